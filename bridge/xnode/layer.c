/* SPDX-License-Identifier: MIT */
/*
 * Layer ops of cross-node transfers (xnode.c has the state machines): a
 * KVB_OP_LAYER becomes the transfer list of that layer's blocks on each
 * target peer (bridge/zmq/blocks: offsets from block ids, runs contiguous
 * on both sides merged), queued on the peer's transport destination like
 * any other op; the group of pieces completes as one descriptor. Layers
 * submitted before the peer is ready are deferred and issued when it is.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "nic.h"
#include "zmq/blocks.h"
#include "zmq/handshake.h"

/* The descriptor's worker (role, dp, tp), or NULL. */
static const struct kvb_hs_worker *desc_worker(const struct kvb_hs_desc *d,
					       uint32_t role, uint32_t dp,
					       uint32_t tp)
{
	for (uint32_t i = 0; i < d->nworkers; i++) {
		const struct kvb_hs_worker *w = &d->workers[i];

		if (w->role == role && w->dp_rank == dp && w->tp_rank == tp)
			return w;
	}
	return NULL;
}

/* tp_size of the peer's workers of (role, dp); 0 if none. */
static uint32_t desc_tp_size(const struct kvb_hs_desc *d, uint32_t role,
			     uint32_t dp)
{
	for (uint32_t i = 0; i < d->nworkers; i++)
		if (d->workers[i].role == role && d->workers[i].dp_rank == dp)
			return d->workers[i].tp_size;
	return 0;
}

static const struct kvb_hs_region *desc_layer(const struct kvb_hs_worker *w,
					      uint32_t layer)
{
	for (uint32_t i = 0; i < w->nregions; i++)
		if (w->regions[i].layer == layer)
			return &w->regions[i];
	return NULL;
}

/* ------------------------------------------------------------------ */
/* layer ops */

static uint32_t group_alloc(struct kvb_xn *xn)
{
	return xn->ngfree ? xn->gfree[--xn->ngfree] : 0;
}

static void group_free(struct kvb_xn *xn, uint32_t gi)
{
	xn->groups[gi].used = 0;
	xn->gfree[xn->ngfree++] = gi;
}

/* A completion status that says the peer (or what we know of it) changed:
 * connection errors, and remote access errors (a region deregistered or
 * replaced there: our descriptor is stale; on rdma the QPs were reset).
 * Not -ECANCELED: that is an op this broker took back itself (a transfer
 * aborted or failed: its queued ops dropped; the ops after a broken queue
 * pair's first error, which carries the real status). Taking it for a
 * connection error made one aborted transfer fail every other transfer
 * queued to the same peer. */
static int conn_error(int status)
{
	return status == -EACCES || status == -EREMOTEIO || status == -EIO ||
	       status == -ECONNRESET || status == -ECONNREFUSED ||
	       status == -ECONNABORTED || status == -ETIMEDOUT ||
	       status == -EPIPE || status == -ENOTCONN ||
	       status == -EHOSTUNREACH || status == -ENETUNREACH;
}

/* The group_done hook: entry gi's piece ended. The layer op's completion
 * goes back to the engine (*done), which posts and counts it. */
int kvb_xn_group_done(struct kvb_broker *b, uint32_t gi, int status,
		      uint64_t bytes, struct kvb_op_done *done, uint32_t *stale)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_group *g;
	struct kvb_peer *p;
	int last = 0;

	*stale = 0;
	if (!xn || !gi || gi >= MAX_GROUPS || !xn->groups[gi].used)
		return 0;
	g = &xn->groups[gi];
	p = kvb_xn_peer_get(xn, g->peer);
	if (status && !g->err)
		g->err = status;
	if (!status)
		g->bytes += bytes;
	if (!--g->remaining) {
		*done = (struct kvb_op_done){.worker = g->worker,
					     .xfer = g->xfer,
					     .tag = g->tag,
					     .bytes = g->err ? 0 : g->bytes,
					     .status = g->err,
					     .flags = g->flags};
		group_free(xn, gi);
		last = 1;
	}
	/*
	 * A connection error: the peer may come back as another broker
	 * instance with other regions behind the same ids. Post nothing more
	 * to it until a new handshake (which reconnects to a new instance):
	 * the engine fails what is queued to it (*stale), after this
	 * completion. Not when the rdma transport parked the failed queue
	 * pair alone and goes on through the peer's other NICs (nic.h).
	 */
	if (status && conn_error(status) && p && !p->stale &&
	    !(kvb_xn_peer_wants_rdma(b, p) &&
	      kvb_xn_parked_error(b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA],
				  status))) {
		p->stale = 1;
		*stale = PEER_SLOT(kvb_xn_peer_id(xn, p));
	}
	return last;
}

/* A layer op that failed before it went out: its completion, into *out
 * (for the engine: the layer_op hook's) or, without out, now. Returns 1. */
static int fail_layer(struct kvb_broker *b, struct kvb_xfer *x, uint64_t tag,
		      int status, const char *why, uint16_t layer,
		      struct kvb_op_done *out)
{
	struct kvb_op_done d = {.worker = x->worker,
				.xfer = kvb_xfer_handle(&b->xfers, x),
				.tag = tag,
				.status = status};

	log_warn("transfer '%s' layer %u: %s (%s)", x->id, layer, why,
		 strerror(-status));
	if (out)
		*out = d;
	else
		kvb_op_complete(b, &d);
	return 1;
}

/* Remote ranks a layer op of this transfer touches (sets rx->targets). */
/* Do w's KV regions and the peer worker's (role, dp, tp) hold different
 * heads (a head split)? Compares the first layer both declared. */
static int heads_differ(struct kvb_broker *b, const struct kvb_worker *w,
			const struct kvb_peer *p, uint32_t role, uint32_t dp,
			uint32_t tp)
{
	const struct kvb_hs_worker *hw = desc_worker(&p->desc, role, dp, tp);

	for (uint32_t l = 0, n = kvb_xn_nkv(b, w); hw && l < n; l++) {
		struct kvb_region_ent *r;
		const struct kvb_xn_region *kv = kvb_xn_kv_layer(b, w, l, &r);
		const struct kvb_hs_region *hr =
			kv && !r->dead ? desc_layer(hw, l) : NULL;

		if (hr)
			return hr->geom.num_heads != kv->geom.num_heads;
	}
	return 0;
}

int kvb_xn_compute_targets(struct kvb_broker *b, struct kvb_worker *w,
			   struct kvb_peer *p, struct kvb_rxfer *rx)
{
	uint32_t L = w->tp_size, r = w->tp_rank, R;

	if (rx->role == KVB_ROLE_P) { /* WRITE: the D ranks fed by r */
		R = desc_tp_size(&p->desc, KVB_HS_ROLE_D, rx->remote_dp);
		if (!R || (R > L ? R % L : L % R))
			return -EINVAL;
		rx->ntargets = 0;
		if (R >= L) {
			for (uint32_t d = r * (R / L);
			     d < (r + 1) * (R / L) &&
			     rx->ntargets < MAX_TARGETS;
			     d++)
				rx->targets[rx->ntargets++] = d;
		} else if (r % (L / R) == 0 ||
			   heads_differ(b, w, p, KVB_HS_ROLE_D, rx->remote_dp,
					r / (L / R))) {
			/* replicated heads: one P rank of each group writes;
			 * split: each writes its heads into D's rows */
			rx->targets[rx->ntargets++] = r / (L / R);
		}
	} else { /* D, READ: the P rank(s) read from */
		int s;

		R = desc_tp_size(&p->desc, KVB_HS_ROLE_P, rx->remote_dp);
		if (!R)
			return -EINVAL;
		s = kvb_tp_remote_rank(r, L, R);
		if (s < 0)
			return s;
		rx->targets[0] = (uint32_t) s;
		rx->ntargets = 1;
		if (R > L && heads_differ(b, w, p, KVB_HS_ROLE_P, rx->remote_dp,
					  (uint32_t) s)) {
			/* P's heads split over R / L ranks: gather a slice
			 * from each (the release goes to all of them) */
			for (uint32_t q = (uint32_t) s + 1;
			     q < (uint32_t) s + R / L &&
			     rx->ntargets < MAX_TARGETS;
			     q++)
				rx->targets[rx->ntargets++] = q;
		}
	}
	rx->target_tp = R;
	return 0;
}

/* Why a layer cannot be issued now: 0 = go, 1 = defer, < 0 = fail. */
static int layer_ready(struct kvb_broker *b, struct kvb_rxfer *rx,
		       const char **why)
{
	struct kvb_peer *p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);

	if (rx->wait_peer) {
		*why = "waiting for the peer's handshake";
		return 1;
	}
	if (rx->role == KVB_ROLE_P && !rx->have_rblocks) {
		*why = "waiting for remote_blocks";
		return 1;
	}
	if (!p || !p->have_desc) {
		*why = "unknown peer";
		return -EHOSTUNREACH;
	}
	if (p->stale || p->state == PEER_HS) {
		*why = "peer reconnecting";
		return 1;
	}
	if (kvb_xn_peer_wants_rdma(b, p) && !kvb_xn_rdma_ready(b, p)) {
		int rc = kvb_xn_rdma_offer(b, p);

		if (rc < 0) {
			*why = "rdma queue pairs cannot connect";
			return rc;
		}
		*why = "rdma queue pairs connecting";
		return 1;
	}
	return 0;
}

static int defer_layer(struct kvb_broker *b, struct kvb_rxfer *rx,
		       uint16_t layer, uint64_t tag, uint8_t flags);

/*
 * Which part of the larger side's heads this (worker, remote rank) pair
 * moves when the two hold different heads per worker (heterogeneous TP
 * with the KV heads split across ranks). Where D has m = D_TP / P_TP times
 * the ranks and a P rank m times a D rank's heads, D rank d holds slice
 * d % m of P rank d / m's heads (WRITE and READ). Where P has m times D's
 * ranks and a D rank m times a P rank's heads, P rank p's heads are slice
 * p % m of D rank p / m's: P writes them there (WRITE), or D reads them
 * into it from each of its m P ranks (READ, a gather). Equal heads: slice
 * 0. Returns 0 or -EINVAL.
 */
static int head_slice(const struct kvb_worker *w, const struct kvb_rxfer *rx,
		      uint32_t target, const struct kvb_kv_geom *mine,
		      const struct kvb_kv_geom *theirs, uint32_t *slice)
{
	int is_p = rx->role == KVB_ROLE_P;
	uint32_t p_tp = is_p ? w->tp_size : rx->target_tp;
	uint32_t d_tp = is_p ? rx->target_tp : w->tp_size;
	uint32_t d_rank = is_p ? target : w->tp_rank;
	uint32_t p_heads = is_p ? mine->num_heads : theirs->num_heads;
	uint32_t d_heads = is_p ? theirs->num_heads : mine->num_heads;
	uint32_t m;

	*slice = 0;
	if (mine->num_heads == theirs->num_heads)
		return 0;
	if (!p_tp || !d_tp)
		return -EINVAL;
	if (d_tp > p_tp && d_tp % p_tp == 0) {
		m = d_tp / p_tp;
		if ((uint64_t) d_heads * m != p_heads)
			return -EINVAL;
		*slice = d_rank % m;
		return 0;
	}
	if (p_tp > d_tp && p_tp % d_tp == 0) {
		m = p_tp / d_tp;
		if ((uint64_t) p_heads * m != d_heads)
			return -EINVAL;
		*slice = (is_p ? w->tp_rank : target) % m;
		return 0;
	}
	return -EINVAL;
}

/* The most in-flight entries a layer op can make: K and V of each block
 * for each target rank, and one per token of those where the heads are
 * split (merged runs make fewer); *per_target: the most for one rank. */
static uint64_t layer_entries_max(const struct kvb_peer *p,
				  const struct kvb_rxfer *rx,
				  const struct kvb_kv_geom *g, uint16_t layer,
				  uint64_t *per_target)
{
	uint32_t role = rx->role == KVB_ROLE_P ? KVB_HS_ROLE_D : KVB_HS_ROLE_P;
	uint64_t need = 0;

	*per_target = 0;
	for (uint32_t t = 0; t < rx->ntargets; t++) {
		const struct kvb_hs_worker *hw = desc_worker(
			&p->desc, role, rx->remote_dp, rx->targets[t]);
		const struct kvb_hs_region *hr =
			hw ? desc_layer(hw, layer) : NULL;
		uint64_t rows = hr && hr->geom.num_heads != g->num_heads
					? g->block_size
					: 1;

		need += 2 * (uint64_t) rx->nlb * rows;
		if (2 * (uint64_t) rx->nlb * rows > *per_target)
			*per_target = 2 * (uint64_t) rx->nlb * rows;
	}
	return need;
}

void kvb_xn_retry_starved(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	if (!xn || !xn->starved_need || kvb_inflight_free(b) < xn->starved_need)
		return;
	xn->starved_need = 0; /* set again by what still does not fit */
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];

		if (x->rx && x->rx->starved) {
			x->rx->starved = 0;
			kvb_xn_issue_deferred(b, x);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

/* One layer op being issued: what issue_layer's steps share. */
struct layer_op {
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	struct kvb_worker *w;
	struct kvb_peer *p;
	struct kvb_region_ent *r; /* this worker's KV region of the layer */
	const struct kvb_xn_region *kv; /* ... its geometry, transports */
	struct kvb_group *g;
	uint32_t handle, gi;
	unsigned ts; /* the peer's transport slot */
	uint16_t layer;
	uint8_t flags;
	uint64_t tag;
	struct kvb_op_done *out; /* its completion, if it completes at once
				  * (NULL: complete it now) */
};

/* Can it go out: worker, peer, region, transport, targets? 0, or -1 when
 * it failed (completed with the reason). */
static int layer_check(struct kvb_broker *b, struct layer_op *o)
{
	struct kvb_worker *w = o->w;
	int rc;

	if (!w || !o->p) {
		fail_layer(b, o->x, o->tag, -EHOSTUNREACH, "peer gone",
			   o->layer, o->out);
		return -1;
	}
	o->kv = kvb_xn_kv_layer(b, w, o->layer, &o->r);
	if (!o->kv || o->r->dead) {
		fail_layer(b, o->x, o->tag, -ENOENT,
			   "no KV region declared for this layer "
			   "(kvb_mem_set_kv)",
			   o->layer, o->out);
		return -1;
	}
	o->ts = kvb_xn_peer_ts(b, o->p);
	if (!o->ts || !b->trs[o->ts]) {
		fail_layer(b, o->x, o->tag, -EHOSTUNREACH,
			   "no transport to the peer", o->layer, o->out);
		return -1;
	}
	if (!(o->ts == KVB_TS_RDMA ? o->kv->rdma_reg : o->kv->tcp_reg)) {
		fail_layer(b, o->x, o->tag, -EOPNOTSUPP,
			   "region not registered with the peer's transport "
			   "(see the broker log)",
			   o->layer, o->out);
		return -1;
	}
	rc = kvb_xn_compute_targets(b, w, o->p, o->rx);
	if (rc &&
	    (!o->rx->refreshed || o->p->stale || o->p->state == PEER_HS)) {
		/* the peer's workers may have attached after our handshake
		 * (a batched open uses the descriptor it finds): ask again
		 * once; this and the transfer's next layer ops wait for the
		 * answer */
		if (!o->rx->refreshed) {
			o->rx->refreshed = 1;
			o->p->stale = 1;
		}
		if (defer_layer(b, o->rx, o->layer, o->tag, o->flags) == 0) {
			if (o->p->state != PEER_HS)
				kvb_xn_peer_start_hs(b, o->p);
			return 1;
		}
	}
	if (rc) {
		fail_layer(b, o->x, o->tag, rc,
			   "the peer has no workers of that DP rank with a "
			   "compatible TP size",
			   o->layer, o->out);
		return -1;
	}
	return 0;
}

/* A region the peer's descriptor lacks: its worker may have come after
 * our handshake; ask again once, then give up. 1: deferred until then. */
static int layer_refresh(struct kvb_broker *b, struct layer_op *o)
{
	struct kvb_rxfer *rx = o->rx;
	struct kvb_peer *p = o->p;

	for (uint32_t t = 0; t < rx->ntargets; t++) {
		const struct kvb_hs_worker *hw = desc_worker(
			&p->desc,
			rx->role == KVB_ROLE_P ? KVB_HS_ROLE_D : KVB_HS_ROLE_P,
			rx->remote_dp, rx->targets[t]);

		if (hw && desc_layer(hw, o->layer))
			continue;
		/* once per transfer; its later layer ops wait for that
		 * answer too */
		if (rx->refreshed && !p->stale && p->state != PEER_HS)
			continue;
		rx->refreshed = 1;
		p->stale = 1;
		if (defer_layer(b, rx, o->layer, o->tag, o->flags) == 0) {
			if (p->state != PEER_HS)
				kvb_xn_peer_start_hs(b, p);
			return 1;
		}
		break;
	}
	return 0;
}

/* Room for every entry it can make (*ncap), or wait for it: a layer op
 * never goes out in part (it would fail for want of room). 0: room; 1:
 * deferred; -1: failed. */
static int layer_room(struct kvb_broker *b, struct layer_op *o, uint64_t *ncap)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint64_t need =
		layer_entries_max(o->p, o->rx, &o->kv->geom, o->layer, ncap);

	if (need >= KVB_INFLIGHT_MAX) {
		fail_layer(b, o->x, o->tag, -ENOBUFS,
			   "more entries than the broker's in-flight table "
			   "holds (65,536): fewer blocks per layer op",
			   o->layer, o->out);
		return -1;
	}
	if (need <= kvb_inflight_free(b))
		return 0;
	if (defer_layer(b, o->rx, o->layer, o->tag, o->flags) < 0) {
		fail_layer(b, o->x, o->tag, -ENOMEM, "out of memory", o->layer,
			   o->out);
		return -1;
	}
	xn->st.layers_starved++;
	o->rx->starved = 1;
	if (!xn->starved_need || need < xn->starved_need)
		xn->starved_need = need;
	return 1;
}

/* The group of in-flight entries the layer op completes as, held while it
 * is built (remaining = 1). 0 or -1 (failed: none free). */
static int layer_group(struct kvb_broker *b, struct layer_op *o)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_group *g;

	o->gi = group_alloc(xn);
	if (!o->gi) {
		fail_layer(b, o->x, o->tag, -ENOBUFS,
			   "too many layer ops in flight", o->layer, o->out);
		return -1;
	}
	g = o->g = &xn->groups[o->gi];
	memset(g, 0, sizeof(*g));
	g->used = 1;
	g->worker = o->w->id;
	g->xfer = o->handle;
	g->peer = o->rx->peer;
	g->tag = o->tag;
	g->flags = o->flags;
	g->remaining = 1;
	return 0;
}

/* Queue the n entries for one peer region hr to the peer's destination. */
static void layer_queue(struct kvb_broker *b, struct layer_op *o,
			const struct kvb_hs_region *hr,
			const struct kvb_kv_xfer *ents, int n)
{
	uint32_t di = UINT32_MAX; /* bound at the first entry */

	for (int i = 0; i < n; i++) {
		uint32_t idx = kvb_inflight_alloc(b);
		struct kvb_inflight *f;
		struct kvb_xop op;

		if (!idx) {
			if (!o->g->err)
				o->g->err = -ENOBUFS;
			break;
		}
		f = kvb_inflight_get(b, idx);
		f->worker = o->w->id;
		f->xfer = o->handle;
		f->tag = o->tag;
		f->bytes = ents[i].len;
		f->lreg = o->r->mr.id;
		f->group = o->gi;
		kvb_region_hold(o->r);
		o->g->remaining++;
		memset(&op, 0, sizeof(op));
		op.opcode = o->rx->role == KVB_ROLE_P ? KVB_XOP_WRITE
						      : KVB_XOP_READ;
		op.local = &o->r->mr;
		op.local_off = ents[i].local_off;
		op.remote.region = hr->id;
		op.remote.addr = hr->addr;
		op.remote.rkey = hr->rkey;
		kvb_xn_remote_keys(&op.remote, hr);
		op.remote_off = ents[i].remote_off;
		op.len = ents[i].len;
		op.cookie = idx;
		if (di == UINT32_MAX)
			di = kvb_dest_bind(b, o->ts, PEER_SLOT(o->rx->peer),
					   b->trs[o->ts], o->p->ep[o->ts]);
		if (kvb_dest_append(b, di, &op))
			kvb_complete_inflight(b, idx, -ENOMEM);
	}
}

/* The entries for the peer's rank rank (ents: room for ncap). */
static void layer_target(struct kvb_broker *b, struct layer_op *o,
			 uint32_t rank, struct kvb_kv_xfer *ents, uint64_t ncap)
{
	struct kvb_rxfer *rx = o->rx;
	const struct kvb_kv_geom *g = &o->kv->geom;
	uint32_t role = rx->role == KVB_ROLE_P ? KVB_HS_ROLE_D : KVB_HS_ROLE_P;
	const struct kvb_hs_worker *hw =
		desc_worker(&o->p->desc, role, rx->remote_dp, rank);
	const struct kvb_hs_region *hr = hw ? desc_layer(hw, o->layer) : NULL;
	uint32_t slice;
	int n;

	if (!hr) {
		log_warn("transfer '%s' layer %u: peer %s has no region for "
			 "%s dp %u tp %u",
			 o->x->id, o->layer, o->p->desc.node_id,
			 role == KVB_HS_ROLE_D ? "D" : "P", rx->remote_dp,
			 rank);
		if (!o->g->err)
			o->g->err = -ENOENT;
		return;
	}
	if (head_slice(o->w, rx, rank, g, &hr->geom, &slice)) {
		log_warn("transfer '%s' layer %u: %u heads here, %u at the "
			 "peer's rank %u: not a head split (one side's TP m "
			 "times the other's, its ranks holding 1/m of the "
			 "heads)",
			 o->x->id, o->layer, g->num_heads, hr->geom.num_heads,
			 rank);
		if (!o->g->err)
			o->g->err = -EINVAL;
		return;
	}
	/* D may name fewer blocks than P holds (its prefix cache had the
	 * first ones): P writes its last nrb (end-trim) */
	n = kvb_kv_build_xfers_split(g, &hr->geom, slice,
				     rx->lb + (rx->nlb - rx->nrb), rx->rb,
				     rx->nrb, ents, (uint32_t) ncap);
	if (n < 0) {
		log_warn("transfer '%s' layer %u: block list refused: %s",
			 o->x->id, o->layer,
			 n == -ERANGE ? "a block id is out of range"
				      : "geometry mismatch");
		if (!o->g->err)
			o->g->err = n;
		return;
	}
	layer_queue(b, o, hr, ents, n);
}

/* Issue a layer op now. 1 when it completed at once with its completion
 * in *out (out NULL: completed already), else 0. */
static int issue_layer(struct kvb_broker *b, struct kvb_xfer *x, uint16_t layer,
		       uint64_t tag, uint8_t flags, struct kvb_op_done *out)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct layer_op o = {
		.x = x,
		.rx = x->rx,
		.w = kvb_worker_by_id(b, x->worker),
		.p = kvb_xn_peer_get(xn, x->rx->peer),
		.handle = kvb_xfer_handle(&b->xfers, x),
		.layer = layer,
		.flags = flags,
		.tag = tag,
		.out = out,
	};
	struct kvb_kv_xfer *ents;
	struct kvb_op_done done;
	uint32_t stale;
	uint64_t ncap;
	int rc;

	rc = layer_check(b, &o);
	if (!rc)
		rc = layer_refresh(b, &o);
	if (!rc)
		rc = layer_room(b, &o, &ncap);
	if (!rc)
		rc = layer_group(b, &o);
	if (rc) /* -1: failed, 1: deferred */
		return rc < 0 && out;
	ents = malloc((ncap ? ncap : 1) * sizeof(*ents)); /* 0: no target */
	if (!ents)
		o.g->err = -ENOMEM;
	for (uint32_t t = 0; ents && t < o.rx->ntargets; t++)
		layer_target(b, &o, o.rx->targets[t], ents, ncap);
	free(ents);
	xn->st.layer_ops++;
	/* drop the building hold: the last one if every piece ended */
	if (!kvb_xn_group_done(b, o.gi, 0, 0, &done, &stale))
		return 0;
	if (!out) {
		kvb_op_complete(b, &done);
		return 0;
	}
	*out = done;
	return 1;
}

static int defer_layer(struct kvb_broker *b, struct kvb_rxfer *rx,
		       uint16_t layer, uint64_t tag, uint8_t flags)
{
	if (rx->ndef == rx->capdef) {
		uint32_t cap = rx->capdef ? rx->capdef * 2 : 16;
		struct deferred *n = realloc(rx->def, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		rx->def = n;
		rx->capdef = cap;
	}
	if (!rx->ndef)
		rx->defer_deadline =
			kvb_now_ns() +
			(int64_t) (rx->defer_ms ? rx->defer_ms
						: b->opt.defer_timeout_ms) *
				1000000;
	rx->def[rx->ndef++] = (struct deferred){layer, flags, tag};
	kvb_xn_of(b)->st.layers_deferred++;
	return 0;
}

void kvb_xn_issue_deferred(struct kvb_broker *b, struct kvb_xfer *x)
{
	struct kvb_rxfer *rx = x->rx;
	const char *why;
	uint32_t n = rx->ndef;
	struct deferred *d = rx->def;

	if (!n || layer_ready(b, rx, &why) != 0)
		return;
	rx->def = NULL;
	rx->ndef = rx->capdef = 0;
	for (uint32_t i = 0; i < n; i++) {
		/* the transfer may end while issuing (a failure) */
		if (!x->used || x->rx != rx)
			break;
		issue_layer(b, x, d[i].layer, d[i].tag, d[i].flags, NULL);
	}
	free(d);
}

void kvb_xn_issue_deferred_of_peer(struct kvb_broker *b, uint32_t pid)
{
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];

		if (x->rx && x->rx->peer == pid && x->rx->ndef)
			kvb_xn_issue_deferred(b, x);
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

/* The layer_op hook: 1 when the op completed at once (*done), else 0. */
int kvb_xn_layer(struct kvb_broker *b, struct kvb_worker *w,
		 const struct kvb_sqe *e, struct kvb_op_done *done)
{
	struct kvb_xfer *x = kvb_xfer_get(&b->xfers, e->transfer, w->id);
	struct kvb_rxfer *rx = x ? x->rx : NULL;
	const char *why = NULL;
	int rc;

	if (!rx || !kvb_xn_of(b)) {
		kvb_layer_refuse(b, w, e, -EINVAL,
				 "layer op for an unknown or local transfer");
		return 0;
	}
	if (x->closing) {
		kvb_layer_refuse(b, w, e, x->close_err, "the transfer failed");
		return 0;
	}
	if (x->held_err) {
		kvb_layer_refuse(b, w, e, x->held_err,
				 "the transfer failed waiting for its peer");
		return 0;
	}
	if (e->layer >= MAX_LAYERS) {
		kvb_layer_refuse(b, w, e, -EINVAL, "layer out of range");
		return 0;
	}
	if (!((rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_WRITE) ||
	      (rx->role == KVB_ROLE_D && rx->mode == KVB_XFER_READ))) {
		kvb_layer_refuse(b, w, e, -EINVAL,
				 "layer ops are for P in WRITE mode and D in "
				 "READ mode");
		return 0;
	}
	if (rx->layers[e->layer / 64] & (1ull << (e->layer % 64))) {
		kvb_layer_refuse(b, w, e, -EEXIST, "layer submitted twice");
		return 0;
	}
	rx->layers[e->layer / 64] |= 1ull << (e->layer % 64);
	x->submitted++;
	rc = layer_ready(b, rx, &why);
	if (rc < 0)
		return fail_layer(b, x, e->tag, rc, why, e->layer, done);
	if (rc == 1 || rx->ndef) { /* keep the order of deferred layers */
		struct kvb_peer *p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);

		if (defer_layer(b, rx, e->layer, e->tag, e->flags) < 0)
			return fail_layer(b, x, e->tag, -ENOMEM,
					  "out of memory", e->layer, done);
		if (p && p->stale && p->state != PEER_HS &&
		    kvb_now_ns() >= p->next_refresh)
			kvb_xn_peer_start_hs(b, p);
		return 0;
	}
	return issue_layer(b, x, e->layer, e->tag, e->flags, done);
}

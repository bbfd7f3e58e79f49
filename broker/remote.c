/* SPDX-License-Identifier: MIT */
/*
 * The cross-node bridge inside the broker (PROTOCOL.md, issue 3):
 *
 * - every attached worker gets its MoRIIO notify ports (bridge/zmq/notify);
 *   remote_blocks, write_done, release and plain-string messages drive the
 *   WRITE and READ state machines below;
 * - the handshake port answers peer brokers with this node's engine
 *   descriptor (bridge/zmq/handshake), and kvb_peer_connect() asks a peer
 *   for its own; both sides then connect their data transports (tcp);
 * - a layer op (KVB_OP_LAYER) becomes the transfer list of that layer's
 *   blocks (bridge/zmq/blocks: offsets from block ids, runs contiguous on
 *   both sides merged), queued on the peer's transport destination like any
 *   other op, and completes as one descriptor when all its pieces did.
 *
 * Everything runs on the broker thread and never blocks: ZMQ sockets are
 * drained without waiting, peers that do not answer time out. Set-up,
 * teardown and region registration: remote_setup.c; peers and the
 * handshake: remote_peer.c; notify messages: remote_notify.c.
 */
#include "remote_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "zmq/blocks.h"
#include "zmq/codec.h"
#include "zmq/handshake.h"
#include "zmq/notify.h"
#ifdef KVB_HAVE_TCP
#include "tcp/tcp.h"
#endif
#ifdef KVB_HAVE_RDMA
#include "rdma/rdma.h"
#endif

struct kvb_broker *g_b;

/* ------------------------------------------------------------------ */
/* small helpers */

int ep_add(struct kvb_broker *b, int fd)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = KVB_EP_REMOTE};

	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

void ep_del(struct kvb_broker *b, int fd)
{
	if (fd >= 0)
		epoll_ctl(b->epfd, EPOLL_CTL_DEL, fd, NULL);
}

int trusted(struct kvb_xnode *rm, const char *host)
{
	if (!rm->ntrusted)
		return 1;
	for (uint32_t i = 0; i < rm->ntrusted; i++)
		if (!strcmp(rm->trusted[i], host))
			return 1;
	return 0;
}

struct kvb_peer *peer_get(struct kvb_xnode *rm, uint32_t id)
{
	if (!rm || id == 0 || id >= rm->npeers_max ||
	    rm->peers[id].state == PEER_FREE)
		return NULL;
	return &rm->peers[id];
}

uint32_t peer_id(struct kvb_xnode *rm, struct kvb_peer *p)
{
	return (uint32_t) (p - rm->peers);
}

struct kvb_peer *peer_find(struct kvb_xnode *rm, const char *host,
			   uint16_t port, int create)
{
	struct kvb_peer *free_p = NULL;

	for (uint32_t i = 1; i < rm->npeers_max; i++) {
		struct kvb_peer *p = &rm->peers[i];

		if (p->state == PEER_FREE) {
			if (!free_p)
				free_p = p;
			continue;
		}
		if (p->port == port && !strcmp(p->host, host))
			return p;
	}
	if (!create || !free_p)
		return NULL;
	memset(free_p, 0, sizeof(*free_p));
	snprintf(free_p->host, sizeof(free_p->host), "%s", host);
	free_p->port = port;
	free_p->dealer_fd = -1;
	free_p->state = PEER_FAILED; /* no handshake yet */
	return free_p;
}

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

static const char *peer_notify_host(const struct kvb_peer *p,
				    const struct kvb_rxfer *rx)
{
	if (rx && rx->notify_host[0])
		return rx->notify_host;
	return p->desc.host[0] ? p->desc.host : p->host;
}

static uint32_t peer_notify_base(const struct kvb_peer *p,
				 const struct kvb_rxfer *rx)
{
	if (rx && rx->notify_port)
		return rx->notify_port;
	return p->desc.notify_port ? p->desc.notify_port
				   : KVB_NOTIFY_PORT_DEFAULT;
}

/* Transport slot serving a peer (0 = none). */
const struct kvb_hs_transport *desc_transport(const struct kvb_hs_desc *d,
					      const char *name)
{
	for (uint32_t i = 0; i < d->ntransports; i++)
		if (!strcmp(d->transports[i].name, name))
			return &d->transports[i];
	return NULL;
}

/* Both sides speak rdma: it is the transport for this peer. */
int peer_wants_rdma(const struct kvb_peer *p)
{
	return g_b->trs[KVB_TS_RDMA] && p->have_desc &&
	       desc_transport(&p->desc, "rdma");
}

int rdma_ready(const struct kvb_peer *p)
{
#ifdef KVB_HAVE_RDMA
	return p->ep[KVB_TS_RDMA] &&
	       kvb_rdma_ep_state(g_b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA]) ==
		       KVB_RDMA_EP_READY;
#else
	return 0;
#endif
}

unsigned peer_ts(const struct kvb_peer *p)
{
	if (peer_wants_rdma(p))
		return rdma_ready(p) ? KVB_TS_RDMA : 0;
	if (p->ep[KVB_TS_TCP])
		return KVB_TS_TCP;
	return 0;
}

static int send_msg(struct kvb_broker *b, struct kvb_worker *w,
		    const char *host, uint32_t port, const struct kvb_zmsg *m)
{
	int rc = -ENOTCONN;

	if (w && w->notify)
		rc = kvb_notify_send(w->notify, host, port, m);
	if (rc) {
		b->rm->st.send_errors++;
		log_warn("worker %u: cannot send %s for '%s' to %s:%u: %s",
			 w ? w->id : 0, kvb_zmsg_type_name(m->type),
			 m->transfer_id, host, port, strerror(-rc));
	}
	return rc;
}

/* ------------------------------------------------------------------ */
/* layer ops */

static uint32_t group_alloc(struct kvb_xnode *rm)
{
	return rm->ngfree ? rm->gfree[--rm->ngfree] : 0;
}

static void group_free(struct kvb_xnode *rm, uint32_t gi)
{
	rm->groups[gi].used = 0;
	rm->gfree[rm->ngfree++] = gi;
}

/* A completion status that says the peer (or what we know of it) changed:
 * connection errors, and remote access errors (a region deregistered or
 * replaced there: our descriptor is stale; on rdma the QPs were reset). */
static int conn_error(int status)
{
	return status == -EACCES || status == -EREMOTEIO || status == -EIO ||
	       status == -ECANCELED || status == -ECONNRESET ||
	       status == -ECONNREFUSED || status == -ECONNABORTED ||
	       status == -ETIMEDOUT || status == -EPIPE ||
	       status == -ENOTCONN || status == -EHOSTUNREACH ||
	       status == -ENETUNREACH;
}

void kvb_remote_group_done(struct kvb_broker *b, uint32_t gi, int status,
			   uint64_t bytes)
{
	struct kvb_xnode *rm = b->rm;
	struct kvb_group *g;
	struct kvb_peer *p;

	if (!rm || !gi || gi >= MAX_GROUPS || !rm->groups[gi].used)
		return;
	g = &rm->groups[gi];
	p = peer_get(rm, g->peer);
	if (status && !g->err)
		g->err = status;
	if (!status)
		g->bytes += bytes;
	if (!--g->remaining) {
		uint32_t xfer = g->xfer, worker = g->worker;
		int err = g->err;

		if (err || !(g->flags & KVB_SQE_F_UNSIGNALED))
			kvb_post_cqe(b, worker, KVB_CQ_DESC, g->tag, err,
				     err ? 0 : g->bytes, xfer);
		group_free(rm, gi);
		kvb_xfer_account(b, xfer, worker, err);
	}
	/*
	 * A connection error: the peer may come back as another broker
	 * instance with other regions behind the same ids. Post nothing more
	 * to it until a new handshake (which reconnects to a new instance).
	 * Done last: failing the queued ops re-enters this function.
	 */
	if (status && conn_error(status) && p && !p->stale) {
		p->stale = 1;
		for (unsigned ts = KVB_TS_TCP; ts < KVB_TS_MAX; ts++)
			fail_dest_ops(b, peer_id(rm, p), ts, -ECONNRESET);
	}
}

static void fail_layer(struct kvb_broker *b, struct kvb_xfer *x, uint64_t tag,
		       int status, const char *why, uint16_t layer)
{
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);
	uint32_t worker = x->worker;

	log_warn("transfer '%s' layer %u: %s (%s)", x->id, layer, why,
		 strerror(-status));
	kvb_post_cqe(b, worker, KVB_CQ_DESC, tag, status, 0, handle);
	kvb_xfer_account(b, handle, worker, status);
}

/* Remote ranks a layer op of this transfer touches (sets rx->targets). */
static int compute_targets(struct kvb_worker *w, struct kvb_peer *p,
			   struct kvb_rxfer *rx)
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
		} else if (r % (L / R) == 0) {
			rx->targets[rx->ntargets++] = r / (L / R);
		}
	} else { /* D, READ: the one P rank read from */
		int s;

		R = desc_tp_size(&p->desc, KVB_HS_ROLE_P, rx->remote_dp);
		if (!R)
			return -EINVAL;
		s = kvb_tp_remote_rank(r, L, R);
		if (s < 0)
			return s;
		rx->targets[0] = (uint32_t) s;
		rx->ntargets = 1;
	}
	rx->target_tp = R;
	return 0;
}

/* Why a layer cannot be issued now: 0 = go, 1 = defer, < 0 = fail. */
static int layer_ready(struct kvb_broker *b, struct kvb_rxfer *rx,
		       const char **why)
{
	struct kvb_peer *p = peer_get(b->rm, rx->peer);

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
	if (peer_wants_rdma(p) && !rdma_ready(p)) {
		int rc = rdma_offer(b, p);

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

static void issue_layer(struct kvb_broker *b, struct kvb_xfer *x,
			uint16_t layer, uint64_t tag, uint8_t flags)
{
	struct kvb_xnode *rm = b->rm;
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = peer_get(rm, rx->peer);
	struct kvb_region_ent *r = NULL;
	struct kvb_kv_xfer *ents = NULL;
	uint32_t handle = kvb_xfer_handle(&b->xfers, x), gi;
	unsigned ts;
	struct kvb_group *g;
	int rc;

	if (!w || !p) {
		fail_layer(b, x, tag, -EHOSTUNREACH, "peer gone", layer);
		return;
	}
	if (layer < w->nkv && w->kv_layer[layer])
		r = kvb_region_get(&b->regions, w->kv_layer[layer]);
	if (!r || r->dead || !r->has_kv) {
		fail_layer(b, x, tag, -ENOENT,
			   "no KV region declared for this layer "
			   "(kvb_mem_set_kv)",
			   layer);
		return;
	}
	ts = peer_ts(p);
	if (!ts || !b->trs[ts]) {
		fail_layer(b, x, tag, -EHOSTUNREACH, "no transport to the peer",
			   layer);
		return;
	}
	rc = compute_targets(w, p, rx);
	if (rc) {
		fail_layer(b, x, tag, rc,
			   "the peer has no workers of that DP rank with a "
			   "compatible TP size",
			   layer);
		return;
	}
	/* a region the peer's descriptor lacks: its worker may have come
	 * after our handshake; ask again once, then give up */
	for (uint32_t t = 0; t < rx->ntargets; t++) {
		const struct kvb_hs_worker *hw = desc_worker(
			&p->desc,
			rx->role == KVB_ROLE_P ? KVB_HS_ROLE_D : KVB_HS_ROLE_P,
			rx->remote_dp, rx->targets[t]);

		if ((hw && desc_layer(hw, layer)) || rx->refreshed)
			continue;
		rx->refreshed = 1;
		p->stale = 1;
		if (defer_layer(b, rx, layer, tag, flags) == 0) {
			if (p->state != PEER_HS)
				peer_start_hs(b, p);
			return;
		}
		break;
	}
	gi = group_alloc(rm);
	if (!gi) {
		fail_layer(b, x, tag, -ENOBUFS, "too many layer ops in flight",
			   layer);
		return;
	}
	g = &rm->groups[gi];
	memset(g, 0, sizeof(*g));
	g->used = 1;
	g->worker = w->id;
	g->xfer = handle;
	g->peer = rx->peer;
	g->tag = tag;
	g->flags = flags;
	g->remaining = 1; /* held while building */
	ents = malloc(2 * (size_t) rx->nlb * sizeof(*ents));
	if (!ents) {
		g->err = -ENOMEM;
		goto out;
	}
	for (uint32_t t = 0; t < rx->ntargets; t++) {
		uint32_t role =
			rx->role == KVB_ROLE_P ? KVB_HS_ROLE_D : KVB_HS_ROLE_P;
		const struct kvb_hs_worker *hw = desc_worker(
			&p->desc, role, rx->remote_dp, rx->targets[t]);
		const struct kvb_hs_region *hr =
			hw ? desc_layer(hw, layer) : NULL;
		int n;

		if (!hr) {
			log_warn("transfer '%s' layer %u: peer %s has no "
				 "region for %s dp %u tp %u",
				 x->id, layer, p->desc.node_id,
				 role == KVB_HS_ROLE_D ? "D" : "P",
				 rx->remote_dp, rx->targets[t]);
			if (!g->err)
				g->err = -ENOENT;
			continue;
		}
		n = kvb_kv_build_xfers(&r->geom, &hr->geom, rx->lb, rx->rb,
				       rx->nlb, ents, 2 * rx->nlb);
		if (n < 0) {
			log_warn("transfer '%s' layer %u: block list refused: "
				 "%s",
				 x->id, layer,
				 n == -ERANGE ? "a block id is out of range"
					      : "geometry mismatch");
			if (!g->err)
				g->err = n;
			continue;
		}
		for (int i = 0; i < n; i++) {
			uint32_t idx = kvb_inflight_alloc(b);
			struct kvb_inflight *f;
			struct kvb_xop op;

			if (!idx) {
				if (!g->err)
					g->err = -ENOBUFS;
				break;
			}
			f = &b->inf[idx];
			f->worker = w->id;
			f->xfer = handle;
			f->tag = tag;
			f->bytes = ents[i].len;
			f->lreg = r->mr.id;
			f->group = gi;
			r->refs++;
			g->remaining++;
			memset(&op, 0, sizeof(op));
			op.opcode = rx->role == KVB_ROLE_P ? KVB_XOP_WRITE
							   : KVB_XOP_READ;
			op.local = &r->mr;
			op.local_off = ents[i].local_off;
			op.remote.region = hr->id;
			op.remote.addr = hr->addr;
			op.remote.rkey = hr->rkey;
			op.remote_off = ents[i].remote_off;
			op.len = ents[i].len;
			op.cookie = idx;
			{
				uint32_t di =
					ts * b->opt.max_workers + rx->peer;

				b->dests[di].tr = b->trs[ts];
				b->dests[di].ep = p->ep[ts];
				if (kvb_dest_append(b, di, &op))
					kvb_complete_inflight(b, idx, -ENOMEM);
			}
		}
	}
out:
	free(ents);
	rm->st.layer_ops++;
	kvb_remote_group_done(b, gi, 0, 0); /* drop the building hold */
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
			(int64_t) b->opt.defer_timeout_ms * 1000000;
	rx->def[rx->ndef++] = (struct deferred){layer, flags, tag};
	b->rm->st.layers_deferred++;
	return 0;
}

void issue_deferred(struct kvb_broker *b, struct kvb_xfer *x)
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
		issue_layer(b, x, d[i].layer, d[i].tag, d[i].flags);
	}
	free(d);
}

void issue_deferred_of_peer(struct kvb_broker *b, uint32_t pid)
{
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];

		if (x->rx && x->rx->peer == pid && x->rx->ndef)
			issue_deferred(b, x);
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

void kvb_remote_layer(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e)
{
	struct kvb_xfer *x = kvb_xfer_get(&b->xfers, e->transfer, w->id);
	struct kvb_rxfer *rx = x ? x->rx : NULL;
	const char *why = NULL;
	int rc;

	b->st.descriptors_submitted++;
	w->st.submitted++;
	if (!rx || !b->rm) {
		b->st.descriptors_refused++;
		log_warn("worker %u: layer op for an unknown or local transfer "
			 "(handle %#x)",
			 w->id, e->transfer);
		kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, -EINVAL, 0,
			     e->transfer);
		return;
	}
	if (!((rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_WRITE) ||
	      (rx->role == KVB_ROLE_D && rx->mode == KVB_XFER_READ)) ||
	    e->layer >= MAX_LAYERS) {
		b->st.descriptors_refused++;
		log_warn("worker %u: transfer '%s': layer op refused (%s)",
			 w->id, x->id,
			 e->layer >= MAX_LAYERS
				 ? "layer out of range"
				 : "layer ops are for P in WRITE mode and D "
				   "in READ mode");
		kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, -EINVAL, 0,
			     e->transfer);
		return;
	}
	if (rx->layers[e->layer / 64] & (1ull << (e->layer % 64))) {
		b->st.descriptors_refused++;
		log_warn("worker %u: transfer '%s': layer %u submitted twice",
			 w->id, x->id, e->layer);
		kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, -EEXIST, 0,
			     e->transfer);
		return;
	}
	rx->layers[e->layer / 64] |= 1ull << (e->layer % 64);
	x->submitted++;
	rc = layer_ready(b, rx, &why);
	if (rc < 0) {
		fail_layer(b, x, e->tag, rc, why, e->layer);
		return;
	}
	if (rc == 1 || rx->ndef) { /* keep the order of deferred layers */
		struct kvb_peer *p = peer_get(b->rm, rx->peer);

		if (defer_layer(b, rx, e->layer, e->tag, e->flags) < 0)
			fail_layer(b, x, e->tag, -ENOMEM, "out of memory",
				   e->layer);
		else if (p && p->stale && p->state != PEER_HS &&
			 kvb_now_ns() >= p->next_refresh)
			peer_start_hs(b, p);
		return;
	}
	issue_layer(b, x, e->layer, e->tag, e->flags);
}

/* ------------------------------------------------------------------ */
/* transfers */

void rx_free(struct kvb_rxfer *rx)
{
	free(rx->lb);
	free(rx->rb);
	free(rx->def);
	free(rx);
}

uint32_t *copy_ids(const uint32_t *ids, uint32_t n)
{
	uint32_t *c;

	if (!n)
		return NULL;
	c = malloc(n * sizeof(*c));
	if (c)
		memcpy(c, ids, n * sizeof(*c));
	return c;
}

/* remote_blocks to every P TP rank of rx->remote_dp at the peer. */
static int announce(struct kvb_broker *b, struct kvb_worker *w,
		    struct kvb_xfer *x)
{
	struct kvb_rxfer *rx = x->rx;
	struct kvb_peer *p = peer_get(b->rm, rx->peer);
	struct kvb_zmsg m;
	uint32_t sent = 0;
	int rc;

	/* once per node: another D rank here may have announced it */
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *v = &b->workers[b->live[i]];
		struct kvb_xfer *y;

		if (v == w || v->role != KVB_ROLE_D)
			continue;
		y = kvb_xfer_find(&b->xfers, v->id, x->id, strlen(x->id));
		if (y && y->rx && y->rx->announced && y->rx->peer == rx->peer)
			return 0;
		/* ... or it ended there already (P wrote every rank) */
		if (!y && kvb_xfer_is_terminal(
				  &b->xfers, v->id,
				  kvb_xfer_hash(v->id, x->id, strlen(x->id))))
			return 0;
	}
	rc = kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, x->id);
	if (rc)
		return rc;
	snprintf(m.req_id, sizeof(m.req_id), "%s", x->id);
	m.decode_rank = w->dp_rank;
	rc = kvb_zmsg_set_blocks(&m, rx->lb, rx->nlb);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < p->desc.nworkers; i++) {
		const struct kvb_hs_worker *hw = &p->desc.workers[i];
		int port;

		if (hw->role != KVB_HS_ROLE_P || hw->dp_rank != rx->remote_dp)
			continue;
		port = kvb_port_of(peer_notify_base(p, rx), hw->dp_rank,
				   hw->tp_rank, hw->tp_size,
				   KVB_PORT_DP_TIMES_TP);
		if (port < 0)
			continue;
		if (!send_msg(b, w, peer_notify_host(p, rx), (uint32_t) port,
			      &m)) {
			sent++;
			b->rm->st.remote_blocks_sent++;
		}
	}
	kvb_zmsg_fini(&m);
	if (!sent) {
		log_warn("transfer '%s': peer %s has no reachable P worker of "
			 "DP rank %u (attach them, then kvb_peer_connect "
			 "again)",
			 x->id, p->desc.node_id, rx->remote_dp);
		return -EHOSTUNREACH;
	}
	rx->announced = 1;
	return 0;
}

int kvb_remote_xopen(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_msg_xopen *m, uint32_t len,
		     uint32_t *handle)
{
	struct kvb_xnode *rm = b->rm;
	const uint32_t *ids = (const uint32_t *) (m + 1);
	struct kvb_peer *p;
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	int err = 0, created;

	if (!rm)
		return -ENOTCONN;
	if ((uint64_t) len !=
		    sizeof(*m) + ((uint64_t) m->nblocks + m->nremote) *
					 sizeof(uint32_t) ||
	    m->id_len == 0 || m->id_len > KVB_XFER_ID_MAX ||
	    m->mode > KVB_XFER_READ || !memchr(m->notify_host, 0, 64) ||
	    m->notify_port > 65535)
		return -EINVAL;
	if (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D)
		return -EINVAL;
	p = peer_get(rm, m->peer);
	if (!(w->role == KVB_ROLE_P && m->mode == KVB_XFER_READ) &&
	    (!p || !p->have_desc))
		return -ENOENT;
	/* block lists each mode needs */
	if ((w->role == KVB_ROLE_P || m->mode == KVB_XFER_WRITE) && !m->nblocks)
		return -EINVAL;
	if (w->role == KVB_ROLE_D && m->mode == KVB_XFER_READ &&
	    (!m->nblocks || m->nremote != m->nblocks))
		return -EINVAL;
	x = kvb_xfer_find(&b->xfers, w->id, m->id, m->id_len);
	created = !x;
	if (!x)
		x = kvb_xfer_open(&b->xfers, w->id, m->id, m->id_len,
				  kvb_now_ns() +
					  (int64_t) b->opt.transfer_timeout_ms *
						  1000000,
				  &err);
	if (!x)
		return err;
	if (x->opened) {
		if (!x->rx)
			return -EBUSY; /* opened as a same-node transfer */
		*handle = kvb_xfer_handle(&b->xfers, x);
		return 0;
	}
	rx = x->rx;
	if (!rx) {
		rx = calloc(1, sizeof(*rx));
		if (!rx)
			goto nomem;
		x->rx = rx;
	} else if (rx->have_rblocks &&
		   (m->mode != KVB_XFER_WRITE || rx->nrb != m->nblocks)) {
		log_warn("transfer '%s': remote_blocks had %u blocks, P opened "
			 "it with %u",
			 x->id, rx->nrb, m->nblocks);
		kvb_xfer_end(&b->xfers, x);
		return -EINVAL;
	}
	rx->peer = m->peer;
	rx->role = (uint8_t) w->role;
	rx->mode = (uint8_t) m->mode;
	rx->flags = (uint8_t) m->flags;
	if (w->role == KVB_ROLE_D)
		rx->remote_dp = m->remote_dp_rank;
	rx->lb = copy_ids(ids, m->nblocks);
	rx->nlb = m->nblocks;
	if (w->role == KVB_ROLE_D && m->mode == KVB_XFER_READ) {
		rx->rb = copy_ids(ids + m->nblocks, m->nremote);
		rx->nrb = m->nremote;
		rx->have_rblocks = 1;
		if (!rx->rb)
			goto nomem;
	}
	if (m->nblocks && !rx->lb)
		goto nomem;
	rx->acks_needed = 1;
	memcpy(rx->notify_host, m->notify_host, sizeof(rx->notify_host));
	rx->notify_port = (uint16_t) m->notify_port;
	/* a transfer created by remote_blocks had the defer deadline */
	x->deadline_ns =
		kvb_now_ns() + (int64_t) b->opt.transfer_timeout_ms * 1000000;
	x->opened = 1;
	if (w->role == KVB_ROLE_D && m->mode == KVB_XFER_WRITE &&
	    !(m->flags & KVB_XFER_F_NO_ANNOUNCE)) {
		int rc = announce(b, w, x);

		if (rc) {
			kvb_xfer_end(&b->xfers, x);
			return rc;
		}
	}
	(void) created;
	*handle = kvb_xfer_handle(&b->xfers, x);
	return 0;
nomem:
	kvb_xfer_end(&b->xfers, x);
	return -ENOMEM;
}

int kvb_remote_xfer_complete(const struct kvb_xfer *x)
{
	const struct kvb_rxfer *rx = x->rx;

	if (rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_READ)
		return x->sealed && rx->acks_got >= rx->acks_needed;
	return kvb_xfer_complete(x);
}

void kvb_remote_xfer_end(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	struct kvb_xnode *rm = b->rm;
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = rm ? peer_get(rm, rx->peer) : NULL;
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);
	struct kvb_zmsg m;

	/* layers that never went out fail with the transfer */
	for (uint32_t i = 0; i < rx->ndef; i++)
		kvb_post_cqe(b, x->worker, KVB_CQ_DESC, rx->def[i].tag,
			     status ? status : -ECANCELED, 0, handle);
	if (rx->ndef && status == -ETIMEDOUT) {
		if (rm) /* the defer or the transfer timeout, whichever first */
			rm->st.defer_expired++;
		log_warn("transfer '%s': %u layer op(s) still waiting "
			 "(remote blocks or the peer) when it timed out",
			 x->id, rx->ndef);
	}
	rx->ndef = 0;
	if (!rm || !w || !p || !x->opened)
		return;
	if (rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_WRITE && !status) {
		/* every layer landed: write_done to each D rank written */
		if (!rx->ntargets && compute_targets(w, p, rx))
			return;
		if (kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, x->id))
			return;
		for (uint32_t t = 0; t < rx->ntargets; t++) {
			int port = kvb_port_of(peer_notify_base(p, rx),
					       rx->remote_dp, rx->targets[t],
					       rx->target_tp,
					       KVB_PORT_DP_TIMES_TP);

			if (port > 0 && !send_msg(b, w, peer_notify_host(p, rx),
						  (uint32_t) port, &m))
				rm->st.write_done_sent++;
		}
	} else if (rx->role == KVB_ROLE_D && rx->mode == KVB_XFER_READ) {
		/* reads done or failed: release the P rank read from */
		int port;

		if (!rx->ntargets && compute_targets(w, p, rx))
			return;
		if (kvb_zmsg_init(&m,
				  rx->flags & KVB_XFER_F_PLAIN_RELEASE
					  ? KVB_ZMSG_PLAIN
					  : KVB_ZMSG_RELEASE,
				  x->id))
			return;
		if (m.type == KVB_ZMSG_RELEASE) {
			m.flags |= KVB_ZMSG_F_CONSUMER_TP;
			m.consumer_tp_size = w->tp_size;
		}
		port = kvb_port_of(peer_notify_base(p, rx), rx->remote_dp,
				   rx->targets[0], rx->target_tp,
				   KVB_PORT_DP_TIMES_TP);
		if (port > 0 && !send_msg(b, w, peer_notify_host(p, rx),
					  (uint32_t) port, &m))
			rm->st.releases_sent++;
	}
}

/* ------------------------------------------------------------------ */
/* regions */

int kvb_remote_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_mem_kv *m)
{
	struct kvb_region_ent *r = kvb_region_get(&b->regions, m->region);
	struct kvb_kv_geom g = {
		.layout = m->layout,
		.num_blocks = m->num_blocks,
		.block_size = m->block_size,
		.num_heads = m->num_heads,
		.head_dim = m->head_dim,
		.elem_size = m->elem_size,
	};

	if (!r || r->dead || r->owner != w->id)
		return -ENOENT;
	if (m->layer >= MAX_LAYERS || kvb_kv_geom_check(&g) ||
	    kvb_kv_region_len(&g) > r->mr.len || r->has_kv)
		return r->has_kv ? -EEXIST : -EINVAL;
	if (m->layer >= w->nkv) {
		uint32_t n = m->layer + 1 < 64 ? 64 : 2 * (m->layer + 1);
		uint32_t *v = realloc(w->kv_layer, n * sizeof(*v));

		if (!v)
			return -ENOMEM;
		memset(v + w->nkv, 0, (n - w->nkv) * sizeof(*v));
		w->kv_layer = v;
		w->nkv = n;
	}
	if (w->kv_layer[m->layer]) {
		struct kvb_region_ent *o =
			kvb_region_get(&b->regions, w->kv_layer[m->layer]);

		if (o && !o->dead)
			return -EEXIST;
	}
	w->kv_layer[m->layer] = r->mr.id;
	r->has_kv = 1;
	r->layer = m->layer;
	r->geom = g;
	return 0;
}

/* ------------------------------------------------------------------ */
/* control requests, service, timers */

int kvb_remote_peer_req(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_msg_peer *m)
{
	struct kvb_xnode *rm = b->rm;
	struct kvb_peer *p;
	int rc;

	if (!rm)
		return -ENOTCONN;
	if (!memchr(m->host, 0, sizeof(m->host)) || !m->host[0] ||
	    m->port == 0 || m->port > 65535)
		return -EINVAL;
	if (!trusted(rm, m->host)) {
		log_warn("worker %u: peer %s is not in --trusted-hosts", w->id,
			 m->host);
		return -EACCES;
	}
	p = peer_find(rm, m->host, (uint16_t) m->port, 1);
	if (!p)
		return -ENOSPC;
	if (p->nwaiters == PEER_WAITERS)
		return -EBUSY;
	p->waiters[p->nwaiters++] = w->id;
	if (p->state == PEER_HS)
		return 1;
	rc = peer_start_hs(b, p);
	if (rc) {
		p->nwaiters--;
		return rc;
	}
	return 1;
}

void kvb_remote_service(struct kvb_broker *b)
{
	struct kvb_xnode *rm = b->rm;

	if (!rm)
		return;
	hs_serve(b);
	for (uint32_t i = 1; i < rm->npeers_max; i++)
		if (rm->peers[i].dealer)
			peer_poll(b, &rm->peers[i]);
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];

		if (w->notify)
			while (kvb_notify_recv(w->notify, NOTIFY_BUDGET) ==
			       (int) NOTIFY_BUDGET)
				;
	}
}

void kvb_remote_timers(struct kvb_broker *b, int64_t now)
{
	struct kvb_xnode *rm = b->rm;

	if (!rm)
		return;
	for (uint32_t i = 1; i < rm->npeers_max; i++) {
		struct kvb_peer *p = &rm->peers[i];

		if (p->ep_pending && now >= p->ep_deadline) {
			log_warn("peer %s:%u: no answer to the rdma offer "
				 "within "
				 "%lld s",
				 p->host, p->port,
				 (long long) (HS_TIMEOUT_NS / 1000000000));
			p->ep_pending = 0; /* the next layer op offers again */
		}
		if (p->state == PEER_HS && now >= p->hs_deadline) {
			log_warn("peer %s:%u: no handshake answer within %lld "
				 "s",
				 p->host, p->port,
				 (long long) (HS_TIMEOUT_NS / 1000000000));
			peer_done(b, p, -ETIMEDOUT);
		}
	}
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		struct kvb_rxfer *rx = x->rx;

		if (rx && rx->ndef && now >= rx->defer_deadline) {
			log_warn("transfer '%s': %s within the defer timeout "
				 "(%u s)",
				 x->id,
				 rx->have_rblocks ? "the peer did not come back"
						  : "no remote_blocks arrived",
				 b->opt.defer_timeout_ms / 1000);
			kvb_xfer_finish(b, x, -ETIMEDOUT);
		} else if (rx && rx->ndef) {
			struct kvb_peer *p = peer_get(rm, rx->peer);

			if (p && p->stale && p->state != PEER_HS &&
			    now >= p->next_refresh)
				peer_start_hs(b, p);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

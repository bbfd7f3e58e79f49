/* SPDX-License-Identifier: MIT */
/*
 * The cross-node bridge inside the broker (docs/protocol.md):
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
 * teardown and region registration: setup.c; peers and the
 * handshake: peer.c; notify messages: notify.c; layer ops:
 * layer.c; a D transfer's remote_blocks (or release), once per node:
 * announce.c.
 */
#include "xnode_priv.h"

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

/* ------------------------------------------------------------------ */
/* small helpers */

int kvb_xn_ep_add_tag(struct kvb_broker *b, int fd, uint64_t tag)
{
	return kvb_engine_watch_fd(b, fd, tag);
}

int kvb_xn_ep_add(struct kvb_broker *b, int fd)
{
	return kvb_engine_watch_fd(b, fd, KVB_EP_REMOTE);
}

void kvb_xn_ep_del(struct kvb_broker *b, int fd)
{
	kvb_engine_unwatch_fd(b, fd);
}

/* Say how many lines the windows that ended suppressed. */
static void rlog_roll(struct kvb_xn *xn, int64_t now)
{
	uint64_t n = kvb_ratelimit_take(&xn->log_rl, now);

	if (n)
		log_warn("cross-node: %llu bad-input log lines suppressed",
			 (unsigned long long) n);
}

int kvb_xn_rlog_ok(struct kvb_xn *xn)
{
	int64_t now = kvb_now_ns();

	rlog_roll(xn, now);
	if (kvb_ratelimit_ok(&xn->log_rl, now))
		return 1;
	xn->st.logs_suppressed++;
	return 0;
}

int kvb_xn_trusted(struct kvb_xn *xn, const char *host)
{
	if (!xn->ntrusted)
		return 1;
	for (uint32_t i = 0; i < xn->ntrusted; i++)
		if (!strcmp(xn->trusted[i], host))
			return 1;
	return 0;
}

struct kvb_peer *kvb_xn_peer_get(struct kvb_xn *xn, uint32_t id)
{
	uint32_t slot = PEER_SLOT(id);

	if (!xn || slot == 0 || slot >= xn->npeers_max ||
	    xn->peers[slot].state == PEER_FREE ||
	    xn->peers[slot].gen != id / MAX_PEERS)
		return NULL;
	return &xn->peers[slot];
}

uint32_t kvb_xn_peer_id(struct kvb_xn *xn, struct kvb_peer *p)
{
	return p->gen * MAX_PEERS + (uint32_t) (p - xn->peers);
}

void kvb_xn_peer_ref(struct kvb_broker *b, struct kvb_peer *p, uint32_t wid)
{
	uint32_t k = PEER_REFS;

	for (uint32_t i = 0; i < PEER_REFS; i++) {
		if (p->refs[i] == wid)
			return;
		if (k == PEER_REFS && !kvb_worker_by_id(b, p->refs[i]))
			k = i; /* empty, or a worker that is gone */
	}
	if (k < PEER_REFS)
		p->refs[k] = wid;
	/* else PEER_REFS live workers hold it already: it is kept anyway */
}

static int peer_referenced(struct kvb_broker *b, const struct kvb_peer *p)
{
	for (uint32_t i = 0; i < PEER_REFS; i++) {
		struct kvb_worker *w =
			p->refs[i] ? kvb_worker_by_id(b, p->refs[i]) : NULL;

		if (w && w->attached)
			return 1;
	}
	return 0;
}

/* The least recently used peer nothing holds, or NULL. */
static struct kvb_peer *peer_victim(struct kvb_xn *xn)
{
	struct kvb_broker *b = xn->b;
	uint8_t busy[MAX_PEERS] = {0};
	struct kvb_peer *v = NULL;

	for (uint32_t i = 0; i < b->xfers.nactive; i++) {
		const struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		struct kvb_peer *p =
			x->rx ? kvb_xn_peer_get(xn, x->rx->peer) : NULL;

		if (p)
			busy[p - xn->peers] = 1;
	}
	for (uint32_t gi = 1; gi < MAX_GROUPS; gi++) {
		struct kvb_peer *p =
			xn->groups[gi].used
				? kvb_xn_peer_get(xn, xn->groups[gi].peer)
				: NULL;

		if (p)
			busy[p - xn->peers] = 1;
	}
	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];

		if (busy[i] || p->state == PEER_HS || p->nwaiters ||
		    peer_referenced(b, p))
			continue;
		if (!v || p->last_use < v->last_use)
			v = p;
	}
	return v;
}

/* Drop an idle peer: its connections, its descriptor; its id dies. */
static void peer_reclaim(struct kvb_xn *xn, struct kvb_peer *p)
{
	uint32_t gen = p->gen + 1 > PEER_GEN_MAX ? 0 : p->gen + 1;

	xn->st.peers_reclaimed++;
	if (kvb_xn_rlog_ok(xn))
		log_info("peer %u %s:%u: idle, dropped to make room for "
			 "another",
			 kvb_xn_peer_id(xn, p), p->host, p->port);
	kvb_xn_close_dealer(xn->b, p);
	kvb_xn_peer_disconnect(xn->b, p);
	kvb_hs_fini(&p->desc);
	free(p->offer);
	memset(p, 0, sizeof(*p));
	p->gen = gen;
	p->dealer_fd = -1;
}

struct kvb_peer *kvb_xn_peer_find(struct kvb_xn *xn, const char *host,
				  uint16_t port, int create)
{
	struct kvb_peer *free_p = NULL;
	uint32_t gen;

	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];

		if (p->state == PEER_FREE) {
			if (!free_p)
				free_p = p;
			continue;
		}
		if (p->port == port && !strcmp(p->host, host)) {
			p->last_use = ++xn->tick;
			return p;
		}
	}
	if (!create)
		return NULL;
	if (!free_p) {
		free_p = peer_victim(xn);
		if (!free_p)
			return NULL;
		peer_reclaim(xn, free_p);
	}
	gen = free_p->gen;
	memset(free_p, 0, sizeof(*free_p));
	free_p->gen = gen;
	snprintf(free_p->host, sizeof(free_p->host), "%s", host);
	free_p->port = port;
	free_p->dealer_fd = -1;
	free_p->state = PEER_FAILED; /* no handshake yet */
	free_p->last_use = ++xn->tick;
	return free_p;
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
const struct kvb_hs_transport *
kvb_xn_desc_transport(const struct kvb_hs_desc *d, const char *name)
{
	for (uint32_t i = 0; i < d->ntransports; i++)
		if (!strcmp(d->transports[i].name, name))
			return &d->transports[i];
	return NULL;
}

/* Both sides speak rdma: it is the transport for this peer. */
int kvb_xn_peer_wants_rdma(struct kvb_broker *b, const struct kvb_peer *p)
{
	return b->trs[KVB_TS_RDMA] && p->have_desc &&
	       kvb_xn_desc_transport(&p->desc, "rdma");
}

int kvb_xn_rdma_ready(struct kvb_broker *b, const struct kvb_peer *p)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];

	return p->ep[KVB_TS_RDMA] && t->ops->ep_state &&
	       t->ops->ep_state(t, p->ep[KVB_TS_RDMA]) == KVB_EP_STATE_READY;
}

unsigned kvb_xn_peer_ts(struct kvb_broker *b, const struct kvb_peer *p)
{
	if (kvb_xn_peer_wants_rdma(b, p))
		return kvb_xn_rdma_ready(b, p) ? KVB_TS_RDMA : 0;
	if (p->ep[KVB_TS_TCP])
		return KVB_TS_TCP;
	return 0;
}

int kvb_xn_send_msg(struct kvb_broker *b, struct kvb_worker *w,
		    const char *host, uint32_t port, const struct kvb_zmsg *m)
{
	int rc = -ENOTCONN;

	/* a failed kvb_notify_send() is counted and logged (rate-limited)
	 * by the endpoint itself */
	struct kvb_notify *n = w ? kvb_xn_notify(b, w) : NULL;

	if (n)
		return kvb_notify_send(n, host, port, m);
	kvb_xn_of(b)->st.send_errors++;
	if (kvb_xn_rlog_ok(kvb_xn_of(b)))
		log_warn("worker %u: cannot send %s for '%s' to %s:%u: %s",
			 w ? w->id : 0, kvb_zmsg_type_name(m->type),
			 m->transfer_id, host, port, strerror(-rc));
	return rc;
}

/* ------------------------------------------------------------------ */
/* transfers */

void kvb_xn_rx_opened(struct kvb_xn *xn, struct kvb_rxfer *rx)
{

	if (!rx->unopened)
		return;
	rx->unopened = 0;
	if (!xn)
		return;
	xn->nunopened--;
	xn->unopened_ids -= rx->nrb;
}

void kvb_xn_rx_free(void *ctx, struct kvb_rxfer *rx)
{
	kvb_xn_rx_opened(ctx, rx);
	if (rx->granted && ctx)
		kvb_grant_drop(((struct kvb_xn *) ctx)->b, rx->granted, rx->lb,
			       rx->nlb, rx->failed && rx->role == KVB_ROLE_D);
	free(rx->lb);
	free(rx->rb);
	free(rx->def);
	free(rx);
}

uint32_t *kvb_xn_copy_ids(const uint32_t *ids, uint32_t n)
{
	uint32_t *c;

	if (!n)
		return NULL;
	c = malloc(n * sizeof(*c));
	if (c)
		memcpy(c, ids, n * sizeof(*c));
	return c;
}

uint32_t kvb_xn_send_to_p_ranks(struct kvb_broker *b, struct kvb_worker *w,
				struct kvb_peer *p, const struct kvb_rxfer *rx,
				struct kvb_zmsg *m)
{
	uint32_t sent = 0;

	for (uint32_t i = 0; i < p->desc.nworkers; i++) {
		const struct kvb_hs_worker *hw = &p->desc.workers[i];
		int port;

		if (hw->role != KVB_HS_ROLE_P || hw->dp_rank != rx->remote_dp)
			continue;
		port = kvb_port_of(peer_notify_base(p, rx), hw->dp_rank,
				   hw->tp_rank, hw->tp_size,
				   KVB_PORT_DP_TIMES_TP);
		if (port > 0 && !kvb_xn_send_msg(b, w, peer_notify_host(p, rx),
						 (uint32_t) port, m))
			sent++;
	}
	return sent;
}

/* Is an open well formed for w (its block lists as its role and mode need
 * them), with a peer where it needs one (or one it waits for)? 0 or
 * -errno. */
static int open_check(struct kvb_xn *xn, struct kvb_worker *w,
		      const struct kvb_xn_open *o)
{
	struct kvb_peer *p;
	int release_only = !!(o->flags & KVB_XFER_F_RELEASE_ONLY);

	if (o->id_len == 0 || o->id_len > KVB_XFER_ID_MAX ||
	    o->mode > KVB_XFER_READ ||
	    (o->flags & ~(KVB_XFER_F_NO_ANNOUNCE | KVB_XFER_F_PLAIN_RELEASE |
			  KVB_XFER_F_RELEASE_ONLY)))
		return -EINVAL;
	if (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D)
		return -EINVAL;
	if (release_only &&
	    (w->role != KVB_ROLE_D || o->mode != KVB_XFER_WRITE))
		return -EINVAL;
	p = kvb_xn_peer_get(xn, o->peer);
	if (!(w->role == KVB_ROLE_P && o->mode == KVB_XFER_READ) && !o->wait &&
	    (!p || !p->have_desc))
		return -ENOENT;
	/* block lists each mode needs */
	if ((w->role == KVB_ROLE_P || o->mode == KVB_XFER_WRITE) && !o->nlb &&
	    !release_only)
		return -EINVAL;
	if (w->role == KVB_ROLE_D && o->mode == KVB_XFER_READ &&
	    (!o->nlb || o->nrb != o->nlb))
		return -EINVAL;
	return 0;
}

/* P reading from D: the ACKs the D ranks will send, typed release or plain
 * string, from the peer's D TP size (a typed release's consumer_tp_size
 * overrides it); 1 where it cannot say. */
static uint32_t read_acks(const struct kvb_worker *w, const struct kvb_peer *p)
{
	uint32_t ctp = 0;
	int a;

	for (uint32_t i = 0; i < p->desc.nworkers; i++) {
		const struct kvb_hs_worker *hw = &p->desc.workers[i];

		if (hw->role != KVB_HS_ROLE_D)
			continue;
		ctp = !ctp || ctp == hw->tp_size ? hw->tp_size : UINT32_MAX;
	}
	a = ctp && ctp != UINT32_MAX ? kvb_tp_release_acks(w->tp_size, ctp)
				     : -EINVAL;
	return a > 0 ? (uint32_t) a : 1;
}

/* What an open does once its peer is known: D/WRITE announces its blocks
 * (or releases them: release-only), P/READ counts the ACKs it waits for.
 * 0 or -errno. */
static int open_steps(struct kvb_broker *b, struct kvb_worker *w,
		      struct kvb_xfer *x)
{
	struct kvb_rxfer *rx = x->rx;
	struct kvb_peer *p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);

	if (rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_READ) {
		if (p && p->have_desc)
			rx->acks_needed = read_acks(w, p);
		return 0;
	}
	if (rx->role != KVB_ROLE_D || rx->mode != KVB_XFER_WRITE)
		return 0;
	if (rx->release_only)
		return kvb_xn_release_only(b, w, x);
	if (rx->flags & KVB_XFER_F_NO_ANNOUNCE)
		return 0;
	return kvb_xn_announce(b, w, x);
}

int kvb_xn_open_ready(struct kvb_broker *b, struct kvb_xfer *x)
{
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);

	rx->wait_peer = 0;
	if (!w || !p || !p->have_desc)
		return -EHOSTUNREACH;
	return open_steps(b, w, x);
}

int kvb_xn_open_one(struct kvb_broker *b, struct kvb_worker *w,
		    const struct kvb_xn_open *o, uint32_t *handle)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_peer *p;
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	int err = 0;

	if (!xn)
		return -ENOTCONN;
	/* malformed first, then a duplicate, then the rest */
	if (o->id_len == 0 || o->id_len > KVB_XFER_ID_MAX ||
	    o->mode > KVB_XFER_READ)
		return -EINVAL;
	x = kvb_xfer_find(&b->xfers, w->id, o->id, o->id_len);
	if (x && x->opened) {
		if (!x->rx)
			return -EBUSY; /* opened as a same-node transfer */
		/* two requests sharing an id would share one transfer */
		xn->st.duplicate_opens++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("worker %u: transfer '%s' opened again while "
				 "it is live: refused (-EEXIST), the open one "
				 "goes on",
				 w->id, x->id);
		return -EEXIST;
	}
	err = open_check(xn, w, o);
	if (err)
		return err;
	p = kvb_xn_peer_get(xn, o->peer);
	err = kvb_xn_live_refuse(b, p);
	if (err)
		return err;
	if (!x)
		x = kvb_xfer_open(
			&b->xfers, w->id, o->id, o->id_len,
			kvb_now_ns() +
				(int64_t) b->opt.transfer_deadline_ms * 1000000,
			&err);
	if (!x)
		return err;
	rx = x->rx;
	if (!rx) {
		rx = calloc(1, sizeof(*rx));
		if (!rx)
			goto nomem;
		x->rx = rx;
	} else if (rx->have_rblocks &&
		   (o->mode != KVB_XFER_WRITE || rx->nrb > o->nlb)) {
		log_warn("transfer '%s': remote_blocks had %u blocks, P opened "
			 "it with %u (D may name fewer, not more)",
			 x->id, rx->nrb, o->nlb);
		kvb_xfer_end(&b->xfers, x);
		return -EINVAL;
	}
	kvb_xn_rx_opened(xn, rx);
	rx->peer = o->peer;
	rx->role = (uint8_t) w->role;
	rx->mode = (uint8_t) o->mode;
	rx->flags = (uint8_t) o->flags;
	rx->release_only = !!(o->flags & KVB_XFER_F_RELEASE_ONLY);
	if (w->role == KVB_ROLE_D)
		rx->remote_dp = o->remote_dp;
	if (!rx->release_only) { /* a release holds no blocks */
		rx->lb = kvb_xn_copy_ids(o->lb, o->nlb);
		rx->nlb = o->nlb;
		if (o->nlb && !rx->lb)
			goto nomem;
	}
	if (w->role == KVB_ROLE_D && o->mode == KVB_XFER_READ) {
		rx->rb = kvb_xn_copy_ids(o->rb, o->nrb);
		rx->nrb = o->nrb;
		rx->have_rblocks = 1;
		if (!rx->rb)
			goto nomem;
	}
	if (!rx->release_only &&
	    ((w->role == KVB_ROLE_D && o->mode == KVB_XFER_WRITE) ||
	     (w->role == KVB_ROLE_P && o->mode == KVB_XFER_READ))) {
		/* D/WRITE: writes after it failed are refused; P/READ: its
		 * blocks may be read while it lives (kvb_grant_read_gate) */
		if (kvb_grant_take(b, w, rx->lb, rx->nlb))
			goto nomem;
		rx->granted = w->id;
	}
	rx->acks_needed = 1; /* P/READ: counted when the peer is known */
	memset(rx->notify_host, 0, sizeof(rx->notify_host));
	if (o->notify_host)
		snprintf(rx->notify_host, sizeof(rx->notify_host), "%s",
			 o->notify_host);
	rx->notify_port = o->notify_port;
	/* a transfer created by remote_blocks had the defer deadline */
	x->deadline_ns =
		kvb_now_ns() + (int64_t) b->opt.transfer_deadline_ms * 1000000;
	x->opened = 1;
	if (o->wait) {
		rx->wait_peer = 1;
		xn->st.opens_waiting++;
	} else if (p && p->have_desc) {
		int rc = open_steps(b, w, x);

		if (rc && rx->release_only) {
			/* told in its completion, as if it had waited */
			x->held_err = rc;
		} else if (rc) {
			kvb_xfer_end(&b->xfers, x);
			return rc;
		}
	}
	*handle = kvb_xfer_handle(&b->xfers, x);
	return 0;
nomem:
	kvb_xfer_end(&b->xfers, x);
	return -ENOMEM;
}

int kvb_xn_xopen(struct kvb_broker *b, struct kvb_worker *w,
		 const struct kvb_msg_xopen *m, uint32_t len, uint32_t *handle)
{
	const uint32_t *ids = (const uint32_t *) (m + 1);
	struct kvb_xn_open o = {
		.id = m->id,
		.id_len = m->id_len,
		.peer = m->peer,
		.mode = m->mode,
		.flags = m->flags,
		.remote_dp = m->remote_dp_rank,
		.lb = ids,
		.nlb = m->nblocks,
		.rb = ids + m->nblocks,
		.nrb = m->nremote,
		.notify_host = m->notify_host,
		.notify_port = (uint16_t) m->notify_port,
	};

	if (!kvb_xn_of(b))
		return -ENOTCONN;
	if ((uint64_t) len !=
		    sizeof(*m) + ((uint64_t) m->nblocks + m->nremote) *
					 sizeof(uint32_t) ||
	    m->id_len == 0 || m->id_len > KVB_XFER_ID_MAX ||
	    !memchr(m->notify_host, 0, 64) || m->notify_port > 65535)
		return -EINVAL;
	return kvb_xn_open_one(b, w, &o, handle);
}

int kvb_xn_xfer_deferred(const struct kvb_xfer *x)
{
	return x->rx && x->rx->ndef;
}

uint32_t kvb_xn_xfer_writers(struct kvb_broker *b, const struct kvb_xfer *x)
{
	const struct kvb_rxfer *rx = x->rx;
	uint32_t ended = x->completed + x->failed;

	if (!kvb_xn_of(b) || !rx || rx->role != KVB_ROLE_D ||
	    rx->mode != KVB_XFER_WRITE || !x->opened || rx->notify_host[0] ||
	    rx->notify_port || rx->peer_lost)
		return 0;
	/* nothing announced: no P writes into it */
	if (rx->wait_peer || rx->release_only || x->held_err)
		return 0;
	if (!x->sealed)
		return ended ? 0 : 1;
	return x->expected > ended ? x->expected - ended : 0;
}

/*
 * A failing D transfer in WRITE mode: ask every P rank it announced its
 * blocks to to stop (a typed release, which P takes as an abort). P's
 * broker answers, once its writes in flight ended, with kvb_write_failed
 * (or write_done when they had all landed): the transfer's completion
 * waits for as many answers as writers may still write, or for its stall
 * timeout at most. Returns how many releases went out.
 */
static uint32_t release_writers(struct kvb_broker *b, struct kvb_xfer *x)
{
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);
	struct kvb_zmsg m;
	uint32_t sent = 0;

	if (!w || !p || kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, x->id))
		return 0;
	sent = kvb_xn_send_to_p_ranks(b, w, p, rx, &m);
	kvb_xn_of(b)->st.releases_sent += sent;
	kvb_zmsg_fini(&m);
	return sent;
}

uint32_t kvb_xn_xfer_fence(struct kvb_broker *b, struct kvb_xfer *x, int status,
			   uint32_t *failed)
{
	struct kvb_rxfer *rx = x->rx;
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);
	uint32_t writers = kvb_xn_xfer_writers(b, x);

	if (writers && !release_writers(b, x))
		writers = 0;
	/* layers that never went out fail now: they count as ended ops
	 * (the engine counts them: *failed) */
	if (rx->ndef && status == -ETIMEDOUT && kvb_xn_of(b))
		kvb_xn_of(b)->st.defer_expired++;
	for (uint32_t i = 0; i < rx->ndef; i++)
		kvb_post_cqe(b, x->worker, KVB_CQ_DESC, rx->def[i].tag, status,
			     0, handle);
	*failed = rx->ndef;
	rx->ndef = 0;
	return writers;
}

int kvb_xn_set_defer(struct kvb_xfer *x, uint32_t defer_ms)
{
	if (!x->rx)
		return -EINVAL;
	x->rx->defer_ms = defer_ms;
	if (x->rx->ndef && defer_ms)
		x->rx->defer_deadline =
			kvb_now_ns() + (int64_t) defer_ms * 1000000;
	return 0;
}

int kvb_xn_xfer_complete(const struct kvb_xfer *x)
{
	const struct kvb_rxfer *rx = x->rx;

	if (rx->wait_peer) /* nothing can be done before the peer is */
		return 0;
	if (rx->release_only) /* its release went out: done once sealed */
		return x->sealed;
	if (rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_READ)
		return x->sealed && rx->acks_got >= rx->acks_needed;
	return kvb_xfer_complete(x);
}

void kvb_xn_xfer_end(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = xn ? kvb_xn_peer_get(xn, rx->peer) : NULL;
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);
	struct kvb_zmsg m;

	rx->failed = status != 0; /* its blocks are fenced (grants.c) */
	/* layers that never went out fail with the transfer */
	for (uint32_t i = 0; i < rx->ndef; i++)
		kvb_post_cqe(b, x->worker, KVB_CQ_DESC, rx->def[i].tag,
			     status ? status : -ECANCELED, 0, handle);
	if (rx->ndef && status == -ETIMEDOUT) {
		if (xn) /* the defer or the transfer timeout, whichever first */
			xn->st.defer_expired++;
		log_warn("transfer '%s': %u layer op(s) still waiting "
			 "(remote blocks or the peer) when it timed out",
			 x->id, rx->ndef);
	}
	rx->ndef = 0;
	if (xn && !x->opened)
		kvb_xn_live_unopened_end(b, x, status);
	/* nothing goes to a lost peer (its new life knows no such id) */
	if (!xn || !w || !p || !x->opened || rx->wait_peer || !p->have_desc ||
	    rx->release_only || rx->peer_lost)
		return;
	if (rx->role == KVB_ROLE_P && rx->mode == KVB_XFER_WRITE) {
		/* every layer landed: write_done to each D rank written. Else
		 * kvb_write_failed, so that D fails now, not at its timeout,
		 * and, to a D that asked us to stop (a release), to say that
		 * none of our writes is in flight any more (this runs once
		 * they drained): only to the peer broker's own ports (not to
		 * an override, which may be a MoRIIO engine) */
		if (status && (rx->notify_host[0] || rx->notify_port))
			return;
		if (!rx->ntargets && kvb_xn_compute_targets(b, w, p, rx))
			return;
		if (kvb_zmsg_init(&m,
				  status ? KVB_ZMSG_WRITE_FAILED
					 : KVB_ZMSG_WRITE_DONE,
				  x->id))
			return;
		m.status = status < 0 && status >= -4095 ? status : -EIO;
		for (uint32_t t = 0; t < rx->ntargets; t++) {
			int port = kvb_port_of(peer_notify_base(p, rx),
					       rx->remote_dp, rx->targets[t],
					       rx->target_tp,
					       KVB_PORT_DP_TIMES_TP);

			if (port <= 0 ||
			    kvb_xn_send_msg(b, w, peer_notify_host(p, rx),
					    (uint32_t) port, &m))
				continue;
			if (status)
				xn->st.write_failed_sent++;
			else
				xn->st.write_done_sent++;
		}
	} else if (rx->role == KVB_ROLE_D && rx->mode == KVB_XFER_READ) {
		/* reads done or failed: release the P rank read from */
		uint32_t n;
		int port;

		if (!rx->ntargets && kvb_xn_compute_targets(b, w, p, rx))
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
		/* P ranks no D rank reads from (P TP larger) wait for a
		 * release all the same: rank d releases the P ranks from the
		 * one it read to the next D rank's */
		n = rx->target_tp > w->tp_size ? rx->target_tp / w->tp_size : 1;
		for (uint32_t k = 0; k < n; k++) {
			port = kvb_port_of(peer_notify_base(p, rx),
					   rx->remote_dp, rx->targets[0] + k,
					   rx->target_tp, KVB_PORT_DP_TIMES_TP);
			if (port > 0 &&
			    !kvb_xn_send_msg(b, w, peer_notify_host(p, rx),
					     (uint32_t) port, &m))
				xn->st.releases_sent++;
		}
	}
}

/* ------------------------------------------------------------------ */
/* regions */

/* w's layer table, for w (an entry of an earlier worker of the slot was
 * freed with it: worker_free) */
static struct kvb_xn_wctx *kv_table(struct kvb_broker *b,
				    const struct kvb_worker *w)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	struct kvb_xn_wctx *ws = xn ? kvb_xn_w(xn, w) : NULL;

	return ws && ws->wid == w->id ? ws : NULL;
}

uint32_t kvb_xn_nkv(struct kvb_broker *b, const struct kvb_worker *w)
{
	struct kvb_xn_wctx *ws = kv_table(b, w);

	return ws ? ws->nkv : 0;
}

const struct kvb_xn_region *kvb_xn_kv_layer(struct kvb_broker *b,
					    const struct kvb_worker *w,
					    uint32_t l,
					    struct kvb_region_ent **r)
{
	struct kvb_xn_wctx *ws = kv_table(b, w);
	const struct kvb_xn_region *kv;

	*r = ws && l < ws->nkv && ws->kv_layer[l]
		     ? kvb_region_get(&b->regions, ws->kv_layer[l])
		     : NULL;
	kv = *r ? kvb_xn_region(kvb_xn_state(b), (*r)->mr.id) : NULL;
	if (!kv || !kv->has_kv) {
		*r = NULL;
		return NULL;
	}
	return kv;
}

/* The mem_kv hook: region m->region of w holds layer m->layer's KV cache,
 * with that geometry (the module owns KV layouts). */
int kvb_xn_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_msg_mem_kv *m)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	struct kvb_region_ent *r = kvb_region_get(&b->regions, m->region);
	struct kvb_xn_region *x = r ? kvb_xn_region(xn, r->mr.id) : NULL;
	struct kvb_xn_wctx *ws = kvb_xn_w(xn, w);
	struct kvb_kv_geom g = {
		.layout = m->layout,
		.num_blocks = m->num_blocks,
		.block_size = m->block_size,
		.num_heads = m->num_heads,
		.head_dim = m->head_dim,
		.elem_size = m->elem_size,
	};

	if (!r || r->dead || r->owner != w->id || !x)
		return -ENOENT;
	if (m->layer >= MAX_LAYERS || kvb_kv_geom_check(&g) ||
	    kvb_kv_region_len(&g) > r->mr.len || x->has_kv)
		return x->has_kv ? -EEXIST : -EINVAL;
	if (ws->wid != w->id) { /* the first of this worker */
		free(ws->kv_layer);
		ws->kv_layer = NULL;
		ws->nkv = 0;
		ws->wid = w->id;
	}
	if (m->layer >= ws->nkv) {
		uint32_t n = m->layer + 1 < 64 ? 64 : 2 * (m->layer + 1);
		uint32_t *v = realloc(ws->kv_layer, n * sizeof(*v));

		if (!v)
			return -ENOMEM;
		memset(v + ws->nkv, 0, (n - ws->nkv) * sizeof(*v));
		ws->kv_layer = v;
		ws->nkv = n;
	}
	if (ws->kv_layer[m->layer]) {
		struct kvb_region_ent *o =
			kvb_region_get(&b->regions, ws->kv_layer[m->layer]);

		if (o && !o->dead)
			return -EEXIST;
	}
	ws->kv_layer[m->layer] = r->mr.id;
	x->has_kv = 1;
	x->layer = m->layer;
	x->geom = g;
	return 0;
}

/* ------------------------------------------------------------------ */
/* control requests, service, timers */

/* Drop the waiters that are gone (a worker that disconnected during the
 * handshake), so that they do not hold the slots until it ends. */
static void waiters_compact(struct kvb_broker *b, struct kvb_peer *p)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < p->nwaiters; i++) {
		struct kvb_worker *w = kvb_worker_by_id(b, p->waiters[i]);

		if (w && w->attached)
			p->waiters[n++] = p->waiters[i];
	}
	p->nwaiters = n;
}

int kvb_xn_peer_req(struct kvb_broker *b, struct kvb_worker *w,
		    const struct kvb_msg_peer *m)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_peer *p;
	int rc;

	if (!xn)
		return -ENOTCONN;
	if (!memchr(m->host, 0, sizeof(m->host)) || !m->host[0] ||
	    m->port == 0 || m->port > 65535)
		return -EINVAL;
	if (!kvb_xn_trusted(xn, m->host)) {
		log_warn("worker %u: peer %s is not in --trusted-hosts", w->id,
			 m->host);
		return -EACCES;
	}
	p = kvb_xn_peer_find(xn, m->host, (uint16_t) m->port, 1);
	if (!p)
		return -ENOSPC;
	if (p->nwaiters == PEER_WAITERS)
		waiters_compact(b, p);
	if (p->nwaiters == PEER_WAITERS)
		return -EBUSY;
	p->waiters[p->nwaiters++] = w->id;
	if (p->state == PEER_HS)
		return 1;
	rc = kvb_xn_peer_start_hs(b, p);
	if (rc) {
		p->nwaiters--;
		return rc;
	}
	return 1;
}

void kvb_xn_service(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	if (!xn)
		return;
	kvb_xn_hs_serve(b);
	for (uint32_t i = 1; i < xn->npeers_max; i++)
		if (xn->peers[i].dealer)
			kvb_xn_peer_poll(b, &xn->peers[i]);
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];

		struct kvb_notify *n = kvb_xn_w(xn, w)->notify;

		if (n)
			while (kvb_notify_recv(n, NOTIFY_BUDGET) ==
			       (int) NOTIFY_BUDGET)
				;
	}
}

void kvb_xn_timers(struct kvb_broker *b, int64_t now)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	if (!xn)
		return;
	/* the count of a burst's suppressed lines comes out within a second
	 * of it, not with the next bad message */
	rlog_roll(xn, now);
	kvb_xn_notify_retry(b, now);
	kvb_xn_live_tick(b, now);
	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];

		if (p->ep_pending && now >= p->ep_deadline) {
			log_warn("peer %s:%u: no answer to the rdma offer "
				 "within "
				 "%lld s",
				 p->host, p->port,
				 (long long) (HS_TIMEOUT_NS / 1000000000));
			p->ep_pending = 0; /* the next layer op offers again */
		}
		if (p->state == PEER_HS && now >= p->hs_deadline) {
			if (!p->live.lost) /* said once, when it was lost */
				log_warn("peer %s:%u: no handshake answer "
					 "within %lld "
					 "s",
					 p->host, p->port,
					 (long long) (HS_TIMEOUT_NS /
						      1000000000));
			kvb_xn_peer_done(b, p, -ETIMEDOUT);
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
			struct kvb_peer *p = kvb_xn_peer_get(xn, rx->peer);

			if (p && p->stale && p->state != PEER_HS &&
			    now >= p->next_refresh)
				kvb_xn_peer_start_hs(b, p);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

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
 * drained without waiting, peers that do not answer time out.
 */
#include "broker.h"

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

#define MAX_PEERS     64u
#define PEER_WAITERS  32u
#define MAX_LAYERS    4096u
#define MAX_GROUPS    65536u
#define HS_TIMEOUT_NS (3ll * 1000000000)
#define REFRESH_NS    (1ll * 1000000000) /* at most one refresh a second */
#define HS_DRAIN      64u
#define NOTIFY_BUDGET 256u
#define MAX_TRUSTED   32u
#define MAX_TARGETS   64u

enum peer_state { PEER_FREE = 0, PEER_HS, PEER_READY, PEER_FAILED };

struct kvb_peer {
	uint8_t state;
	uint8_t have_desc;
	uint8_t stale; /* a transport error: refresh before the next use */
	char host[64];
	uint16_t port;
	void *dealer;
	int dealer_fd;
	int64_t hs_deadline, next_refresh;
	struct kvb_hs_desc desc;
	struct kvb_ep *ep[KVB_TS_MAX];
	uint32_t waiters[PEER_WAITERS]; /* worker ids awaiting the reply */
	uint32_t nwaiters;
	int last_err;
	uint64_t handshakes, failures;
	uint8_t ep_pending; /* rdma offer sent, answer awaited */
	int64_t ep_deadline;
	uint64_t ep_offers, ep_answers;
};

/* "ep" handshake message: an endpoint blob of one transport (rdma offer or
 * answer), sent by the broker at host:port (its handshake address). */
struct ep_msg {
	char host[64];
	uint32_t port;
	uint32_t len;
	uint8_t blob[KVB_HS_CONN_MAX];
};

struct kvb_group {
	uint32_t worker, xfer, peer;
	uint32_t remaining;
	int32_t err;
	uint8_t flags, used;
	uint64_t tag, bytes;
};

struct deferred {
	uint16_t layer;
	uint8_t flags;
	uint64_t tag;
};

struct kvb_rxfer {
	uint32_t peer;
	uint8_t role, mode, flags;
	uint8_t have_rblocks, announced, refreshed;
	uint32_t remote_dp; /* P/WRITE: decode_rank; D: the P DP rank */
	uint32_t *lb, nlb;  /* this worker's block ids */
	uint32_t *rb, nrb;  /* the other side's */
	uint32_t acks_needed, acks_got;
	struct deferred *def;
	uint32_t ndef, capdef;
	int64_t defer_deadline;
	uint64_t layers[MAX_LAYERS / 64];
	char notify_host[64];
	uint16_t notify_port;
	uint32_t ntargets, target_tp;
	uint32_t targets[MAX_TARGETS];
};

struct kvb_xnode {
	void *zctx;
	void *router;
	int router_fd;
	uint64_t instance;
	uint32_t npeers_max;
	struct kvb_peer peers[MAX_PEERS]; /* peer id = index; 0 unused */
	struct kvb_group *groups;
	uint32_t *gfree, ngfree;
	char trusted[MAX_TRUSTED][64];
	uint32_t ntrusted;
	struct {
		uint64_t hs_served, hs_refused, hs_sent, hs_failed;
		uint64_t notify_rejected_closed, notify_received_closed;
		uint64_t notify_sent_closed;
		uint64_t layer_ops, layers_deferred, defer_expired;
		uint64_t remote_blocks_sent, write_done_sent, releases_sent;
		uint64_t write_done_rx, releases_rx, remote_blocks_rx;
		uint64_t send_errors;
		uint64_t rejected; /* by the state machine (also in notify's) */
	} st;
};

static struct kvb_broker *g_b; /* one broker per process */

/* ------------------------------------------------------------------ */
/* small helpers */

static int ep_add(struct kvb_broker *b, int fd)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = KVB_EP_REMOTE};

	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static void ep_del(struct kvb_broker *b, int fd)
{
	if (fd >= 0)
		epoll_ctl(b->epfd, EPOLL_CTL_DEL, fd, NULL);
}

static int trusted(struct kvb_xnode *rm, const char *host)
{
	if (!rm->ntrusted)
		return 1;
	for (uint32_t i = 0; i < rm->ntrusted; i++)
		if (!strcmp(rm->trusted[i], host))
			return 1;
	return 0;
}

static struct kvb_peer *peer_get(struct kvb_xnode *rm, uint32_t id)
{
	if (!rm || id == 0 || id >= rm->npeers_max ||
	    rm->peers[id].state == PEER_FREE)
		return NULL;
	return &rm->peers[id];
}

static uint32_t peer_id(struct kvb_xnode *rm, struct kvb_peer *p)
{
	return (uint32_t) (p - rm->peers);
}

static struct kvb_peer *peer_find(struct kvb_xnode *rm, const char *host,
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
static const struct kvb_hs_transport *
desc_transport(const struct kvb_hs_desc *d, const char *name)
{
	for (uint32_t i = 0; i < d->ntransports; i++)
		if (!strcmp(d->transports[i].name, name))
			return &d->transports[i];
	return NULL;
}

/* Both sides speak rdma: it is the transport for this peer. */
static int peer_wants_rdma(const struct kvb_peer *p)
{
	return g_b->trs[KVB_TS_RDMA] && p->have_desc &&
	       desc_transport(&p->desc, "rdma");
}

static int rdma_ready(const struct kvb_peer *p)
{
#ifdef KVB_HAVE_RDMA
	return p->ep[KVB_TS_RDMA] &&
	       kvb_rdma_ep_state(g_b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA]) ==
		       KVB_RDMA_EP_READY;
#else
	return 0;
#endif
}

static unsigned peer_ts(const struct kvb_peer *p)
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
/* engine descriptor of this node */

static int own_desc(struct kvb_broker *b, struct kvb_hs_desc *d)
{
	struct kvb_xnode *rm = b->rm;
	uint32_t nw = 0;

	memset(d, 0, sizeof(*d));
	snprintf(d->node_id, sizeof(d->node_id), "%s:%u", b->opt.host_ip,
		 b->opt.handshake_port);
	snprintf(d->host, sizeof(d->host), "%s", b->opt.host_ip);
	d->notify_port = b->opt.notify_port;
	d->hs_port = b->opt.handshake_port;
	d->instance = rm->instance;
	if (b->trs[KVB_TS_TCP]) {
		struct kvb_transport *t = b->trs[KVB_TS_TCP];
		struct kvb_hs_transport *ht = &d->transports[0];
		size_t len = KVB_HS_CONN_MAX;

		ht->conn = malloc(len);
		if (!ht->conn)
			return -ENOMEM;
		if (t->ops->local_info(t, ht->conn, &len) == 0) {
			snprintf(ht->name, sizeof(ht->name), "tcp");
			ht->conn_len = (uint32_t) len;
			d->ntransports = 1;
		} else {
			free(ht->conn);
			ht->conn = NULL;
		}
	}
	if (b->trs[KVB_TS_RDMA]) {
		struct kvb_transport *t = b->trs[KVB_TS_RDMA];
		struct kvb_hs_transport *ht = &d->transports[d->ntransports];
		size_t len = KVB_HS_CONN_MAX;

		ht->conn = malloc(len);
		if (!ht->conn)
			return -ENOMEM;
		int rc = t->ops->local_info(t, ht->conn, &len);

		if (rc)
			log_warn("rdma: no connection data to offer: %s",
				 strerror(-rc));
		if (rc == 0) {
			snprintf(ht->name, sizeof(ht->name), "rdma");
			ht->conn_len = (uint32_t) len;
			d->ntransports++;
		} else {
			free(ht->conn);
			ht->conn = NULL;
		}
	}
	d->workers = calloc(b->nlive ? b->nlive : 1, sizeof(*d->workers));
	if (!d->workers)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];
		struct kvb_hs_worker *hw = &d->workers[nw];
		uint32_t nr = 0;

		if (!w->attached ||
		    (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D))
			continue;
		hw->role =
			w->role == KVB_ROLE_P ? KVB_HS_ROLE_P : KVB_HS_ROLE_D;
		hw->dp_rank = w->dp_rank;
		hw->tp_rank = w->tp_rank;
		hw->tp_size = w->tp_size;
		if (w->nkv) {
			hw->regions = calloc(w->nkv, sizeof(*hw->regions));
			if (!hw->regions)
				return -ENOMEM;
		}
		for (uint32_t l = 0; l < w->nkv && nr < KVB_HS_REGIONS_MAX;
		     l++) {
			struct kvb_region_ent *r =
				w->kv_layer[l] ? kvb_region_get(&b->regions,
								w->kv_layer[l])
					       : NULL;
			struct kvb_hs_region *hr = &hw->regions[nr];

			/* peers only see what they may access */
			if (!r || r->dead || !r->has_kv ||
			    !(r->mr.flags &
			      (KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
				continue;
			hr->id = r->mr.id;
			hr->size = r->mr.len;
			hr->geom = r->geom;
			hr->addr = (uint64_t) (uintptr_t) r->mr.addr;
			hr->rkey = r->mr.rkey;
			hr->layer = l;
			nr++;
		}
		hw->nregions = nr;
		nw++;
	}
	d->nworkers = nw;
	return 0;
}

/* ------------------------------------------------------------------ */
/* peers: handshake, transports */

static void fail_dest_ops(struct kvb_broker *b, uint32_t pid, unsigned ts,
			  int status)
{
	struct kvb_dest *d = &b->dests[ts * b->opt.max_workers + pid];

	for (uint32_t i = 0; i < d->n; i++)
		kvb_complete_inflight(b, (uint32_t) d->ops[i].cookie, status);
	d->n = 0;
}

static void peer_disconnect(struct kvb_broker *b, struct kvb_peer *p)
{
	uint32_t pid = peer_id(b->rm, p);

	for (unsigned ts = KVB_TS_TCP; ts < KVB_TS_MAX; ts++) {
		if (!p->ep[ts])
			continue;
		fail_dest_ops(b, pid, ts, -ECONNRESET);
		b->trs[ts]->ops->disconnect(b->trs[ts], p->ep[ts]);
		p->ep[ts] = NULL;
	}
}

/* Take a peer's new descriptor; (re)connect transports when it changed. */
static int peer_adopt(struct kvb_broker *b, struct kvb_peer *p,
		      struct kvb_hs_desc *d)
{
	int same = p->have_desc && p->desc.instance == d->instance &&
		   (p->ep[KVB_TS_TCP] || p->ep[KVB_TS_RDMA]);
	int rc = 0;

	kvb_hs_fini(&p->desc);
	p->desc = *d;
	memset(d, 0, sizeof(*d));
	p->have_desc = 1;
	p->stale = 0;
	if (same)
		return 0;
	peer_disconnect(b, p);
#ifdef KVB_HAVE_TCP
	for (uint32_t i = 0; i < p->desc.ntransports; i++) {
		struct kvb_hs_transport *ht = &p->desc.transports[i];
		struct kvb_transport *t = b->trs[KVB_TS_TCP];

		if (!t || strcmp(ht->name, "tcp"))
			continue;
		rc = kvb_tcp_connect_host(t, ht->conn, ht->conn_len, p->host,
					  &p->ep[KVB_TS_TCP]);
		if (rc)
			log_warn("peer %s:%u: tcp connect: %s", p->host,
				 p->port, strerror(-rc));
	}
#endif
	if (peer_wants_rdma(p)) {
		log_info("peer %u %s:%u (node %s, %u workers): rdma (queue "
			 "pairs connect on first use)",
			 peer_id(b->rm, p), p->host, p->port, p->desc.node_id,
			 p->desc.nworkers);
		return 0;
	}
	if (!peer_ts(p)) {
		char names[128] = "";

		for (uint32_t i = 0; i < p->desc.ntransports; i++)
			snprintf(names + strlen(names),
				 sizeof(names) - strlen(names), "%s%s",
				 i ? "," : "", p->desc.transports[i].name);
		log_warn("peer %s:%u (%s): no transport in common (it offers "
			 "'%s')",
			 p->host, p->port, p->desc.node_id, names);
		return rc ? rc : -EPROTONOSUPPORT;
	}
	log_info("peer %u %s:%u (node %s, %u workers) connected over %s",
		 peer_id(b->rm, p), p->host, p->port, p->desc.node_id,
		 p->desc.nworkers, b->trs[peer_ts(p)]->ops->name);
	return 0;
}

static void peer_reply_waiters(struct kvb_broker *b, struct kvb_peer *p,
			       int status)
{
	for (uint32_t i = 0; i < p->nwaiters; i++) {
		struct kvb_worker *w = kvb_worker_by_id(b, p->waiters[i]);
		struct kvb_msg_peer_reply rep = {.h.type = KVB_MSG_PEER};

		if (!w || !w->attached)
			continue;
		rep.peer = status ? 0 : peer_id(b->rm, p);
		kvb_worker_reply(w, &rep.h, sizeof(rep), status);
	}
	p->nwaiters = 0;
}

static void close_dealer(struct kvb_broker *b, struct kvb_peer *p)
{
	if (!p->dealer)
		return;
	ep_del(b, p->dealer_fd);
	zmq_close(p->dealer);
	p->dealer = NULL;
	p->dealer_fd = -1;
}

static void issue_deferred_of_peer(struct kvb_broker *b, uint32_t pid);
static void hs_reply(void *router, zmq_msg_t *id, int32_t status,
		     const void *body, size_t len);

static void peer_done(struct kvb_broker *b, struct kvb_peer *p, int status)
{
	p->last_err = status;
	if (status) {
		p->failures++;
		b->rm->st.hs_failed++;
		p->state = p->have_desc ? PEER_READY : PEER_FAILED;
		p->stale = 1;
		close_dealer(b, p); /* drop what is queued for a dead peer */
	} else {
		p->state = PEER_READY;
		p->handshakes++;
	}
	peer_reply_waiters(b, p, status);
	if (!status)
		issue_deferred_of_peer(b, peer_id(b->rm, p));
}

static int peer_dealer(struct kvb_broker *b, struct kvb_peer *p)
{
	char ep[96];
	int zero = 0, hwm = 4, rc;
	int64_t maxmsg = KVB_HS_BYTES_MAX + 1024;
	size_t sz = sizeof(p->dealer_fd);

	if (p->dealer)
		return 0;
	p->dealer = zmq_socket(b->rm->zctx, ZMQ_DEALER);
	if (!p->dealer)
		return -errno;
	snprintf(ep, sizeof(ep),
		 strchr(p->host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u",
		 p->host, p->port);
	if (zmq_setsockopt(p->dealer, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_setsockopt(p->dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm)) ||
	    zmq_setsockopt(p->dealer, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) ||
	    zmq_connect(p->dealer, ep) ||
	    zmq_getsockopt(p->dealer, ZMQ_FD, &p->dealer_fd, &sz)) {
		rc = -errno;
		zmq_close(p->dealer);
		p->dealer = NULL;
		return rc;
	}
	ep_add(b, p->dealer_fd);
	return 0;
}

static int peer_start_hs(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_hs_desc d;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (p->state == PEER_HS)
		return 0;
	rc = peer_dealer(b, p);
	if (rc)
		return rc;
	rc = own_desc(b, &d);
	if (!rc)
		rc = kvb_hs_encode(&d, &buf, &len);
	kvb_hs_fini(&d);
	if (rc)
		return rc;
	rc = zmq_send(p->dealer, buf, len, ZMQ_DONTWAIT) < 0 ? -errno : 0;
	free(buf);
	if (rc)
		return rc;
	b->rm->st.hs_sent++;
	p->state = PEER_HS;
	p->hs_deadline = kvb_now_ns() + HS_TIMEOUT_NS;
	p->next_refresh = kvb_now_ns() + REFRESH_NS;
	return 0;
}

/*
 * rdma: make this peer's endpoint ready. The side that needs to post sends
 * an "ep" offer (its endpoint blob) on the handshake channel; the peer
 * connects it and answers with its own; both QP sets are then in RTS (the
 * rdma transport pairs crossing offers itself, see rdma.h).
 */
static int rdma_offer(struct kvb_broker *b, struct kvb_peer *p)
{
#ifdef KVB_HAVE_RDMA
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	const struct kvb_hs_transport *ht = desc_transport(&p->desc, "rdma");
	static struct ep_msg m;
	size_t len = sizeof(m.blob);
	int rc;

	if (!t || !ht)
		return -EPROTONOSUPPORT;
	if (p->ep_pending)
		return 0;
	if (!p->ep[KVB_TS_RDMA]) {
		rc = t->ops->connect(t, ht->conn, ht->conn_len,
				     &p->ep[KVB_TS_RDMA]);
		if (rc) {
			log_warn("peer %s:%u: rdma connect: %s", p->host,
				 p->port, strerror(-rc));
			return rc;
		}
	}
	if (rdma_ready(p))
		return 0;
	memset(&m, 0, sizeof(m));
	snprintf(m.host, sizeof(m.host), "%s", b->opt.host_ip);
	m.port = b->opt.handshake_port;
	rc = kvb_rdma_ep_info(t, p->ep[KVB_TS_RDMA], m.blob, &len);
	if (rc)
		return rc;
	m.len = (uint32_t) len;
	rc = peer_dealer(b, p);
	if (rc)
		return rc;
	if (zmq_send(p->dealer, "ep", 2, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(p->dealer, &m, offsetof(struct ep_msg, blob) + len,
		     ZMQ_DONTWAIT) < 0)
		return -errno;
	p->ep_pending = 1;
	p->ep_offers++;
	p->ep_deadline = kvb_now_ns() + HS_TIMEOUT_NS;
	return 0;
#else
	return -EPROTONOSUPPORT;
#endif
}

/* An rdma blob from the peer (offer or answer): connect it. */
static int rdma_take(struct kvb_broker *b, struct kvb_peer *p, const void *blob,
		     size_t len)
{
#ifdef KVB_HAVE_RDMA
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	struct kvb_ep *ep = NULL;
	int rc;

	if (!t)
		return -EPROTONOSUPPORT;
	rc = t->ops->connect(t, blob, len, &ep);
	if (rc)
		return rc;
	if (p->ep[KVB_TS_RDMA] && p->ep[KVB_TS_RDMA] != ep) {
		/* the peer's endpoint of an older life: drop ours */
		fail_dest_ops(b, peer_id(b->rm, p), KVB_TS_RDMA, -ECONNRESET);
		t->ops->disconnect(t, p->ep[KVB_TS_RDMA]);
	}
	p->ep[KVB_TS_RDMA] = ep;
	if (rdma_ready(p)) {
		log_info("peer %u %s:%u: rdma queue pairs ready",
			 peer_id(b->rm, p), p->host, p->port);
		p->stale = 0;
	}
	return 0;
#else
	return -EPROTONOSUPPORT;
#endif
}

/* "ep" request on the handshake port: [id]["ep"][struct ep_msg]. */
static void hs_serve_ep(struct kvb_broker *b, zmq_msg_t *id, zmq_msg_t *body)
{
	struct ep_msg m;
	size_t n = zmq_msg_size(body);
	struct kvb_peer *p;
	int rc = -EBADMSG;
	static const char why_bad[] = "malformed ep message",
			  why_peer[] = "unknown peer: hand-shake first";

	memset(&m, 0, sizeof(m));
	if (n >= offsetof(struct ep_msg, blob) && n <= sizeof(m)) {
		memcpy(&m, zmq_msg_data(body), n);
		if (memchr(m.host, 0, sizeof(m.host)) &&
		    m.len == n - offsetof(struct ep_msg, blob))
			rc = 0;
	}
	if (rc) {
		b->rm->st.hs_refused++;
		hs_reply(b->rm->router, id, rc, why_bad, sizeof(why_bad) - 1);
		return;
	}
	p = peer_find(b->rm, m.host, (uint16_t) m.port, 0);
	if (!p || !p->have_desc) {
		b->rm->st.hs_refused++;
		hs_reply(b->rm->router, id, -ENOENT, why_peer,
			 sizeof(why_peer) - 1);
		return;
	}
	rc = rdma_take(b, p, m.blob, m.len);
#ifdef KVB_HAVE_RDMA
	if (!rc) {
		static struct ep_msg a;
		size_t len = sizeof(a.blob);

		memset(&a, 0, sizeof(a));
		snprintf(a.host, sizeof(a.host), "%s", b->opt.host_ip);
		a.port = b->opt.handshake_port;
		rc = kvb_rdma_ep_info(b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA],
				      a.blob, &len);
		if (!rc) {
			zmq_msg_t idc;
			int32_t ok = 0;

			a.len = (uint32_t) len;
			zmq_msg_init(&idc);
			zmq_msg_copy(&idc, id);
			if (zmq_msg_send(&idc, b->rm->router,
					 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
				zmq_msg_close(&idc);
			else {
				zmq_send(b->rm->router, &ok, sizeof(ok),
					 ZMQ_SNDMORE | ZMQ_DONTWAIT);
				zmq_send(b->rm->router, "ep", 2,
					 ZMQ_SNDMORE | ZMQ_DONTWAIT);
				zmq_send(b->rm->router, &a,
					 offsetof(struct ep_msg, blob) + len,
					 ZMQ_DONTWAIT);
			}
			p->ep_answers++;
			if (rdma_ready(p))
				issue_deferred_of_peer(b, peer_id(b->rm, p));
			return;
		}
	}
#endif
	log_warn("peer %s:%u: rdma endpoint refused: %s", m.host, m.port,
		 strerror(-rc));
	hs_reply(b->rm->router, id, rc, "rdma endpoint refused", 21);
}

/* Read one multipart message (at most `max` frames); -EAGAIN if none. */
static int recv_frames(void *sock, zmq_msg_t *f, int max, int *nf)
{
	int more = 1, n = 0, extra = 0;

	while (more) {
		zmq_msg_t tmp;
		zmq_msg_t *m = n < max ? &f[n] : &tmp;
		size_t sz = sizeof(more);

		zmq_msg_init(m);
		if (zmq_msg_recv(m, sock, n || extra ? 0 : ZMQ_DONTWAIT) < 0) {
			int e = errno;

			zmq_msg_close(m);
			for (int i = 0; i < n; i++)
				zmq_msg_close(&f[i]);
			return -e;
		}
		if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz))
			more = 0;
		if (n < max)
			n++;
		else {
			zmq_msg_close(&tmp);
			extra++;
		}
	}
	*nf = n;
	return extra ? -EBADMSG : 0;
}

static void close_frames(zmq_msg_t *f, int n)
{
	for (int i = 0; i < n; i++)
		zmq_msg_close(&f[i]);
}

/* A handshake reply on a peer's DEALER: [status][desc | reason]. */
static void peer_poll(struct kvb_broker *b, struct kvb_peer *p)
{
	for (unsigned k = 0; k < HS_DRAIN && p->dealer; k++) {
		zmq_msg_t f[3];
		struct kvb_hs_desc d;
		const char *reason = NULL;
		int32_t status;
		int n = 0, rc;

		rc = recv_frames(p->dealer, f, 3, &n);
		if (rc == -EAGAIN)
			return;
		if (!rc && n == 3 && zmq_msg_size(&f[0]) == sizeof(status) &&
		    zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "ep", 2)) {
			/* the answer to our rdma offer */
			struct ep_msg m;
			size_t sz = zmq_msg_size(&f[2]);

			memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
			memset(&m, 0, sizeof(m));
			if (sz >= offsetof(struct ep_msg, blob) &&
			    sz <= sizeof(m))
				memcpy(&m, zmq_msg_data(&f[2]), sz);
			close_frames(f, n);
			p->ep_pending = 0;
			rc = status ? status
				    : (m.len == sz - offsetof(struct ep_msg,
							      blob)
					       ? rdma_take(b, p, m.blob, m.len)
					       : -EBADMSG);
			if (rc) {
				log_warn("peer %s:%u: rdma answer: %s", p->host,
					 p->port, strerror(-rc));
				continue;
			}
			if (rdma_ready(p))
				issue_deferred_of_peer(b, peer_id(b->rm, p));
			continue;
		}
		if (!rc && n == 3) {
			close_frames(f, n);
			rc = -EBADMSG;
		}
		if (rc || n != 2 || zmq_msg_size(&f[0]) != sizeof(status)) {
			if (!rc)
				close_frames(f, n);
			b->rm->st.rejected++;
			log_warn("peer %s:%u: malformed handshake reply",
				 p->host, p->port);
			continue;
		}
		memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
		if (p->state != PEER_HS) {
			close_frames(f, n); /* late reply to a timed-out ask */
			continue;
		}
		if (status) {
			log_warn("peer %s:%u refused the handshake: %.*s (%s)",
				 p->host, p->port, (int) zmq_msg_size(&f[1]),
				 (const char *) zmq_msg_data(&f[1]),
				 strerror(status < 0 ? -status : status));
			close_frames(f, n);
			peer_done(b, p, status < 0 ? status : -EPROTO);
			continue;
		}
		rc = kvb_hs_decode(&d, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]),
				   &reason);
		close_frames(f, n);
		if (rc) {
			log_warn("peer %s:%u: bad engine descriptor: %s",
				 p->host, p->port, reason ? reason : "?");
			b->rm->st.rejected++;
			peer_done(b, p, rc);
			continue;
		}
		rc = peer_adopt(b, p, &d);
		kvb_hs_fini(&d);
		peer_done(b, p, rc);
	}
}

static void hs_reply(void *router, zmq_msg_t *id, int32_t status,
		     const void *body, size_t len)
{
	zmq_msg_t idc;

	zmq_msg_init(&idc);
	zmq_msg_copy(&idc, id);
	if (zmq_msg_send(&idc, router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&idc);
		return;
	}
	zmq_send(router, &status, sizeof(status), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(router, body, len, ZMQ_DONTWAIT);
}

/* Requests on the handshake port: [identity][descriptor]. */
static void hs_serve(struct kvb_broker *b)
{
	struct kvb_xnode *rm = b->rm;

	for (unsigned k = 0; k < HS_DRAIN; k++) {
		zmq_msg_t f[3];
		struct kvb_hs_desc d, mine;
		const char *reason = NULL, *addr;
		char host[64];
		char *buf = NULL;
		size_t len = 0;
		struct kvb_peer *p;
		int n = 0, rc;

		rc = recv_frames(rm->router, f, 3, &n);
		if (rc == -EAGAIN)
			return;
		if (!rc && n == 3 && zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "ep", 2)) {
			addr = zmq_msg_gets(&f[2], "Peer-Address");
			if (!trusted(rm, addr ? addr : "?")) {
				rm->st.hs_refused++;
				hs_reply(rm->router, &f[0], -EACCES,
					 "not in --trusted-hosts", 22);
			} else {
				hs_serve_ep(b, &f[0], &f[2]);
			}
			close_frames(f, n);
			continue;
		}
		if (rc || n != 2) {
			static const char why[] = "malformed request";

			if (!rc) {
				hs_reply(rm->router, &f[0], -EBADMSG, why,
					 sizeof(why) - 1);
				close_frames(f, n);
			}
			rm->st.hs_refused++;
			log_warn("handshake port: malformed request refused");
			continue;
		}
		addr = zmq_msg_gets(&f[1], "Peer-Address");
		snprintf(host, sizeof(host), "%s", addr ? addr : "?");
		if (!trusted(rm, host)) {
			static const char why[] = "not in --trusted-hosts";

			rm->st.hs_refused++;
			log_warn("handshake from %s refused: %s", host, why);
			hs_reply(rm->router, &f[0], -EACCES, why,
				 sizeof(why) - 1);
			close_frames(f, n);
			continue;
		}
		rc = kvb_hs_decode(&d, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]),
				   &reason);
		if (rc) {
			rm->st.hs_refused++;
			log_warn("handshake from %s refused: %s", host,
				 reason ? reason : strerror(-rc));
			if (rc == -EPROTONOSUPPORT)
				log_warn("peer %s speaks handshake version %u, "
					 "this broker %u",
					 host, d.version, KVB_HS_VERSION);
			hs_reply(rm->router, &f[0], rc,
				 reason ? reason : "bad descriptor",
				 strlen(reason ? reason : "bad descriptor"));
			close_frames(f, n);
			continue;
		}
		/* the requester becomes (or refreshes) a peer of ours */
		p = peer_find(rm, d.host[0] ? d.host : host,
			      (uint16_t) d.hs_port, 1);
		if (p) {
			rc = peer_adopt(b, p, &d);
			if (!rc && p->state != PEER_HS)
				p->state = PEER_READY;
			if (!rc)
				issue_deferred_of_peer(b, peer_id(rm, p));
		} else {
			log_warn("handshake from %s: peer table full (%u)",
				 host, rm->npeers_max - 1);
		}
		kvb_hs_fini(&d);
		rc = own_desc(b, &mine);
		if (!rc)
			rc = kvb_hs_encode(&mine, &buf, &len);
		kvb_hs_fini(&mine);
		if (rc) {
			hs_reply(rm->router, &f[0], rc, "internal error", 14);
		} else {
			hs_reply(rm->router, &f[0], 0, buf, len);
			rm->st.hs_served++;
		}
		free(buf);
		close_frames(f, n);
	}
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

static void issue_deferred(struct kvb_broker *b, struct kvb_xfer *x)
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

static void issue_deferred_of_peer(struct kvb_broker *b, uint32_t pid)
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

static void rx_free(struct kvb_rxfer *rx)
{
	free(rx->lb);
	free(rx->rb);
	free(rx->def);
	free(rx);
}

static uint32_t *copy_ids(const uint32_t *ids, uint32_t n)
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
/* notify messages */

static int reject(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_zmsg *m, int rc, const char *why)
{
	b->rm->st.rejected++;
	log_warn("worker %u: %s for '%s' rejected: %s", w->id,
		 kvb_zmsg_type_name(m->type), m->transfer_id, why);
	return rc;
}

static struct kvb_xfer *find_or_terminal(struct kvb_broker *b,
					 struct kvb_worker *w,
					 const struct kvb_zmsg *m, int *rc)
{
	size_t n = strlen(m->transfer_id);
	struct kvb_xfer *x = kvb_xfer_find(&b->xfers, w->id, m->transfer_id, n);

	*rc = 0;
	if (!x && kvb_xfer_is_terminal(&b->xfers, w->id,
				       kvb_xfer_hash(w->id, m->transfer_id, n)))
		*rc = -ESTALE;
	return x;
}

static int p_remote_blocks(struct kvb_broker *b, struct kvb_worker *w,
			   const struct kvb_zmsg *m)
{
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	struct kvb_peer *p;
	int rc, err = 0;

	b->rm->st.remote_blocks_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc)
		return reject(b, w, m, rc, "the transfer already ended");
	if (!x) { /* before P opened it: keep the blocks until it does */
		x = kvb_xfer_open(&b->xfers, w->id, m->transfer_id,
				  strlen(m->transfer_id),
				  kvb_now_ns() +
					  (int64_t) b->opt.defer_timeout_ms *
						  1000000,
				  &err);
		if (!x)
			return reject(b, w, m, err, "transfer table full");
		x->rx = calloc(1, sizeof(*x->rx));
		if (!x->rx) {
			kvb_xfer_end(&b->xfers, x);
			return -ENOMEM;
		}
		x->rx->role = KVB_ROLE_P;
		x->rx->mode = KVB_XFER_WRITE;
	}
	rx = x->rx;
	if (!rx)
		return reject(b, w, m, -EINVAL,
			      "the id names a same-node transfer");
	if (rx->mode != KVB_XFER_WRITE)
		return reject(b, w, m, -EPROTO,
			      "remote_blocks for a READ-mode transfer");
	if (rx->have_rblocks) {
		if (rx->nrb == m->nblocks &&
		    !memcmp(rx->rb, m->blocks, m->nblocks * sizeof(*m->blocks)))
			return 0; /* the same again: harmless */
		return reject(b, w, m, -EEXIST,
			      "remote_blocks already received with other "
			      "blocks");
	}
	if (x->opened && rx->nlb != m->nblocks)
		return reject(b, w, m, -EINVAL,
			      "block_notify_list length differs from P's "
			      "blocks");
	p = peer_get(b->rm, rx->peer);
	if (x->opened && p && p->have_desc) {
		const struct kvb_hs_worker *hw = NULL;

		for (uint32_t i = 0; i < p->desc.nworkers && !hw; i++)
			if (p->desc.workers[i].role == KVB_HS_ROLE_D &&
			    p->desc.workers[i].dp_rank == m->decode_rank &&
			    p->desc.workers[i].nregions)
				hw = &p->desc.workers[i];
		if (hw) {
			uint32_t nb = hw->regions[0].geom.num_blocks;

			for (uint32_t i = 0; i < m->nblocks; i++)
				if (m->blocks[i] >= nb)
					return reject(b, w, m, -ERANGE,
						      "a block id is past the "
						      "peer's num_blocks");
		}
	}
	rx->rb = copy_ids(m->blocks, m->nblocks);
	if (!rx->rb)
		return -ENOMEM;
	rx->nrb = m->nblocks;
	rx->remote_dp = m->decode_rank;
	rx->have_rblocks = 1;
	if (x->opened && rx->ndef)
		issue_deferred(b, x);
	return 0;
}

static int p_release(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_zmsg *m)
{
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	int rc, err = 0;

	b->rm->st.releases_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc)
		return reject(b, w, m, rc, "the transfer already ended");
	if (m->type == KVB_ZMSG_RELEASE &&
	    (m->flags & KVB_ZMSG_F_CONSUMER_TP) &&
	    kvb_tp_release_acks(w->tp_size, m->consumer_tp_size) < 0)
		return reject(b, w, m, -EINVAL,
			      "consumer_tp_size is not a multiple or divisor "
			      "of this TP size");
	if (!x) { /* abort before P opened it: remember it as ended */
		x = kvb_xfer_open(&b->xfers, w->id, m->transfer_id,
				  strlen(m->transfer_id), 0, &err);
		if (x)
			kvb_xfer_end(&b->xfers, x);
		return 0;
	}
	rx = x->rx;
	if (!rx)
		return reject(b, w, m, -EINVAL,
			      "the id names a same-node transfer");
	if (rx->mode == KVB_XFER_WRITE) {
		log_info("transfer '%s' released (aborted) by the peer", x->id);
		kvb_xfer_finish(b, x, -ECANCELED);
		return 0;
	}
	if (m->type == KVB_ZMSG_RELEASE && (m->flags & KVB_ZMSG_F_CONSUMER_TP))
		rx->acks_needed = (uint32_t) kvb_tp_release_acks(
			w->tp_size, m->consumer_tp_size);
	rx->acks_got++;
	kvb_xfer_maybe_finish(b, x);
	return 0;
}

static int d_write_done(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_zmsg *m)
{
	struct kvb_xfer *x;
	int rc;

	b->rm->st.write_done_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc)
		return reject(b, w, m, rc, "the transfer already ended");
	if (!x) {
		/* another D rank of this node announced it and P wrote every
		 * rank before this one opened: keep the count until it does
		 * (it expires after the transfer timeout if it never does) */
		int err = 0;

		x = kvb_xfer_open(&b->xfers, w->id, m->transfer_id,
				  strlen(m->transfer_id),
				  kvb_now_ns() +
					  (int64_t) b->opt.transfer_timeout_ms *
						  1000000,
				  &err);
		if (!x)
			return reject(b, w, m, err, "transfer table full");
		x->rx = calloc(1, sizeof(*x->rx));
		if (!x->rx) {
			kvb_xfer_end(&b->xfers, x);
			return -ENOMEM;
		}
		x->rx->role = KVB_ROLE_D;
		x->rx->mode = KVB_XFER_WRITE;
	}
	if (!x->rx)
		return reject(b, w, m, -ENOENT,
			      "the id names a same-node transfer");
	if (x->rx->mode != KVB_XFER_WRITE)
		return reject(b, w, m, -EPROTO,
			      "write_done for a READ-mode transfer");
	x->completed++;
	kvb_xfer_maybe_finish(b, x);
	return 0;
}

static int on_notify(void *arg, const struct kvb_zmsg *m, uint16_t port)
{
	struct kvb_broker *b = g_b;
	struct kvb_worker *w = kvb_worker_by_id(b, (uint32_t) (uintptr_t) arg);

	if (!w || !w->attached)
		return -ENXIO;
	if (w->role == KVB_ROLE_P) {
		switch (m->type) {
		case KVB_ZMSG_REMOTE_BLOCKS:
			return p_remote_blocks(b, w, m);
		case KVB_ZMSG_RELEASE:
		case KVB_ZMSG_PLAIN:
			return p_release(b, w, m);
		default:
			return reject(b, w, m, -EPROTO,
				      "meant for a D worker, this is P");
		}
	}
	switch (m->type) {
	case KVB_ZMSG_WRITE_DONE:
	case KVB_ZMSG_PLAIN:
		return d_write_done(b, w, m);
	default:
		return reject(b, w, m, -EPROTO,
			      "meant for a P worker, this is D");
	}
}

static void on_notify_log(void *arg, int level, const char *line)
{
	if (level == KVB_NOTIFY_LOG_WARN)
		log_warn("notify (worker %u): %s", (uint32_t) (uintptr_t) arg,
			 line);
	else
		log_info("notify (worker %u): %s", (uint32_t) (uintptr_t) arg,
			 line);
}

static void notify_close(struct kvb_broker *b, struct kvb_worker *w)
{
	struct kvb_notify_stats st;
	int fds[KVB_NOTIFY_MAX_SOCKS], n;

	if (!w->notify)
		return;
	n = kvb_notify_fds(w->notify, fds, KVB_NOTIFY_MAX_SOCKS);
	for (int i = 0; i < n; i++)
		ep_del(b, fds[i]);
	kvb_notify_get_stats(w->notify, &st);
	b->rm->st.notify_rejected_closed += st.messages_rejected;
	b->rm->st.notify_received_closed += st.messages_received;
	b->rm->st.notify_sent_closed += st.messages_sent;
	kvb_notify_close(w->notify);
	w->notify = NULL;
}

static int notify_open(struct kvb_broker *b, struct kvb_worker *w, int alias)
{
	struct kvb_notify_conf c = {
		.host_ip = b->opt.host_ip,
		.notify_port = b->opt.notify_port,
		.dp_rank = w->dp_rank,
		.tp_rank = w->tp_rank,
		.tp_size = w->tp_size,
		.formula = KVB_PORT_DP_TIMES_TP,
		.defer_alias = true,
		.on_msg = on_notify,
		.on_log = on_notify_log,
		.arg = (void *) (uintptr_t) w->id,
		.zmq_ctx = b->rm->zctx,
	};
	int fds[KVB_NOTIFY_MAX_SOCKS], n, rc;

	rc = kvb_notify_open(&w->notify, &c);
	if (rc) {
		w->notify = NULL;
		return rc;
	}
	if (alias) {
		int ap = kvb_port_of(b->opt.notify_port, w->dp_rank, w->tp_rank,
				     w->tp_size, KVB_PORT_DP_PLUS_TP);
		int taken = 0;

		/* an alias never takes another worker's primary port */
		for (uint32_t i = 0; i < b->nlive && ap > 0; i++) {
			struct kvb_worker *v = &b->workers[b->live[i]];

			if (v != w &&
			    kvb_port_of(b->opt.notify_port, v->dp_rank,
					v->tp_rank, v->tp_size,
					KVB_PORT_DP_TIMES_TP) == ap)
				taken = 1;
		}
		if (!taken)
			kvb_notify_bind_alias(w->notify);
	}
	n = kvb_notify_fds(w->notify, fds, KVB_NOTIFY_MAX_SOCKS);
	for (int i = 0; i < n; i++)
		ep_add(b, fds[i]);
	return 0;
}

int kvb_remote_worker_attached(struct kvb_broker *b, struct kvb_worker *w)
{
	int rc;
	uint16_t ports[2];

	if (!b->rm || (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D))
		return 0;
	rc = notify_open(b, w, 1);
	if (rc == -EADDRINUSE) {
		/* maybe a worker of ours holds it as its alias: take it back */
		int mine =
			kvb_port_of(b->opt.notify_port, w->dp_rank, w->tp_rank,
				    w->tp_size, KVB_PORT_DP_TIMES_TP);

		for (uint32_t i = 0; i < b->nlive; i++) {
			struct kvb_worker *v = &b->workers[b->live[i]];

			if (v == w || !v->notify ||
			    kvb_notify_ports(v->notify, ports, 2) != 2 ||
			    ports[1] != mine)
				continue;
			notify_close(b, v);
			notify_open(b, v, 0);
			rc = notify_open(b, w, 1);
			break;
		}
	}
	if (rc)
		log_warn("worker %u: notify port %d unavailable (%s): no "
			 "cross-node messages for it",
			 w->id,
			 kvb_port_of(b->opt.notify_port, w->dp_rank, w->tp_rank,
				     w->tp_size, KVB_PORT_DP_TIMES_TP),
			 strerror(-rc));
	else if (kvb_notify_ports(w->notify, ports, 2) > 0)
		log_info("worker %u: notify port %u", w->id, ports[0]);
	return rc;
}

void kvb_remote_worker_gone(struct kvb_broker *b, struct kvb_worker *w)
{
	if (!b->rm)
		return;
	notify_close(b, w);
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

static void rdma_reg(struct kvb_broker *b, struct kvb_region_ent *r);

void kvb_remote_reg(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];

	rdma_reg(b, r);
	/* every host region: the tcp receiver checks the KVB_MEM_REMOTE_*
	 * flags itself before landing or sending a byte */
	if (!t || r->mr.kind != KVB_MEM_HOST)
		return;
	if (t->ops->reg_mr(t, &r->mr) == 0)
		r->tcp_reg = 1;
}

static void rdma_reg(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	int rc;

	/* every host region: a source of our writes needs a local key too.
	 * Remote access is still what the descriptor offers: only regions
	 * with KVB_MEM_REMOTE_* go there with their rkey. */
	if (!t || r->mr.kind != KVB_MEM_HOST)
		return;
	rc = t->ops->reg_mr(t, &r->mr);
	if (rc)
		log_warn("region %#x: rdma registration failed: %s", r->mr.id,
			 strerror(-rc));
	else
		r->rdma_reg = 1;
}

void kvb_remote_dereg(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];

	if (t && r->tcp_reg)
		t->ops->dereg_mr(t, &r->mr);
	r->tcp_reg = 0;
	t = b->trs[KVB_TS_RDMA];
	if (t && r->rdma_reg)
		t->ops->dereg_mr(t, &r->mr);
	r->rdma_reg = 0;
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

static void parse_trusted(struct kvb_xnode *rm, const char *list)
{
	const char *s = list;

	while (*s && rm->ntrusted < MAX_TRUSTED) {
		size_t n = strcspn(s, ", ");

		if (n && n < sizeof(rm->trusted[0])) {
			memcpy(rm->trusted[rm->ntrusted], s, n);
			rm->trusted[rm->ntrusted++][n] = '\0';
		}
		s += n;
		s += strspn(s, ", ");
	}
}

int kvb_remote_init(struct kvb_broker *b)
{
	struct kvb_xnode *rm;
	char ep[96];
	size_t sz = sizeof(int);
	int zero = 0, rc;
	int64_t maxmsg = KVB_HS_BYTES_MAX + 1024;

	kvb_xfer_rx_free = rx_free;
	g_b = b;
	if (!b->opt.cross_node)
		return 0;
	rm = calloc(1, sizeof(*rm));
	if (!rm)
		return -ENOMEM;
	b->rm = rm;
	rm->router_fd = -1;
	rm->npeers_max =
		b->opt.max_workers < MAX_PEERS ? b->opt.max_workers : MAX_PEERS;
	if (getrandom(&rm->instance, sizeof(rm->instance), 0) !=
	    sizeof(rm->instance))
		rm->instance = (uint64_t) kvb_now_ns() ^ (uint64_t) getpid();
	parse_trusted(rm, b->opt.trusted_hosts);
	rm->groups = calloc(MAX_GROUPS, sizeof(*rm->groups));
	rm->gfree = calloc(MAX_GROUPS, sizeof(*rm->gfree));
	if (!rm->groups || !rm->gfree)
		return -ENOMEM;
	for (uint32_t i = MAX_GROUPS - 1; i >= 1; i--)
		rm->gfree[rm->ngfree++] = i;
	rm->zctx = zmq_ctx_new();
	if (!rm->zctx)
		return -errno;
#ifdef KVB_HAVE_TCP
	{
		struct kvb_transport_params p = {
			.post_batch_size = b->opt.post_batch_size,
			.host_ip = b->opt.host_ip,
			.tcp_port = b->opt.data_port,
			.timeout_ms = 10000,
		};
		char why[256] = "";

		if (b->opt.transport != KVB_TR_RDMA) {
			rc = kvb_tcp_ops.open(&p, &b->trs[KVB_TS_TCP], why,
					      sizeof(why));
			if (rc) {
				log_err("transport tcp: cannot listen on "
					"%s:%u: "
					"%s",
					b->opt.host_ip, b->opt.data_port,
					why[0] ? why : strerror(-rc));
				return rc;
			}
			if (b->trs[KVB_TS_TCP]->ops->wait_fd) {
				int fd = b->trs[KVB_TS_TCP]->ops->wait_fd(
					b->trs[KVB_TS_TCP]);

				if (fd >= 0)
					ep_add(b, fd);
			}
			log_info("transport tcp ready on %s:%d", b->opt.host_ip,
				 kvb_tcp_port(b->trs[KVB_TS_TCP]));
		}
	}
#endif
#ifdef KVB_HAVE_RDMA
	if (b->opt.transport == KVB_TR_RDMA ||
	    b->opt.transport == KVB_TR_AUTO) {
		struct kvb_transport_params p = {
			.dev_name = b->opt.rdma_dev[0] ? b->opt.rdma_dev : NULL,
			.ib_port = b->opt.ib_port,
			.gid_index = b->opt.gid_index,
			.post_batch_size = b->opt.post_batch_size,
			.qp_per_peer = b->opt.qp_per_transfer,
		};
		char why[256] = "";

		rc = kvb_rdma_ops.open(&p, &b->trs[KVB_TS_RDMA], why,
				       sizeof(why));
		if (rc && b->opt.transport == KVB_TR_RDMA) {
			log_err("transport rdma: unavailable: %s",
				why[0] ? why : strerror(-rc));
			return rc;
		}
		if (rc)
			log_info("transport auto: rdma unavailable (%s); "
				 "across nodes: tcp",
				 why[0] ? why : strerror(-rc));
		else
			log_info("transport rdma ready (%s%s): peers that "
				 "offer rdma use it",
				 b->opt.rdma_dev[0] ? b->opt.rdma_dev
						    : "first device",
				 b->opt.transport == KVB_TR_RDMA
					 ? ", no tcp"
					 : ", tcp for "
					   "the others");
	}
#else
	if (b->opt.transport == KVB_TR_RDMA) {
		log_err("transport rdma: this build has no libibverbs");
		return -ENOTSUP;
	}
#endif
	rm->router = zmq_socket(rm->zctx, ZMQ_ROUTER);
	if (!rm->router)
		return -errno;
	snprintf(ep, sizeof(ep),
		 strchr(b->opt.host_ip, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u",
		 b->opt.host_ip, b->opt.handshake_port);
	if (strchr(b->opt.host_ip, ':')) {
		int one = 1;

		zmq_setsockopt(rm->router, ZMQ_IPV6, &one, sizeof(one));
	}
	if (zmq_setsockopt(rm->router, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_setsockopt(rm->router, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) ||
	    zmq_bind(rm->router, ep) ||
	    zmq_getsockopt(rm->router, ZMQ_FD, &rm->router_fd, &sz)) {
		rc = -errno;
		log_err("handshake port %s: %s", ep, zmq_strerror(-rc));
		return rc;
	}
	ep_add(b, rm->router_fd);
	log_info("cross-node bridge on %s: handshake port %u, notify ports "
		 "from %u%s%s",
		 b->opt.host_ip, b->opt.handshake_port, b->opt.notify_port,
		 rm->ntrusted ? ", trusted hosts " : "",
		 rm->ntrusted ? b->opt.trusted_hosts : "");
	return 0;
}

void kvb_remote_fini(struct kvb_broker *b)
{
	struct kvb_xnode *rm = b->rm;

	if (!rm)
		return;
	for (uint32_t i = 0; i < b->opt.max_workers && b->workers; i++)
		if (b->workers[i].notify)
			notify_close(b, &b->workers[i]);
	for (uint32_t i = 1; i < rm->npeers_max; i++) {
		struct kvb_peer *p = &rm->peers[i];

		if (p->state == PEER_FREE)
			continue;
		peer_reply_waiters(b, p, -ESHUTDOWN);
		close_dealer(b, p);
		peer_disconnect(b, p);
		kvb_hs_fini(&p->desc);
	}
	if (rm->router)
		zmq_close(rm->router);
	if (rm->zctx)
		zmq_ctx_term(rm->zctx);
	free(rm->groups);
	free(rm->gfree);
	free(rm);
	b->rm = NULL;
}

/* ------------------------------------------------------------------ */
/* stats */

__attribute__((format(printf, 4, 5))) static void
put_(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*len + 1 >= cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (n > 0)
		*len += (size_t) n < cap - *len ? (size_t) n : cap - *len - 1;
}

#define PUT(...) put_(buf, cap, &len, __VA_ARGS__)

/* Per-QP counters of a peer's rdma endpoint (kvbctl stats). */
static void qp_stats(struct kvb_broker *b, const struct kvb_peer *p, int json,
		     char *buf, size_t cap, size_t *lenp)
{
#ifdef KVB_HAVE_RDMA
	struct kvb_rdma_qp_stats q;
	size_t len = *lenp;

	for (unsigned i = 0;
	     p->ep[KVB_TS_RDMA] &&
	     !kvb_rdma_qp_stats(b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA], i, &q);
	     i++) {
		if (json)
			PUT("%s{\"qpn\":%u,\"credits\":%u,\"depth\":%u,"
			    "\"in_flight\":%u,\"doorbells\":%llu,\"wrs\":%llu,"
			    "\"ops\":%llu,\"bytes\":%llu,\"cqes\":%llu,"
			    "\"credit_stalls\":%llu,\"wc_errors\":%llu,"
			    "\"resets\":%llu}",
			    i ? "," : "", q.qpn, q.credits, q.depth,
			    q.in_flight, (unsigned long long) q.chain.chains,
			    (unsigned long long) q.chain.wrs,
			    (unsigned long long) q.chain.ops,
			    (unsigned long long) q.chain.bytes,
			    (unsigned long long) q.chain.cqes,
			    (unsigned long long) q.chain.credit_stalls,
			    (unsigned long long) q.chain.wc_errors,
			    (unsigned long long) q.chain.resets);
		else
			PUT("  qp %-6u            %llu WRs in %llu doorbells "
			    "(%.1f per doorbell), %llu CQEs, %llu credit "
			    "stalls, %llu WC errors, %u/%u in flight\n",
			    q.qpn, (unsigned long long) q.chain.wrs,
			    (unsigned long long) q.chain.chains,
			    q.chain.chains ? (double) q.chain.wrs /
						     (double) q.chain.chains
					   : 0.0,
			    (unsigned long long) q.chain.cqes,
			    (unsigned long long) q.chain.credit_stalls,
			    (unsigned long long) q.chain.wc_errors, q.in_flight,
			    q.depth);
	}
	*lenp = len;
#else
	(void) b, (void) p, (void) json, (void) buf, (void) cap, (void) lenp;
#endif
}

size_t kvb_remote_stats(struct kvb_broker *b, int json, char *buf, size_t cap)
{
	struct kvb_xnode *rm = b->rm;
	uint64_t rx = 0, rej = 0, sent = 0, serr = 0;
	size_t len = 0;

	if (!rm || !cap)
		return 0;
	rx = rm->st.notify_received_closed;
	rej = rm->st.notify_rejected_closed;
	sent = rm->st.notify_sent_closed;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];
		struct kvb_notify_stats st;

		if (!w->notify)
			continue;
		kvb_notify_get_stats(w->notify, &st);
		rx += st.messages_received;
		rej += st.messages_rejected;
		sent += st.messages_sent;
		serr += st.send_errors;
	}
	if (json) {
		PUT("\"remote\":{\"messages_received\":%llu,"
		    "\"messages_rejected\":%llu,\"messages_sent\":%llu,"
		    "\"send_errors\":%llu,\"handshakes_served\":%llu,"
		    "\"handshakes_refused\":%llu,\"handshakes_sent\":%llu,"
		    "\"handshakes_failed\":%llu,\"layer_ops\":%llu,"
		    "\"layers_deferred\":%llu,\"defer_expired\":%llu,"
		    "\"remote_blocks_sent\":%llu,\"write_done_sent\":%llu,"
		    "\"releases_sent\":%llu,\"remote_blocks_received\":%llu,"
		    "\"write_done_received\":%llu,\"releases_received\":%llu,"
		    "\"peers\":[",
		    (unsigned long long) rx, (unsigned long long) rej,
		    (unsigned long long) sent,
		    (unsigned long long) (serr + rm->st.send_errors),
		    (unsigned long long) rm->st.hs_served,
		    (unsigned long long) rm->st.hs_refused,
		    (unsigned long long) rm->st.hs_sent,
		    (unsigned long long) rm->st.hs_failed,
		    (unsigned long long) rm->st.layer_ops,
		    (unsigned long long) rm->st.layers_deferred,
		    (unsigned long long) rm->st.defer_expired,
		    (unsigned long long) rm->st.remote_blocks_sent,
		    (unsigned long long) rm->st.write_done_sent,
		    (unsigned long long) rm->st.releases_sent,
		    (unsigned long long) rm->st.remote_blocks_rx,
		    (unsigned long long) rm->st.write_done_rx,
		    (unsigned long long) rm->st.releases_rx);
	} else {
		PUT("notify messages        %llu received, %llu rejected, %llu "
		    "sent, %llu send errors\n",
		    (unsigned long long) rx, (unsigned long long) rej,
		    (unsigned long long) sent,
		    (unsigned long long) (serr + rm->st.send_errors));
		PUT("handshakes             %llu served, %llu refused, %llu "
		    "sent, %llu failed\n",
		    (unsigned long long) rm->st.hs_served,
		    (unsigned long long) rm->st.hs_refused,
		    (unsigned long long) rm->st.hs_sent,
		    (unsigned long long) rm->st.hs_failed);
		PUT("layer ops              %llu (%llu deferred, %llu expired "
		    "waiting)\n",
		    (unsigned long long) rm->st.layer_ops,
		    (unsigned long long) rm->st.layers_deferred,
		    (unsigned long long) rm->st.defer_expired);
		PUT("sent                   %llu remote_blocks, %llu "
		    "write_done, %llu release\n",
		    (unsigned long long) rm->st.remote_blocks_sent,
		    (unsigned long long) rm->st.write_done_sent,
		    (unsigned long long) rm->st.releases_sent);
	}
	for (uint32_t i = 1, k = 0; i < rm->npeers_max; i++) {
		struct kvb_peer *p = &rm->peers[i];
		static const char *const sn[] = {"free", "handshaking", "ready",
						 "failed"};
		unsigned ts = peer_ts(p);

		if (p->state == PEER_FREE)
			continue;
		if (json)
			PUT("%s{\"id\":%u,\"host\":\"%s\",\"port\":%u,"
			    "\"state\":\"%s\",\"stale\":%u,\"node\":\"%s\","
			    "\"workers\":%u,\"transport\":\"%s\","
			    "\"handshakes\":%llu,\"failures\":%llu,\"qps\":[",
			    k++ ? "," : "", i, p->host, p->port, sn[p->state],
			    p->stale, p->have_desc ? p->desc.node_id : "",
			    p->have_desc ? p->desc.nworkers : 0,
			    ts ? b->trs[ts]->ops->name : "none",
			    (unsigned long long) p->handshakes,
			    (unsigned long long) p->failures);
		else
			PUT("peer %-3u               %s:%u %s%s node %s, %u "
			    "workers, over %s\n",
			    i, p->host, p->port, sn[p->state],
			    p->stale ? " (stale)" : "",
			    p->have_desc ? p->desc.node_id : "-",
			    p->have_desc ? p->desc.nworkers : 0,
			    ts ? b->trs[ts]->ops->name : "none");
		qp_stats(b, p, json, buf, cap, &len);
		if (json)
			PUT("]}");
	}
	if (json)
		PUT("]},");
#undef PUT
	return len;
}

uint64_t kvb_remote_rejected(struct kvb_broker *b)
{
	struct kvb_xnode *rm = b->rm;
	uint64_t rej;

	if (!rm)
		return 0;
	rej = rm->st.notify_rejected_closed + rm->st.hs_refused;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_notify_stats st;

		if (!b->workers[b->live[i]].notify)
			continue;
		kvb_notify_get_stats(b->workers[b->live[i]].notify, &st);
		rej += st.messages_rejected;
	}
	return rej;
}

/* SPDX-License-Identifier: MIT */
/*
 * Setting the cross-node bridge up and down: its transports (tcp data port,
 * rdma device), the ZMQ context and handshake port, --trusted-hosts, and
 * the registration of regions with those transports (host regions with
 * both, GPU regions with rdma only). The state machines that use them are
 * in xnode.c.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "nic.h"
#include "zmq/handshake.h"
#include "zmq/notify.h"

static void rdma_reg(struct kvb_broker *b, struct kvb_region_ent *r,
		     struct kvb_xn_region *x);
static void xn_fini(struct kvb_broker *b);

void kvb_xn_reg(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];
	struct kvb_xn_region *x = &kvb_xn_state(b)->regs[r->mr.id & 0xffffu];
	int rc;

	memset(x, 0, sizeof(*x));
	x->id = r->mr.id;
	rdma_reg(b, r, x);
	/* every region: the tcp receiver checks the KVB_MEM_REMOTE_* flags
	 * itself before landing or sending a byte; GPU memory goes through
	 * its host staging buffers, copied by the gpu runtime */
	if (!t)
		return;
	rc = t->ops->reg_mr(t, &r->mr);
	if (rc)
		log_warn("region %#x: tcp registration failed: %s%s", r->mr.id,
			 strerror(-rc),
			 rc == -EOPNOTSUPP && r->mr.kind == KVB_MEM_GPU
				 ? " (GPU memory, and no gpu runtime open)"
				 : "");
	else
		x->tcp_reg = 1;
}

/* GPU memory for the NIC: as a dmabuf where the runtime exports one, else
 * by its address (a peer-memory module: nvidia-peermem, amdgpu; the host
 * backend's "device memory" is host memory). Returns 0 or -errno. */
static int rdma_reg_gpu(struct kvb_transport *t, struct kvb_region_ent *r)
{
	char why[160] = "";
	uint64_t off = 0;
	int fd = -1, rc;

	if (!t->ops->reg_dmabuf)
		return -ENOTSUP; /* a transport without it */
	if (kvb_broker_gpu_dmabuf(r, &fd, &off, why, sizeof(why)))
		fd = -1;
	rc = t->ops->reg_dmabuf(t, &r->mr, fd, off);
	if (fd >= 0)
		close(fd);
	if (rc >= 0)
		log_info(
			"region %#x: GPU memory registered with the NIC %s%s%s",
			r->mr.id,
			rc == 0 ? "as a dmabuf" : "by address (peer memory)",
			fd < 0 ? ": no dmabuf: " : "", fd < 0 ? why : "");
	return rc < 0 ? rc : 0;
}

static void rdma_reg(struct kvb_broker *b, struct kvb_region_ent *r,
		     struct kvb_xn_region *x)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	int rc;

	/* every region: a source of our writes (or the sink of our READs)
	 * needs a local key too. The transport grants remote write / remote
	 * read only as the region's KVB_MEM_REMOTE_* flags say, and only
	 * regions with one of them go into the descriptor with their rkey: a
	 * local-only region cannot be reached from outside. */
	if (!t)
		return;
	rc = r->mr.kind == KVB_MEM_GPU ? rdma_reg_gpu(t, r)
				       : t->ops->reg_mr(t, &r->mr);
	if (rc)
		log_warn("region %#x: rdma registration failed: %s", r->mr.id,
			 strerror(-rc));
	else
		x->rdma_reg = 1;
	if (!rc)
		kvb_xn_log_region_nic(t, r);
}

/* The region_info hook (kvbctl regions): what the module keeps of r. */
static void region_info(struct kvb_broker *b, const struct kvb_region_ent *r,
			struct kvb_region_info *ri)
{
	const struct kvb_xn_region *x =
		kvb_xn_region(kvb_xn_state(b), r->mr.id);

	if (!x)
		return;
	kvb_xn_state(b)->desc_gen++;
	ri->kv = x->has_kv;
	ri->layer = x->layer;
	ri->rdma = x->rdma_reg;
}

static void rdma_event_log(void *arg, int level, const char *line)
{
	(void) arg;
	if (level == KVB_TLOG_ERR)
		log_err("%s", line);
	else if (level == KVB_TLOG_WARN)
		log_warn("%s", line);
	else
		log_info("%s", line);
}

void kvb_xn_rdma_events(struct kvb_broker *b)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];

	if (t && t->ops->events)
		t->ops->events(t, rdma_event_log, NULL);
}

void kvb_xn_dereg(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_xn_region *x = kvb_xn_region(kvb_xn_state(b), r->mr.id);
	struct kvb_transport *t = b->trs[KVB_TS_TCP];

	if (!x)
		return;
	if (t && x->tcp_reg)
		t->ops->dereg_mr(t, &r->mr);
	t = b->trs[KVB_TS_RDMA];
	if (t && x->rdma_reg)
		t->ops->dereg_mr(t, &r->mr);
	memset(x, 0, sizeof(*x)); /* its KV layout goes with it */
}

static void parse_trusted(struct kvb_xn *xn, const char *list)
{
	const char *s = list;

	while (*s && xn->ntrusted < MAX_TRUSTED) {
		size_t n = strcspn(s, ", ");

		if (n && n < sizeof(xn->trusted[0])) {
			memcpy(xn->trusted[xn->ntrusted], s, n);
			xn->trusted[xn->ntrusted++][n] = '\0';
		}
		s += n;
		s += strspn(s, ", ");
	}
}

/* The tcp transport's data port (unless --transport rdma). */
static int open_tcp(struct kvb_broker *b)
{
	const struct kvb_transport_ops *ops = kvb_transport_find("tcp");
	struct kvb_transport_params p = {
		.post_batch_size = b->opt.post_batch_size,
		.host_ip = b->opt.host_ip,
		.tcp_port = b->opt.data_port,
		.timeout_ms = 10000,
		.qp_per_peer = b->opt.tcp_conns,
	};
	char why[256] = "";
	struct kvb_transport *t;
	int rc;

	if (!ops || b->opt.transport == KVB_TR_RDMA)
		return 0;
	rc = ops->open(&p, &b->trs[KVB_TS_TCP], why, sizeof(why));
	if (rc) {
		log_err("transport tcp: cannot listen on %s:%u: %s",
			b->opt.host_ip, b->opt.data_port,
			why[0] ? why : strerror(-rc));
		return rc;
	}
	t = b->trs[KVB_TS_TCP];
	/* late writes into the blocks of a failed transfer (grants.c) */
	if (t->ops->set_write_gate)
		t->ops->set_write_gate(t, kvb_grant_gate, kvb_xn_state(b));
	/* reads of P's KV blocks only while a READ transfer holds them */
	if (t->ops->set_read_gate)
		t->ops->set_read_gate(t, kvb_grant_read_gate, kvb_xn_state(b));
	if (t->ops->wait_fd) {
		int fd = t->ops->wait_fd(t);

		if (fd >= 0)
			kvb_xn_ep_add(b, fd);
	}
	log_info("transport tcp ready on %s:%d", b->opt.host_ip,
		 t->ops->port ? t->ops->port(t) : -1);
	return 0;
}

/* The rdma transport's fds: completions, the device's events. */
static void rdma_watch(struct kvb_broker *b, struct kvb_transport *t)
{
	/* completion events wake a sleeping broker */
	int fd = t->ops->wait_fd ? t->ops->wait_fd(t) : -1;

	if (fd >= 0)
		kvb_xn_ep_add(b, fd);
	/* device events: port down / up, QP errors */
	fd = t->ops->events_fd ? t->ops->events_fd(t) : -1;
	if (fd < 0 || kvb_xn_ep_add_tag(b, fd, KVB_EP_RDMA_EVENTS))
		log_warn("transport rdma: device events (port down, QP "
			 "errors) will not be read");
}

/* The rdma transport (--transport rdma or auto): a device, or tcp only. */
static int open_rdma(struct kvb_broker *b)
{
	const struct kvb_transport_ops *ops = kvb_transport_find("rdma");
	struct kvb_transport_params p = {
		.dev_name = b->opt.rdma_dev[0] ? b->opt.rdma_dev : NULL,
		.ib_port = b->opt.ib_port,
		.gid_index = b->opt.gid_index,
		.post_batch_size = b->opt.post_batch_size,
		.qp_per_peer = b->opt.qp_per_transfer,
		.max_qps = b->opt.max_qps,
	};
	char why[256] = "";
	struct kvb_transport_where where = {0}; /* p.dev_name may point here */
	struct kvb_transport *t;
	int rc;

	if (!ops) {
		if (b->opt.transport != KVB_TR_RDMA)
			return 0;
		log_err("transport rdma: this build has no libibverbs");
		return -ENOTSUP;
	}
	if (b->opt.transport != KVB_TR_RDMA && b->opt.transport != KVB_TR_AUTO)
		return 0;
	/* no --gid-index: the device, port and GID holding --host-ip */
	if (ops->resolve && ops->resolve(&p, b->opt.host_ip, &where) != 1)
		log_info("transport rdma: %s", where.why);
	rc = ops->open(&p, &b->trs[KVB_TS_RDMA], why, sizeof(why));
	if (rc && b->opt.transport == KVB_TR_RDMA) {
		log_err("transport rdma: unavailable: %s",
			why[0] ? why : strerror(-rc));
		return rc;
	}
	if (rc) {
		log_info("transport auto: rdma unavailable (%s); across "
			 "nodes: tcp",
			 why[0] ? why : strerror(-rc));
		return 0;
	}
	t = b->trs[KVB_TS_RDMA];
	/* time inside ibv_post_send (stats post_ns): two clock reads per
	 * doorbell */
	if (t->ops->time_posts)
		t->ops->time_posts(t, 1);
	rdma_watch(b, t);
	/* events pending since open; the transport keeps the log function
	 * for its NIC choices (a region's nearest NIC, QP budgets) */
	kvb_xn_rdma_events(b);
	log_info("transport rdma ready (%s%s): peers that offer rdma use it",
		 p.dev_name ? p.dev_name : "first device",
		 b->opt.transport == KVB_TR_RDMA ? ", no tcp"
						 : ", tcp for the others");
	return 0;
}

static void xn_event(struct kvb_broker *b, uint64_t tag)
{
	if (tag == KVB_EP_RDMA_EVENTS)
		kvb_xn_rdma_events(b);
}

static const struct kvb_engine_hooks xn_hooks = {
	.region_added = kvb_xn_reg,
	.region_gone = kvb_xn_dereg,
	.worker_attached = kvb_xn_worker_attached,
	.worker_gone = kvb_xn_worker_gone,
	.worker_free = kvb_xn_worker_free,
	.layer_op = kvb_xn_layer,
	.group_done = kvb_xn_group_done,
	.xfer_complete = kvb_xn_xfer_complete,
	.xfer_end = kvb_xn_xfer_end,
	.xfer_fence = kvb_xn_xfer_fence,
	.xfer_writers = kvb_xn_xfer_writers,
	.xfer_deferred = kvb_xn_xfer_deferred,
	.set_defer = kvb_xn_set_defer,
	.rx_free = kvb_xn_rx_free,
	.round = kvb_xn_retry_starved,
	.timers = kvb_xn_timers,
	.mem_kv = kvb_xn_mem_kv,
	.peer_req = kvb_xn_peer_req,
	.xopen = kvb_xn_xopen,
	.xopen_batch = kvb_xn_xopen_batch,
	.expect = kvb_xn_expect,
	.event = xn_event,
	.service = kvb_xn_service,
	.rejected = kvb_xn_rejected,
	.stats = kvb_xn_stats,
	.peer_info = kvb_xn_peer_info,
	.region_info = region_info,
	.fini = xn_fini,
};

int kvb_xn_init(struct kvb_broker *b)
{
	struct kvb_xn *xn;
	char ep[96];
	size_t sz = sizeof(int);
	int zero = 0, rc, hwm = 4, hsivl = 2000;
	int64_t maxmsg = KVB_HS_BYTES_MAX + 1024;

	/* registered with or without --host-ip: a worker's KV layout is kept
	 * all the same (xn->on 0: every other request is refused) */
	xn = calloc(1, sizeof(*xn));
	if (!xn)
		return -ENOMEM;
	xn->b = b;
	xn->router_fd = -1;
	kvb_engine_set_hooks(b, &xn_hooks, xn);
	xn->wctx = calloc(b->opt.max_workers, sizeof(*xn->wctx));
	xn->regs = calloc(KVB_MAX_REGIONS, sizeof(*xn->regs));
	if (!xn->wctx || !xn->regs)
		return -ENOMEM;
	if (!b->opt.xnode)
		return 0;
	xn->on = 1;
	kvb_ratelimit_init(&xn->log_rl, RLOG_BURST, 1000000000);
	xn->npeers_max =
		b->opt.max_workers < MAX_PEERS ? b->opt.max_workers : MAX_PEERS;
	if (getrandom(&xn->instance, sizeof(xn->instance), 0) !=
	    sizeof(xn->instance))
		xn->instance = (uint64_t) kvb_now_ns() ^ (uint64_t) getpid();
	parse_trusted(xn, b->opt.trusted_hosts);
	xn->groups = calloc(MAX_GROUPS, sizeof(*xn->groups));
	xn->gfree = calloc(MAX_GROUPS, sizeof(*xn->gfree));
	if (!xn->groups || !xn->gfree)
		return -ENOMEM;
	for (uint32_t i = MAX_GROUPS - 1; i >= 1; i--)
		xn->gfree[xn->ngfree++] = i;
	xn->zctx = zmq_ctx_new();
	if (!xn->zctx)
		return -errno;
	/* ZMQ sockets: two notify ports per worker and its DEALERs to the
	 * notify ports it sends to, a DEALER per peer, the handshake port:
	 * never fewer than libzmq's default 1023, more with many workers */
	rc = zmq_ctx_set(
		xn->zctx, ZMQ_MAX_SOCKETS,
		4 * (int) b->opt.max_workers + (int) MAX_PEERS + 64 > 1023
			? 4 * (int) b->opt.max_workers + (int) MAX_PEERS + 64
			: 1023);
	if (rc)
		log_warn("zmq: cannot set ZMQ_MAX_SOCKETS: %s",
			 zmq_strerror(errno));
	rc = open_tcp(b);
	if (rc)
		return rc;
	rc = open_rdma(b);
	if (rc)
		return rc;
	rc = kvb_xn_auth_init(b);
	if (rc)
		return rc;
	xn->router = zmq_socket(xn->zctx, ZMQ_ROUTER);
	if (!xn->router)
		return -errno;
	snprintf(ep, sizeof(ep),
		 strchr(b->opt.host_ip, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u",
		 b->opt.host_ip, b->opt.handshake_port);
	if (strchr(b->opt.host_ip, ':')) {
		int one = 1;

		zmq_setsockopt(xn->router, ZMQ_IPV6, &one, sizeof(one));
	}
	/* what a stranger can make the handshake port hold: messages of at
	 * most one descriptor, a few queued per connection, and a connection
	 * that does not finish the ZMTP greeting within 2 s is dropped */
	if (zmq_setsockopt(xn->router, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_setsockopt(xn->router, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) ||
	    zmq_setsockopt(xn->router, ZMQ_RCVHWM, &hwm, sizeof(hwm)) ||
	    zmq_setsockopt(xn->router, ZMQ_HANDSHAKE_IVL, &hsivl,
			   sizeof(hsivl)) ||
	    zmq_bind(xn->router, ep) ||
	    zmq_getsockopt(xn->router, ZMQ_FD, &xn->router_fd, &sz)) {
		rc = -errno;
		log_err("handshake port %s: %s", ep, zmq_strerror(-rc));
		return rc;
	}
	kvb_xn_ep_add(b, xn->router_fd);
	log_info("cross-node bridge on %s: handshake port %u, notify ports "
		 "from %u%s%s",
		 b->opt.host_ip, b->opt.handshake_port, b->opt.notify_port,
		 xn->ntrusted ? ", trusted hosts " : "",
		 xn->ntrusted ? b->opt.trusted_hosts : "");
	return 0;
}

static void xn_fini(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_state(b);

	if (!xn)
		return;
	for (uint32_t i = 0; i < b->opt.max_workers && xn->wctx; i++) {
		struct kvb_xn_wctx *ws = &xn->wctx[i];

		if (ws->notify && b->workers)
			kvb_xn_notify_close(b, &b->workers[i]);
		free(ws->kv_layer);
		kvb_grant_free(ws);
	}
	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];

		if (p->state == PEER_FREE)
			continue;
		kvb_xn_peer_reply_waiters(b, p, -ESHUTDOWN);
		kvb_xn_close_dealer(b, p);
		kvb_xn_peer_disconnect(b, p);
		kvb_hs_fini(&p->desc);
		free(p->offer);
	}
	if (xn->on)
		kvb_xn_auth_fini(xn);
	if (xn->router)
		zmq_close(xn->router);
	if (xn->zctx)
		zmq_ctx_term(xn->zctx);
	free(xn->groups);
	free(xn->gfree);
	free(xn->ufifo);
	free(xn->wctx);
	free(xn->regs);
	free(xn);
}

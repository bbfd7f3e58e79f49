/* SPDX-License-Identifier: MIT */
/*
 * `kvbench workload --transport rdma`: the same writes as on `tcp`
 * (wl_tcp.c), as RDMA WRITEs on real RC queue pairs (rxe0 in the soft-RoCE
 * guest of tests/rdma/rxe-runner.sh, or a NIC).
 *
 *  - direct: every P worker opens its own `rdma` transport (its own device
 *    context, PD, CQ) and one endpoint (its own QP) to its D peer, and posts
 *    one chain per (request, layer): one ibv_post_send per chain, as vLLM's
 *    MoRIIO connector does per worker. Each D worker is a receiver process:
 *    its own rdma transport with its layer regions registered, answering the
 *    QP handshake (offer / answer of rdma.h, over a socketpair made by the
 *    parent). RDMA WRITEs are one-sided: the receiver polls nothing. A
 *    request is done when its last WR completed at P (RC: acked by D); P
 *    then tells D on the same socket, as the other direct modes do. The P
 *    and D loops are wl_direct.c's; what is rdma's here is the setup, the
 *    QP handshake and the remote addresses (D's address and rkey).
 *  - broker: two kvbrokers `--transport rdma --host-ip` on one device with
 *    distinct ports (tests/rdma/broker-pair.sh), the broker workers of
 *    wl_tcp.c unchanged.
 *
 * post_cpu: the thread's CPU time inside ibv_post_send on the transport's
 * sampled doorbells (kvb_rdma_time_posts: 1 in 16, stats post_cpu_ns) per
 * WR of those (post_cpu_wrs); direct: the P workers' transports, broker
 * mode: the P broker's (kvbctl stats per_transport). post_wall: the wall
 * time of every call (post_ns) per WR.
 */
#include "kvbench.h"

#if defined(KVB_HAVE_RDMA) && defined(KVB_HAVE_TCP)

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "rdma/conn.h"
#include "rdma/rdma.h"
#include "transport.h"

/* no progress at all: give up (soft-RoCE under TCG is ~1000x slower than a
 * NIC) */
#define STALL_NS (120ll * 1000000000)

/* One handshake message on the worker pair's socket. */
struct hs_msg {
	uint32_t len;	/* of blob */
	uint32_t rkey;	/* answer: D's region */
	uint64_t addr;	/* answer: D's region, layer 0 at offset 0 */
	uint64_t bytes; /* answer: its length */
	uint8_t blob[KVB_RDMA_CONN_MAX];
};

static int open_rdma(struct kvb_transport **t, char side, unsigned rank)
{
	struct kvb_transport_params p = {.dev_name = getenv("KVB_RDMA_DEV"),
					 .ib_port = 1,
					 .gid_index = -1,
					 .post_batch_size = -1,
					 .qp_per_peer = 1};
	char why[160] = "";
	int rc = kvb_rdma_ops.open(&p, t, why, sizeof(why));

	if (rc)
		fprintf(stderr, "kvbench: %c%u: rdma transport: %s %s\n", side,
			rank, strerror(-rc), why);
	return rc;
}

int wl_rdma_probe(struct bench_net *n, const char *ip)
{
	struct kvb_transport *t = NULL;
	struct kvb_transport_params p = {.dev_name = getenv("KVB_RDMA_DEV"),
					 .ib_port = 1,
					 .gid_index = -1,
					 .post_batch_size = -1,
					 .qp_per_peer = 1};
	struct ibv_device **list;
	char why[160] = "";
	int rc = kvb_rdma_ops.open(&p, &t, why, sizeof(why)), nd = 0;
	int base = 20000 + (int) (getpid() % 30) * 400;

	if (rc == -ENODEV && !strncmp(why, "no RDMA device", 14)) {
		fprintf(stderr,
			"kvbench: --transport rdma: %s: run it in the "
			"soft-RoCE guest, see docs/testing.md\n",
			why);
		return -1;
	}
	if (rc) {
		fprintf(stderr,
			"kvbench: --transport rdma: cannot open the rdma "
			"transport: %s%s%s (see docs/testing.md)\n",
			strerror(-rc), why[0] ? ": " : "", why);
		return -1;
	}
	kvb_rdma_ops.close(t);
	memset(n, 0, sizeof(*n));
	n->rdma = 1;
	list = ibv_get_device_list(&nd);
	snprintf(n->rdma_dev, sizeof(n->rdma_dev), "%s",
		 p.dev_name   ? p.dev_name
		 : list && nd ? ibv_get_device_name(list[0])
			      : "?");
	if (list)
		ibv_free_device_list(list);
	/* one device, one address: the brokers need their own ports */
	snprintf(n->ip[0], sizeof(n->ip[0]), "%s", ip);
	snprintf(n->ip[1], sizeof(n->ip[1]), "%s", ip);
	n->hs_port[0] = base;
	n->hs_port[1] = base + 1;
	n->notify_port[0] = base + 10;
	n->notify_port[1] = base + 200;
	return 0;
}

/* ---- direct: P ------------------------------------------------------- */

/* P's side of the handshake: offer, answer, READY. 0 or -1. */
static int p_handshake(struct kvb_transport *t, unsigned rank, int hs,
		       struct kvb_ep **ep, struct hs_msg *m)
{
	size_t len = sizeof(m->blob);
	int rc = t->ops->connect(t, NULL, 0, ep);

	if (!rc)
		rc = kvb_rdma_ep_info(t, *ep, m->blob, &len);
	if (rc) {
		fprintf(stderr, "kvbench: P%u: rdma offer: %s\n", rank,
			strerror(-rc));
		return -1;
	}
	m->len = (uint32_t) len;
	if (send(hs, m, sizeof(*m), 0) != sizeof(*m) ||
	    recv(hs, m, sizeof(*m), 0) != sizeof(*m)) {
		fprintf(stderr, "kvbench: P%u: handshake with D%u: %s\n", rank,
			rank, strerror(errno));
		return -1;
	}
	rc = t->ops->connect(t, m->blob, m->len, ep);
	if (!rc && kvb_rdma_ep_state(t, *ep) != KVB_RDMA_EP_READY)
		rc = -EPROTO;
	if (rc) {
		fprintf(stderr, "kvbench: P%u: rdma answer of D%u: %s\n", rank,
			rank, strerror(-rc));
		return -1;
	}
	return 0;
}

int wl_rdma_direct_p(const struct wl_cfg *c, unsigned rank, int hs,
		     int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t pb = wl_region_bytes_p(c), db = wl_region_bytes_d(c);
	struct wl_layer_io *io = calloc(c->layers, sizeof(*io));
	struct hs_msg *m = calloc(1, sizeof(*m));
	struct kvb_mr mr = {.id = 1, .kind = KVB_MEM_HOST};
	struct wl_mem src;
	struct wl_direct d = {.c = c,
			      .rank = rank,
			      .io = io,
			      .src = &src,
			      .notify_fd = hs,
			      .stall_ns = STALL_NS,
			      .post_ns = kvb_rdma_post_ns};
	int rc;

	if (!io || !m || wl_src_mem(&src, c, rank))
		return 1;
	if (open_rdma(&d.t, 'P', rank))
		return 1;
	/* one region for all layers (the layers sit side by side) */
	mr.addr = src.map;
	mr.len = src.map_len;
	if (d.t->ops->reg_mr(d.t, &mr)) {
		fprintf(stderr, "kvbench: P%u: ibv_reg_mr failed\n", rank);
		return 1;
	}
	/* D answers the handshake only after the first barrier */
	if (wl_sync_start(ready_fd, go[0]) ||
	    p_handshake(d.t, rank, hs, &d.ep, m))
		return 1;
	/* D's answer: one region, layer l at l * db */
	for (unsigned l = 0; l < c->layers; l++)
		io[l] = (struct wl_layer_io){
			.local = &mr,
			.local_off = l * pb,
			.remote = {.addr = m->addr, .rkey = m->rkey},
			.remote_off = l * db};
	kvb_rdma_time_posts(d.t, 1);
	rc = wl_direct_p_run(&d, ready_fd, go[1], res);
	d.t->ops->disconnect(d.t, d.ep);
	d.t->ops->dereg_mr(d.t, &mr);
	d.t->ops->close(d.t);
	wl_mem_free(&src);
	free(io);
	free(m);
	return rc ? 1 : res->failed ? 3 : 0;
}

/* ---- direct: D ------------------------------------------------------- */

int wl_rdma_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		     int hs, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t db = wl_region_bytes_d(c);
	struct kvb_mr mr = {.id = 1,
			    .flags = KVB_MEM_REMOTE_WRITE,
			    .kind = KVB_MEM_HOST,
			    .addr = dmaps[rank],
			    .len = db * c->layers};
	struct hs_msg *m = calloc(1, sizeof(*m));
	void **base = calloc(c->layers, sizeof(*base));
	struct wl_mem dm = {
		.layers = c->layers, .len = db, .at = base, .host = base};
	struct kvb_transport *t = NULL;
	struct kvb_ep *ep = NULL;
	size_t len;
	char byte = 1;
	int rc;

	if (!m || !base)
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		base[l] = (char *) dmaps[rank] + l * db;
	if (open_rdma(&t, 'D', rank))
		return 1;
	if (t->ops->reg_mr(t, &mr)) {
		fprintf(stderr, "kvbench: D%u: ibv_reg_mr failed\n", rank);
		return 1;
	}
	/* no P exists before the first barrier */
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* answer P's offer: our QP goes READY, P's with our answer */
	if (recv(hs, m, sizeof(*m), 0) != sizeof(*m)) {
		fprintf(stderr, "kvbench: D%u: no offer from P%u\n", rank,
			rank);
		return 1;
	}
	rc = t->ops->connect(t, m->blob, m->len, &ep);
	len = sizeof(m->blob);
	if (!rc)
		rc = kvb_rdma_ep_info(t, ep, m->blob, &len);
	if (rc) {
		fprintf(stderr, "kvbench: D%u: rdma offer of P%u: %s\n", rank,
			rank, strerror(-rc));
		return 1;
	}
	m->len = (uint32_t) len;
	m->addr = (uintptr_t) mr.addr;
	m->rkey = mr.rkey;
	m->bytes = mr.len;
	if (send(hs, m, sizeof(*m), 0) != sizeof(*m))
		return 1;
	/* the warm-up is P's: RDMA WRITEs need nothing from us */
	if (write(ready_fd, &byte, 1) != 1 || read(go[1], &byte, 1) != 1)
		return 1;
	rc = wl_direct_d_run(c, rank, hs, &dm, NULL, NULL, res);
	t->ops->disconnect(t, ep);
	t->ops->dereg_mr(t, &mr);
	t->ops->close(t);
	free(m);
	wl_mem_free(&dm);
	return rc ? 1 : res->dbad ? 3 : 0;
}

#else /* no rdma: kvb_bench_check_transport() refuses --transport rdma */

int wl_rdma_probe(struct bench_net *n, const char *ip)
{
	(void) n;
	(void) ip;
	fprintf(stderr, "kvbench: --transport rdma: this kvbench was built "
			"without the rdma transport (libibverbs)\n");
	return 2;
}

#endif /* KVB_HAVE_RDMA && KVB_HAVE_TCP */

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
 *    then tells D on the same socket, as the other direct modes do.
 *  - broker: two kvbrokers `--transport rdma --host-ip` on one device with
 *    distinct ports (tests/rdma/broker-pair.sh), the broker workers of
 *    wl_tcp.c unchanged.
 *
 * post_cpu (direct): wall time inside ibv_post_send (kvb_rdma_time_posts /
 * kvb_rdma_post_ns) per WR. The broker does not time its posts: n/a.
 */
#include "kvbench.h"

#if defined(KVB_HAVE_RDMA) && defined(KVB_HAVE_TCP)

#include <errno.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "rdma/conn.h"
#include "rdma/rdma.h"
#include "transport.h"

#define COMP_BATCH 64u
#define STALL_NS   (120ll * 1000000000) /* no progress at all: give up */
#define WARM	   UINT64_MAX		/* cookie of warm-up WRs */

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

struct rp_state {
	const struct wl_cfg *c;
	unsigned rank;
	struct kvb_transport *t;
	struct wl_pres *res;
	uint32_t *left; /* WRs left per request of the step */
	int64_t *t0;	/* first post of each request of the step */
	uint64_t first; /* the step's first request */
	unsigned pending;
	uint64_t warm_left; /* warm-up WRs not completed */
	int hs;
	int measuring;
};

static int rp_complete(struct rp_state *s, const struct kvb_xcqe *e)
{
	struct wl_pres *res = s->res;
	uint64_t r = e->cookie;

	if (e->status)
		res->failed++;
	if (r == WARM) {
		s->warm_left--;
		return 0;
	}
	if (r >= s->c->requests || --s->left[r])
		return 0;
	{
		double *lat = wl_pres_lat(res);
		uint32_t q = (uint32_t) (s->first + r);

		lat[res->nlat++] =
			(double) (kvb_bench_now_ns() - s->t0[r]) / 1e3;
		if (send(s->hs, &q, sizeof(q), 0) != sizeof(q))
			return -1;
	}
	s->pending--;
	res->done++;
	return 0;
}

/*
 * Reap completions. block = 0: what is there. block = 1: until at least one
 * came. An empty poll yields the CPU: soft-RoCE does its work in kernel
 * threads that a spinning worker would starve (rxe-runner.sh: 2 vCPUs).
 */
static int rp_reap(struct rp_state *s, int block)
{
	struct kvb_xcqe cqe[COMP_BATCH];
	int64_t start = kvb_bench_now_ns();

	for (int got = 0;;) {
		int n = s->t->ops->poll(s->t, cqe, COMP_BATCH), k;

		if (n < 0) {
			fprintf(stderr, "kvbench: P%u: rdma poll: %s\n",
				s->rank, strerror(-n));
			return -1;
		}
		for (k = 0; k < n; k++)
			if (rp_complete(s, &cqe[k]))
				return -1;
		got += n;
		if (n == (int) COMP_BATCH)
			continue;
		if (got || !block)
			return 0;
		sched_yield();
		if (kvb_bench_now_ns() - start > STALL_NS) {
			fprintf(stderr,
				"kvbench: P%u: no rdma completion in %lld s\n",
				s->rank, STALL_NS / 1000000000);
			return -1;
		}
	}
}

/* Post a whole chain (several post() calls only when credit runs out). */
static int rp_post(struct rp_state *s, struct kvb_ep *ep,
		   const struct kvb_xop *ops, unsigned n)
{
	unsigned sent = 0;

	while (sent < n) {
		uint64_t tc = kvb_bench_thread_cpu_ns();
		int rc = s->t->ops->post(s->t, ep, ops + sent, n - sent);

		if (s->measuring)
			s->res->post_cpu_ns += kvb_bench_thread_cpu_ns() - tc;
		if (rc < 0) {
			fprintf(stderr, "kvbench: P%u: rdma post: %s\n",
				s->rank, strerror(-rc));
			return -1;
		}
		sent += (unsigned) rc;
		/* out of credit: wait for completions */
		if (sent < n && rp_reap(s, rc == 0))
			return -1;
	}
	return 0;
}

static void chain(const struct wl_cfg *c, struct kvb_xop *ops,
		  struct kvb_mr *src, const struct hs_msg *d, unsigned l,
		  uint64_t q, uint64_t cookie)
{
	uint64_t pb = wl_region_bytes_p(c), db = wl_region_bytes_d(c);

	for (unsigned j = 0; j < c->blocks; j++)
		ops[j] = (struct kvb_xop){
			.opcode = KVB_XOP_WRITE,
			.local = src,
			.local_off =
				l * pb + wl_src_block(c, q, j) * c->block_bytes,
			.remote = {.addr = d->addr, .rkey = d->rkey},
			.remote_off =
				l * db + wl_dst_block(c, q, j) * c->block_bytes,
			.len = c->block_bytes,
			.cookie = cookie};
}

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
	uint64_t pb = wl_region_bytes_p(c);
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct kvb_xop *ops = calloc(c->blocks, sizeof(*ops));
	struct rp_state s = {.c = c, .rank = rank, .res = res, .hs = hs};
	struct hs_msg *d = calloc(1, sizeof(*d));
	struct kvb_mr src = {.id = 1, .kind = KVB_MEM_HOST};
	struct kvb_ep *ep = NULL;
	uint64_t cpu0, db0, wrs0, pns0;
	int64_t go_ns;
	char *pmem;

	s.left = calloc(c->requests, sizeof(*s.left));
	s.t0 = calloc(c->requests, sizeof(*s.t0));
	pmem = wl_memfd_map(pb * c->layers);
	if (!ops || !d || !s.left || !s.t0 || pmem == MAP_FAILED) {
		fprintf(stderr, "kvbench: P%u (direct): out of memory\n", rank);
		return 1;
	}
	if (open_rdma(&s.t, 'P', rank))
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		wl_fill_src(c, rank, l, (uint64_t *) (pmem + l * pb));
	/* one region for all layers (the layers sit side by side) */
	src.addr = pmem;
	src.len = pb * c->layers;
	if (s.t->ops->reg_mr(s.t, &src)) {
		fprintf(stderr, "kvbench: P%u: ibv_reg_mr failed\n", rank);
		return 1;
	}
	/* D answers the handshake only after the first barrier */
	if (wl_sync_start(ready_fd, go[0]) ||
	    p_handshake(s.t, rank, hs, &ep, d))
		return 1;
	kvb_rdma_time_posts(s.t, 1);
	/* warm-up: every D slot once (faults the pages in, fills caches) */
	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < wl_dslots(c); q++) {
			chain(c, ops, &src, d, l, q, WARM);
			s.warm_left += c->blocks;
			if (rp_post(&s, ep, ops, c->blocks) || rp_reap(&s, 0))
				return 1;
		}
	while (s.warm_left)
		if (rp_reap(&s, 1))
			return 1;
	if (res->failed) {
		fprintf(stderr, "kvbench: P%u: warm-up writes to D%u failed\n",
			rank, rank);
		return 1;
	}
	db0 = s.t->stats.doorbells;
	wrs0 = s.t->stats.wrs;
	pns0 = kvb_rdma_post_ns(s.t);
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	s.measuring = 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	while (next < total) {
		unsigned n = wl_next_step(c, next, total, go_ns);

		s.first = next;
		s.pending = n;
		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				if (l == 0) {
					s.t0[i] = kvb_bench_now_ns();
					s.left[i] = c->layers * c->blocks;
				}
				chain(c, ops, &src, d, l, next + i, i);
				if (rp_post(&s, ep, ops, c->blocks))
					return 1;
				res->descs += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
				if (rp_reap(&s, 0))
					return 1;
			}
		while (s.pending)
			if (rp_reap(&s, 1))
				return 1;
		next += n;
	}
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->doorbells = s.t->stats.doorbells - db0;
	res->wrs = s.t->stats.wrs - wrs0;
	res->verbs_post_ns = kvb_rdma_post_ns(s.t) - pns0;
	res->ok = 1;
	s.t->ops->disconnect(s.t, ep);
	s.t->ops->dereg_mr(s.t, &src);
	s.t->ops->close(s.t);
	return res->failed ? 3 : 0;
}

/* ---- direct: D ------------------------------------------------------- */

int wl_rdma_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		     int hs, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests,
		 db = wl_region_bytes_d(c);
	struct kvb_mr mr = {.id = 1,
			    .flags = KVB_MEM_REMOTE_WRITE,
			    .kind = KVB_MEM_HOST,
			    .addr = dmaps[rank],
			    .len = db * c->layers};
	struct hs_msg *m = calloc(1, sizeof(*m));
	void **base = calloc(c->layers, sizeof(*base));
	struct kvb_transport *t = NULL;
	struct kvb_ep *ep = NULL;
	size_t len;
	char byte = 1;
	uint64_t cpu0;
	uint32_t q;
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
	cpu0 = kvb_bench_proc_cpu_ns();
	while (res->done < total) {
		if (recv(hs, &q, sizeof(q), 0) != sizeof(q)) {
			fprintf(stderr,
				"kvbench: D%u (direct): P%u went away after "
				"%llu requests\n",
				rank, rank, (unsigned long long) res->done);
			return 1;
		}
		if (c->verify) {
			uint64_t tc = kvb_bench_thread_cpu_ns();

			res->dbad += wl_verify_req(c, rank, base, q);
			res->dchecked += (uint64_t) c->layers * c->blocks *
					 c->block_bytes;
			res->verify_ns += kvb_bench_thread_cpu_ns() - tc;
		}
		res->done++;
	}
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	t->ops->disconnect(t, ep);
	t->ops->dereg_mr(t, &mr);
	t->ops->close(t);
	free(m);
	free(base);
	return res->dbad ? 3 : 0;
}

#endif /* KVB_HAVE_RDMA && KVB_HAVE_TCP */

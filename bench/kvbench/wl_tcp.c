/* SPDX-License-Identifier: MIT */
/*
 * The worker processes of `kvbench workload --transport tcp`: the same
 * writes as on `local` (wl_workers.c), across two nodes (two network
 * namespaces or loopback, net.c).
 *
 *  - direct: every P worker opens its own `tcp` transport and one endpoint
 *    (its own socket) to its D peer, and posts one chain per (request,
 *    layer), as vLLM's MoRIIO connector does per worker. Each D worker is a
 *    receiver: its own tcp transport with its layer regions registered,
 *    polled in its own process (one receiver per D worker, none shared).
 *    A request is done when its last WR is acked (the bytes landed at D);
 *    P then tells D over a pipe, as in local direct mode.
 *  - broker: one kvbroker per node (`--transport tcp --host-ip`). Workers
 *    declare one KV region per layer (kvb_mem_set_kv, [blocks, 2, 1, 1,
 *    block_bytes / 2] bytes: one block = one contiguous write), meet through
 *    kvb_peer_connect, and run MoRIIO's WRITE mode: D opens each request with
 *    its block ids and seals expecting one write_done, P opens it with its
 *    own, submits one kvb_submit_layer per layer and seals with the layer
 *    count. Request ids are shared by the TP ranks as in vLLM; D rank 0
 *    announces a request (remote_blocks to every P rank) only once every D
 *    rank opened it, so no write_done can reach a D rank before its open.
 *
 * Block ids: P's ascend, D's descend, as in local mode: nothing merges, one
 * block = one WR in both modes.
 */
#include "kvbench.h"

#ifdef KVB_HAVE_TCP

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "tcp/tcp.h"
#include "transport.h"

#define COMP_BATCH 64u
#define SPIN_NS	   20000ll /* spin this long before sleeping (as kvb_wait) */
#define STALL_NS   (60ll * 1000000000) /* no progress at all: give up */
#define WARM	   UINT64_MAX	       /* cookie of warm-up WRs */

/* ---- direct ---------------------------------------------------------- */

struct tp_state {
	const struct wl_cfg *c;
	unsigned rank;
	struct kvb_transport *t;
	struct wl_pres *res;
	uint32_t *left; /* WRs left per request of the step */
	int64_t *t0;	/* first post of each request of the step */
	uint64_t first; /* the step's first request */
	unsigned pending;
	uint64_t warm_left; /* warm-up WRs not completed */
	int notify_fd;
	int measuring;
};

static int tp_complete(struct tp_state *s, const struct kvb_xcqe *e)
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
		if (write(s->notify_fd, &q, sizeof(q)) != sizeof(q))
			return -1;
	}
	s->pending--;
	res->done++;
	return 0;
}

/*
 * Reap completions. block = 0: what is there. block = 1: until at least one
 * came (spin SPIN_NS, then sleep on the transport's wait fd). 0 or -1.
 */
static int tp_reap(struct tp_state *s, int block)
{
	struct kvb_xcqe cqe[COMP_BATCH];
	int64_t start = kvb_bench_now_ns();
	int wfd = s->t->ops->wait_fd(s->t);

	for (int got = 0;;) {
		int n = s->t->ops->poll(s->t, cqe, COMP_BATCH), k;

		if (n < 0) {
			fprintf(stderr, "kvbench: P%u: tcp poll: %s\n", s->rank,
				strerror(-n));
			return -1;
		}
		for (k = 0; k < n; k++)
			if (tp_complete(s, &cqe[k]))
				return -1;
		got += n;
		if (n == (int) COMP_BATCH)
			continue;
		if (got || !block)
			return 0;
		if (kvb_bench_now_ns() - start < SPIN_NS)
			continue;
		{
			struct pollfd p = {.fd = wfd, .events = POLLIN};

			poll(&p, 1, 100);
		}
		if (kvb_bench_now_ns() - start > STALL_NS) {
			fprintf(stderr,
				"kvbench: P%u: no tcp completion in %lld s\n",
				s->rank, STALL_NS / 1000000000);
			return -1;
		}
	}
}

/* Post a whole chain (several post() calls only when credit runs out). */
static int tp_post(struct tp_state *s, struct kvb_ep *ep,
		   const struct kvb_xop *ops, unsigned n)
{
	unsigned sent = 0;

	while (sent < n) {
		uint64_t tc = kvb_bench_thread_cpu_ns();
		int rc = s->t->ops->post(s->t, ep, ops + sent, n - sent);

		if (s->measuring)
			s->res->post_cpu_ns += kvb_bench_thread_cpu_ns() - tc;
		if (rc < 0) {
			fprintf(stderr, "kvbench: P%u: tcp post: %s\n", s->rank,
				strerror(-rc));
			return -1;
		}
		sent += (unsigned) rc;
		/* out of credit: wait for acks */
		if (sent < n && tp_reap(s, rc == 0))
			return -1;
	}
	return 0;
}

static void chain(const struct wl_cfg *c, struct kvb_xop *ops,
		  struct kvb_mr *src, unsigned l, uint64_t q, uint64_t cookie)
{
	for (unsigned j = 0; j < c->blocks; j++)
		ops[j] = (struct kvb_xop){
			.opcode = KVB_XOP_WRITE,
			.local = &src[l],
			.local_off = wl_src_block(c, q, j) * c->block_bytes,
			.remote.region = l + 1, /* the D receiver's ids */
			.remote_off = wl_dst_block(c, q, j) * c->block_bytes,
			.len = c->block_bytes,
			.cookie = cookie};
}

int wl_tcp_direct_p(const struct wl_cfg *c, unsigned rank, void *shm,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	uint64_t pb = wl_region_bytes_p(c);
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct kvb_transport_params tp = {.post_batch_size = -1,
					  .host_ip = nw->ip[0]};
	struct wl_pres *dres = wl_pres_at(shm, c, 2 * rank + 1);
	struct kvb_mr *src = calloc(c->layers, sizeof(*src));
	struct kvb_xop *ops = calloc(c->blocks, sizeof(*ops));
	struct tp_state s = {
		.c = c, .rank = rank, .res = res, .notify_fd = notify_fd};
	uint8_t blob[KVB_TCP_BLOB_LEN];
	size_t blen = sizeof(blob);
	struct kvb_ep *ep = NULL;
	uint64_t cpu0, db0, wrs0;
	int64_t go_ns;
	char why[160] = "";
	char *pmem;
	int rc;

	s.left = calloc(c->requests, sizeof(*s.left));
	s.t0 = calloc(c->requests, sizeof(*s.t0));
	pmem = wl_memfd_map(pb * c->layers);
	if (!src || !ops || !s.left || !s.t0 || pmem == MAP_FAILED) {
		fprintf(stderr, "kvbench: P%u (direct): out of memory\n", rank);
		return 1;
	}
	rc = kvb_tcp_ops.open(&tp, &s.t, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "kvbench: P%u: tcp transport on %s: %s %s\n",
			rank, nw->ip[0], strerror(-rc), why);
		return 1;
	}
	rc = kvb_tcp_blob_make(nw->ip[1], (uint16_t) dres->port, 0, blob,
			       &blen);
	if (!rc)
		rc = s.t->ops->connect(s.t, blob, blen, &ep);
	if (rc) {
		fprintf(stderr, "kvbench: P%u: endpoint to %s:%d: %s\n", rank,
			nw->ip[1], dres->port, strerror(-rc));
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		src[l] = (struct kvb_mr){.id = l + 1,
					 .kind = KVB_MEM_HOST,
					 .addr = pmem + l * pb,
					 .len = pb};
		wl_fill_src(c, rank, l, (uint64_t *) src[l].addr);
		if (s.t->ops->reg_mr(s.t, &src[l]))
			return 1;
	}
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* warm-up: every D slot once (connects, faults the pages in) */
	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < wl_dslots(c); q++) {
			chain(c, ops, src, l, q, WARM);
			s.warm_left += c->blocks;
			if (tp_post(&s, ep, ops, c->blocks) || tp_reap(&s, 0))
				return 1;
		}
	while (s.warm_left)
		if (tp_reap(&s, 1))
			return 1;
	if (res->failed) {
		fprintf(stderr,
			"kvbench: P%u: warm-up writes to %s:%d failed\n", rank,
			nw->ip[1], dres->port);
		return 1;
	}
	db0 = s.t->stats.doorbells;
	wrs0 = s.t->stats.wrs;
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
				chain(c, ops, src, l, next + i, i);
				if (tp_post(&s, ep, ops, c->blocks))
					return 1;
				res->descs += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
				if (tp_reap(&s, 0))
					return 1;
			}
		while (s.pending)
			if (tp_reap(&s, 1))
				return 1;
		next += n;
	}
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->doorbells = s.t->stats.doorbells - db0;
	res->wrs = s.t->stats.wrs - wrs0;
	res->ok = 1;
	s.t->ops->close(s.t);
	return res->failed ? 3 : 0;
}

/*
 * D receiver: serve the transport until `fd` turns readable (or hangs up):
 * 1. Spins SPIN_NS after the last activity, then sleeps on both.
 */
static int serve_until(struct kvb_transport *t, int fd, unsigned rank)
{
	struct kvb_xcqe cqe[COMP_BATCH];
	int64_t last = kvb_bench_now_ns();
	int wfd = t->ops->wait_fd(t);

	for (;;) {
		struct pollfd p[2] = {{.fd = wfd, .events = POLLIN},
				      {.fd = fd, .events = POLLIN}};
		int k;

		if (t->ops->poll(t, cqe, COMP_BATCH) < 0) {
			fprintf(stderr, "kvbench: D%u: tcp poll failed\n",
				rank);
			return -1;
		}
		k = poll(p, 2, 0);
		if (k == 0 && kvb_bench_now_ns() - last < SPIN_NS)
			continue;
		if (k == 0)
			k = poll(p, 2, 1000);
		if (k > 0)
			last = kvb_bench_now_ns();
		if (p[1].revents)
			return 1;
	}
}

int wl_tcp_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	uint64_t total = (uint64_t) c->iters * c->requests,
		 db = wl_region_bytes_d(c);
	struct kvb_transport_params tp = {.post_batch_size = -1,
					  .host_ip = nw->ip[1]};
	struct kvb_mr *mr = calloc(c->layers, sizeof(*mr));
	void **base = calloc(c->layers, sizeof(*base));
	struct kvb_transport *t = NULL;
	char why[160] = "", byte = 1;
	uint64_t cpu0;
	uint32_t q;
	int rc;

	if (!mr || !base)
		return 1;
	rc = kvb_tcp_ops.open(&tp, &t, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "kvbench: D%u: tcp transport on %s: %s %s\n",
			rank, nw->ip[1], strerror(-rc), why);
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		base[l] = (char *) dmaps[rank] + l * db;
		mr[l] = (struct kvb_mr){.id = l + 1,
					.flags = KVB_MEM_REMOTE_WRITE,
					.kind = KVB_MEM_HOST,
					.addr = base[l],
					.len = db};
		if (t->ops->reg_mr(t, &mr[l]))
			return 1;
	}
	res->port = kvb_tcp_port(t);
	/* no P exists before the first barrier: nothing to serve */
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* the warm-up is P's: ready at once, serving until the run starts */
	if (write(ready_fd, &byte, 1) != 1)
		return 1;
	if (serve_until(t, go[1], rank) < 0 || read(go[1], &byte, 1) != 1)
		return 1;
	cpu0 = kvb_bench_proc_cpu_ns();
	while (res->done < total) {
		if (serve_until(t, notify_fd, rank) < 0)
			return 1;
		if (read(notify_fd, &q, sizeof(q)) != sizeof(q)) {
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
	t->ops->close(t);
	free(mr);
	free(base);
	return res->dbad ? 3 : 0;
}

/* ---- broker ---------------------------------------------------------- */

static int attach(const char *sock, enum kvb_role role, unsigned rank,
		  unsigned size, struct kvb_ctx **ctx)
{
	struct kvb_attach_opts o = {.socket_path = sock,
				    .role = role,
				    .tp_rank = rank,
				    .tp_size = size,
				    .timeout_ms = 10000};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "kvbench: attach %s%u to %s: %s\n",
			role == KVB_ROLE_P ? "P" : "D", rank, sock,
			kvb_strerror(rc));
	return rc;
}

/* One KV region per layer, blocks first: block b = bytes [b*S, (b+1)*S). */
static int kv_regions(struct kvb_ctx *ctx, const struct wl_cfg *c,
		      unsigned rank, int is_d, struct kvb_region *reg)
{
	uint64_t len = is_d ? wl_region_bytes_d(c) : wl_region_bytes_p(c);
	struct kvb_kv_geometry g = {
		.layout = KVB_KV_BLOCK_FIRST,
		.num_blocks = (uint32_t) (len / c->block_bytes),
		.block_size = 1,
		.num_heads = 1,
		.head_dim = (uint32_t) (c->block_bytes / 2), /* K, V halves */
		.elem_size = 1};

	for (unsigned l = 0; l < c->layers; l++) {
		/* P: REMOTE_READ as MoRIIO's read mode needs; the broker only
		 * registers regions with a remote flag with its tcp transport,
		 * and a WRITE's source must be registered there */
		int rc = kvb_mem_alloc(ctx, len,
				       is_d ? KVB_MEM_REMOTE_WRITE
					    : KVB_MEM_REMOTE_READ,
				       l, &reg[l]);

		if (!rc)
			rc = kvb_mem_set_kv(ctx, reg[l].id, l, &g);
		if (rc) {
			fprintf(stderr, "kvbench: %c%u: layer %u region: %s\n",
				is_d ? 'D' : 'P', rank, l, kvb_strerror(rc));
			return -1;
		}
		if (is_d)
			memset(reg[l].addr, 0, len); /* pages in before */
		else
			wl_fill_src(c, rank, l, reg[l].addr);
	}
	return 0;
}

/* The other node's broker; it may still be setting up: retry 15 s. */
static int peer(struct kvb_ctx *ctx, const char *who, unsigned rank,
		const char *host, int port, uint32_t *out)
{
	int64_t end = kvb_bench_now_ns() + 15000000000ll;
	int rc;

	do {
		rc = kvb_peer_connect(ctx, host, (uint16_t) port, out);
		if (rc && rc != -EACCES && rc != -EPROTONOSUPPORT)
			usleep(100000);
	} while (rc && rc != -EACCES && rc != -EPROTONOSUPPORT &&
		 kvb_bench_now_ns() < end);
	if (rc)
		fprintf(stderr, "kvbench: %s%u: kvb_peer_connect %s:%d: %s\n",
			who, rank, host, port, kvb_strerror(rc));
	return rc;
}

/*
 * P: `total` requests named prefix<q>, R at a time (at --rate when
 * measuring): open each, submit its layers, seal, wait for the step's
 * write_done completions.
 */
static int bp_phase(struct kvb_ctx *ctx, const struct wl_cfg *c, unsigned rank,
		    uint32_t pr, char prefix, uint64_t total, int measure,
		    int64_t go_ns, struct wl_pres *res)
{
	uint32_t *h = calloc(c->requests, sizeof(*h));
	uint32_t *ids = calloc(c->blocks, sizeof(*ids));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	struct kvb_completion comp[COMP_BATCH];
	double *lat = wl_pres_lat(res);
	uint64_t next = 0;
	int rc = -1;

	if (!h || !ids || !t0)
		goto out;
	while (next < total) {
		unsigned n = measure ? wl_next_step(c, next, total, go_ns)
				     : (unsigned) (total - next < c->requests
							   ? total - next
							   : c->requests);
		unsigned pending = n;

		for (unsigned i = 0; i < n; i++) {
			uint64_t q = next + i;
			struct kvb_remote_xfer x = {.peer = pr,
						    .mode = KVB_XFER_WRITE,
						    .blocks = ids,
						    .nblocks = c->blocks};
			char id[32];
			int64_t t_open = kvb_bench_now_ns();
			int e;

			for (unsigned j = 0; j < c->blocks; j++)
				ids[j] = (uint32_t) wl_src_block(c, q, j);
			snprintf(id, sizeof(id), "%c%llu", prefix,
				 (unsigned long long) q);
			e = kvb_transfer_open_remote(ctx, id, &x, &h[i]);
			if (measure)
				res->ctl_ns += (uint64_t) (kvb_bench_now_ns() -
							   t_open);
			if (e) {
				fprintf(stderr, "kvbench: P%u: open %s: %s\n",
					rank, id, kvb_strerror(e));
				goto out;
			}
		}
		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				uint64_t tc = kvb_bench_thread_cpu_ns();
				int e;

				if (l == 0)
					t0[i] = kvb_bench_now_ns();
				while ((e = kvb_submit_layer(
						ctx, h[i], (uint16_t) l,
						next + i,
						KVB_DESC_UNSIGNALED)) ==
				       -EAGAIN)
					sched_yield(); /* ring full */
				if (measure) {
					res->post_cpu_ns +=
						kvb_bench_thread_cpu_ns() - tc;
					res->descs += c->blocks;
					res->bytes +=
						c->blocks * c->block_bytes;
				}
				if (e < 0) {
					fprintf(stderr,
						"kvbench: P%u: layer %u: %s\n",
						rank, l, kvb_strerror(e));
					goto out;
				}
			}
		for (unsigned i = 0; i < n; i++) {
			int e;

			while ((e = kvb_transfer_seal(ctx, h[i], c->layers,
						      next + i)) == -EAGAIN)
				sched_yield();
			if (e) {
				fprintf(stderr, "kvbench: P%u: seal: %s\n",
					rank, kvb_strerror(e));
				goto out;
			}
		}
		while (pending) {
			int k = kvb_wait(ctx, comp, COMP_BATCH, 60000);

			if (k < 0) {
				fprintf(stderr,
					"kvbench: P%u: waiting for write_done: "
					"%s\n",
					rank, kvb_strerror(k));
				goto out;
			}
			for (int i = 0; i < k; i++) {
				uint64_t tag = comp[i].tag;

				if (comp[i].kind == KVB_COMP_DESC) {
					res->failed++; /* only errors come */
					continue;
				}
				if (comp[i].kind != KVB_COMP_TRANSFER ||
				    tag < next || tag >= next + n)
					continue;
				if (comp[i].status) {
					res->failed++;
					fprintf(stderr,
						"kvbench: P%u: request %c%llu: "
						"%s\n",
						rank, prefix,
						(unsigned long long) tag,
						kvb_strerror(comp[i].status));
				}
				if (measure) {
					lat[res->nlat++] =
						(double) (kvb_bench_now_ns() -
							  t0[tag - next]) /
						1e3;
					res->done++;
				}
				pending--;
			}
		}
		next += n;
	}
	rc = res->failed ? -1 : 0;
out:
	free(h);
	free(ids);
	free(t0);
	return rc;
}

int wl_tcp_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		    int ready_fd, const int *go, struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_ctx *ctx;
	uint64_t cpu0;
	int64_t go_ns;
	uint32_t pr;

	if (!reg || attach(sock, KVB_ROLE_P, rank, c->workers, &ctx) ||
	    kv_regions(ctx, c, rank, 0, reg))
		return 1;
	/* every D worker is attached with its regions by now */
	if (peer(ctx, "P", rank, nw->ip[1], nw->hs_port[1], &pr))
		return 1;
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	if (bp_phase(ctx, c, rank, pr, 'w', wl_dslots(c), 0, 0, res)) {
		fprintf(stderr, "kvbench: P%u: warm-up failed\n", rank);
		return 1;
	}
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	if (bp_phase(ctx, c, rank, pr, 'r', (uint64_t) c->iters * c->requests,
		     1, go_ns, res))
		return res->failed ? 3 : 1;
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->ok = 1;
	for (unsigned l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	free(reg);
	return 0;
}

/* Has every other D rank opened request number g (0-based, all phases)? */
static int all_opened(const struct wl_cfg *c, void *shm, uint64_t g)
{
	for (unsigned i = 1; i < c->workers; i++)
		if (wl_pres_at(shm, c, 2 * i + 1)->opened <= g)
			return 0;
	return 1;
}

/*
 * D: open (and seal expecting one write_done) up to 2R requests ahead of
 * the last one done; `g0` numbers this phase's first request across phases.
 */
static int bd_phase(struct kvb_ctx *ctx, const struct wl_cfg *c, unsigned rank,
		    uint32_t pr, void *shm, char prefix, uint64_t g0,
		    uint64_t total, int measure, void *const *base,
		    struct wl_pres *res)
{
	uint64_t window = 2ull * c->requests, sealed = 0, done = 0;
	uint32_t *ids = calloc(c->blocks, sizeof(*ids));
	struct kvb_completion comp[COMP_BATCH];
	int64_t idle_since = kvb_bench_now_ns();
	int rc = -1;

	if (!ids)
		return -1;
	while (done < total) {
		int blocked = 0, k;

		for (; sealed < total && sealed < done + window; sealed++) {
			uint64_t q = sealed;
			struct kvb_remote_xfer x = {
				.peer = pr,
				.mode = KVB_XFER_WRITE,
				/* rank 0 announces for the node, see top */
				.flags = rank ? KVB_XFER_F_NO_ANNOUNCE : 0,
				.blocks = ids,
				.nblocks = c->blocks};
			char id[32];
			uint32_t h;
			int e;

			if (rank == 0 && !all_opened(c, shm, g0 + q)) {
				blocked = 1;
				break;
			}
			for (unsigned j = 0; j < c->blocks; j++)
				ids[j] = (uint32_t) wl_dst_block(c, q, j);
			snprintf(id, sizeof(id), "%c%llu", prefix,
				 (unsigned long long) q);
			e = kvb_transfer_open_remote(ctx, id, &x, &h);
			if (!e)
				while ((e = kvb_transfer_seal(ctx, h, 1, q)) ==
				       -EAGAIN)
					sched_yield();
			if (e) {
				fprintf(stderr,
					"kvbench: D%u: open/seal %s: %s\n",
					rank, id, kvb_strerror(e));
				goto out;
			}
			res->opened = g0 + q + 1;
		}
		k = kvb_wait(ctx, comp, COMP_BATCH, blocked ? 1 : 1000);
		if (k == -ETIMEDOUT)
			k = 0;
		if (k < 0) {
			fprintf(stderr,
				"kvbench: D%u: waiting for write_done: %s\n",
				rank, kvb_strerror(k));
			goto out;
		}
		if (!k && kvb_bench_now_ns() - idle_since > STALL_NS) {
			fprintf(stderr,
				"kvbench: D%u: no write_done in %lld s (%llu "
				"of "
				"%llu requests done)\n",
				rank, STALL_NS / 1000000000,
				(unsigned long long) done,
				(unsigned long long) total);
			goto out;
		}
		if (k)
			idle_since = kvb_bench_now_ns();
		for (int i = 0; i < k; i++) {
			if (comp[i].kind != KVB_COMP_TRANSFER)
				continue;
			if (comp[i].status) {
				fprintf(stderr,
					"kvbench: D%u: request %c%llu failed: "
					"%s\n",
					rank, prefix,
					(unsigned long long) comp[i].tag,
					kvb_strerror(comp[i].status));
				res->failed++;
			} else if (measure && c->verify) {
				uint64_t tc = kvb_bench_thread_cpu_ns();

				res->dbad += wl_verify_req(c, rank, base,
							   comp[i].tag);
				res->dchecked += (uint64_t) c->layers *
						 c->blocks * c->block_bytes;
				res->verify_ns +=
					kvb_bench_thread_cpu_ns() - tc;
			}
			done++;
			if (measure)
				res->done++;
		}
	}
	rc = res->failed ? -1 : 0;
out:
	free(ids);
	return rc;
}

int wl_tcp_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		    void *shm, int ready_fd, const int *go, struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	void **base = calloc(c->layers, sizeof(*base));
	struct kvb_ctx *ctx;
	uint64_t cpu0;
	uint32_t pr;

	if (!reg || !base || attach(sock, KVB_ROLE_D, rank, c->workers, &ctx) ||
	    kv_regions(ctx, c, rank, 1, reg))
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		base[l] = reg[l].addr;
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* every P worker is attached with its regions by now */
	if (peer(ctx, "D", rank, nw->ip[0], nw->hs_port[0], &pr))
		return 1;
	if (bd_phase(ctx, c, rank, pr, shm, 'w', 0, wl_dslots(c), 0, base,
		     res)) {
		fprintf(stderr, "kvbench: D%u: warm-up failed\n", rank);
		return 1;
	}
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	cpu0 = kvb_bench_proc_cpu_ns();
	if (bd_phase(ctx, c, rank, pr, shm, 'r', wl_dslots(c),
		     (uint64_t) c->iters * c->requests, 1, base, res))
		return res->failed || res->dbad ? 3 : 1;
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	for (unsigned l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	free(reg);
	free(base);
	return res->dbad ? 3 : 0;
}

#endif /* KVB_HAVE_TCP */

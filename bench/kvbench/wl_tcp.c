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
 *    P then tells D over a pipe, as in local direct mode. The P loop and
 *    the D loop are wl_direct.c's; what is tcp's here is the setup (P's
 *    endpoint to D's port, the region ids) and the receiver's serving.
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

/* ---- direct ---------------------------------------------------------- */

int wl_tcp_direct_p(const struct wl_cfg *c, unsigned rank, void *shm,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	uint64_t pb = wl_region_bytes_p(c);
	struct kvb_transport_params tp = {.post_batch_size = -1,
					  .host_ip = nw->ip[0]};
	struct wl_pres *dres = wl_pres_at(shm, c, 2 * rank + 1);
	struct kvb_mr *mr = calloc(c->layers, sizeof(*mr));
	struct wl_layer_io *io = calloc(c->layers, sizeof(*io));
	struct wl_mem src;
	struct wl_direct d = {.c = c,
			      .rank = rank,
			      .io = io,
			      .src = &src,
			      .notify_fd = notify_fd,
			      .stall_ns = STALL_NS};
	uint8_t blob[KVB_TCP_BLOB_LEN];
	size_t blen = sizeof(blob);
	char why[160] = "";
	int rc;

	if (!mr || !io || wl_src_mem(&src, c, rank))
		return 1;
	rc = kvb_tcp_ops.open(&tp, &d.t, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "kvbench: P%u: tcp transport on %s: %s %s\n",
			rank, nw->ip[0], strerror(-rc), why);
		return 1;
	}
	rc = kvb_tcp_blob_make(nw->ip[1], (uint16_t) dres->port, 0, blob,
			       &blen);
	if (!rc)
		rc = d.t->ops->connect(d.t, blob, blen, &d.ep);
	/* direct mode is its own peer: the tools' shared key */
	if (!rc)
		rc = kvb_tcp_ep_set_key(d.t, d.ep, kvb_tcp_tool_key);
	if (rc) {
		fprintf(stderr, "kvbench: P%u: endpoint to %s:%d: %s\n", rank,
			nw->ip[1], dres->port, strerror(-rc));
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		mr[l] = (struct kvb_mr){.id = l + 1,
					.kind = KVB_MEM_HOST,
					.addr = src.at[l],
					.len = pb};
		if (d.t->ops->reg_mr(d.t, &mr[l])) {
			fprintf(stderr, "kvbench: P%u: tcp reg_mr failed\n",
				rank);
			return 1;
		}
		/* the D receiver's region ids: layer l is l + 1 */
		io[l] = (struct wl_layer_io){.local = &mr[l],
					     .remote.region = l + 1};
	}
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	rc = wl_direct_p_run(&d, ready_fd, go[1], res);
	d.t->ops->close(d.t);
	wl_mem_free(&src);
	free(mr);
	free(io);
	return rc ? 1 : res->failed ? 3 : 0;
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

struct receiver {
	struct kvb_transport *t;
	unsigned rank;
};

static int serve(void *arg, int fd)
{
	struct receiver *r = arg;

	return serve_until(r->t, fd, r->rank);
}

int wl_tcp_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res)
{
	const struct bench_net *nw = c->nw;
	uint64_t db = wl_region_bytes_d(c);
	struct kvb_transport_params tp = {.post_batch_size = -1,
					  .host_ip = nw->ip[1]};
	struct kvb_mr *mr = calloc(c->layers, sizeof(*mr));
	void **base = calloc(c->layers, sizeof(*base));
	struct wl_mem m = {
		.layers = c->layers, .len = db, .at = base, .host = base};
	struct receiver r = {.rank = rank};
	char why[160] = "", byte = 1;
	int rc;

	if (!mr || !base)
		return 1;
	rc = kvb_tcp_ops.open(&tp, &r.t, why, sizeof(why));
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
		if (r.t->ops->reg_mr(r.t, &mr[l])) {
			fprintf(stderr, "kvbench: D%u: tcp reg_mr failed\n",
				rank);
			return 1;
		}
	}
	rc = kvb_tcp_peer_allow(r.t, 0, kvb_tcp_tool_key, NULL, -1);
	if (rc) {
		fprintf(stderr, "kvbench: D%u: tcp allow: %s\n", rank,
			strerror(-rc));
		return 1;
	}
	res->port = kvb_tcp_port(r.t);
	/* no P exists before the first barrier: nothing to serve */
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* the warm-up is P's: ready at once, serving until the run starts */
	if (write(ready_fd, &byte, 1) != 1)
		return 1;
	if (serve_until(r.t, go[1], rank) < 0 || read(go[1], &byte, 1) != 1)
		return 1;
	rc = wl_direct_d_run(c, rank, notify_fd, &m, serve, &r, res);
	r.t->ops->close(r.t);
	free(mr);
	wl_mem_free(&m);
	return rc ? 1 : res->dbad ? 3 : 0;
}

/* ---- broker ---------------------------------------------------------- */

/* One KV region per layer, blocks first: block b = bytes [b*S, (b+1)*S). */
static int kv_regions(struct kvb_ctx *ctx, const struct wl_cfg *c,
		      unsigned rank, int is_d, struct kvb_region *reg,
		      struct wl_mem *m)
{
	uint64_t len = is_d ? wl_region_bytes_d(c) : wl_region_bytes_p(c);
	struct kvb_kv_geometry g = {
		.layout = KVB_KV_BLOCK_FIRST,
		.num_blocks = (uint32_t) (len / c->block_bytes),
		.block_size = 1,
		.num_heads = 1,
		.head_dim = (uint32_t) (c->block_bytes / 2), /* K, V halves */
		.elem_size = 1};

	/* P: REMOTE_READ, as MoRIIO's read mode needs (D pulls); a WRITE's
	 * source needs none: the broker registers every host region for
	 * local access and offers only remote-flagged ones to peers */
	if (wl_broker_regions(ctx, c, rank, is_d, len,
			      is_d ? KVB_MEM_REMOTE_WRITE : KVB_MEM_REMOTE_READ,
			      reg, m))
		return -1;
	for (unsigned l = 0; l < c->layers; l++) {
		int rc = kvb_mem_set_kv(ctx, reg[l].id, l, &g);

		if (rc) {
			fprintf(stderr,
				"kvbench: %c%u: layer %u kvb_mem_set_kv: %s\n",
				is_d ? 'D' : 'P', rank, l, kvb_strerror(rc));
			return -1;
		}
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
	struct wl_post_timer pt;
	uint64_t next = 0;
	int rc = -1;

	if (!h || !ids || !t0)
		goto out;
	if (measure)
		wl_post_timer_init(&pt, rank + 1);
	while (next < total) {
		unsigned n = measure ? wl_next_step(c, next, total, go_ns)
				     : (unsigned) (total - next < c->requests
							   ? total - next
							   : c->requests);

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
				int e;

				if (l == 0)
					t0[i] = wl_req_start_ns(c, next + i,
								go_ns);
				for (;;) {
					if (measure)
						wl_post_begin(&pt);
					e = kvb_submit_layer(
						ctx, h[i], (uint16_t) l,
						next + i, KVB_DESC_UNSIGNALED);
					if (measure)
						wl_post_end(&pt, res,
							    e >= 0 ? c->blocks
								   : 0);
					if (e != -EAGAIN)
						break;
					sched_yield(); /* ring full */
				}
				if (measure) {
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
		if (wl_p_wait_step(ctx, rank, next, n, measure ? t0 : NULL,
				   prefix, res))
			goto out;
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
	struct wl_mem m;
	uint64_t cpu0;
	int64_t go_ns;
	uint32_t pr;

	if (!reg || wl_attach(sock, 0, rank, c->workers, 10000, &ctx) ||
	    kv_regions(ctx, c, rank, 0, reg, &m))
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
	if (wl_mem_fill(&m, c, rank, 0) || wl_sync_start(ready_fd, go[1]))
		return 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	if (bp_phase(ctx, c, rank, pr, 'r', (uint64_t) c->iters * c->requests,
		     1, go_ns, res))
		return res->failed ? 3 : 1;
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->ok = 1;
	wl_broker_regions_free(ctx, reg, &m);
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
		    uint64_t total, int measure, struct wl_mem *m,
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
			int e = wl_d_completion(c, rank, &comp[i], prefix,
						measure && c->verify, m, res);

			if (e < 0)
				goto out;
			done += (uint64_t) e;
			if (measure)
				res->done += (uint64_t) e;
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
	struct kvb_ctx *ctx;
	struct wl_mem m;
	uint64_t cpu0;
	uint32_t pr;

	if (!reg || wl_attach(sock, 1, rank, c->workers, 10000, &ctx) ||
	    kv_regions(ctx, c, rank, 1, reg, &m))
		return 1;
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	/* every P worker is attached with its regions by now */
	if (peer(ctx, "D", rank, nw->ip[0], nw->hs_port[0], &pr))
		return 1;
	if (bd_phase(ctx, c, rank, pr, shm, 'w', 0, wl_dslots(c), 0, &m, res)) {
		fprintf(stderr, "kvbench: D%u: warm-up failed\n", rank);
		return 1;
	}
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	cpu0 = kvb_bench_proc_cpu_ns();
	if (bd_phase(ctx, c, rank, pr, shm, 'r', wl_dslots(c),
		     (uint64_t) c->iters * c->requests, 1, &m, res))
		return res->failed || res->dbad ? 3 : 1;
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	wl_broker_regions_free(ctx, reg, &m);
	kvb_detach(ctx);
	free(reg);
	return res->dbad ? 3 : 0;
}

#endif /* KVB_HAVE_TCP */

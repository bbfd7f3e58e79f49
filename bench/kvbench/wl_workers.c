/* SPDX-License-Identifier: MIT */
/*
 * The worker processes of `kvbench workload`.
 *
 * Both modes do the same writes. A P worker runs steps: each step takes up
 * to --requests requests (those that arrived, with --rate), and for every
 * layer, for every request of the step, writes the request's --blocks blocks
 * of that layer into its D peer (P rank i -> D rank i, as TP ranks pair up):
 * the order a forward pass produces them. A step ends when all its requests
 * are written (write_done); then the next starts.
 *
 *  - direct: the worker drives its own `local` transport instance: one post()
 *    (one doorbell) per (request, layer) chain, as vLLM's MoRIIO connector
 *    does per worker; write_done goes to the D worker over a pipe.
 *  - broker: the worker submits descriptors to kvbroker and seals each
 *    request; the D worker seals expecting its one P writer and gets the
 *    write_done as a KVB_COMP_TRANSFER completion.
 *
 * Blocks land at scattered D offsets (descending while P's ascend) so no two
 * writes are contiguous on both sides: one descriptor = one WR in both modes.
 */
#include "kvbench.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "transport.h"

#define COMP_BATCH 64u

uint64_t wl_dslots(const struct wl_cfg *c)
{
	return c->verify ? (uint64_t) c->iters * c->requests : c->requests;
}

uint64_t wl_region_bytes_p(const struct wl_cfg *c)
{
	return (uint64_t) c->requests * c->blocks * c->block_bytes;
}

uint64_t wl_region_bytes_d(const struct wl_cfg *c)
{
	return wl_dslots(c) * c->blocks * c->block_bytes;
}

size_t wl_pres_size(const struct wl_cfg *c)
{
	size_t n = sizeof(struct wl_pres) +
		   (size_t) c->iters * c->requests * sizeof(double);

	return (n + 63) & ~(size_t) 63;
}

struct wl_pres *wl_pres_at(void *shm, const struct wl_cfg *c, unsigned i)
{
	return (struct wl_pres *) ((char *) shm + i * wl_pres_size(c));
}

double *wl_pres_lat(struct wl_pres *r)
{
	return (double *) (r + 1);
}

/* 64-bit word w of source block `blk` of layer l on P rank p. */
static inline uint64_t pat(unsigned p, unsigned l, uint64_t blk, uint64_t w)
{
	uint64_t x =
		((uint64_t) p << 52) ^ ((uint64_t) l << 36) ^ (blk << 20) ^ w;

	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

void wl_fill_src(const struct wl_cfg *c, unsigned rank, unsigned l,
		 uint64_t *base)
{
	uint64_t nblk = (uint64_t) c->requests * c->blocks;
	uint64_t words = c->block_bytes / 8;

	for (uint64_t b = 0; b < nblk; b++)
		for (uint64_t w = 0; w < words; w++)
			base[b * words + w] = pat(rank, l, b, w);
}

uint64_t wl_src_block(const struct wl_cfg *c, uint64_t q, unsigned j)
{
	return (q % c->requests) * c->blocks + j;
}

uint64_t wl_dst_block(const struct wl_cfg *c, uint64_t q, unsigned j)
{
	uint64_t n = wl_dslots(c) * c->blocks;

	return n - 1 - ((q % wl_dslots(c)) * c->blocks + j);
}

/* Check request q's blocks in every layer region; returns bad words. */
uint64_t wl_verify_req(const struct wl_cfg *c, unsigned rank,
		       void *const *layer_base, uint64_t q)
{
	uint64_t words = c->block_bytes / 8, bad = 0;

	for (unsigned l = 0; l < c->layers; l++)
		for (unsigned j = 0; j < c->blocks; j++) {
			const uint64_t *d = (const uint64_t *) layer_base[l] +
					    wl_dst_block(c, q, j) * words;
			uint64_t sb = wl_src_block(c, q, j);

			for (uint64_t w = 0; w < words; w++)
				bad += d[w] != pat(rank, l, sb, w);
		}
	return bad;
}

/* A barrier with the parent: every worker passes it twice, after setup
 * and after the warm-up. */
/* A shared memfd mapping of len bytes, MAP_FAILED on error. */
void *wl_memfd_map(uint64_t len)
{
	int fd = memfd_create("kvbench-p", MFD_CLOEXEC);
	void *p = MAP_FAILED;

	if (fd >= 0 && !ftruncate(fd, (off_t) len))
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	return p;
}

int wl_sync_start(int ready_fd, int go_fd)
{
	char byte = 1;

	if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1)
		return -1;
	return 0;
}

/* First request of the next step and how many it takes (>= 1), honouring
 * --rate: request q arrives at go + q / rate. */
unsigned wl_next_step(const struct wl_cfg *c, uint64_t next, uint64_t total,
		      int64_t go_ns)
{
	uint64_t n = total - next < c->requests ? total - next : c->requests;
	int64_t due, now;
	uint64_t k;

	if (c->rate <= 0)
		return (unsigned) n;
	due = go_ns + (int64_t) ((double) next * 1e9 / c->rate);
	now = kvb_bench_now_ns();
	if (now < due) {
		struct timespec ts = {.tv_sec = due / 1000000000,
				      .tv_nsec = due % 1000000000};

		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		now = kvb_bench_now_ns();
	}
	for (k = 1; k < n; k++)
		if (go_ns + (int64_t) ((double) (next + k) * 1e9 / c->rate) >
		    now)
			break;
	return (unsigned) k;
}

/*
 * Warm-up, not measured: write every D slot once from the source blocks, so
 * the writer's page tables (the worker's in direct mode, the broker's in
 * broker mode) and the caches start warm in both modes alike.
 */
static int direct_warm(const struct wl_cfg *c, struct kvb_transport *t,
		       struct kvb_ep *ep, struct kvb_mr *src,
		       struct kvb_mr *dst, struct kvb_xop *ops)
{
	struct kvb_xcqe cqe[COMP_BATCH];

	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < wl_dslots(c); q++) {
			unsigned sent = 0;
			int rc;

			for (unsigned j = 0; j < c->blocks; j++)
				ops[j] = (struct kvb_xop){
					.opcode = KVB_XOP_WRITE,
					.local = &src[l],
					.local_off = wl_src_block(c, q, j) *
						     c->block_bytes,
					.remote.mr = &dst[l],
					.remote_off = wl_dst_block(c, q, j) *
						      c->block_bytes,
					.len = c->block_bytes};
			while (sent < c->blocks) {
				rc = t->ops->post(t, ep, ops + sent,
						  c->blocks - sent);
				if (rc < 0)
					return rc;
				sent += (unsigned) rc;
			}
			while (t->ops->poll(t, cqe, COMP_BATCH) > 0)
				;
		}
	return 0;
}

int wl_direct_p(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t pb = wl_region_bytes_p(c), db = wl_region_bytes_d(c);
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct kvb_transport_params tp = {.post_batch_size = -1};
	struct kvb_mr *src = calloc(c->layers, sizeof(*src));
	struct kvb_mr *dst = calloc(c->layers, sizeof(*dst));
	struct kvb_xop *ops = calloc(c->blocks, sizeof(*ops));
	uint32_t *left = calloc(c->requests, sizeof(*left));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	struct kvb_xcqe cqe[COMP_BATCH];
	struct kvb_transport *t = NULL;
	struct kvb_ep *ep = NULL;
	double *lat = wl_pres_lat(res);
	uint64_t cpu0, db0, wrs0;
	int64_t go_ns;
	char why[128];
	char *pmem;
	int rc;

	/* the same kind of memory as kvb_mem_alloc() gives in broker mode */
	pmem = wl_memfd_map(pb * c->layers);
	if (!src || !dst || !ops || !left || !t0 || pmem == MAP_FAILED) {
		fprintf(stderr, "kvbench: P%u (direct): out of memory\n", rank);
		return 1;
	}
	rc = kvb_local_ops.open(&tp, &t, why, sizeof(why));
	if (rc || (rc = t->ops->connect(t, NULL, 0, &ep))) {
		fprintf(stderr, "kvbench: P%u: local transport: %s\n", rank,
			strerror(-rc));
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		src[l] = (struct kvb_mr){.id = l + 1,
					 .kind = KVB_MEM_HOST,
					 .addr = pmem + l * pb,
					 .len = pb};
		dst[l] = (struct kvb_mr){.id = c->layers + l + 1,
					 .flags = KVB_MEM_REMOTE_WRITE,
					 .kind = KVB_MEM_HOST,
					 .addr = (char *) dmaps[rank] + l * db,
					 .len = db};
		wl_fill_src(c, rank, l, (uint64_t *) src[l].addr);
		if (t->ops->reg_mr(t, &src[l]) || t->ops->reg_mr(t, &dst[l]))
			return 1;
	}
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	if ((rc = direct_warm(c, t, ep, src, dst, ops))) {
		fprintf(stderr, "kvbench: P%u: warm-up: %s\n", rank,
			strerror(-rc));
		return 1;
	}
	db0 = t->stats.doorbells;
	wrs0 = t->stats.wrs;
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	while (next < total) {
		unsigned n = wl_next_step(c, next, total, go_ns), pending = n;

		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				uint64_t q = next + i, tc;
				unsigned sent = 0;

				if (l == 0) {
					t0[i] = kvb_bench_now_ns();
					left[i] = c->layers * c->blocks;
				}
				for (unsigned j = 0; j < c->blocks; j++)
					ops[j] = (struct kvb_xop){
						.opcode = KVB_XOP_WRITE,
						.local = &src[l],
						.local_off =
							wl_src_block(c, q, j) *
							c->block_bytes,
						.remote.mr = &dst[l],
						.remote_off =
							wl_dst_block(c, q, j) *
							c->block_bytes,
						.len = c->block_bytes,
						.cookie = i};
				while (sent < c->blocks) {
					tc = kvb_bench_thread_cpu_ns();
					rc = t->ops->post(t, ep, ops + sent,
							  c->blocks - sent);
					res->post_cpu_ns +=
						kvb_bench_thread_cpu_ns() - tc;
					if (rc < 0) {
						fprintf(stderr,
							"kvbench: P%u: post: "
							"%s\n",
							rank, strerror(-rc));
						return 1;
					}
					sent += (unsigned) rc;
				}
				res->descs += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
				/* reap: a request ends with its last WR */
				while ((rc = t->ops->poll(t, cqe, COMP_BATCH)) >
				       0)
					for (int k = 0; k < rc; k++) {
						uint64_t r = cqe[k].cookie;

						if (cqe[k].status)
							res->failed++;
						if (--left[r])
							continue;
						lat[res->nlat++] =
							(double) (kvb_bench_now_ns() -
								  t0[r]) /
							1e3;
						uint32_t qq =
							(uint32_t) (next + r);

						if (write(notify_fd, &qq,
							  sizeof(qq)) !=
						    sizeof(qq))
							return 1;
						pending--;
						res->done++;
					}
			}
		if (pending) {
			fprintf(stderr,
				"kvbench: P%u: %u requests never completed\n",
				rank, pending);
			return 1;
		}
		next += n;
	}
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->doorbells = t->stats.doorbells - db0;
	res->wrs = t->stats.wrs - wrs0;
	res->ok = 1;
	t->ops->close(t);
	return res->failed ? 3 : 0;
}

int wl_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests,
		 db = wl_region_bytes_d(c);
	void **base = calloc(c->layers, sizeof(*base));
	uint32_t q;

	if (!base)
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		base[l] = (char *) dmaps[rank] + l * db;
	if (wl_sync_start(ready_fd, go[0]) || wl_sync_start(ready_fd, go[1]))
		return 1;
	while (res->done < total) {
		ssize_t n = read(notify_fd, &q, sizeof(q));

		if (n != sizeof(q)) {
			fprintf(stderr,
				"kvbench: D%u (direct): P%u went away after "
				"%llu requests\n",
				rank, rank, (unsigned long long) res->done);
			return 1;
		}
		if (c->verify) {
			res->dbad += wl_verify_req(c, rank, base, q);
			res->dchecked += (uint64_t) c->layers * c->blocks *
					 c->block_bytes;
		}
		res->done++;
	}
	res->ok = 1;
	free(base);
	return res->dbad ? 3 : 0;
}

static int attach(const char *sock, enum kvb_role role, unsigned rank,
		  unsigned size, struct kvb_ctx **ctx)
{
	struct kvb_attach_opts o = {.socket_path = sock,
				    .role = role,
				    .tp_rank = rank,
				    .tp_size = size};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "kvbench: attach %s%u to %s: %s\n",
			role == KVB_ROLE_P ? "P" : "D", rank, sock,
			kvb_strerror(rc));
	return rc;
}

/* Wait for the step's transfers; records latencies. 0 or -1. */
static int p_wait_step(struct kvb_ctx *ctx, unsigned rank, uint64_t first,
		       unsigned n, const int64_t *t0, struct wl_pres *res)
{
	struct kvb_completion comp[COMP_BATCH];
	double *lat = wl_pres_lat(res);
	unsigned pending = n;

	while (pending) {
		int k = kvb_wait(ctx, comp, COMP_BATCH, 60000);

		if (k < 0) {
			fprintf(stderr,
				"kvbench: P%u: waiting for write_done: %s\n",
				rank, kvb_strerror(k));
			return -1;
		}
		for (int i = 0; i < k; i++) {
			if (comp[i].kind == KVB_COMP_DESC) {
				res->failed++; /* unsignaled: only errors come
						*/
				continue;
			}
			if (comp[i].kind != KVB_COMP_TRANSFER ||
			    comp[i].tag < first || comp[i].tag >= first + n)
				continue;
			if (comp[i].status)
				res->failed++;
			lat[res->nlat++] = (double) (kvb_bench_now_ns() -
						     t0[comp[i].tag - first]) /
					   1e3;
			pending--;
			res->done++;
		}
	}
	return 0;
}

#define WARM_TAG UINT64_MAX

/* The same warm-up through the broker: unsignaled writes outside any
 * transfer, the last one signaled (one destination: FIFO). */
static int broker_warm(const struct wl_cfg *c, struct kvb_ctx *ctx,
		       const struct kvb_region *reg,
		       const struct kvb_remote_region *dst, struct kvb_desc *d)
{
	struct kvb_completion comp[COMP_BATCH];
	uint64_t n = wl_dslots(c);
	int rc;

	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < n; q++) {
			unsigned sent = 0;

			for (unsigned j = 0; j < c->blocks; j++) {
				int last = l == c->layers - 1 && q == n - 1 &&
					   j == c->blocks - 1;

				d[j] = (struct kvb_desc){
					.flags = last ? 0 : KVB_DESC_UNSIGNALED,
					.region = reg[l].id,
					.peer_region = dst[l].id,
					.offset = wl_src_block(c, q, j) *
						  c->block_bytes,
					.peer_offset = wl_dst_block(c, q, j) *
						       c->block_bytes,
					.len = c->block_bytes,
					.tag = last ? WARM_TAG : 0};
			}
			while (sent < c->blocks) {
				rc = kvb_submit_write(ctx, d + sent,
						      c->blocks - sent);
				if (rc == -EAGAIN) {
					sched_yield();
					continue;
				}
				if (rc < 0)
					return rc;
				sent += (unsigned) rc;
			}
		}
	for (;;) {
		int k = kvb_wait(ctx, comp, COMP_BATCH, 60000);

		if (k < 0)
			return k;
		for (int i = 0; i < k; i++) {
			if (comp[i].status)
				return comp[i].status;
			if (comp[i].tag == WARM_TAG)
				return 0;
		}
	}
}

int wl_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t pb = wl_region_bytes_p(c);
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_remote_region *dst = calloc(c->layers, sizeof(*dst));
	struct kvb_desc *d = calloc(c->blocks, sizeof(*d));
	uint32_t *h = calloc(c->requests, sizeof(*h));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	struct kvb_ctx *ctx;
	uint64_t cpu0;
	int64_t go_ns;
	char id[64];
	int rc;

	if (!reg || !dst || !d || !h || !t0 ||
	    attach(sock, KVB_ROLE_P, rank, c->workers, &ctx))
		return 1;
	for (unsigned l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, pb, 0, l, &reg[l]);
		if (!rc)
			rc = kvb_mem_lookup(ctx, KVB_ROLE_D, 0, rank, l,
					    &dst[l]);
		if (rc) {
			fprintf(stderr, "kvbench: P%u: layer %u region: %s\n",
				rank, l, kvb_strerror(rc));
			return 1;
		}
		wl_fill_src(c, rank, l, reg[l].addr);
	}
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	if ((rc = broker_warm(c, ctx, reg, dst, d))) {
		fprintf(stderr, "kvbench: P%u: warm-up: %s\n", rank,
			kvb_strerror(rc));
		return 1;
	}
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	while (next < total) {
		unsigned n = wl_next_step(c, next, total, go_ns);
		int64_t t_open;

		for (unsigned i = 0; i < n; i++) {
			snprintf(id, sizeof(id), "req-%llu",
				 (unsigned long long) (next + i));
			t_open = kvb_bench_now_ns();
			rc = kvb_transfer_open(ctx, id, &h[i]);
			res->ctl_ns += (uint64_t) (kvb_bench_now_ns() - t_open);
			if (rc) {
				fprintf(stderr, "kvbench: P%u: open %s: %s\n",
					rank, id, kvb_strerror(rc));
				return 1;
			}
		}
		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				uint64_t q = next + i, tc;
				unsigned sent = 0;

				if (l == 0)
					t0[i] = kvb_bench_now_ns();
				for (unsigned j = 0; j < c->blocks; j++)
					d[j] = (struct kvb_desc){
						.transfer = h[i],
						.layer = (uint16_t) l,
						.flags = KVB_DESC_UNSIGNALED,
						.region = reg[l].id,
						.peer_region = dst[l].id,
						.offset =
							wl_src_block(c, q, j) *
							c->block_bytes,
						.peer_offset =
							wl_dst_block(c, q, j) *
							c->block_bytes,
						.len = c->block_bytes,
						.tag = q};
				while (sent < c->blocks) {
					tc = kvb_bench_thread_cpu_ns();
					rc = kvb_submit_write(ctx, d + sent,
							      c->blocks - sent);
					res->post_cpu_ns +=
						kvb_bench_thread_cpu_ns() - tc;
					if (rc == -EAGAIN) {
						/* ring full: let the broker run
						 */
						sched_yield();
						continue;
					}
					if (rc < 0) {
						fprintf(stderr,
							"kvbench: P%u: submit: "
							"%s\n",
							rank, kvb_strerror(rc));
						return 1;
					}
					sent += (unsigned) rc;
				}
				res->descs += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
			}
		for (unsigned i = 0; i < n; i++)
			while ((rc = kvb_transfer_seal(ctx, h[i],
						       c->layers * c->blocks,
						       next + i)) == -EAGAIN)
				sched_yield();
		if (rc) {
			fprintf(stderr, "kvbench: P%u: seal: %s\n", rank,
				kvb_strerror(rc));
			return 1;
		}
		if (p_wait_step(ctx, rank, next, n, t0, res))
			return 1;
		next += n;
	}
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->ok = 1;
	for (unsigned l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	return res->failed ? 3 : 0;
}

int wl_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests, sealed = 0;
	uint64_t window = 2ull * c->requests, db = wl_region_bytes_d(c);
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	void **base = calloc(c->layers, sizeof(*base));
	struct kvb_completion comp[COMP_BATCH];
	struct kvb_ctx *ctx;
	uint32_t h;
	char id[64];
	int rc;

	if (!reg || !base || attach(sock, KVB_ROLE_D, rank, c->workers, &ctx))
		return 1;
	for (unsigned l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, db, KVB_MEM_REMOTE_WRITE, l, &reg[l]);
		if (rc) {
			fprintf(stderr, "kvbench: D%u: layer %u region: %s\n",
				rank, l, kvb_strerror(rc));
			return 1;
		}
		base[l] = reg[l].addr;
		memset(base[l], 0, db); /* pages allocated before the run */
	}
	if (wl_sync_start(ready_fd, go[0]) || wl_sync_start(ready_fd, go[1]))
		return 1;
	while (res->done < total) {
		int k;

		/* seal ahead: each request waits for its one P writer */
		for (; sealed < total && sealed < res->done + window;
		     sealed++) {
			snprintf(id, sizeof(id), "req-%llu",
				 (unsigned long long) sealed);
			rc = kvb_transfer_open(ctx, id, &h);
			if (!rc)
				while ((rc = kvb_transfer_seal(
						ctx, h, 1, sealed)) == -EAGAIN)
					sched_yield();
			if (rc) {
				fprintf(stderr,
					"kvbench: D%u: open/seal %s: %s\n",
					rank, id, kvb_strerror(rc));
				return 1;
			}
		}
		k = kvb_wait(ctx, comp, COMP_BATCH, 60000);
		if (k < 0) {
			fprintf(stderr,
				"kvbench: D%u: waiting for write_done: %s\n",
				rank, kvb_strerror(k));
			return 1;
		}
		for (int i = 0; i < k; i++) {
			if (comp[i].kind != KVB_COMP_TRANSFER)
				continue;
			if (comp[i].status) {
				fprintf(stderr,
					"kvbench: D%u: request %llu failed: "
					"%s\n",
					rank, (unsigned long long) comp[i].tag,
					kvb_strerror(comp[i].status));
				res->failed++;
			} else if (c->verify) {
				res->dbad += wl_verify_req(c, rank, base,
							   comp[i].tag);
				res->dchecked += (uint64_t) c->layers *
						 c->blocks * c->block_bytes;
			}
			res->done++;
		}
	}
	res->ok = 1;
	for (unsigned l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	return res->dbad || res->failed ? 3 : 0;
}

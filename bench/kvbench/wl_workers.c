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
 *    does per worker (the loop is wl_direct.c's, shared by every
 *    transport); write_done goes to the D worker over a pipe.
 *  - broker: the worker submits descriptors to kvbroker and seals each
 *    request; the D worker seals expecting its one P writer and gets the
 *    write_done as a KVB_COMP_TRANSFER completion. On `--transport gpu`
 *    the same workers hold their layers in device memory
 *    (kvb_mem_register_gpu) against a `kvbroker --transport gpu`.
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
static inline uint64_t pat(unsigned p, unsigned l, uint64_t blk, uint64_t w,
			   uint64_t salt)
{
	uint64_t x = ((uint64_t) p << 52) ^ ((uint64_t) l << 36) ^ (blk << 20) ^
		     w ^ salt;

	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

void wl_fill_src(const struct wl_cfg *c, unsigned rank, unsigned l,
		 uint64_t *base, uint64_t salt)
{
	uint64_t nblk = (uint64_t) c->requests * c->blocks;
	uint64_t words = c->block_bytes / 8;

	if (!c->verify) {
		/* nobody checks the bytes: page the region in, cheaply */
		memset(base, (int) ((rank + l + salt) & 0xff),
		       nblk * c->block_bytes);
		return;
	}
	for (uint64_t b = 0; b < nblk; b++)
		for (uint64_t w = 0; w < words; w++)
			base[b * words + w] = pat(rank, l, b, w, salt);
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
				bad += d[w] != pat(rank, l, sb, w, 0);
		}
	return bad;
}

/* A shared memfd mapping of len bytes, MAP_FAILED on error. */
void *wl_memfd_map(const char *name, uint64_t len)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	void *p = MAP_FAILED;

	if (fd >= 0 && !ftruncate(fd, (off_t) len))
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	/* huge pages where shmem THP is `advise`, as kvb_mem_alloc() asks */
	if (p != MAP_FAILED)
		(void) madvise(p, len, MADV_HUGEPAGE);
	if (fd >= 0)
		close(fd);
	return p;
}

/* A barrier with the parent: every worker passes it twice, after setup
 * and after the warm-up. */
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

/* When request q's latency starts: with --rate its arrival (go + q / rate),
 * so that the time it waited behind earlier requests counts (an open
 * loop: arrivals do not wait for completions); else now (its first
 * write). */
int64_t wl_req_start_ns(const struct wl_cfg *c, uint64_t q, int64_t go_ns)
{
	if (c->rate <= 0)
		return kvb_bench_now_ns();
	return go_ns + (int64_t) ((double) q * 1e9 / c->rate);
}

int wl_mem_fill(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		uint64_t salt)
{
	if (m->fill)
		return m->fill(m, c, rank, salt);
	for (unsigned l = 0; l < m->layers; l++)
		wl_fill_src(c, rank, l, m->at[l], salt);
	return 0;
}

int wl_mem_verify(const struct wl_cfg *c, unsigned rank, struct wl_mem *m,
		  uint64_t q, struct wl_pres *res)
{
	uint64_t tc = kvb_bench_thread_cpu_ns(), bad;

	if (m->fetch && m->fetch(m, c, q)) {
		fprintf(stderr,
			"kvbench: D%u: reading request %llu back for "
			"--verify failed\n",
			rank, (unsigned long long) q);
		return -1;
	}
	bad = wl_verify_req(c, rank, m->host, q);
	if (bad && !res->dbad)
		fprintf(stderr,
			"kvbench: D%u: request %llu: %llu bytes differ from "
			"what P%u wrote (first bad request)\n",
			rank, (unsigned long long) q,
			(unsigned long long) bad * 8, rank);
	res->dbad += bad;
	res->dchecked += (uint64_t) c->layers * c->blocks * c->block_bytes;
	res->verify_ns += kvb_bench_thread_cpu_ns() - tc;
	return 0;
}

void wl_mem_free(struct wl_mem *m)
{
	if (m->gpu) {
		wl_gpu_mem_free(m);
		return;
	}
	if (m->map)
		munmap(m->map, m->map_len);
	if (m->host != m->at)
		free(m->host);
	free(m->at);
	memset(m, 0, sizeof(*m));
}

int wl_src_mem(struct wl_mem *m, const struct wl_cfg *c, unsigned rank)
{
	uint64_t pb = wl_region_bytes_p(c);

	memset(m, 0, sizeof(*m));
	m->layers = c->layers;
	m->len = pb;
	m->map_len = pb * c->layers;
	m->map = wl_memfd_map("kvbench-p", m->map_len);
	m->at = calloc(c->layers, sizeof(*m->at));
	m->host = m->at;
	if (m->map == MAP_FAILED)
		m->map = NULL;
	if (!m->map || !m->at) {
		fprintf(stderr, "kvbench: P%u: source memory: out of memory\n",
			rank);
		return -1;
	}
	for (unsigned l = 0; l < c->layers; l++)
		m->at[l] = (char *) m->map + l * pb;
	return wl_mem_fill(m, c, rank, WL_SALT_WARM);
}

/*
 * Direct mode on `local`: the worker's own local transport, D's regions
 * (mapped by the parent before the fork) registered in it as well.
 */
int wl_direct_p(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t pb = wl_region_bytes_p(c), db = wl_region_bytes_d(c);
	struct kvb_transport_params tp = {.post_batch_size = -1};
	struct kvb_mr *mr = calloc(2 * (size_t) c->layers, sizeof(*mr));
	struct wl_layer_io *io = calloc(c->layers, sizeof(*io));
	struct wl_mem src;
	struct wl_direct d = {.c = c,
			      .rank = rank,
			      .io = io,
			      .src = &src,
			      .notify_fd = notify_fd};
	char why[128] = "";
	int rc;

	/* the same kind of memory as kvb_mem_alloc() gives in broker mode */
	if (!mr || !io || wl_src_mem(&src, c, rank))
		return 1;
	rc = kvb_local_ops.open(&tp, &d.t, why, sizeof(why));
	if (rc || (rc = d.t->ops->connect(d.t, NULL, 0, &d.ep))) {
		fprintf(stderr, "kvbench: P%u: local transport: %s %s\n", rank,
			strerror(-rc), why);
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		struct kvb_mr *sr = &mr[l], *dst = &mr[c->layers + l];

		*sr = (struct kvb_mr){.id = l + 1,
				      .kind = KVB_MEM_HOST,
				      .addr = src.at[l],
				      .len = pb};
		*dst = (struct kvb_mr){.id = c->layers + l + 1,
				       .flags = KVB_MEM_REMOTE_WRITE,
				       .kind = KVB_MEM_HOST,
				       .addr = (char *) dmaps[rank] + l * db,
				       .len = db};
		if (d.t->ops->reg_mr(d.t, sr) || d.t->ops->reg_mr(d.t, dst)) {
			fprintf(stderr, "kvbench: P%u: local reg_mr failed\n",
				rank);
			return 1;
		}
		io[l] = (struct wl_layer_io){.local = sr, .remote.mr = dst};
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

int wl_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t db = wl_region_bytes_d(c);
	void **base = calloc(c->layers, sizeof(*base));
	struct wl_mem m = {
		.layers = c->layers, .len = db, .at = base, .host = base};
	int rc;

	if (!base)
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		base[l] = (char *) dmaps[rank] + l * db;
	if (wl_sync_start(ready_fd, go[0]) || wl_sync_start(ready_fd, go[1]))
		return 1;
	rc = wl_direct_d_run(c, rank, notify_fd, &m, NULL, NULL, res);
	wl_mem_free(&m);
	return rc ? 1 : res->dbad ? 3 : 0;
}

int wl_attach(const char *sock, int is_d, unsigned rank, unsigned size,
	      int timeout_ms, struct kvb_ctx **ctx)
{
	struct kvb_attach_opts o = {.socket_path = sock,
				    .role = is_d ? KVB_ROLE_D : KVB_ROLE_P,
				    .tp_rank = rank,
				    .tp_size = size,
				    .timeout_ms = timeout_ms};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "kvbench: attach %c%u to %s: %s\n",
			is_d ? 'D' : 'P', rank, sock, kvb_strerror(rc));
	return rc;
}

int wl_broker_regions(struct kvb_ctx *ctx, const struct wl_cfg *c,
		      unsigned rank, int is_d, uint64_t len, uint32_t flags,
		      struct kvb_region *reg, struct wl_mem *m)
{
	int gpu = c->transport == KVB_BENCH_TR_GPU;

	memset(m, 0, sizeof(*m));
	if (gpu) {
		if (wl_gpu_mem_alloc(m, c, rank, is_d, len))
			return -1;
	} else {
		m->layers = c->layers;
		m->len = len;
		m->at = calloc(c->layers, sizeof(*m->at));
		m->host = m->at;
		if (!m->at) {
			fprintf(stderr, "kvbench: %c%u: out of memory\n",
				is_d ? 'D' : 'P', rank);
			return -1;
		}
	}
	for (unsigned l = 0; l < c->layers; l++) {
		int rc = gpu ? kvb_mem_register_gpu(ctx, m->at[l], len, 0,
						    flags, l, &reg[l])
			     : kvb_mem_alloc(ctx, len, flags, l, &reg[l]);

		if (rc) {
			fprintf(stderr,
				"kvbench: %c%u: layer %u region (%s): %s\n",
				is_d ? 'D' : 'P', rank, l,
				gpu ? "kvb_mem_register_gpu" : "kvb_mem_alloc",
				kvb_strerror(rc));
			return -1;
		}
		if (gpu)
			continue;
		m->at[l] = reg[l].addr;
		if (is_d)
			memset(m->at[l], 0, len); /* pages in before the run */
		else
			wl_fill_src(c, rank, l, m->at[l], WL_SALT_WARM);
	}
	return 0;
}

void wl_broker_regions_free(struct kvb_ctx *ctx, struct kvb_region *reg,
			    struct wl_mem *m)
{
	for (unsigned l = 0; l < m->layers; l++)
		if (reg[l].id)
			kvb_mem_free(ctx, &reg[l]);
	wl_mem_free(m);
}

int wl_p_wait_step(struct kvb_ctx *ctx, unsigned rank, uint64_t first,
		   unsigned n, const int64_t *t0, char prefix,
		   struct wl_pres *res)
{
	struct kvb_completion comp[COMP_BATCH];
	double *lat = wl_pres_lat(res);
	unsigned pending = n;

	while (pending) {
		/* woken once the step is done, not once per request */
		int k = kvb_wait_min(
			ctx, comp, COMP_BATCH,
			pending < COMP_BATCH ? pending : COMP_BATCH, 60000);

		if (k < 0) {
			fprintf(stderr,
				"kvbench: P%u: waiting for write_done: %s\n",
				rank, kvb_strerror(k));
			return -1;
		}
		for (int i = 0; i < k; i++) {
			uint64_t tag = comp[i].tag;

			if (comp[i].kind == KVB_COMP_DESC) {
				res->failed++; /* unsignaled: only errors */
				continue;
			}
			if (comp[i].kind != KVB_COMP_TRANSFER || tag < first ||
			    tag >= first + n)
				continue;
			if (comp[i].status) {
				res->failed++;
				fprintf(stderr,
					"kvbench: P%u: request %.*s%llu: %s\n",
					rank, prefix ? 1 : 0, &prefix,
					(unsigned long long) tag,
					kvb_strerror(comp[i].status));
			}
			if (t0) {
				lat[res->nlat++] =
					(double) (kvb_bench_now_ns() -
						  t0[tag - first]) /
					1e3;
				res->done++;
			}
			pending--;
		}
	}
	return 0;
}

int wl_d_completion(const struct wl_cfg *c, unsigned rank,
		    const struct kvb_completion *comp, char prefix, int verify,
		    struct wl_mem *m, struct wl_pres *res)
{
	if (comp->kind != KVB_COMP_TRANSFER)
		return 0;
	if (comp->status) {
		fprintf(stderr, "kvbench: D%u: request %.*s%llu failed: %s\n",
			rank, prefix ? 1 : 0, &prefix,
			(unsigned long long) comp->tag,
			kvb_strerror(comp->status));
		res->failed++;
	} else if (verify && wl_mem_verify(c, rank, m, comp->tag, res)) {
		return -1;
	}
	return 1;
}

#define WARM_TAG UINT64_MAX

/* Count warm-up completions (wait up to timeout_ms; 0: poll). 0 or -errno:
 * a failed warm-up write, or nothing for timeout_ms. */
static int warm_reap(struct kvb_ctx *ctx, uint64_t *got, int timeout_ms)
{
	struct kvb_completion comp[COMP_BATCH];
	int k = timeout_ms ? kvb_wait(ctx, comp, COMP_BATCH, timeout_ms)
			   : kvb_poll(ctx, comp, COMP_BATCH);

	if (k < 0)
		return k;
	for (int i = 0; i < k; i++) {
		if (comp[i].status)
			return comp[i].status;
		*got += comp[i].tag == WARM_TAG;
	}
	return 0;
}

/*
 * The same warm-up through the broker: writes outside any transfer, each
 * signaled (a transport with several queues, as gpu's streams, may finish
 * them in any order), all waited for.
 */
static int broker_warm(const struct wl_cfg *c, struct kvb_ctx *ctx,
		       const struct kvb_region *reg,
		       const struct kvb_remote_region *dst, struct kvb_desc *d)
{
	uint64_t n = wl_dslots(c), got = 0;
	uint64_t want = (uint64_t) c->layers * n * c->blocks;
	int rc;

	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < n; q++) {
			unsigned sent = 0;

			for (unsigned j = 0; j < c->blocks; j++)
				d[j] = (struct kvb_desc){
					.region = reg[l].id,
					.peer_region = dst[l].id,
					.offset = wl_src_block(c, q, j) *
						  c->block_bytes,
					.peer_offset = wl_dst_block(c, q, j) *
						       c->block_bytes,
					.len = c->block_bytes,
					.tag = WARM_TAG};
			while (sent < c->blocks) {
				rc = kvb_submit_write(ctx, d + sent,
						      c->blocks - sent);
				if (rc == -EAGAIN) {
					/* ring full: completions may be what
					 * holds the broker back */
					rc = warm_reap(ctx, &got, 0);
					if (rc)
						return rc;
					sched_yield();
					continue;
				}
				if (rc < 0)
					return rc;
				sent += (unsigned) rc;
			}
		}
	while (got < want)
		if ((rc = warm_reap(ctx, &got, 60000)))
			return rc;
	return 0;
}

/*
 * Open requests [first, first + n) ("req-<number>") into h: one control
 * round trip per KVB_TRANSFER_OPEN_BATCH_MAX of them (kvb_transfer_open_batch)
 * instead of one per request. 0 or the first failure's -errno.
 */
static int open_reqs(struct kvb_ctx *ctx, uint64_t first, unsigned n,
		     uint32_t *h)
{
	char buf[KVB_TRANSFER_OPEN_BATCH_MAX][32];
	const char *ids[KVB_TRANSFER_OPEN_BATCH_MAX];

	for (unsigned i = 0; i < n;) {
		unsigned k = n - i < KVB_TRANSFER_OPEN_BATCH_MAX
				     ? n - i
				     : KVB_TRANSFER_OPEN_BATCH_MAX;
		int rc;

		for (unsigned j = 0; j < k; j++) {
			snprintf(buf[j], sizeof(buf[j]), "req-%llu",
				 (unsigned long long) (first + i + j));
			ids[j] = buf[j];
		}
		rc = kvb_transfer_open_batch(ctx, ids, k, h + i, NULL);
		if (rc)
			return rc;
		i += k;
	}
	return 0;
}

int wl_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_remote_region *dst = calloc(c->layers, sizeof(*dst));
	struct kvb_desc *d = calloc(c->blocks, sizeof(*d));
	uint32_t *h = calloc(c->requests, sizeof(*h));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	struct wl_post_timer pt;
	struct wl_mem m;
	struct kvb_ctx *ctx;
	uint64_t cpu0;
	int64_t go_ns;
	int rc;

	if (!reg || !dst || !d || !h || !t0 ||
	    wl_attach(sock, 0, rank, c->workers, 0, &ctx))
		return 1;
	if (wl_broker_regions(ctx, c, rank, 0, wl_region_bytes_p(c), 0, reg,
			      &m))
		return 1;
	for (unsigned l = 0; l < c->layers; l++) {
		rc = kvb_mem_lookup(ctx, KVB_ROLE_D, 0, rank, l, &dst[l]);
		if (rc) {
			fprintf(stderr,
				"kvbench: P%u: D%u's layer %u region: %s\n",
				rank, rank, l, kvb_strerror(rc));
			return 1;
		}
	}
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	if ((rc = broker_warm(c, ctx, reg, dst, d))) {
		fprintf(stderr, "kvbench: P%u: warm-up: %s\n", rank,
			kvb_strerror(rc));
		return 1;
	}
	if (wl_mem_fill(&m, c, rank, 0))
		return 1;
	wl_post_timer_init(&pt, rank + 1);
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	while (next < total) {
		unsigned n = wl_next_step(c, next, total, go_ns);
		int64_t t_open;

		t_open = kvb_bench_now_ns();
		rc = open_reqs(ctx, next, n, h);
		res->ctl_ns += (uint64_t) (kvb_bench_now_ns() - t_open);
		if (rc) {
			fprintf(stderr,
				"kvbench: P%u: open req-%llu..%llu: %s\n", rank,
				(unsigned long long) next,
				(unsigned long long) (next + n - 1),
				kvb_strerror(rc));
			return 1;
		}
		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				uint64_t q = next + i;
				unsigned sent = 0;

				if (l == 0)
					t0[i] = wl_req_start_ns(c, q, go_ns);
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
					wl_post_begin(&pt);
					rc = kvb_submit_write(ctx, d + sent,
							      c->blocks - sent);
					wl_post_end(&pt, res,
						    rc > 0 ? (unsigned) rc : 0);
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
		if (wl_p_wait_step(ctx, rank, next, n, t0, 0, res))
			return 1;
		next += n;
	}
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->ok = 1;
	wl_broker_regions_free(ctx, reg, &m);
	kvb_detach(ctx);
	free(reg);
	free(dst);
	free(d);
	free(h);
	free(t0);
	return res->failed ? 3 : 0;
}

int wl_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests, sealed = 0;
	uint64_t window = 2ull * c->requests;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_completion comp[COMP_BATCH];
	struct kvb_ctx *ctx;
	struct wl_mem m;
	uint32_t *hs = calloc(window, sizeof(*hs));
	uint64_t cpu0;
	int rc;

	if (!reg || !hs || wl_attach(sock, 1, rank, c->workers, 0, &ctx))
		return 1;
	if (wl_broker_regions(ctx, c, rank, 1, wl_region_bytes_d(c),
			      KVB_MEM_REMOTE_WRITE, reg, &m))
		return 1;
	if (wl_sync_start(ready_fd, go[0]) || wl_sync_start(ready_fd, go[1]))
		return 1;
	cpu0 = kvb_bench_proc_cpu_ns();
	while (res->done < total) {
		int k;

		/*
		 * Seal ahead, each request waiting for its one P writer: up to
		 * `window` requests past the last done, opened a step's worth
		 * (R) or more at a time, in one round trip per batch.
		 */
		uint64_t upto =
			res->done + window < total ? res->done + window : total;
		unsigned nopen = (unsigned) (upto - sealed);

		if (nopen && (nopen >= c->requests || upto == total)) {
			rc = open_reqs(ctx, sealed, nopen, hs);
			for (unsigned i = 0; !rc && i < nopen; i++)
				while ((rc = kvb_transfer_seal(ctx, hs[i], 1,
							       sealed + i)) ==
				       -EAGAIN)
					sched_yield();
			if (rc) {
				fprintf(stderr,
					"kvbench: D%u: open/seal "
					"req-%llu..%llu: %s\n",
					rank, (unsigned long long) sealed,
					(unsigned long long) (upto - 1),
					kvb_strerror(rc));
				return 1;
			}
			sealed = upto;
		}
		/*
		 * Sleep until enough requests are done to open the next
		 * batch (or all are): woken once per step, not per request.
		 */
		{
			/* left >= 1: the loop runs while done < total */
			uint64_t left = sealed - res->done,
				 keep = window - c->requests, need = 1;

			if (sealed == total)
				need = left;
			else if (left > keep)
				need = left - keep;
			if (need > COMP_BATCH)
				need = COMP_BATCH;
			k = kvb_wait_min(ctx, comp, COMP_BATCH, (unsigned) need,
					 60000);
		}
		if (k < 0) {
			fprintf(stderr,
				"kvbench: D%u: waiting for write_done: %s\n",
				rank, kvb_strerror(k));
			return 1;
		}
		for (int i = 0; i < k; i++) {
			rc = wl_d_completion(c, rank, &comp[i], 0, c->verify,
					     &m, res);
			if (rc < 0)
				return 1;
			res->done += (uint64_t) rc;
		}
	}
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	wl_broker_regions_free(ctx, reg, &m);
	kvb_detach(ctx);
	free(reg);
	free(hs);
	return res->dbad || res->failed ? 3 : 0;
}

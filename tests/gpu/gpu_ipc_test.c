/* SPDX-License-Identifier: MIT */
/*
 * Real GPU copies between two processes through the gpu transport (label
 * gpu), plus copy bandwidth against the runtime's plain memcpy.
 *
 * The process forks before any runtime is initialised. The child ("worker")
 * allocates device memory, fills a pattern and sends an export handle over
 * a socketpair; the parent ("broker") imports it, copies it through the
 * transport into its own allocation, reads that back and checks every
 * byte. Then it times transport copies of 1, 4 and 16 MiB blocks against
 * synchronous memcpy (cudaMemcpy / hipMemcpy device to device) of the same
 * blocks in the same run.
 *
 * Plain C (no cmocka) so scripts/device-gpu-check.sh can build it alone.
 * --quick: 32 MiB, no bandwidth table (the benchmark's copies overwrite
 * each other's destinations on purpose, which a race detector flags).
 *
 * Exit: 0 pass, 1 fail, 77 no GPU or runtime, 3 IPC between processes
 * unavailable (e.g. a sandbox): copies and bandwidth then ran in one
 * process and the line "OUTCOME: ipc-unavailable" says so.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "gpu/gpu_api.h"
#include "gpu/gpu_export.h"

#define MIB	   (1024ull * 1024ull)
#define REGION_OFF (64 * 1024ull) /* region starts inside its allocation */
#define CHAIN	   8
#define WINDOW	   32 /* ops in flight */

struct msg {
	int32_t status;
	char why[236];
	struct kvb_gpu_handle h;
};

static const char *backend = "auto";
static int quick;
static int nstreams = KVB_GPU_STREAMS_DEFAULT;
static uint64_t region_size = 256 * MIB;

static int xfer(int fd, void *buf, size_t len, int wr)
{
	char *p = buf;

	while (len) {
		ssize_t n =
			wr ? send(fd, p, len, MSG_NOSIGNAL) : read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void pattern(unsigned char *p, uint64_t n, unsigned seed)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		p[i] = (unsigned char) ((i >> 3) * 131u + (i & 7) * 17u +
					(i >> 20) + seed);
}

/* ---- worker (child) ---------------------------------------------------- */

static int child_main(int sk)
{
	const struct kvb_gpu_api *g = NULL;
	struct msg m = {0};
	unsigned char *host = NULL;
	void *base = NULL;
	char done;
	int rc;

	rc = kvb_gpu_backend_init(backend, m.why, sizeof(m.why));
	if (rc)
		goto out_send;
	g = kvb_gpu_backend();
	rc = g->alloc(g, 0, region_size + 2 * REGION_OFF, &base);
	if (rc) {
		snprintf(m.why, sizeof(m.why), "alloc: %s", g->errstr(g));
		goto out_send;
	}
	host = malloc(region_size);
	if (!host) {
		rc = -ENOMEM;
		goto out_send;
	}
	pattern(host, region_size, 1);
	rc = g->memcpy(g, (char *) base + REGION_OFF, host, region_size,
		       KVB_GPU_H2D);
	if (rc) {
		snprintf(m.why, sizeof(m.why), "fill: %s", g->errstr(g));
		goto out_send;
	}
	rc = kvb_gpu_export((char *) base + REGION_OFF, region_size, 0, &m.h);
	if (rc)
		snprintf(m.why, sizeof(m.why), "export: %s",
			 kvb_gpu_export_strerror());
out_send:
	free(host);
	m.status = rc;
	if (xfer(sk, &m, sizeof(m), 1) == 0 && rc == 0)
		xfer(sk, &done, 1, 0); /* parent finished with our memory */
	if (base)
		g->free(g, base);
	return rc ? (rc == -ENODEV ? 77 : 1) : 0;
}

/* ---- broker (parent) --------------------------------------------------- */

struct run {
	struct kvb_transport *t;
	unsigned posted, done, failed;
};

static int reap(struct run *r, double deadline)
{
	struct kvb_xcqe cq[64];
	int n, i;

	n = r->t->ops->poll(r->t, cq, 64);
	if (n < 0)
		return n;
	for (i = 0; i < n; i++)
		if (cq[i].status)
			r->failed++;
	r->done += (unsigned) n;
	if (now_s() > deadline)
		return -ETIMEDOUT;
	return 0;
}

/* Post `n` ops in chains of CHAIN, at most WINDOW in flight; wait all. */
static int run_ops(struct kvb_transport *t, const struct kvb_xop *ops,
		   unsigned n)
{
	struct run r = {.t = t};
	double deadline = now_s() + 60;
	unsigned k;
	int rc;

	while (r.done < n) {
		if (r.posted < n && r.posted - r.done < WINDOW) {
			k = n - r.posted < CHAIN ? n - r.posted : CHAIN;
			rc = t->ops->post(t, NULL, ops + r.posted, k);
			if (rc < 0)
				return rc;
			r.posted += (unsigned) rc;
		}
		rc = reap(&r, deadline);
		if (rc)
			return rc;
	}
	return r.failed ? -EIO : 0;
}

static struct kvb_xop op_write(struct kvb_mr *src, uint64_t soff,
			       struct kvb_mr *dst, uint64_t doff, uint64_t len,
			       uint64_t cookie)
{
	struct kvb_xop op = {0};

	op.opcode = KVB_XOP_WRITE;
	op.local = src;
	op.local_off = soff;
	op.remote.mr = dst;
	op.remote_off = doff;
	op.len = len;
	op.cookie = cookie;
	return op;
}

/* Copy src to dst through the transport in shuffled 256 KiB pieces (some
 * runs merge, most do not) and verify every byte on the host. */
static int verify_copy(const struct kvb_gpu_api *g, struct kvb_transport *t,
		       struct kvb_mr *src, struct kvb_mr *dst)
{
	const uint64_t piece = 256 * 1024;
	unsigned n = (unsigned) (region_size / piece), i, j, tmp;
	unsigned char *want = NULL, *got = NULL;
	struct kvb_xop *ops;
	unsigned *order;
	uint64_t bad = 0, b;
	uint32_t seed = 7;
	int rc = -ENOMEM;

	ops = calloc(n, sizeof(*ops));
	order = calloc(n, sizeof(*order));
	want = malloc(region_size);
	got = malloc(region_size);
	if (!ops || !order || !want || !got)
		goto out;
	for (i = 0; i < n; i++)
		order[i] = i;
	for (i = n - 1; i > 0; i--) {
		if ((i & 3) == 0)
			continue; /* keep some runs in order: merges */
		seed = seed * 1103515245u + 12345u;
		j = (seed >> 8) % (i + 1);
		tmp = order[i];
		order[i] = order[j];
		order[j] = tmp;
	}
	for (i = 0; i < n; i++)
		ops[i] = op_write(src, order[i] * piece, dst, order[i] * piece,
				  piece, i);
	rc = run_ops(t, ops, n);
	if (rc) {
		fprintf(stderr, "verify: transport copies failed: %s\n",
			strerror(-rc));
		goto out;
	}
	rc = g->memcpy(g, got, dst->addr, region_size, KVB_GPU_D2H);
	if (rc) {
		fprintf(stderr, "verify: read back: %s\n", g->errstr(g));
		goto out;
	}
	pattern(want, region_size, 1);
	for (b = 0; b < region_size; b++)
		if (got[b] != want[b] && bad++ < 5)
			fprintf(stderr, "verify: byte %llu: %u != %u\n",
				(unsigned long long) b, got[b], want[b]);
	printf("verify: %llu bytes through %u ops: %s (%llu bad)\n",
	       (unsigned long long) region_size, n, bad ? "FAIL" : "ok",
	       (unsigned long long) bad);
	rc = bad ? -EIO : 0;
out:
	free(ops);
	free(order);
	free(want);
	free(got);
	return rc;
}

/*
 * Every method copies the same blocks: copy i reads block i % per and
 * writes block per - 1 - i % per (reversed, so no two ops of a chain
 * merge), `per` blocks on each side: the working set is the same for all,
 * and too big for the L2 cache from 4 MiB blocks on.
 */
static unsigned blocks(uint64_t n)
{
	unsigned per = (unsigned) (region_size / n);

	return per > CHAIN ? CHAIN : per;
}

static uint64_t soff(unsigned i, uint64_t n)
{
	return (i % blocks(n)) * n;
}

static uint64_t doff(unsigned i, uint64_t n)
{
	return (blocks(n) - 1 - i % blocks(n)) * n;
}

static double bw_transport(struct kvb_transport *t, struct kvb_mr *src,
			   struct kvb_mr *dst, uint64_t n, unsigned iters)
{
	struct kvb_xop *ops = calloc(iters, sizeof(*ops));
	double t0, dt;
	unsigned i;

	if (!ops)
		return -1;
	for (i = 0; i < iters; i++)
		ops[i] = op_write(src, soff(i, n), dst, doff(i, n), n, i);
	t0 = now_s();
	if (run_ops(t, ops, iters)) {
		free(ops);
		return -1;
	}
	dt = now_s() - t0;
	free(ops);
	return (double) n * iters / dt / 1e9;
}

static double bw_memcpy(const struct kvb_gpu_api *g, void *dst, const void *src,
			uint64_t n, unsigned iters)
{
	double t0 = now_s();
	unsigned char last;
	unsigned i;

	for (i = 0; i < iters; i++)
		if (g->memcpy(g, (char *) dst + doff(i, n),
			      (const char *) src + soff(i, n), n, KVB_GPU_D2D))
			return -1;
	/* cudaMemcpy D2D returns before the copy is done: a D2H read of one
	 * byte (same legacy stream, blocking) waits for all of them */
	if (g->memcpy(g, &last, dst, 1, KVB_GPU_D2H))
		return -1;
	return (double) n * iters / (now_s() - t0) / 1e9;
}

static double bw_async(const struct kvb_gpu_api *g, void *stream, void *dst,
		       const void *src, uint64_t n, unsigned iters)
{
	double t0 = now_s();
	unsigned i;

	for (i = 0; i < iters; i++)
		if (g->copy_async(g, (char *) dst + doff(i, n), 0,
				  (const char *) src + soff(i, n), 0, n,
				  stream))
			return -1;
	if (g->stream_sync(g, stream))
		return -1;
	return (double) n * iters / (now_s() - t0) / 1e9;
}

static double best3(double a, double b, double c)
{
	double m = a > b ? a : b;

	return m > c ? m : c;
}

static int bandwidth(const struct kvb_gpu_api *g, struct kvb_transport *t,
		     struct kvb_mr *src, struct kvb_mr *dst, const char *mode)
{
	static const uint64_t sizes[] = {256 * 1024, MIB, 4 * MIB, 16 * MIB};
	uint64_t budget = 32768 * MIB;
	void *stream = NULL;
	unsigned i, r, iters, below = 0;
	double bt[3], bm[3], ba[3], T, M, A;

	if (g->stream_create(g, 0, &stream)) {
		fprintf(stderr, "bandwidth: stream: %s\n", g->errstr(g));
		return -EIO;
	}
	printf("\nbandwidth (%s, backend %s; GB/s = 1e9 B/s, best of 3)\n",
	       mode, g->name);
	printf("%10s %7s %14s %14s %7s %16s\n", "#bytes", "#iters", "transport",
	       "memcpy(sync)", "ratio", "memcpyAsync(1s)");
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t n = sizes[i];

		if (n * 2 > region_size)
			continue;
		iters = (unsigned) (budget / n);
		if (iters > 65536)
			iters = 65536;
		/* warm-up: first use of each path */
		bw_transport(t, src, dst, n, CHAIN);
		bw_memcpy(g, dst->addr, src->addr, n, 4);
		for (r = 0; r < 3; r++) {
			bt[r] = bw_transport(t, src, dst, n, iters);
			bm[r] = bw_memcpy(g, dst->addr, src->addr, n, iters);
			ba[r] = bw_async(g, stream, dst->addr, src->addr, n,
					 iters);
		}
		T = best3(bt[0], bt[1], bt[2]);
		M = best3(bm[0], bm[1], bm[2]);
		A = best3(ba[0], ba[1], ba[2]);
		printf("%10llu %7u %14.1f %14.1f %7.2f %16.1f%s\n",
		       (unsigned long long) n, iters, T, M, M > 0 ? T / M : 0,
		       A,
		       n >= MIB ? (T >= 0.9 * M ? "  ok" : "  BELOW 0.9")
				: "  (info)");
		if (n >= MIB && T < 0.9 * M)
			below++;
	}
	printf("bandwidth target (transport >= 0.9 x memcpy for >= 1 MiB): "
	       "%s\n",
	       below ? "MISSED" : "met");
	g->stream_destroy(g, stream);
	return 0;
}

/* Can the runtime export `what` memory at ptr as a dmabuf (what the
 * broker's rdma path registers with ibv_reg_dmabuf_mr)? Prints the answer. */
static void dmabuf_probe(void *ptr, const char *what)
{
	uint64_t off;
	int fd;

	if (kvb_gpu_dmabuf_fd(ptr, 2 * MIB, &fd, &off) == 0) {
		printf("dmabuf export of %s: supported (offset %llu): the rdma "
		       "transport would use ibv_reg_dmabuf_mr\n",
		       what, (unsigned long long) off);
		close(fd);
	} else {
		printf("dmabuf export of %s: not available (%s): the rdma "
		       "transport would use ibv_reg_mr on the device "
		       "pointer\n",
		       what, kvb_gpu_export_strerror());
	}
}

static void report_platform(const struct kvb_gpu_api *g, void *ptr)
{
	int n = 0, a, b, ok;
	char id[32];

	g->device_count(g, &n);
	printf("backend %s, %d device(s)\n", g->name, n);
	for (a = 0; a < n && a < 16; a++) {
		if (g->device_id(g, a, id, sizeof(id)))
			snprintf(id, sizeof(id), "?");
		printf("  device %d: %s, peers:", a, id);
		for (b = 0; b < n && b < 16; b++)
			if (b != a && !g->can_access_peer(g, a, b, &ok))
				printf(" %d%s", b, ok ? "" : "(no)");
		printf("\n");
	}
	dmabuf_probe(ptr, "own memory");
}

static int mr_setup(struct kvb_transport *t, struct kvb_mr *mr, uint32_t id,
		    int dev, void *addr)
{
	memset(mr, 0, sizeof(*mr));
	mr->id = id;
	mr->kind = KVB_MEM_GPU;
	mr->gpu_device = dev;
	mr->addr = addr;
	mr->len = region_size;
	return t->ops->reg_mr(t, mr);
}

/* IPC unavailable: the same checks inside one process. */
static int single_process(const struct kvb_gpu_api *g, struct kvb_transport *t,
			  struct kvb_mr *dst)
{
	struct kvb_mr src;
	unsigned char *host;
	void *base = NULL;
	int rc;

	rc = g->alloc(g, 0, region_size, &base);
	if (rc) {
		fprintf(stderr, "alloc: %s\n", g->errstr(g));
		return rc;
	}
	host = malloc(region_size);
	rc = -ENOMEM;
	if (!host)
		goto out;
	pattern(host, region_size, 1);
	rc = g->memcpy(g, base, host, region_size, KVB_GPU_H2D);
	free(host);
	if (!rc)
		rc = mr_setup(t, &src, 1, 0, base);
	if (rc)
		goto out;
	rc = verify_copy(g, t, &src, dst);
	if (!rc && !quick)
		rc = bandwidth(g, t, &src, dst, "one process");
	t->ops->dereg_mr(t, &src);
out:
	g->free(g, base);
	return rc;
}

static int parent_main(int sk, pid_t child)
{
	struct kvb_transport_params p = {0};
	const struct kvb_gpu_api *g;
	struct kvb_transport *t = NULL;
	struct kvb_mr src, dst;
	void *imported = NULL, *own = NULL;
	char why[240] = "", done = 'd';
	struct msg m;
	int rc, dev, result = 1, wst;

	if (xfer(sk, &m, sizeof(m), 0)) {
		fprintf(stderr, "worker died before sending its handle\n");
		goto out_child;
	}
	if (m.status) {
		printf("worker: %s\n", m.why);
		result = m.status == -ENODEV ? 77 : 1;
		if (result == 77)
			printf("SKIP: no GPU runtime/device (%s)\n", m.why);
		goto out_child;
	}
	rc = kvb_gpu_backend_init(backend, why, sizeof(why));
	if (rc) {
		printf("SKIP: %s\n", why);
		result = 77;
		goto out_child;
	}
	g = kvb_gpu_backend();
	p.gpu_streams = nstreams;
	rc = kvb_gpu_transport_open(&p, backend, &t, why, sizeof(why));
	if (rc) {
		printf("transport: %s\n", why);
		goto out_child;
	}
	rc = g->alloc(g, 0, region_size, &own);
	if (rc) {
		fprintf(stderr, "alloc: %s\n", g->errstr(g));
		goto out_t;
	}
	if (mr_setup(t, &dst, 2, 0, own))
		goto out_own;
	report_platform(g, own);

	rc = kvb_gpu_import_device(&m.h, &dev);
	if (!rc)
		rc = kvb_gpu_import(&m.h, &imported);
	if (rc) {
		printf("OUTCOME: ipc-unavailable: import of the worker's "
		       "handle failed: %s\n",
		       kvb_gpu_export_strerror());
		printf("(sandboxed runtimes often refuse IPC between "
		       "processes; measuring in one process instead)\n");
		xfer(sk, &done, 1, 1);
		rc = single_process(g, t, &dst);
		result = 3;
		goto out_dst;
	}
	printf("imported %llu bytes at offset %llu of the worker's "
	       "allocation (device %d, bus %s)\n",
	       (unsigned long long) m.h.size, (unsigned long long) m.h.offset,
	       dev, m.h.bus_id);
	/* the broker holds worker memory this way (GPU regions across nodes) */
	dmabuf_probe(imported, "IPC-imported memory");
	if (mr_setup(t, &src, 1, dev, imported))
		goto out_import;
	rc = verify_copy(g, t, &src, &dst);
	if (!rc && !quick)
		rc = bandwidth(g, t, &src, &dst, "two processes, IPC");
	if (!rc) {
		struct kvb_gpu_stats s;

		kvb_gpu_transport_stats(t, &s);
		printf("stats: batches %llu copies %llu ops %llu bytes %llu "
		       "streams %u failed %llu\n",
		       (unsigned long long) s.batches,
		       (unsigned long long) s.copies,
		       (unsigned long long) s.ops, (unsigned long long) s.bytes,
		       s.streams, (unsigned long long) s.failed_batches);
		printf("OUTCOME: ipc-ok\n");
		result = 0;
	}
	t->ops->dereg_mr(t, &src);
out_import:
	kvb_gpu_unimport(imported);
out_dst:
	t->ops->dereg_mr(t, &dst);
out_own:
	g->free(g, own);
out_t:
	t->ops->close(t);
out_child:
	xfer(sk, &done, 1, 1);
	close(sk);
	if (waitpid(child, &wst, 0) == child && WIFEXITED(wst) &&
	    WEXITSTATUS(wst) != 0 && WEXITSTATUS(wst) != 77 && result == 0) {
		fprintf(stderr, "worker exited %d\n", WEXITSTATUS(wst));
		result = 1;
	}
	return result;
}

int main(int argc, char **argv)
{
	int sk[2], i;
	pid_t pid;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--backend") && i + 1 < argc)
			backend = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--streams") && i + 1 < argc)
			nstreams = atoi(argv[++i]);
		else {
			fprintf(stderr,
				"usage: %s [--backend auto|hip|cuda|host] "
				"[--quick] [--streams N]\n",
				argv[0]);
			return 2;
		}
	}
	if (quick)
		region_size = 32 * MIB;
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(280);
	/* fork before any runtime is initialised: the child gets a clean one */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sk)) {
		perror("socketpair");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		close(sk[0]);
		_exit(child_main(sk[1]));
	}
	close(sk[1]);
	return parent_main(sk[0], pid);
}

/* SPDX-License-Identifier: MIT */
/*
 * tcp transport: GPU regions, through the host staging buffers. The host
 * gpu backend runs with opaque device pointers ($KVB_GPU_HOST_OPAQUE): a
 * socket call or a memcpy on a device pointer outside the runtime would
 * fail (-EFAULT) or crash, so every byte checked here went through the
 * runtime's copies. Sizes cross the 1 MiB staging buffer and the socket
 * buffers (partial sends resume from the stage: each GPU byte is copied
 * exactly once, counted). Copy failures fail one op with -EIO, on each side
 * and each direction, and the connection keeps serving.
 */
#include "tcp_harness.h"

#include "common/gpu/gpu_api.h"
#include "common/gpu/gpu_host.h"

static const struct kvb_gpu_api *G;

/* A "device" region: guard | len | guard, all in device memory. */
struct gregion {
	struct kvb_mr mr;
	char *dev; /* allocation base (opaque pointer) */
	size_t len;
};

static const uint64_t sizes[] = {
	1,	4096, 65536 + 7, 1024 * 1024, 1024 * 1024 + 1, 3 * MiB + 123,
	8 * MiB};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define GAP    512u /* bytes left untouched between ops */

/* Bytes of one half: every size once, with gaps. */
static uint64_t half_len(void)
{
	uint64_t t = 0;
	unsigned i;

	for (i = 0; i < NSIZES; i++)
		t += sizes[i] + GAP;
	return t;
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 7;
	size_t i;

	for (i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t) (x >> 16);
	}
}

static void gregion_init(struct gregion *r, uint32_t id, size_t len,
			 uint32_t flags, const uint8_t *init)
{
	uint8_t *h = malloc(len + 2 * GUARD);
	void *d = NULL;

	assert_non_null(h);
	memset(h, GUARD_B, len + 2 * GUARD);
	if (init)
		memcpy(h + GUARD, init, len);
	else
		memset(h + GUARD, 0, len);
	assert_int_equal(G->alloc(G, 0, len + 2 * GUARD, &d), 0);
	assert_int_equal(G->memcpy(G, d, h, len + 2 * GUARD, KVB_GPU_H2D), 0);
	free(h);
	memset(r, 0, sizeof(*r));
	r->dev = d;
	r->len = len;
	r->mr.id = id;
	r->mr.flags = flags;
	r->mr.kind = KVB_MEM_GPU;
	r->mr.addr = r->dev + GUARD;
	r->mr.len = len;
}

/* Contents (malloc'd, len bytes); the guards are checked on the way. */
static uint8_t *gread(const struct gregion *r)
{
	uint8_t *h = malloc(r->len + 2 * GUARD), *out = malloc(r->len);
	size_t i;

	assert_non_null(h);
	assert_non_null(out);
	assert_int_equal(
		G->memcpy(G, h, r->dev, r->len + 2 * GUARD, KVB_GPU_D2H), 0);
	for (i = 0; i < GUARD; i++) {
		assert_int_equal(h[i], GUARD_B);
		assert_int_equal(h[GUARD + r->len + i], GUARD_B);
	}
	memcpy(out, h + GUARD, r->len);
	free(h);
	return out;
}

static void gregion_free(struct gregion *r)
{
	assert_int_equal(G->free(G, r->dev), 0);
}

static void greg(struct kvb_transport *t, struct gregion *r)
{
	assert_int_equal(kvb_tcp_ops.reg_mr(t, &r->mr), 0);
}

/* One op of every size from `l` [lbase..] to region id rid [rbase..]. */
static unsigned add_ops(struct kvb_xop *ops, unsigned k, uint32_t code,
			struct kvb_mr *l, uint64_t lbase, uint32_t rid,
			uint64_t rbase, uint64_t *cookie)
{
	uint64_t off = 0;
	unsigned i;

	for (i = 0; i < NSIZES; i++) {
		memset(&ops[k], 0, sizeof(ops[k]));
		ops[k].opcode = code;
		ops[k].local = l;
		ops[k].local_off = lbase + off;
		ops[k].remote.region = rid;
		ops[k].remote_off = rbase + off;
		ops[k].len = sizes[i];
		ops[k++].cookie = (*cookie)++;
		off += sizes[i] + GAP;
	}
	return k;
}

/* Where the ops of add_ops() land, [base .. base + half) gets src's bytes
 * at the same offsets, the gaps untouched. */
static void expect_copy(uint8_t *dst, const uint8_t *src)
{
	uint64_t off = 0;
	unsigned i;

	for (i = 0; i < NSIZES; i++) {
		memcpy(dst + off, src + off, sizes[i]);
		off += sizes[i] + GAP;
	}
}

static void test_backend(void **state)
{
	struct kvb_transport *a;
	struct gregion g;

	(void) state;
	assert_true(kvb_gpu_host_opaque());
	a = topen("127.0.0.1", 0, 0, 0);
	gregion_init(&g, 9, 4 * KiB, KVB_MEM_REMOTE_WRITE, NULL);
	/* not a host address: the kernel refuses to read it */
	assert_true(write(-1, g.mr.addr, 1) < 0);
	assert_int_equal(kvb_tcp_ops.reg_mr(a, &g.mr), 0);
	kvb_tcp_ops.dereg_mr(a, &g.mr);
	kvb_tcp_ops.close(a);
	gregion_free(&g);
}

/*
 * WRITE then READ in every pairing of GPU and host memory, in interleaved
 * chains: GPU->GPU, host->GPU, GPU->host; GPU<-GPU, host<-GPU, GPU<-host.
 */
static void test_both_ways(void **state)
{
	uint64_t T = half_len(), cookie = 0;
	struct kvb_xop ops[3 * NSIZES], run[3 * NSIZES];
	struct gregion gl, gr, gl2;
	struct region hl, hr, hl2;
	uint8_t *src = malloc(2 * T), *want, *got;
	struct kvb_tcp_stats sa, sb;
	struct kvb_gpu_host_counts c0, c1;
	struct pair p;
	unsigned k, i;

	(void) state;
	assert_non_null(src);
	pattern(src, 2 * T, 1);
	pair_open(&p, 0, 10000, 3 * NSIZES);
	gregion_init(&gl, 1, 2 * T, 0, src);
	region_init(&hl, 2, T, 0);
	region_fill(&hl, 2);
	gregion_init(&gr, 7, 2 * T, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ,
		     NULL);
	region_init(&hr, 8, T, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ);
	greg(p.a, &gl);
	reg(p.a, &hl);
	greg(p.b, &gr);
	reg(p.b, &hr);
	kvb_gpu_host_counts(&c0);

	k = add_ops(run, 0, KVB_XOP_WRITE, &gl.mr, 0, 7, 0, &cookie);
	k = add_ops(run, k, KVB_XOP_WRITE, &hl.mr, 0, 7, T, &cookie);
	k = add_ops(run, k, KVB_XOP_WRITE, &gl.mr, T, 8, 0, &cookie);
	/* the three runs interleaved: GPU and host payload in each frame */
	for (i = 0; i < k; i++)
		ops[i] = run[(i % 3) * NSIZES + i / 3];
	post_all(&p, ops, k);
	wait_all(&p);
	for (i = 0; i < k; i++)
		assert_int_equal(p.tr.status[i], 0);
	/* the runtime copied what the transports say they staged, no more */
	kvb_gpu_host_counts(&c1);
	assert_int_equal(c1.memcpy_bytes - c0.memcpy_bytes,
			 4 * (T - NSIZES * GAP));
	want = calloc(1, 2 * T);
	assert_non_null(want);
	expect_copy(want, src);
	expect_copy(want + T, hl.mem);
	got = gread(&gr);
	assert_memory_equal(got, want, 2 * T);
	free(got);
	memset(want, 0, T);
	expect_copy(want, src + T);
	assert_memory_equal(hr.mem, want, T);
	assert_true(guards_ok(&hr));
	sa = stats(p.a);
	sb = stats(p.b);
	/* every GPU byte copied once: partial sends resumed from the stage */
	assert_int_equal(sa.gpu_tx_bytes, 2 * (T - NSIZES * GAP));
	assert_int_equal(sb.gpu_rx_bytes, 2 * (T - NSIZES * GAP));
	assert_int_equal(sa.gpu_copy_errors + sb.gpu_copy_errors, 0);

	/* READ back into fresh regions: GPU<-GPU, host<-GPU, GPU<-host */
	gregion_init(&gl2, 3, 2 * T, 0, NULL);
	region_init(&hl2, 4, T, 0);
	greg(p.a, &gl2);
	reg(p.a, &hl2);
	tr_free(&p.tr);
	tr_init(&p.tr, 3 * NSIZES);
	cookie = 0;
	k = add_ops(ops, 0, KVB_XOP_READ, &gl2.mr, 0, 7, 0, &cookie);
	k = add_ops(ops, k, KVB_XOP_READ, &hl2.mr, 0, 7, T, &cookie);
	k = add_ops(ops, k, KVB_XOP_READ, &gl2.mr, T, 8, 0, &cookie);
	post_all(&p, ops, k);
	wait_all(&p);
	for (i = 0; i < k; i++)
		assert_int_equal(p.tr.status[i], 0);
	memset(want, 0, 2 * T);
	expect_copy(want, src);		/* gr's first half came from gl */
	expect_copy(want + T, src + T); /* hr came from gl's second half */
	got = gread(&gl2);
	assert_memory_equal(got, want, 2 * T);
	free(got);
	memset(want, 0, T);
	expect_copy(want, hl.mem); /* gr's second half came from hl */
	assert_memory_equal(hl2.mem, want, T);
	assert_true(guards_ok(&hl2));
	assert_int_equal(stats(p.b).gpu_tx_bytes - sb.gpu_tx_bytes,
			 2 * (T - NSIZES * GAP));
	assert_int_equal(stats(p.a).gpu_rx_bytes - sa.gpu_rx_bytes,
			 2 * (T - NSIZES * GAP));
	assert_int_equal(stats(p.b).rejected, 0);

	pair_close(&p);
	gregion_free(&gl);
	gregion_free(&gr);
	gregion_free(&gl2);
	region_free(&hl);
	region_free(&hr);
	region_free(&hl2);
	free(want);
	free(src);
}

/*
 * One op whose runtime copy fails: `fail_before_post` arms the failure
 * before post() (A's copy out of its GPU region, sending a WRITE), else
 * after (B's copy: into its GPU region for a WRITE, out of it for a READ).
 * The op completes -EIO, a second op on the same connection succeeds.
 */
static void copy_fail(uint32_t code, int fail_before_post)
{
	const uint64_t len = 256 * KiB;
	struct gregion gl, gr;
	struct kvb_xop op;
	struct pair p;
	uint8_t *src = malloc(4 * len), *got;
	uint64_t ea, eb;

	assert_non_null(src);
	pattern(src, 4 * len, 5);
	pair_open(&p, 0, 10000, 3);
	gregion_init(&gl, 1, 4 * len, 0, code == KVB_XOP_WRITE ? src : NULL);
	gregion_init(&gr, 7, 4 * len,
		     KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ,
		     code == KVB_XOP_READ ? src : NULL);
	greg(p.a, &gl);
	greg(p.b, &gr);
	/* connected first, so that post() sends at once */
	op = (struct kvb_xop){.opcode = code,
			      .local = &gl.mr,
			      .remote.region = 7,
			      .len = len,
			      .cookie = 0};
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	ea = stats(p.a).gpu_copy_errors;
	eb = stats(p.b).gpu_copy_errors;

	op.local_off = op.remote_off = len;
	op.cookie = 1;
	if (fail_before_post)
		kvb_gpu_host_fail_memcpy(0);
	post_all(&p, &op, 1);
	if (!fail_before_post)
		kvb_gpu_host_fail_memcpy(0);
	wait_all(&p);
	assert_int_equal(p.tr.status[1], -EIO);
	assert_int_equal(stats(p.a).gpu_copy_errors - ea,
			 fail_before_post ? 1 : 0);
	assert_int_equal(stats(p.b).gpu_copy_errors - eb,
			 fail_before_post ? 0 : 1);

	op.local_off = op.remote_off = 2 * len;
	op.cookie = 2;
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[2], 0);
	got = gread(code == KVB_XOP_WRITE ? &gr : &gl);
	assert_memory_equal(got, src, len);
	assert_memory_equal(got + 2 * len, src + 2 * len, len);
	free(got);
	assert_int_equal(stats(p.b).rejected, 0);
	assert_int_equal(stats(p.a).conn_failed, 0);
	pair_close(&p);
	gregion_free(&gl);
	gregion_free(&gr);
	free(src);
}

static void test_fail_write_send(void **state)
{
	(void) state;
	copy_fail(KVB_XOP_WRITE, 1);
}

static void test_fail_write_land(void **state)
{
	(void) state;
	copy_fail(KVB_XOP_WRITE, 0);
}

static void test_fail_read_serve(void **state)
{
	(void) state;
	copy_fail(KVB_XOP_READ, 0);
}

/* A GPU target deregistered before its WRITE lands: -ENOENT, no byte. */
static void test_dereg_target(void **state)
{
	const uint64_t len = 4 * MiB;
	struct gregion gl, gr;
	struct kvb_xop op;
	struct pair p;
	uint8_t *src = malloc(len), *got, *zero = calloc(1, len);

	(void) state;
	assert_non_null(src);
	assert_non_null(zero);
	pattern(src, len, 9);
	pair_open(&p, 0, 10000, 1);
	gregion_init(&gl, 1, len, 0, src);
	gregion_init(&gr, 7, len, KVB_MEM_REMOTE_WRITE, NULL);
	greg(p.a, &gl);
	greg(p.b, &gr);
	kvb_tcp_ops.dereg_mr(p.b, &gr.mr);
	op = (struct kvb_xop){.opcode = KVB_XOP_WRITE,
			      .local = &gl.mr,
			      .remote.region = 7,
			      .len = len,
			      .cookie = 0};
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], -ENOENT);
	got = gread(&gr);
	assert_memory_equal(got, zero, len);
	free(got);
	assert_int_equal(stats(p.b).gpu_rx_bytes, 0);
	pair_close(&p);
	gregion_free(&gl);
	gregion_free(&gr);
	free(src);
	free(zero);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend),
		cmocka_unit_test(test_both_ways),
		cmocka_unit_test(test_fail_write_send),
		cmocka_unit_test(test_fail_write_land),
		cmocka_unit_test(test_fail_read_serve),
		cmocka_unit_test(test_dereg_target),
	};
	char why[256] = "";

	setenv("KVB_GPU_HOST_OPAQUE", "1", 1);
	if (kvb_gpu_backend_init("host", why, sizeof(why))) {
		fprintf(stderr, "host gpu backend: %s\n", why);
		return 1;
	}
	G = kvb_gpu_backend();
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * The gpu transport through the host backend: batching per device pair,
 * merging, stream round-robin, event completion, failure of one copy,
 * teardown with copies in flight, invalid ops, credit, export/import.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu.h"
#include "gpu/gpu_api.h"
#include "gpu/gpu_export.h"
#include "gpu/gpu_host.h"

#define REG_SIZE (1u << 20)
#define BLK	 4096u
#define NSTREAMS 4

struct fx {
	const struct kvb_gpu_api *g;
	struct kvb_transport *t;
	struct kvb_mr a0, b0, c1; /* a0, b0 on device 0; c1 on device 1 */
	int status[4096];
	unsigned ncqe;
};

static void fill(struct kvb_mr *mr, unsigned seed)
{
	unsigned char *p = mr->addr;
	uint64_t i;

	for (i = 0; i < mr->len; i++)
		p[i] = (unsigned char) (i * 131u + seed * 7u + (i >> 12));
}

static void mr_init(struct fx *f, struct kvb_mr *mr, uint32_t id, int dev,
		    unsigned seed)
{
	memset(mr, 0, sizeof(*mr));
	mr->id = id;
	mr->kind = KVB_MEM_GPU;
	mr->gpu_device = dev;
	mr->len = REG_SIZE;
	assert_int_equal(f->g->alloc(f->g, dev, REG_SIZE, &mr->addr), 0);
	fill(mr, seed);
	assert_int_equal(f->t->ops->reg_mr(f->t, mr), 0);
}

static int open_fx(struct fx *f, int streams, uint32_t sq_depth)
{
	struct kvb_transport_params p = {0};
	char why[160] = "";

	p.gpu_streams = streams;
	p.sq_depth = sq_depth;
	assert_int_equal(kvb_gpu_backend_init("host", why, sizeof(why)), 0);
	f->g = kvb_gpu_backend();
	return kvb_gpu_transport_open(&p, "host", &f->t, why, sizeof(why));
}

static int setup_n(void **state, int streams, uint32_t sq_depth,
		   const char *split)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	kvb_gpu_host_pause(0);
	kvb_gpu_host_set_delay_us(0);
	if (split)
		setenv("KVB_GPU_STREAM_SPLIT", split, 1);
	assert_int_equal(open_fx(f, streams, sq_depth), 0);
	unsetenv("KVB_GPU_STREAM_SPLIT");
	mr_init(f, &f->a0, 1, 0, 1);
	mr_init(f, &f->b0, 2, 0, 2);
	mr_init(f, &f->c1, 3, 1, 3);
	*state = f;
	return 0;
}

static int setup(void **state)
{
	return setup_n(state, NSTREAMS, 0, NULL);
}

/* every copy on the next stream */
static int setup_spread(void **state)
{
	return setup_n(state, NSTREAMS, 0, "0");
}

/* next stream after 8 KiB of a batch */
static int setup_split8k(void **state)
{
	return setup_n(state, NSTREAMS, 0, "8192");
}

static int setup_credit(void **state)
{
	return setup_n(state, NSTREAMS, 4, NULL);
}

static void free_mrs(struct fx *f)
{
	struct kvb_mr *m[] = {&f->a0, &f->b0, &f->c1};
	unsigned i;

	for (i = 0; i < 3; i++) {
		if (f->t)
			f->t->ops->dereg_mr(f->t, m[i]);
		assert_int_equal(f->g->free(f->g, m[i]->addr), 0);
	}
}

static int teardown(void **state)
{
	struct fx *f = *state;
	struct kvb_gpu_host_counts c;

	kvb_gpu_host_pause(0);
	if (f->t)
		f->t->ops->close(f->t);
	f->t = NULL;
	free_mrs(f);
	kvb_gpu_host_counts(&c);
	assert_int_equal(c.streams, 0);
	assert_int_equal(c.events, 0);
	assert_int_equal(c.allocs, 0);
	free(f);
	return 0;
}

static struct kvb_xop mkop(uint32_t opc, struct kvb_mr *l, uint64_t loff,
			   struct kvb_mr *r, uint64_t roff, uint64_t len,
			   uint64_t cookie)
{
	struct kvb_xop op = {0};

	op.opcode = opc;
	op.local = l;
	op.local_off = loff;
	op.remote.mr = r;
	op.remote_off = roff;
	op.len = len;
	op.cookie = cookie;
	return op;
}

static struct kvb_xop wr(struct kvb_mr *l, uint64_t loff, struct kvb_mr *r,
			 uint64_t roff, uint64_t len, uint64_t cookie)
{
	return mkop(KVB_XOP_WRITE, l, loff, r, roff, len, cookie);
}

static void post_all(struct fx *f, struct kvb_ep *ep, struct kvb_xop *ops,
		     unsigned n)
{
	assert_int_equal(f->t->ops->post(f->t, ep, ops, n), (int) n);
}

/* Poll until `want` completions arrived in total; statuses by cookie. */
static void reap(struct fx *f, unsigned want)
{
	struct kvb_xcqe cq[64];
	time_t end = time(NULL) + 10;
	int n, i;

	while (f->ncqe < want) {
		n = f->t->ops->poll(f->t, cq, 64);
		assert_true(n >= 0);
		for (i = 0; i < n; i++) {
			assert_true(cq[i].cookie < 4096);
			assert_int_equal(f->status[cq[i].cookie], 1);
			f->status[cq[i].cookie] = cq[i].status;
			f->ncqe++;
		}
		assert_true(time(NULL) <= end);
	}
	n = f->t->ops->poll(f->t, cq, 64);
	assert_int_equal(n, 0); /* exactly once */
}

static void expect(struct fx *f, unsigned lo, unsigned hi)
{
	unsigned i;

	for (i = lo; i < hi; i++)
		f->status[i] = 1; /* pending marker */
}

static void check_copy(struct kvb_mr *dst, uint64_t doff, struct kvb_mr *src,
		       uint64_t soff, uint64_t len, unsigned src_seed)
{
	const unsigned char *d = (unsigned char *) dst->addr + doff;
	uint64_t i;

	(void) src;
	for (i = 0; i < len; i++) {
		uint64_t k = soff + i;
		unsigned char v =
			(unsigned char) (k * 131u + src_seed * 7u + (k >> 12));

		if (d[i] != v)
			fail_msg("byte %llu: got %u want %u",
				 (unsigned long long) i, d[i], v);
	}
}

static void gstats(struct fx *f, struct kvb_gpu_stats *s)
{
	assert_int_equal(kvb_gpu_transport_stats(f->t, s), 0);
}

static void test_merge_both_sides(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[4];
	struct kvb_gpu_stats s;
	unsigned i;

	for (i = 0; i < 4; i++)
		ops[i] = wr(&f->a0, 8192 + i * BLK, &f->b0, 65536 + i * BLK,
			    BLK, i);
	expect(f, 0, 4);
	post_all(f, NULL, ops, 4);
	reap(f, 4);
	for (i = 0; i < 4; i++)
		assert_int_equal(f->status[i], 0);
	gstats(f, &s);
	assert_int_equal(s.batches, 1);
	assert_int_equal(s.copies, 1);
	assert_int_equal(s.ops, 4);
	assert_int_equal(s.bytes, 4 * BLK);
	assert_int_equal(f->t->stats.doorbells, 1);
	assert_int_equal(f->t->stats.wrs, 1);
	assert_int_equal(f->t->stats.cqes, 4);
	check_copy(&f->b0, 65536, &f->a0, 8192, 4 * BLK, 1);
}

static void test_merge_one_side(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[4];
	struct kvb_gpu_stats s;

	/* contiguous at the source only */
	ops[0] = wr(&f->a0, 0, &f->b0, 0, BLK, 0);
	ops[1] = wr(&f->a0, BLK, &f->b0, 3 * BLK, BLK, 1);
	/* contiguous at the destination only */
	ops[2] = wr(&f->a0, 10 * BLK, &f->b0, 20 * BLK, BLK, 2);
	ops[3] = wr(&f->a0, 12 * BLK, &f->b0, 21 * BLK, BLK, 3);
	expect(f, 0, 4);
	post_all(f, NULL, ops, 4);
	reap(f, 4);
	gstats(f, &s);
	assert_int_equal(s.batches, 1);
	assert_int_equal(s.copies, 4);
	assert_int_equal(f->t->stats.wrs, 4);
	check_copy(&f->b0, 0, &f->a0, 0, BLK, 1);
	check_copy(&f->b0, 3 * BLK, &f->a0, BLK, BLK, 1);
	check_copy(&f->b0, 20 * BLK, &f->a0, 10 * BLK, BLK, 1);
	check_copy(&f->b0, 21 * BLK, &f->a0, 12 * BLK, BLK, 1);
}

static void test_batch_per_pair(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[5];
	struct kvb_gpu_stats s;
	unsigned i;

	/* interleaved device pairs: 0->1, 0->0, 0->1 (merges), READ 1->0 */
	ops[0] = wr(&f->a0, 0, &f->c1, 0, BLK, 0);
	ops[1] = wr(&f->a0, 0, &f->b0, 0, BLK, 1);
	ops[2] = wr(&f->a0, BLK, &f->c1, BLK, BLK, 2);
	ops[3] =
		mkop(KVB_XOP_READ, &f->b0, 100 * BLK, &f->c1, 50 * BLK, BLK, 3);
	ops[4] = wr(&f->a0, 2 * BLK, &f->c1, 2 * BLK, BLK, 4);
	expect(f, 0, 5);
	post_all(f, NULL, ops, 5);
	reap(f, 5);
	for (i = 0; i < 5; i++)
		assert_int_equal(f->status[i], 0);
	gstats(f, &s);
	assert_int_equal(s.batches, 3);
	assert_int_equal(f->t->stats.doorbells, 3);
	assert_int_equal(s.copies, 3); /* ops 0, 2, 4 merged into one */
	assert_int_equal(s.peer_copies, 2);
	check_copy(&f->c1, 0, &f->a0, 0, 3 * BLK, 1);
	check_copy(&f->b0, 0, &f->a0, 0, BLK, 1);
	check_copy(&f->b0, 100 * BLK, &f->c1, 50 * BLK, BLK, 3);
}

static void test_stream_round_robin(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[6];
	struct kvb_gpu_stats s;
	uint64_t c;
	unsigned i;
	const uint64_t want1[NSTREAMS] = {2, 2, 1, 1};

	kvb_gpu_host_pause(1);
	for (i = 0; i < 6; i++) /* a gap on both sides: no merging */
		ops[i] = wr(&f->a0, 2 * i * BLK, &f->c1, 2 * i * BLK, BLK, i);
	expect(f, 0, 8);
	post_all(f, NULL, ops, 6);
	for (i = 0; i < NSTREAMS; i++) {
		assert_int_equal(kvb_gpu_stream_copies(f->t, 0, i, &c), 0);
		assert_int_equal(c, want1[i]);
	}
	gstats(f, &s);
	assert_int_equal(s.streams, 2 * NSTREAMS); /* devices 0 and 1 */
	assert_int_equal(s.streams_busy, NSTREAMS);
	/* the next batch continues where the last one stopped */
	post_all(f, NULL, ops, 2);
	for (i = 0; i < NSTREAMS; i++) {
		assert_int_equal(kvb_gpu_stream_copies(f->t, 0, i, &c), 0);
		assert_int_equal(c, 2);
	}
	kvb_gpu_host_pause(0);
	/* ops 0 and 1 were posted twice: same cookies, reap by count */
	memset(f->status, 0, sizeof(f->status));
	for (i = 0; i < 6; i++)
		f->status[i] = 1;
	{
		struct kvb_xcqe cq[16];
		unsigned got = 0;
		time_t end = time(NULL) + 10;
		int n;

		while (got < 8) {
			n = f->t->ops->poll(f->t, cq, 16);
			assert_true(n >= 0);
			got += (unsigned) n;
			assert_true(time(NULL) <= end);
		}
	}
	gstats(f, &s);
	assert_int_equal(s.streams_busy, 0);
	assert_int_equal(s.batches_inflight, 0);
	assert_int_equal(kvb_gpu_stream_copies(f->t, 1, 0, &c), 0);
	assert_int_equal(c, 0);
}

static void expect_stream_copies(struct fx *f, const uint64_t *want)
{
	uint64_t c;
	unsigned i;

	for (i = 0; i < NSTREAMS; i++) {
		assert_int_equal(kvb_gpu_stream_copies(f->t, 0, i, &c), 0);
		if (c != want[i])
			fail_msg("stream %u: %llu copies, want %llu", i,
				 (unsigned long long) c,
				 (unsigned long long) want[i]);
	}
}

/* Default split: a batch of small copies stays on one stream, one event;
 * batches rotate over the pool. */
static void test_batch_one_stream(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[6];
	struct kvb_gpu_stats s;
	const uint64_t want[NSTREAMS] = {6, 6, 6, 0};
	unsigned b, i;

	kvb_gpu_host_pause(1);
	expect(f, 0, 18);
	for (b = 0; b < 3; b++) {
		for (i = 0; i < 6; i++)
			ops[i] = wr(&f->a0, (b * 12 + 2 * i) * BLK, &f->b0,
				    (b * 12 + 2 * i) * BLK, BLK, b * 6 + i);
		post_all(f, NULL, ops, 6);
	}
	expect_stream_copies(f, want);
	gstats(f, &s);
	assert_int_equal(s.streams_busy, 3);
	assert_int_equal(s.copies, 18);
	kvb_gpu_host_pause(0);
	reap(f, 18);
	for (i = 0; i < 18; i++) {
		assert_int_equal(f->status[i], 0);
		check_copy(&f->b0, 2 * i * BLK, &f->a0, 2 * i * BLK, BLK, 1);
	}
}

/*
 * Peer split after 8 KiB: two 4 KiB copies per stream, then the next one;
 * the same copies inside one device stay on one stream.
 */
static void test_batch_split(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[13];
	struct kvb_gpu_stats s;
	const uint64_t want[NSTREAMS] = {2, 2, 2, 7};
	unsigned i;

	kvb_gpu_host_pause(1);
	expect(f, 0, 13);
	for (i = 0; i < 6; i++)
		ops[i] = wr(&f->a0, 2 * i * BLK, &f->c1, 2 * i * BLK, BLK, i);
	post_all(f, NULL, ops, 6);
	gstats(f, &s);
	assert_int_equal(s.streams_busy, 3);
	/* a new batch starts on the next stream even if the last had room */
	for (i = 6; i < 13; i++)
		ops[i] = wr(&f->a0, 2 * i * BLK, &f->b0, 2 * i * BLK, BLK, i);
	post_all(f, NULL, &ops[6], 7);
	expect_stream_copies(f, want);
	kvb_gpu_host_pause(0);
	reap(f, 13);
	for (i = 0; i < 13; i++)
		assert_int_equal(f->status[i], 0);
}

static void test_event_completion(void **state)
{
	struct fx *f = *state;
	struct kvb_xcqe cq[8];
	struct kvb_xop ops[3];
	struct kvb_gpu_stats s;
	unsigned i;

	kvb_gpu_host_pause(1);
	expect(f, 0, 3);
	for (i = 0; i < 3; i++) { /* three posts = three batches in flight */
		ops[i] = wr(&f->a0, i * 8 * BLK, &f->c1, i * 8 * BLK, 8 * BLK,
			    i);
		post_all(f, NULL, &ops[i], 1);
	}
	assert_int_equal(f->t->ops->poll(f->t, cq, 8), 0);
	gstats(f, &s);
	assert_int_equal(s.batches_inflight, 3);
	assert_int_equal(s.ops_inflight, 3);
	kvb_gpu_host_pause(0);
	reap(f, 3);
	for (i = 0; i < 3; i++)
		assert_int_equal(f->status[i], 0);
	check_copy(&f->c1, 0, &f->a0, 0, 24 * BLK, 1);
	gstats(f, &s);
	assert_int_equal(s.batches_inflight, 0);
}

static void fail_one(void **state, int sync)
{
	struct fx *f = *state;
	struct kvb_xop ops[6];
	struct kvb_gpu_stats s;
	unsigned i, b;

	kvb_gpu_host_pause(1);
	/* batches A (ops 0,1), B (2,3), C (4,5); copy #2 (B's first) fails */
	kvb_gpu_host_fail_copy(2, sync);
	expect(f, 0, 6);
	for (b = 0; b < 3; b++) {
		for (i = 2 * b; i < 2 * b + 2; i++)
			ops[i] = wr(&f->a0, 2 * i * BLK, &f->b0,
				    2 * i * BLK + BLK * 64, BLK, i);
		post_all(f, NULL, &ops[2 * b], 2);
	}
	kvb_gpu_host_pause(0);
	reap(f, 6);
	assert_int_equal(f->status[0], 0);
	assert_int_equal(f->status[1], 0);
	assert_int_equal(f->status[2], -EIO);
	assert_int_equal(f->status[3], -EIO);
	assert_int_equal(f->status[4], 0);
	assert_int_equal(f->status[5], 0);
	for (i = 0; i < 6; i++)
		if (i != 2 && i != 3 && !(sync && i == 3))
			check_copy(&f->b0, 2 * i * BLK + BLK * 64, &f->a0,
				   2 * i * BLK, BLK, 1);
	gstats(f, &s);
	assert_int_equal(s.failed_batches, 1);
	assert_int_equal(s.failed_ops, 2);
	assert_int_equal(f->t->stats.errors, 2);
	assert_int_equal(s.batches_inflight, 0);
	assert_int_equal(s.streams_busy, 0);
}

static void test_fail_async(void **state)
{
	fail_one(state, 0);
}

static void test_fail_sync(void **state)
{
	fail_one(state, 1);
}

static void test_invalid_ops(void **state)
{
	struct fx *f = *state;
	struct kvb_mr stranger = f->b0;
	struct kvb_xop ops[5];

	stranger.tpriv[KVB_GPU_TPRIV] = NULL; /* never registered */
	ops[0] = wr(&f->a0, REG_SIZE - BLK, &f->b0, 0, 2 * BLK, 0);
	ops[1] = wr(&f->a0, 0, &stranger, 0, BLK, 1);
	ops[2] = wr(&f->a0, 0, &f->b0, 0, 0, 2);
	ops[3] = wr(&f->a0, 5 * BLK, &f->b0, 7 * BLK, BLK, 3);
	ops[4] = mkop(99, &f->a0, 0, &f->b0, 0, BLK, 4);
	ops[4].opcode = 99;
	expect(f, 0, 5);
	post_all(f, NULL, ops, 5);
	reap(f, 5);
	assert_int_equal(f->status[0], -EFAULT);
	assert_int_equal(f->status[1], -EINVAL);
	assert_int_equal(f->status[2], 0);
	assert_int_equal(f->status[3], 0);
	assert_int_equal(f->status[4], -EINVAL);
	check_copy(&f->b0, 7 * BLK, &f->a0, 5 * BLK, BLK, 1);
}

static void test_credit(void **state)
{
	struct fx *f = *state;
	struct kvb_xop ops[6];
	unsigned i;

	kvb_gpu_host_pause(1);
	for (i = 0; i < 6; i++)
		ops[i] = wr(&f->a0, 2 * i * BLK, &f->b0, 2 * i * BLK, BLK, i);
	expect(f, 0, 6);
	assert_int_equal(f->t->ops->post(f->t, NULL, ops, 6), 4);
	assert_int_equal(f->t->ops->post(f->t, NULL, ops + 4, 2), 0);
	assert_true(f->t->stats.credit_stalls >= 2);
	kvb_gpu_host_pause(0);
	reap(f, 4);
	post_all(f, NULL, ops + 4, 2);
	reap(f, 6);
	for (i = 0; i < 6; i++)
		assert_int_equal(f->status[i], 0);
}

static void test_ep_pair(void **state)
{
	struct fx *f = *state;
	struct kvb_gpu_ep_blob eb = {KVB_GPU_EP_MAGIC, 0, 1, 0};
	struct kvb_ep *ep = (struct kvb_ep *) &eb, *none = NULL;
	struct kvb_xop ops[2];

	assert_int_equal(f->t->ops->connect(f->t, NULL, 0, &none), 0);
	assert_null(none);
	eb.local_dev = 9;
	assert_int_equal(f->t->ops->connect(f->t, &eb, sizeof(eb), &ep),
			 -EINVAL);
	eb.local_dev = 0;
	assert_int_equal(f->t->ops->connect(f->t, &eb, sizeof(eb), &ep), 0);
	assert_non_null(ep);
	ops[0] = wr(&f->a0, 0, &f->c1, 0, BLK, 0); /* 0 -> 1: fits */
	ops[1] = wr(&f->a0, 0, &f->b0, 0, BLK, 1); /* 0 -> 0: wrong ep */
	expect(f, 0, 2);
	post_all(f, ep, ops, 2);
	reap(f, 2);
	assert_int_equal(f->status[0], 0);
	assert_int_equal(f->status[1], -EINVAL);
	f->t->ops->disconnect(f->t, ep);
}

static void test_teardown_inflight(void **state)
{
	struct fx *f = *state;
	struct kvb_gpu_host_counts before, after;
	struct kvb_xop ops[4];
	unsigned b, i;

	kvb_gpu_host_counts(&before);
	kvb_gpu_host_set_delay_us(2000);
	for (b = 0; b < 10; b++) {
		for (i = 0; i < 4; i++)
			ops[i] = wr(&f->a0, (b * 8 + 2 * i) * BLK, &f->c1,
				    (b * 8 + 2 * i) * BLK, BLK, b * 4 + i);
		post_all(f, NULL, ops, 4);
	}
	f->t->ops->close(f->t); /* must wait for all 40 copies */
	f->t = NULL;
	kvb_gpu_host_set_delay_us(0);
	kvb_gpu_host_counts(&after);
	assert_int_equal(after.copies - before.copies, 40);
	assert_int_equal(after.streams, 0);
	assert_int_equal(after.events, 0);
	for (b = 0; b < 10; b++)
		for (i = 0; i < 4; i++)
			check_copy(&f->c1, (b * 8 + 2 * i) * BLK, &f->a0,
				   (b * 8 + 2 * i) * BLK, BLK, 1);
}

/*
 * Random chains: mixed device pairs, runs contiguous on one side, both or
 * neither. Destinations within a chain never overlap, so the bytes are
 * checked after each chain whatever the streams' order.
 */
static void test_random(void **state)
{
	struct fx *f = *state;
	enum { SLOTS = REG_SIZE / BLK, NOPS = 600, MAXN = 64 };
	struct kvb_mr *dsts[2] = {&f->b0, &f->c1};
	struct kvb_xop ops[MAXN];
	struct kvb_gpu_stats s;
	unsigned cookie = 0, i, n, slot, src;
	uint32_t seed = 12345;

#define RND() (seed = seed * 1103515245u + 12345u, (seed >> 8))
	expect(f, 0, NOPS);
	while (cookie < NOPS) {
		n = 1 + RND() % MAXN;
		if (n > NOPS - cookie)
			n = NOPS - cookie;
		slot = RND() % (SLOTS - 2 * MAXN);
		src = RND() % (SLOTS - 2 * MAXN);
		for (i = 0; i < n; i++, cookie++) {
			struct kvb_mr *d = dsts[RND() % 4 == 0];

			if (i) {
				slot += RND() % 3 == 0 ? 2 : 1;
				src = RND() % 3 ? src + 1
						: RND() % (SLOTS - 2 * MAXN);
			}
			ops[i] = wr(&f->a0, (uint64_t) src * BLK, d,
				    (uint64_t) slot * BLK, BLK, cookie);
		}
		post_all(f, NULL, ops, n);
		reap(f, cookie);
		for (i = 0; i < n; i++)
			check_copy(ops[i].remote.mr, ops[i].remote_off, &f->a0,
				   ops[i].local_off, BLK, 1);
	}
#undef RND
	for (i = 0; i < NOPS; i++)
		assert_int_equal(f->status[i], 0);
	gstats(f, &s);
	assert_int_equal(s.ops, NOPS);
	assert_true(s.copies < NOPS); /* some merged */
	assert_true(s.copies > s.batches);
	print_message("random: %llu ops, %llu copies, %llu batches\n",
		      (unsigned long long) s.ops, (unsigned long long) s.copies,
		      (unsigned long long) s.batches);
}

static void test_export_import(void **state)
{
	struct fx *f = *state;
	struct kvb_gpu_handle h, h2, bad;
	void *p = NULL, *p2 = NULL;
	uint64_t off;
	int dev = -1, fd;

	assert_int_equal(
		kvb_gpu_export((char *) f->c1.addr + 3 * BLK, 8 * BLK, 1, &h),
		0);
	assert_int_equal(h.magic, KVB_GPU_HANDLE_MAGIC);
	assert_int_equal(h.offset, 3 * BLK);
	assert_int_equal(h.alloc_size, REG_SIZE);
	assert_string_equal(h.bus_id, "host:1");
	assert_int_equal(kvb_gpu_import_device(&h, &dev), 0);
	assert_int_equal(dev, 1);
	assert_int_equal(kvb_gpu_import(&h, &p), 0);
	assert_ptr_equal(p, (char *) f->c1.addr + 3 * BLK);
	assert_int_equal(kvb_gpu_export(f->c1.addr, BLK, 1, &h2), 0);
	assert_int_equal(kvb_gpu_import(&h2, &p2), 0); /* same allocation */
	assert_ptr_equal(p2, f->c1.addr);
	/* the same IPC bytes claiming a larger allocation (and an offset
	 * inside that claim): refused, not base + 512 GiB */
	bad = h2;
	bad.alloc_size = 1ull << 40;
	bad.offset = 1ull << 39;
	assert_int_equal(kvb_gpu_import(&bad, &p), -EINVAL);
	assert_ptr_equal(p, (char *) f->c1.addr + 3 * BLK); /* untouched */
	assert_int_equal(kvb_gpu_unimport(p), 0);
	assert_int_equal(kvb_gpu_unimport(p2), 0);
	assert_int_equal(kvb_gpu_unimport(p2), -ENOENT);

	/* beyond the allocation, foreign memory, corrupted handles */
	assert_int_equal(kvb_gpu_export(f->c1.addr, REG_SIZE + 1, 1, &bad),
			 -EINVAL);
	assert_int_equal(kvb_gpu_export(&bad, 8, 0, &bad), -EINVAL);
	bad = h;
	bad.magic ^= 1;
	assert_int_equal(kvb_gpu_import(&bad, &p), -EINVAL);
	bad = h;
	bad.size = REG_SIZE;
	assert_int_equal(kvb_gpu_import(&bad, &p), -EINVAL);
	bad = h;
	bad.backend = KVB_GPU_CUDA;
	assert_int_equal(kvb_gpu_import(&bad, &p), -EPROTO);

	assert_int_equal(kvb_gpu_dmabuf_fd(f->c1.addr, BLK, &fd, &off),
			 -ENOTSUP);
}

static void test_backend_select(void **state)
{
	const struct kvb_gpu_api *g;
	char why[200] = "";
	int rc;

	assert_int_equal(kvb_gpu_backend_init("host", NULL, 0), 0);
	assert_int_equal(kvb_gpu_backend_init("cuda", why, sizeof(why)),
			 -EBUSY);
	assert_non_null(strstr(why, "host"));
	/* the real runtimes load or say why not, without a GPU */
	why[0] = '\0';
	rc = _kvb_gpu_cuda_load(&g, why, sizeof(why));
	if (rc)
		assert_true(rc == -ENODEV && why[0]);
	why[0] = '\0';
	rc = _kvb_gpu_hip_load(&g, why, sizeof(why));
	if (rc)
		assert_true(rc == -ENODEV && why[0]);
	print_message("hip: %s\n", rc ? why : "available");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_select),
		cmocka_unit_test_setup_teardown(test_merge_both_sides, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_merge_one_side, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_batch_per_pair, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_stream_round_robin,
						setup_spread, teardown),
		cmocka_unit_test_setup_teardown(test_batch_one_stream, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_batch_split, setup_split8k,
						teardown),
		cmocka_unit_test_setup_teardown(test_event_completion, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fail_async, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fail_sync, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_invalid_ops, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_credit, setup_credit,
						teardown),
		cmocka_unit_test_setup_teardown(test_ep_pair, setup, teardown),
		cmocka_unit_test_setup_teardown(test_teardown_inflight, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_random, setup, teardown),
		cmocka_unit_test_setup_teardown(test_random, setup_spread,
						teardown),
		cmocka_unit_test_setup_teardown(test_export_import, setup,
						teardown),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);

	kvb_gpu_host_shutdown();
	return rc;
}

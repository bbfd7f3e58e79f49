/* SPDX-License-Identifier: MIT */
/*
 * The `local` transport: inline copies of small chains, and large chains cut
 * into pieces and copied by the pool, with the polling thread taking pieces
 * through progress() as the broker's loop does (reap_all). Every
 * byte is checked, every op must complete exactly once with its cookie, and
 * dereg_mr() / close() must not return while a copy could still touch the
 * memory. Built twice: plain (and under ASan in CI) and with TSan.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

#define MIB (1u << 20)

struct fx {
	struct kvb_transport *t;
	struct kvb_mr src, dst;
	uint8_t *s, *d;
	uint64_t len;
};

static void fx_open_p(struct fx *f, int threads, uint64_t piece, uint64_t len,
		      int plain)
{
	struct kvb_transport_params p = {.copy_threads = threads,
					 .copy_piece = piece,
					 .copy_plain = plain};
	char why[128] = "";

	memset(f, 0, sizeof(*f));
	assert_int_equal(kvb_local_ops.open(&p, &f->t, why, sizeof(why)), 0);
	f->len = len;
	f->s = malloc(len);
	f->d = malloc(len);
	assert_non_null(f->s);
	assert_non_null(f->d);
	for (uint64_t i = 0; i < len; i++)
		f->s[i] = (uint8_t) (i * 131 + (i >> 13) + 7);
	memset(f->d, 0xee, len);
	f->src = (struct kvb_mr){
		.id = 1, .kind = KVB_MEM_HOST, .addr = f->s, .len = len};
	f->dst = (struct kvb_mr){
		.id = 2, .kind = KVB_MEM_HOST, .addr = f->d, .len = len};
	assert_int_equal(f->t->ops->reg_mr(f->t, &f->src), 0);
	assert_int_equal(f->t->ops->reg_mr(f->t, &f->dst), 0);
}

static void fx_open(struct fx *f, int threads, uint64_t piece, uint64_t len)
{
	fx_open_p(f, threads, piece, len, 0);
}

static void fx_close(struct fx *f)
{
	f->t->ops->dereg_mr(f->t, &f->src);
	f->t->ops->dereg_mr(f->t, &f->dst);
	f->t->ops->close(f->t);
	free(f->s);
	free(f->d);
}

static struct kvb_xop wr(struct fx *f, uint64_t soff, uint64_t doff,
			 uint64_t len, uint64_t cookie)
{
	struct kvb_xop op = {.opcode = KVB_XOP_WRITE,
			     .local = &f->src,
			     .local_off = soff,
			     .remote = {.mr = &f->dst},
			     .remote_off = doff,
			     .len = len,
			     .cookie = cookie};

	return op;
}

/* 0: reap_all() never calls progress(): the pool alone must copy it all */
static int with_progress = 1;

/*
 * Poll until `want` completions arrived (bounded: 10 s), each cookie in
 * [0, want) exactly once with status 0.
 */
static void reap_all(struct fx *f, unsigned want)
{
	uint8_t *seen = calloc(want ? want : 1, 1);
	struct kvb_xcqe c[64];
	unsigned got = 0;
	int fd = f->t->ops->wait_fd ? f->t->ops->wait_fd(f->t) : -1;

	assert_non_null(seen);
	for (int round = 0; got < want && round < 10000; round++) {
		int n = f->t->ops->poll(f->t, c, 64);

		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			assert_true(c[i].cookie < want);
			assert_int_equal(c[i].status, 0);
			assert_int_equal(seen[c[i].cookie], 0);
			seen[c[i].cookie] = 1;
		}
		got += (unsigned) n;
		/* as the broker's round: one piece on this thread */
		if (with_progress && f->t->ops->progress &&
		    f->t->ops->progress(f->t) > 0)
			continue;
		if (!n && got < want) {
			struct pollfd pf = {.fd = fd, .events = POLLIN};

			/* the pool's eventfd wakes us; else just wait 1 ms */
			poll(fd >= 0 ? &pf : NULL, fd >= 0, 1);
		}
	}
	assert_int_equal(got, want);
	assert_int_equal(f->t->ops->poll(f->t, c, 64), 0);
	free(seen);
}

static void check_range(struct fx *f, uint64_t soff, uint64_t doff,
			uint64_t len)
{
	assert_memory_equal(f->d + doff, f->s + soff, len);
}

/* No pool: copies happen inside post(); no wait_fd. */
static void test_inline(void **state)
{
	struct fx f;
	struct kvb_xop ops[3];

	(void) state;
	fx_open(&f, 0, 0, 4 * MIB);
	assert_int_equal(f.t->ops->wait_fd(f.t), -1);
	ops[0] = wr(&f, 0, MIB, 3 * MIB, 0); /* large, still inline */
	ops[1] = wr(&f, 100, 5, 17, 1);
	ops[2] = wr(&f, 4096, 8192, 0, 2); /* zero length */
	assert_int_equal(f.t->ops->post(f.t, NULL, ops, 3), 3);
	assert_int_equal(f.t->ops->progress(f.t), 0); /* no pool */
	check_range(&f, 0, MIB, 3 * MIB);
	check_range(&f, 100, 5, 17);
	assert_int_equal(f.t->stats.doorbells, 1);
	assert_int_equal(f.t->stats.wrs, 3);
	assert_int_equal(f.t->stats.bytes, 3 * MIB + 17);
	reap_all(&f, 3);
	assert_int_equal(f.t->stats.cqes, 3);
	fx_close(&f);
}

/*
 * A worker may copy within one region with overlapping ranges (the broker
 * allows it): no memcpy on overlapping memory (ASan's memcpy-param-overlap
 * in the broker, found by test_ring_fuzz); the bytes come out as memmove's.
 * Short and long (non-temporal-sized) copies, forwards and backwards.
 */
static void test_overlap(void **state)
{
	static const uint64_t c[][3] = {{0, 45, 641},
					{45, 0, 641},
					{0, 1, 300 * 1024},
					{4096, 0, 300 * 1024}};
	struct fx f;
	uint8_t *want;

	(void) state;
	fx_open(&f, 0, 0, MIB);
	want = malloc(f.len);
	assert_non_null(want);
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct kvb_xop op = wr(&f, c[i][0], c[i][1], c[i][2], 0);

		op.remote.mr = &f.src;
		memcpy(want, f.s, f.len);
		memmove(want + c[i][1], want + c[i][0], c[i][2]);
		assert_int_equal(f.t->ops->post(f.t, NULL, &op, 1), 1);
		reap_all(&f, 1);
		assert_memory_equal(f.s, want, f.len);
	}
	free(want);
	fx_close(&f);
}

/*
 * Pool of 2, 64 KiB pieces: ops straddling pieces, ops inside one piece,
 * one op spanning many, zero-length ops; every byte and completion checked,
 * bytes outside the ops untouched.
 */
static void pool_write(int threads)
{
	struct fx f;
	struct kvb_xop ops[64];
	uint64_t doff = 0, soff = 0, sizes[64];
	unsigned n = 0;

	fx_open(&f, threads, 64 << 10, 16 * MIB);
	assert_true(f.t->ops->wait_fd(f.t) >= 0);
	for (unsigned i = 0; i < 40; i++)
		sizes[n++] = (uint64_t) ((i * 7919) % 50000) + 1;
	sizes[n++] = 0;
	sizes[n++] = 3 * MIB + 5; /* many pieces */
	sizes[n++] = 0;
	sizes[n++] = 1;
	for (unsigned i = 0; i < n; i++) {
		ops[i] = wr(&f, soff, doff + 64, sizes[i], i);
		soff += sizes[i] + 3;
		doff += sizes[i] + 128; /* gaps must stay 0xee */
	}
	assert_true(doff + 64 < f.len);
	assert_int_equal(f.t->ops->post(f.t, NULL, ops, n), (int) n);
	reap_all(&f, n);
	for (unsigned i = 0; i < n; i++)
		check_range(&f, ops[i].local_off, ops[i].remote_off,
			    ops[i].len);
	for (unsigned i = 0; i + 1 < n; i++)
		for (uint64_t b = ops[i].remote_off + ops[i].len;
		     b < ops[i + 1].remote_off; b++)
			assert_int_equal(f.d[b], 0xee);
	assert_int_equal(f.d[63], 0xee);
	assert_int_equal(f.t->stats.doorbells, 1);
	assert_int_equal(f.t->stats.wrs, n);
	fx_close(&f);
}

static void test_pool_write(void **state)
{
	(void) state;
	pool_write(2);
}

/*
 * The pool alone (no progress() calls): its threads take runs of lane A
 * and must also take lane B, the part kept for the caller's thread, or the
 * chain never completes. One thread, and three (runs shared out).
 */
static void test_pool_lanes(void **state)
{
	(void) state;
	with_progress = 0;
	pool_write(1);
	pool_write(3);
	with_progress = 1;
}

/* READ: the local region is the sink. */
static void test_pool_read(void **state)
{
	struct fx f;
	struct kvb_xop ops[8];

	(void) state;
	fx_open(&f, 3, 0, 8 * MIB);
	for (unsigned i = 0; i < 8; i++) {
		/* local = dst buffer, remote = src buffer */
		ops[i] = (struct kvb_xop){.opcode = KVB_XOP_READ,
					  .local = &f.dst,
					  .local_off = (7 - i) * MIB,
					  .remote = {.mr = &f.src},
					  .remote_off = i * MIB,
					  .len = MIB - 1000 * i,
					  .cookie = i};
	}
	assert_int_equal(f.t->ops->post(f.t, NULL, ops, 8), 8);
	reap_all(&f, 8);
	for (unsigned i = 0; i < 8; i++)
		check_range(&f, i * MIB, (7 - i) * MIB, MIB - 1000 * i);
	fx_close(&f);
}

/* Many chains queued before anyone polls; a small one in between goes
 * inline. */
static void test_many_chains(void **state)
{
	struct fx f;
	const unsigned chains = 32, per = 8;
	const uint64_t blk = 32 << 10; /* 8 x 32 KiB = 256 KiB a chain */
	struct kvb_xop ops[8];
	unsigned cookie = 0;

	(void) state;
	fx_open(&f, 2, 16 << 10, chains * per * blk + MIB);
	for (unsigned c = 0; c < chains; c++) {
		for (unsigned i = 0; i < per; i++) {
			uint64_t o = (uint64_t) (c * per + i) * blk;

			ops[i] = wr(&f, o, o, blk, cookie++);
		}
		assert_int_equal(f.t->ops->post(f.t, NULL, ops, per),
				 (int) per);
		if (c == 10) {
			/* below two pieces: copied inside post() */
			uint64_t o = (uint64_t) chains * per * blk;

			ops[0] = wr(&f, o, o, 1000, cookie++);
			assert_int_equal(f.t->ops->post(f.t, NULL, ops, 1), 1);
			check_range(&f, o, o, 1000);
		}
	}
	reap_all(&f, cookie);
	check_range(&f, 0, 0, (uint64_t) chains * per * blk);
	assert_int_equal(f.t->stats.doorbells, chains + 1);
	fx_close(&f);
}

/*
 * More pooled ops outstanding than the completion queue's first size (1024)
 * before anyone polls: none may be lost or overwritten.
 */
static void test_many_ops_unpolled(void **state)
{
	struct fx f;
	const unsigned chains = 4, per = 700;
	const uint64_t blk = 1024;
	struct kvb_xop *ops = calloc(per, sizeof(*ops));
	unsigned cookie = 0;

	(void) state;
	assert_non_null(ops);
	fx_open(&f, 1, 16 << 10, (uint64_t) chains * per * blk);
	for (unsigned c = 0; c < chains; c++) {
		for (unsigned i = 0; i < per; i++) {
			uint64_t o = (uint64_t) (c * per + i) * blk;

			ops[i] = wr(&f, o, o, blk, cookie++);
		}
		assert_int_equal(f.t->ops->post(f.t, NULL, ops, per),
				 (int) per);
	}
	reap_all(&f, cookie);
	check_range(&f, 0, 0, (uint64_t) chains * per * blk);
	free(ops);
	fx_close(&f);
}

/*
 * One try for the progress() tests: post ops, call progress() until it has
 * nothing (no call may return more than max_run pieces; afterwards nothing
 * is queued), reap, check every op's bytes. Returns the pieces progress()
 * copied; *best = the largest single call.
 */
static int progress_try(struct fx *f, struct kvb_xop *ops, unsigned n,
			int max_run, int *best)
{
	int mine = 0, k;

	memset(f->d, 0xee, f->len);
	assert_int_equal(f->t->ops->post(f->t, NULL, ops, n), (int) n);
	*best = 0;
	while ((k = f->t->ops->progress(f->t)) > 0) {
		assert_true(k <= max_run);
		mine += k;
		if (k > *best)
			*best = k;
	}
	assert_int_equal(f->t->ops->progress(f->t), 0); /* nothing queued */
	reap_all(f, n);
	for (unsigned i = 0; i < n; i++)
		check_range(f, ops[i].local_off, ops[i].remote_off, ops[i].len);
	return mine;
}

/*
 * progress(): the caller's thread takes queued pieces. One pool thread and
 * three 32 MiB pieces: the caller's lane is the last piece, which the pool
 * steals only after copying the first two (milliseconds), so progress()
 * right after post() usually gets it. Usually, not always: on a loaded
 * machine this thread can be descheduled that long, and then the pool has
 * taken everything (mine == 0, still correct). So the caller must take a
 * piece in at least one of up to 40 tries; every try must copy right and
 * leave nothing queued.
 */
static void test_progress(void **state)
{
	struct fx f;
	struct kvb_xop ops[3];
	unsigned tries;
	int mine = 0, best;

	(void) state;
	fx_open(&f, 1, 32 * MIB, 96 * MIB);
	for (unsigned i = 0; i < 3; i++)
		ops[i] = wr(&f, i * 32 * MIB, (2 - i) * 32 * MIB, 32 * MIB, i);
	for (tries = 0; tries < 40 && !mine; tries++) {
		mine = progress_try(&f, ops, 3, 3, &best);
		assert_true(mine <= 3);
	}
	print_message("progress() took %d piece(s) on try %u\n", mine, tries);
	assert_true(mine >= 1);
	fx_close(&f);
}

/*
 * progress() copies a run of consecutive pieces, up to 2 MiB: 64 KiB
 * pieces, one pool thread, a 64 MiB chain (lane B: the last 512 pieces, so
 * that the pool needs milliseconds to copy its lane and steal all of B:
 * with a 4 MiB chain a loaded CI machine once delayed this thread past
 * that in 40 tries running). No call may return more than 32; some call
 * must return more than one (in one of up to 40 tries: the pool may have
 * stolen the lane first, as in test_progress); every try copies right.
 */
static void test_progress_runs(void **state)
{
	const uint64_t piece = 64 << 10, len = 64 * MIB;
	struct fx f;
	struct kvb_xop op;
	unsigned tries;
	int best = 0;

	(void) state;
	fx_open(&f, 1, piece, 2 * len);
	op = wr(&f, 0, len, len, 0);
	for (tries = 0; tries < 40 && best < 2; tries++)
		progress_try(&f, &op, 1, (int) ((2 * MIB) / piece), &best);
	print_message("largest run %d pieces, try %u\n", best, tries);
	assert_true(best >= 2);
	fx_close(&f);
}

/* dereg_mr() returns only after every pooled copy finished. */
static void test_dereg_waits(void **state)
{
	struct fx f;
	struct kvb_xop ops[4];

	(void) state;
	fx_open(&f, 1, 8 * MIB, 32 * MIB); /* big pieces: the pool is
					    * still copying when post()
					    * returns */
	for (unsigned i = 0; i < 4; i++)
		ops[i] = wr(&f, i * 8 * MIB, (3 - i) * 8 * MIB, 8 * MIB, i);
	assert_int_equal(f.t->ops->post(f.t, NULL, ops, 4), 4);
	f.t->ops->dereg_mr(f.t, &f.src);
	/* no poll yet: the bytes must already be there (last piece first:
	 * the one the pool most likely copied last) */
	for (unsigned i = 4; i-- > 0;)
		check_range(&f, i * 8 * MIB, (3 - i) * 8 * MIB, 8 * MIB);
	reap_all(&f, 4);
	fx_close(&f);
}

/* close() with chains queued and nothing reaped: no leak, no crash. */
static void test_close_in_flight(void **state)
{
	struct fx f;
	struct kvb_xop ops[4];

	(void) state;
	fx_open(&f, 4, 0, 16 * MIB);
	for (unsigned k = 0; k < 4; k++) {
		for (unsigned i = 0; i < 4; i++) {
			uint64_t o = (uint64_t) (k * 4 + i) * MIB;

			ops[i] = wr(&f, o, o, MIB, k * 4 + i);
		}
		assert_int_equal(f.t->ops->post(f.t, NULL, ops, 4), 4);
	}
	f.t->ops->close(f.t); /* finishes the queued pieces, completes none */
	check_range(&f, 0, 0, 16 * MIB);
	free(f.s);
	free(f.d);
}

/* Does this build stream (non-temporal stores) on this CPU? */
static int expect_streams(void)
{
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
	return 0;
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	return 0;
#elif defined(__x86_64__) && defined(__GNUC__)
	return __builtin_cpu_supports("avx2") != 0;
#else
	return 0;
#endif
}

/*
 * Copies around the streaming threshold (32 KiB) and its 32-byte
 * destination alignment and 128-byte steps: every length and misalignment
 * of source and destination copies exactly its bytes and nothing next to
 * them, streamed or not (copy_plain), inline and through the pool.
 */
static void streamed(int threads, int plain)
{
	static const uint64_t lens[] = {
		(32u << 10) - 1,   32u << 10,	      (32u << 10) + 1,
		(32u << 10) + 31,  (32u << 10) + 127, (32u << 10) + 128,
		(256u << 10) + 77, MIB + 5,	      2 * MIB + 4095};
	static const uint64_t mis[][2] = {{0, 0},   {1, 0},  {0, 1},
					  {5, 31},  {31, 5}, {32, 33},
					  {63, 17}, {17, 63}};
	struct fx f;

	fx_open_p(&f, threads, 64u << 10, 8 * MIB, plain);
	assert_int_equal(kvb_local_streams(f.t), plain ? 0 : expect_streams());
	for (unsigned i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (unsigned k = 0; k < sizeof(mis) / sizeof(mis[0]); k++) {
			uint64_t soff = 4096 + mis[k][0],
				 doff = 3 * MIB + mis[k][1];
			struct kvb_xop op = wr(&f, soff, doff, lens[i], 0);

			memset(f.d, 0xee, f.len);
			assert_int_equal(f.t->ops->post(f.t, NULL, &op, 1), 1);
			reap_all(&f, 1);
			check_range(&f, soff, doff, lens[i]);
			/* the bytes around the copy are untouched */
			for (uint64_t j = doff - 64; j < doff; j++)
				assert_int_equal(f.d[j], 0xee);
			for (uint64_t j = doff + lens[i];
			     j < doff + lens[i] + 64; j++)
				assert_int_equal(f.d[j], 0xee);
		}
	fx_close(&f);
}

static void test_streamed_inline(void **state)
{
	(void) state;
	streamed(0, 0);
	streamed(0, 1);
}

static void test_streamed_pool(void **state)
{
	(void) state;
	streamed(2, 0);
}

static void test_bad_params(void **state)
{
	struct kvb_transport_params p = {.copy_threads = 65};
	struct kvb_transport *t = NULL;
	char why[128] = "";

	(void) state;
	assert_int_equal(kvb_local_ops.open(&p, &t, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "copy threads"));
	assert_null(t);
	p.copy_threads = -1;
	assert_int_equal(kvb_local_ops.open(&p, &t, NULL, 0), -EINVAL);
	/* a GPU region is not local's */
	p.copy_threads = 0;
	assert_int_equal(kvb_local_ops.open(&p, &t, NULL, 0), 0);
	{
		struct kvb_mr mr = {.kind = KVB_MEM_GPU};

		assert_int_equal(t->ops->reg_mr(t, &mr), -EOPNOTSUPP);
	}
	t->ops->close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inline),
		cmocka_unit_test(test_overlap),
		cmocka_unit_test(test_pool_write),
		cmocka_unit_test(test_pool_read),
		cmocka_unit_test(test_many_chains),
		cmocka_unit_test(test_many_ops_unpolled),
		cmocka_unit_test(test_progress),
		cmocka_unit_test(test_progress_runs),
		cmocka_unit_test(test_pool_lanes),
		cmocka_unit_test(test_dereg_waits),
		cmocka_unit_test(test_close_in_flight),
		cmocka_unit_test(test_streamed_inline),
		cmocka_unit_test(test_streamed_pool),
		cmocka_unit_test(test_bad_params),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

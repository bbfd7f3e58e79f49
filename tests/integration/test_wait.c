/* SPDX-License-Identifier: MIT */
/*
 * kvb_wait timing and the sleep/wake handshake with the broker: a wait with
 * nothing pending times out, not before its time; after the broker has gone
 * to sleep (idle longer than --busy-poll-us), a submission wakes it and the
 * completion wakes the waiting worker; thousands of submit/wait round trips
 * with jittered pauses lose no wakeup; waits that always end up asleep
 * shorten kvb_wait's busy-poll (counted in the broker's per-worker stats);
 * kvb_wait_min sleeps once for several completions.
 *
 * A lost wakeup is not judged by the clock (a loaded 2-core CI machine
 * stalls a process for most of a second now and then) but by the counters:
 * the broker counts sleeps that ran to their timeout with a submission
 * waiting (late_wakeups), the library counts kvb_wait sleeps that ran to
 * their timeout with a completion waiting (worker_late_wakeups). Both must
 * stay 0. The latencies are printed. Upper time bounds here only catch a
 * wait that ignores its timeout, so they are generous.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define KiB    (1ull << 10)
#define ROUNDS 3000

/* No lost wakeup so far, on either side. */
static void no_late_wakeups(void)
{
	char js[16384];
	int64_t br, wk;

	assert_int_equal(broker_stats(&fx.br, js, sizeof(js)), 0);
	br = stat_get(js, "late_wakeups");
	wk = stat_get(js, "worker_late_wakeups");
	if (br || wk)
		fail_msg("lost wakeups: broker %lld, workers %lld (-1: no such "
			 "counter)",
			 (long long) br, (long long) wk);
}

static int round_trip(uint64_t tag, double *ms)
{
	struct kvb_desc d = {.region = fx.src.id,
			     .peer_region = fx.dst.id,
			     .offset = (tag % 16) * KiB,
			     .peer_offset = (tag % 16) * KiB,
			     .len = KiB,
			     .tag = tag};
	struct kvb_completion c[2];
	int64_t t0 = now_ns();
	int n;

	if (kvb_submit_write(fx.ctx, &d, 1) != 1)
		return -1;
	n = kvb_wait(fx.ctx, c, 2, 3000);
	*ms = ms_since(t0);
	if (n != 1 || c[0].tag != tag || c[0].status)
		return -2;
	return 0;
}

static void test_timeout(void **state)
{
	struct kvb_completion c[4];
	int64_t t0;
	double ms;

	(void) state;
	t0 = now_ns();
	assert_int_equal(kvb_wait(fx.ctx, c, 4, 50), -ETIMEDOUT);
	ms = ms_since(t0);
	fprintf(stderr, "kvb_wait(50 ms) with nothing pending: %.1f ms\n", ms);
	assert_true(ms >= 49 && ms < 50 + SLACK);

	t0 = now_ns();
	assert_int_equal(kvb_wait(fx.ctx, c, 4, 0), -ETIMEDOUT);
	assert_true(ms_since(t0) < SLACK);
	t0 = now_ns();
	assert_int_equal(kvb_wait(fx.ctx, c, 4, 1), -ETIMEDOUT);
	assert_true(ms_since(t0) < 1 + SLACK);
	t0 = now_ns();
	assert_int_equal(kvb_wait(fx.ctx, c, 4, 250), -ETIMEDOUT);
	ms = ms_since(t0);
	assert_true(ms >= 249 && ms < 250 + SLACK);
	/* poll with nothing: 0, not an error */
	assert_int_equal(kvb_poll(fx.ctx, c, 4), 0);
	assert_int_equal(kvb_wait(fx.ctx, c, 0, 10), -EINVAL);
	assert_int_equal(kvb_poll(fx.ctx, c, 0), -EINVAL);
}

static void test_wake_after_sleep(void **state)
{
	double ms, worst = 0;

	(void) state;
	for (int i = 0; i < 5; i++) {
		usleep(200 * 1000); /* the broker is asleep by now */
		assert_int_equal(round_trip(1000 + i, &ms), 0);
		if (ms > worst)
			worst = ms;
	}
	fprintf(stderr,
		"submit -> completion after 200 ms idle: worst %.2f ms\n",
		worst);
	no_late_wakeups();
}

struct d_wait {
	struct kvb_ctx *ctx;
	int n;
	struct kvb_completion c[4];
	int64_t t;
};

static void *d_waiter(void *arg)
{
	struct d_wait *w = arg;

	w->n = kvb_wait(w->ctx, w->c, 4, -1);
	w->t = now_ns();
	return NULL;
}

/* A D worker asleep in kvb_wait(-1) is woken by another worker's write. */
static void test_wake_other_worker(void **state)
{
	struct kvb_remote_region rr;
	struct kvb_region dreg;
	struct kvb_ctx *dctx;
	struct d_wait w = {0};
	struct kvb_completion c[4];
	struct kvb_desc d;
	pthread_t th;
	uint32_t hd, hp;
	int64_t t0;

	(void) state;
	dctx = w_attach(&fx.br, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(dctx);
	assert_int_equal(
		kvb_mem_alloc(dctx, 64 * KiB, KVB_MEM_REMOTE_WRITE, 7, &dreg),
		0);
	assert_int_equal(kvb_transfer_open(dctx, "wake", &hd), 0);
	assert_int_equal(kvb_transfer_seal(dctx, hd, 1, 55), 0);
	w.ctx = dctx;
	assert_int_equal(pthread_create(&th, NULL, d_waiter, &w), 0);
	usleep(200 * 1000);

	assert_int_equal(kvb_mem_lookup(fx.ctx, KVB_ROLE_D, 0, 0, 7, &rr), 0);
	assert_int_equal(kvb_transfer_open(fx.ctx, "wake", &hp), 0);
	d = (struct kvb_desc){.transfer = hp,
			      .region = fx.src.id,
			      .peer_region = rr.id,
			      .len = 8 * KiB,
			      .flags = KVB_DESC_UNSIGNALED};
	t0 = now_ns();
	assert_int_equal(kvb_submit_write(fx.ctx, &d, 1), 1);
	assert_int_equal(kvb_transfer_seal(fx.ctx, hp, 1, 56), 0);
	assert_int_equal(w_collect(fx.ctx, c, 1, 2000), 1);
	assert_int_equal(c[0].tag, 56);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	fprintf(stderr, "D woken %.2f ms after P's submit\n",
		(double) (w.t - t0) / 1e6);
	assert_int_equal(w.n, 1);
	assert_int_equal(w.c[0].kind, KVB_COMP_TRANSFER);
	assert_int_equal(w.c[0].tag, 55);
	assert_int_equal(w.c[0].status, 0);
	no_late_wakeups();
	assert_int_equal(pattern_check(dreg.addr, 8 * KiB, 6, 0), 0);
	kvb_detach(dctx);
}

static void test_no_lost_wakeup(void **state)
{
	double ms, worst = 0, total = 0;
	unsigned seed = 1;

	(void) state;
	for (int i = 0; i < ROUNDS; i++) {
		/* pauses around the broker's 20 us spin: it is going to
		 * sleep, asleep, or still spinning when we submit */
		usleep((unsigned) (rand_r(&seed) % 60));
		if (round_trip(10000 + (uint64_t) i, &ms))
			fail_msg("round %d failed", i);
		total += ms;
		if (ms > worst)
			worst = ms;
	}
	fprintf(stderr, "%d round trips: mean %.1f us, worst %.2f ms\n", ROUNDS,
		total * 1000 / ROUNDS, worst);
	no_late_wakeups();
}

/* This worker's kvb_wait counters in the broker's stats (one worker). */
static void wait_counters(int64_t *sleeps, int64_t *spin_us)
{
	char js[16384];

	assert_int_equal(broker_stats(&fx.br, js, sizeof(js)), 0);
	*sleeps = stat_get(js, "wait_sleeps");
	*spin_us = stat_get(js, "wait_spin_us");
	assert_true(*sleeps >= 0 && *spin_us >= 0);
}

/*
 * Waits that always sleep (nothing comes) shrink kvb_wait's busy-poll: 256
 * of them spin well under the 256 x 20 us a fixed spin burns (about 16
 * full-length probes plus 1 us each; a fixed 20 us spin fails this). Each
 * is counted as one sleep. The spin is timed by the clock, so a stall in
 * the middle of one can blow the sum: up to three tries of 256, one must
 * pass (a fixed spin fails all three). Then round trips still complete.
 */
static void test_spin_adapts(void **state)
{
	struct kvb_completion c[4];
	int64_t s0, u0, s1, u1;
	int ok = 0;
	double ms;

	(void) state;
	for (int t = 0; t < 3 && !ok; t++) {
		wait_counters(&s0, &u0);
		for (int i = 0; i < 256; i++)
			assert_int_equal(kvb_wait(fx.ctx, c, 4, 1), -ETIMEDOUT);
		wait_counters(&s1, &u1);
		fprintf(stderr,
			"256 waits that slept: %lld sleeps, %lld us "
			"busy-polling\n",
			(long long) (s1 - s0), (long long) (u1 - u0));
		ok = s1 - s0 == 256 && u1 - u0 < 256 * 20 / 2;
	}
	assert_true(ok);
	for (int i = 0; i < 50; i++)
		assert_int_equal(round_trip(50000 + (uint64_t) i, &ms), 0);
	no_late_wakeups();
}

struct spaced {
	int n, gap_ms;
	uint64_t tag0;
	int rc;
};

/* Submit n writes gap_ms apart (the submitting thread; main waits). */
static void *submit_spaced(void *arg)
{
	struct spaced *s = arg;

	s->rc = 0;
	for (int i = 0; i < s->n && !s->rc; i++) {
		struct kvb_desc d = {.region = fx.src.id,
				     .peer_region = fx.dst.id,
				     .offset = (uint64_t) i * KiB,
				     .peer_offset = (uint64_t) i * KiB,
				     .len = KiB,
				     .tag = s->tag0 + (uint64_t) i};

		usleep((unsigned) s->gap_ms * 1000);
		if (kvb_submit_write(fx.ctx, &d, 1) != 1)
			s->rc = -1;
	}
	return NULL;
}

/*
 * kvb_wait_min sleeps until its count is there: one completion already
 * queued and two more 30 ms apart come back together, after one sleep (the
 * broker does not wake the worker for the second: with a wake per
 * completion it sleeps twice). Fewer than min by the timeout: what came, not an
 * error; min above max means max.
 */
static void test_wait_min(void **state)
{
	struct spaced sp = {.n = 1, .gap_ms = 0, .tag0 = 70000};
	struct kvb_completion c[8];
	int64_t s0, u0, s1, u1, t0;
	pthread_t th;
	int n;

	(void) state;
	/* one already there when the wait starts, two more 30 ms apart */
	submit_spaced(&sp);
	assert_int_equal(sp.rc, 0);
	usleep(50 * 1000);
	wait_counters(&s0, &u0);
	sp = (struct spaced){.n = 2, .gap_ms = 30, .tag0 = 70001};
	t0 = now_ns();
	assert_int_equal(pthread_create(&th, NULL, submit_spaced, &sp), 0);
	n = kvb_wait_min(fx.ctx, c, 8, 3, 5000);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(sp.rc, 0);
	fprintf(stderr, "1 + 2 completions 30 ms apart: one wait of %.1f ms\n",
		ms_since(t0));
	assert_int_equal(n, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(c[i].tag, 70000 + i);
		assert_int_equal(c[i].status, 0);
	}
	assert_true(ms_since(t0) >= 55);
	wait_counters(&s1, &u1);
	/* 0 when this thread stalled until all three were there */
	assert_true(s1 - s0 <= 1);

	/* two come, five wanted: the two at the timeout */
	sp = (struct spaced){.n = 2, .gap_ms = 5, .tag0 = 71000};
	assert_int_equal(pthread_create(&th, NULL, submit_spaced, &sp), 0);
	t0 = now_ns();
	n = kvb_wait_min(fx.ctx, c, 8, 5, 300);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(n, 2);
	assert_true(ms_since(t0) >= 299);
	assert_int_equal(kvb_wait_min(fx.ctx, c, 8, 5, 20), -ETIMEDOUT);

	/* min > max: max */
	sp = (struct spaced){.n = 2, .gap_ms = 5, .tag0 = 72000};
	assert_int_equal(pthread_create(&th, NULL, submit_spaced, &sp), 0);
	n = kvb_wait_min(fx.ctx, c, 2, 64, 5000);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(n, 2);
	assert_int_equal(kvb_wait_min(NULL, c, 2, 1, 0), -EINVAL);
	assert_int_equal(kvb_wait_min(fx.ctx, c, 0, 1, 0), -EINVAL);
	no_late_wakeups();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_wake_after_sleep),
		cmocka_unit_test(test_wake_other_worker),
		cmocka_unit_test(test_no_lost_wakeup),
		cmocka_unit_test(test_spin_adapts),
		cmocka_unit_test(test_wait_min),
	};

	fx.size = 64 * KiB;
	fx.seed = 6;
	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * kvbench's sampled post timing (bench/kvbench/post_timer.c): about one
 * call in WL_POST_SAMPLE is timed, not a fixed position in a step; only
 * the timed calls' descriptors are counted; the clock reads' own cost is
 * taken off, so a known amount of CPU comes out as itself.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbench.h"

#define CALLS 16000u

/* Burn about ns of this thread's CPU. */
static void burn(uint64_t ns)
{
	uint64_t end = kvb_bench_thread_cpu_ns() + ns;

	while (kvb_bench_thread_cpu_ns() < end)
		;
}

static void samples_about_one_in_16(void **state)
{
	struct wl_post_timer pt;
	struct wl_pres res;
	unsigned timed = 0, by_pos[WL_POST_SAMPLE] = {0}, positions = 0;

	(void) state;
	memset(&res, 0, sizeof(res));
	wl_post_timer_init(&pt, 3);
	assert_true(pt.ovh_ns > 0);
	for (unsigned i = 0; i < CALLS; i++) {
		wl_post_begin(&pt);
		if (pt.t0) {
			timed++;
			by_pos[i % WL_POST_SAMPLE]++;
		}
		wl_post_end(&pt, &res, 4);
		assert_int_equal(pt.t0, 0);
	}
	/* binomial, mean 1000, sd 31: within 5 sd */
	assert_in_range(timed, 845, 1155);
	/* only the timed calls' descriptors */
	assert_int_equal(res.post_timed, 4ull * timed);
	/* random, not every 16th call: every position mod 16 gets some */
	for (unsigned k = 0; k < WL_POST_SAMPLE; k++)
		positions += by_pos[k] > 0;
	assert_int_equal(positions, WL_POST_SAMPLE);
}

static void same_seed_same_calls(void **state)
{
	struct wl_post_timer a, b;

	(void) state;
	wl_post_timer_init(&a, 7);
	wl_post_timer_init(&b, 7);
	for (unsigned i = 0; i < 1000; i++) {
		wl_post_begin(&a);
		wl_post_begin(&b);
		assert_int_equal(!a.t0, !b.t0);
		a.t0 = b.t0 = 0;
	}
}

/* The clock's cost is taken off: empty calls come out near zero, calls
 * that burn 20 us come out near 20 us. */
static void clock_cost_taken_off(void **state)
{
	struct wl_post_timer pt;
	struct wl_pres res;
	unsigned timed = 0;
	uint64_t best = UINT64_MAX, hi = 0;
	double per;

	(void) state;
	/*
	 * Without the subtraction each empty call counts about ovh_ns, every
	 * time. A busy machine (ctest -j2 on 2 cores) can preempt a few timed
	 * calls and lift one series' mean: the best of 3 series must pass.
	 */
	for (unsigned attempt = 0; attempt < 3; attempt++) {
		memset(&res, 0, sizeof(res));
		wl_post_timer_init(&pt, 11 + 100 * attempt);
		timed = 0;
		for (unsigned i = 0; i < CALLS; i++) {
			wl_post_begin(&pt);
			timed += pt.t0 != 0;
			wl_post_end(&pt, &res, 1);
		}
		per = (double) res.post_cpu_ns / timed;
		print_message("clock reads %llu ns; empty call %.0f ns\n",
			      (unsigned long long) pt.ovh_ns, per);
		if (per < 0.5 * (double) pt.ovh_ns)
			break;
	}
	assert_true(per < 0.5 * (double) pt.ovh_ns);

	/* the same here: one preempted 20 us call lifts a series' mean by
	 * its delay / ~50, so the best of 5 series is checked */
	for (unsigned attempt = 0; attempt < 5; attempt++) {
		memset(&res, 0, sizeof(res));
		wl_post_timer_init(&pt, 12 + 100 * attempt);
		timed = 0;
		for (unsigned i = 0; i < 800; i++) {
			wl_post_begin(&pt);
			if (pt.t0) {
				timed++;
				burn(20000);
			}
			wl_post_end(&pt, &res, 1);
		}
		assert_true(timed > 0);
		per = (double) res.post_cpu_ns / timed;
		print_message("20 us calls: %.0f ns\n", per);
		/* burn() itself reads the clock: its first read and up to two
		 * at the end come on top of the 20 us */
		hi = 20000 + 5 * pt.ovh_ns + 5000;
		if ((uint64_t) per < best)
			best = (uint64_t) per;
		if (best >= 19000 && best <= hi)
			break;
	}
	assert_in_range(best, 19000, hi);
}

/* The figure: n/a (NAN) when no call was timed, never a 0 */
static void figure_none_timed_is_na(void **state)
{
	(void) state;
	assert_true(isnan(wl_post_cpu_us_per_wr(0, 0)));
	assert_true(isnan(wl_post_cpu_us_per_wr(5000, 0)));
	assert_true(wl_post_cpu_us_per_wr(3000, 4) == 0.75);
	/* timed calls cheaper than the clock's jitter: 0, measured */
	assert_true(wl_post_cpu_us_per_wr(-200, 4) == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(samples_about_one_in_16),
		cmocka_unit_test(same_seed_same_calls),
		cmocka_unit_test(clock_cost_taken_off),
		cmocka_unit_test(figure_none_timed_is_na),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

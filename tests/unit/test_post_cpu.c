/* SPDX-License-Identifier: MIT */
/*
 * The transports' sampled post timing (common/post_cpu.h): 1 doorbell in
 * 16 picked at random, the clock's cost as the median of back-to-back
 * read pairs, a timed call net of it and clipped at 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "post_cpu.h"

static void pick_one_in_16(void **state)
{
	struct kvb_post_cpu a = {0}, b = {0};
	unsigned n = 160000, hits = 0, same = 0, run = 0, longest = 0;

	(void) state;
	kvb_post_cpu_calibrate(&a, 1);
	kvb_post_cpu_calibrate(&b, 2);
	assert_int_not_equal(a.rng, 0);
	for (unsigned i = 0; i < n; i++) {
		int x = kvb_post_cpu_pick(&a), y = kvb_post_cpu_pick(&b);

		hits += x;
		same += x == y;
		run = x ? 0 : run + 1;
		longest = run > longest ? run : longest;
	}
	/* 10000 expected; 5 sigma is about 480 */
	assert_in_range(hits, 9500, 10500);
	/* two seeds give two sequences (equal by chance: ~88%) */
	assert_in_range(same, n * 80 / 100, n * 96 / 100);
	/* not periodic at 16: a gap longer than 16 happens */
	assert_true(longest > 16);
}

static void median_of_pairs(void **state)
{
	int64_t odd[] = {9, 1, 7, 3, 5};
	int64_t one[] = {42};
	int64_t spikes[31];

	(void) state;
	assert_int_equal(kvb_median_i64(odd, 5), 5);
	assert_int_equal(kvb_median_i64(one, 1), 42);
	/* a few preemptions (huge reads) do not move it */
	for (unsigned i = 0; i < 31; i++)
		spikes[i] = i % 5 ? 100 + i : 1000000;
	assert_true(kvb_median_i64(spikes, 31) < 200);
}

static void net_clipped(void **state)
{
	(void) state;
	assert_int_equal(kvb_post_cpu_net(1000, 5000, 1500), 2500);
	assert_int_equal(kvb_post_cpu_net(1000, 2000, 1500), 0);
	assert_int_equal(kvb_post_cpu_net(1000, 1000, 0), 0);
}

static void calibrated_cost(void **state)
{
	struct kvb_post_cpu p = {0};
	uint64_t c0, c1;

	(void) state;
	kvb_post_cpu_calibrate(&p, 7);
	/* two reads of the thread clock: > 0 ns of its resolution or so,
	 * far under a millisecond */
	assert_in_range(p.ovh_ns, 0, 1000000);
	/* a burn of CPU timed net of it is above 0 */
	c0 = kvb_thread_cpu_ns();
	for (volatile unsigned i = 0; i < 20000000; i++)
		;
	c1 = kvb_thread_cpu_ns();
	assert_true(kvb_post_cpu_net(c0, c1, p.ovh_ns) > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pick_one_in_16),
		cmocka_unit_test(median_of_pairs),
		cmocka_unit_test(net_clipped),
		cmocka_unit_test(calibrated_cost),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

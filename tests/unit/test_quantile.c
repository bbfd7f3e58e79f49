/* SPDX-License-Identifier: MIT */
/*
 * kvbench's percentiles (bench/kvbench/quantile.c): nearest rank, the
 * ceil(q * n)-th smallest sample, never one rank high.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvbench.h"

/* 1, 2, ..., n */
static double *ramp(double *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (double) (i + 1);
	return v;
}

static void nearest_rank(void **state)
{
	static double v[1000];

	(void) state;
	/* p99 of 100 samples: the 99th, not the largest */
	assert_true(kvb_bench_quantile(ramp(v, 100), 100, 0.99) == 99);
	assert_true(kvb_bench_quantile(v, 100, 0.50) == 50);
	/* p50 of 4: the 2nd, not the 3rd */
	assert_true(kvb_bench_quantile(ramp(v, 4), 4, 0.50) == 2);
	/* p99.9 of 1000: the 999th; of 100: the largest */
	assert_true(kvb_bench_quantile(ramp(v, 1000), 1000, 0.999) == 999);
	assert_true(kvb_bench_quantile(ramp(v, 100), 100, 0.999) == 100);
	/* between ranks: the next one up (p50 of 5: the 3rd) */
	assert_true(kvb_bench_quantile(ramp(v, 5), 5, 0.50) == 3);
	assert_true(kvb_bench_quantile(ramp(v, 3), 3, 0.99) == 3);
}

static void ends_and_none(void **state)
{
	double v[3] = {7, 8, 9};

	(void) state;
	assert_true(kvb_bench_quantile(v, 3, 0) == 7);
	assert_true(kvb_bench_quantile(v, 3, 1) == 9);
	assert_true(kvb_bench_quantile(v, 1, 0.5) == 7);
	assert_true(kvb_bench_quantile(v, 1, 0.999) == 7);
	/* no samples: not measured */
	assert_true(isnan(kvb_bench_quantile(v, 0, 0.5)));
}

static void sorts(void **state)
{
	double v[5] = {3, -1, 2.5, 10, 0};

	(void) state;
	kvb_bench_sort(v, 5);
	assert_true(v[0] == -1 && v[1] == 0 && v[2] == 2.5 && v[3] == 3 &&
		    v[4] == 10);
	assert_true(kvb_bench_quantile(v, 5, 0.5) == 2.5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(nearest_rank),
		cmocka_unit_test(ends_and_none),
		cmocka_unit_test(sorts),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/* kvbench's percentiles: nearest rank over sorted samples. */
#include "kvbench.h"

#include <math.h>
#include <stdlib.h>

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

void kvb_bench_sort(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_dbl);
}

double kvb_bench_quantile(const double *sorted, size_t n, double q)
{
	double r;
	size_t k;

	if (!n)
		return NAN;
	/* rank k = ceil(q * n), 1-based; q * n a hair above a whole number
	 * (0.99 * 100 in binary) is that number */
	r = q * (double) n;
	k = r > 0 ? (size_t) r : 0;
	if ((double) k < r - 1e-9 * (r > 1 ? r : 1))
		k++;
	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return sorted[k - 1];
}

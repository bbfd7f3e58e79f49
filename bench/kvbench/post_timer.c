/* SPDX-License-Identifier: MIT */
/*
 * kvbench: timing the posting calls on a sample of them (struct
 * wl_post_timer in kvbench.h says why).
 */
#include "kvbench.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

uint64_t kvb_bench_thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

	return (x > y) - (x < y);
}

void wl_post_timer_init(struct wl_post_timer *pt, uint64_t seed)
{
	uint64_t v[31];

	for (unsigned i = 0; i < 31; i++) {
		uint64_t a = kvb_bench_thread_cpu_ns();

		v[i] = kvb_bench_thread_cpu_ns() - a;
	}
	qsort(v, 31, sizeof(v[0]), cmp_u64);
	pt->ovh_ns = v[15];
	pt->rng = seed * 0x9e3779b97f4a7c15ull | 1; /* never 0 */
	pt->t0 = 0;
}

void wl_post_begin(struct wl_post_timer *pt)
{
	uint64_t x = pt->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	pt->rng = x;
	pt->t0 = x % WL_POST_SAMPLE ? 0 : kvb_bench_thread_cpu_ns();
}

void wl_post_end(struct wl_post_timer *pt, struct wl_pres *res, unsigned n)
{
	uint64_t dt;

	if (!pt->t0)
		return;
	dt = kvb_bench_thread_cpu_ns() - pt->t0;
	/* net of the clock's cost, not clipped call by call (a call cheaper
	 * than the clock's jitter would count high): the sum is clipped */
	res->post_cpu_ns += (int64_t) (dt - pt->ovh_ns);
	res->post_timed += n;
	pt->t0 = 0;
}

double wl_post_cpu_us_per_wr(int64_t post_cpu_ns, uint64_t post_timed)
{
	if (!post_timed)
		return NAN; /* no call was timed: not measured */
	return post_cpu_ns > 0
		       ? (double) post_cpu_ns / 1e3 / (double) post_timed
		       : 0;
}

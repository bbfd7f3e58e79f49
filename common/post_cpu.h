/* SPDX-License-Identifier: MIT */
/*
 * Sampled CPU timing of doorbells: the posting thread's CPU time inside
 * the post call on a random 1 in KVB_POST_CPU_SAMPLE doorbells, net of
 * the cost of the two clock reads (CLOCK_THREAD_CPUTIME_ID is a system
 * call on most kernels: too dear to read on every doorbell).
 */
#ifndef KVB_POST_CPU_H
#define KVB_POST_CPU_H

#include <stdint.h>
#include <time.h>

#define KVB_POST_CPU_SAMPLE 16 /* a power of two */
#define KVB_POST_CPU_CAL    31 /* read pairs of the calibration */

struct kvb_post_cpu {
	uint64_t rng;	/* xorshift64 state, never 0 */
	int64_t ovh_ns; /* median cost of two back-to-back reads */
};

static inline uint64_t kvb_thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* The median of v[0..n) (n odd; v is sorted in place). */
static inline int64_t kvb_median_i64(int64_t *v, unsigned n)
{
	for (unsigned i = 1; i < n; i++) {
		int64_t x = v[i];
		unsigned j = i;

		for (; j && v[j - 1] > x; j--)
			v[j] = v[j - 1];
		v[j] = x;
	}
	return n ? v[n / 2] : 0;
}

/* 1 when this doorbell is to be timed: 1 in KVB_POST_CPU_SAMPLE. */
static inline int kvb_post_cpu_pick(struct kvb_post_cpu *p)
{
	uint64_t x = p->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	p->rng = x;
	return ((x >> 32) & (KVB_POST_CPU_SAMPLE - 1)) == 0;
}

/* A timed call's CPU time net of the clock's cost, clipped at 0. */
static inline uint64_t kvb_post_cpu_net(uint64_t c0, uint64_t c1,
					int64_t ovh_ns)
{
	int64_t d = (int64_t) (c1 - c0) - ovh_ns;

	return d > 0 ? (uint64_t) d : 0;
}

/* Seeds the sampler and measures the clock's cost (median of
 * KVB_POST_CPU_CAL back-to-back read pairs). */
static inline void kvb_post_cpu_calibrate(struct kvb_post_cpu *p, uint64_t seed)
{
	int64_t v[KVB_POST_CPU_CAL];

	for (unsigned i = 0; i < KVB_POST_CPU_CAL; i++) {
		uint64_t a = kvb_thread_cpu_ns();

		v[i] = (int64_t) (kvb_thread_cpu_ns() - a);
	}
	p->ovh_ns = kvb_median_i64(v, KVB_POST_CPU_CAL);
	p->rng = seed * 0x9e3779b97f4a7c15ull | 1;
}

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Completions owed to a worker whose completion ring was full reach it at
 * once when it reaps, also when the broker went to sleep meanwhile.
 *
 * Each try: a worker with a 16-entry completion ring submits 48 writes and
 * does not reap until the broker has completed them and gone to sleep (16
 * in the ring, 32 in the broker's overflow list); then it collects the 48
 * with kvb_wait. Before, the overflow list moved only in the broker's busy
 * rounds, so a sleeping broker delivered the other 32 on its ~1 s timer: a
 * wait returned after ~1000 ms. Now the worker's reap wakes a broker that
 * owes it completions (the segment's cq_backlog word), and the broker does
 * not go to sleep with owed completions that fit the ring.
 *
 * A wait is late when the 48 took 500 ms or more from the first reap (the
 * old timer gives ~1000 ms; a loaded 2-core machine's stalls are far below
 * that). None may be late. The latency from the first reap (all 48 are
 * completed then) to the last wait's return is printed (p50, p99, max).
 * KVB_WAIT_OVF_TRIES sets the number of tries (default 1000).
 */
#include <errno.h>
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

#define KiB   (1ull << 10)
#define CQ    16
#define NDESC 48
#define LATE  500.0 /* ms */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return (x > y) - (x < y);
}

static void test_overflow_reaches_sleeper(void **state)
{
	struct kvb_attach_opts ao = {.socket_path = fx.br.sock,
				     .role = KVB_ROLE_P,
				     .tp_size = 1,
				     .cq_entries = CQ};
	const char *env = getenv("KVB_WAIT_OVF_TRIES");
	int tries = env ? atoi(env) : 1000, late = 0;
	struct kvb_region src, dst;
	struct kvb_ctx *ctx;
	double *lat, worst = 0;

	(void) state;
	assert_true(tries > 0);
	lat = calloc((size_t) tries, sizeof(*lat));
	assert_non_null(lat);
	assert_int_equal(kvb_attach(&ao, &ctx), 0);
	assert_int_equal(kvb_mem_alloc(ctx, NDESC * KiB, 0, 0, &src), 0);
	assert_int_equal(kvb_mem_alloc(ctx, NDESC * KiB, 0, 1, &dst), 0);
	for (int t = 0; t < tries; t++) {
		struct kvb_desc d[NDESC];
		struct kvb_completion c[NDESC];
		unsigned got = 0;
		int64_t t0;

		for (unsigned i = 0; i < NDESC; i++)
			d[i] = (struct kvb_desc){.region = src.id,
						 .peer_region = dst.id,
						 .offset = i * KiB,
						 .peer_offset = i * KiB,
						 .len = KiB,
						 .tag = (uint64_t) t * NDESC +
							i};
		assert_int_equal(kvb_submit_write(ctx, d, NDESC), NDESC);
		/* done, and asleep: --busy-poll-us 20 */
		usleep(5000);
		t0 = now_ns();
		while (got < NDESC) {
			int n = kvb_wait(ctx, c, NDESC, 5000);

			if (n < 0)
				fail_msg("try %d: kvb_wait: %s after %u of %u",
					 t, kvb_strerror(n), got, NDESC);
			for (int i = 0; i < n; i++) {
				assert_int_equal(c[i].status, 0);
				assert_int_equal(c[i].tag,
						 (uint64_t) t * NDESC + got +
							 (unsigned) i);
			}
			got += (unsigned) n;
		}
		lat[t] = ms_since(t0);
		if (lat[t] > worst)
			worst = lat[t];
		if (lat[t] >= LATE) {
			late++;
			fprintf(stderr, "try %d: late, %.1f ms\n", t, lat[t]);
			if (late >= 3) { /* enough to know */
				tries = t + 1;
				break;
			}
		}
	}
	qsort(lat, (size_t) tries, sizeof(*lat), cmp_double);
	fprintf(stderr,
		"%d tries of %d completions through a %d-entry ring: %d late "
		"(>= %.0f ms); from the first reap to the last return p50 "
		"%.3f ms, p99 %.3f ms, max %.3f ms\n",
		tries, NDESC, CQ, late, LATE, lat[tries / 2],
		lat[(tries * 99) / 100 - (tries >= 100)], worst);
	assert_int_equal(late, 0);
	free(lat);
	kvb_mem_free(ctx, &src);
	kvb_mem_free(ctx, &dst);
	kvb_detach(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_overflow_reaches_sleeper),
	};

	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker goes away under its workers. SIGKILL: a worker blocked in
 * kvb_wait(-1) gets -EPIPE within ~1.5 s, a submitting worker gets -EPIPE
 * once its ring is full (no call blocks), control calls get -EPIPE.
 * SIGTERM: every worker gets a KVB_COMP_SHUTDOWN completion, then -EPIPE;
 * the broker exits 0 and removes its socket.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define SQ  64u
#define KiB (1ull << 10)
/*
 * The time bounds below (+ SLACK, harness.h) catch a call that blocks; they
 * are not latency targets: the design's figures are 1 s to notice a dead
 * broker and no wait in a submit.
 */

struct waiter {
	struct kvb_ctx *ctx;
	pthread_t thread;
	int rc;
	struct kvb_completion c[8];
	unsigned min; /* > 1: kvb_wait_min */
	int64_t t_return;
};

static void *wait_forever(void *arg)
{
	struct waiter *w = arg;

	/* waiting for 8: the shutdown ends the wait all the same */
	w->rc = w->min > 1 ? kvb_wait_min(w->ctx, w->c, 8, w->min, -1)
			   : kvb_wait(w->ctx, w->c, 8, -1);
	w->t_return = now_ns();
	return NULL;
}

/* The waiter thread is in kvb_wait's sleep by now (it spins 20 us at
 * most). */
static void start_waiter(struct waiter *w, struct kvb_ctx *ctx, unsigned min)
{
	memset(w, 0, sizeof(*w));
	w->ctx = ctx;
	w->min = min;
	assert_int_equal(pthread_create(&w->thread, NULL, wait_forever, w), 0);
	usleep(100 * 1000);
}

static void test_sigkill(void **state)
{
	struct kvb_ctx *a, *b, *c;
	struct kvb_completion comp[64];
	struct kvb_region r1, r2;
	struct kvb_desc d[16];
	struct broker br;
	struct waiter w;
	int64_t t_kill, t_epipe = 0;
	double worst_ms = 0;
	uint32_t h;
	int rc, calls = 0;

	(void) state;
	assert_int_equal(broker_start(&br, NULL), 0);
	a = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	b = w_attach(&br, KVB_ROLE_P, 0, 2, SQ);
	c = w_attach(&br, KVB_ROLE_P, 1, 2, 0);
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(c);
	assert_int_equal(kvb_mem_alloc(b, 64 * KiB, 0, 1, &r1), 0);
	assert_int_equal(kvb_mem_alloc(b, 64 * KiB, 0, 2, &r2), 0);
	for (unsigned i = 0; i < 16; i++)
		d[i] = (struct kvb_desc){.region = r1.id,
					 .peer_region = r2.id,
					 .offset = i * 4 * KiB,
					 .peer_offset = i * 4 * KiB,
					 .len = 4 * KiB,
					 .tag = i};
	/* B is busy, A sleeps in kvb_wait(-1) */
	for (int k = 0; k < 50; k++) {
		assert_int_equal(kvb_submit_write(b, d, 16), 16);
		assert_int_equal(w_collect(b, comp, 16, 5000), 16);
	}
	start_waiter(&w, a, 1);

	t_kill = now_ns();
	broker_kill(&br);

	/* B keeps submitting and never reaps: the ring fills, then -EPIPE;
	 * no call blocks */
	for (;;) {
		int64_t t0 = now_ns();
		double ms;

		rc = kvb_submit_write(b, d, 16);
		ms = ms_since(t0);
		if (ms > worst_ms)
			worst_ms = ms;
		calls++;
		if (rc == -EPIPE) {
			t_epipe = now_ns();
			break;
		}
		if (rc < 0 && rc != -EAGAIN)
			fail_msg("submit after broker death: %d", rc);
		if (ms_since(t_kill) > 1500 + SLACK)
			fail_msg("submit never returned -EPIPE (%d calls)",
				 calls);
	}
	fprintf(stderr,
		"submit: -EPIPE after %d calls, %.1f ms after the kill, "
		"slowest call %.2f ms\n",
		calls, (double) (t_epipe - t_kill) / 1e6, worst_ms);
	assert_true(worst_ms < SLACK);
	assert_true((double) (t_epipe - t_kill) / 1e6 < 1500 + SLACK);
	/* and keeps saying so */
	assert_int_equal(kvb_submit_write(b, d, 1), -EPIPE);
	assert_int_equal(kvb_submit_read(b, d, 1), -EPIPE);

	/* A's kvb_wait(-1) came back with -EPIPE, promptly */
	assert_int_equal(pthread_join(w.thread, NULL), 0);
	fprintf(stderr, "kvb_wait(-1): %d after %.1f ms\n", w.rc,
		(double) (w.t_return - t_kill) / 1e6);
	assert_int_equal(w.rc, -EPIPE);
	assert_true((double) (w.t_return - t_kill) / 1e6 < 1500 + SLACK);

	/* control calls, on a context that has not noticed yet too */
	assert_int_equal(kvb_transfer_open(c, "after-death", &h), -EPIPE);
	assert_int_equal(kvb_transfer_open(b, "after-death", &h), -EPIPE);
	assert_int_equal(kvb_transfer_open(a, "after-death", &h), -EPIPE);
	assert_int_equal(kvb_mem_alloc(c, 4096, 0, 9, &r1), -EPIPE);
	assert_int_equal(kvb_transfer_seal(b, 1, 1, 1), -EPIPE);
	assert_int_equal(kvb_transfer_abort(c, 1, 1), -EPIPE);
	{
		int64_t t0 = now_ns();

		assert_int_equal(kvb_wait(a, comp, 8, -1), -EPIPE);
		assert_int_equal(kvb_wait(c, comp, 8, 5000), -EPIPE);
		assert_int_equal(kvb_poll(b, comp, 8), -EPIPE);
		assert_true(ms_since(t0) < 1500 + SLACK);
	}
	/* detach never hangs */
	{
		int64_t t0 = now_ns();

		assert_int_equal(kvb_detach(a), 0);
		assert_int_equal(kvb_detach(b), 0);
		assert_int_equal(kvb_detach(c), 0);
		assert_true(ms_since(t0) < 1000 + SLACK);
	}
	broker_cleanup(&br);
}

static void test_sigterm(void **state)
{
	struct kvb_completion comp[8];
	struct kvb_ctx *a, *b;
	struct broker br;
	struct waiter w;
	int64_t t0;
	uint32_t h;
	int n, rc, i, shutdown = -1;

	(void) state;
	assert_int_equal(broker_start(&br, NULL), 0);
	a = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	b = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	assert_non_null(a);
	assert_non_null(b);
	/* B has a transfer open and sealed, waiting for writes */
	assert_int_equal(kvb_transfer_open(b, "pending", &h), 0);
	assert_int_equal(kvb_transfer_seal(b, h, 5, 77), 0);
	start_waiter(&w, a, 8);

	t0 = now_ns();
	rc = broker_stop(&br);
	assert_int_equal(rc, 0);
	assert_true(ms_since(t0) < 2000 + SLACK);
	assert_int_equal(access(br.sock, F_OK), -1);
	assert_int_equal(errno, ENOENT);
	assert_true(broker_log_has(&br, "shutting down"));

	/* A was woken with the SHUTDOWN completion */
	assert_int_equal(pthread_join(w.thread, NULL), 0);
	assert_true(w.rc >= 1);
	assert_int_equal(w.c[0].kind, KVB_COMP_SHUTDOWN);
	assert_int_equal(w.c[0].status, -ESHUTDOWN);
	t0 = now_ns();
	assert_int_equal(kvb_wait(a, comp, 8, 5000), -EPIPE);
	assert_true(ms_since(t0) < 1500 + SLACK);

	/* B: SHUTDOWN first, maybe its pending transfer cancelled, then
	 * -EPIPE */
	n = w_collect(b, comp, 2, 1000);
	assert_true(n >= 1);
	for (i = 0; i < n; i++)
		if (comp[i].kind == KVB_COMP_SHUTDOWN && shutdown < 0)
			shutdown = i;
	assert_int_equal(shutdown, 0);
	if (n == 2) {
		assert_int_equal(comp[1].kind, KVB_COMP_TRANSFER);
		assert_int_equal(comp[1].tag, 77);
		assert_int_equal(comp[1].status, -ECANCELED);
	}
	for (i = 0; i < 1000 && (rc = kvb_poll(b, comp, 8)) >= 0; i++)
		;
	assert_int_equal(rc, -EPIPE);
	assert_int_equal(kvb_transfer_open(b, "later", &h), -EPIPE);
	assert_int_equal(kvb_detach(a), 0);
	assert_int_equal(kvb_detach(b), 0);
	broker_cleanup(&br);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigkill),
		cmocka_unit_test(test_sigterm),
	};

	/* SIGPIPE left at its default: the library must never raise it */
	return cmocka_run_group_tests(tests, NULL, NULL);
}

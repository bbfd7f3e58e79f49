/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the fair shares of the node-wide tables (broker/quota.c) on
 * a broker built by hand: the transfer table (kvb_xfer_admit, entries
 * charged with kvb_xfer_open) and the in-flight table (kvb_inflight_room,
 * entries counted in inf_used / inf_nfree).
 *
 * - a worker alone takes half of each table at most: the other half is
 *   the share of the next worker, which takes it at once; the first is
 *   then refused (counted) until it is back under its new share;
 * - at --max-workers nobody can attach: a worker alone has it all;
 * - workers within their shares fill the table: one more is refused
 *   within its share as xfer_table_full, not as past its share;
 * - a busy worker beside an idle one gets its share, no more.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"

#define NW    4u
#define XALL  (KVB_MAX_XFERS - 1)    /* 16383 */
#define INALL (KVB_INFLIGHT_MAX - 1) /* 65535 */

static struct kvb_broker b;
static struct kvb_worker ws[NW];
static uint32_t live[NW];
static struct kvb_ring_shm ring_shm; /* every submission ring: empty */
static unsigned serial;

static int setup(void **state)
{
	(void) state;
	memset(&b, 0, sizeof(b));
	memset(ws, 0, sizeof(ws));
	b.workers = ws;
	b.live = live;
	b.opt.max_workers = 256;
	b.inf_nfree = INALL;
	for (uint32_t i = 0; i < NW; i++) {
		ws[i].id = (1u << 12) | i; /* gen 1, slot i */
		ws[i].seg.sq.shm = &ring_shm;
		ws[i].seg.sq.entries = 1;
	}
	return kvb_xfers_init(&b.xfers);
}

static int teardown(void **state)
{
	(void) state;
	kvb_xfers_fini(&b.xfers);
	return 0;
}

static void attach(uint32_t i)
{
	b.live[b.nlive++] = i;
}

/* Transfers w opens, one at a time, until refused (at most max). */
static uint32_t open_until(uint32_t i, uint32_t max, int *err)
{
	uint32_t n = 0;

	*err = 0;
	while (n < max) {
		char id[32];
		int len = snprintf(id, sizeof(id), "t%u", serial++);
		int e = 0;

		*err = kvb_xfer_admit(&b, &ws[i], "transfer", id,
				      (uint32_t) len);
		if (*err)
			break;
		assert_non_null(kvb_xfer_open(&b.xfers, ws[i].id, id,
					      (size_t) len, INT64_MAX, &e));
		n++;
	}
	return n;
}

/* In-flight entries w takes, bursts of 64, until held back. */
static uint32_t drain_until(uint32_t i)
{
	uint32_t n = 0, k;

	while ((k = kvb_inflight_room(&b, &ws[i], 64)) > 0) {
		ws[i].inf_used += k;
		b.inf_nfree -= k;
		n += k;
	}
	return n;
}

static void test_alone_then_second(void **state)
{
	uint32_t n1, n2;
	int err;

	(void) state;
	attach(0);
	n1 = open_until(0, XALL, &err);
	assert_int_equal(n1, XALL - XALL / 2); /* 8192 */
	assert_int_equal(err, -ENOSPC);
	assert_int_equal(b.st.xfer_quota_refused, 1);
	attach(1);
	/* the second worker's share is there, all of it, at once */
	n2 = open_until(1, XALL, &err);
	assert_int_equal(n2, XALL / 2); /* 8191 */
	assert_int_equal(b.xfers.nactive, XALL);
	/* the first is refused above its new share */
	assert_int_equal(open_until(0, 1, &err), 0);
	assert_int_equal(err, -ENOSPC);
	assert_int_equal(b.st.xfer_table_full, 0);
	/* a third: the table is full of shares taken before it came */
	attach(2);
	assert_int_equal(open_until(2, 1, &err), 0);
	assert_int_equal(err, -ENOSPC);
	assert_int_equal(b.st.xfer_table_full, 1);
	fprintf(stderr,
		"transfers: alone %u, the second worker %u at once; a third "
		"refused (table full) until entries end\n",
		n1, n2);
}

static void test_inflight_alone_then_second(void **state)
{
	uint32_t n1, n2;

	(void) state;
	attach(0);
	n1 = drain_until(0);
	assert_int_equal(n1, INALL - INALL / 2); /* 32768 */
	attach(1);
	assert_int_equal(kvb_inflight_room(&b, &ws[1], 64), 64);
	n2 = drain_until(1);
	assert_int_equal(n2, INALL / 2); /* 32767 */
	assert_int_equal(kvb_inflight_room(&b, &ws[0], 64), 0);
	fprintf(stderr, "in flight: alone %u, the second worker %u at once\n",
		n1, n2);
}

static void test_no_seat_at_max(void **state)
{
	int err;

	(void) state;
	b.opt.max_workers = 1;
	attach(0);
	assert_int_equal(open_until(0, XALL + 1, &err), XALL);
	assert_int_equal(drain_until(0), INALL);
}

static void test_busy_beside_idle(void **state)
{
	int err;

	(void) state;
	attach(0);
	attach(1);
	/* its share; lending would eat the idle one's share or the seat */
	assert_int_equal(open_until(0, XALL, &err), XALL / 2);
	assert_int_equal(open_until(1, XALL, &err), XALL / 2);
	assert_int_equal(b.st.xfer_table_full, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_alone_then_second, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_inflight_alone_then_second,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_seat_at_max, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_busy_beside_idle, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * A vLLM worker restarts while the brokers keep running: a new worker with
 * the same role and ranks attaches with new regions (a new vLLM process,
 * the same pod's broker). The peer broker's handshake descriptor still
 * names the old worker's regions; its next transfer must use the new ones
 * (a new handshake), not fail every layer against regions that are gone.
 * Two brokers on loopback, tcp, A (P) and B (D); every byte checked.
 *
 * - new_d: D's worker replaced between two transfers.
 * - new_p: P's worker replaced between two transfers.
 * - both: both replaced, twice.
 * - p_after_handshake: B's broker got A's descriptor while A had no P
 *   worker (a D open failed then, -EHOSTUNREACH); once A's P worker
 *   attaches, B's next open (a second later: one refresh a second per
 *   peer) asks A again and succeeds.
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

#include "kv_pair.h"

static void pair_start(void)
{
	static const char *const extra[] = {NULL};

	assert_int_equal(broker_pair_start(&pp, extra), 0);
}

/* D's regions zeroed, so that check() sees only this transfer's bytes */
static void memset_regions(void)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		memset(dr[l].addr, 0, KV_BYTES);
}

static void one(struct kvb_ctx *p, struct kvb_ctx *d, const char *id,
		uint32_t k)
{
	memset_regions();
	d_open(d, id, k);
	p_write(p, id, k);
	assert_int_equal(ended(p, 200 + k, 10000), 0);
	assert_int_equal(ended(d, 100 + k, 10000), 0);
	assert_int_equal(check(k), 0);
}

static void test_new_d(void **state)
{
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	one(p, d, "tx-nd-0", 0);
	kvb_detach(d);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	one(p, d, "tx-nd-1", 1);
	/* B handed A its new descriptor before announcing */
	assert_true(broker_stat(&pp.b, "descriptor_refreshes") >= 1);
	pair_stop(p, d);
}

static void test_new_p(void **state)
{
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	one(p, d, "tx-np-0", 0);
	kvb_detach(p);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	one(p, d, "tx-np-1", 1);
	pair_stop(p, d);
}

static void test_both(void **state)
{
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	one(p, d, "tx-b-0", 0);
	for (uint32_t r = 1; r <= 2; r++) {
		char id[32];

		kvb_detach(p);
		kvb_detach(d);
		d = worker(&pp.b, KVB_ROLE_D, dr);
		p = worker(&pp.a, KVB_ROLE_P, pr);
		snprintf(id, sizeof(id), "tx-b-%u", r);
		one(p, d, id, r);
	}
	pair_stop(p, d);
}

static void test_p_after_handshake(void **state)
{
	struct kvb_ctx *p, *d;
	uint32_t h;

	(void) state;
	pair_start();
	d = worker(&pp.b, KVB_ROLE_D, dr);
	h = d_open(d, "tx-pah-0", 0);
	(void) h;
	assert_int_equal(ended(d, 100, 10000), -EHOSTUNREACH);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	/* the broker asks a peer again at most once a second */
	usleep(1100 * 1000);
	one(p, d, "tx-pah-1", 1);
	assert_true(broker_stat(&pp.b, "descriptor_refreshes") >= 1);
	pair_stop(p, d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_new_d, pair_kill),
		cmocka_unit_test_teardown(test_new_p, pair_kill),
		cmocka_unit_test_teardown(test_both, pair_kill),
		cmocka_unit_test_teardown(test_p_after_handshake, pair_kill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * READ mode on tcp: D's broker reads P's KV blocks; P's broker serves a
 * read only of blocks that a READ transfer of that P worker holds now.
 * Outside such a hold a block may already hold another request's KV (P
 * freed it after D's release or its lease): serving it would hand D wrong
 * bytes as if they were the request's. Two brokers on loopback (A: P, B:
 * D), tcp; every byte checked.
 *
 * - held: P holds transfer 0's blocks; D reads them: every byte arrives,
 *   and P's transfer ends on D's release.
 * - unheld: D reads blocks P holds in no transfer (before P's hold, and
 *   after it ended): the read fails -EACCES, D's blocks stay untouched,
 *   A counts unheld_reads_refused; a read of held blocks afterwards works.
 * - partly: D's read names a held block and an unheld one: it fails, and
 *   P's hold of the held one is not disturbed (a read of it alone works).
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

/* Both brokers, a P worker on A and a D worker on B. */
static void pair_up(struct kvb_ctx **p, struct kvb_ctx **d)
{
	pair_start();
	*p = worker(&pp.a, KVB_ROLE_P, pr);
	*d = worker(&pp.b, KVB_ROLE_D, dr);
}

/* P holds `n` of its blocks pb in a READ transfer (ends on D's release,
 * tag 300 + k). */
static uint32_t p_hold(struct kvb_ctx *p, const char *id, const uint32_t *pb,
		       uint32_t n, uint32_t k)
{
	uint32_t h;
	int32_t st;
	struct kvb_remote_open o = {.transfer_id = id,
				    .host = "127.0.0.1",
				    .port = pp.hs_b,
				    .mode = KVB_XFER_READ,
				    .blocks = pb,
				    .nblocks = n};

	assert_int_equal(kvb_transfer_open_remote_batch(p, &o, 1, &h, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvb_transfer_seal(p, h, 0, 300 + k), 0);
	return h;
}

/* D reads P's blocks pb into its db (every layer), tag 400 + k; returns
 * the transfer's status. */
static int32_t d_read(struct kvb_ctx *d, const char *id, const uint32_t *pb,
		      const uint32_t *db, uint32_t n, uint32_t k)
{
	uint32_t h;
	int32_t st;
	struct kvb_remote_open o = {.transfer_id = id,
				    .host = "127.0.0.1",
				    .port = pp.hs_a,
				    .mode = KVB_XFER_READ,
				    .blocks = db,
				    .nblocks = n,
				    .remote_blocks = pb,
				    .nremote = n};

	assert_int_equal(kvb_transfer_open_remote_batch(d, &o, 1, &h, &st), 0);
	assert_int_equal(st, 0);
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t tag = l;

		assert_int_equal(kvb_submit_layers(d, &h, &tag, 1, (uint16_t) l,
						   KVB_DESC_UNSIGNALED),
				 1);
	}
	assert_int_equal(kvb_transfer_seal(d, h, LAYERS, 400 + k), 0);
	return ended(d, 400 + k, 10000);
}

/* Are D's blocks db all zero (nothing landed)? */
static int untouched(const uint32_t *db, uint32_t n)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const uint8_t *q =
					(const uint8_t *) dr[l].addr +
					((uint64_t) kv * NB + db[i]) * BLK;

				for (uint64_t j = 0; j < BLK; j++)
					if (q[j])
						return 0;
			}
	return 1;
}

static void test_held(void **state)
{
	struct kvb_ctx *p, *d;
	uint32_t pb[NPX], db[NPX];

	(void) state;
	pair_up(&p, &d);
	blocks(0, pb, db);
	p_hold(p, "rg-held", pb, NPX, 0);
	assert_int_equal(d_read(d, "rg-held", pb, db, NPX, 0), 0);
	assert_int_equal(check(0), 0);
	/* D's release ended P's hold */
	assert_int_equal(ended(p, 300, 10000), 0);
	assert_int_equal(broker_stat(&pp.a, "unheld_reads_refused"), 0);
	pair_stop(p, d);
}

static void test_unheld(void **state)
{
	struct kvb_ctx *p, *d;
	uint32_t pb[NPX], db[NPX];

	(void) state;
	pair_up(&p, &d);
	blocks(1, pb, db);
	/* no hold yet */
	assert_int_equal(d_read(d, "rg-early", pb, db, NPX, 1), -EACCES);
	assert_true(untouched(db, NPX));
	assert_true(broker_stat(&pp.a, "unheld_reads_refused") >= 1);
	/* held, read, released: the hold is over */
	p_hold(p, "rg-1", pb, NPX, 1);
	assert_int_equal(d_read(d, "rg-1", pb, db, NPX, 2), 0);
	assert_int_equal(check(1), 0);
	assert_int_equal(ended(p, 301, 10000), 0);
	for (uint32_t l = 0; l < LAYERS; l++)
		memset(dr[l].addr, 0, KV_BYTES);
	assert_int_equal(d_read(d, "rg-late", pb, db, NPX, 3), -EACCES);
	assert_true(untouched(db, NPX));
	pair_stop(p, d);
}

static void test_partly(void **state)
{
	struct kvb_ctx *p, *d;
	uint32_t pb[NPX], db[NPX], h;

	(void) state;
	pair_up(&p, &d);
	blocks(2, pb, db);
	/* P holds the first block only */
	h = p_hold(p, "rg-part", pb, 1, 2);
	(void) h;
	assert_int_equal(d_read(d, "rg-both", pb, db, 2, 4), -EACCES);
	assert_true(broker_stat(&pp.a, "unheld_reads_refused") >= 1);
	/* the refused read's release named another id: the hold stays */
	for (uint32_t l = 0; l < LAYERS; l++)
		memset(dr[l].addr, 0, KV_BYTES);
	assert_int_equal(d_read(d, "rg-part", pb, db, 1, 5), 0);
	assert_int_equal(ended(p, 302, 10000), 0);
	pair_stop(p, d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_held, pair_kill),
		cmocka_unit_test_teardown(test_unheld, pair_kill),
		cmocka_unit_test_teardown(test_partly, pair_kill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

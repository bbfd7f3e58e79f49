/* SPDX-License-Identifier: MIT */
/*
 * kvb_transfer_open_batch: ids opened in one round trip intern as
 * kvb_transfer_open's do (same handles, duplicates share one), each id
 * fails on its own (-ESTALE for an ended one, the others still opened),
 * bad arguments are refused before the broker is asked, more than one
 * batch's worth of ids is refused, and a batch-opened transfer carries
 * writes to completion.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define SIZE   (64u << 10)
#define ID_MAX 255 /* the longest transfer id (kvbroker.h) */

/* One control round trip per batch: the broker counts workers' requests. */
static int64_t ctl_requests(void)
{
	return broker_stat(&fx.br, "control_requests");
}

static void test_interning(void **state)
{
	const char *ids[] = {"ob-a", "ob-b", "ob-c", "ob-a"};
	uint32_t h[4], one;
	int st[4] = {1, 1, 1, 1};

	(void) state;
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 4, h, st), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(st[i], 0);
		assert_int_not_equal(h[i], 0);
	}
	assert_int_not_equal(h[0], h[1]);
	assert_int_not_equal(h[1], h[2]);
	assert_int_equal(h[0], h[3]); /* the same id twice: one transfer */
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kvb_transfer_open(fx.ctx, ids[i], &one), 0);
		assert_int_equal(one, h[i]);
	}
	/* status may be NULL */
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 2, h, NULL), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvb_transfer_abort(fx.ctx, h[i], 100 + i), 0);
	{
		struct kvb_completion c[3];

		assert_int_equal(w_collect(fx.ctx, c, 3, 5000), 3);
		for (int i = 0; i < 3; i++)
			assert_int_equal(c[i].status, -ECANCELED);
	}
}

static void test_per_id_status(void **state)
{
	const char *ids[] = {"ob-new-1", "ob-a", "ob-new-2"};
	uint32_t h[3] = {7, 7, 7};
	int st[3];

	(void) state;
	/* ob-a was aborted in test_interning: it ended, its id is stale */
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 3, h, st),
			 -ESTALE);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -ESTALE);
	assert_int_equal(st[2], 0);
	assert_int_not_equal(h[0], 0);
	assert_int_equal(h[1], 0);
	assert_int_not_equal(h[2], 0);
	assert_int_equal(kvb_transfer_abort(fx.ctx, h[0], 1), 0);
	assert_int_equal(kvb_transfer_abort(fx.ctx, h[2], 2), 0);
	{
		struct kvb_completion c[2];

		assert_int_equal(w_collect(fx.ctx, c, 2, 5000), 2);
	}
}

static void test_bad_args(void **state)
{
	static char longid[ID_MAX + 2];
	const char *ids[KVB_TRANSFER_OPEN_BATCH_MAX + 1];
	char buf[KVB_TRANSFER_OPEN_BATCH_MAX + 1][16];
	uint32_t h[KVB_TRANSFER_OPEN_BATCH_MAX + 1];
	const char *bad[2] = {"ob-ok", NULL};
	int64_t before = ctl_requests();

	(void) state;
	assert_true(before > 0);
	for (unsigned i = 0; i <= KVB_TRANSFER_OPEN_BATCH_MAX; i++) {
		snprintf(buf[i], sizeof(buf[i]), "ob-many-%u", i);
		ids[i] = buf[i];
	}
	assert_int_equal(kvb_transfer_open_batch(NULL, ids, 1, h, NULL),
			 -EINVAL);
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, NULL, 1, h, NULL),
			 -EINVAL);
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 1, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 0, h, NULL),
			 -EINVAL);
	assert_int_equal(
		kvb_transfer_open_batch(
			fx.ctx, ids, KVB_TRANSFER_OPEN_BATCH_MAX + 1, h, NULL),
		-EINVAL);
	/* a NULL, an empty and a 256-byte id */
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, bad, 2, h, NULL),
			 -EINVAL);
	bad[1] = "";
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, bad, 2, h, NULL),
			 -EINVAL);
	memset(longid, 'x', ID_MAX + 1);
	bad[1] = longid;
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, bad, 2, h, NULL),
			 -EINVAL);
	/* none of those reached the broker */
	assert_int_equal(ctl_requests(), before);
	/* a full batch of 255-byte ids: the largest message, one round trip */
	{
		static char big[KVB_TRANSFER_OPEN_BATCH_MAX][ID_MAX + 1];
		const char *bids[KVB_TRANSFER_OPEN_BATCH_MAX];

		for (unsigned i = 0; i < KVB_TRANSFER_OPEN_BATCH_MAX; i++) {
			char pre[8];

			memset(big[i], 'a' + (char) (i % 26), ID_MAX);
			snprintf(pre, sizeof(pre), "%06u-", i);
			memcpy(big[i], pre, 7); /* unique, still 255 bytes */
			bids[i] = big[i];
			assert_int_equal(strlen(big[i]), ID_MAX);
		}
		assert_int_equal(kvb_transfer_open_batch(
					 fx.ctx, bids,
					 KVB_TRANSFER_OPEN_BATCH_MAX, h, NULL),
				 0);
		assert_int_equal(ctl_requests(), before + 1);
		for (unsigned i = 0; i < KVB_TRANSFER_OPEN_BATCH_MAX; i++)
			assert_int_equal(kvb_transfer_abort(fx.ctx, h[i], i),
					 0);
		{
			struct kvb_completion c[KVB_TRANSFER_OPEN_BATCH_MAX];

			assert_int_equal(w_collect(fx.ctx, c,
						   KVB_TRANSFER_OPEN_BATCH_MAX,
						   5000),
					 KVB_TRANSFER_OPEN_BATCH_MAX);
		}
	}
}

/* Writes on batch-opened transfers complete them, bytes intact. */
static void test_writes(void **state)
{
	const char *ids[] = {"ob-w-0", "ob-w-1"};
	struct kvb_completion c[2];
	uint32_t h[2];
	int n;

	(void) state;
	memset(fx.dst.addr, 0, SIZE);
	assert_int_equal(kvb_transfer_open_batch(fx.ctx, ids, 2, h, NULL), 0);
	for (int i = 0; i < 2; i++) {
		struct kvb_desc d = {.transfer = h[i],
				     .flags = KVB_DESC_UNSIGNALED,
				     .region = fx.src.id,
				     .peer_region = fx.dst.id,
				     .offset = (uint64_t) i * (SIZE / 2),
				     .peer_offset = (uint64_t) i * (SIZE / 2),
				     .len = SIZE / 2,
				     .tag = 10 + (uint64_t) i};

		assert_int_equal(kvb_submit_write(fx.ctx, &d, 1), 1);
		assert_int_equal(kvb_transfer_seal(fx.ctx, h[i], 1, 20 + i), 0);
	}
	n = w_collect(fx.ctx, c, 2, 5000);
	assert_int_equal(n, 2);
	for (int i = 0; i < 2; i++) {
		int k = w_find(c, n, KVB_COMP_TRANSFER, 20 + (uint64_t) i);

		assert_true(k >= 0);
		assert_int_equal(c[k].status, 0);
	}
	assert_int_equal(pattern_check(fx.dst.addr, SIZE, fx.seed, 0), 0);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_interning),
		cmocka_unit_test(test_per_id_status),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_writes),
	};

	fx.size = SIZE;
	fx.seed = 42;
	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

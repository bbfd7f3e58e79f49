/* SPDX-License-Identifier: MIT */
/*
 * kvb_transfer_expect: a P worker declares the transfer ids it will open,
 * so that D's announcement (remote_blocks) of an id it will never open
 * fails D's transfer after --unknown-timeout, not the whole
 * --unopened-timeout. Two brokers on loopback, A (a P worker) and B (a D
 * worker), tcp between them, A with --unknown-timeout 1.
 *
 * - unknown: P expects one id; D opens it and one P does not expect. The
 *   unknown one fails at D (-ENOENT) after about 1 s; the expected one is
 *   still held, and succeeds (every byte checked) when P opens it later.
 * - late_expect: D announces first, P expects the id after that: held
 *   past --unknown-timeout, then it succeeds.
 * - undeclared: a P worker that never declares: an announcement it has
 *   not opened is held past --unknown-timeout (the old behaviour), and
 *   succeeds when P opens it.
 * - withdraw: P withdraws an id announced already (D fails at once,
 *   -ECANCELED) and one announced after the withdrawal (the same).
 * - ended_before_announce: P's worker aborted a transfer before D
 *   announced it: D's announcement is answered at once (-ESTALE), nothing
 *   lands, and the pair serves the next transfer.
 * - bad_calls: refused arguments, an ended id (-ESTALE), the per-worker
 *   bound (4096 held: the next -ENOSPC, counted).
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
	static const char *const extra[] = {"--unknown-timeout", "1", NULL};

	assert_int_equal(broker_pair_start(&pp, extra), 0);
}

static int expect1(struct kvb_ctx *c, const char *id, unsigned flags)
{
	int32_t st = 1;

	assert_int_equal(kvb_transfer_expect(c, &id, 1, flags, &st), 0);
	return st;
}

static void test_unknown(void **state)
{
	struct kvb_ctx *p, *d;
	int64_t t0;
	double ms;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	assert_int_equal(expect1(p, "tx-exp-yes", 0), 0);
	d_open(d, "tx-exp-yes", 0);
	t0 = now_ns();
	d_open(d, "tx-exp-no", 1);
	assert_int_equal(ended(d, 101, 5000), -ENOENT);
	ms = ms_since(t0);
	printf("unknown id: D's transfer failed after %.0f ms "
	       "(--unknown-timeout 1)\n",
	       ms);
	assert_true(ms >= 900 && ms < 3000);
	/* the expected one is still held: P opens it now */
	assert_int_equal(broker_stat(&pp.a, "unopened_held"), 1);
	p_write(p, "tx-exp-yes", 0);
	assert_int_equal(ended(p, 200, 10000), 0);
	assert_int_equal(ended(d, 100, 10000), 0);
	assert_int_equal(check(0), 0);
	assert_int_equal(broker_stat(&pp.a, "unknown_expired"), 1);
	assert_int_equal(broker_stat(&pp.a, "unopened_expired"), 0);
	assert_int_equal(broker_stat(&pp.a, "expects"), 1);
	assert_true(broker_log_has(&pp.a, "does not expect it"));
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

static void test_late_expect(void **state)
{
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	assert_int_equal(expect1(p, "tx-other", 0), 0); /* declares */
	d_open(d, "tx-late", 2);
	assert_int_equal(
		broker_wait_stat(&pp.a, "remote_blocks_received", 1, 5000), 0);
	assert_int_equal(expect1(p, "tx-late", 0), 0);
	/* past --unknown-timeout: still held */
	assert_int_equal(ended(d, 102, 2000), 1);
	p_write(p, "tx-late", 2);
	assert_int_equal(ended(p, 202, 10000), 0);
	assert_int_equal(ended(d, 102, 10000), 0);
	assert_int_equal(check(2), 0);
	assert_int_equal(broker_stat(&pp.a, "unknown_expired"), 0);
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

static void test_undeclared(void **state)
{
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	d_open(d, "tx-undeclared", 3);
	assert_int_equal(ended(d, 103, 2000), 1);
	assert_int_equal(broker_stat(&pp.a, "unopened_held"), 1);
	p_write(p, "tx-undeclared", 3);
	assert_int_equal(ended(p, 203, 10000), 0);
	assert_int_equal(ended(d, 103, 10000), 0);
	assert_int_equal(check(3), 0);
	assert_int_equal(broker_stat(&pp.a, "unknown_expired"), 0);
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

static void test_withdraw(void **state)
{
	const char *ids[2] = {"tx-wd-1", "tx-wd-2"};
	int32_t st[2];
	struct kvb_ctx *p, *d;
	int64_t t0;
	double ms;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	assert_int_equal(kvb_transfer_expect(p, ids, 2, 0, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	d_open(d, ids[0], 4);
	assert_int_equal(
		broker_wait_stat(&pp.a, "remote_blocks_received", 1, 5000), 0);
	t0 = now_ns();
	assert_int_equal(
		kvb_transfer_expect(p, ids, 2, KVB_EXPECT_WITHDRAW, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	assert_int_equal(ended(d, 104, 3000), -ECANCELED);
	ms = ms_since(t0);
	printf("withdrawn after its announcement: D failed after %.1f ms\n",
	       ms);
	assert_true(ms < 900);
	/* announced after its withdrawal: answered at once too */
	t0 = now_ns();
	d_open(d, ids[1], 5);
	assert_int_equal(ended(d, 105, 3000), -ECANCELED);
	ms = ms_since(t0);
	printf("withdrawn before its announcement: D failed after %.1f ms\n",
	       ms);
	assert_true(ms < 900);
	assert_int_equal(broker_stat(&pp.a, "withdrawn_told"), 2);
	assert_int_equal(broker_stat(&pp.a, "withdraws"), 2);
	assert_int_equal(broker_stat(&pp.a, "unopened_held"), 0);
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

/* P's worker ended a transfer (aborted, or failed toward a D broker that
 * restarted since) before D announced it: D hears kvb_write_failed at
 * once instead of waiting for its clocks. */
static void test_ended_before_announce(void **state)
{
	uint32_t pb[NPX], db[NPX], h;
	int32_t st;
	struct kvb_remote_open o = {.transfer_id = "tx-ended",
				    .host = "127.0.0.1",
				    .mode = KVB_XFER_WRITE,
				    .blocks = pb,
				    .nblocks = NPX};
	struct kvb_ctx *p, *d;
	int64_t t0;
	double ms;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	o.port = pp.hs_b;
	blocks(6, pb, db);
	assert_int_equal(kvb_transfer_open_remote_batch(p, &o, 1, &h, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvb_transfer_abort(p, h, 206), 0);
	assert_int_equal(ended(p, 206, 5000), -ECANCELED);
	t0 = now_ns();
	d_open(d, "tx-ended", 6);
	assert_int_equal(ended(d, 106, 5000), -ESTALE);
	ms = ms_since(t0);
	printf("announced after P ended it: D failed after %.1f ms\n", ms);
	assert_true(ms < 900);
	/* nothing of it landed */
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint64_t i = 0; i < KV_BYTES; i++)
			if (((const uint8_t *) dr[l].addr)[i])
				fail_msg("layer %u byte %llu written", l,
					 (unsigned long long) i);
	assert_true(broker_log_has(&pp.a, "remote_blocks after P worker"));
	/* the pair still serves a new transfer */
	d_open(d, "tx-after-ended", 7);
	p_write(p, "tx-after-ended", 7);
	assert_int_equal(ended(p, 207, 10000), 0);
	assert_int_equal(ended(d, 107, 10000), 0);
	assert_int_equal(check(7), 0);
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

static void test_bad_calls(void **state)
{
	static char many[4097][16];
	static const char *pm[4097];
	static int32_t st[4097];
	char longid[300];
	const char *ids[2];
	struct kvb_ctx *p, *d;

	(void) state;
	pair_start();
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	ids[0] = "tx-a";
	assert_int_equal(kvb_transfer_expect(NULL, ids, 1, 0, st), -EINVAL);
	assert_int_equal(kvb_transfer_expect(p, ids, 0, 0, st), -EINVAL);
	assert_int_equal(kvb_transfer_expect(p, NULL, 1, 0, st), -EINVAL);
	assert_int_equal(kvb_transfer_expect(p, ids, 1, 0x2, st), -EINVAL);
	assert_int_equal(kvb_transfer_expect(p, ids, KVB_EXPECT_MAX + 1, 0, st),
			 -EINVAL);
	memset(longid, 'x', sizeof(longid) - 1);
	longid[sizeof(longid) - 1] = 0;
	ids[0] = "";
	ids[1] = longid;
	assert_int_equal(kvb_transfer_expect(p, ids, 2, 0, st), 0);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(st[1], -EINVAL);
	/* an id that ended: -ESTALE */
	d_open(d, "tx-ended", 6);
	p_write(p, "tx-ended", 6);
	assert_int_equal(ended(p, 206, 10000), 0);
	assert_int_equal(ended(d, 106, 10000), 0);
	assert_int_equal(expect1(p, "tx-ended", 0), -ESTALE);
	/* 4096 held at most (in 5 calls of up to KVB_EXPECT_MAX) */
	for (unsigned i = 0; i < 4097; i++) {
		snprintf(many[i], sizeof(many[i]), "tx-many-%u", i);
		pm[i] = many[i];
	}
	for (unsigned i = 0; i < 4097; i += KVB_EXPECT_MAX) {
		unsigned n =
			4097 - i < KVB_EXPECT_MAX ? 4097 - i : KVB_EXPECT_MAX;

		assert_int_equal(kvb_transfer_expect(p, pm + i, n, 0, st + i),
				 0);
	}
	for (unsigned i = 0; i < 4096; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(st[4096], -ENOSPC);
	assert_int_equal(broker_stat(&pp.a, "expects_refused"), 1);
	/* a held one can still be withdrawn */
	assert_int_equal(expect1(p, many[0], KVB_EXPECT_WITHDRAW), 0);
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_unknown, pair_kill),
		cmocka_unit_test_teardown(test_late_expect, pair_kill),
		cmocka_unit_test_teardown(test_undeclared, pair_kill),
		cmocka_unit_test_teardown(test_withdraw, pair_kill),
		cmocka_unit_test_teardown(test_ended_before_announce,
					  pair_kill),
		cmocka_unit_test_teardown(test_bad_calls, pair_kill),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

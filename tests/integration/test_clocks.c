/* SPDX-License-Identifier: MIT */
/*
 * A transfer's clocks and its quiet failure, same node (docs/deadlines.md),
 * against a broker started with --stall-timeout 1 --transfer-deadline 30:
 *
 * - a D transfer that only waits its turn (opened and sealed, no P writes
 *   yet) outlives the stall timeout and completes when P comes 2.5 s later;
 * - one that started (ops completed) and then makes no progress fails with
 *   -ETIMEDOUT after the stall timeout, not before;
 * - kvb_transfer_set_timeouts: a 500 ms deadline fails an idle transfer in
 *   about 500 ms; its errors (-ESTALE, -EINVAL);
 * - D's transfer times out while P's 1 MiB writes into it stream: once D
 *   has its failure completion its region does not change while P keeps
 *   submitting for 1.5 s; those writes are refused (-ECANCELED, counted as
 *   late_writes_refused, until P's own transfer stalls: refusals are no
 *   progress);
 * - P's abort completes only after every write of it in flight completed;
 *   a seal after it gets -ESTALE (one completion each).
 *
 * Times: a clock must not fire early (exact lower bounds); upper bounds
 * only catch one that never fires (SLACK for a loaded machine).
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

#define MiB	    (1ull << 20)
#define CHUNKS	    64u /* D's region: CHUNKS x 1 MiB */
#define OUTSTANDING 48u

static struct broker br;
static struct kvb_ctx *pd, *dd; /* P and D workers */
static struct kvb_region src, dst;
static struct kvb_remote_region rdst;

static int setup(void **state)
{
	static const char *const args[] = {"--stall-timeout",
					   "1",
					   "--transfer-deadline",
					   "30",
					   "--copy-threads",
					   "1",
					   NULL};
	const struct broker_opts o = {.args = args};

	(void) state;
	if (broker_start(&br, &o))
		return -1;
	dd = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	pd = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	if (!dd || !pd ||
	    kvb_mem_alloc(dd, CHUNKS * MiB, KVB_MEM_REMOTE_WRITE, 9, &dst) ||
	    kvb_mem_alloc(pd, 2 * CHUNKS * MiB, 0, 1, &src) ||
	    kvb_mem_lookup(pd, KVB_ROLE_D, 0, 0, 9, &rdst))
		return -1;
	/* two laps of different bytes: D's chunks change with every lap */
	pattern_fill(src.addr, CHUNKS * MiB, 1, 0);
	pattern_fill((char *) src.addr + CHUNKS * MiB, CHUNKS * MiB, 2, 0);
	return 0;
}

static int teardown(void **state)
{
	(void) state;
	kvb_detach(pd);
	kvb_detach(dd);
	return broker_stop(&br) == 0 ? 0 : -1;
}

/* P's write i: source chunk of lap (i / CHUNKS) % 2 into D's chunk i %
 * CHUNKS, signaled, tag i. */
static struct kvb_desc wr(uint32_t h, uint64_t i, uint64_t len)
{
	uint64_t c = i % CHUNKS, lap = (i / CHUNKS) % 2;

	return (struct kvb_desc){.transfer = h,
				 .region = src.id,
				 .peer_region = rdst.id,
				 .offset = (lap * CHUNKS + c) * MiB,
				 .peer_offset = c * MiB,
				 .len = len,
				 .tag = i};
}

static void test_waits_its_turn(void **state)
{
	struct kvb_completion c[16];
	struct kvb_desc d[4];
	uint32_t hd, hp;
	int n, i;

	(void) state;
	assert_int_equal(kvb_transfer_open(dd, "turn", &hd), 0);
	assert_int_equal(kvb_transfer_seal(dd, hd, 1, 1), 0);
	/* 2.5 stall timeouts of waiting: nothing ends it */
	assert_int_equal(kvb_wait(dd, c, 16, 2500), -ETIMEDOUT);
	assert_int_equal(kvb_transfer_open(pd, "turn", &hp), 0);
	for (i = 0; i < 4; i++)
		d[i] = wr(hp, (uint64_t) i, 4096);
	assert_int_equal(kvb_submit_write(pd, d, 4), 4);
	assert_int_equal(kvb_transfer_seal(pd, hp, 4, 2), 0);
	n = w_collect(pd, c, 5, SLACK);
	assert_int_equal(n, 5);
	for (i = 0; i < n; i++)
		assert_int_equal(c[i].status, 0);
	n = w_collect(dd, c, 1, SLACK);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].kind, KVB_COMP_TRANSFER);
	assert_int_equal(c[0].tag, 1);
	assert_int_equal(c[0].status, 0);
}

static void test_stall(void **state)
{
	struct kvb_completion c[8];
	struct kvb_desc d[2];
	int64_t t0;
	uint32_t h;
	double ms;
	int n, i;

	(void) state;
	assert_int_equal(kvb_transfer_open(pd, "stall", &h), 0);
	d[0] = wr(h, 0, 4096);
	d[1] = wr(h, 1, 4096);
	assert_int_equal(kvb_submit_write(pd, d, 2), 2);
	assert_int_equal(kvb_transfer_seal(pd, h, 5, 10), 0);
	n = w_collect(pd, c, 2, SLACK);
	assert_int_equal(n, 2);
	t0 = now_ns(); /* its last progress was before this */
	n = w_collect(pd, c, 1, 1000 + SLACK);
	ms = ms_since(t0);
	assert_int_equal(n, 1);
	i = w_find(c, n, KVB_COMP_TRANSFER, 10);
	assert_true(i >= 0);
	assert_int_equal(c[i].status, -ETIMEDOUT);
	/* the timer runs every few ms: it fires 1 s after the last progress
	 * (a little before t0) at the earliest */
	assert_true(ms >= 900 && ms <= 1000 + SLACK);
}

static void test_set_timeouts(void **state)
{
	struct kvb_completion c[4];
	int64_t t0;
	uint32_t h;
	double ms;

	(void) state;
	assert_int_equal(kvb_transfer_open(pd, "dl", &h), 0);
	t0 = now_ns();
	assert_int_equal(kvb_transfer_set_timeouts(pd, h, 500, 0, 0), 0);
	assert_int_equal(kvb_transfer_seal(pd, h, 1, 20), 0);
	assert_int_equal(w_collect(pd, c, 1, 500 + SLACK), 1);
	ms = ms_since(t0);
	assert_int_equal(c[0].kind, KVB_COMP_TRANSFER);
	assert_int_equal(c[0].status, -ETIMEDOUT);
	assert_true(ms >= 490 && ms <= 500 + SLACK);
	/* ended: stale; out of range and a defer clock for a local one */
	assert_int_equal(kvb_transfer_set_timeouts(pd, h, 500, 0, 0), -ESTALE);
	assert_int_equal(kvb_transfer_set_timeouts(pd, 0, 500, 0, 0), -EINVAL);
	assert_int_equal(kvb_transfer_open(pd, "dl2", &h), 0);
	assert_int_equal(kvb_transfer_set_timeouts(pd, h, 86400001, 0, 0),
			 -EINVAL);
	assert_int_equal(kvb_transfer_set_timeouts(pd, h, 0, 0, 1000), -EINVAL);
	assert_int_equal(kvb_transfer_abort(pd, h, 21), 0);
	assert_int_equal(w_collect(pd, c, 1, SLACK), 1);
	assert_int_equal(c[0].status, -ECANCELED);
}

/* Reap P's completions (signaled writes); counts refused ones. */
static unsigned p_reap(unsigned *refused, int *p_done)
{
	struct kvb_completion c[64];
	int n = kvb_poll(pd, c, 64);
	unsigned got = 0;

	for (int i = 0; i < n; i++) {
		if (c[i].kind == KVB_COMP_TRANSFER) {
			/* the abort's (its transfer may have ended before:
			 * -ESTALE then) */
			*p_done |= c[i].tag == 31;
			continue;
		}
		got++;
		if (c[i].status)
			(*refused)++;
	}
	return got;
}

static void test_quiet_failure(void **state)
{
	struct kvb_completion c[8];
	unsigned outstanding = 0, refused = 0;
	int64_t t_fail = 0, t_end = 0;
	char *snap = malloc(CHUNKS * MiB);
	uint64_t i = 0, after = 0;
	int p_done = 0, d_status = 1;
	int64_t late0 = broker_stat(&br, "late_writes_refused"), late;
	uint32_t hd, hp;

	(void) state;
	assert_non_null(snap);
	assert_int_equal(kvb_transfer_open(dd, "quiet", &hd), 0);
	assert_int_equal(kvb_transfer_set_timeouts(dd, hd, 800, 0, 0), 0);
	assert_int_equal(kvb_transfer_seal(dd, hd, 1, 30), 0);
	assert_int_equal(kvb_transfer_open(pd, "quiet", &hp), 0);
	/* P streams 1 MiB writes; D's deadline passes meanwhile; P goes on
	 * for 1.5 s after D's failure completion */
	while (!t_end || now_ns() < t_end) {
		assert_true(ms_since(t_fail ? t_fail : now_ns()) < 30000);
		while (outstanding < OUTSTANDING) {
			struct kvb_desc d = wr(hp, i, MiB);
			int rc = kvb_submit_write(pd, &d, 1);

			if (rc != 1)
				break;
			i++;
			outstanding++;
			if (t_fail)
				after++;
		}
		outstanding -= p_reap(&refused, &p_done);
		if (!t_fail && kvb_poll(dd, c, 8) == 1) {
			assert_int_equal(c[0].kind, KVB_COMP_TRANSFER);
			d_status = c[0].status;
			/* no byte may land from here on */
			memcpy(snap, dst.addr, CHUNKS * MiB);
			t_fail = now_ns();
			t_end = t_fail + 1500 * 1000000ll;
		}
	}
	/* P ends its transfer; it saw the refusals */
	assert_int_equal(kvb_transfer_abort(pd, hp, 31), 0);
	while (!p_done || outstanding) {
		assert_true(ms_since(t_end) < 30000);
		outstanding -= p_reap(&refused, &p_done);
	}
	fprintf(stderr,
		"quiet failure: %llu writes submitted, %llu after D's "
		"failure, %u refused\n",
		(unsigned long long) i, (unsigned long long) after, refused);
	assert_int_equal(d_status, -ETIMEDOUT);
	assert_true(after > 0);
	assert_int_equal(memcmp(snap, dst.addr, CHUNKS * MiB), 0);
	assert_true(refused >= after);
	/* refused as late writes until P's own transfer stalled (refusals
	 * are no progress), then as writes of an ended transfer */
	late = broker_stat(&br, "late_writes_refused") - late0;
	fprintf(stderr, "late_writes_refused: %lld\n", (long long) late);
	assert_true(late > 0 && late <= (int64_t) after);
	free(snap);
}

static void test_abort_drains(void **state)
{
	struct kvb_completion c[128];
	struct kvb_desc d[32];
	unsigned descs = 0;
	uint32_t hp;
	int n, seen_abort = 0, seen_seal = 0;

	(void) state;
	assert_int_equal(kvb_transfer_open(pd, "abort", &hp), 0);
	/* descending: not merged into one chain, 32 copies in flight */
	for (unsigned k = 0; k < 32; k++)
		d[k] = wr(hp, 31 - k, MiB);
	assert_int_equal(kvb_submit_write(pd, d, 32), 32);
	assert_int_equal(kvb_transfer_abort(pd, hp, 40), 0);
	/* a seal after the abort: told at once (-ESTALE) that it ended,
	 * while the abort's completion waits for the writes */
	assert_int_equal(kvb_transfer_seal(pd, hp, 32, 41), 0);
	/* every write's completion comes before the abort's */
	while (!seen_abort || !seen_seal) {
		n = kvb_wait(pd, c, 128, SLACK);
		assert_true(n > 0);
		for (int k = 0; k < n; k++) {
			if (c[k].kind == KVB_COMP_TRANSFER && c[k].tag == 41) {
				assert_int_equal(c[k].status, -ESTALE);
				seen_seal++;
				continue;
			}
			if (c[k].kind == KVB_COMP_TRANSFER) {
				assert_int_equal(c[k].tag, 40);
				assert_int_equal(c[k].status, -ECANCELED);
				seen_abort++;
				continue;
			}
			assert_false(seen_abort);
			descs++;
		}
	}
	assert_int_equal(descs, 32);
	assert_int_equal(seen_abort, 1);
	assert_int_equal(seen_seal, 1);
	assert_int_equal(kvb_wait(pd, c, 128, 200), -ETIMEDOUT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_waits_its_turn),
		cmocka_unit_test(test_stall),
		cmocka_unit_test(test_set_timeouts),
		cmocka_unit_test(test_quiet_failure),
		cmocka_unit_test(test_abort_drains),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

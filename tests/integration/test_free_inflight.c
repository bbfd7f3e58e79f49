/* SPDX-License-Identifier: MIT */
/*
 * kvb_mem_free() while descriptors that name the region are in flight: the
 * header promises that descriptors already submitted still complete.
 *
 *  - P frees its source right after submitting and sealing (the broker was
 *    asleep, so the free and the ring's wakeup reach it together): every
 *    descriptor completes with 0 and D holds the bytes, in every round;
 *  - D frees its destination once the broker took P's writes to it
 *    (descriptors_submitted), while the copies run: they complete, into
 *    memory only the broker still maps, and the transfer ends with 0 (a
 *    free that reaches the broker before another worker's descriptors
 *    would make those -ENOENT: the two processes are not ordered);
 *  - afterwards the broker holds no region that was freed (its references
 *    were dropped as the copies ended);
 *  - a worker that never reaps: its completion ring fills, the broker stops
 *    draining it and its submission ring fills too; then it frees its
 *    source. The broker still takes the ring's descriptors first (their
 *    completions queue behind the others): every one completes with 0 and
 *    its bytes once the worker reaps, each exactly once, and the transfer
 *    ends with 0. (Before, those were refused with -EINVAL: 64 of 175.)
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

#define MiB	 (1024u * 1024u)
#define DST_SIZE (16 * MiB)
#define KEY_DST	 1
#define ROUNDS	 12
/* small (copied by the broker thread) and large (the copy pool) writes */
static const uint32_t lens[] = {4096, 65536, 1 * MiB, 2 * MiB};
#define NDESC 16 /* per round: lens[] over and over, 15 MiB at most */

static struct broker br;

static int setup(void **state)
{
	(void) state;
	return broker_start(&br, NULL);
}

static int teardown(void **state)
{
	int rc;

	(void) state;
	rc = broker_stop(&br);
	broker_cleanup(&br);
	return rc ? -1 : 0;
}

/* Submit NDESC writes of src into dst (offsets packed from 0), seal; the
 * total length into *total. */
static uint32_t submit_round(struct kvb_ctx *p, const char *id,
			     const struct kvb_region *src,
			     const struct kvb_remote_region *dst,
			     uint64_t *total)
{
	struct kvb_desc d[NDESC];
	uint64_t off = 0;
	unsigned sent = 0;
	uint32_t h;

	assert_int_equal(kvb_transfer_open(p, id, &h), 0);
	for (unsigned i = 0; i < NDESC; i++) {
		uint32_t len = lens[i % 4];

		d[i] = (struct kvb_desc){.transfer = h,
					 .region = src->id,
					 .peer_region = dst->id,
					 .offset = off,
					 .peer_offset = off,
					 .len = len,
					 .tag = 100 + i};
		off += len;
	}
	assert_true(off <= DST_SIZE);
	while (sent < NDESC) {
		int k = kvb_submit_write(p, d + sent, NDESC - sent);

		if (k == -EAGAIN)
			continue;
		assert_true(k > 0);
		sent += (unsigned) k;
	}
	while (kvb_transfer_seal(p, h, NDESC, 7) == -EAGAIN)
		;
	*total = off;
	return h;
}

/* Every descriptor and the transfer completed with 0: NDESC + 1 entries. */
static void collect_ok(struct kvb_ctx *p)
{
	struct kvb_completion c[NDESC + 1];
	int n = w_collect(p, c, NDESC + 1, 20000);

	assert_int_equal(n, NDESC + 1);
	for (int i = 0; i < n; i++) {
		if (c[i].status)
			fprintf(stderr, "completion kind %u tag %llu: %s\n",
				c[i].kind, (unsigned long long) c[i].tag,
				kvb_strerror(c[i].status));
		assert_int_equal(c[i].status, 0);
	}
	assert_true(w_find(c, n, KVB_COMP_TRANSFER, 7) >= 0);
}

static void test_source_freed(void **state)
{
	struct kvb_ctx *p = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	struct kvb_ctx *dc = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	struct kvb_remote_region dst;
	struct kvb_region dreg;

	(void) state;
	assert_non_null(p);
	assert_non_null(dc);
	assert_int_equal(kvb_mem_alloc(dc, DST_SIZE, KVB_MEM_REMOTE_WRITE,
				       KEY_DST, &dreg),
			 0);
	assert_int_equal(kvb_mem_lookup(p, KVB_ROLE_D, 0, 0, KEY_DST, &dst), 0);
	for (unsigned r = 0; r < ROUNDS; r++) {
		struct kvb_region src;
		uint64_t total;
		char id[32];

		assert_int_equal(kvb_mem_alloc(p, DST_SIZE, 0, 0, &src), 0);
		pattern_fill(src.addr, DST_SIZE, r + 1, 0);
		memset(dreg.addr, 0, DST_SIZE);
		usleep(20 * 1000); /* the broker goes to sleep */
		snprintf(id, sizeof(id), "free-src-%u", r);
		submit_round(p, id, &src, &dst, &total);
		assert_int_equal(kvb_mem_free(p, &src), 0);
		collect_ok(p);
		assert_int_equal(pattern_check(dreg.addr, total, r + 1, 0), 0);
	}
	assert_int_equal(broker_stat(&br, "descriptors_refused"), 0);
	/* only D's region is left: the freed ones' references are gone */
	assert_int_equal(broker_wait_stat(&br, "regions", 1, 5000), 0);
	assert_int_equal(kvb_mem_free(dc, &dreg), 0);
	kvb_detach(p);
	kvb_detach(dc);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);
}

static void test_destination_freed(void **state)
{
	struct kvb_ctx *p = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	struct kvb_ctx *dc = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	struct kvb_remote_region dst;
	struct kvb_region dreg, src;
	uint64_t total;

	(void) state;
	assert_non_null(p);
	assert_non_null(dc);
	assert_int_equal(kvb_mem_alloc(p, DST_SIZE, 0, 0, &src), 0);
	pattern_fill(src.addr, DST_SIZE, 99, 0);
	for (unsigned r = 0; r < 4; r++) {
		int64_t taken = broker_stat(&br, "descriptors_submitted");
		char id[32];

		assert_int_equal(kvb_mem_alloc(dc, DST_SIZE,
					       KVB_MEM_REMOTE_WRITE,
					       KEY_DST + 1 + r, &dreg),
				 0);
		assert_int_equal(kvb_mem_lookup(p, KVB_ROLE_D, 0, 0,
						KEY_DST + 1 + r, &dst),
				 0);
		usleep(20 * 1000);
		snprintf(id, sizeof(id), "free-dst-%u", r);
		submit_round(p, id, &src, &dst, &total);
		assert_int_equal(broker_wait_stat(&br, "descriptors_submitted",
						  taken + NDESC, 5000),
				 0);
		assert_int_equal(kvb_mem_free(dc, &dreg), 0);
		collect_ok(p);
	}
	assert_int_equal(kvb_mem_free(p, &src), 0);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);
	kvb_detach(p);
	kvb_detach(dc);
}

#define SAT_SQ	    64u
#define SAT_LEN	    4096u
#define SAT_MAX	    4096u /* descriptors at most (the rings fill long before) */
#define SAT_IDLE_MS 300	  /* the ring stayed full this long: not drained */

static void test_free_saturated(void **state)
{
	struct kvb_attach_opts o = {.socket_path = br.sock,
				    .role = KVB_ROLE_P,
				    .tp_size = 1,
				    .sq_entries = SAT_SQ,
				    .cq_entries = SAT_SQ};
	struct kvb_ctx *p = NULL;
	struct kvb_ctx *dc = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	static struct kvb_completion c[SAT_MAX + 1];
	static uint8_t seen[SAT_MAX];
	int64_t refused0 = broker_stat(&br, "descriptors_refused");
	struct kvb_remote_region dst;
	struct kvb_region dreg, src;
	unsigned n = 0, i;
	int64_t full_since = 0;
	uint32_t h;
	int got;

	(void) state;
	assert_int_equal(kvb_attach(&o, &p), 0);
	assert_non_null(dc);
	assert_int_equal(kvb_mem_alloc(dc, SAT_MAX * SAT_LEN,
				       KVB_MEM_REMOTE_WRITE, KEY_DST + 9,
				       &dreg),
			 0);
	memset(dreg.addr, 0, SAT_MAX * SAT_LEN);
	assert_int_equal(kvb_mem_lookup(p, KVB_ROLE_D, 0, 0, KEY_DST + 9, &dst),
			 0);
	assert_int_equal(kvb_mem_alloc(p, SAT_MAX * SAT_LEN, 0, 0, &src), 0);
	pattern_fill(src.addr, SAT_MAX * SAT_LEN, 5, 0);
	assert_int_equal(kvb_transfer_open(p, "free-saturated", &h), 0);
	/* submit without reaping until the ring stays full */
	for (;;) {
		struct kvb_desc d = {.transfer = h,
				     .region = src.id,
				     .peer_region = dst.id,
				     .offset = (uint64_t) n * SAT_LEN,
				     .peer_offset = (uint64_t) n * SAT_LEN,
				     .len = SAT_LEN,
				     .tag = n};
		int k;

		assert_true(n < SAT_MAX);
		k = kvb_submit_write(p, &d, 1);
		if (k == 1) {
			n++;
			full_since = 0;
			continue;
		}
		assert_int_equal(k, -EAGAIN);
		if (!full_since)
			full_since = now_ns();
		else if (ms_since(full_since) > SAT_IDLE_MS)
			break;
		usleep(1000);
	}
	/* completions filled, then the ring, which the broker stopped taking */
	assert_true(n > SAT_SQ);
	assert_int_equal(kvb_mem_free(p, &src), 0);

	/* every descriptor once, with 0 and its bytes */
	got = w_collect(p, c, n, 20000);
	assert_int_equal(got, (int) n);
	for (i = 0; i < n; i++) {
		assert_int_equal(c[i].kind, KVB_COMP_DESC);
		assert_true(c[i].tag < n && !seen[c[i].tag]);
		seen[c[i].tag] = 1;
		assert_int_equal(c[i].status, 0);
		assert_int_equal(pattern_check((uint8_t *) dreg.addr +
						       c[i].tag * SAT_LEN,
					       SAT_LEN, 5, c[i].tag * SAT_LEN),
				 0);
	}
	assert_int_equal(broker_log_has(&br, "still in its ring"), 0);
	assert_int_equal(broker_stat(&br, "descriptors_refused"), refused0);
	while (kvb_transfer_seal(p, h, n, 77) == -EAGAIN)
		;
	assert_int_equal(w_collect(p, c, 1, 20000), 1);
	assert_int_equal(c[0].kind, KVB_COMP_TRANSFER);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(kvb_mem_free(dc, &dreg), 0);
	kvb_detach(p);
	kvb_detach(dc);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_source_freed),
		cmocka_unit_test(test_destination_freed),
		cmocka_unit_test(test_free_saturated),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

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

#define LAYERS 2u
#define NPX    4u  /* blocks per transfer */
#define NB     64u /* blocks per region */
/* 16 tokens x 2 heads x 64 x 2 bytes: 4 KiB of K (or V) per block */
static const struct kvb_kv_geometry geo = {KVB_KV_KV_FIRST, NB, 16, 2, 64, 2};
#define BLK	 (16ull * 2 * 64 * 2)
#define KV_BYTES (2ull * NB * BLK)

static struct broker_pair pp;
static struct kvb_region pr[LAYERS], dr[LAYERS];

static int pair_kill(void **state)
{
	(void) state;
	broker_pair_kill(&pp);
	return 0;
}

static void pair_start(void)
{
	static const char *const extra[] = {NULL};

	assert_int_equal(broker_pair_start(&pp, extra), 0);
}

static struct kvb_ctx *worker(struct broker *b, enum kvb_role role,
			      struct kvb_region *r)
{
	struct kvb_ctx *c = w_attach(b, role, 0, 1, 0);

	assert_non_null(c);
	for (uint32_t l = 0; l < LAYERS; l++) {
		assert_int_equal(kvb_mem_alloc(c, KV_BYTES,
					       KVB_MEM_REMOTE_WRITE |
						       KVB_MEM_REMOTE_READ,
					       l, &r[l]),
				 0);
		assert_int_equal(kvb_mem_set_kv(c, r[l].id, l, &geo), 0);
		if (role == KVB_ROLE_P)
			pattern_fill(r[l].addr, KV_BYTES, 11 + l, 0);
		else
			memset(r[l].addr, 0, KV_BYTES);
	}
	return c;
}

/* transfer k: P's blocks k*NPX.., D's (k+8)*NPX.. */
static void blocks(uint32_t k, uint32_t *pb, uint32_t *db)
{
	for (uint32_t i = 0; i < NPX; i++) {
		pb[i] = k * NPX + i;
		db[i] = (k + 8) * NPX + i;
	}
}

static uint64_t check(uint32_t k)
{
	uint32_t pb[NPX], db[NPX];
	uint64_t bad = 0;

	blocks(k, pb, db);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t i = 0; i < NPX; i++)
			for (uint32_t kv = 0; kv < 2; kv++)
				bad += memcmp((const uint8_t *) dr[l].addr +
						      ((uint64_t) kv * NB +
						       db[i]) *
							      BLK,
					      (const uint8_t *) pr[l].addr +
						      ((uint64_t) kv * NB +
						       pb[i]) *
							      BLK,
					      BLK) != 0;
	return bad;
}

/* D opens transfer k (WRITE, announced) and seals it with tag 100 + k. */
static uint32_t d_open(struct kvb_ctx *d, const char *id, uint32_t k)
{
	uint32_t pb[NPX], db[NPX], h;
	int32_t st;
	struct kvb_remote_open o = {.transfer_id = id,
				    .host = "127.0.0.1",
				    .port = pp.hs_a,
				    .mode = KVB_XFER_WRITE,
				    .blocks = db,
				    .nblocks = NPX};

	blocks(k, pb, db);
	assert_int_equal(kvb_transfer_open_remote_batch(d, &o, 1, &h, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvb_transfer_seal(d, h, 1, 100 + k), 0);
	return h;
}

/* P opens transfer k, writes every layer and seals it. */
static void p_write(struct kvb_ctx *p, const char *id, uint32_t k)
{
	uint32_t pb[NPX], db[NPX], h;
	int32_t st;
	struct kvb_remote_open o = {.transfer_id = id,
				    .host = "127.0.0.1",
				    .port = pp.hs_b,
				    .mode = KVB_XFER_WRITE,
				    .blocks = pb,
				    .nblocks = NPX};

	blocks(k, pb, db);
	assert_int_equal(kvb_transfer_open_remote_batch(p, &o, 1, &h, &st), 0);
	assert_int_equal(st, 0);
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t tag = l;

		assert_int_equal(kvb_submit_layers(p, &h, &tag, 1, (uint16_t) l,
						   KVB_DESC_UNSIGNALED),
				 1);
	}
	assert_int_equal(kvb_transfer_seal(p, h, LAYERS, 200 + k), 0);
}

/* The status of the KVB_COMP_TRANSFER tagged `tag` on c, 1 if none came
 * within timeout_ms (other completions are dropped). */
static int32_t ended(struct kvb_ctx *c, uint64_t tag, int timeout_ms)
{
	int64_t t0 = now_ns();

	while (ms_since(t0) < timeout_ms) {
		struct kvb_completion v[16];
		int n = kvb_wait(c, v, 16, 50);

		if (n == -ETIMEDOUT)
			continue;
		assert_true(n >= 0);
		for (int i = 0; i < n; i++)
			if (v[i].kind == KVB_COMP_TRANSFER && v[i].tag == tag)
				return v[i].status;
	}
	return 1;
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
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
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
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
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
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_new_d, pair_kill),
		cmocka_unit_test_teardown(test_new_p, pair_kill),
		cmocka_unit_test_teardown(test_both, pair_kill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

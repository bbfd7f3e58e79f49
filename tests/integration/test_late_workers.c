/* SPDX-License-Identifier: MIT */
/*
 * P's broker knows the D node from a handshake made before D's workers
 * attached: its descriptor lists none of them (or not all). Two brokers on
 * loopback, A (a P worker, TP 1) and B (two D workers, TP 2: P writes both
 * ranks, each a full copy), tcp between them. P opens NX WRITE transfers
 * with kvb_transfer_open_remote_batch, submits every layer and seals
 * (the layer ops wait for D's remote_blocks); then the missing D workers
 * attach, declare their regions and open the transfers, and D announces.
 * A's descriptor of B is older than D's workers: the layer ops must make A
 * ask B again (a new handshake) and wait for it, not fail.
 *
 * - no_workers: the batched open handshakes with B while B has no worker
 *   at all; both D ranks attach after. The layer ops failed with -EINVAL
 *   ("the peer has no workers of that DP rank with a compatible TP size").
 * - late_rank: A handshakes (kvb_peer_connect) when D rank 0 of 2 had
 *   attached, rank 1 after. The first layer op of a transfer asked again,
 *   the others issued with it failed with -ENOENT ("peer ... has no region
 *   for D dp 0 tp 1").
 *
 * Checked: every P and D transfer completes with 0, no layer op fails, A
 * handshook with B again, and each D rank holds P's bytes in its blocks
 * (and zeros elsewhere).
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

#define NB     64u /* blocks per layer */
#define LAYERS 4u
#define NX     4u /* transfers */
#define NPX    3u /* blocks per transfer */
static const struct kvb_kv_geometry geo = {KVB_KV_KV_FIRST, NB, 4, 1, 16, 2};
#define KV_BYTES (2ull * NB * 4 * 16 * 2) /* a layer's tensor */
#define BLK	 (4ull * 16 * 2)	  /* K (or V) bytes of one block */

/* the brokers of the test running: its teardown kills what is left */
static struct broker_pair pp;

/* Teardown: the brokers a failed test left (none after pair_stop). */
static int pair_kill(void **state)
{
	(void) state;
	broker_pair_kill(&pp);
	return 0;
}

static void pair_start(struct broker_pair *p)
{
	assert_int_equal(broker_pair_start(p, NULL), 0);
}

static void pair_stop(struct broker_pair *p)
{
	assert_int_equal(broker_pair_stop(p), 0);
}

/* A worker (rank tp of tp_size) with one KV region per layer (key =
 * layer); P's filled with a pattern, D's zero. */
static struct kvb_ctx *worker(struct broker *b, enum kvb_role role, uint32_t tp,
			      uint32_t tp_size, struct kvb_region *r)
{
	struct kvb_ctx *c = w_attach(b, role, tp, tp_size, 0);

	assert_non_null(c);
	for (uint32_t l = 0; l < LAYERS; l++) {
		assert_int_equal(kvb_mem_alloc(c, KV_BYTES,
					       KVB_MEM_REMOTE_WRITE |
						       KVB_MEM_REMOTE_READ,
					       l, &r[l]),
				 0);
		assert_int_equal(kvb_mem_set_kv(c, r[l].id, l, &geo), 0);
		if (role == KVB_ROLE_P)
			pattern_fill(r[l].addr, KV_BYTES, 7 + l, 0);
	}
	return c;
}

/* kv_first: K of block k at k * BLK, V at (NB + k) * BLK */
static uint64_t kv_off(uint32_t kv, uint32_t blk)
{
	return ((uint64_t) kv * NB + blk) * BLK;
}

/* Transfer t: P's blocks 5 + NPX * t + i into D's 40 + NPX * t - i. */
static uint32_t pblk(uint32_t t, uint32_t i)
{
	return 5 + NPX * t + i;
}

static uint32_t dblk(uint32_t t, uint32_t i)
{
	return 40 + NPX * t - i;
}

/* Every byte of D's blocks of every transfer equals P's; D's blocks not
 * named are all zero. Returns the blocks that differ. */
static uint64_t check_blocks(const struct kvb_region *pr,
			     const struct kvb_region *dr)
{
	uint64_t bad = 0;

	for (uint32_t l = 0; l < LAYERS; l++) {
		uint8_t named[NB] = {0};
		const uint8_t *d = dr[l].addr;

		for (uint32_t t = 0; t < NX; t++)
			for (uint32_t i = 0; i < NPX; i++) {
				named[dblk(t, i)] = 1;
				for (uint32_t kv = 0; kv < 2; kv++)
					bad += memcmp(d + kv_off(kv,
								 dblk(t, i)),
						      (const uint8_t *) pr[l]
								      .addr +
							      kv_off(kv,
								     pblk(t,
									  i)),
						      BLK) != 0;
			}
		for (uint32_t k = 0; k < NB; k++)
			for (uint32_t kv = 0; kv < 2 && !named[k]; kv++)
				for (uint64_t j = 0; j < BLK; j++)
					bad += d[kv_off(kv, k) + j] != 0;
	}
	return bad;
}

static struct kvb_remote_open entry(const char *id, uint16_t port,
				    const uint32_t *blocks)
{
	return (struct kvb_remote_open){.transfer_id = id,
					.host = "127.0.0.1",
					.port = port,
					.mode = KVB_XFER_WRITE,
					.blocks = blocks,
					.nblocks = NPX};
}

/* NX transfer completions of c, tags tag0.., each with 0; no layer op
 * completion (unsignaled: only a failed one would come). */
static void expect_done(struct kvb_ctx *c, const char *who, uint64_t tag0)
{
	struct kvb_completion v[NX + NX * LAYERS];
	int n = w_collect(c, v, NX, 20000), bad = 0;

	/* and whatever else is there: failed layer ops */
	if (n >= 0 && n < (int) (NX + NX * LAYERS)) {
		int m = kvb_poll(c, v + n, NX + NX * LAYERS - (unsigned) n);

		n += m > 0 ? m : 0;
	}
	for (int i = 0; i < n; i++)
		if (v[i].status) {
			printf("%s: %s (tag %llu) failed: %s\n", who,
			       v[i].kind == KVB_COMP_DESC ? "layer op"
							  : "transfer",
			       (unsigned long long) v[i].tag,
			       strerror(-v[i].status));
			bad++;
		}
	if (bad || n != (int) NX) {
		printf("%s: %d completion(s), %u transfers\n", who, n, NX);
		broker_log_dump(&pp.a);
		broker_log_dump(&pp.b);
	}
	assert_int_equal(bad, 0);
	assert_int_equal(n, NX);
	for (uint64_t t = 0; t < NX; t++)
		assert_true(w_find(v, n, KVB_COMP_TRANSFER, tag0 + t) >= 0);
}

/* B's D ranks 0 and 1 (TP 2); A has handshaken with B when B had rank 0
 * (late_rank) or no worker; the others attach after P's layer ops. */
static void run(int late_rank)
{
	static struct kvb_region pr[LAYERS], dr[2][LAYERS];
	static char ids[NX][32];
	static uint32_t pb[NX][NPX], db[NX][NPX];
	struct kvb_remote_open o[NX];
	uint32_t hp[NX], hd[NX], peer = 0;
	int32_t st[NX];
	struct kvb_ctx *p, *d[2] = {NULL, NULL};
	int64_t hs0;

	pair_start(&pp);
	p = worker(&pp.a, KVB_ROLE_P, 0, 1, pr);
	if (late_rank)
		d[0] = worker(&pp.b, KVB_ROLE_D, 0, 2, dr[0]);
	for (uint32_t t = 0; t < NX; t++) {
		snprintf(ids[t], sizeof(ids[t]), "tx-late-%s-%u",
			 late_rank ? "rank" : "all", t);
		for (uint32_t i = 0; i < NPX; i++) {
			pb[t][i] = pblk(t, i);
			db[t][i] = dblk(t, i);
		}
	}
	/* A handshakes with B now: as a batched open does (no_workers), or
	 * by kvb_peer_connect before it (late_rank) */
	if (late_rank)
		assert_int_equal(
			kvb_peer_connect(p, "127.0.0.1", pp.hs_b, &peer), 0);
	for (uint32_t t = 0; t < NX; t++)
		o[t] = entry(ids[t], pp.hs_b, pb[t]);
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, NX, hp, st), 0);
	for (uint32_t t = 0; t < NX; t++)
		assert_int_equal(st[t], 0);
	/* (the batch's handshake ended: B answered, with no worker) */
	if (!late_rank)
		assert_int_equal(
			kvb_peer_connect(p, "127.0.0.1", pp.hs_b, &peer), 0);
	hs0 = broker_stat(&pp.a, "handshakes_sent");
	assert_true(hs0 >= 1);
	/* every layer, before D announced: they wait for remote_blocks */
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t tags[NX];

		for (uint32_t t = 0; t < NX; t++)
			tags[t] = 100 * l + t;
		assert_int_equal(kvb_submit_layers(p, hp, tags, NX,
						   (uint16_t) l,
						   KVB_DESC_UNSIGNALED),
				 NX);
	}
	for (uint32_t t = 0; t < NX; t++)
		assert_int_equal(kvb_transfer_seal(p, hp[t], LAYERS, 2000 + t),
				 0);
	/* D's workers A does not know of */
	for (uint32_t r = 0; r < 2; r++)
		if (!d[r])
			d[r] = worker(&pp.b, KVB_ROLE_D, r, 2, dr[r]);
	for (uint32_t t = 0; t < NX; t++)
		o[t] = entry(ids[t], pp.hs_a, db[t]);
	for (uint32_t r = 0; r < 2; r++) {
		assert_int_equal(
			kvb_transfer_open_remote_batch(d[r], o, NX, hd, st), 0);
		for (uint32_t t = 0; t < NX; t++) {
			assert_int_equal(st[t], 0);
			assert_int_equal(
				kvb_transfer_seal(d[r], hd[t], 1, 1000 + t), 0);
		}
	}
	expect_done(p, "P", 2000);
	expect_done(d[0], "D rank 0", 1000);
	expect_done(d[1], "D rank 1", 1000);
	/* A asked B again for its descriptor */
	assert_true(broker_stat(&pp.a, "handshakes_sent") > hs0);
	assert_int_equal(check_blocks(pr, dr[0]), 0);
	assert_int_equal(check_blocks(pr, dr[1]), 0);
	kvb_detach(p);
	kvb_detach(d[0]);
	kvb_detach(d[1]);
	pair_stop(&pp);
}

static void test_no_workers(void **state)
{
	(void) state;
	run(0);
}

static void test_late_rank(void **state)
{
	(void) state;
	run(1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_no_workers, pair_kill),
		cmocka_unit_test_teardown(test_late_rank, pair_kill),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

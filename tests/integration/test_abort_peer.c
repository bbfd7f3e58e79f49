/* SPDX-License-Identifier: MIT */
/*
 * One aborted transfer must not fail the other transfers queued to the same
 * peer. Two brokers on loopback, A (a P worker) and B (a D worker), tcp
 * between them, A with one connection per peer (--tcp-conns 1: 1024 ops of
 * credit). D opens NX WRITE transfers to A and announces them; P opens them
 * and submits every layer of each: NX * LAYERS * NPX * 2 ops of 4 KiB, far
 * more than the credit, so most wait in A's destination queue for the
 * peer. Then one transfer is aborted, while the others' ops are still
 * queued behind and between its own:
 *
 * - p_abort: P aborts it (kvb_transfer_abort).
 * - d_abort: D aborts it: B releases it at A (a typed release, which A
 *   takes as an abort).
 *
 * The aborted transfer's queued ops are dropped and complete with
 * -ECANCELED; A took that for a connection error (bridge/xnode/layer.c,
 * conn_error()), marked the peer stale and failed every op still queued to
 * it with -ECONNRESET: the other transfers failed. Checked: the aborted
 * one ends with -ECANCELED on both sides, each of the others with 0 on
 * both sides, and every byte of their blocks landed in D's regions.
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

#define NX     8u  /* transfers */
#define LAYERS 16u /* layers, each a region on both sides */
#define NPX    32u /* blocks per transfer */
#define NB     (NX * NPX)
/* 16 tokens x 2 heads x 64 x 2 bytes: 4 KiB of K (or V) per block */
static const struct kvb_kv_geometry geo = {KVB_KV_KV_FIRST, NB, 16, 2, 64, 2};
#define BLK	 (16ull * 2 * 64 * 2)
#define KV_BYTES (2ull * NB * BLK) /* a layer's tensor */
#define VICTIM	 0u		   /* the aborted one: first of each layer */

/* the brokers of the test running: its teardown kills what is left */
static struct broker_pair pp;

/* Teardown: the brokers a failed test left (none after pair_stop). */
static int pair_kill(void **state)
{
	(void) state;
	broker_pair_kill(&pp);
	return 0;
}

/* one data connection to the peer: every transfer shares its queue */
static void pair_start(struct broker_pair *p)
{
	static const char *const extra[] = {"--tcp-conns", "1", NULL};

	assert_int_equal(broker_pair_start(p, extra), 0);
}

static void pair_stop(struct broker_pair *p)
{
	assert_int_equal(broker_pair_stop(p), 0);
}

/* A worker with one KV region per layer (key = layer); P's filled with a
 * pattern, D's zero. */
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
			pattern_fill(r[l].addr, KV_BYTES, 7 + l, 0);
	}
	return c;
}

/* kv_first: K of block k at k * BLK, V at (NB + k) * BLK */
static uint64_t kv_off(uint32_t kv, uint32_t blk)
{
	return ((uint64_t) kv * NB + blk) * BLK;
}

/* Transfer t: P's blocks t * NPX + i, in order, into D's in reverse (no
 * two of a layer op's entries merge: two ops per block). */
static uint32_t pblk(uint32_t t, uint32_t i)
{
	return t * NPX + i;
}

static uint32_t dblk(uint32_t t, uint32_t i)
{
	return t * NPX + NPX - 1 - i;
}

/* The bytes of transfer t's blocks in D's regions that differ from P's. */
static uint64_t check_xfer(const struct kvb_region *pr,
			   const struct kvb_region *dr, uint32_t t)
{
	uint64_t bad = 0;

	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t i = 0; i < NPX; i++)
			for (uint32_t kv = 0; kv < 2; kv++)
				bad += memcmp((const uint8_t *) dr[l].addr +
						      kv_off(kv, dblk(t, i)),
					      (const uint8_t *) pr[l].addr +
						      kv_off(kv, pblk(t, i)),
					      BLK) != 0;
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

/*
 * Completions of c until `want` KVB_COMP_TRANSFER ones came (or
 * timeout_ms): the statuses of transfers h[0..NX) into xs (1 where none
 * came); of the layer ops that failed, *victim_descs counts those of
 * h[VICTIM] with -ECANCELED and *other_descs all the others (every layer
 * op of the others succeeds: unsignaled, silent). Returns the transfer
 * completions seen.
 */
static unsigned collect(struct kvb_ctx *c, unsigned want, const uint32_t *h,
			int32_t *xs, unsigned *victim_descs,
			unsigned *other_descs, int timeout_ms)
{
	int64_t t0 = now_ns();
	unsigned got = 0;

	for (uint32_t i = 0; i < NX; i++)
		xs[i] = 1;
	*victim_descs = *other_descs = 0;
	while (got < want && ms_since(t0) < timeout_ms) {
		struct kvb_completion v[64];
		int n = kvb_wait(c, v, 64, 100);

		if (n == -ETIMEDOUT)
			continue;
		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			uint32_t t = 0;

			while (t < NX && h[t] != v[i].transfer)
				t++;
			assert_true(t < NX);
			if (v[i].kind == KVB_COMP_DESC) {
				if (t == VICTIM && v[i].status == -ECANCELED)
					++*victim_descs;
				else if (++*other_descs <= 4)
					printf("transfer %u: layer op %llu "
					       "failed: %s\n",
					       t, (unsigned long long) v[i].tag,
					       strerror(-v[i].status));
				continue;
			}
			assert_int_equal(v[i].kind, KVB_COMP_TRANSFER);
			assert_int_equal(xs[t], 1); /* one each */
			xs[t] = v[i].status;
			got++;
		}
	}
	return got;
}

/* D opens and announces NX transfers to A, P opens them and submits every
 * layer of each; then P (p_aborts) or D aborts transfer VICTIM. */
static void run(int p_aborts)
{
	static struct kvb_region pr[LAYERS], dr[LAYERS];
	static char ids[NX][32];
	static uint32_t pb[NX][NPX], db[NX][NPX];
	struct kvb_remote_open o[NX];
	uint32_t hp[NX], hd[NX];
	int32_t st[NX], xs[NX];
	unsigned vdescs, odescs;
	struct kvb_ctx *p, *d;
	int64_t t0;

	pair_start(&pp);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	for (uint32_t t = 0; t < NX; t++) {
		snprintf(ids[t], sizeof(ids[t]), "tx-abort-%c-%u",
			 p_aborts ? 'p' : 'd', t);
		for (uint32_t i = 0; i < NPX; i++) {
			pb[t][i] = pblk(t, i);
			db[t][i] = dblk(t, i);
		}
	}
	/* D first; P's transfers exist (early remote_blocks) when P opens
	 * them, so that its layer ops go out as they come, none deferred */
	for (uint32_t t = 0; t < NX; t++)
		o[t] = entry(ids[t], pp.hs_a, db[t]);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, NX, hd, st), 0);
	for (uint32_t t = 0; t < NX; t++) {
		assert_int_equal(st[t], 0);
		assert_int_equal(kvb_transfer_seal(d, hd[t], 1, 1000 + t), 0);
	}
	assert_int_equal(
		broker_wait_stat(&pp.a, "remote_blocks_received", NX, 10000),
		0);
	for (uint32_t t = 0; t < NX; t++)
		o[t] = entry(ids[t], pp.hs_b, pb[t]);
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, NX, hp, st), 0);
	for (uint32_t t = 0; t < NX; t++)
		assert_int_equal(st[t], 0);
	/* NX * LAYERS layer ops of 2 * NPX ops each, the victim's first in
	 * each layer: its queued ops lie between the others' */
	t0 = now_ns();
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t tags[NX];

		for (uint32_t t = 0; t < NX; t++)
			tags[t] = 100 * l + t;
		assert_int_equal(kvb_submit_layers(p, hp, tags, NX,
						   (uint16_t) l,
						   KVB_DESC_UNSIGNALED),
				 NX);
	}
	/* P's victim stays unsealed: its completion comes with the abort's
	 * tag, or (D's abort) as D's release may overtake a seal still in
	 * P's ring */
	for (uint32_t t = 0; t < NX; t++)
		if (t != VICTIM)
			assert_int_equal(
				kvb_transfer_seal(p, hp[t], LAYERS, 2000 + t),
				0);
	if (p_aborts) {
		assert_int_equal(
			kvb_transfer_abort(p, hp[VICTIM], 2000 + VICTIM), 0);
	} else {
		/* D's release must find every layer op issued at A (most of
		 * their ops still queued) */
		assert_int_equal(broker_wait_stat(&pp.a, "layer_ops",
						  NX * LAYERS, 10000),
				 0);
		assert_int_equal(
			kvb_transfer_abort(d, hd[VICTIM], 1000 + VICTIM), 0);
	}

	assert_int_equal(collect(p, NX, hp, xs, &vdescs, &odescs, 20000), NX);
	printf("P: %u transfers ended in %.1f ms; the victim's layer ops "
	       "dropped (-ECANCELED): %u, other layer ops failed: %u\n",
	       NX, ms_since(t0), vdescs, odescs);
	for (uint32_t t = 0; t < NX; t++)
		if (xs[t])
			printf("P: transfer %u: %s\n", t, strerror(-xs[t]));
	/* the case under test happened: ops of the victim were still queued */
	assert_true(vdescs > 0);
	assert_int_equal(xs[VICTIM], -ECANCELED);
	for (uint32_t t = 0; t < NX; t++)
		if (t != VICTIM)
			assert_int_equal(xs[t], 0);
	assert_int_equal(odescs, 0);

	assert_int_equal(collect(d, NX, hd, xs, &vdescs, &odescs, 20000), NX);
	for (uint32_t t = 0; t < NX; t++)
		if (xs[t])
			printf("D: transfer %u: %s\n", t, strerror(-xs[t]));
	assert_int_equal(xs[VICTIM], -ECANCELED);
	for (uint32_t t = 0; t < NX; t++)
		if (t != VICTIM) {
			assert_int_equal(xs[t], 0);
			assert_int_equal(check_xfer(pr, dr, t), 0);
		}
	assert_int_equal(odescs, 0);
	kvb_detach(p);
	kvb_detach(d);
	pair_stop(&pp);
}

static void test_p_abort(void **state)
{
	(void) state;
	run(1);
}

static void test_d_abort(void **state)
{
	(void) state;
	run(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_p_abort, pair_kill),
		cmocka_unit_test_teardown(test_d_abort, pair_kill),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Cross-node opens by peer address (kvb_transfer_open_remote_batch), the
 * refusal of a live transfer id opened twice, release-only entries and
 * alias regions (kvb_mem_alias), between two brokers on loopback: A (a P
 * worker) and B (a D worker), both --host-ip 127.0.0.1 with their own
 * handshake and notify ports, tcp between them.
 *
 * - batch64: D opens 64 WRITE transfers to A in one call while A is not
 *   known yet (they wait for the handshake, then announce), P opens its 64
 *   in one call: one control request each, every transfer completes, every
 *   byte of every block named lands right and no other byte changes. Then
 *   64 opens in one batch against 64 kvb_transfer_open_remote calls,
 *   interleaved over 10 rounds: the medians are printed, and the batch
 *   must be the faster.
 * - no_answer: a batch to a port where nothing listens returns at once
 *   (< 50 ms + slack); its transfers fail with the handshake's -ETIMEDOUT
 *   within its 3 s: deferred layer ops and sealed transfers then, an
 *   unsealed one at its seal (with the seal's tag), an aborted one at the
 *   abort; a layer op after the failure is refused with it; an entry
 *   within 1 s of the failure fails at once, one after it waits again.
 * - duplicate: the same live id opened again, single or batch: -EEXIST,
 *   counted; the first transfer completes with every byte right. A
 *   transfer made by an early remote_blocks is no duplicate.
 * - release_only: D releases an id it never loaded: P's transfer (layers
 *   waiting for remote_blocks) ends with -ECANCELED at once, D's with 0;
 *   an id P had not opened is refused to P later (-ESTALE).
 * - alias: layers declared on aliases at odd byte offsets of one backing
 *   buffer on both sides; P writes D's: the right bytes land, no other byte
 *   of D's buffer changes; a same-node copy between aliases; the parent
 *   cannot be freed while aliases live (-EBUSY), bad aliases refused.
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

#define NB     128u /* blocks per layer */
#define LAYERS 4u
#define NX     64u /* transfers of a batch */
static const struct kvb_kv_geometry geo = {KVB_KV_KV_FIRST, NB, 4, 1, 16, 2};
#define KV_BYTES (2ull * NB * 4 * 16 * 2) /* a layer's tensor */
#define BLK	 (4ull * 16 * 2)	  /* K (or V) bytes of one block */

struct pair {
	struct broker a, b;
	uint16_t hs_a, hs_b;
	char ha[8], hb[8], na[8], nb[8];
};

static void pair_start(struct pair *p, int start_a)
{
	/* ports of their own per test (a failed test leaves its brokers),
	 * below the ephemeral range; a port another program or a connection
	 * holds is tried again on others, as broker_pair_start does */
	static unsigned k;
	const char *aa[] = {"--host-ip",
			    "127.0.0.1",
			    "--handshake-port",
			    p->ha,
			    "--notify-port",
			    p->na,
			    "--trusted-hosts",
			    "127.0.0.1",
			    NULL};
	const char *ab[] = {"--host-ip",
			    "127.0.0.1",
			    "--handshake-port",
			    p->hb,
			    "--notify-port",
			    p->nb,
			    "--trusted-hosts",
			    "127.0.0.1",
			    NULL};
	struct broker_opts oa = {.args = aa}, ob = {.args = ab};
	int rc = -1;

	for (int tries = 0; rc && tries < 4; tries++) {
		uint16_t base = (uint16_t) (20000 + (getpid() % 120) * 100 +
					    (k++ % 6) * 16);

		memset(&p->a, 0, sizeof(p->a));
		memset(&p->b, 0, sizeof(p->b));
		p->hs_a = base;
		p->hs_b = (uint16_t) (base + 8);
		snprintf(p->ha, sizeof(p->ha), "%u", p->hs_a);
		snprintf(p->na, sizeof(p->na), "%u", p->hs_a + 1);
		snprintf(p->hb, sizeof(p->hb), "%u", p->hs_b);
		snprintf(p->nb, sizeof(p->nb), "%u", p->hs_b + 1);
		rc = start_a ? broker_start(&p->a, &oa) : 0;
		if (!rc)
			rc = broker_start(&p->b, &ob);
		if (rc) { /* neither left running */
			broker_kill(&p->a);
			broker_cleanup(&p->a);
			broker_kill(&p->b);
			broker_cleanup(&p->b);
		}
	}
	assert_int_equal(rc, 0);
}

static void pair_stop(struct pair *p, int started_a)
{
	if (started_a) {
		assert_int_equal(broker_stop(&p->a), 0);
		broker_cleanup(&p->a);
	}
	assert_int_equal(broker_stop(&p->b), 0);
	broker_cleanup(&p->b);
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

/* Every byte of D's blocks dblk[i] equals P's pblk[i]; D's blocks not
 * named are all zero. Returns the bytes that differ. */
static uint64_t check_blocks(const struct kvb_region *pr,
			     const struct kvb_region *dr, const uint32_t *pblk,
			     const uint32_t *dblk, uint32_t n)
{
	uint64_t bad = 0;

	for (uint32_t l = 0; l < LAYERS; l++) {
		uint8_t named[NB] = {0};
		const uint8_t *d = dr[l].addr;

		for (uint32_t i = 0; i < n; i++) {
			named[dblk[i]] = 1;
			for (uint32_t kv = 0; kv < 2; kv++)
				bad += memcmp(d + kv_off(kv, dblk[i]),
					      (const uint8_t *) pr[l].addr +
						      kv_off(kv, pblk[i]),
					      BLK) != 0;
		}
		for (uint32_t k = 0; k < NB; k++)
			for (uint32_t kv = 0; kv < 2 && !named[k]; kv++)
				for (uint64_t j = 0; j < BLK; j++)
					bad += d[kv_off(kv, k) + j] != 0;
	}
	return bad;
}

static struct kvb_remote_open entry(const char *id, const char *host,
				    uint16_t port, uint32_t mode,
				    const uint32_t *blocks, uint32_t n)
{
	return (struct kvb_remote_open){.transfer_id = id,
					.host = host,
					.port = port,
					.mode = mode,
					.blocks = blocks,
					.nblocks = n};
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;

	return x < y ? -1 : x > y;
}

/* 64 P/READ opens per round: one batch, then 64 single opens (peer from
 * kvb_peer_connect), interleaved; each set aborted after. Medians in ns. */
static void measure(struct kvb_ctx *p, uint16_t hs_b, uint32_t peer)
{
	enum { ROUNDS = 10 };
	int64_t tb[ROUNDS], ts[ROUNDS];
	static char ids[NX][32];
	struct kvb_remote_open o[NX];
	uint32_t h[NX], blk[2] = {0, 1};
	int32_t st[NX];
	struct kvb_completion c[NX];

	for (int r = 0; r < ROUNDS; r++) {
		int64_t t0;

		for (uint32_t i = 0; i < NX; i++) {
			snprintf(ids[i], sizeof(ids[i]), "m%d-b%u", r, i);
			o[i] = entry(ids[i], "127.0.0.1", hs_b, KVB_XFER_READ,
				     blk, 2);
		}
		t0 = now_ns();
		assert_int_equal(
			kvb_transfer_open_remote_batch(p, o, NX, h, st), 0);
		tb[r] = now_ns() - t0;
		for (uint32_t i = 0; i < NX; i++) {
			assert_int_equal(st[i], 0);
			assert_int_equal(kvb_transfer_abort(p, h[i], 1), 0);
		}
		assert_int_equal(w_collect(p, c, NX, 5000), NX);
		t0 = now_ns();
		for (uint32_t i = 0; i < NX; i++) {
			struct kvb_remote_xfer x = {.peer = peer,
						    .mode = KVB_XFER_READ,
						    .blocks = blk,
						    .nblocks = 2};

			snprintf(ids[i], sizeof(ids[i]), "m%d-s%u", r, i);
			assert_int_equal(
				kvb_transfer_open_remote(p, ids[i], &x, &h[i]),
				0);
		}
		ts[r] = now_ns() - t0;
		for (uint32_t i = 0; i < NX; i++)
			assert_int_equal(kvb_transfer_abort(p, h[i], 1), 0);
		assert_int_equal(w_collect(p, c, NX, 5000), NX);
	}
	qsort(tb, ROUNDS, sizeof(tb[0]), cmp_i64);
	qsort(ts, ROUNDS, sizeof(ts[0]), cmp_i64);
	printf("64 opens, median of %d interleaved rounds: one "
	       "kvb_transfer_open_remote_batch %.3f ms (min %.3f), 64 "
	       "kvb_transfer_open_remote %.3f ms (min %.3f)\n",
	       ROUNDS, tb[ROUNDS / 2] / 1e6, tb[0] / 1e6, ts[ROUNDS / 2] / 1e6,
	       ts[0] / 1e6);
	/* one round trip against 64: robust even on a loaded machine */
	assert_true(tb[ROUNDS / 2] < ts[ROUNDS / 2]);
}

static void test_batch64(void **state)
{
	struct pair pp;
	struct kvb_region pr[LAYERS], dr[LAYERS];
	struct kvb_ctx *p, *d;
	static char ids[NX][32];
	static uint32_t pblk[NX][2], dblk[NX][2], pall[2 * NX], dall[2 * NX];
	struct kvb_remote_open o[NX];
	uint32_t hp[NX], hd[NX], peer = 0;
	int32_t st[NX];
	static struct kvb_completion c[NX * (LAYERS + 1)];
	int64_t req0, t0;
	double ms;
	int n;

	(void) state;
	pair_start(&pp, 1);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	for (uint32_t i = 0; i < NX; i++) {
		snprintf(ids[i], sizeof(ids[i]), "tx-b64-%u", i);
		dblk[i][0] = dall[2 * i] = 2 * i;
		dblk[i][1] = dall[2 * i + 1] = 2 * i + 1;
		pblk[i][0] = pall[2 * i] = (2 * i + 37) % NB;
		pblk[i][1] = pall[2 * i + 1] = (2 * i + 38) % NB;
	}
	/* D first: A is not known to B, so they wait for the handshake */
	for (uint32_t i = 0; i < NX; i++)
		o[i] = entry(ids[i], "127.0.0.1", pp.hs_a, KVB_XFER_WRITE,
			     dblk[i], 2);
	req0 = broker_stat(&pp.b, "control_requests");
	t0 = now_ns();
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, NX, hd, st), 0);
	ms = ms_since(t0);
	printf("D: 64 opens to an unknown peer: %.3f ms\n", ms);
	assert_true(ms < 50 + SLACK);
	assert_int_equal(broker_stat(&pp.b, "control_requests") - req0, 1);
	for (uint32_t i = 0; i < NX; i++) {
		assert_int_equal(st[i], 0);
		assert_int_equal(kvb_transfer_seal(d, hd[i], 1, 1000 + i), 0);
	}
	for (uint32_t i = 0; i < NX; i++)
		o[i] = entry(ids[i], "127.0.0.1", pp.hs_b, KVB_XFER_WRITE,
			     pblk[i], 2);
	req0 = broker_stat(&pp.a, "control_requests");
	t0 = now_ns();
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, NX, hp, st), 0);
	printf("P: 64 opens: %.3f ms\n", ms_since(t0));
	assert_int_equal(broker_stat(&pp.a, "control_requests") - req0, 1);
	for (uint32_t i = 0; i < NX; i++)
		assert_int_equal(st[i], 0);
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t tags[NX];

		for (uint32_t i = 0; i < NX; i++)
			tags[i] = 100 * l + i;
		assert_int_equal(kvb_submit_layers(p, hp, tags, NX,
						   (uint16_t) l,
						   KVB_DESC_UNSIGNALED),
				 NX);
	}
	for (uint32_t i = 0; i < NX; i++)
		assert_int_equal(kvb_transfer_seal(p, hp[i], LAYERS, 2000 + i),
				 0);
	n = w_collect(p, c, NX, 20000);
	assert_int_equal(n, NX);
	for (int i = 0; i < n; i++) {
		assert_int_equal(c[i].kind, KVB_COMP_TRANSFER);
		assert_int_equal(c[i].status, 0);
	}
	n = w_collect(d, c, NX, 20000);
	assert_int_equal(n, NX);
	for (int i = 0; i < n; i++) {
		assert_int_equal(c[i].kind, KVB_COMP_TRANSFER);
		assert_int_equal(c[i].status, 0);
	}
	assert_int_equal(check_blocks(pr, dr, pall, dall, 2 * NX), 0);
	assert_int_equal(broker_stat(&pp.b, "opens_waiting"), NX);
	assert_int_equal(broker_stat(&pp.b, "remote_blocks_sent"), NX);
	/* the timing: P's peer is B, known now */
	assert_int_equal(kvb_peer_connect(p, "127.0.0.1", pp.hs_b, &peer), 0);
	measure(p, pp.hs_b, peer);
	{
		/* entries past one control message: two requests, in order */
		static uint32_t big[6000];
		struct kvb_remote_open bo[3];
		uint32_t bh[3];
		int32_t bs[3];

		for (uint32_t i = 0; i < 6000; i++)
			big[i] = i % NB;
		for (uint32_t i = 0; i < 3; i++)
			bo[i] = entry(ids[i], "127.0.0.1", pp.hs_b,
				      KVB_XFER_READ, big, 6000);
		bo[1].transfer_id = "tx-split-1";
		req0 = broker_stat(&pp.a, "control_requests");
		assert_int_equal(
			kvb_transfer_open_remote_batch(p, bo, 3, bh, bs), 0);
		assert_int_equal(broker_stat(&pp.a, "control_requests") - req0,
				 2);
		assert_int_equal(bs[0], -ESTALE); /* ended above */
		assert_int_equal(bs[1], 0);
		assert_int_equal(bs[2], -ESTALE);
		assert_int_equal(kvb_transfer_abort(p, bh[1], 5), 0);
		assert_int_equal(w_collect(p, c, 1, 5000), 1);
	}
	kvb_detach(p);
	kvb_detach(d);
	pair_stop(&pp, 1);
}

static void test_no_answer(void **state)
{
	struct pair pp;
	struct kvb_region dr[LAYERS];
	struct kvb_ctx *d;
	uint32_t blk[2] = {0, 1}, h[4], h2;
	int32_t st[4];
	struct kvb_remote_open o[4];
	struct kvb_completion c[16];
	int64_t t0;
	double ms;
	int n, i;

	(void) state;
	pair_start(&pp, 0); /* nothing on A's port */
	d = worker(&pp.b, KVB_ROLE_D, dr);
	o[0] = entry("na-read", "127.0.0.1", pp.hs_a, KVB_XFER_READ, blk, 2);
	o[0].remote_blocks = blk;
	o[0].nremote = 2;
	o[1] = entry("na-sealed", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, blk, 2);
	o[2] = entry("na-late", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, blk, 2);
	o[3] = entry("na-abort", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, blk, 2);
	t0 = now_ns();
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 4, h, st), 0);
	ms = ms_since(t0);
	printf("4 opens to a peer that does not answer: %.3f ms\n", ms);
	assert_true(ms < 50 + SLACK);
	for (i = 0; i < 4; i++)
		assert_int_equal(st[i], 0);
	/* as usual meanwhile: layer ops (deferred), seals */
	assert_int_equal(kvb_submit_layer(d, h[0], 0, 10, 0), 1);
	assert_int_equal(kvb_submit_layer(d, h[0], 1, 11, KVB_DESC_UNSIGNALED),
			 1);
	assert_int_equal(kvb_transfer_seal(d, h[0], 2, 12), 0);
	assert_int_equal(kvb_transfer_seal(d, h[1], 1, 13), 0);
	n = w_collect(d, c, 4, 3000 + SLACK);
	printf("handshake failed after %.0f ms\n", ms_since(t0));
	assert_int_equal(n, 4);
	for (uint64_t tag = 10; tag <= 13; tag++) {
		i = w_find(c, n, tag >= 12 ? KVB_COMP_TRANSFER : KVB_COMP_DESC,
			   tag);
		assert_true(i >= 0);
		assert_int_equal(c[i].status, -ETIMEDOUT);
	}
	assert_true(ms_since(t0) >= 2900); /* the handshake's 3 s */
	/* the unsealed ones report at their seal / abort, not before */
	assert_int_equal(kvb_poll(d, c, 16), 0);
	assert_int_equal(kvb_submit_layer(d, h[2], 0, 20, 0), 1);
	assert_int_equal(kvb_transfer_seal(d, h[2], 1, 21), 0);
	assert_int_equal(kvb_transfer_abort(d, h[3], 22), 0);
	n = w_collect(d, c, 3, 5000);
	assert_int_equal(n, 3);
	i = w_find(c, n, KVB_COMP_DESC, 20); /* D/WRITE takes no layer op */
	assert_true(i >= 0);
	assert_true(c[i].status != 0);
	i = w_find(c, n, KVB_COMP_TRANSFER, 21);
	assert_true(i >= 0);
	assert_int_equal(c[i].status, -ETIMEDOUT);
	i = w_find(c, n, KVB_COMP_TRANSFER, 22);
	assert_true(i >= 0);
	assert_int_equal(c[i].status, -ETIMEDOUT);
	/* within a second of the failure: at once, with it */
	o[0] = entry("na-again", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, blk, 2);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, &h2, st), 0);
	assert_int_equal(st[0], -ETIMEDOUT);
	assert_int_equal(h2, 0);
	assert_int_equal(broker_stat(&pp.b, "handshake_wait_failed"), 5);
	/* later: a new handshake, the entry waits again */
	usleep(1100 * 1000);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, &h2, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(kvb_transfer_abort(d, h2, 30), 0);
	n = w_collect(d, c, 1, 5000);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].status, -ECANCELED);
	/* bad entries fail alone; bad calls as a whole */
	o[0] = entry("", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, blk, 2);
	o[1] = entry("na-untrusted", "192.0.2.9", 6301, KVB_XFER_WRITE, blk, 2);
	o[2] = entry("na-flags", "127.0.0.1", pp.hs_a, KVB_XFER_READ, blk, 2);
	o[2].flags = KVB_XFER_F_RELEASE_ONLY; /* D/WRITE only */
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 3, h, st), 0);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(st[1], -EACCES);
	assert_int_equal(st[2], -EINVAL);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 0, h, st),
			 -EINVAL);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, h, NULL),
			 -EINVAL);
	{
		static uint32_t big[20000];

		o[0] = entry("na-big", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE,
			     big, 20000);
		assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, h, st),
				 -E2BIG);
	}
	kvb_detach(d);
	pair_stop(&pp, 0);
}

static void test_duplicate(void **state)
{
	struct pair pp;
	struct kvb_region pr[LAYERS], dr[LAYERS];
	struct kvb_ctx *p, *d;
	uint32_t pb[3] = {5, 9, 2}, db[3] = {7, 8, 100};
	uint32_t hp, hd, h2, peer = 0;
	int32_t st[2];
	struct kvb_remote_open o[2];
	struct kvb_remote_xfer x = {.mode = KVB_XFER_WRITE};
	struct kvb_completion c[8];
	int n;

	(void) state;
	pair_start(&pp, 1);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	/* D announces first: P's transfer exists before P opens it */
	o[0] = entry("tx-dup", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, db, 3);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, &hd, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(kvb_transfer_seal(d, hd, 1, 50), 0);
	assert_int_equal(
		broker_wait_stat(&pp.a, "remote_blocks_received", 1, 5000), 0);
	o[0] = entry("tx-dup", "127.0.0.1", pp.hs_b, KVB_XFER_WRITE, pb, 3);
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, 1, &hp, st), 0);
	assert_int_equal(st[0], 0); /* not a duplicate */
	/* the same id again: in a batch (twice in one), and alone */
	o[1] = o[0];
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, 2, NULL, st),
			 -EINVAL);
	{
		uint32_t hh[2];

		assert_int_equal(
			kvb_transfer_open_remote_batch(p, o, 2, hh, st), 0);
		assert_int_equal(st[0], -EEXIST);
		assert_int_equal(st[1], -EEXIST);
		assert_int_equal(hh[0], 0);
	}
	assert_int_equal(kvb_peer_connect(p, "127.0.0.1", pp.hs_b, &peer), 0);
	x.peer = peer;
	x.blocks = pb;
	x.nblocks = 3;
	assert_int_equal(kvb_transfer_open_remote(p, "tx-dup", &x, &h2),
			 -EEXIST);
	assert_int_equal(broker_stat(&pp.a, "duplicate_opens"), 3);
	assert_true(broker_log_has(&pp.a, "opened again while it is live"));
	/* D too */
	o[0] = entry("tx-dup", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, db, 3);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, &h2, st), 0);
	assert_int_equal(st[0], -EEXIST);
	/* the first goes on, untouched */
	for (uint16_t l = 0; l < LAYERS; l++)
		assert_int_equal(kvb_submit_layer(p, hp, l, l, 0), 1);
	assert_int_equal(kvb_transfer_seal(p, hp, LAYERS, 60), 0);
	n = w_collect(p, c, LAYERS + 1, 20000);
	assert_int_equal(n, LAYERS + 1);
	for (int i = 0; i < n; i++)
		assert_int_equal(c[i].status, 0);
	n = w_collect(d, c, 1, 20000);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].tag, 50);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(check_blocks(pr, dr, pb, db, 3), 0);
	/* ended: the id is terminal, not a duplicate */
	assert_int_equal(kvb_transfer_open_remote(p, "tx-dup", &x, &h2),
			 -ESTALE);
	kvb_detach(p);
	kvb_detach(d);
	pair_stop(&pp, 1);
}

static void test_release_only(void **state)
{
	struct pair pp;
	struct kvb_region pr[LAYERS], dr[LAYERS];
	struct kvb_ctx *p, *d;
	uint32_t pb[2] = {1, 2}, hp, hd[2], h2, peer = 0;
	int32_t st[2];
	struct kvb_remote_open o[2];
	struct kvb_remote_xfer x = {.mode = KVB_XFER_WRITE};
	struct kvb_completion c[8];
	int64_t t0;
	int n, i;

	(void) state;
	pair_start(&pp, 1);
	p = worker(&pp.a, KVB_ROLE_P, pr);
	d = worker(&pp.b, KVB_ROLE_D, dr);
	/* P opened, its layers wait for remote_blocks that never come */
	o[0] = entry("tx-rel", "127.0.0.1", pp.hs_b, KVB_XFER_WRITE, pb, 2);
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, 1, &hp, st), 0);
	assert_int_equal(st[0], 0);
	for (uint16_t l = 0; l < LAYERS; l++)
		assert_int_equal(kvb_submit_layer(p, hp, l, l, 0), 1);
	assert_int_equal(kvb_transfer_seal(p, hp, LAYERS, 70), 0);
	/* D drops both requests before loading anything: no blocks */
	o[0] = entry("tx-rel", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, NULL, 0);
	o[0].flags = KVB_XFER_F_RELEASE_ONLY;
	o[1] = entry("tx-rel-unopened", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE,
		     NULL, 0);
	o[1].flags = KVB_XFER_F_RELEASE_ONLY;
	t0 = now_ns();
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 2, hd, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	assert_int_equal(kvb_transfer_seal(d, hd[0], 0, 80), 0);
	assert_int_equal(kvb_transfer_seal(d, hd[1], 0, 81), 0);
	n = w_collect(p, c, LAYERS + 1, 5000);
	printf("P's transfer ended %.1f ms after D's release\n", ms_since(t0));
	assert_int_equal(n, LAYERS + 1);
	assert_true(ms_since(t0) < 3000 + SLACK); /* defer timeout: 60 s */
	i = w_find(c, n, KVB_COMP_TRANSFER, 70);
	assert_true(i >= 0);
	assert_int_equal(c[i].status, -ECANCELED);
	for (uint64_t l = 0; l < LAYERS; l++) {
		i = w_find(c, n, KVB_COMP_DESC, l);
		assert_true(i >= 0);
		assert_int_equal(c[i].status, -ECANCELED);
	}
	n = w_collect(d, c, 2, 5000);
	assert_int_equal(n, 2);
	for (uint64_t tag = 80; tag <= 81; tag++) {
		i = w_find(c, n, KVB_COMP_TRANSFER, tag);
		assert_true(i >= 0);
		assert_int_equal(c[i].status, 0);
	}
	assert_int_equal(broker_stat(&pp.b, "release_only_sent"), 2);
	assert_int_equal(broker_stat(&pp.b, "release_only_failed"), 0);
	assert_int_equal(broker_wait_stat(&pp.a, "releases_received", 2, 5000),
			 0);
	/* P opens the other id only now: it ended already */
	assert_int_equal(kvb_peer_connect(p, "127.0.0.1", pp.hs_b, &peer), 0);
	x.peer = peer;
	x.blocks = pb;
	x.nblocks = 2;
	assert_int_equal(
		kvb_transfer_open_remote(p, "tx-rel-unopened", &x, &h2),
		-ESTALE);
	/* the single open does not take the flag */
	x.flags = KVB_XFER_F_RELEASE_ONLY;
	assert_int_equal(kvb_transfer_open_remote(d, "tx-rel-2", &x, &h2),
			 -EINVAL);
	kvb_detach(p);
	kvb_detach(d);
	pair_stop(&pp, 1);
}

#define PAD	5u /* bytes between two layers' aliases */
#define OFF0	3u /* the first alias's odd offset */
#define BACKING (OFF0 + LAYERS * (KV_BYTES + PAD))

static void test_alias(void **state)
{
	struct pair pp;
	struct kvb_region pback, dback, pa[LAYERS], da[LAYERS], bad, sa, sb;
	struct kvb_ctx *p, *d;
	uint32_t pb[3] = {4, 5, 77}, db[3] = {9, 3, 127}, hp, hd;
	uint8_t *canary;
	int32_t st[1];
	struct kvb_remote_open o[1];
	struct kvb_completion c[8];
	uint64_t bad_bytes = 0;
	int n;

	(void) state;
	pair_start(&pp, 1);
	p = w_attach(&pp.a, KVB_ROLE_P, 0, 1, 0);
	d = w_attach(&pp.b, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(p);
	assert_non_null(d);
	assert_int_equal(
		kvb_mem_alloc(p, BACKING, KVB_MEM_REMOTE_READ, 99, &pback), 0);
	assert_int_equal(
		kvb_mem_alloc(d, BACKING, KVB_MEM_REMOTE_WRITE, 99, &dback), 0);
	pattern_fill(pback.addr, BACKING, 3, 0);
	memset(dback.addr, 0xa5, BACKING);
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t off = OFF0 + l * (KV_BYTES + PAD);
		/* D's views lie at other odd offsets than P's */
		uint64_t doff = BACKING - (l + 1) * (KV_BYTES + PAD);

		assert_int_equal(kvb_mem_alias(p, &pback, off, KV_BYTES,
					       KVB_MEM_REMOTE_READ, l, &pa[l]),
				 0);
		assert_ptr_equal(pa[l].addr, (uint8_t *) pback.addr + off);
		assert_int_equal(pa[l].alias, 1);
		assert_int_equal(kvb_mem_set_kv(p, pa[l].id, l, &geo), 0);
		assert_int_equal(kvb_mem_alias(d, &dback, doff, KV_BYTES,
					       KVB_MEM_REMOTE_WRITE, l, &da[l]),
				 0);
		assert_int_equal(kvb_mem_set_kv(d, da[l].id, l, &geo), 0);
	}
	/* refused: outside the parent, empty, unknown flags, an alias of an
	 * alias, another worker's region; the parent while aliases live */
	assert_int_equal(kvb_mem_alias(p, &pback, BACKING - 1, 2, 0, 0, &bad),
			 -EINVAL);
	assert_int_equal(kvb_mem_alias(p, &pback, 0, 0, 0, 0, &bad), -EINVAL);
	assert_int_equal(kvb_mem_alias(p, &pback, 0, 1, 0x80, 0, &bad),
			 -EINVAL);
	assert_int_equal(kvb_mem_alias(p, &pa[0], 1, 1, 0, 0, &bad),
			 -EOPNOTSUPP);
	bad = pback;
	bad.id = 0xdead0001u; /* no such region */
	assert_int_equal(kvb_mem_alias(p, &bad, 1, 1, 0, 0, &sa), -ENOENT);
	assert_int_equal(kvb_mem_free(p, &pback), -EBUSY);
	assert_non_null(pback.addr); /* still mapped */
	/* P writes D's blocks through the aliases */
	o[0] = entry("tx-alias", "127.0.0.1", pp.hs_a, KVB_XFER_WRITE, db, 3);
	assert_int_equal(kvb_transfer_open_remote_batch(d, o, 1, &hd, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(kvb_transfer_seal(d, hd, 1, 90), 0);
	o[0] = entry("tx-alias", "127.0.0.1", pp.hs_b, KVB_XFER_WRITE, pb, 3);
	assert_int_equal(kvb_transfer_open_remote_batch(p, o, 1, &hp, st), 0);
	assert_int_equal(st[0], 0);
	for (uint16_t l = 0; l < LAYERS; l++)
		assert_int_equal(kvb_submit_layer(p, hp, l, l, 0), 1);
	assert_int_equal(kvb_transfer_seal(p, hp, LAYERS, 91), 0);
	n = w_collect(p, c, LAYERS + 1, 20000);
	assert_int_equal(n, LAYERS + 1);
	for (int i = 0; i < n; i++)
		assert_int_equal(c[i].status, 0);
	n = w_collect(d, c, 1, 20000);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].status, 0);
	/* the named blocks: P's bytes; every other byte of D's buffer: as
	 * it was */
	canary = malloc(BACKING);
	assert_non_null(canary);
	memset(canary, 0xa5, BACKING);
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t doff = BACKING - (l + 1) * (KV_BYTES + PAD);
		uint64_t poff = OFF0 + l * (KV_BYTES + PAD);

		for (uint32_t i = 0; i < 3; i++)
			for (uint32_t kv = 0; kv < 2; kv++)
				memcpy(canary + doff + kv_off(kv, db[i]),
				       (uint8_t *) pback.addr + poff +
					       kv_off(kv, pb[i]),
				       BLK);
	}
	for (uint64_t j = 0; j < BACKING; j++)
		bad_bytes += ((uint8_t *) dback.addr)[j] != canary[j];
	free(canary);
	assert_int_equal(bad_bytes, 0);
	/* same node: one alias into another, 1000 bytes at odd offsets */
	assert_int_equal(kvb_mem_alloc(p, 1 << 16, 0, 200, &sb), 0);
	assert_int_equal(kvb_mem_alias(p, &sb, 4097, 8191, 0, 201, &sa), 0);
	memset(sb.addr, 0, 1 << 16);
	{
		struct kvb_desc dd = {.region = pa[1].id,
				      .peer_region = sa.id,
				      .offset = 11,
				      .peer_offset = 7,
				      .len = 1000,
				      .tag = 1};

		assert_int_equal(w_transfer_write(p, "tx-local-alias", dd), 0);
		assert_memory_equal((uint8_t *) sb.addr + 4097 + 7,
				    (uint8_t *) pa[1].addr + 11, 1000);
		assert_int_equal(((uint8_t *) sb.addr)[4097 + 6], 0);
		assert_int_equal(((uint8_t *) sb.addr)[4097 + 7 + 1000], 0);
	}
	/* aliases first, then the parent */
	assert_int_equal(kvb_mem_free(p, &sb), -EBUSY);
	assert_int_equal(kvb_mem_free(p, &sa), 0);
	assert_int_equal(kvb_mem_free(p, &sb), 0);
	for (uint32_t l = 0; l < LAYERS; l++)
		assert_int_equal(kvb_mem_free(p, &pa[l]), 0);
	assert_int_equal(kvb_mem_free(p, &pback), 0);
	kvb_detach(p);
	kvb_detach(d); /* D's aliases and parent go at detach, any order */
	pair_stop(&pp, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch64),
		cmocka_unit_test(test_no_answer),
		cmocka_unit_test(test_duplicate),
		cmocka_unit_test(test_release_only),
		cmocka_unit_test(test_alias),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Two brokers on loopback (harness.h's broker_pair), a P worker on A and a
 * D worker on B with LAYERS KV regions each, and transfers k that move P's
 * blocks k*NPX.. into D's (k+8)*NPX.., every byte checked: what
 * test_expect and test_worker_replaced share. Each defines pair_start()
 * (its brokers' options).
 */
#ifndef KVB_KV_PAIR_H
#define KVB_KV_PAIR_H

#define KVB_UNUSED __attribute__((unused))

#define LAYERS 2u
#define NPX    4u  /* blocks per transfer */
#define NB     64u /* blocks per region */
/* 16 tokens x 2 heads x 64 x 2 bytes: 4 KiB of K (or V) per block */
static const struct kvb_kv_geometry geo = {KVB_KV_KV_FIRST, NB, 16, 2, 64, 2};
#define BLK	 (16ull * 2 * 64 * 2)
#define KV_BYTES (2ull * NB * BLK)

static struct broker_pair pp;
static struct kvb_region pr[LAYERS], dr[LAYERS];

KVB_UNUSED static int pair_kill(void **state)
{
	(void) state;
	broker_pair_kill(&pp);
	return 0;
}

KVB_UNUSED static struct kvb_ctx *worker(struct broker *b, enum kvb_role role,
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

/* The end of a case: both workers detach, both brokers stop cleanly. */
KVB_UNUSED static void pair_stop(struct kvb_ctx *p, struct kvb_ctx *d)
{
	kvb_detach(p);
	kvb_detach(d);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

/* transfer k: P's blocks k*NPX.., D's (k+8)*NPX.. */
KVB_UNUSED static void blocks(uint32_t k, uint32_t *pb, uint32_t *db)
{
	for (uint32_t i = 0; i < NPX; i++) {
		pb[i] = k * NPX + i;
		db[i] = (k + 8) * NPX + i;
	}
}

KVB_UNUSED static uint64_t check(uint32_t k)
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
KVB_UNUSED static uint32_t d_open(struct kvb_ctx *d, const char *id, uint32_t k)
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
KVB_UNUSED static void p_write(struct kvb_ctx *p, const char *id, uint32_t k)
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
KVB_UNUSED static int32_t ended(struct kvb_ctx *c, uint64_t tag, int timeout_ms)
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

#endif

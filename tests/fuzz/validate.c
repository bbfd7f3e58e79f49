// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the broker's check of a worker's descriptor
 * (kvb_validate_desc(), broker/regions.c), what a worker writes into its
 * submission ring. The input is a run of (worker, struct kvb_sqe) records,
 * checked against a region table made by hand: regions of three workers with
 * every grant, an empty one, a huge one, a dead one and the stale id of a
 * freed one.
 *
 * Every answer is compared with the rules written out once more, with
 * 128-bit arithmetic for the bounds: accepted means a known opcode, a length
 * in (0, 1 TiB], a live local region of this worker and a live peer region
 * of this node that is its own or granted for the access, both ranges inside
 * their regions; refused means the right -errno and a reason.
 */
#include <errno.h>

#include "fuzz.h"
#include "kvbroker/kvbroker.h"
#include "regions.h"

#define REC_LEN	 (1 + sizeof(struct kvb_sqe))
#define MAX_DESC (1ull << 40)

static const uint32_t workers[4] = {0x1001, 0x1002, 0x2003, 0x3004};
static struct kvb_regions t;
static int ready;

static void setup(void)
{
	static const struct {
		uint32_t owner, flags;
		uint64_t len;
	} reg[] = {
		{0x1001, 0, 65536},
		{0x1001, 0, 0},
		{0x1002, KVB_MEM_REMOTE_WRITE, 4096},
		{0x1002, KVB_MEM_REMOTE_READ, 64},
		{0x2003, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ,
		 1ull << 62},
		{0x2003, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ, 100},
	};
	struct kvb_region_ent *r;
	unsigned i;

	FUZZ_CHECK(kvb_regions_init(&t) == 0);
	/* a freed region: its slot is reused, its old id must not match */
	r = kvb_region_alloc(&t);
	FUZZ_CHECK(r);
	kvb_region_release(&t, r);
	for (i = 0; i < sizeof(reg) / sizeof(reg[0]); i++) {
		r = kvb_region_alloc(&t);
		FUZZ_CHECK(r);
		r->owner = reg[i].owner;
		r->mr.flags = reg[i].flags;
		r->mr.len = reg[i].len;
	}
	/* dead: its owner went away with an op still in flight */
	r->dead = 1;
	ready = 1;
}

static int inside(uint64_t off, uint64_t len, uint64_t size)
{
	return (unsigned __int128) off + len <= size;
}

static void one(uint32_t w, const struct kvb_sqe *e)
{
	struct kvb_region_ent *l = NULL, *r = NULL, *lx, *rx;
	const char *why = NULL;
	uint32_t need;
	int rc, want;

	rc = kvb_validate_desc(&t, w, e, &l, &r, &why);
	lx = kvb_region_get(&t, e->region);
	rx = kvb_region_get(&t, e->peer_region);
	need = e->opcode == KVB_OP_WRITE ? KVB_MEM_REMOTE_WRITE
					 : KVB_MEM_REMOTE_READ;
	if (e->opcode != KVB_OP_WRITE && e->opcode != KVB_OP_READ)
		want = -EINVAL;
	else if (!e->len || e->len > MAX_DESC)
		want = -EINVAL;
	else if (!lx || lx->dead || lx->owner != w)
		want = -EINVAL;
	else if (!inside(e->offset, e->len, lx->mr.len))
		want = -EFAULT;
	else if (e->peer)
		want = -EHOSTUNREACH;
	else if (!rx)
		want = -EINVAL;
	else if (rx->dead)
		want = -ENXIO;
	else if (rx->owner != w && !(rx->mr.flags & need))
		want = -EINVAL;
	else if (!inside(e->peer_offset, e->len, rx->mr.len))
		want = -EFAULT;
	else if (lx == rx && e->offset < e->peer_offset + e->len &&
		 e->peer_offset < e->offset + e->len)
		want = -EINVAL; /* overlapping ranges of one region */
	else
		want = 0;
	FUZZ_CHECK(rc == want);
	if (rc) {
		FUZZ_CHECK(why && *why);
		return;
	}
	FUZZ_CHECK(l == lx && r == rx);
	FUZZ_CHECK(l->mr.id == e->region && r->mr.id == e->peer_region);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvb_sqe e;

	if (!ready)
		setup();
	for (; size >= REC_LEN; data += REC_LEN, size -= REC_LEN) {
		memcpy(&e, data + 1, sizeof(e));
		one(workers[data[0] & 3], &e);
	}
	return 0;
}

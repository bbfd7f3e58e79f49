/* SPDX-License-Identifier: MIT */
#include "regions.h"

#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define KVB_MAX_DESC_LEN (1ull << 40)

int kvb_regions_init(struct kvb_regions *t)
{
	t->v = calloc(KVB_MAX_REGIONS, sizeof(*t->v));
	if (!t->v)
		return -ENOMEM;
	t->next_free = 1;
	t->live = 0;
	return 0;
}

void kvb_regions_fini(struct kvb_regions *t)
{
	free(t->v);
	t->v = NULL;
}

struct kvb_region_ent *kvb_region_alloc(struct kvb_regions *t)
{
	uint32_t i, slot;

	for (i = 0; i < KVB_MAX_REGIONS - 1; i++) {
		slot = 1 + (t->next_free - 1 + i) % (KVB_MAX_REGIONS - 1);
		if (!t->v[slot].used) {
			struct kvb_region_ent *r = &t->v[slot];
			uint16_t gen = (uint16_t) (r->gen + 1);

			memset(r, 0, sizeof(*r));
			r->gen = gen ? gen : 1;
			r->used = 1;
			r->mr.id = ((uint32_t) r->gen << 16) | slot;
			t->next_free = slot + 1;
			t->live++;
			return r;
		}
	}
	return NULL;
}

void kvb_region_release(struct kvb_regions *t, struct kvb_region_ent *r)
{
	uint16_t gen = r->gen;

	memset(r, 0, sizeof(*r));
	r->gen = gen;
	t->live--;
}

struct kvb_region_ent *kvb_region_get(struct kvb_regions *t, uint32_t id)
{
	uint32_t slot = id & 0xffffu;
	struct kvb_region_ent *r;

	if (slot == 0)
		return NULL;
	r = &t->v[slot];
	if (!r->used || r->mr.id != id)
		return NULL;
	return r;
}

/* off + len inside [0, size) without overflow */
static int in_bounds(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

int kvb_validate_desc(struct kvb_regions *t, uint32_t worker,
		      const struct kvb_sqe *e, struct kvb_region_ent **loc,
		      struct kvb_region_ent **rem, const char **why)
{
	struct kvb_region_ent *l, *r;
	uint32_t need;

	if (e->opcode != KVB_OP_WRITE && e->opcode != KVB_OP_READ) {
		*why = "unknown opcode";
		return -EINVAL;
	}
	if (e->len == 0 || e->len > KVB_MAX_DESC_LEN) {
		*why = "length is 0 or larger than 1 TiB";
		return -EINVAL;
	}
	l = kvb_region_get(t, e->region);
	if (!l || l->dead) {
		*why = "unknown local region";
		return -EINVAL;
	}
	if (l->owner != worker) {
		*why = "local region belongs to another worker";
		return -EINVAL;
	}
	if (!in_bounds(e->offset, e->len, l->mr.len)) {
		*why = "local offset + length outside the region";
		return -EFAULT;
	}
	if (e->peer != 0) {
		*why = "unknown peer node";
		return -EHOSTUNREACH;
	}
	r = kvb_region_get(t, e->peer_region);
	if (!r) {
		*why = "unknown peer region";
		return -EINVAL;
	}
	if (r->dead) {
		*why = "peer region's owner is gone or freed it";
		return -ENXIO;
	}
	need = e->opcode == KVB_OP_WRITE ? KVB_MEM_REMOTE_WRITE
					 : KVB_MEM_REMOTE_READ;
	if (r->owner != worker && !(r->mr.flags & need)) {
		*why = "peer region not granted for this access";
		return -EINVAL;
	}
	if (!in_bounds(e->peer_offset, e->len, r->mr.len)) {
		*why = "peer offset + length outside the region";
		return -EFAULT;
	}
	/* both in bounds: the sums below do not overflow */
	if (l == r && e->offset < e->peer_offset + e->len &&
	    e->peer_offset < e->offset + e->len) {
		*why = "source and destination overlap in one region";
		return -EINVAL;
	}
	*loc = l;
	*rem = r;
	return 0;
}

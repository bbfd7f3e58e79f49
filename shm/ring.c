/* SPDX-License-Identifier: MIT */
#include "ring.h"

#include <errno.h>

int kvb_ring_init(void *mem, uint32_t entries)
{
	struct kvb_ring_shm *s = mem;

	if (!mem || entries < 2 || (entries & (entries - 1)) ||
	    entries > (1u << 30))
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	atomic_init(&s->prod, 0);
	atomic_init(&s->cons, 0);
	s->magic = KVB_RING_MAGIC;
	s->entries = entries;
	s->mask = entries - 1;
	s->slot_size = KVB_RING_SLOT;
	return 0;
}

int kvb_ring_attach(struct kvb_ring *r, void *mem, size_t avail)
{
	struct kvb_ring_shm *s = mem;
	uint32_t n;

	if (!r || !mem || avail < sizeof(*s))
		return -EINVAL;
	n = s->entries;
	if (s->magic != KVB_RING_MAGIC || s->slot_size != KVB_RING_SLOT)
		return -EPROTO;
	if (n < 2 || (n & (n - 1)) || s->mask != n - 1 ||
	    kvb_ring_bytes(n) > avail)
		return -EPROTO;
	r->shm = s;
	r->slots = s->slots;
	r->mask = n - 1;
	r->entries = n;
	/* start the cache at the side's own index: conservative either way */
	r->cached = _kvb_load_acquire(&s->cons);
	return 0;
}

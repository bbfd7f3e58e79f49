/* SPDX-License-Identifier: MIT */
#include "segment.h"

#include <errno.h>

#define SEG_PAGE 4096u

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

size_t kvb_seg_bytes(uint32_t sq_entries, uint32_t cq_entries)
{
	size_t sz = sizeof(struct kvb_seg_hdr);

	sz = round_up(sz, KVB_CACHELINE) + kvb_ring_bytes(sq_entries);
	sz = round_up(sz, KVB_CACHELINE) + kvb_ring_bytes(cq_entries);
	return round_up(sz, SEG_PAGE);
}

int kvb_seg_format(struct kvb_seg *seg, void *mem, size_t size,
		   uint32_t sq_entries, uint32_t cq_entries, uint32_t worker_id)
{
	struct kvb_seg_hdr *h = mem;
	size_t sq_off = round_up(sizeof(*h), KVB_CACHELINE);
	size_t cq_off = round_up(sq_off + kvb_ring_bytes(sq_entries), KVB_CACHELINE);
	unsigned char *base = mem;
	int rc;

	if (!seg || !mem || size < kvb_seg_bytes(sq_entries, cq_entries))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	rc = kvb_ring_init(base + sq_off, sq_entries);
	if (rc)
		return rc;
	rc = kvb_ring_init(base + cq_off, cq_entries);
	if (rc)
		return rc;
	h->seg_size = size;
	h->sq_off = (uint32_t)sq_off;
	h->sq_entries = sq_entries;
	h->cq_off = (uint32_t)cq_off;
	h->cq_entries = cq_entries;
	h->worker_id = worker_id;
	h->version = KVB_SEG_VERSION;
	atomic_init(&h->broker_sleeping, 0);
	atomic_init(&h->broker_state, KVB_BROKER_RUNNING);
	atomic_init(&h->worker_waiting, 0);
	/* the magic last: a reader that sees it sees a laid-out segment */
	atomic_thread_fence(memory_order_release);
	h->magic = KVB_SEG_MAGIC;
	return kvb_seg_attach(seg, mem, size);
}

int kvb_seg_attach(struct kvb_seg *seg, void *mem, size_t size)
{
	struct kvb_seg_hdr *h = mem;
	unsigned char *base = mem;
	int rc;

	if (!seg || !mem || size < sizeof(*h))
		return -EINVAL;
	if (h->magic != KVB_SEG_MAGIC || h->version != KVB_SEG_VERSION)
		return -EPROTO;
	if (h->seg_size != size || h->sq_off < sizeof(*h) ||
	    h->sq_off % KVB_CACHELINE || h->cq_off % KVB_CACHELINE ||
	    (uint64_t)h->sq_off + kvb_ring_bytes(h->sq_entries) > h->cq_off ||
	    (uint64_t)h->cq_off + kvb_ring_bytes(h->cq_entries) > size)
		return -EINVAL;
	rc = kvb_ring_attach(&seg->sq, base + h->sq_off, h->cq_off - h->sq_off);
	if (rc)
		return rc;
	if (seg->sq.entries != h->sq_entries)
		return -EINVAL;
	rc = kvb_ring_attach(&seg->cq, base + h->cq_off, size - h->cq_off);
	if (rc)
		return rc;
	if (seg->cq.entries != h->cq_entries)
		return -EINVAL;
	seg->hdr = h;
	seg->size = size;
	return 0;
}

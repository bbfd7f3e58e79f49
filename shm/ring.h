/* SPDX-License-Identifier: MIT */
/*
 * kvbroker shared-memory SPSC ring of fixed 64-byte slots.
 *
 * Layout in shared memory (no pointers; every process builds its own view):
 *
 *   offset   0: producer line  { prod }          written by the producer only
 *   offset  64: consumer line  { cons }          written by the consumer only
 *   offset 128: config line    { magic, entries, mask, slot_size }  read-only
 *   offset 192: entries * 64 bytes of slots
 *
 * Indices are free-running uint32_t; a slot is `idx & mask`. The ring is full
 * when prod - cons == entries. Each side keeps a private cached copy of the
 * other side's index so that the common case touches one shared line only.
 *
 * Memory ordering: the producer writes slots, then store-release prod; the
 * consumer load-acquires prod, reads slots, then store-release cons; the
 * producer load-acquires cons before reusing slots.
 */
#ifndef KVB_SHM_RING_H
#define KVB_SHM_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVB_RING_MAGIC 0x4b56524eu /* "KVRN" */
#define KVB_RING_SLOT 64u
#define KVB_CACHELINE 64u

struct kvb_ring_shm {
	alignas(KVB_CACHELINE) _Atomic uint32_t prod;
	alignas(KVB_CACHELINE) _Atomic uint32_t cons;
	alignas(KVB_CACHELINE) uint32_t magic;
	uint32_t entries;
	uint32_t mask;
	uint32_t slot_size;
	alignas(KVB_CACHELINE) unsigned char slots[];
};

_Static_assert(offsetof(struct kvb_ring_shm, prod) == 0, "prod line");
_Static_assert(offsetof(struct kvb_ring_shm, cons) == 64, "cons line");
_Static_assert(offsetof(struct kvb_ring_shm, magic) == 128, "config line");
_Static_assert(offsetof(struct kvb_ring_shm, slots) == 192, "slots start");

/* Process-local view of one side of a ring. Not shared. */
struct kvb_ring {
	struct kvb_ring_shm *shm;
	unsigned char *slots;
	uint32_t mask;
	uint32_t entries;
	uint32_t cached; /* producer: last seen cons; consumer: last seen prod */
};

/* Bytes of shared memory a ring of `entries` slots needs. */
static inline size_t kvb_ring_bytes(uint32_t entries)
{
	return sizeof(struct kvb_ring_shm) + (size_t)entries * KVB_RING_SLOT;
}

/*
 * Initialise a ring in memory `mem` of at least kvb_ring_bytes(entries).
 * entries must be a power of two >= 2. Returns 0 or -EINVAL.
 * Not thread-safe; call before the ring is shared.
 */
int kvb_ring_init(void *mem, uint32_t entries);

/*
 * Build a process-local view of an initialised ring at `mem`, checking the
 * magic, the power-of-two size and that the ring fits in `avail` bytes.
 * Returns 0, or -EINVAL / -EPROTO on a corrupt header.
 */
int kvb_ring_attach(struct kvb_ring *r, void *mem, size_t avail);

/* Small named helpers for the two orders we use. */
static inline uint32_t _kvb_load_acquire(_Atomic uint32_t *p)
{
	return atomic_load_explicit(p, memory_order_acquire);
}

static inline void _kvb_store_release(_Atomic uint32_t *p, uint32_t v)
{
	atomic_store_explicit(p, v, memory_order_release);
}

static inline uint32_t _kvb_load_relaxed(_Atomic uint32_t *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

static inline void *kvb_ring_slot(const struct kvb_ring *r, uint32_t idx)
{
	return r->slots + (size_t)(idx & r->mask) * KVB_RING_SLOT;
}

/* Producer: free slots, refreshing the cached consumer index if needed. */
static inline uint32_t _kvb_ring_prod_free(struct kvb_ring *r, uint32_t prod,
					   uint32_t want)
{
	uint32_t used = prod - r->cached;

	if (used > r->entries || r->entries - used < want) {
		/* pairs with the consumer's store-release of cons */
		r->cached = _kvb_load_acquire(&r->shm->cons);
		used = prod - r->cached;
		/* a corrupt consumer index must not let us overwrite live slots */
		if (used > r->entries)
			return 0;
	}
	return r->entries - used;
}

static inline void _kvb_ring_copy_in(struct kvb_ring *r, uint32_t prod,
				     const void *src, uint32_t n)
{
	const unsigned char *s = (const unsigned char *)src;
	uint32_t i;

	for (i = 0; i < n; i++)
		memcpy(kvb_ring_slot(r, prod + i), s + (size_t)i * KVB_RING_SLOT,
		       KVB_RING_SLOT);
}

static inline void _kvb_ring_copy_out(struct kvb_ring *r, uint32_t cons,
				      void *dst, uint32_t n)
{
	unsigned char *d = (unsigned char *)dst;
	uint32_t i;

	for (i = 0; i < n; i++)
		memcpy(d + (size_t)i * KVB_RING_SLOT, kvb_ring_slot(r, cons + i),
		       KVB_RING_SLOT);
}

/*
 * Enqueue up to n 64-byte entries from `src` (burst). Returns how many were
 * enqueued (0..n). Single producer: not thread-safe against another producer.
 */
static inline uint32_t kvb_ring_enqueue_burst(struct kvb_ring *r,
					      const void *src, uint32_t n)
{
	/* only the producer writes prod: relaxed read of our own index */
	uint32_t prod = _kvb_load_relaxed(&r->shm->prod);
	uint32_t free_slots = _kvb_ring_prod_free(r, prod, n);

	if (n > free_slots)
		n = free_slots;
	if (n == 0)
		return 0;
	_kvb_ring_copy_in(r, prod, src, n);
	/* pairs with the consumer's load-acquire of prod */
	_kvb_store_release(&r->shm->prod, prod + n);
	return n;
}

/* Enqueue exactly n entries or none (bulk). Returns n or 0. */
static inline uint32_t kvb_ring_enqueue_bulk(struct kvb_ring *r,
					     const void *src, uint32_t n)
{
	uint32_t prod = _kvb_load_relaxed(&r->shm->prod);

	if (_kvb_ring_prod_free(r, prod, n) < n)
		return 0;
	_kvb_ring_copy_in(r, prod, src, n);
	_kvb_store_release(&r->shm->prod, prod + n);
	return n;
}

/* Consumer: entries available, refreshing the cached producer index. */
static inline uint32_t _kvb_ring_cons_avail(struct kvb_ring *r, uint32_t cons,
					    uint32_t want)
{
	uint32_t avail = r->cached - cons;

	/* re-check a cached index that was corrupt when last read */
	if (avail < want || avail > r->entries) {
		/* pairs with the producer's store-release of prod */
		r->cached = _kvb_load_acquire(&r->shm->prod);
		avail = r->cached - cons;
		/* a corrupt producer index must not make us read garbage */
		if (avail > r->entries)
			avail = 0;
	}
	return avail;
}

/*
 * Dequeue up to n entries into `dst` (burst). Returns how many (0..n).
 * Single consumer.
 */
static inline uint32_t kvb_ring_dequeue_burst(struct kvb_ring *r, void *dst,
					      uint32_t n)
{
	uint32_t cons = _kvb_load_relaxed(&r->shm->cons);
	uint32_t avail = _kvb_ring_cons_avail(r, cons, n);

	if (n > avail)
		n = avail;
	if (n == 0)
		return 0;
	_kvb_ring_copy_out(r, cons, dst, n);
	/* pairs with the producer's load-acquire of cons */
	_kvb_store_release(&r->shm->cons, cons + n);
	return n;
}

/* Dequeue exactly n entries or none (bulk). Returns n or 0. */
static inline uint32_t kvb_ring_dequeue_bulk(struct kvb_ring *r, void *dst,
					     uint32_t n)
{
	uint32_t cons = _kvb_load_relaxed(&r->shm->cons);

	if (_kvb_ring_cons_avail(r, cons, n) < n)
		return 0;
	_kvb_ring_copy_out(r, cons, dst, n);
	_kvb_store_release(&r->shm->cons, cons + n);
	return n;
}

/* Entries currently queued, as seen by either side (a snapshot). */
static inline uint32_t kvb_ring_count(const struct kvb_ring *r)
{
	uint32_t p = _kvb_load_acquire(&r->shm->prod);
	uint32_t c = _kvb_load_acquire(&r->shm->cons);
	uint32_t n = p - c;

	return n > r->entries ? r->entries : n;
}

#endif /* KVB_SHM_RING_H */

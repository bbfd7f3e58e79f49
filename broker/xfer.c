/* SPDX-License-Identifier: MIT */
#include "xfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * The slot table (~7.5 MiB) is faulted in up front: slots are handed out
 * round robin (a handle is reused as late as possible), so its first lap
 * would otherwise take a page fault every ~9 transfer opens on the
 * broker's loop, all through its first 16384 transfers: 0.5 % of all
 * samples (perf, kvbench's large-block workload at 8 workers, dev VM, where
 * a first touch costs ~14 us a page), none with the table populated.
 */
static size_t slots_bytes(void)
{
	return (size_t) KVB_MAX_XFERS * sizeof(struct kvb_xfer);
}

int kvb_xfers_init(struct kvb_xfers *t)
{
	void *v;

	memset(t, 0, sizeof(*t));
	t->nbuckets = 8192;
	v = mmap(NULL, slots_bytes(), PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	t->v = v == MAP_FAILED ? NULL : v;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	t->active = calloc(KVB_MAX_XFERS, sizeof(*t->active));
	if (!t->v || !t->buckets || !t->active) {
		kvb_xfers_fini(t);
		return -ENOMEM;
	}
	t->free_hint = 1;
	return 0;
}

void kvb_xfers_fini(struct kvb_xfers *t)
{
	/* Transfers still open at shutdown (a detached rank's transfers that
	 * the node keeps for its other ranks) give back their cross-node
	 * state; by now rx_ctx is NULL, so this only frees memory. */
	for (uint32_t i = 0; t->v && t->active && i < t->nactive; i++) {
		struct kvb_xfer *x = &t->v[t->active[i]];

		if (x->rx && t->rx_free)
			t->rx_free(t->rx_ctx, x->rx);
		x->rx = NULL;
	}
	t->nactive = 0;
	if (t->v)
		munmap(t->v, slots_bytes());
	free(t->buckets);
	free(t->active);
	t->v = NULL;
	t->buckets = t->active = NULL;
}

uint64_t kvb_xfer_hash(uint32_t worker, const char *id, size_t len)
{
	uint64_t h = 1469598103934665603ull;
	size_t i;

	for (i = 0; i < 4; i++) {
		h ^= (worker >> (8 * i)) & 0xff;
		h *= 1099511628211ull;
	}
	for (i = 0; i < len; i++) {
		h ^= (unsigned char) id[i];
		h *= 1099511628211ull;
	}
	return h;
}

struct kvb_xfer *kvb_xfer_find(struct kvb_xfers *t, uint32_t worker,
			       const char *id, size_t len)
{
	uint64_t h = kvb_xfer_hash(worker, id, len);
	uint32_t s = t->buckets[h % t->nbuckets];

	for (; s; s = t->v[s].hnext) {
		struct kvb_xfer *x = &t->v[s];

		if (x->hash == h && x->worker == worker &&
		    strlen(x->id) == len && !memcmp(x->id, id, len))
			return x;
	}
	return NULL;
}

_Static_assert(
	(KVB_TERMINAL_LRU & (KVB_TERMINAL_LRU - 1)) == 0 &&
		KVB_TERMINAL_LRU < 65536,
	"the LRU index masks with KVB_TERMINAL_LRU and links entries + 1 "
	"in 16 bits");

/* The LRU index's bucket of a hash (KVB_TERMINAL_LRU is a power of two). */
static uint32_t lru_bucket(uint64_t hash)
{
	return (uint32_t) (hash ^ (hash >> 32)) & (KVB_TERMINAL_LRU - 1);
}

int kvb_xfer_is_terminal(const struct kvb_xfers *t, uint32_t worker,
			 uint64_t hash)
{
	for (uint32_t e = t->lru_head[lru_bucket(hash)]; e;
	     e = t->lru_chain[e - 1])
		if (t->lru_hash[e - 1] == hash &&
		    t->lru_worker[e - 1] == worker)
			return 1;
	return 0;
}

/* Remember (worker, hash) as ended, in place of the oldest entry. */
static void lru_add(struct kvb_xfers *t, uint32_t worker, uint64_t hash)
{
	uint32_t i = t->lru_next;
	uint16_t *pp;

	if (i < t->lru_fill) {
		/* unlink the entry this one replaces */
		pp = &t->lru_head[lru_bucket(t->lru_hash[i])];
		while (*pp && *pp != i + 1)
			pp = &t->lru_chain[*pp - 1];
		if (*pp)
			*pp = t->lru_chain[i];
	} else {
		t->lru_fill = i + 1;
	}
	t->lru_hash[i] = hash;
	t->lru_worker[i] = worker;
	pp = &t->lru_head[lru_bucket(hash)];
	t->lru_chain[i] = *pp;
	*pp = (uint16_t) (i + 1);
	t->lru_next = (i + 1) % KVB_TERMINAL_LRU;
}

static void uncharge(struct kvb_xfers *t, struct kvb_xfer *x)
{
	uint32_t slot = x->charge % KVB_XFER_WSLOTS;

	if (x->charge && t->charged_id[slot] == x->charge && t->charged[slot])
		t->charged[slot]--;
	x->charge = 0;
}

void kvb_xfer_charge(struct kvb_xfers *t, struct kvb_xfer *x, uint32_t worker)
{
	uint32_t slot = worker % KVB_XFER_WSLOTS;

	if (x->charge == worker)
		return;
	uncharge(t, x);
	if (t->charged_id[slot] != worker) {
		t->charged_id[slot] = worker;
		t->charged[slot] = 0;
	}
	t->charged[slot]++;
	x->charge = worker;
}

uint32_t kvb_xfers_charged(const struct kvb_xfers *t, uint32_t worker)
{
	uint32_t slot = worker % KVB_XFER_WSLOTS;

	return t->charged_id[slot] == worker ? t->charged[slot] : 0;
}

struct kvb_xfer *kvb_xfer_open(struct kvb_xfers *t, uint32_t worker,
			       const char *id, size_t len, int64_t deadline_ns,
			       int *err)
{
	struct kvb_xfer *x;
	uint64_t h;
	uint32_t i, s, b;

	if (len == 0 || len > KVB_XFER_ID_MAX || memchr(id, 0, len)) {
		*err = -EINVAL;
		return NULL;
	}
	x = kvb_xfer_find(t, worker, id, len);
	if (x)
		return x;
	h = kvb_xfer_hash(worker, id, len);
	if (kvb_xfer_is_terminal(t, worker, h)) {
		*err = -ESTALE;
		return NULL;
	}
	for (i = 0; i < KVB_MAX_XFERS - 1; i++) {
		s = 1 + (t->free_hint - 1 + i) % (KVB_MAX_XFERS - 1);
		if (!t->v[s].used)
			break;
	}
	if (i == KVB_MAX_XFERS - 1) {
		*err = -ENOSPC;
		return NULL;
	}
	x = &t->v[s];
	{
		uint16_t gen = (uint16_t) (x->gen + 1);

		memset(x, 0, sizeof(*x));
		x->gen = gen ? gen : 1;
	}
	x->used = 1;
	memcpy(x->id, id, len);
	x->id[len] = '\0';
	x->hash = h;
	x->worker = worker;
	x->deadline_ns = deadline_ns;
	x->opened_ns = mono_ns();
	b = (uint32_t) (h % t->nbuckets);
	x->hnext = t->buckets[b];
	t->buckets[b] = s;
	x->active_pos = t->nactive;
	t->active[t->nactive++] = s;
	t->free_hint = s + 1;
	kvb_xfer_charge(t, x, worker);
	return x;
}

struct kvb_xfer *kvb_xfer_get(struct kvb_xfers *t, uint32_t handle,
			      uint32_t worker)
{
	uint32_t s = handle & 0xffffu;
	struct kvb_xfer *x;

	if (s == 0 || s >= KVB_MAX_XFERS)
		return NULL;
	x = &t->v[s];
	if (!x->used || x->gen != (handle >> 16) || x->worker != worker)
		return NULL;
	return x;
}

void kvb_xfer_end(struct kvb_xfers *t, struct kvb_xfer *x)
{
	uint32_t s = (uint32_t) (x - t->v);
	uint32_t *pp = &t->buckets[x->hash % t->nbuckets];
	uint32_t last;
	uint16_t gen = x->gen;

	while (*pp && *pp != s)
		pp = &t->v[*pp].hnext;
	if (*pp)
		*pp = x->hnext;
	last = t->active[--t->nactive];
	t->active[x->active_pos] = last;
	t->v[last].active_pos = x->active_pos;
	lru_add(t, x->worker, x->hash);
	uncharge(t, x);
	if (x->rx && t->rx_free)
		t->rx_free(t->rx_ctx, x->rx);
	memset(x, 0, sizeof(*x));
	x->gen = gen;
}

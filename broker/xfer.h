/* SPDX-License-Identifier: MIT */
/*
 * The transfer table: transfer-id strings interned per worker to small
 * handles ((generation << 16) | slot), their state, deadlines, and the LRU of
 * the last KVB_TERMINAL_LRU ids that ended (a late message or re-open for one
 * of them is refused, as docs/protocol.md says).
 */
#ifndef KVB_BROKER_XFER_H
#define KVB_BROKER_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* KVB_MAX_XFERS: proto.h */
#define KVB_TERMINAL_LRU   4096u
#define KVB_XFER_MAX_DESTS 32u
#define KVB_XFER_WSLOTS	   4096u /* worker slots (id & 0xfff) */

struct kvb_xfer {
	char id[KVB_XFER_ID_MAX + 1];
	uint64_t hash;
	uint32_t worker; /* owner's worker slot */
	uint32_t hnext;	 /* hash chain (slot), 0 = end */
	uint32_t active_pos;
	uint16_t gen;
	uint8_t used;
	uint8_t sealed;
	uint32_t expected; /* from the seal */
	uint32_t submitted, completed, failed;
	int32_t first_err;
	uint64_t seal_tag;
	int64_t deadline_ns;
	int64_t opened_ns; /* created at (CLOCK_MONOTONIC): age, latency */
	uint32_t ndests;   /* workers whose regions this transfer wrote */
	uint32_t dests[KVB_XFER_MAX_DESTS];
	uint8_t opened;	      /* the owner opened it (not only a message) */
	uint32_t charge;      /* the worker whose share it counts in */
	struct kvb_rxfer *rx; /* cross-node state (heap), NULL = local */
	/*
	 * Clocks (docs/deadlines.md): deadline_ns above (the whole transfer,
	 * from the open); the stall clock runs once anything happened (an op
	 * submitted or completed, a peer's notification): no progress for
	 * stall_ms fails it. progress counts events; the timer notes when it
	 * last changed (progress_ns, 0 = nothing happened yet: the transfer
	 * only waits its turn). stall_ms: 0 = the broker's. (The defer clock
	 * is cross-node state: kvb_rxfer.)
	 */
	uint32_t stall_ms;
	uint32_t progress, progress_seen;
	int64_t progress_ns;
	/*
	 * A failing transfer is reported only once no byte of it can still
	 * land (closing: no new op accepted, queued ones dropped; the final
	 * completion waits for the ones posted). inbound: ops of other
	 * workers' transfers of the same id writing into this worker's
	 * regions, in flight; dest_xfer[i]: their entry at dests[i].
	 */
	uint8_t closing;
	uint8_t tag_set; /* a seal or an abort gave seal_tag */
	int32_t close_err;
	uint32_t inbound;
	/* closing, cross-node D: inbound counts P writers asked to stop (a
	 * release); their write_done / kvb_write_failed says their writes
	 * ended. Waited for until fence_ns at most (0 = not waiting). */
	int64_t fence_ns;
	uint32_t dest_xfer[KVB_XFER_MAX_DESTS];
	/* failed before its seal, the failure held for the worker (the
	 * extension's: a cross-node transfer whose peer's handshake failed):
	 * its one completion carries it, at its seal or abort (that call's
	 * tag) or at its deadline; 0 = none */
	int32_t held_err;
};

/* Nothing of x in flight: its own ops and the ones writing into it. */
static inline int kvb_xfer_drained(const struct kvb_xfer *x)
{
	return !x->inbound && x->completed + x->failed >= x->submitted;
}

/* An extension's state of a transfer (x->rx): the engine only keeps the
 * pointer; the table frees it with rx_free below. */
struct kvb_rxfer;

struct kvb_xfers {
	struct kvb_xfer *v; /* KVB_MAX_XFERS slots, slot 0 unused */
	uint32_t *buckets;  /* hash heads */
	uint32_t nbuckets;
	uint32_t *active; /* slots in use, unordered */
	uint32_t nactive;
	uint32_t free_hint;
	uint64_t lru_hash[KVB_TERMINAL_LRU];
	uint32_t lru_worker[KVB_TERMINAL_LRU];
	uint32_t lru_next;
	uint32_t lru_fill; /* entries written so far, up to KVB_TERMINAL_LRU */
	/* a hash index over the LRU (entry + 1, 0 = end of chain), so that a
	 * lookup does not scan all of it on every transfer open */
	uint16_t lru_head[KVB_TERMINAL_LRU];
	uint16_t lru_chain[KVB_TERMINAL_LRU];
	/* entries counted in each worker slot's share, for the worker id
	 * charged_id[slot] (a new worker in the slot starts from 0) */
	uint32_t charged[KVB_XFER_WSLOTS];
	uint32_t charged_id[KVB_XFER_WSLOTS];
	/* frees an entry's rx when it ends (NULL: no entry has one); set
	 * with the engine's hooks */
	void (*rx_free)(void *ctx, struct kvb_rxfer *rx);
	void *rx_ctx;
};

int kvb_xfers_init(struct kvb_xfers *t);
void kvb_xfers_fini(struct kvb_xfers *t);

/* 64-bit FNV-1a of (worker, id). */
uint64_t kvb_xfer_hash(uint32_t worker, const char *id, size_t len);

/* Find the live transfer of `worker` named id; NULL if none. */
struct kvb_xfer *kvb_xfer_find(struct kvb_xfers *t, uint32_t worker,
			       const char *id, size_t len);

/*
 * Find or create. Returns the entry, or NULL with *err = -ESTALE (id is in
 * the terminal LRU), -ENOSPC (table full), -EINVAL (bad id).
 */
struct kvb_xfer *kvb_xfer_open(struct kvb_xfers *t, uint32_t worker,
			       const char *id, size_t len, int64_t deadline_ns,
			       int *err);

/* By handle, checking the owner; NULL if stale, unknown or not owned. */
struct kvb_xfer *kvb_xfer_get(struct kvb_xfers *t, uint32_t handle,
			      uint32_t worker);

static inline uint32_t kvb_xfer_handle(const struct kvb_xfers *t,
				       const struct kvb_xfer *x)
{
	return ((uint32_t) x->gen << 16) | (uint32_t) (x - t->v);
}

/*
 * Quotas: every entry counts in one worker's share, the opener's at first.
 * kvb_xfer_charge moves x to worker's share (an entry another worker's
 * writes made, once its owner opens it); kvb_xfers_charged says how many
 * entries count in worker's share now.
 */
void kvb_xfer_charge(struct kvb_xfers *t, struct kvb_xfer *x, uint32_t worker);
uint32_t kvb_xfers_charged(const struct kvb_xfers *t, uint32_t worker);

/* Remove a transfer that ended; remembers its id in the terminal LRU. */
void kvb_xfer_end(struct kvb_xfers *t, struct kvb_xfer *x);

/* Is (worker, id) among the last KVB_TERMINAL_LRU ended transfers? */
int kvb_xfer_is_terminal(const struct kvb_xfers *t, uint32_t worker,
			 uint64_t hash);

/* A transfer is complete when sealed and every expected op finished. */
static inline int kvb_xfer_complete(const struct kvb_xfer *x)
{
	return x->sealed && x->completed + x->failed >= x->expected &&
	       kvb_xfer_drained(x);
}

#endif

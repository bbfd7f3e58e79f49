/* SPDX-License-Identifier: MIT */
/*
 * Per-worker shared segment: header, submission ring (worker -> broker),
 * completion ring (broker -> worker), wake words. Created by the broker as a
 * memfd (nothing named in /dev/shm, nothing left behind by a crash) and handed
 * to the worker over the Unix socket with SCM_RIGHTS.
 *
 *   0      struct kvb_seg_hdr (256 bytes)
 *   sq_off struct kvb_ring_shm + sq_entries slots of struct kvb_sqe
 *   cq_off struct kvb_ring_shm + cq_entries slots of struct kvb_cqe
 */
#ifndef KVB_SHM_SEGMENT_H
#define KVB_SHM_SEGMENT_H

#include "ring.h"

#define KVB_SEG_MAGIC	0x4b564253u /* "KVBS" */
#define KVB_SEG_VERSION 1u

/* broker_state values */
enum { KVB_BROKER_RUNNING = 1, KVB_BROKER_STOPPING = 2 };

struct kvb_seg_hdr {
	uint32_t magic;
	uint32_t version;
	uint64_t seg_size;
	uint32_t sq_off;
	uint32_t sq_entries;
	uint32_t cq_off;
	uint32_t cq_entries;
	uint32_t worker_id;
	uint32_t pad0[7]; /* fields end at 36: pad to the wake line at 64 */
	/*
	 * Set by the broker before it sleeps; a worker that publishes entries
	 * and then sees it set writes the broker's eventfd (io_uring SQPOLL
	 * NEED_WAKEUP pattern).
	 */
	alignas(KVB_CACHELINE) _Atomic uint32_t broker_sleeping;
	_Atomic uint32_t broker_state;
	/*
	 * Set by the broker while it owes this worker completions that did
	 * not fit its completion ring (its overflow list). A worker that
	 * reaps (makes room) and then sees it and broker_sleeping set writes
	 * the broker's eventfd, so that the rest moves at once.
	 */
	_Atomic uint32_t cq_backlog;
	/*
	 * Set by a worker blocked in kvb_wait, to the number of completions
	 * it waits for (kvb_wait_min; 0: not waiting); the broker writes the
	 * worker's eventfd after publishing completions when the ring holds
	 * that many.
	 */
	alignas(KVB_CACHELINE) _Atomic uint32_t worker_waiting;
	/*
	 * Counted by the worker (the broker only reads it, for stats): sleeps
	 * in kvb_wait that ended on their timeout with a completion already
	 * there, i.e. a wakeup the broker should have sent and did not.
	 */
	alignas(KVB_CACHELINE) _Atomic uint32_t worker_late_wakes;
	uint32_t pad1;
	/*
	 * Also the worker's, read for stats: sleeps in kvb_wait (poll()
	 * calls, each ended by a wakeup, the timeout or the 1 s liveness
	 * check), and the ns all kvb_wait calls spent busy-polling.
	 */
	_Atomic uint64_t worker_sleeps;
	_Atomic uint64_t worker_spin_ns;
	uint8_t pad2[40];
};

_Static_assert(sizeof(struct kvb_seg_hdr) == 256, "segment header size");
_Static_assert(offsetof(struct kvb_seg_hdr, broker_sleeping) == 64,
	       "wake line");
_Static_assert(offsetof(struct kvb_seg_hdr, worker_waiting) == 128,
	       "wait line");
_Static_assert(offsetof(struct kvb_seg_hdr, worker_late_wakes) == 192,
	       "worker's counter line");
_Static_assert(offsetof(struct kvb_seg_hdr, worker_spin_ns) == 208,
	       "worker's counters");

/* Submission opcodes */
enum kvb_sq_op {
	KVB_OP_NOP = 0,
	KVB_OP_WRITE = 1, /* local region -> peer region */
	KVB_OP_READ = 2,  /* peer region -> local region */
	KVB_OP_SEAL = 3,  /* transfer expects `len` writes in all */
	KVB_OP_ABORT = 4, /* fail the transfer with -ECANCELED */
	KVB_OP_LAYER = 5, /* cross-node: write (or read) one layer's blocks */
};

/* Submission flags */
#define KVB_SQE_F_UNSIGNALED 0x01 /* no completion on success */

/* 64-byte submission entry. All fields little-endian host order. */
struct kvb_sqe {
	uint8_t opcode;
	uint8_t flags;
	uint16_t layer;
	uint32_t transfer;    /* transfer handle from KVB_MSG_OPEN */
	uint32_t region;      /* local region id */
	uint32_t peer_region; /* remote region id */
	uint64_t offset;      /* into the local region */
	uint64_t peer_offset; /* into the peer region */
	uint64_t len;	      /* bytes; for SEAL: expected write count */
	uint64_t tag;	      /* echoed in the completion */
	uint32_t peer;	      /* peer node, 0 = this node */
	uint32_t rsvd[3];
};
_Static_assert(sizeof(struct kvb_sqe) == KVB_RING_SLOT, "sqe is one slot");

/* Completion opcodes: what completed */
enum kvb_cq_op {
	KVB_CQ_DESC = 1,     /* one WRITE/READ descriptor */
	KVB_CQ_TRANSFER = 2, /* a sealed transfer ended (tag = seal tag) */
	KVB_CQ_SHUTDOWN = 3, /* broker is going away */
};

struct kvb_cqe {
	uint64_t tag;
	uint64_t bytes;
	int32_t status; /* 0 or -errno */
	uint32_t transfer;
	uint8_t opcode;
	uint8_t pad[7];
	uint64_t rsvd[4];
};
_Static_assert(sizeof(struct kvb_cqe) == KVB_RING_SLOT, "cqe is one slot");

struct kvb_seg {
	struct kvb_seg_hdr *hdr;
	size_t size;
	struct kvb_ring sq;
	struct kvb_ring cq;
};

/* Bytes a segment with these ring sizes needs (page-rounded). */
size_t kvb_seg_bytes(uint32_t sq_entries, uint32_t cq_entries);

/*
 * Lay out a fresh segment in `mem` (kvb_seg_bytes() long) and build the
 * creator's view in `seg`. Returns 0 or -EINVAL.
 */
int kvb_seg_format(struct kvb_seg *seg, void *mem, size_t size,
		   uint32_t sq_entries, uint32_t cq_entries,
		   uint32_t worker_id);

/*
 * Check a mapped segment (magic, version, offsets inside `size`, rings) and
 * build a view. Returns 0, -EPROTO (bad magic/version) or -EINVAL.
 */
int kvb_seg_attach(struct kvb_seg *seg, void *mem, size_t size);

#endif /* KVB_SHM_SEGMENT_H */

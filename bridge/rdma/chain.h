/* SPDX-License-Identifier: MIT */
/*
 * Per-QP send-queue bookkeeping for the rdma transport: prebuilt
 * ibv_send_wr/ibv_sge arrays, chain building with merging, the signaling
 * policy, send-queue credits, retirement of completed chains and the mapping
 * of a work-completion error onto the ops it covers.
 *
 * Pure logic: this file never calls into libibverbs (it only uses its types),
 * so it is unit-tested on machines without an RDMA device.
 *
 * Lifecycle of a work request (free-running u32 sequence numbers):
 *
 *   tail <= done <= head
 *   [tail, done)  retired (status known), cookies not yet handed out
 *   [done, head)  posted, owned by the hardware, each holds one credit
 *
 * wr_id of every WR = qp index (bits 48..63) | generation (32..47) | seq.
 * The generation changes on every reset, so completions of an earlier
 * incarnation of the QP (flushes still in the CQ) are recognised and dropped.
 *
 * Not thread-safe: one owner (the broker's loop) per chain.
 */
#ifndef KVB_BRIDGE_RDMA_CHAIN_H
#define KVB_BRIDGE_RDMA_CHAIN_H

#include <stdint.h>
#include <infiniband/verbs.h>

#include "transport.h"

#define KVB_CHAIN_MERGE_MAX_DEFAULT 64
#define KVB_CHAIN_WR_BYTES_DEFAULT  (1ull << 30)

struct kvb_chain_params {
	uint32_t depth;	       /* send-queue depth = credits, >= 1 */
	int post_batch;	       /* max WRs per chain; <= 0 means up to depth */
	uint32_t signal_every; /* >= 1 signaled per N WRs; 0 = depth / 2 */
	uint32_t merge_max;    /* max ops merged into one WR; 0 = 64 */
	uint64_t wr_max_bytes; /* max bytes in one WR; 0 = 1 GiB */
	uint32_t max_sge;      /* SGEs per WR (the QP's max_send_sge); 0 = 1 */
	uint16_t qp_index;     /* stored in wr_id bits 48..63 */
};

/* Bookkeeping of one posted WR (a ring slot). */
struct kvb_chain_wr {
	uint32_t ck_first; /* first cookie (index into the cookie ring) */
	uint32_t ck_count; /* ops merged into this WR, >= 1 */
	int32_t status;	   /* 0 or -errno once retired */
	uint32_t signaled;
	uint64_t bytes;
};

/* Counters of one QP; see kvb_rdma_qp_stats(). */
struct kvb_chain_stats {
	uint64_t chains;	/* committed chains (doorbells) */
	uint64_t wrs;		/* WRs posted */
	uint64_t ops;		/* ops posted (>= wrs when merged) */
	uint64_t bytes;		/* bytes posted */
	uint64_t signaled;	/* signaled WRs posted */
	uint64_t credit_stalls; /* times work had to wait for credit */
	uint64_t cqes;		/* work completions consumed */
	uint64_t stale_cqes;	/* completions of an old generation, dropped */
	uint64_t wc_errors;	/* error completions that failed live WRs */
	uint64_t failed_ops;	/* ops completed with a non-zero status */
	uint64_t resets;	/* kvb_chain_reset() calls */
};

struct kvb_chain {
	struct kvb_chain_params p;
	uint32_t max_wrs; /* WRs per chain: min(post_batch, depth) */
	uint32_t credits; /* free send-queue slots */
	uint32_t broken;  /* set by an error until kvb_chain_reset() */
	uint32_t stalled; /* a stall was counted, no credit came back yet */
	uint16_t gen;

	uint32_t head, done, tail; /* WR sequence numbers, see above */
	uint64_t inflight_bytes;   /* bytes of the live WRs [done, head) */
	uint32_t wr_mask;
	struct kvb_chain_wr *wri;

	uint32_t ck_head, ck_tail; /* cookie ring: appended / handed out */
	uint32_t ck_mask;
	uint64_t *ck;

	/* The prebuilt chain: wr[i].sg_list == &sge[i * max_sge]; staged WRs
	 * valid. */
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	uint32_t staged;     /* WRs in the built, not yet committed chain */
	uint32_t staged_ops; /* ops those WRs cover */

	struct kvb_chain_stats st;
};

/*
 * Allocate the arrays of one QP's chain. Returns 0, -EINVAL on bad params or
 * -ENOMEM. Undo with kvb_chain_fini().
 */
int kvb_chain_init(struct kvb_chain *c, const struct kvb_chain_params *p);
void kvb_chain_fini(struct kvb_chain *c);

/*
 * Build one chain from ops[0..n) into c->wr[0..c->staged): merges runs
 * contiguous on both sides (same opcode, lkey and rkey, adjacent addresses)
 * into one WR, and with max_sge > 1 also runs contiguous at the remote side
 * only (a gather list: WRITE from scattered local pieces to one remote
 * range, READ from one remote range into scattered pieces), one SGE per
 * local piece; stops at max_wrs WRs, the credit left, or ring space;
 * signals the last WR and at least one in every signal_every. Nothing is
 * committed.
 *
 * Returns the ops the chain covers (>= 1), 0 when there is no credit at all
 * (a stall, counted), -ENOTCONN when the chain is broken (awaits reset), or
 * -EINVAL / -EFAULT / -EMSGSIZE when ops[0] itself is malformed (bad opcode
 * or missing region / outside its region / longer than wr_max_bytes); a
 * malformed op later in the array just ends the chain before it.
 */
int kvb_chain_build(struct kvb_chain *c, const struct kvb_xop *ops, unsigned n);

/*
 * The same, and the chain also ends before the op that would take its
 * bytes past max_bytes (ops[0] is always taken): how the transport spreads
 * one large chain over the QPs of a peer.
 */
int kvb_chain_build_max(struct kvb_chain *c, const struct kvb_xop *ops,
			unsigned n, uint64_t max_bytes);

/*
 * Commit the first nwr staged WRs (those the hardware took: all of them, or
 * the ones before ibv_post_send's bad_wr). Takes their credits and records
 * their cookies. Returns the ops those WRs cover. If nwr is smaller than the
 * staged count, the last committed WR may be unsignaled: the caller must
 * then move the QP to the error state so everything it holds is flushed.
 */
unsigned kvb_chain_commit(struct kvb_chain *c, unsigned nwr);

/* Bytes covered by the first nwr staged WRs. */
uint64_t kvb_chain_staged_bytes(const struct kvb_chain *c, unsigned nwr);

/* QP index a wr_id belongs to (to route a work completion). */
static inline uint16_t kvb_chain_wr_id_qp(uint64_t wr_id)
{
	return (uint16_t) (wr_id >> 48);
}

/*
 * Account one work completion of this chain. status is 0 or the -errno
 * kvb_chain_wc_errno() gave for its ibv_wc_status.
 *
 * Success: every live WR up to and including it is retired with status 0
 * and its credit returned (only signaled WRs complete, and an RC send queue
 * completes in order, so all earlier unsignaled WRs are done).
 * Error: the WRs before it are retired with 0 (in-order completion: they
 * finished, or their own error would have come first); it fails with
 * `status`; every later live WR fails with -ECANCELED (the QP is in the
 * error state and flushes them). The chain is then broken: building
 * returns -ENOTCONN until kvb_chain_reset().
 * A completion of an earlier generation or of a WR already retired is
 * counted as stale and ignored.
 *
 * Returns the number of ops newly retired.
 */
unsigned kvb_chain_complete(struct kvb_chain *c, uint64_t wr_id,
			    int32_t status);

/*
 * Fail every live WR with `status` (e.g. -ECANCELED when the transport tears
 * the QP down or resets it for a peer's re-handshake) and mark the chain
 * broken. Returns the number of ops failed.
 */
unsigned kvb_chain_fail_all(struct kvb_chain *c, int32_t status);

/*
 * After the QP went through RESET: all credits back, a new generation,
 * building allowed again. Retired cookies not yet reaped stay reapable.
 * Every live WR must have been retired (complete or fail_all) first;
 * returns -EBUSY otherwise, else 0.
 */
int kvb_chain_reset(struct kvb_chain *c);

/* Cookies ready to be handed out (retired, not yet reaped). */
unsigned kvb_chain_ready(const struct kvb_chain *c);

/* Hand out up to max retired cookies with their status. Returns the count. */
unsigned kvb_chain_reap(struct kvb_chain *c, struct kvb_xcqe *out,
			unsigned max);

/* Map an ibv_wc_status to 0 or -errno (see docs/rdma.md for the table). */
int32_t kvb_chain_wc_errno(enum ibv_wc_status st);

#endif /* KVB_BRIDGE_RDMA_CHAIN_H */

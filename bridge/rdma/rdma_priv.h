/* SPDX-License-Identifier: MIT */
/*
 * Internals of the rdma transport shared by rdma.c (device, memory, post,
 * poll) and ep.c (QP state machine, handshake, recovery). Not installed.
 */
#ifndef KVB_BRIDGE_RDMA_PRIV_H
#define KVB_BRIDGE_RDMA_PRIV_H

#include <stdint.h>
#include <sys/random.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "rdma/chain.h"
#include "rdma/conn.h"
#include "rdma/rdma.h"

#define KVB_RDMA_DEPTH_DEFAULT 256
#define KVB_RDMA_CQ_MAX	       (1 << 16)
#define KVB_RDMA_MAX_SLOTS     4096 /* QPs per transport */
#define KVB_RDMA_POLL_BATCH    32
#define KVB_RDMA_RD_ATOM       16
#define KVB_RDMA_FLUSH_WAIT_NS (200 * 1000000ull)
/* a chain spread over a peer's QPs gives each at least this many bytes */
#define KVB_RDMA_STRIPE_MIN (256u << 10)
/* SGEs per WR at most: a gather of local pieces to one remote range (a
 * head split's tokens, scattered P blocks into contiguous D blocks) */
#define KVB_RDMA_SGE_MAX 16u

struct kvb_rdma_qp {
	struct ibv_qp *qp;
	struct kvb_ep *ep;
	struct kvb_chain ch;
	uint32_t psn;	  /* our initial send PSN of this incarnation */
	uint16_t slot;	  /* index into kvb_rdma.slots, in every wr_id */
	uint8_t on_ready; /* queued in kvb_rdma.ready */
};

struct kvb_ep {
	struct kvb_rdma *t;
	struct kvb_ep *next;
	enum kvb_rdma_ep_state state;
	uint64_t token;
	uint32_t epoch;
	struct kvb_rdma_conn peer; /* last peer blob applied (or offer) */
	unsigned nqp;
	unsigned rr;
	struct kvb_rdma_qp qp[KVB_RDMA_MAX_QP];
};

struct kvb_rdma {
	struct kvb_transport base;
	struct kvb_transport_params p;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	/*
	 * Completion events behind wait_fd() (NULL: the device gave no
	 * channel). Only arm() (a caller about to sleep) asks for one, so a
	 * caller that is busy polling pays nothing for them; arm() also
	 * reads the events that came (non-blocking fd) and acks them in
	 * batches.
	 */
	struct ibv_comp_channel *chan;
	int armed;	  /* an event is asked for and has not come */
	unsigned unacked; /* events read, not yet acked */
	int cq_size;
	int cq_used;  /* CQE budget taken by QPs (2 x depth each) */
	uint32_t sge; /* SGEs per WR new QPs get (0: not chosen yet) */
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	union ibv_gid gid;
	uint64_t node;
	struct kvb_ep *eps;
	struct kvb_rdma_qp *slots[KVB_RDMA_MAX_SLOTS];
	uint16_t slot_gen[KVB_RDMA_MAX_SLOTS];
	struct kvb_rdma_qp *ready[KVB_RDMA_MAX_SLOTS];
	unsigned nready;
	int time_posts;
	struct ibv_wc wc[KVB_RDMA_POLL_BATCH];
	/* completions of disconnected endpoints' ops, handed out by poll() */
	struct kvb_xcqe *orphan;
	unsigned norphan, orphan_head, orphan_cap;
	/* asynchronous events (async.c) */
	int async_nb; /* ctx->async_fd is non-blocking: read it */
	struct kvb_rdma_async_stats async; /* counters and port state */
};

#define to_rdma(t) container_of(t, struct kvb_rdma, base)

static inline uint64_t rand64(void)
{
	uint64_t v = 0;

	while (!v)
		if (getrandom(&v, sizeof(v), 0) != sizeof(v))
			v = (uint64_t) (uintptr_t) &v ^ 0x9e3779b97f4a7c15ull;
	return v;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static inline uint32_t rand_psn(void)
{
	return (uint32_t) rand64() & 0xffffff;
}

/* rdma.c */
void _kvb_rdma_ready_push(struct kvb_rdma *r, struct kvb_rdma_qp *q);
void _kvb_rdma_cq_drain(struct kvb_rdma *r);

/* ep.c */
void _kvb_rdma_ep_destroy(struct kvb_rdma *r, struct kvb_ep *ep);
int _kvb_rdma_ep_usable(struct kvb_rdma *r, struct kvb_ep *ep);
int _kvb_rdma_local_info(struct kvb_transport *t, void *blob, size_t *len);
int _kvb_rdma_connect(struct kvb_transport *t, const void *blob, size_t len,
		      struct kvb_ep **out);
void _kvb_rdma_disconnect(struct kvb_transport *t, struct kvb_ep *ep);

#endif /* KVB_BRIDGE_RDMA_PRIV_H */

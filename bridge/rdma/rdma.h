/* SPDX-License-Identifier: MIT */
/*
 * The `rdma` transport (libibverbs RC queue pairs): what the broker and the
 * GPU backend need beyond the ops table of transport.h.
 *
 * Handshake (see docs/rdma.md): local_info() gives an offer without queue
 * pairs; connect() takes any blob of the peer and returns the endpoint it
 * belongs to; kvb_rdma_ep_info() gives the blob of one endpoint to send
 * back. Broker rule, two control messages at most per (re)connection:
 *
 *   initiator: ep = connect(peer's local_info, or NULL/0)   -> ep HALF
 *              send "offer"  = ep_info(ep)
 *   on offer:  ep = connect(offer)                          -> ep READY
 *              send "answer" = ep_info(ep)
 *   on answer: connect(answer)                              -> ep READY
 *
 * Both sides may send offers at once (they cross, both get READY, the
 * answers are then no-ops). After a work-completion error, post() on the
 * endpoint returns -ENOTCONN: the endpoint's QPs were reset with new PSNs
 * and the broker sends ep_info(ep) as an offer again; the peer resets its
 * side on seeing the newer epoch.
 */
#ifndef KVB_BRIDGE_RDMA_RDMA_H
#define KVB_BRIDGE_RDMA_RDMA_H

#include <stdint.h>

#include "transport.h"
#include "rdma/chain.h"

/*
 * reg_mr registers with IBV_ACCESS_LOCAL_WRITE, plus IBV_ACCESS_REMOTE_WRITE
 * / IBV_ACCESS_REMOTE_READ only where mr->flags has KVB_MEM_REMOTE_WRITE /
 * KVB_MEM_REMOTE_READ: a region not offered to peers cannot be reached
 * with its rkey.
 */
extern const struct kvb_transport_ops kvb_rdma_ops;

/* Slot of struct kvb_mr.tpriv[] the rdma transport keeps its ibv_mr in
 * (registered: kvb_transport_tpriv). */
int kvb_rdma_tpriv(void);
#define KVB_RDMA_TPRIV kvb_rdma_tpriv()

/* enum kvb_ep_state of transport.h, for rdma endpoints */
enum kvb_rdma_ep_state {
	/* QPs in INIT, waiting for the peer's blob */
	KVB_RDMA_EP_HALF = KVB_EP_STATE_HALF,
	KVB_RDMA_EP_READY = KVB_EP_STATE_READY, /* QPs in RTS */
	/* reset after an error, needs a re-handshake */
	KVB_RDMA_EP_RESET = KVB_EP_STATE_RESET,
};

/*
 * Connection blob of one endpoint (the offer of a HALF or RESET endpoint, or
 * the answer of a READY one). *len: capacity in, size out. Returns 0,
 * -ENOSPC (with *len = size needed) or -EINVAL.
 * (ops->ep_info.)
 */
int kvb_rdma_ep_info(struct kvb_transport *t, struct kvb_ep *ep, void *blob,
		     size_t *len);

/* enum kvb_rdma_ep_state of ep. */
int kvb_rdma_ep_state(struct kvb_transport *t, struct kvb_ep *ep);

struct kvb_rdma_qp_stats {
	uint32_t qpn;
	uint32_t credits; /* free send-queue slots now */
	uint32_t depth;
	uint32_t in_flight; /* WRs posted, not retired */
	struct kvb_chain_stats chain;
	uint8_t lnic, rnic; /* our NIC, the peer's (several NICs) */
};

/*
 * Counters of QP `i` (0 .. QPs of the endpoint - 1) of an endpoint. Returns 0
 * or -ENOENT. Same thread as post()/poll().
 */
int kvb_rdma_qp_stats(struct kvb_transport *t, struct kvb_ep *ep, unsigned i,
		      struct kvb_rdma_qp_stats *out);

/*
 * Measure the time spent inside ibv_post_send (two CLOCK_MONOTONIC reads
 * per doorbell; off by default). kvb_rdma_post_ns() gives the sum in ns.
 * It also times a random 1 in 16 doorbells with the thread's CPU clock,
 * net of the clock's cost (measured when switched on): stats post_cpu_ns,
 * and post_cpu_wrs, the WRs of those doorbells.
 */
void kvb_rdma_time_posts(struct kvb_transport *t, int on);
uint64_t kvb_rdma_post_ns(struct kvb_transport *t);

/*
 * Register memory given as a dmabuf (a GPU buffer exported by HIP/CUDA):
 * ibv_reg_dmabuf_mr(fd, offset) first, and when the device or kernel cannot
 * (EOPNOTSUPP, ENOSYS, EINVAL, EPROTONOSUPPORT) ibv_reg_mr on mr->addr,
 * which works where a peer-memory module maps GPU memory. Fills
 * mr->lkey/rkey and mr->tpriv[KVB_RDMA_TPRIV]; undo with ops->dereg_mr.
 * Access as for ops->reg_mr: local write, plus remote write / remote read
 * where mr->flags has KVB_MEM_REMOTE_WRITE / KVB_MEM_REMOTE_READ (set
 * flags before registering; they are not looked at again).
 * Returns 0 (registered as a dmabuf), 1 (by address, ibv_reg_mr) or
 * -errno. fd < 0 skips straight to ibv_reg_mr. The caller keeps fd (the
 * MR holds its own reference to the dmabuf: close it when done).
 */
int kvb_rdma_reg_dmabuf(struct kvb_transport *t, struct kvb_mr *mr, int fd,
			uint64_t offset);

/*
 * The devices' asynchronous events (async.c). kvb_rdma_async_fd() is the
 * context's async fd (several NICs: an epoll fd over theirs), non-blocking,
 * readable when events are pending (-1: it could not be made non-blocking;
 * then events are not read).
 * kvb_rdma_async_service() reads and acks up to 64 pending events and
 * returns how many: our port going down makes post() refuse chains with
 * -ENETDOWN until PORT_ACTIVE, DEVICE_FATAL with -ENODEV for good (with
 * several NICs: a NIC down takes no new chains, they go through the next
 * nearest NIC up; post() refuses only when none is up); QP and
 * CQ errors are counted. Each event worth a line goes to `log` (may be
 * NULL) with a KVB_RDMA_LOG_* level. Same thread as post()/poll().
 */
enum {
	KVB_RDMA_LOG_INFO = KVB_TLOG_INFO,
	KVB_RDMA_LOG_WARN = KVB_TLOG_WARN,
	KVB_RDMA_LOG_ERR = KVB_TLOG_ERR
};
typedef kvb_transport_log_fn kvb_rdma_log_fn;

struct kvb_rdma_async_stats {
	uint64_t events;      /* every event read */
	uint64_t port_errors; /* PORT_ERR of our port */
	uint64_t port_active; /* PORT_ACTIVE of our port */
	uint64_t qp_errors;   /* QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, ... */
	uint64_t cq_errors;   /* CQ_ERR (overrun) */
	uint64_t device_fatal;
	int port_down;	 /* now: a PORT_ERR not followed by PORT_ACTIVE */
	int device_dead; /* DEVICE_FATAL came */
};

/*
 * Lines about the NIC choices (a region's nearest NIC at registration, QP
 * budgets) go to log (NULL: none); kvb_rdma_async_service's log is taken
 * when none was set.
 */
void kvb_rdma_set_log(struct kvb_transport *t, kvb_rdma_log_fn log, void *arg);

/* ops->stats_format: the device's state and events (ep NULL), or the
 * per-QP counters of an endpoint (JSON: a list's members) */
size_t kvb_rdma_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			     int json, char *buf, size_t cap);

int kvb_rdma_async_fd(struct kvb_transport *t);
int kvb_rdma_async_service(struct kvb_transport *t, kvb_rdma_log_fn log,
			   void *arg);
/* summed over the NICs; port_down / device_dead: on every NIC */
void kvb_rdma_async_get_stats(struct kvb_transport *t,
			      struct kvb_rdma_async_stats *out);

#endif /* KVB_BRIDGE_RDMA_RDMA_H */

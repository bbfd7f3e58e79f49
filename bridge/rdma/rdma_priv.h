/* SPDX-License-Identifier: MIT */
/*
 * Internals of the rdma transport shared by rdma.c (open, post, poll),
 * nic.c (the devices, memory registration on each, the nearest NIC), ep.c
 * (QP state machine, NIC pairs, handshake, recovery) and async.c (device
 * events). Not installed.
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
#include "rdma/topo.h"
#include "post_cpu.h"

#define KVB_RDMA_DEPTH_DEFAULT 256
#define KVB_RDMA_CQ_MAX	       (1 << 16)
#define KVB_RDMA_MAX_SLOTS     4096 /* QPs per transport */
#define KVB_RDMA_POLL_BATCH    32
#define KVB_RDMA_RD_ATOM       16
#define KVB_RDMA_FLUSH_WAIT_NS (200 * 1000000ull)
/* A QP parked after it failed on a NIC that stayed up (no PORT_ACTIVE
 * since) is reconnected no sooner than this: its NIC's port-down event
 * may still be on its way (soft-RoCE read it 20 ms after the error), or
 * the failure was on the path or the peer's side. */
#define KVB_RDMA_PARK_HOLD_NS (5 * 1000000000ull)
/* a chain spread over a peer's QPs gives each at least this many bytes */
#define KVB_RDMA_STRIPE_MIN (256u << 10)
/* a chain at least this large is spread over the QPs of every NIC pair
 * that can carry it (the region's nearest NIC first); smaller ones stay
 * on the nearest NIC */
#define KVB_RDMA_NIC_STRIPE_MIN (4u << 20)
/* ops rewritten for one NIC pair's keys at a time (several NICs) */
#define KVB_RDMA_RUN_MAX 256
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
	uint8_t lnic;	  /* our NIC (index into kvb_rdma.nics) */
	uint8_t rnic;	  /* the peer's NIC (index into its blob's list) */
	/* not connected at the last handshake (takes no chains): our NIC's
	 * port was down (QP_PARK_LOCAL), or the peer's QP was parked */
	uint8_t parked;
	/* parked after a failure (ep.c qp_park_failed): when, and its NIC's
	 * PORT_ACTIVE count then; 0: parked at a handshake, or not parked */
	uint64_t parked_ns, parked_active;
};

enum { QP_PARK_LOCAL = 1, QP_PARK_PEER = 2 };

struct kvb_ep {
	struct kvb_rdma *t;
	struct kvb_ep *next;
	enum kvb_rdma_ep_state state;
	uint64_t token;
	uint32_t epoch;
	struct kvb_rdma_conn peer; /* last peer blob applied (or offer) */
	unsigned nqp;
	unsigned rr;
	struct kvb_rdma_qp qp[KVB_RDMA_EP_QP_MAX];
};

/*
 * One verbs device (NIC) of the transport: its own PD, CQ, completion
 * channel and async events. NIC 0 alone is what a single-device transport
 * has, as before several NICs existed.
 */
struct kvb_rdma_nic {
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
	int port_num; /* port used */
	int gid_index;
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int async_nb; /* ctx->async_fd is non-blocking: read it */
	struct kvb_rdma_async_stats async; /* counters and port state */
	char name[64];
	int numa;			/* NUMA node, -1 unknown (topo.c) */
	char pci[32];			/* PCI address, "" unknown */
	uint64_t bytes, wrs, doorbells; /* chains posted through it */
	uint64_t regions;		/* regions whose home it is */
	uint64_t moved;			/* chains it took for a down NIC */
	uint64_t qp_refused;		/* connects over its QP budget */
	uint64_t qp_parked;		/* failed QPs parked (ep.c) */
	uint32_t qps, max_qps;		/* QPs now, and the budget */
};

/* A region's registration (kvb_mr.tpriv[KVB_RDMA_TPRIV]): on every NIC */
struct kvb_rdma_reg {
	struct ibv_mr *mr[KVB_NIC_MAX];
	/* the region with NIC i's keys: what chains on NIC i carry */
	struct kvb_mr on[KVB_NIC_MAX];
	uint8_t home;		    /* its nearest NIC */
	uint8_t order[KVB_NIC_MAX]; /* NICs nearest first (home first) */
	char why[160];		    /* why home */
};

static inline int nic_up(const struct kvb_rdma_nic *n)
{
	return !n->async.port_down && !n->async.device_dead;
}

struct kvb_rdma {
	struct kvb_transport base;
	struct kvb_transport_params p;
	struct kvb_rdma_nic nics[KVB_NIC_MAX];
	unsigned nnic;
	/* several NICs: one epoll fd over their completion channels
	 * (wait_fd) and one over their async fds (events_fd); -1 otherwise */
	int wait_epfd, async_epfd;
	struct kvb_topo *topo; /* sysfs topology (NULL: none read) */
	kvb_rdma_log_fn log;   /* lines about NIC choices (may be NULL) */
	void *log_arg;
	uint64_t node;
	struct kvb_ep *eps;
	/* an endpoint may have a parked QP whose NIC is up: poll() resets
	 * each such endpoint once it is idle (_kvb_rdma_reconnect_idle) */
	int reconnect_due;
	struct kvb_rdma_qp *slots[KVB_RDMA_MAX_SLOTS];
	uint16_t slot_gen[KVB_RDMA_MAX_SLOTS];
	struct kvb_rdma_qp *ready[KVB_RDMA_MAX_SLOTS];
	unsigned nready;
	int time_posts;
	struct kvb_post_cpu pcpu; /* sampled CPU timing of the posts */
	struct ibv_wc wc[KVB_RDMA_POLL_BATCH];
	/* completions of disconnected endpoints' ops, handed out by poll() */
	struct kvb_xcqe *orphan;
	unsigned norphan, orphan_head, orphan_cap;
	/* a run of ops with one NIC pair's keys (several NICs) */
	struct kvb_xop xops[KVB_RDMA_RUN_MAX];
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

/* nic.c */
__attribute__((format(printf, 3, 4))) void
_kvb_rdma_say(struct kvb_rdma *r, int level, const char *fmt, ...);
int _kvb_rdma_nics_open(struct kvb_rdma *r, const char *dev_name, char *why,
			size_t why_len);
void _kvb_rdma_nics_close(struct kvb_rdma *r);
int _kvb_rdma_mem_numa(const void *addr);
/* the NIC a region's chains leave from: its home, or the nearest one up
 * (*moved = 1 then); -1 when none is up */
int _kvb_rdma_mr_nic_use(const struct kvb_rdma *r, const struct kvb_mr *mr,
			 int *moved);
int _kvb_rdma_reg_mr(struct kvb_transport *t, struct kvb_mr *mr);
void _kvb_rdma_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr);
int _kvb_rdma_nics(struct kvb_transport *t, struct kvb_transport_nic *out,
		   unsigned max);
int _kvb_rdma_mr_nic(struct kvb_transport *t, const struct kvb_mr *mr,
		     char *why, size_t why_len);
int _kvb_rdma_mr_keys(struct kvb_transport *t, const struct kvb_mr *mr,
		      uint32_t *rkeys, unsigned max, unsigned *home);

/* ep.c */
void _kvb_rdma_ep_destroy(struct kvb_rdma *r, struct kvb_ep *ep);
int _kvb_rdma_ep_usable(struct kvb_rdma *r, struct kvb_ep *ep);
void _kvb_rdma_reconnect_idle(struct kvb_rdma *r);
int _kvb_rdma_local_info(struct kvb_transport *t, void *blob, size_t *len);
int _kvb_rdma_connect(struct kvb_transport *t, const void *blob, size_t len,
		      struct kvb_ep **out);
void _kvb_rdma_disconnect(struct kvb_transport *t, struct kvb_ep *ep);

#endif /* KVB_BRIDGE_RDMA_PRIV_H */

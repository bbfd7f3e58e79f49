/* SPDX-License-Identifier: MIT */
/* The broker's internal state, shared by its .c files. */
#ifndef KVB_BROKER_BROKER_H
#define KVB_BROKER_BROKER_H

#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "options.h"
#include "proto.h"
#include "regions.h"
#include "segment.h"
#include "transport.h"
#include "xfer.h"

/* refusals of a worker's ops logged (the rest only counted) */
#define KVB_REFUSALS_LOGGED 16u

/* worker id = (generation << 12) | slot; slot < 4096 */
#define KVB_WSLOT(id) ((id) &0xfffu)

struct kvb_worker_stats {
	uint64_t submitted, completed, refused, bytes;
};

struct kvb_worker {
	uint32_t id; /* 0 = slot free (pending table: 1 = in use) */
	uint16_t gen;
	uint8_t attached; /* HELLO done */
	uint8_t closing;
	uint8_t asked_stats; /* a STATS request before HELLO (kvbctl) */
	int sock;
	int efd; /* worker's eventfd: we write it to wake kvb_wait */
	uid_t uid;
	pid_t pid;
	uint32_t role, dp_rank, tp_rank, tp_size;
	struct kvb_seg seg;
	void *seg_mem;
	size_t seg_size;
	/* completions that did not fit the CQ ring yet */
	struct kvb_cqe *ovf;
	uint32_t ovf_len, ovf_cap;
	uint8_t cq_dirty;
	struct kvb_ratelimit refuse_rl; /* refusals logged: the first few */
	uint32_t seal_logged;		/* a bad seal count was logged */
	struct kvb_worker_stats st;
	int64_t since;	   /* accepted at (pending: the HELLO deadline) */
	uint32_t inf_used; /* in-flight entries of its descriptors */
	struct kvb_notify *notify; /* cross-node: this worker's notify ports */
	uint32_t *kv_layer;	   /* layer -> region id (kvb_mem_set_kv) */
	uint32_t nkv;
	uint16_t *grant; /* per KV block: holders, fenced (grants.c) */
	uint32_t ngrant;
};

/* A descriptor between drain and completion. */
struct kvb_inflight {
	uint32_t worker; /* worker id */
	uint32_t xfer;	 /* transfer handle */
	uint64_t tag;
	uint64_t bytes;
	uint32_t next;	     /* next merged descriptor (index), 0 = end */
	uint32_t tail;	     /* head only: last of the merged list */
	uint32_t lreg, rreg; /* region ids (refs held) */
	uint32_t group;	     /* cross-node layer op it belongs to, 0 = none */
	uint32_t dxfer;	     /* the destination worker's entry of the id */
	uint32_t downer;     /* ... and that worker (dxfer != 0) */
	uint8_t flags;
	uint8_t used;
};

/* Pending ops for one destination, flushed as chains. */
struct kvb_dest {
	struct kvb_transport *tr;
	struct kvb_ep *ep;
	struct kvb_xop *ops;
	uint32_t n, cap;
	uint8_t queued; /* on the dirty list */
};

#define KVB_INFLIGHT_MAX 65536u

/* transport slots: same-node host copies, same-node GPU copies, and the
 * cross-node transports (destinations indexed by peer) */
enum {
	KVB_TS_HOST = 0,
	KVB_TS_GPU = 1,
	KVB_TS_TCP = 2,
	KVB_TS_RDMA = 3,
	KVB_TS_MAX = 4
};

struct kvb_xnode; /* remote.c */
struct kvb_metrics; /* metrics.h */

/* epoll data of a pre-HELLO connection: tag | index in b->pend */
#define KVB_EP_PENDING_TAG 0x200000000ull

/* epoll tag of every cross-node fd (ZMQ sockets, tcp transport) */
#define KVB_EP_REMOTE 4ull
/* the rdma device's async event fd: kvb_remote_rdma_events() */
#define KVB_EP_RDMA_EVENTS 6ull

struct kvb_broker {
	struct kvb_options opt;
	int epfd, listen_fd, efd, sigfd;
	int stop;
	uid_t uid;
	struct kvb_worker *workers; /* opt.max_workers slots */
	uint32_t nworkers;
	/* connections that have not said HELLO (opt.max_pending): apart
	 * from the worker slots, so that they cannot lock attaches out */
	struct kvb_worker *pend;
	uint32_t npending;
	uint32_t *live; /* slots of attached workers, compact (hot loops) */
	uint32_t nlive;
	uint32_t rr; /* fair-drain start */
	struct kvb_regions regions;
	struct kvb_xfers xfers;
	struct kvb_transport *trs[KVB_TS_MAX]; /* NULL = not available */
	struct kvb_inflight *inf; /* KVB_INFLIGHT_MAX, slot 0 unused */
	uint32_t *inf_free;
	uint32_t inf_nfree;
	struct kvb_dest *dests; /* [transport slot][worker slot] */
	uint32_t *dirty;	/* dest indices with pending ops */
	uint32_t ndirty;
	int64_t next_timer_ns;
	struct kvb_xnode *rm; /* cross-node state, NULL without --host-ip */
	struct kvb_metrics *mx; /* NULL without --metrics-listen */
	struct kvb_ratelimit conn_rl; /* connections past --max-workers */
	struct {
		uint64_t descriptors_submitted, descriptors_completed;
		uint64_t descriptors_refused, bytes;
		uint64_t transfers_done, transfers_failed;
		uint64_t messages_rejected, workers_attached, workers_lost;
		uint64_t sleeps, wakeups;
		/* sleeps that ran to their timeout (>= KVB_LATE_SLEEP_MS)
		 * with a submission already waiting: a lost wakeup */
		uint64_t late_wakeups;
		/* kvb_wait's late wakes of workers that are gone */
		uint64_t worker_late_wakes_gone;
		/* control requests with a valid header (STATS not counted):
		 * each one a round trip that wakes its worker */
		uint64_t ctl_requests;
		/* node-side protection (docs/security.md, "On the node") */
		uint64_t hello_timeouts;  /* closed: no HELLO in time */
		uint64_t pending_evicted; /* closed for a newer one */
		uint64_t hello_refused;	  /* bad identity, rings, duplicate */
		uint64_t duplicate_identity;
		uint64_t ctl_empty;	     /* zero-length control messages */
		uint64_t mem_reg_refused;    /* every MEM_REG refusal */
		uint64_t xfer_quota_refused; /* opens past a worker's share */
		uint64_t inflight_quota_stalls; /* drains held at the share */
		uint64_t undelivered_refused; /* held: completions not reaped */
		uint64_t xfer_notify_refused; /* writes not counted for D */
		/* writes for a transfer whose destination already ended it
		 * (failed, aborted or done): refused, nothing landed */
		uint64_t late_writes_refused;
		/* transfers that failed with ops still in flight: their
		 * completion waited until those drained */
		uint64_t transfers_fenced;
		/* cross-node D: P writers that did not confirm they stopped
		 * within the stall timeout (the transfer ended anyway) */
		uint64_t fences_expired;
	} st;
};

int64_t kvb_now_ns(void);

/* worker.c */
int kvb_worker_accept(struct kvb_broker *b);
void kvb_worker_ctl(struct kvb_broker *b, struct kvb_worker *w);
void kvb_worker_drop(struct kvb_broker *b, struct kvb_worker *w,
		     const char *why);
struct kvb_worker *kvb_worker_by_id(struct kvb_broker *b, uint32_t id);
/* Close connections past their HELLO deadline; called every few ms. */
void kvb_worker_timers(struct kvb_broker *b, int64_t now);

/* grants.c: the KV blocks a cross-node D transfer holds (WRITE mode) and
 * those a failed one left (fenced), so that tcp writes arriving after it
 * failed are refused. take (its open; lifts the fence): 0 or -ENOMEM; drop
 * (its end; failed: fence them); unfence (another D rank of DP rank dp
 * announced them: P may write every such rank now). */
int kvb_grant_take(struct kvb_broker *b, struct kvb_worker *w,
		   const uint32_t *ids, uint32_t n);
void kvb_grant_drop(struct kvb_broker *b, uint32_t worker, const uint32_t *ids,
		    uint32_t n, int failed);
void kvb_grant_unfence(struct kvb_broker *b, uint32_t dp, const uint32_t *ids,
		       uint32_t n);
/* the tcp transport's write gate (kvb_tcp_set_write_gate), arg = b */
int kvb_grant_gate(void *arg, uint32_t region, uint64_t off, uint64_t len);
void kvb_grant_free(struct kvb_worker *w);

/* quota.c (docs/security.md, "On the node"). May w take one more
 * transfer table slot (1) or not (0)? */
int kvb_xfer_room(struct kvb_broker *b, const struct kvb_worker *w);
/* How many of w's descriptors (at most burst) the engine may take now. */
uint32_t kvb_inflight_room(struct kvb_broker *b, struct kvb_worker *w,
			   uint32_t burst);

/* engine.c */
int kvb_engine_init(struct kvb_broker *b);
void kvb_engine_fini(struct kvb_broker *b);
/* One drain + flush + poll round; returns work done (0 = idle). */
unsigned kvb_engine_round(struct kvb_broker *b);
/*
 * Process what worker w's submission ring holds now (not what it adds
 * meanwhile), before one of its control requests that changes what those
 * descriptors name (MEM_DEREG): they were submitted first. Also when w's
 * completions back up (they queue in its overflow list, which grows by
 * the ring's count at most). Stops early when the in-flight table stays
 * full, or when w has --max-undelivered completions waiting (it does not
 * reap); returns how many are left in the ring (0: all taken).
 */
uint32_t kvb_engine_drain_worker(struct kvb_broker *b, struct kvb_worker *w);
/* Deadlines; called every few ms. */
void kvb_engine_timers(struct kvb_broker *b, int64_t now);
/* Queue a completion to a worker (ring or overflow). */
void kvb_complete(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_cqe *c);
/* Wake workers blocked in kvb_wait whose CQ got entries and now holds as
 * many as they wait for. */
void kvb_wake_workers(struct kvb_broker *b);
/* Fail and forget everything of a worker that is going away. */
void kvb_engine_worker_gone(struct kvb_broker *b, struct kvb_worker *w);
/* Region no longer referenced and dead: unmap and free the slot. */
void kvb_region_put(struct kvb_broker *b, struct kvb_region_ent *r);
void kvb_region_kill(struct kvb_broker *b, struct kvb_region_ent *r);

/* The transport that serves a region of this kind (NULL if none). */
static inline struct kvb_transport *kvb_tr_for(struct kvb_broker *b,
					       enum kvb_mem_kind kind)
{
	return b->trs[kind == KVB_MEM_GPU ? KVB_TS_GPU : KVB_TS_HOST];
}

/* gpu.c */
int kvb_broker_gpu_open(struct kvb_broker *b, char *why, size_t why_len);
int kvb_broker_gpu_import(struct kvb_region_ent *r, const void *payload,
			  size_t len);
void kvb_broker_gpu_unimport(struct kvb_region_ent *r);
/* A dmabuf fd covering GPU region r (the caller closes it) and r's offset
 * in it, for ibv_reg_dmabuf_mr; -errno and a reason where the runtime,
 * driver or kernel cannot export one (-ENOTSUP on the host backend). */
int kvb_broker_gpu_dmabuf(const struct kvb_region_ent *r, int *fd,
			  uint64_t *offset, char *why, size_t why_len);

/* worker.c: reply to a control request (deferred replies, remote.c) */
void kvb_worker_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		      int status);

/* engine.c, for remote.c */
uint32_t kvb_inflight_alloc(struct kvb_broker *b);
void kvb_complete_inflight(struct kvb_broker *b, uint32_t idx, int status);
int kvb_dest_append(struct kvb_broker *b, uint32_t di,
		    const struct kvb_xop *op);
void kvb_post_cqe(struct kvb_broker *b, uint32_t worker, uint8_t op,
		  uint64_t tag, int32_t status, uint64_t bytes, uint32_t xfer);
void kvb_xfer_finish(struct kvb_broker *b, struct kvb_xfer *x, int status);
void kvb_xfer_maybe_finish(struct kvb_broker *b, struct kvb_xfer *x);
void kvb_xfer_account(struct kvb_broker *b, uint32_t handle, uint32_t worker,
		      int status);

/* remote.c: the cross-node bridge (all no-ops when b->rm is NULL) */
int kvb_remote_init(struct kvb_broker *b);
void kvb_remote_fini(struct kvb_broker *b);
/* Drain notify, handshake and peer sockets; bounded. */
void kvb_remote_service(struct kvb_broker *b);
/* Issue the layer ops that waited for in-flight room, if there is room
 * now (cheap when none waits). */
void kvb_remote_retry_starved(struct kvb_broker *b);
/* Read the rdma device's events (port down / up, QP errors): logged,
 * counted; while the port is down rdma chains fail with -ENETDOWN. */
void kvb_remote_rdma_events(struct kvb_broker *b);
void kvb_remote_timers(struct kvb_broker *b, int64_t now);
int kvb_remote_worker_attached(struct kvb_broker *b, struct kvb_worker *w);
void kvb_remote_worker_gone(struct kvb_broker *b, struct kvb_worker *w);
/* Control requests: 1 = reply deferred (sent later), else status. */
int kvb_remote_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_mem_kv *m);
int kvb_remote_peer_req(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_msg_peer *m);
int kvb_remote_xopen(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_msg_xopen *m, uint32_t len,
		     uint32_t *handle);
/* KVB_OP_LAYER from a worker's ring (already counted as submitted) */
void kvb_remote_layer(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e);
/* engine.c: refuse a layer op: completed with rc, counted (broker and
 * worker), logged within the worker's refusal log budget; the transfer
 * itself is left as it is */
void kvb_layer_refuse(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e, int rc, const char *why);
/* A cross-node transfer is ending with status: notify, fail deferred ops. */
void kvb_remote_xfer_end(struct kvb_broker *b, struct kvb_xfer *x, int status);
/* A failing cross-node transfer: its deferred layer ops fail now (never
 * issued, counted as ended); what is in flight drains before it ends. */
void kvb_remote_xfer_fence(struct kvb_broker *b, struct kvb_xfer *x,
			   int status);
/* Cross-node D in WRITE mode: how many P writers may still write into it
 * (0 for anything else); a failing one asks them to stop and waits. */
uint32_t kvb_remote_xfer_writers(struct kvb_broker *b,
				 const struct kvb_xfer *x);
/* Does it wait for the peer (deferred layer ops: the defer clock runs)? */
int kvb_remote_xfer_deferred(const struct kvb_xfer *x);
/* Its defer clock (ms, 0 = the broker's); -EINVAL for a local transfer. */
int kvb_remote_set_defer(struct kvb_xfer *x, uint32_t defer_ms);
/* Is the transfer complete (cross-node rules)? */
int kvb_remote_xfer_complete(const struct kvb_xfer *x);
/* Group (layer op) bookkeeping for complete_inflight */
void kvb_remote_group_done(struct kvb_broker *b, uint32_t group, int status,
			   uint64_t bytes);
/* Register / unregister a host region with the cross-node transports. */
void kvb_remote_reg(struct kvb_broker *b, struct kvb_region_ent *r);
void kvb_remote_dereg(struct kvb_broker *b, struct kvb_region_ent *r);
/* notify and handshake messages rejected */
uint64_t kvb_remote_rejected(struct kvb_broker *b);
size_t kvb_remote_stats(struct kvb_broker *b, int json, char *buf, size_t cap);

/* stats.c: text or JSON into buf; returns length */
size_t kvb_stats_format(struct kvb_broker *b, int json, char *buf, size_t cap);

#endif

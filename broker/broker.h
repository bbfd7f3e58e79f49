/* SPDX-License-Identifier: MIT */
/* The broker's internal state, shared by its .c files. */
#ifndef KVB_BROKER_BROKER_H
#define KVB_BROKER_BROKER_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

struct kvb_metrics;	 /* metrics.h */
struct kvb_peer_info;	 /* metrics.h */
struct kvb_engine_hooks; /* below */

/* epoll data of a pre-HELLO connection: tag | index in b->pend */
#define KVB_EP_PENDING_TAG 0x200000000ull

/* epoll tag of the extension's fds that need no call of their own
 * (ZMQ sockets, transport completion fds): its service hook drains them */
#define KVB_EP_REMOTE 4ull
/* an extension's fd that needs its event hook (rdma device events) */
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
	/* deadlines of the extension's that the timer passes keep (a count;
	 * while > 0 an idle broker sleeps until the next pass, TIMER_NS,
	 * not a second) */
	uint32_t timers_soon;
	/* the module that extends the engine (cross-node), NULL = none */
	const struct kvb_engine_hooks *hooks;
	void *hooks_ctx;
	struct kvb_metrics *mx;	      /* NULL without --metrics-listen */
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
		/* opens within the share refused for a full table: others
		 * hold entries past the shares of now (until those end) */
		uint64_t xfer_table_full;
		uint64_t inflight_quota_stalls; /* drains held at the share */
		uint64_t undelivered_refused; /* held: completions not reaped */
		uint64_t xfer_notify_refused; /* writes not counted for D */
		/* writes for a transfer whose destination already ended it
		 * (failed, aborted or done): refused, nothing landed */
		uint64_t late_writes_refused;
		/* tcp READs of a P worker's KV blocks that no READ transfer
		 * of it held: refused, nothing sent */
		uint64_t unheld_reads_refused;
		/* transfers that failed with ops still in flight: their
		 * completion waited until those drained */
		uint64_t transfers_fenced;
		/* cross-node D: P writers that did not confirm they stopped
		 * within the stall timeout (the transfer ended anyway) */
		uint64_t fences_expired;
	} st;
};

/* ext.c: CLOCK_MONOTONIC in ns */
int64_t kvb_now_ns(void);

/* worker.c */
int kvb_worker_accept(struct kvb_broker *b);
void kvb_worker_ctl(struct kvb_broker *b, struct kvb_worker *w);
void kvb_worker_drop(struct kvb_broker *b, struct kvb_worker *w,
		     const char *why);
struct kvb_worker *kvb_worker_by_id(struct kvb_broker *b, uint32_t id);
/* Close connections past their HELLO deadline; called every few ms. */
void kvb_worker_timers(struct kvb_broker *b, int64_t now);

/* quota.c (docs/security.md, "On the node"). May w take one more entry
 * of the transfer table, for `what` (its kind of open) of id[0..len)? 0, or
 * -ENOSPC counted (xfer_quota_refused past its share, xfer_table_full
 * within it) and logged. */
int kvb_xfer_admit(struct kvb_broker *b, const struct kvb_worker *w,
		   const char *what, const char *id, uint32_t len);
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
/*
 * Move completions owed to workers (their overflow lists) into the rings
 * that have room now, and wake the workers waiting for them. The broker
 * calls it after announcing its sleep: a worker that reaps meanwhile sees
 * broker_sleeping and cq_backlog and wakes it. Returns how many moved.
 */
unsigned kvb_engine_flush_owed(struct kvb_broker *b);

/* Queue a completion to a worker (ring or overflow). */
void kvb_complete(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_cqe *c);
/* Wake workers blocked in kvb_wait whose CQ got entries and now holds as
 * many as they wait for. */
void kvb_wake_workers(struct kvb_broker *b);
/* Fail and forget everything of a worker that is going away. */
void kvb_engine_worker_gone(struct kvb_broker *b, struct kvb_worker *w);
/* An op in flight touches r (held until kvb_region_put). */
static inline void kvb_region_hold(struct kvb_region_ent *r)
{
	r->refs++;
}
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

/* worker.c: reply to a control request (deferred replies: the hooks) */
void kvb_worker_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		      int status);

/* engine.c: the engine API its extension (bridge/xnode) uses */
uint32_t kvb_inflight_alloc(struct kvb_broker *b);
/* An entry kvb_inflight_alloc() gave (to fill in), and the free entries. */
static inline struct kvb_inflight *kvb_inflight_get(struct kvb_broker *b,
						    uint32_t idx)
{
	return &b->inf[idx];
}
static inline uint32_t kvb_inflight_free(const struct kvb_broker *b)
{
	return b->inf_nfree;
}
/* ext.c: the destination of transport slot ts and index slot (a worker
 * slot, or the extension's peer slot), bound to tr and ep; its index for
 * kvb_dest_append */
uint32_t kvb_dest_bind(struct kvb_broker *b, unsigned ts, uint32_t slot,
		       struct kvb_transport *tr, struct kvb_ep *ep);
/* ext.c: complete the ops queued for that destination (not yet posted)
 * with status */
void kvb_dest_fail(struct kvb_broker *b, unsigned ts, uint32_t slot,
		   int status);
void kvb_complete_inflight(struct kvb_broker *b, uint32_t idx, int status);
int kvb_dest_append(struct kvb_broker *b, uint32_t di,
		    const struct kvb_xop *op);
void kvb_post_cqe(struct kvb_broker *b, uint32_t worker, uint8_t op,
		  uint64_t tag, int32_t status, uint64_t bytes, uint32_t xfer);
void kvb_xfer_finish(struct kvb_broker *b, struct kvb_xfer *x, int status);
void kvb_xfer_maybe_finish(struct kvb_broker *b, struct kvb_xfer *x);
/* finish.c: count one ended op of transfer (handle, worker) (none: handle
 * 0, or it ended already) and end the transfer if that completes it */
/* n ops of x failed with status before they were issued (a module's
 * deferred ops): counted as ended, x is not finished here. */
void kvb_xfer_ops_failed(struct kvb_xfer *x, uint32_t n, int status);

/* A closing x waits for its writers no longer: its fence ends at the next
 * timer round (nothing when it does not wait). */
void kvb_xfer_fence_now(struct kvb_xfer *x);

void kvb_xfer_account(struct kvb_broker *b, uint32_t handle, uint32_t worker,
		      int status);

/* The one completion of an op the extension built (a layer op), and what
 * the engine does with it (kvb_op_complete): the descriptor completion
 * (unless it succeeded and was unsignaled), then the op counted on its
 * transfer. */
struct kvb_op_done {
	uint32_t worker, xfer;
	uint64_t tag, bytes;
	int32_t status;
	uint8_t flags;
};
/* finish.c: for an op the extension completes by itself (one failed before
 * it went out, or issued late from its own events); in the completion
 * path the hooks hand it back to the engine instead (group_done) */
void kvb_op_complete(struct kvb_broker *b, const struct kvb_op_done *d);
/* finish.c: a peer says its writes into x ended (done, or failed with
 * status): one op counted; a writer asked to stop (x->closing) is no
 * longer waited for */
void kvb_xfer_peer_done(struct kvb_broker *b, struct kvb_xfer *x, int status);

/* A write refused because it came after the transfer that held its
 * memory failed (the extension's write gate): late_writes_refused. */
static inline void kvb_count_late_write(struct kvb_broker *b)
{
	b->st.late_writes_refused++;
}

/* engine.c: refuse a layer op: completed with rc, counted (broker and
 * worker), logged within the worker's refusal log budget; the transfer
 * itself is left as it is */
void kvb_layer_refuse(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e, int rc, const char *why);

/* kvbctl regions: what the extension keeps of a region */
struct kvb_region_info {
	uint8_t kv;   /* a KV region (kvb_mem_set_kv) of layer `layer` */
	uint8_t rdma; /* registered with the rdma transport */
	uint32_t layer;
};

/*
 * Hooks: what a module that extends the engine (the cross-node module,
 * bridge/xnode) hands it with kvb_engine_set_hooks(). The engine calls
 * them at the points named below; each one may be NULL. A broker built
 * or started without such a module registers none, and then: layer ops
 * are refused, the cross-node control requests answer -ENOTCONN, every
 * transfer is a same-node one, and the other hooks do nothing.
 */
struct kvb_engine_hooks {
	/* a region was registered / is about to be freed */
	void (*region_added)(struct kvb_broker *b, struct kvb_region_ent *r);
	void (*region_gone)(struct kvb_broker *b, struct kvb_region_ent *r);
	/* a worker attached (0 or -errno: it is dropped) / is going away
	 * (before its transfers end) / its slot is freed (after they ended:
	 * the module lets go of what it keeps for it) */
	int (*worker_attached)(struct kvb_broker *b, struct kvb_worker *w);
	void (*worker_gone)(struct kvb_broker *b, struct kvb_worker *w);
	void (*worker_free)(struct kvb_broker *b, struct kvb_worker *w);
	/* KVB_OP_LAYER from a worker's ring (already counted as submitted):
	 * 1 when it completed at once (*done: the engine posts and counts
	 * it), 0 when taken (queued, deferred) or refused (kvb_layer_refuse) */
	int (*layer_op)(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_sqe *e, struct kvb_op_done *done);
	/* an in-flight entry with a group (a layer op) completed: 1 when it
	 * was the group's last (*done: the layer op's completion, which the
	 * engine posts and counts), else 0. *stale: a slot of the
	 * extension's destinations (a peer) whose queued ops the engine then
	 * fails with -ECONNRESET (0 = none) */
	int (*group_done)(struct kvb_broker *b, uint32_t group, int status,
			  uint64_t bytes, struct kvb_op_done *done,
			  uint32_t *stale);
	/* Transfers with extension state (x->rx): complete by its rules? */
	int (*xfer_complete)(const struct kvb_xfer *x);
	/* ... ending with status (notify the peer, fail deferred ops) */
	void (*xfer_end)(struct kvb_broker *b, struct kvb_xfer *x, int status);
	/* ... failing: deferred ops fail now (their completions posted;
	 * *failed: how many, the engine counts them); the rest drains first.
	 * Returns how many peer writers it asked to stop: the engine waits
	 * for their answers (kvb_xfer_peer_done), its stall timeout at most */
	uint32_t (*xfer_fence)(struct kvb_broker *b, struct kvb_xfer *x,
			       int status, uint32_t *failed);
	/* ... how many peers may still write into it (0: none) */
	uint32_t (*xfer_writers)(struct kvb_broker *b,
				 const struct kvb_xfer *x);
	/* ... waits for the peer (deferred layer ops: the defer clock) */
	int (*xfer_deferred)(const struct kvb_xfer *x);
	/* ... its defer clock (ms, 0 = the broker's); -EINVAL if none */
	int (*set_defer)(struct kvb_xfer *x, uint32_t defer_ms);
	/* ... frees x->rx (the transfer table calls it at kvb_xfer_end) */
	void (*rx_free)(void *ctx, struct kvb_rxfer *rx);
	/* once a round: retry work that waited for in-flight room */
	void (*round)(struct kvb_broker *b);
	/* every few ms */
	void (*timers)(struct kvb_broker *b, int64_t now);
	/* control requests: 1 = reply deferred (sent later), else status */
	int (*mem_kv)(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_mem_kv *m);
	int (*peer_req)(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_msg_peer *m);
	int (*xopen)(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_msg_xopen *m, uint32_t len,
		     uint32_t *handle);
	/* XOPEN_BATCH (len bytes, m->n checked): 0 with res[0..m->n)
	 * filled, -EBADMSG (malformed: the worker is dropped), or a status
	 * every entry gets */
	int (*xopen_batch)(struct kvb_broker *b, struct kvb_worker *w,
			   const struct kvb_msg_xopen_batch *m, uint32_t len,
			   struct kvb_open_result *res);
	/* XEXPECT (len bytes, m->n and m->flags checked): as xopen_batch */
	int (*expect)(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_xexpect *m, uint32_t len,
		      struct kvb_open_result *res);
	/* the daemon's loop: an fd added with kvb_engine_watch_fd() turned
	 * readable (tag), and, after every sleep, its sockets' turn */
	void (*event)(struct kvb_broker *b, uint64_t tag);
	void (*service)(struct kvb_broker *b);
	/* kvbctl stats: messages it rejected, and its section */
	uint64_t (*rejected)(struct kvb_broker *b);
	size_t (*stats)(struct kvb_broker *b, int json, char *buf, size_t cap);
	/* kvbctl peers, metrics: peer slot i (from 1): 0 with *pi filled,
	 * -ENOENT for a free slot, -ERANGE past the last one */
	int (*peer_info)(struct kvb_broker *b, uint32_t i,
			 struct kvb_peer_info *pi);
	/* kvbctl regions: region r's part (*ri zeroed first) */
	void (*region_info)(struct kvb_broker *b,
			    const struct kvb_region_ent *r,
			    struct kvb_region_info *ri);
	/* the daemon shuts down */
	void (*fini)(struct kvb_broker *b);
};

/* ext.c: register the hooks (NULL: none) and their module's state */
void kvb_engine_set_hooks(struct kvb_broker *b,
			  const struct kvb_engine_hooks *h, void *ctx);
/* The module state given with the hooks (NULL: none). */
static inline void *kvb_engine_ctx(const struct kvb_broker *b)
{
	return b->hooks_ctx;
}
/* Does the broker run cross-node (a module registered and --host-ip)? */
static inline int kvb_engine_cross_node(const struct kvb_broker *b)
{
	return b->hooks_ctx && b->opt.xnode;
}
/* ext.c: wake the daemon's loop when fd turns readable; tag is handed to
 * the event hook (KVB_EP_REMOTE: only the service hook runs). 0 or -errno */
int kvb_engine_watch_fd(struct kvb_broker *b, int fd, uint64_t tag);
void kvb_engine_unwatch_fd(struct kvb_broker *b, int fd);

/* The engine's side of the hooks: what runs without them is the
 * same-node broker's answer. */
#define KVB_HOOK(b, name) ((b)->hooks ? (b)->hooks->name : NULL)

static inline void kvb_hook_region_added(struct kvb_broker *b,
					 struct kvb_region_ent *r)
{
	if (KVB_HOOK(b, region_added))
		b->hooks->region_added(b, r);
}

static inline void kvb_hook_region_gone(struct kvb_broker *b,
					struct kvb_region_ent *r)
{
	if (KVB_HOOK(b, region_gone))
		b->hooks->region_gone(b, r);
}

static inline int kvb_hook_worker_attached(struct kvb_broker *b,
					   struct kvb_worker *w)
{
	return KVB_HOOK(b, worker_attached) ? b->hooks->worker_attached(b, w)
					    : 0;
}

static inline void kvb_hook_worker_gone(struct kvb_broker *b,
					struct kvb_worker *w)
{
	if (KVB_HOOK(b, worker_gone))
		b->hooks->worker_gone(b, w);
}

static inline void kvb_hook_worker_free(struct kvb_broker *b,
					struct kvb_worker *w)
{
	if (KVB_HOOK(b, worker_free))
		b->hooks->worker_free(b, w);
}

static inline int kvb_hook_layer_op(struct kvb_broker *b, struct kvb_worker *w,
				    const struct kvb_sqe *e,
				    struct kvb_op_done *done)
{
	if (KVB_HOOK(b, layer_op))
		return b->hooks->layer_op(b, w, e, done);
	kvb_layer_refuse(b, w, e, -EINVAL,
			 "layer op for an unknown or local transfer");
	return 0;
}

static inline int kvb_hook_group_done(struct kvb_broker *b, uint32_t group,
				      int status, uint64_t bytes,
				      struct kvb_op_done *done, uint32_t *stale)
{
	return KVB_HOOK(b, group_done)
		       ? b->hooks->group_done(b, group, status, bytes, done,
					      stale)
		       : 0;
}

/* Is x complete: by the rules of its module where it has one (x->rx). */
static inline int kvb_hook_xfer_complete(const struct kvb_broker *b,
					 const struct kvb_xfer *x)
{
	if (x->rx && KVB_HOOK(b, xfer_complete))
		return b->hooks->xfer_complete(x);
	return kvb_xfer_complete(x);
}

static inline void kvb_hook_xfer_end(struct kvb_broker *b, struct kvb_xfer *x,
				     int status)
{
	if (x->rx && KVB_HOOK(b, xfer_end))
		b->hooks->xfer_end(b, x, status);
}

static inline uint32_t kvb_hook_xfer_fence(struct kvb_broker *b,
					   struct kvb_xfer *x, int status,
					   uint32_t *failed)
{
	*failed = 0;
	return x->rx && KVB_HOOK(b, xfer_fence)
		       ? b->hooks->xfer_fence(b, x, status, failed)
		       : 0;
}

static inline uint32_t kvb_hook_xfer_writers(struct kvb_broker *b,
					     const struct kvb_xfer *x)
{
	return x->rx && KVB_HOOK(b, xfer_writers) ? b->hooks->xfer_writers(b, x)
						  : 0;
}

static inline int kvb_hook_xfer_deferred(const struct kvb_broker *b,
					 const struct kvb_xfer *x)
{
	return x->rx && KVB_HOOK(b, xfer_deferred) ? b->hooks->xfer_deferred(x)
						   : 0;
}

static inline int kvb_hook_set_defer(struct kvb_broker *b, struct kvb_xfer *x,
				     uint32_t defer_ms)
{
	return KVB_HOOK(b, set_defer) ? b->hooks->set_defer(x, defer_ms)
				      : -EINVAL;
}

static inline void kvb_hook_round(struct kvb_broker *b)
{
	if (KVB_HOOK(b, round))
		b->hooks->round(b);
}

static inline void kvb_hook_timers(struct kvb_broker *b, int64_t now)
{
	if (KVB_HOOK(b, timers))
		b->hooks->timers(b, now);
}

static inline int kvb_hook_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
				  const struct kvb_msg_mem_kv *m)
{
	return KVB_HOOK(b, mem_kv) ? b->hooks->mem_kv(b, w, m) : -ENOTCONN;
}

static inline int kvb_hook_peer_req(struct kvb_broker *b, struct kvb_worker *w,
				    const struct kvb_msg_peer *m)
{
	return KVB_HOOK(b, peer_req) ? b->hooks->peer_req(b, w, m) : -ENOTCONN;
}

static inline int kvb_hook_xopen(struct kvb_broker *b, struct kvb_worker *w,
				 const struct kvb_msg_xopen *m, uint32_t len,
				 uint32_t *handle)
{
	return KVB_HOOK(b, xopen) ? b->hooks->xopen(b, w, m, len, handle)
				  : -ENOTCONN;
}

static inline int kvb_hook_xopen_batch(struct kvb_broker *b,
				       struct kvb_worker *w,
				       const struct kvb_msg_xopen_batch *m,
				       uint32_t len,
				       struct kvb_open_result *res)
{
	return KVB_HOOK(b, xopen_batch)
		       ? b->hooks->xopen_batch(b, w, m, len, res)
		       : -ENOTCONN;
}

static inline int kvb_hook_expect(struct kvb_broker *b, struct kvb_worker *w,
				  const struct kvb_msg_xexpect *m, uint32_t len,
				  struct kvb_open_result *res)
{
	return KVB_HOOK(b, expect) ? b->hooks->expect(b, w, m, len, res)
				   : -ENOTCONN;
}

static inline void kvb_hook_event(struct kvb_broker *b, uint64_t tag)
{
	if (KVB_HOOK(b, event))
		b->hooks->event(b, tag);
}

static inline void kvb_hook_service(struct kvb_broker *b)
{
	if (KVB_HOOK(b, service))
		b->hooks->service(b);
}

static inline uint64_t kvb_hook_rejected(struct kvb_broker *b)
{
	return KVB_HOOK(b, rejected) ? b->hooks->rejected(b) : 0;
}

static inline void kvb_hook_region_info(struct kvb_broker *b,
					const struct kvb_region_ent *r,
					struct kvb_region_info *ri)
{
	memset(ri, 0, sizeof(*ri));
	if (KVB_HOOK(b, region_info))
		b->hooks->region_info(b, r, ri);
}

static inline int kvb_hook_peer_info(struct kvb_broker *b, uint32_t i,
				     struct kvb_peer_info *pi)
{
	return KVB_HOOK(b, peer_info) && kvb_engine_ctx(b)
		       ? b->hooks->peer_info(b, i, pi)
		       : -ERANGE;
}

static inline size_t kvb_hook_stats(struct kvb_broker *b, int json, char *buf,
				    size_t cap)
{
	return KVB_HOOK(b, stats) ? b->hooks->stats(b, json, buf, cap) : 0;
}

/* ext.c: the daemon shuts down: the module lets go of its state; the
 * hooks go (a transfer ended later still has its rx freed, without it) */
void kvb_engine_hooks_fini(struct kvb_broker *b);

/* stats.c: text or JSON into buf; returns length */
size_t kvb_stats_format(struct kvb_broker *b, int json, char *buf, size_t cap);

#endif

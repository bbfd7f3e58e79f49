/* SPDX-License-Identifier: MIT */
/*
 * Private to the cross-node module (bridge/xnode) (xnode.c: notify
 * messages, WRITE/READ state machines, layer ops; peer.c: engine
 * descriptor, peers, handshake port, rdma endpoints; stats.c).
 * One broker thread owns all of it.
 */
#ifndef KVB_BRIDGE_XNODE_PRIV_H
#define KVB_BRIDGE_XNODE_PRIV_H

#include <stdint.h>
#include <zmq.h>

#include "broker.h"
#include "kv_geom.h"
#include "xnode.h"
#include "zmq/codec.h"
#include "zmq/handshake.h"

#define MAX_PEERS     64u /* a power of two: peer id = gen * MAX_PEERS + slot */
#define PEER_GEN_MAX  (UINT32_MAX / MAX_PEERS)
#define PEER_SLOT(id) ((id) % MAX_PEERS)
#define PEER_REFS     32u
#define PEER_WAITERS  32u
#define MAX_LAYERS    4096u
#define MAX_GROUPS    65536u
#define HS_TIMEOUT_NS (3ll * 1000000000)
#define REFRESH_NS    (1ll * 1000000000) /* at most one refresh a second */
/* a batch open to a peer whose handshake failed less than this ago fails
 * at once with that failure (no new handshake) */
#define HS_RETRY_NS   (1ll * 1000000000)
#define HS_DRAIN      64u
#define NOTIFY_BUDGET 256u
#define MAX_TRUSTED   32u
#define MAX_TARGETS   64u
/* Transfers a notify message created before a worker opened them: at most a
 * quarter of the transfer table (the rest stays for workers' opens), holding
 * at most UNOPENED_IDS block ids each and UNOPENED_IDS_ALL together. */
#define UNOPENED_MAX	 (KVB_MAX_XFERS / 4)
#define UNOPENED_IDS	 65536u
#define UNOPENED_IDS_ALL (1u << 22) /* 16 MiB */
#define UNOPENED_FIFO	 (2 * UNOPENED_MAX)
/* (peer, transfer id) a D transfer of this node announced (or released)
 * last, remembered for the D ranks that open the id after every transfer
 * of it here ended (announce.c); a power of two below 65536 */
#define XN_SENT_IDS 16384u

/* The node's list of them: a ring, indexed by a hash of the id (entry + 1
 * in 16 bits, 0 = end of chain), the oldest replaced first. */
struct kvb_xn_sent {
	uint64_t hash[XN_SENT_IDS]; /* of the peer's address and the id */
	uint8_t kind[XN_SENT_IDS];  /* remote_blocks or release */
	uint16_t head[XN_SENT_IDS];
	uint16_t chain[XN_SENT_IDS];
	uint32_t next, fill;
};

/* A worker's notify port that is taken when it attaches is tried again at
 * every timer pass for this long (notify.c): the ROUTER of a worker that
 * just left closes in libzmq's I/O thread, a moment after zmq_close() */
#define NOTIFY_REBIND_NS (2000ll * 1000000)

enum peer_state { PEER_FREE = 0, PEER_HS, PEER_READY, PEER_FAILED };

/* A peer's liveness (live.c): heartbeats while transfers use it, and
 * whether it was declared lost (docs/cross-node.md "Peer death"). */
struct kvb_peer_live {
	uint8_t key[32]; /* per-pair heartbeat key, from the kx exchange */
	uint8_t has_key;
	uint8_t on;   /* transfers use it: pinged, its silence timed */
	uint8_t lost; /* declared lost, not answered since */
	uint8_t no_key_logged;
	int64_t last;  /* when it last proved to be alive */
	int64_t next;  /* next ping */
	int64_t retry; /* lost: next handshake try */
	uint64_t seq;  /* of our last ping */
	uint64_t pings, pongs, losses;
};

struct kvb_peer {
	uint8_t state;
	uint8_t have_desc;
	uint8_t stale; /* a transport error: refresh before the next use */
	char host[64];
	uint16_t port;
	void *dealer;
	int dealer_fd;
	int64_t hs_deadline, next_refresh;
	struct kvb_hs_desc desc;
	struct kvb_ep *ep[KVB_TS_MAX];
	uint32_t waiters[PEER_WAITERS]; /* worker ids awaiting the reply */
	uint32_t nwaiters;
	int last_err;
	uint64_t handshakes, failures;
	uint8_t ep_pending; /* rdma offer sent, answer awaited */
	int64_t ep_deadline;
	uint64_t ep_offers, ep_answers;
	uint32_t gen;		  /* of the slot: ids of a freed peer die */
	uint64_t last_use;	  /* xn->tick when last found or adopted */
	uint32_t refs[PEER_REFS]; /* workers told this peer's id */
	/* data-port authentication (auth.c): the region ids offered
	 * to the peer in our last descriptor to it, the tcp id it is
	 * allowed under (0: none), our last request's MAC (--cluster-key) */
	uint32_t *offer, noffer;
	uint64_t tcp_id;
	uint8_t req_mac[32];
	uint8_t no_kx_logged;
	/* when our last handshake to it failed (0: it did not); open.c
	 * fails batch opens to it at once for HS_RETRY_NS after that */
	int64_t hs_failed_ns;
	/* xn->desc_gen when our descriptor last went to it (our request
	 * or our answer): a worker or region gone since, and our next open
	 * toward it hands it the new one first (open.c) */
	uint32_t sent_gen;
	struct kvb_peer_live live; /* heartbeat, loss (live.c) */
};

/* "ep" handshake message: an endpoint blob of one transport (rdma offer or
 * answer), sent by the broker at host:port (its handshake address). */
struct ep_msg {
	char host[64];
	uint32_t port;
	uint32_t len;
	uint8_t blob[KVB_HS_CONN_MAX];
};

struct kvb_group {
	uint32_t worker, xfer, peer;
	uint32_t remaining;
	int32_t err;
	uint8_t flags, used;
	uint64_t tag, bytes;
};

struct deferred {
	uint16_t layer;
	uint8_t flags;
	uint64_t tag;
};

struct kvb_rxfer {
	uint32_t peer;
	uint8_t role, mode, flags;
	uint8_t have_rblocks, refreshed;
	/* D/WRITE: this node sent the id's remote_blocks to the peer (this
	 * transfer or another D rank's: announce.c) */
	uint8_t announced;
	uint8_t unopened; /* created by a message, counted in xn->nunopened */
	/* ... P/WRITE unopened: its worker declares the ids it expects and
	 * did not expect this one (--unknown-timeout), or withdrew it (D is
	 * told -ECANCELED at once): expect.c */
	uint8_t unknown, withdrawn;
	uint8_t peer_released; /* P/WRITE: ended by D's release (abort) */
	uint8_t starved; /* layers deferred for in-flight room (starved_need) */
	/* opened by address while the peer's handshake runs (open.c): what
	 * needs the peer (announce, release, layer ops) waits for it */
	uint8_t wait_peer;
	uint8_t peer_lost; /* failed as its peer was lost: no message to it */
	uint8_t release_only; /* D/WRITE: KVB_XFER_F_RELEASE_ONLY */
	uint8_t released;     /* ... its release went out (or another D's) */
	uint32_t remote_dp;   /* P/WRITE: decode_rank; D: the P DP rank */
	uint32_t *lb, nlb;    /* this worker's block ids */
	uint32_t granted;     /* D/WRITE, P/READ: worker whose lb it holds
			       * (grants.c) */
	uint8_t failed;	      /* ... and it ended with a failure */
	uint32_t *rb, nrb;    /* the other side's */
	uint32_t acks_needed, acks_got;
	uint64_t acked_ranks; /* P/READ: D ranks < 64 whose ":tp<r>" came */
	struct deferred *def;
	uint32_t ndef, capdef;
	int64_t defer_deadline;
	uint32_t defer_ms; /* kvb_transfer_set_timeouts; 0 = the broker's */
	uint64_t layers[MAX_LAYERS / 64];
	char notify_host[64];
	uint16_t notify_port;
	uint32_t ntargets, target_tp;
	uint32_t targets[MAX_TARGETS];
};

/* What the module keeps per worker slot (xn->wctx[KVB_WSLOT(id)], for
 * worker wid; freed by the worker_free hook), and what the worker's notify
 * endpoint hands its callbacks. */
struct kvb_xn_wctx {
	struct kvb_xn *xn;
	uint32_t wid;
	struct kvb_notify *notify; /* its notify ports (with --host-ip) */
	uint32_t *kv_layer;	   /* layer -> region id (kvb_mem_set_kv) */
	uint32_t nkv;
	uint16_t *grant; /* per KV block: holders, fenced (grants.c) */
	uint32_t ngrant;
	/* its notify port was taken at attach: tried again until then
	 * (0: not; counted in xn->nrebind) */
	int64_t rebind_until, rebind_since;
	struct kvb_xn_expect *exp; /* ids it will open (expect.c), or NULL */
};

/* What the module keeps per region slot (xn->regs[id & 0xffff], for region
 * id; cleared by the region_gone hook). */
struct kvb_xn_region {
	uint32_t id;	  /* 0: nothing kept */
	uint8_t has_kv;	  /* kvb_mem_set_kv(): offered to peer brokers */
	uint8_t tcp_reg;  /* registered with the tcp transport too */
	uint8_t rdma_reg; /* ... and with the rdma transport */
	uint32_t layer;
	struct kvb_kv_geom geom;
};

struct kvb_xn {
	struct kvb_broker *b;	    /* the engine it extends */
	int on;			    /* --host-ip: the cross-node bridge is up */
	struct kvb_xn_wctx *wctx;   /* [worker slot] */
	struct kvb_xn_region *regs; /* [region slot] */
	void *zctx;
	void *router;
	int router_fd;
	uint64_t instance;
	/* bumped when one of our workers or regions goes: the peers'
	 * descriptors of us may name what is gone (kvb_peer.sent_gen) */
	uint32_t desc_gen;
	uint32_t npeers_max;
	struct kvb_peer peers[MAX_PEERS]; /* peer id = index; 0 unused */
	struct kvb_group *groups;
	uint32_t *gfree, ngfree;
	char trusted[MAX_TRUSTED][64];
	uint32_t ntrusted;
	struct {
		uint64_t hs_served, hs_refused, hs_sent, hs_failed;
		uint64_t notify_rejected_closed, notify_received_closed;
		uint64_t notify_sent_closed;
		uint64_t layer_ops, layers_deferred, defer_expired;
		uint64_t remote_blocks_sent, write_done_sent, releases_sent;
		uint64_t write_done_rx, releases_rx, remote_blocks_rx;
		uint64_t write_failed_sent, write_failed_rx;
		uint64_t layers_starved; /* deferred: in-flight table short */
		uint64_t send_errors;	 /* sends with no notify endpoint */
		uint64_t send_errors_closed; /* of closed notify endpoints */
		uint64_t rejected; /* by the state machine (also in notify's) */
		uint64_t hs_bad_replies; /* malformed replies on our DEALERs */
		uint64_t logs_suppressed;
		uint64_t peers_reclaimed;  /* idle peers dropped for new ones */
		uint64_t unopened_evicted; /* oldest unopened, for new ones */
		uint64_t duplicate_opens;  /* a live id opened again: -EEXIST */
		uint64_t opens_batched;	   /* entries of XOPEN_BATCH */
		uint64_t opens_waiting;	   /* ... opened waiting for the peer */
		uint64_t hs_wait_failed;   /* ... failed by its handshake */
		uint64_t release_only_sent, release_only_failed;
		uint64_t peers_lost, peers_back; /* live.c */
		uint64_t hb_sent, hb_answered;	 /* our pings, their pongs */
		uint64_t hb_served, hb_refused;	 /* their pings: ponged, not */
		uint64_t hb_bad_pongs;		 /* refused or not proven */
		uint64_t unopened_expired; /* told D: kvb_write_failed ENOENT */
		/* expect.c: ids declared, withdrawn, refused (table full);
		 * unknown ids and withdrawn ones whose D was told */
		uint64_t expects, withdraws, expects_refused;
		uint64_t unknown_expired, withdrawn_told;
		uint64_t lost_refused;	 /* opens with a lost peer: live.c */
		uint64_t desc_refreshes; /* open.c: our descriptor resent */
		/* D opens of an id this node announced already: not sent */
		uint64_t announce_joined;
	} st;
	char notify_from[64]; /* sender of the notify message in hand */
	int64_t live_next;    /* next liveness pass (live.c) */
	uint32_t nunopened;   /* kvb_rxfer.unopened ones */
	uint32_t nrebind;     /* workers whose notify port is tried again */
	/* the least in-flight room a transfer whose layers wait for it needs
	 * (0: none waits); they are retried once that much is free */
	uint64_t starved_need;
	uint64_t unopened_ids; /* block ids they hold */
	/* unopened transfers in creation order (handle, worker); entries
	 * opened or ended since are skipped: the oldest goes first when the
	 * cap is reached (UNOPENED_FIFO slots, a power of two) */
	struct {
		uint32_t handle, worker;
	} * ufifo;
	uint32_t ufifo_head, ufifo_tail;
	uint64_t tick;		 /* peer LRU clock */
	struct kvb_xn_sent sent; /* what D transfers announced (announce.c) */
	/* auth.c: this instance's X25519 key pair, the cluster key
	 * (--cluster-key) and the handshake MAC key derived from it */
	uint8_t kx_pk[32], kx_sk[32];
	uint8_t ck[32], hs_key[32];
	int has_ck;
	struct kvb_ratelimit log_rl; /* kvb_xn_rlog_ok() */
};

/* The module's state, registered with the engine's hooks: with or
 * without --host-ip (a worker's KV layout is kept all the same). */
static inline struct kvb_xn *kvb_xn_state(const struct kvb_broker *b)
{
	return (struct kvb_xn *) kvb_engine_ctx(b);
}

/* ... and where the cross-node bridge is up (--host-ip), else NULL: every
 * cross-node request is refused. */
static inline struct kvb_xn *kvb_xn_of(const struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_state(b);

	return xn && xn->on ? xn : NULL;
}

/* What the module keeps for worker w. */
static inline struct kvb_xn_wctx *kvb_xn_w(const struct kvb_xn *xn,
					   const struct kvb_worker *w)
{
	return &xn->wctx[KVB_WSLOT(w->id)];
}

/* w's notify endpoint (NULL: none, or no bridge) */
static inline struct kvb_notify *kvb_xn_notify(struct kvb_broker *b,
					       const struct kvb_worker *w)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	return xn ? kvb_xn_w(xn, w)->notify : NULL;
}

/* What the module keeps for region id, NULL if nothing. */
static inline struct kvb_xn_region *kvb_xn_region(struct kvb_xn *xn,
						  uint32_t id)
{
	struct kvb_xn_region *x = xn ? &xn->regs[id & 0xffffu] : NULL;

	return x && id && x->id == id ? x : NULL;
}

/* xnode.c: w's KV region of layer l (kvb_mem_set_kv): the engine's entry
 * into *r (live, or dead and still referenced) and the module's part with
 * its geometry; NULL (and *r NULL) when there is none. */
const struct kvb_xn_region *kvb_xn_kv_layer(struct kvb_broker *b,
					    const struct kvb_worker *w,
					    uint32_t l,
					    struct kvb_region_ent **r);
/* ... how many layer slots w has (layers < that may have a region) */
uint32_t kvb_xn_nkv(struct kvb_broker *b, const struct kvb_worker *w);

/* xnode.c */
int kvb_xn_ep_add(struct kvb_broker *b, int fd);
int kvb_xn_ep_add_tag(struct kvb_broker *b, int fd, uint64_t tag);
/* xnode.c */
void kvb_xn_ep_del(struct kvb_broker *b, int fd);
/* The hooks the module registers with the engine (broker.h, struct
 * kvb_engine_hooks, says when each runs); setup.c holds the table. */
void kvb_xn_service(struct kvb_broker *b);
void kvb_xn_retry_starved(struct kvb_broker *b);
void kvb_xn_rdma_events(struct kvb_broker *b);
void kvb_xn_timers(struct kvb_broker *b, int64_t now);
int kvb_xn_worker_attached(struct kvb_broker *b, struct kvb_worker *w);
void kvb_xn_worker_gone(struct kvb_broker *b, struct kvb_worker *w);
void kvb_xn_worker_free(struct kvb_broker *b, struct kvb_worker *w);
int kvb_xn_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_msg_mem_kv *m);
int kvb_xn_peer_req(struct kvb_broker *b, struct kvb_worker *w,
		    const struct kvb_msg_peer *m);
int kvb_xn_xopen(struct kvb_broker *b, struct kvb_worker *w,
		 const struct kvb_msg_xopen *m, uint32_t len, uint32_t *handle);
int kvb_xn_xopen_batch(struct kvb_broker *b, struct kvb_worker *w,
		       const struct kvb_msg_xopen_batch *m, uint32_t len,
		       struct kvb_open_result *res);

/* xnode.c: one cross-node open, from XOPEN or an XOPEN_BATCH entry */
struct kvb_xn_open {
	const char *id;
	uint32_t id_len;
	uint32_t peer, mode, flags, remote_dp;
	const uint32_t *lb, *rb;
	uint32_t nlb, nrb;
	const char *notify_host; /* NULL or "": the peer's */
	uint16_t notify_port;
	uint8_t wait; /* the peer's handshake runs: open waiting for it */
};
/* 0 with *handle, or -errno (nothing left open) */
int kvb_xn_open_one(struct kvb_broker *b, struct kvb_worker *w,
		    const struct kvb_xn_open *o, uint32_t *handle);
/* xnode.c: the peer of a transfer waiting for it is known now: what its
 * open left for then (announce, release, ACK count); 0 or -errno */
int kvb_xn_open_ready(struct kvb_broker *b, struct kvb_xfer *x);
/* open.c: our handshake with p ended (kvb_xn_peer_done): the transfers
 * waiting for it go on, or fail with status */
void kvb_xn_waiting_done(struct kvb_broker *b, struct kvb_peer *p, int status);
/* open.c: fail transfer x, which waits for its peer, with status (held
 * for its seal where it has none yet) */
void kvb_xn_fail_waiting(struct kvb_broker *b, struct kvb_xfer *x, int status);
int kvb_xn_layer(struct kvb_broker *b, struct kvb_worker *w,
		 const struct kvb_sqe *e, struct kvb_op_done *done);
void kvb_xn_xfer_end(struct kvb_broker *b, struct kvb_xfer *x, int status);
uint32_t kvb_xn_xfer_fence(struct kvb_broker *b, struct kvb_xfer *x, int status,
			   uint32_t *failed);
uint32_t kvb_xn_xfer_writers(struct kvb_broker *b, const struct kvb_xfer *x);
int kvb_xn_xfer_deferred(const struct kvb_xfer *x);
int kvb_xn_set_defer(struct kvb_xfer *x, uint32_t defer_ms);
int kvb_xn_xfer_complete(const struct kvb_xfer *x);
int kvb_xn_group_done(struct kvb_broker *b, uint32_t group, int status,
		      uint64_t bytes, struct kvb_op_done *done,
		      uint32_t *stale);
void kvb_xn_reg(struct kvb_broker *b, struct kvb_region_ent *r);
void kvb_xn_dereg(struct kvb_broker *b, struct kvb_region_ent *r);
uint64_t kvb_xn_rejected(struct kvb_broker *b);
size_t kvb_xn_stats(struct kvb_broker *b, int json, char *buf, size_t cap);
struct kvb_peer_info;
int kvb_xn_peer_info(struct kvb_broker *b, uint32_t i,
		     struct kvb_peer_info *pi);

#define RLOG_BURST 20u /* bad-input log lines a second (rlog_ok) */

/* xnode.c: whether a line about bad input may be logged now (at most
 * RLOG_BURST a second, the rest counted and summed up a second later) */
int kvb_xn_rlog_ok(struct kvb_xn *xn);
/* xnode.c */
int kvb_xn_trusted(struct kvb_xn *xn, const char *host);
/* xnode.c */
uint32_t kvb_xn_peer_id(struct kvb_xn *xn, struct kvb_peer *p);
/*
 * xnode.c: the peer at host:port; with create, a new one when there is
 * none, in a free slot or else in the slot of the least recently used idle
 * peer (not handshaking, no worker waiting for or told its id, no live
 * transfer or layer op): that one is disconnected and its id stops naming
 * anything. NULL when none is found (or every slot is busy).
 */
struct kvb_peer *kvb_xn_peer_find(struct kvb_xn *xn, const char *host,
				  uint16_t port, int create);
/* xnode.c: remember that worker wid was told p's id (p is then kept) */
void kvb_xn_peer_ref(struct kvb_broker *b, struct kvb_peer *p, uint32_t wid);
/* xnode.c */
const struct kvb_hs_transport *
kvb_xn_desc_transport(const struct kvb_hs_desc *d, const char *name);
/* xnode.c */
int kvb_xn_peer_wants_rdma(struct kvb_broker *b, const struct kvb_peer *p);
/* xnode.c */
int kvb_xn_rdma_ready(struct kvb_broker *b, const struct kvb_peer *p);
/* xnode.c */
unsigned kvb_xn_peer_ts(struct kvb_broker *b, const struct kvb_peer *p);
/* layer.c */
void kvb_xn_issue_deferred_of_peer(struct kvb_broker *b, uint32_t pid);
/* peer.c */
void kvb_xn_fail_dest_ops(struct kvb_broker *b, uint32_t pid, unsigned ts,
			  int status);
/* peer.c */
void kvb_xn_peer_disconnect(struct kvb_broker *b, struct kvb_peer *p);
/* peer.c */
void kvb_xn_peer_reply_waiters(struct kvb_broker *b, struct kvb_peer *p,
			       int status);
/* peer.c */
void kvb_xn_close_dealer(struct kvb_broker *b, struct kvb_peer *p);
/* peer.c */
void kvb_xn_peer_done(struct kvb_broker *b, struct kvb_peer *p, int status);
/* peer.c */
int kvb_xn_peer_start_hs(struct kvb_broker *b, struct kvb_peer *p);
/* peer.c */
int kvb_xn_rdma_offer(struct kvb_broker *b, struct kvb_peer *p);
/* peer.c */
void kvb_xn_peer_poll(struct kvb_broker *b, struct kvb_peer *p);
/* peer.c */
void kvb_xn_hs_serve(struct kvb_broker *b);

/* xnode.c */
struct kvb_peer *kvb_xn_peer_get(struct kvb_xn *xn, uint32_t id);
/* layer.c */
void kvb_xn_issue_deferred(struct kvb_broker *b, struct kvb_xfer *x);
/* layer.c: remote ranks a layer op of this transfer touches (sets
 * rx->targets); 0 or -errno */
int kvb_xn_compute_targets(struct kvb_broker *b, struct kvb_worker *w,
			   struct kvb_peer *p, struct kvb_rxfer *rx);
/* xnode.c */
uint32_t *kvb_xn_copy_ids(const uint32_t *ids, uint32_t n);
/* Free a cross-node transfer state (the rx_free hook; ctx: xn). */
void kvb_xn_rx_free(void *ctx, struct kvb_rxfer *rx);
/* xnode.c: a worker opened it, or it goes: out of the unopened count */
void kvb_xn_rx_opened(struct kvb_xn *xn, struct kvb_rxfer *rx);
/* notify.c */
void kvb_xn_notify_close(struct kvb_broker *b, struct kvb_worker *w);
/* notify.c: the notify ports that were taken at attach, tried again (the
 * timers hook) */
void kvb_xn_notify_retry(struct kvb_broker *b, int64_t now);

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
/* a transport's write gate (transport.h set_write_gate), arg = the
 * module's state */
int kvb_grant_gate(void *arg, uint32_t region, uint64_t off, uint64_t len);
int kvb_grant_read_gate(void *arg, uint32_t region, uint64_t off, uint64_t len);
/* w's grants go (the worker_free hook) */
void kvb_grant_free(struct kvb_xn_wctx *ws);

/* auth.c: key pair, cluster key, the tcp data port's caps, trusted
 * hosts and log; 0 or -errno */
int kvb_xn_auth_init(struct kvb_broker *b);
/* auth.c: wipe the secrets */
void kvb_xn_auth_fini(struct kvb_xn *xn);
/* auth.c: the regions of `mine` are what p was offered */
int kvb_xn_auth_offer(struct kvb_broker *b, struct kvb_peer *p,
		      const struct kvb_hs_desc *mine);
/* auth.c: p's key (from its descriptor's kx): allow it on the data
 * port with its offered regions, and prove it on our endpoint to it */
void kvb_xn_auth_tcp_peer(struct kvb_broker *b, struct kvb_peer *p);
/* auth.c: p may no longer connect; its connections close */
void kvb_xn_auth_tcp_forget(struct kvb_broker *b, struct kvb_peer *p);
/* auth.c: the handshake MAC of a descriptor (label "req"/"rep",
 * a reply bound to the request's MAC `pre`) */
void kvb_xn_auth_hs_mac(struct kvb_xn *xn, const char *label,
			const uint8_t *pre, const void *desc, size_t len,
			uint8_t mac[32]);
int kvb_xn_auth_hs_mac_ok(struct kvb_xn *xn, const char *label,
			  const uint8_t *pre, const void *desc, size_t len,
			  const void *mac, size_t mac_len);

/* live.c: peer liveness. The handshake port's "hb" request (a ping from
 * a peer, [identity]["hb"][struct hb]) and answer ([status]["hb"][...]
 * on our DEALER); frames closed by the caller. */
void kvb_xn_hb_serve(struct kvb_broker *b, zmq_msg_t *id, zmq_msg_t *body);
void kvb_xn_hb_answer(struct kvb_broker *b, struct kvb_peer *p, zmq_msg_t *f);
/* live.c: p's heartbeat key from its descriptor's kx (peer_adopt) */
void kvb_xn_live_key(struct kvb_broker *b, struct kvb_peer *p);
/* live.c: p answered a handshake (it is alive); restarted: its descriptor
 * has another instance number than the one we knew (called before it is
 * taken): the old instance's transfers fail */
void kvb_xn_live_alive(struct kvb_broker *b, struct kvb_peer *p);
void kvb_xn_live_restarted(struct kvb_broker *b, struct kvb_peer *p);
/* live.c: heartbeats, silent peers (the timers hook) */
void kvb_xn_live_tick(struct kvb_broker *b, int64_t now);
/* live.c: the handshaken peer a notify message came from (the sender's
 * address, xn->notify_from), 0 if none or several */
uint32_t kvb_xn_live_sender(struct kvb_xn *xn);
/* expect.c: the XEXPECT hook; what worker w said of an id (below); its
 * table goes with the worker slot */
int kvb_xn_expect(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_msg_xexpect *m, uint32_t len,
		  struct kvb_open_result *res);
enum kvb_xn_expected {
	XN_EXPECT_UNDECLARED, /* w never declared: --unopened-timeout */
	XN_EXPECT_UNKNOWN,    /* w declares, not this id: --unknown-timeout */
	XN_EXPECT_YES,	      /* expected: --unopened-timeout */
	XN_EXPECT_WITHDRAWN,  /* withdrawn: D is told at once */
};
enum kvb_xn_expected kvb_xn_expected(struct kvb_broker *b,
				     const struct kvb_worker *w, const char *id,
				     size_t len);
void kvb_xn_expect_free(struct kvb_xn_wctx *ws);

/* live.c: -EHOSTDOWN for a new transfer with a peer declared lost (and a
 * handshake asked of it, at most every 2 s), else 0 */
int kvb_xn_live_refuse(struct kvb_broker *b, struct kvb_peer *p);
/* live.c: remote_blocks for a transfer P's worker `w` already ended
 * (aborted, or failed toward a D broker that restarted since): tell the
 * announcing peer's D ranks kvb_write_failed (-ESTALE) at once, so their
 * loads do not wait for a clock. Only a handshaken sender hears it. */
void kvb_xn_live_tell_ended(struct kvb_broker *b, struct kvb_worker *w,
			    const char *id, uint32_t remote_dp);
/* live.c: an unopened P transfer ends (its --unopened-timeout): tell D */
void kvb_xn_live_unopened_end(struct kvb_broker *b, struct kvb_xfer *x,
			      int status);
/* peer.c */
int kvb_xn_peer_dealer(struct kvb_broker *b, struct kvb_peer *p);
/* xnode.c: send m to the notify port of every P rank of the peer's DP rank
 * rx->remote_dp (a D transfer's writers); returns how many went out */
uint32_t kvb_xn_send_to_p_ranks(struct kvb_broker *b, struct kvb_worker *w,
				struct kvb_peer *p, const struct kvb_rxfer *rx,
				struct kvb_zmsg *m);
/* announce.c: D/WRITE x's remote_blocks to every P rank of its peer's DP
 * rank, once per node and id: 0 when sent or sent already (by any D rank
 * here), -errno when it could not go (nothing sent, nothing marked) */
int kvb_xn_announce(struct kvb_broker *b, struct kvb_worker *w,
		    struct kvb_xfer *x);
/* announce.c: the same for a release-only open's release */
int kvb_xn_release_only(struct kvb_broker *b, struct kvb_worker *w,
			struct kvb_xfer *x);
/* xnode.c: send m to w's peer's notify port (counted, logged) */
int kvb_xn_send_msg(struct kvb_broker *b, struct kvb_worker *w,
		    const char *host, uint32_t port, const struct kvb_zmsg *m);

#endif

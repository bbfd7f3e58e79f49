/* SPDX-License-Identifier: MIT */
/*
 * Internals of the tcp transport, shared by its files:
 *   tcp.c    open/close, regions, blobs, poll loop, timer, completions
 *   dial.c   endpoints: connect, post, responses (the requesting side)
 *   serve.c  accepted connections: requests, acks, READ payloads
 *   rx.c     the receive state machine both sides parse frames with
 *   tx.c     the per-connection send queue (one sendmsg per doorbell)
 *   wire.c   byte layouts
 */
#ifndef KVB_BRIDGE_TCP_PRIV_H
#define KVB_BRIDGE_TCP_PRIV_H

#include <limits.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "tcp/tcp.h"
#include "tcp/wire.h"

#define TCP_DEPTH_DEFAULT   1024u
#define TCP_TIMEOUT_DEFAULT 10000 /* ms */
#define TCP_BACKOFF_NS	    (100ull * 1000000ull)
#define TCP_RX_BUDGET	    (8u << 20)	/* bytes received per poll() */
#define TCP_TX_BUDGET	    (16u << 20) /* bytes sent per connection per poll */
#define TCP_ZBUF	    (64u << 10) /* discard and zero buffers */
#define TCP_IOV_MAX	    1024u /* iovecs per readv/sendmsg (<= IOV_MAX) */
/* a chain spread over a peer's stripes gives each at least this many bytes */
#define KVB_TCP_STRIPE_MIN (256u << 10)
#define TCP_TX_FRAMES_MAX  256u /* served conn: stop reading beyond */
#define TCP_MAX_CONNS	   4096u
#define TCP_ACCEPT_BURST   32u
#define TCP_EVENTS	   64
#define TCP_BUF_WANT	   (4 << 20)
#define TCP_STRIPES_MAX	   16u /* connections per peer (kvb_ep stripes) */
#define TCP_EV_REG	   0x80000000u /* epoll_set: fd is in the set */
/* GPU payload goes through host memory in pieces of up to this many bytes,
 * one staging buffer per direction of a connection (allocated on first use) */
#define TCP_STAGE (1u << 20)
/* WRITEs whose remote ranges continue share a record up to this many bytes
 * (small pieces: a head split's tokens); a larger op gets its own, so an
 * op's answer never waits on much more than its own bytes */
#define TCP_MERGE_MAX (256u << 10)

_Static_assert(TCP_IOV_MAX <= IOV_MAX, "readv/sendmsg iovec limit");

#define TCP_TRUSTED_MAX 64u
#define TCP_PEERS_MAX	4096u
#define TCP_FD_RESERVE                                         \
	64 /* descriptors kept free for the rest of the broker \
	    */
#define TCP_ACCEPT_PAUSE_NS (100ull * 1000000ull) /* after EMFILE / ENFILE */

/* kinds of rate-limited log lines (auth.c tcp_rlog) */
enum tcp_rl_kind {
	RL_UNTRUSTED,
	RL_AUTH_FAILED,
	RL_AUTH_TIMEOUT,
	RL_CONN_LIMIT,
	RL_REGION,
	RL_EMFILE,
	TCP_RL_KINDS
};

enum tcp_kind { TCP_K_LISTEN = 1, TCP_K_TIMER, TCP_K_EP, TCP_K_CONN };

/* What an epoll event's data.ptr points at (first member of its owner). */
struct tcp_tag {
	int kind;
};

/* ---- send queue (tx.c) ---- */

/* A payload piece: memory of a region (base), or zeros (base NULL). */
struct tcp_seg {
	const char *base;
	uint64_t len;
	struct kvb_mr *mr;
	uint32_t ref; /* slot (dialer) or record index (server) */
};

/* One frame: meta (header + records), segs, trailer; sent in that order. */
struct tcp_frame {
	struct tcp_frame *next;
	uint8_t *meta;
	uint8_t *trailer;
	uint32_t meta_len, trailer_len;
	unsigned nseg;
	unsigned part; /* 0 meta, 1..nseg seg[part - 1], nseg + 1 trailer */
	uint64_t done; /* bytes of `part` already sent */
	struct tcp_seg seg[];
};

/* Called for a seg whose payload will not be sent (zeros go instead):
 * the op it carries must complete with `status`. */
typedef void (*tcp_drop_fn)(void *owner, struct tcp_frame *f, uint32_t ref,
			    int status);

struct tcp_txq {
	struct tcp_frame *head, *tail;
	unsigned n;
	/* bytes of every frame pushed / sent since the queue was last
	 * cleared: a byte at offset x of that stream is sent once sent > x */
	uint64_t queued, sent;
	/* GPU payload copied to host memory: stream bytes [stage_lo,
	 * stage_hi) are at stage[0 ..), kept until sent */
	char *stage;
	uint64_t stage_lo, stage_hi;
	tcp_drop_fn drop; /* for a seg whose GPU copy failed */
	void *owner;
};

/* ---- receive state machine (rx.c) ---- */

enum tcp_rx_state { RX_HDR, RX_RECS, RX_PAY, RX_TRAILER };
enum tcp_rx_ev { EV_NONE, EV_HDR, EV_RECS, EV_ITEM, EV_FRAME };

struct tcp_item {
	struct kvb_tcp_rec rec;
	char *dst;	   /* landing address, NULL = discard */
	struct kvb_mr *mr; /* region dst points into */
	uint64_t got;
	uint32_t slot; /* dialer: slot of the op */
};

struct tcp_rx {
	enum tcp_rx_state st;
	uint8_t hbuf[KVB_TCP_HDR_LEN];
	unsigned hgot;
	struct kvb_tcp_hdr h;
	uint8_t *rbuf; /* raw records */
	uint32_t rgot, rlen;
	struct tcp_item *items;
	unsigned n, cur;
	uint8_t *tbuf; /* trailer */
	uint32_t tgot, tlen;
	/* the current item's GPU payload lands here first: staged bytes
	 * not yet copied to the device (allocated on first use) */
	char *stage;
	uint64_t staged;
};

/* ---- endpoint (dial.c) ---- */

/* EP_AUTH: connected, HELLO sent, the server's CHALLENGE awaited; frames
 * queue until the PROOF went out */
enum tcp_ep_state { EP_IDLE, EP_CONNECTING, EP_AUTH, EP_CONNECTED };

struct tcp_slot {
	uint64_t seq; /* gen << 32 | index */
	uint64_t cookie;
	struct kvb_mr *local;
	char *dst; /* READ: landing address, NULL once local is gone */
	uint64_t len;
	uint32_t opcode;
	int32_t err; /* forced status (local region deregistered) */
	uint32_t next_free;
	uint8_t used, answered;
	/* the slot whose record carries this op: its own index, or for a
	 * WRITE that rides in an earlier op's record (tcp_slot_rider) that
	 * op's */
	uint32_t lead;
	uint32_t rider; /* next rider of this record, TCP_NO_SLOT = none */
	/* WRITE that leads a record: where the record's payload ends in
	 * ep->tx's bytes (a rider's is unused) */
	uint64_t tx_end;
};

#define TCP_NO_SLOT UINT32_MAX

/* Is slot i of ep a WRITE riding in another slot's record? */
#define tcp_slot_rider(ep, i) ((ep)->slots[i].lead != (uint32_t) (i))

struct kvb_ep {
	struct tcp_tag tag;
	struct tcp_transport *tt;
	struct kvb_ep *prev, *next;
	struct sockaddr_storage sa;
	socklen_t salen;
	int fd;
	enum tcp_ep_state state;
	uint32_t events;
	int last_err;
	int dialed;
	uint64_t backoff_until, deadline, last_progress;
	uint32_t depth, used, free_head, gen;
	struct tcp_slot *slots;
	struct tcp_txq tx;
	struct tcp_rx rx;
	/*
	 * Stripes: connect() returns the first of params.qp_per_peer
	 * endpoints to one peer, each its own connection, chained through
	 * `stripe` (NULL after the last); post() on it hands each chain to
	 * one of them (dial.c stripe_pick), disconnect() ends them all.
	 */
	struct kvb_ep *stripe;
	uint64_t inflight_bytes; /* of the ops in `slots` */
	/* authentication (auth.c): the server's id (its blob's nonce), the
	 * key, this dial's nonce and the CHALLENGE received so far */
	uint64_t srv_id;
	uint8_t key[KVB_TCP_KEY_LEN];
	uint8_t has_key;
	uint8_t nonce[KVB_TCP_NONCE_LEN];
	uint8_t abuf[KVB_TCP_CHAL_LEN];
	unsigned agot;
};

/* ---- accepted connection (serve.c) ---- */

/* A peer allowed to connect (kvb_tcp_peer_allow). */
struct tcp_peer {
	uint64_t id; /* 0: any dialer */
	uint8_t key[KVB_TCP_KEY_LEN];
	int all;	/* every registered region */
	uint32_t *rids; /* else these, sorted */
	unsigned nrids;
};

/* served connection: HELLO awaited, PROOF awaited, authenticated */
enum tcp_conn_state { C_HELLO, C_PROOF, C_OPEN };

struct tcp_conn {
	struct tcp_tag tag;
	struct tcp_transport *tt;
	struct tcp_conn *prev, *next;
	/* not yet authenticated: on tt's pending list, in accept order
	 * (their deadlines too) */
	struct tcp_conn *pprev, *pnext;
	enum tcp_conn_state state;
	uint64_t deadline; /* of the authentication */
	/* not authenticated, its place taken by a newer connection: closed
	 * after this poll round's events (at the pending list's head) */
	uint8_t evicted;
	struct sockaddr_storage sa; /* source, IPv4-mapped made IPv4 */
	struct tcp_peer *peer;	    /* once authenticated */
	uint64_t dialer_id, srv_id; /* srv_id: as the HELLO named us */
	uint8_t nonce_d[KVB_TCP_NONCE_LEN], nonce_s[KVB_TCP_NONCE_LEN];
	uint8_t abuf[KVB_TCP_HELLO_LEN];
	unsigned agot;
	struct tcp_conn *dnext; /* on the flush list */
	int fd;
	uint32_t events;
	int dirty;
	struct tcp_rx rx;
	struct tcp_txq tx;
	struct kvb_tcp_rec *acks; /* acks not yet framed */
	unsigned nacks, acks_cap;
};

/* ---- transport (tcp.c) ---- */

struct tcp_transport {
	struct kvb_transport base;
	int epfd, lfd, tfd;
	struct tcp_tag ltag, ttag;
	int family;
	uint8_t addr[16];
	uint16_t port;
	uint64_t nonce;
	uint64_t timeout_ns;
	int timeout_ms;
	uint32_t depth;
	unsigned stripes;    /* connections per connect() */
	int sndbuf, rcvbuf;  /* 0: leave the kernel's autotuning alone */
	struct kvb_mr **mrs; /* sorted by id */
	unsigned nmr, mr_cap;
	struct kvb_ep *eps;
	struct tcp_conn *conns, *dirty;
	unsigned nconns;
	struct kvb_xcqe *cq;
	unsigned cq_cap, cq_head, cq_len;
	uint64_t inflight; /* used slots over all endpoints */
	uint64_t timer_at; /* absolute ns the timerfd is armed for, 0 = none */
	char *scratch;	   /* discard target, TCP_ZBUF */
	char *zeros;	   /* never written, TCP_ZBUF */
	uint64_t rx_budget;
	struct iovec iov[TCP_IOV_MAX];
	struct kvb_tcp_stats st;
	/* access control (auth.c, serve.c) */
	struct tcp_peer **peers;
	unsigned npeers;
	struct tcp_trusted {
		int family; /* AF_INET / AF_INET6 */
		uint8_t addr[16];
	} trusted[TCP_TRUSTED_MAX];
	unsigned ntrusted;
	unsigned max_conns, max_per_host;
	uint64_t auth_ns;
	int fd_cap; /* accepted fds at or above this are closed at once */
	struct tcp_conn *phead, *ptail; /* pending authentication */
	unsigned nevicted;		/* of those, evicted (closing) */
	uint32_t lev;			/* the listener's epoll events */
	uint64_t accept_resume;		/* paused after EMFILE until, 0 = not */
	void (*log_fn)(void *arg, const char *line);
	void *log_arg;
	kvb_tcp_gate_fn gate; /* kvb_tcp_set_write_gate() */
	void *gate_arg;
	kvb_tcp_gate_fn rgate; /* kvb_tcp_set_read_gate() */
	void *rgate_arg;
	struct tcp_rl {
		uint64_t since; /* start of the current one-second window */
		uint64_t suppressed;
	} rl[TCP_RL_KINDS];
	int rl_pending; /* some kind has suppressed lines to sum up */
};

#define to_tcp(t) container_of(t, struct tcp_transport, base)

static inline uint64_t tcp_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static inline uint64_t tcp_rand64(void)
{
	uint64_t v = 0;

	while (!v)
		if (getrandom(&v, sizeof(v), 0) != sizeof(v))
			v = (uint64_t) tcp_now() ^ 0x9e3779b97f4a7c15ull;
	return v;
}

/* tcp.c */
struct kvb_mr *_kvb_tcp_mr_find(struct tcp_transport *tt, uint32_t id);
void _kvb_tcp_cq_push(struct tcp_transport *tt, uint64_t cookie, int status);
int _kvb_tcp_cq_reserve(struct tcp_transport *tt, uint64_t n);
void _kvb_tcp_timer_want(struct tcp_transport *tt, uint64_t at);
int _kvb_tcp_epoll_set(struct tcp_transport *tt, int fd, struct tcp_tag *tag,
		       uint32_t *cur, uint32_t want);
void _kvb_tcp_sock_tune(struct tcp_transport *tt, int fd);
int _kvb_tcp_sockaddr(const char *ip, uint16_t port,
		      struct sockaddr_storage *sa, socklen_t *len);

/* tx.c */
struct tcp_frame *_kvb_tcp_frame_new(unsigned nseg, uint32_t meta_len,
				     uint32_t trailer_len);
void _kvb_tcp_txq_init(struct tcp_txq *q, tcp_drop_fn drop, void *owner);
void _kvb_tcp_txq_push(struct tcp_txq *q, struct tcp_frame *f);
/* Drop every frame (and the staging buffer); the stream restarts at 0. */
void _kvb_tcp_txq_clear(struct tcp_txq *q);
/*
 * One sendmsg of the queue head: bytes sent, -EAGAIN, or -errno. GPU
 * payload is copied to the staging buffer first (a piece at a time); a
 * copy that fails sends zeros for that seg and drops it with -EIO.
 */
int64_t _kvb_tcp_txq_send(struct tcp_transport *tt, struct tcp_txq *q, int fd);
/* Replace unsent payload of `mr` by zeros; q->drop(-ENOENT) per seg. */
void _kvb_tcp_txq_drop_mr(struct tcp_txq *q, struct kvb_mr *mr);

/* rx.c */
int _kvb_tcp_rx_init(struct tcp_rx *rx);
void _kvb_tcp_rx_free(struct tcp_rx *rx);
void _kvb_tcp_rx_reset(struct tcp_rx *rx);
void _kvb_tcp_rx_begin_recs(struct tcp_rx *rx);
void _kvb_tcp_rx_begin_pay(struct tcp_rx *rx, unsigned n, int trailer);
void _kvb_tcp_rx_drop_mr(struct tcp_rx *rx, struct kvb_mr *mr);
/* Items not yet whole for which ok(arg, item) says no: the rest of each is
 * discarded, the item answered with `status`; returns how many. */
unsigned _kvb_tcp_rx_drop_if(struct tcp_rx *rx,
			     int (*ok)(void *arg, const struct tcp_item *it),
			     void *arg, int status);
/*
 * Read from fd within the transport's budget, feeding `on` every event
 * (`on` returns 0, 1 to stop reading after this readv, or -errno).
 * Returns 0 (would block or budget spent), -ECONNRESET (peer closed), the
 * negative errno of the read, or what `on` returned when negative.
 */
int _kvb_tcp_rx_pump(struct tcp_transport *tt, struct tcp_rx *rx, int fd,
		     int (*on)(void *owner, enum tcp_rx_ev ev, unsigned idx),
		     void *owner, uint64_t *progress);

/* dial.c */
int _kvb_tcp_ep_new(struct tcp_transport *tt, const struct sockaddr_storage *sa,
		    socklen_t salen, struct kvb_ep **out);
void _kvb_tcp_ep_destroy(struct kvb_ep *ep, int complete);
/* connect(): tt->stripes endpoints to sa, chained; 0 or -ENOMEM */
int _kvb_tcp_ep_group_new(struct tcp_transport *tt,
			  const struct sockaddr_storage *sa, socklen_t salen,
			  uint64_t srv_id, struct kvb_ep **out);
/* disconnect(): every stripe of the group ep leads */
void _kvb_tcp_ep_group_destroy(struct kvb_ep *ep);
void _kvb_tcp_ep_event(struct kvb_ep *ep, uint32_t events);
void _kvb_tcp_ep_tick(struct kvb_ep *ep, uint64_t now, uint64_t *next);
void _kvb_tcp_ep_drop_mr(struct kvb_ep *ep, struct kvb_mr *mr);
int _kvb_tcp_post(struct kvb_transport *t, struct kvb_ep *ep,
		  const struct kvb_xop *ops, unsigned n);

/* auth.c */
void _kvb_tcp_mac(const uint8_t key[KVB_TCP_KEY_LEN], char role, uint64_t id_d,
		  uint64_t id_s, const uint8_t *nonce_d, const uint8_t *nonce_s,
		  uint8_t mac[KVB_TCP_MAC_LEN]);
int _kvb_tcp_mac_ok(const uint8_t key[KVB_TCP_KEY_LEN], char role,
		    uint64_t id_d, uint64_t id_s, const uint8_t *nonce_d,
		    const uint8_t *nonce_s, const uint8_t *mac);
struct tcp_peer *_kvb_tcp_peer_find(struct tcp_transport *tt, uint64_t id);
/* whether an authenticated peer may address region id */
int _kvb_tcp_peer_has(const struct tcp_peer *p, uint32_t id);
/* One line of that kind, or counted when one went out within a second. */
void _kvb_tcp_rlog(struct tcp_transport *tt, enum tcp_rl_kind k,
		   const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sum up the suppressed lines of kinds whose second is over. */
void _kvb_tcp_rlog_flush(struct tcp_transport *tt, uint64_t now);
void _kvb_tcp_addr_str(const struct sockaddr_storage *sa, char *buf,
		       size_t len);
/* send exactly len bytes (auth messages, on a fresh connection): 0 or
 * -errno (-EIO for a short send) */
int _kvb_tcp_send_all(int fd, const void *buf, size_t len);
/* dialer: the connection is up: send HELLO (state EP_AUTH); 0 or -errno */
int _kvb_tcp_ep_auth_start(struct kvb_ep *ep);
/* dialer: read the CHALLENGE; 1 when done (PROOF sent, EP_CONNECTED), 0
 * for more to come, or -errno */
int _kvb_tcp_ep_auth_read(struct kvb_ep *ep);
/* server: read HELLO / PROOF; 1 when authenticated, 0 more to come,
 * -errno (the caller closes, the reason already counted) */
int _kvb_tcp_conn_auth_read(struct tcp_conn *c);

/* serve.c */
/* close unauthenticated connections past their deadline; *next: the next
 * deadline */
void _kvb_tcp_conn_expire(struct tcp_transport *tt, uint64_t now,
			  uint64_t *next);
void _kvb_tcp_accept(struct tcp_transport *tt);
void _kvb_tcp_conn_event(struct tcp_conn *c, uint32_t events);
void _kvb_tcp_conn_flush_all(struct tcp_transport *tt);
void _kvb_tcp_conn_destroy(struct tcp_conn *c);
void _kvb_tcp_conn_drop_mr(struct tcp_conn *c, struct kvb_mr *mr);
/* kvb_tcp_gate_recheck() for one served connection */
void _kvb_tcp_conn_gate_recheck(struct tcp_conn *c);

#endif /* KVB_BRIDGE_TCP_PRIV_H */

/* SPDX-License-Identifier: MIT */
/*
 * The notify-port endpoint of one worker identity, owned by the broker's
 * event loop (docs/protocol.md "Sockets and ports").
 *
 * Receiving: ZMQ ROUTER sockets bound on host_ip at notify_port + offset under
 * BOTH offset formulas (one socket when they agree). kvb_notify_recv() drains
 * them without blocking, decodes each payload (codec.h) and hands good ones to
 * the message callback; a bad one is counted (messages_rejected), logged with
 * its reason and dropped, and the endpoint keeps serving. Nothing is ever
 * sent back on a notify socket.
 *
 * Sending: kvb_notify_send() encodes a message (refusing invalid ones) and
 * sends it, without blocking, on a DEALER socket cached per "tcp://host:port"
 * and reused; bounded SNDHWM and a short LINGER so neither a slow nor a dead
 * peer can hang the loop.
 *
 * Thread safety: none. One thread (the broker loop) owns a struct kvb_notify
 * and everything done with it, as ZMQ sockets require. Several instances may
 * share one ZMQ context (conf.zmq_ctx) from that thread.
 */
#ifndef KVB_BRIDGE_ZMQ_NOTIFY_H
#define KVB_BRIDGE_ZMQ_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

#include "zmq/blocks.h"
#include "zmq/codec.h"

#define KVB_NOTIFY_PORT_DEFAULT 61005
#define KVB_NOTIFY_MAX_SOCKS	2

enum kvb_notify_log_level {
	KVB_NOTIFY_LOG_WARN = 1,
	KVB_NOTIFY_LOG_INFO = 2,
};

/*
 * A decoded, valid message arrived on local port `port`. The message and its
 * block array are valid only during the call. The callback may call
 * kvb_notify_send() (e.g. write_done right away); it must not call
 * kvb_notify_recv() or kvb_notify_close() on the same endpoint. Return 0 when
 * taken, or -errno to have it counted as rejected (e.g. meant for the other
 * role, a terminal transfer, block ids out of the peer's range): it is then
 * counted in messages_rejected and logged (rate-limited, with the reason
 * given by kvb_notify_reject_why() during the call, else strerror(-ret)).
 */
typedef int (*kvb_notify_msg_fn)(void *arg, const struct kvb_zmsg *msg,
				 uint16_t port);

/* One formatted log line, without newline. */
typedef void (*kvb_notify_log_fn)(void *arg, int level, const char *line);

struct kvb_notify_conf {
	const char *host_ip;  /* bind address: "0.0.0.0", "10.1.2.3", "::1" */
	uint32_t notify_port; /* base port; 0 = KVB_NOTIFY_PORT_DEFAULT */
	uint32_t dp_rank;
	uint32_t tp_rank;
	uint32_t tp_size;
	/*
	 * Formula of the port that must bind (default dp*tp_size+tp). The
	 * other formula's port is bound too when it differs; if it is taken
	 * (EADDRINUSE: in one broker, another worker's port under the other
	 * formula) that is logged and skipped, not an error.
	 */
	enum kvb_port_formula formula;
	/*
	 * Leave the other formula's port to kvb_notify_bind_alias(). A broker
	 * opening several workers binds every primary port first, then the
	 * aliases, so that an alias never takes another worker's primary.
	 */
	bool defer_alias;
	kvb_notify_msg_fn on_msg; /* required */
	kvb_notify_log_fn on_log; /* optional */
	/*
	 * Optional: whether a message from this sender address (ZMQ's
	 * "Peer-Address" of the frame, e.g. "192.0.2.2") may be taken; one
	 * that may not is rejected (counted, logged rate-limited) before it
	 * is decoded.
	 */
	bool (*sender_ok)(void *arg, const char *addr);
	void *arg;	    /* passed to the callbacks */
	void *zmq_ctx;	    /* shared ZMQ context; NULL = own one */
	int sndhwm;	    /* per DEALER; 0 = 1000 */
	int linger_ms;	    /* per DEALER; 0 = 100; < 0 = 0 */
	uint32_t max_peers; /* cached DEALERs; 0 = 256; LRU evicted */
};

struct kvb_notify_stats {
	uint64_t messages_received; /* payloads read off the ROUTERs */
	uint64_t messages_accepted; /* decoded and taken by on_msg */
	uint64_t messages_rejected; /* bad frames, bad payloads, on_msg < 0 */
	uint64_t messages_sent;
	uint64_t send_errors; /* kvb_notify_send() failures */
	uint64_t peers;	      /* DEALERs cached now */
	uint64_t peer_evictions;
	uint64_t logs_suppressed; /* reject logs dropped by the rate limit */
};

struct kvb_notify;

/*
 * Bind the ROUTER sockets of one worker identity. Returns 0 with *out set, or
 * -EINVAL (bad conf, tp_rank >= tp_size), -ERANGE (port past 65535),
 * -EADDRINUSE (the configured-formula port is taken) or another -errno from
 * ZMQ. Nothing is left behind on failure.
 */
int kvb_notify_open(struct kvb_notify **out,
		    const struct kvb_notify_conf *conf);

/*
 * Bind the other formula's port now (after open with defer_alias). Returns 0
 * when bound, already bound or equal to the primary; -EADDRINUSE when taken
 * (logged; the endpoint works on its primary port); other -errno.
 */
int kvb_notify_bind_alias(struct kvb_notify *n);

/* The alias port's socket descriptor (kvb_notify_fds), -1 if not bound. */
int kvb_notify_alias_fd(const struct kvb_notify *n);

/*
 * Close the alias port's ROUTER (another endpoint needs that port as its
 * primary one) and never bind it again; the primary port stays as it is.
 * Take kvb_notify_alias_fd() out of a poll set first.
 */
void kvb_notify_drop_alias(struct kvb_notify *n);

/* Close every socket (pending sends are dropped after linger_ms) and free. */
void kvb_notify_close(struct kvb_notify *n);

/*
 * The ROUTER sockets' ZMQ_FD descriptors, for epoll/poll (EPOLLIN). They are
 * edge-style: after a wakeup call kvb_notify_recv() until it returns less
 * than its budget; a spurious wakeup just reads 0. Returns the count (1 or
 * 2) written to fds[0..max), or -ENOSPC when max is too small.
 */
int kvb_notify_fds(struct kvb_notify *n, int *fds, int max);

/* The bound ports (1 or 2), like kvb_notify_fds(). ports[0] is the primary. */
int kvb_notify_ports(struct kvb_notify *n, uint16_t *ports, int max);

/*
 * From inside on_msg, before it returns -errno: why the message is refused
 * (a string that outlives the call, e.g. a literal). The endpoint logs it in
 * its one rate-limited line for that rejection, so the callback need not log.
 */
void kvb_notify_reject_why(struct kvb_notify *n, const char *why);

/*
 * Read and dispatch up to budget pending messages, never blocking. Returns
 * how many payloads were handled (good or bad): budget means more may be
 * pending, so call again before sleeping on the fds. -errno only for a
 * failure of the sockets themselves (e.g. -ETERM).
 */
int kvb_notify_recv(struct kvb_notify *n, unsigned int budget);

/*
 * Encode msg and queue it for tcp://host:port without blocking. Returns 0
 * (queued: ZMQ delivers it once connected), -EINVAL (invalid msg, host or
 * port), -EAGAIN (the peer's queue is full: SNDHWM reached), -ENOMEM, or
 * another -errno from ZMQ. Failures count in send_errors.
 */
int kvb_notify_send(struct kvb_notify *n, const char *host, uint32_t port,
		    const struct kvb_zmsg *msg);

/* Copy the counters. */
void kvb_notify_get_stats(const struct kvb_notify *n,
			  struct kvb_notify_stats *st);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * The `tcp` transport: one-sided WRITE and READ between two brokers over
 * TCP, what the broker uses across nodes without RDMA hardware.
 *
 * Each broker opens one transport (a listening socket); a peer's
 * local_info() blob is enough to connect() (no ep_info round trip). An
 * endpoint is one outgoing connection: this side sends requests on it (WRITE
 * with payload, READ requests) and the peer answers with acks and READ
 * payloads. Connections the peer dials to us are served inside poll(): the
 * receiver checks every (region, offset, length) against the regions
 * registered here and their KVB_MEM_REMOTE_WRITE / KVB_MEM_REMOTE_READ
 * flags before landing a byte. Frame format, rules and counters: docs/tcp.md.
 *
 * Regions: host memory, and GPU memory (KVB_MEM_GPU) once a gpu backend is
 * chosen (kvb_gpu_backend_init): its payload is copied through a host
 * staging buffer per connection and direction (TCP_STAGE bytes) by the
 * runtime's synchronous memcpy, in the same thread; a copy that fails
 * fails its op with -EIO (zeros go on the wire in its place).
 *
 * Single-threaded and non-blocking: every call does bounded work and never
 * sleeps. The broker sleeps on ops->wait_fd() (an epoll fd) and calls poll()
 * when it turns readable; not thread-safe, one thread owns a transport.
 */
#ifndef KVB_BRIDGE_TCP_TCP_H
#define KVB_BRIDGE_TCP_TCP_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

extern const struct kvb_transport_ops kvb_tcp_ops;

/* Size of the local_info() blob (version 1). */
#define KVB_TCP_BLOB_LEN 40

/* Largest single op (bigger ones complete with -EMSGSIZE). */
#define KVB_TCP_MAX_OP (1ull << 30)

struct kvb_tcp_stats {
	uint64_t writev_calls;	  /* sendmsg calls, both roles */
	uint64_t frames_tx;	  /* frames queued for sending */
	uint64_t frames_rx;	  /* frames received whole */
	uint64_t bytes_tx;	  /* socket bytes sent */
	uint64_t bytes_rx;	  /* socket bytes received */
	uint64_t rejected;	  /* malformed frames: connection closed */
	uint64_t refused_ops;	  /* remote ops answered with an error status */
	uint64_t conn_accepted;	  /* connections accepted */
	uint64_t conn_failed;	  /* endpoint connections lost or not made */
	uint64_t reconnects;	  /* dials of an endpoint after its first */
	uint64_t conns_open;	  /* accepted connections open now */
	uint64_t eps_open;	  /* endpoints now */
	uint64_t gpu_tx_bytes;	  /* GPU payload copied out to be sent */
	uint64_t gpu_rx_bytes;	  /* received payload copied into GPU memory */
	uint64_t gpu_copy_errors; /* such copies that failed (op: -EIO) */
	uint64_t ops_merged; /* WRITEs sent in the record of the one before */
	/* connections refused on the data port, by reason (docs/tcp.md) */
	uint64_t refused_untrusted;    /* source not in the trusted list */
	uint64_t refused_auth_failed;  /* bad HELLO / unknown peer / bad MAC */
	uint64_t refused_auth_timeout; /* no valid PROOF within the deadline */
	uint64_t refused_conn_limit;   /* total or per-host cap, fd reserve */
	uint64_t refused_region;   /* ops on a region not offered to the peer */
	uint64_t accept_paused;	   /* accept() hit EMFILE/ENFILE: paused */
	uint64_t conns_unauth;	   /* accepted, not yet authenticated, now */
	uint64_t auth_ok;	   /* connections authenticated (served) */
	uint64_t dial_auth_failed; /* our dials whose server failed its MAC */
	uint64_t refused_gate;	   /* WRITEs the write gate refused */
	uint64_t refused_read_gate; /* READs the read gate refused */
	/* not authenticated, closed for a newer connection from the same
	 * host (its unauthenticated budget full) or the port full */
	uint64_t unauth_evicted;
};

/* Per-peer key (HMAC-SHA512-256, libsodium crypto_auth) */
#define KVB_TCP_KEY_LEN KVB_TRANSPORT_KEY_LEN

/* ops->auth: the functions below */
extern const struct kvb_transport_auth_ops kvb_tcp_auth_ops;

/* ops->stats_format: the transport's counters ("tcp" object / a line) */
size_t kvb_tcp_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			    int json, char *buf, size_t cap);

/* Defaults of kvb_tcp_set_limits() */
#define KVB_TCP_MAX_CONNS_DEF	       256u
#define KVB_TCP_MAX_CONNS_PER_HOST_DEF 32u
#define KVB_TCP_AUTH_MS_DEF	       2000u

/* The port the transport listens on (useful with tcp_port 0), or -EINVAL. */
int kvb_tcp_port(struct kvb_transport *t);

/*
 * Copy the transport's counters to *out. Same thread as poll().
 */
void kvb_tcp_get_stats(struct kvb_transport *t, struct kvb_tcp_stats *out);

/*
 * connect() for a peer whose blob names no address (it listens on 0.0.0.0
 * or ::): dial `host` (a numeric IPv4 or IPv6 address, normally the one the
 * broker used to reach the peer's control channel) at the blob's port.
 * Also usable with a blob that has an address: `host` wins. The blob is
 * checked as by connect(). Returns 0, -EPROTO (bad blob), -EINVAL (host not
 * a numeric address) or -ENOMEM. Same thread as poll().
 */
int kvb_tcp_connect_host(struct kvb_transport *t, const void *blob, size_t len,
			 const char *host, struct kvb_ep **ep);

/*
 * Build a version-1 blob for a peer known only by address and port (tools,
 * tests: kvb-tcp-bench --connect). `ip` is numeric; `nonce` may be 0.
 * *len: capacity in, size out. Returns 0, -ENOSPC (*len = size needed) or
 * -EINVAL.
 */
int kvb_tcp_blob_make(const char *ip, uint16_t port, uint64_t nonce, void *blob,
		      size_t *len);

/*
 * Authentication of the data port (docs/tcp.md, "Authentication"). Every
 * served connection must, first thing, prove a key the server knows for
 * the dialer's id (its transport's nonce: kvb_tcp_id()) by
 * challenge-response; until then not a byte of a frame is read. The
 * server's challenge proves the key back to the dialer.
 */

/* This transport's id (the nonce of its blob). */
uint64_t kvb_tcp_id(struct kvb_transport *t);

/* The id (nonce) a peer's blob carries: 0 or -EPROTO. */
int kvb_tcp_blob_id(const void *blob, size_t len, uint64_t *id);

/*
 * Serving side: the dialer whose id is `id` (0 = any dialer: tools and
 * tests with a shared key) may connect proving `key`, and address only the
 * regions regions[0..n) (in their KVB_MEM_REMOTE_* flags); n < 0 = every
 * registered region. Replaces an earlier entry of that id (its open
 * connections keep going under the new region list). 0, -ENOMEM, -ENOSPC
 * (4096 entries) or -EINVAL.
 */
int kvb_tcp_peer_allow(struct kvb_transport *t, uint64_t id,
		       const uint8_t key[KVB_TCP_KEY_LEN],
		       const uint32_t *regions, int n);
/*
 * A fixed key for tools and benchmarks that run both sides themselves
 * (kvb-tcp-bench, kvbench's direct mode): public, so it protects nothing;
 * a broker never uses it.
 */
extern const uint8_t kvb_tcp_tool_key[KVB_TCP_KEY_LEN];

/*
 * Serving side: an optional check of every WRITE record that passed the
 * region checks, before a byte of its payload lands: fn(arg, region, off,
 * len) returns 0 (it lands) or the negative status the op is answered with
 * (its payload is read into the discard buffer; counted in refused_ops and
 * refused_gate). The broker refuses writes into KV blocks no live transfer
 * holds. NULL fn: none (the default). Same thread as poll().
 */
typedef kvb_write_gate_fn kvb_tcp_gate_fn;
void kvb_tcp_set_write_gate(struct kvb_transport *t, kvb_tcp_gate_fn fn,
			    void *arg);
/* The same for every READ record (counted in refused_ops and
 * refused_read_gate; nothing of it is sent). The broker serves a P
 * worker's KV blocks only while one of its READ transfers holds them. */
void kvb_tcp_set_read_gate(struct kvb_transport *t, kvb_tcp_gate_fn fn,
			   void *arg);
/*
 * Ask the gate again about the WRITE records whose payload is still being
 * received (the frame's header came before the gate changed its mind): the
 * rest of a refused one is discarded. Same thread as poll().
 */
void kvb_tcp_gate_recheck(struct kvb_transport *t);

/* Drop the entry of `id` and close the connections it authenticated. */
void kvb_tcp_peer_forget(struct kvb_transport *t, uint64_t id);

/*
 * Dialing side: the key every stripe of ep (a connect() result) proves; an
 * endpoint without one fails its dials with -ENOKEY. 0 or -EINVAL.
 */
int kvb_tcp_ep_set_key(struct kvb_transport *t, struct kvb_ep *ep,
		       const uint8_t key[KVB_TCP_KEY_LEN]);

/*
 * Only these source addresses (numeric IPv4/IPv6; IPv4-mapped IPv6 peers
 * match their IPv4 form) may connect: others are closed at accept, before
 * a byte is read. n = 0: any. 0, -EINVAL (not numeric) or -ENOSPC (> 64).
 */
int kvb_tcp_set_trusted(struct kvb_transport *t, const char *const *hosts,
			unsigned n);

/*
 * Caps: connections served in all (0 = KVB_TCP_MAX_CONNS_DEF), from one
 * source address (0 = KVB_TCP_MAX_CONNS_PER_HOST_DEF), and the ms a new
 * connection has to authenticate (0 = KVB_TCP_AUTH_MS_DEF).
 */
void kvb_tcp_set_limits(struct kvb_transport *t, unsigned max_conns,
			unsigned max_per_host, unsigned auth_ms);

/*
 * Lines about refused connections and ops (at most one a second per kind,
 * with the count of those suppressed) go to fn; NULL = none.
 */
void kvb_tcp_set_log(struct kvb_transport *t,
		     void (*fn)(void *arg, const char *line), void *arg);

#endif /* KVB_BRIDGE_TCP_TCP_H */

/* SPDX-License-Identifier: MIT */
/*
 * The broker's Prometheus endpoint (--metrics-listen ADDR:PORT) and the
 * views `kvbctl workers|transfers|peers|nics|regions` print (docs/metrics.md,
 * docs/kvbctl.md). The HTTP server is non-blocking and runs in the broker's
 * own epoll loop: no thread, no lock, no copy of the counters.
 */
#ifndef KVB_BROKER_METRICS_H
#define KVB_BROKER_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct kvb_broker;
struct kvb_xfer;

/* epoll data of the endpoint's fds: tag | index (KVB_MX_LISTEN_IDX: the
 * listening socket, else a connection slot) */
#define KVB_EP_METRICS_TAG 0x400000000ull
#define KVB_MX_LISTEN_IDX  0xffffu

/* bounds on what a client of the endpoint can take: connections at once
 * (more are closed), bytes of request line and headers, ms to send the
 * request and again to read the answer */
#define KVB_MX_MAX_CONNS  16u
#define KVB_MX_REQ_MAX	  8192u
#define KVB_MX_TIMEOUT_MS 5000
/* connections of one source address at once; a new one past it (or past
 * KVB_MX_MAX_CONNS) takes the place of the oldest one still sending its
 * request, of that address (or of the address that holds the most) */
#define KVB_MX_PER_SOURCE 4u

/* transfer latency histogram: upper bounds in ns (+Inf implied) */
#define KVB_MX_LAT_BUCKETS 14u

/* why transfers failed: the reason label of the failure counters */
enum kvb_mx_reason {
	KVB_MX_R_TIMEOUT = 0, /* -ETIMEDOUT: a deadline or stall clock */
	KVB_MX_R_ABORTED,     /* -ECANCELED: aborted, or its worker left */
	KVB_MX_R_NETWORK,     /* the peer or the network: resets, unreachable */
	KVB_MX_R_IO,	      /* -EIO: a transport's operation failed */
	KVB_MX_R_INVALID,     /* -EINVAL, -EFAULT, -ERANGE: bad descriptors */
	KVB_MX_R_REFUSED,     /* -EPERM, -EACCES, -ESTALE: not allowed */
	KVB_MX_R_RESOURCES,   /* -ENOSPC, -ENOMEM, -EAGAIN, -ENOBUFS */
	KVB_MX_R_OTHER,
	KVB_MX_R_MAX
};

/* The reason label of a failed transfer's status (a -errno). */
enum kvb_mx_reason kvb_mx_reason_of(int status);
const char *kvb_mx_reason_name(enum kvb_mx_reason r);

/*
 * Set up the endpoint when --metrics-listen is given (else nothing: 0 and
 * b->mx stays NULL): bind, listen, register with the broker's epoll. 0 or
 * -errno (logged: a bad address, a port in use).
 */
int kvb_metrics_init(struct kvb_broker *b);
/* --metrics-listen's form (numeric ADDR:PORT, port <= 65535): 0 or -EINVAL,
 * without binding (the start-up check of the configuration). */
int kvb_metrics_check_listen(const char *spec);
void kvb_metrics_fini(struct kvb_broker *b);
/* An epoll event whose tag has KVB_EP_METRICS_TAG. */
void kvb_metrics_event(struct kvb_broker *b, uint64_t tag, uint32_t events);
/* Close connections past their time; called every few ms. */
void kvb_metrics_timers(struct kvb_broker *b, int64_t now);
/* A transfer ends with status: latency, outcome and reason, per worker.
 * Integer increments only; nothing without --metrics-listen. */
void kvb_metrics_xfer_end(struct kvb_broker *b, const struct kvb_xfer *x,
			  int status);

/*
 * The exposition of everything into a growing buffer: Prometheus text
 * format 0.0.4, or OpenMetrics 1.0.0 (with `# EOF`). Returns 0 or -ENOMEM;
 * *out is malloc'd (the caller frees it), *len its length.
 */
int kvb_metrics_render(struct kvb_broker *b, int openmetrics, char **out,
		       size_t *len);

/* One cross-node peer as `kvbctl peers` and the peers gauge see it. */
struct kvb_peer_info {
	uint32_t id;
	char host[64];
	uint16_t port;
	const char *state; /* "handshaking", "ready", "failed" */
	uint8_t stale;	   /* a transport error: refreshed before next use */
	char node[256];	   /* its node id ("" before its descriptor) */
	uint32_t nworkers;
	const char *transport; /* "tcp", "rdma", "none" */
	uint64_t handshakes, failures;
	int last_err; /* -errno of its last failure, 0 = none */
};

/* kvbctl's views (KVB_MSG_STATS's view field) */
enum kvb_stats_view {
	KVB_VIEW_STATS = 0, /* the counters: kvb_stats_format */
	KVB_VIEW_WORKERS = 1,
	KVB_VIEW_TRANSFERS = 2,
	KVB_VIEW_PEERS = 3,
	KVB_VIEW_NICS = 4,    /* the rdma transport's NICs: nics.c */
	KVB_VIEW_REGIONS = 5, /* regions and their NICs: nics.c */
};

/* A view as text or JSON into buf (NUL-terminated): its length, or
 * -EINVAL for an unknown view. */
int kvb_view_format(struct kvb_broker *b, uint32_t view, int json, char *buf,
		    size_t cap);

/* KVB_VIEW_NICS or KVB_VIEW_REGIONS (nics.c), as kvb_view_format. */
int kvb_view_nics(struct kvb_broker *b, uint32_t view, int json, char *buf,
		  size_t cap);

struct kvb_transport_nic;
/* The rdma transport's NICs (ops->nics), at most max into out: how many,
 * or -ENOTSUP when there is no such transport or it tells none. */
int kvb_nics_get(struct kvb_broker *b, struct kvb_transport_nic *out,
		 unsigned max);
/* Append the NICs to buf at *len: JSON a `"nics":[...]` member (empty
 * without them), text a table (nothing without them). */
void kvb_nics_put(struct kvb_broker *b, int json, char *buf, size_t cap,
		  size_t *len);

#endif

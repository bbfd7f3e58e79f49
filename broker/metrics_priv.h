/* SPDX-License-Identifier: MIT */
/* The metrics endpoint's state, shared by http.c and metrics.c. */
#ifndef KVB_BROKER_METRICS_PRIV_H
#define KVB_BROKER_METRICS_PRIV_H

#include "broker.h"
#include <sys/socket.h>

#include "metrics.h"

/* what a client of the endpoint was refused (the reason label) */
enum kvb_mx_refusal {
	KVB_MX_REF_CONNS = 0, /* past KVB_MX_MAX_CONNS: closed at accept */
	KVB_MX_REF_TOO_LARGE, /* request past KVB_MX_REQ_MAX: 431 */
	KVB_MX_REF_TIMEOUT,   /* not sent or not read in KVB_MX_TIMEOUT_MS */
	KVB_MX_REF_METHOD,    /* not GET: 405 */
	KVB_MX_REF_NOT_FOUND, /* not /metrics: 404 */
	KVB_MX_REF_BAD,	      /* not an HTTP/1.x request line: 400 */
	KVB_MX_REF_EVICTED,   /* still sending its request when a newer one
			       * needed its slot: closed */
	KVB_MX_REF_MAX
};

struct kvb_mx_conn {
	int fd; /* -1 = slot free */
	uint8_t writing;
	int64_t deadline;
	int64_t accepted; /* ns: the oldest reader gives its slot up first */
	struct sockaddr_storage src; /* the peer's address (port ignored) */
	uint32_t rlen;
	char req[KVB_MX_REQ_MAX];
	char head[256]; /* the response's status line and headers */
	size_t hlen;
	char *body; /* malloc'd (a scrape) or NULL */
	size_t blen;
	size_t sent; /* of head, then body */
};

/* per worker slot: transfers it owned that ended, for worker id `id` */
struct kvb_mx_worker {
	uint32_t id;
	uint64_t done;
	uint64_t failed[KVB_MX_R_MAX];
};

struct kvb_metrics {
	int lfd;
	char addr[80]; /* the address it listens on, for the log */
	struct kvb_mx_conn conns[KVB_MX_MAX_CONNS];
	uint32_t nconns;
	uint64_t scrapes[2]; /* [0] text format 0.0.4, [1] OpenMetrics */
	uint64_t render_ns;  /* the broker loop's time spent rendering */
	uint64_t refused[KVB_MX_REF_MAX];
	/* transfer latency: [0] done, [1] failed; the last bucket is +Inf */
	uint64_t lat[2][KVB_MX_LAT_BUCKETS + 1];
	uint64_t lat_sum_ns[2];
	uint64_t failed[KVB_MX_R_MAX];
	struct kvb_mx_worker *wk; /* opt.max_workers slots */
};

extern const int64_t kvb_mx_lat_bounds_ns[KVB_MX_LAT_BUCKETS];
extern const char *const kvb_mx_refusal_names[KVB_MX_REF_MAX];

#endif

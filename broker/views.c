/* SPDX-License-Identifier: MIT */
/*
 * `kvbctl workers`, `kvbctl transfers`, `kvbctl peers` (`nics` and `regions`:
 * nics.c): the broker's tables
 * as text or JSON, in the reply to a STATS request whose view field names
 * them (docs/kvbctl.md). Rows that do not fit in one reply (KVB_MSG_MAX)
 * are counted ("omitted"), never cut, so the JSON stays whole.
 */
#include "broker.h"
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvbroker/kvbroker.h"

#define ROW_ROOM 640u /* a row and what follows it */

struct vout {
	char *buf;
	size_t cap, len;
};

__attribute__((format(printf, 2, 3))) static void put(struct vout *o,
						      const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvb_transport_vput(o->buf, o->cap, &o->len, fmt, ap);
	va_end(ap);
}

/* A string from a worker or a peer: JSON-escaped, or printable in text. */
static void put_str(struct vout *o, const char *s, int json)
{
	if (json)
		put(o, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char) *s;

		if (json && (c == '"' || c == '\\'))
			put(o, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			put(o, json ? "\\u%04x" : "\\x%02x", c);
		else
			put(o, "%c", c);
	}
	if (json)
		put(o, "\"");
}

static const char *role_name(uint32_t role)
{
	return role == KVB_ROLE_P ? "P" : "D";
}

static void workers(struct kvb_broker *b, struct vout *o, int json)
{
	unsigned omitted = 0;

	if (json)
		put(o, "{\"workers\":[");
	else
		put(o,
		    "%-8s %-4s %-3s %-7s %-8s %12s %12s %9s %14s %11s %11s "
		    "%6s %8s\n",
		    "worker", "role", "dp", "tp", "pid", "submitted",
		    "completed", "refused", "bytes", "sq_fill", "cq_fill",
		    "xfers", "inflight");
	for (uint32_t i = 0, k = 0; i < b->nlive; i++) {
		const struct kvb_worker *w = &b->workers[b->live[i]];
		uint32_t sq = kvb_ring_count(&w->seg.sq),
			 cq = kvb_ring_count(&w->seg.cq);

		if (o->cap - o->len < ROW_ROOM) {
			omitted++;
			continue;
		}
		if (json)
			put(o,
			    "%s{\"id\":%u,\"role\":\"%s\",\"dp_rank\":%u,"
			    "\"tp_rank\":%u,\"tp_size\":%u,\"pid\":%d,"
			    "\"submitted\":%llu,\"completed\":%llu,"
			    "\"refused\":%llu,\"bytes\":%llu,\"sq_fill\":%u,"
			    "\"sq_entries\":%u,\"cq_fill\":%u,"
			    "\"cq_entries\":%u,\"undelivered\":%u,"
			    "\"transfers\":%u,\"inflight\":%u}",
			    k++ ? "," : "", w->id, role_name(w->role),
			    w->dp_rank, w->tp_rank, w->tp_size, (int) w->pid,
			    (unsigned long long) w->st.submitted,
			    (unsigned long long) w->st.completed,
			    (unsigned long long) w->st.refused,
			    (unsigned long long) w->st.bytes, sq,
			    w->seg.sq.entries, cq, w->seg.cq.entries,
			    w->ovf_len, kvb_xfers_charged(&b->xfers, w->id),
			    w->inf_used);
		else
			put(o,
			    "%-8u %-4s %-3u %3u/%-3u %-8d %12llu %12llu %9llu "
			    "%14llu %5u/%-5u %5u/%-5u %6u %8u\n",
			    w->id, role_name(w->role), w->dp_rank, w->tp_rank,
			    w->tp_size, (int) w->pid,
			    (unsigned long long) w->st.submitted,
			    (unsigned long long) w->st.completed,
			    (unsigned long long) w->st.refused,
			    (unsigned long long) w->st.bytes, sq,
			    w->seg.sq.entries, cq, w->seg.cq.entries,
			    kvb_xfers_charged(&b->xfers, w->id), w->inf_used);
	}
	if (json)
		put(o, "],\"omitted\":%u}\n", omitted);
	else if (omitted)
		put(o, "(%u more workers: the reply is full)\n", omitted);
}

/* What a transfer waits for, in a word. */
static const char *xfer_state(const struct kvb_broker *b,
			      const struct kvb_xfer *x)
{
	if (x->closing)
		return "failing"; /* waits for its ops in flight */
	if (x->rx && kvb_hook_xfer_deferred(b, x))
		return "deferred"; /* waits for the peer */
	if (x->sealed)
		return "sealed";
	if (x->submitted > x->completed + x->failed)
		return "running";
	return x->opened ? "open" : "incoming";
}

static void transfers(struct kvb_broker *b, struct vout *o, int json)
{
	int64_t now = kvb_now_ns();
	unsigned omitted = 0;

	if (json)
		put(o, "{\"transfers\":[");
	else
		put(o, "%-10s %-8s %-9s %-10s %10s %9s %9s %9s %9s  %s\n",
		    "handle", "worker", "state", "where", "age_ms", "submitted",
		    "completed", "failed", "expected", "id");
	for (uint32_t i = 0, k = 0; i < b->xfers.nactive; i++) {
		const struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		long long age = (long long) ((now - x->opened_ns) / 1000000);
		uint32_t h = kvb_xfer_handle(&b->xfers, x);

		if (o->cap - o->len < ROW_ROOM + 4 * KVB_XFER_ID_MAX) {
			omitted++;
			continue;
		}
		if (json) {
			put(o,
			    "%s{\"handle\":%u,\"worker\":%u,\"state\":\"%s\","
			    "\"remote\":%s,\"age_ms\":%lld,\"submitted\":%u,"
			    "\"completed\":%u,\"failed\":%u,\"expected\":%u,"
			    "\"sealed\":%u,\"id\":",
			    k++ ? "," : "", h, x->worker, xfer_state(b, x),
			    x->rx ? "true" : "false", age, x->submitted,
			    x->completed, x->failed, x->expected, x->sealed);
			put_str(o, x->id, 1);
			put(o, "}");
		} else {
			put(o, "%#-10x %-8u %-9s %-10s %10lld %9u %9u %9u ", h,
			    x->worker, xfer_state(b, x),
			    x->rx ? "cross-node" : "local", age, x->submitted,
			    x->completed, x->failed);
			if (x->sealed)
				put(o, "%9u  ", x->expected);
			else
				put(o, "%9s  ", "-");
			put_str(o, x->id, 0);
			put(o, "\n");
		}
	}
	if (json)
		put(o, "],\"active\":%u,\"omitted\":%u}\n", b->xfers.nactive,
		    omitted);
	else if (omitted)
		put(o, "(%u more transfers: the reply is full)\n", omitted);
}

static void peers(struct kvb_broker *b, struct vout *o, int json)
{
	struct kvb_peer_info pi;
	unsigned omitted = 0, k = 0;
	int rc;

	if (json)
		put(o, "{\"cross_node\":%s,\"peers\":[",
		    kvb_engine_ctx(b) ? "true" : "false");
	else if (!kvb_engine_ctx(b))
		put(o, "(no cross-node bridge: the broker runs without "
		       "--host-ip)\n");
	else
		put(o, "%-5s %-28s %-12s %-6s %-6s %8s %11s %9s  %s\n", "peer",
		    "address", "state", "stale", "over", "workers",
		    "handshakes", "failures", "node");
	for (uint32_t i = 1; (rc = kvb_hook_peer_info(b, i, &pi)) != -ERANGE;
	     i++) {
		char addr[80];

		if (rc)
			continue;
		if (o->cap - o->len < ROW_ROOM + 4 * sizeof(pi.node)) {
			omitted++;
			continue;
		}
		snprintf(addr, sizeof(addr), "%s:%u", pi.host, pi.port);
		if (json) {
			put(o, "%s{\"id\":%u,\"host\":", k++ ? "," : "", pi.id);
			put_str(o, pi.host, 1);
			put(o,
			    ",\"port\":%u,\"state\":\"%s\",\"stale\":%u,"
			    "\"transport\":\"%s\",\"workers\":%u,"
			    "\"handshakes\":%llu,\"failures\":%llu,"
			    "\"last_error\":%d,\"node\":",
			    pi.port, pi.state, pi.stale, pi.transport,
			    pi.nworkers, (unsigned long long) pi.handshakes,
			    (unsigned long long) pi.failures, pi.last_err);
			put_str(o, pi.node, 1);
			put(o, "}");
		} else {
			put(o, "%-5u ", pi.id);
			put_str(o, addr, 0);
			put(o, "%*s %-12s %-6s %-6s %8u %11llu %9llu  ",
			    (int) (strlen(addr) < 28 ? 28 - strlen(addr) : 0),
			    "", pi.state, pi.stale ? "yes" : "no", pi.transport,
			    pi.nworkers, (unsigned long long) pi.handshakes,
			    (unsigned long long) pi.failures);
			put_str(o, pi.node[0] ? pi.node : "-", 0);
			if (pi.last_err)
				put(o, " (last error: %s)",
				    kvb_strerror(pi.last_err));
			put(o, "\n");
		}
	}
	if (json)
		put(o, "],\"omitted\":%u}\n", omitted);
	else if (omitted)
		put(o, "(%u more peers: the reply is full)\n", omitted);
}

int kvb_view_format(struct kvb_broker *b, uint32_t view, int json, char *buf,
		    size_t cap)
{
	struct vout o = {.buf = buf, .cap = cap};

	if (!cap)
		return -EINVAL;
	buf[0] = '\0';
	switch (view) {
	case KVB_VIEW_STATS:
		return (int) kvb_stats_format(b, json, buf, cap);
	case KVB_VIEW_WORKERS:
		workers(b, &o, json);
		break;
	case KVB_VIEW_TRANSFERS:
		transfers(b, &o, json);
		break;
	case KVB_VIEW_PEERS:
		peers(b, &o, json);
		break;
	case KVB_VIEW_NICS:
	case KVB_VIEW_REGIONS:
		return kvb_view_nics(b, view, json, buf, cap);
	default:
		return -EINVAL;
	}
	return (int) o.len;
}

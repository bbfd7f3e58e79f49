/* SPDX-License-Identifier: MIT */
/* Cross-node counters for `kvbctl stats` (see xnode.c). */
#include "xnode_priv.h"
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "zmq/blocks.h"
#include "zmq/codec.h"
#include "zmq/handshake.h"
#include "zmq/notify.h"

/* ------------------------------------------------------------------ */
/* stats */

#define PUT(...) kvb_transport_put(buf, cap, &len, __VA_ARGS__)

/* A JSON string value: node ids and hosts come from peers' descriptors and
 * may hold '"' or '\\' (control characters are refused at decode, but are
 * escaped here all the same). */
static void put_jstr(char *buf, size_t cap, size_t *lenp, const char *s)
{
	size_t len = *lenp;

	PUT("\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char) *s;

		if (c == '"' || c == '\\')
			PUT("\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			PUT("\\u%04x", c);
		else
			PUT("%c", c);
	}
	PUT("\"");
	*lenp = len;
}

/* A transport's section (ep NULL) or one endpoint's, if it has one. */
static void tr_stats(struct kvb_transport *t, struct kvb_ep *ep, int json,
		     char *buf, size_t cap, size_t *lenp)
{
	if (t && t->ops->stats_format && *lenp < cap)
		*lenp += t->ops->stats_format(t, ep, json, buf + *lenp,
					      cap - *lenp);
}

/* Notify messages of all workers' endpoints, the closed ones' included. */
struct notify_sums {
	uint64_t rx, rej, sent, serr;
};

static void notify_sums(struct kvb_broker *b, const struct kvb_xn *xn,
			struct notify_sums *t)
{
	t->rx = xn->st.notify_received_closed;
	t->rej = xn->st.notify_rejected_closed + xn->st.hs_bad_replies;
	t->sent = xn->st.notify_sent_closed;
	t->serr = xn->st.send_errors_closed + xn->st.send_errors;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];
		struct kvb_notify *n = kvb_xn_w(xn, w)->notify;
		struct kvb_notify_stats st;

		if (!n)
			continue;
		kvb_notify_get_stats(n, &st);
		t->rx += st.messages_received;
		t->rej += st.messages_rejected;
		t->sent += st.messages_sent;
		t->serr += st.send_errors;
	}
}

/* The module's counters, as the "remote" object's first members. */
static void counters_json(const struct kvb_xn *xn, const struct notify_sums *t,
			  char *buf, size_t cap, size_t *lenp)
{
	uint64_t rx = t->rx, rej = t->rej, sent = t->sent, serr = t->serr;
	size_t len = *lenp;

	PUT("\"remote\":{\"messages_received\":%llu,"
	    "\"messages_rejected\":%llu,\"messages_sent\":%llu,"
	    "\"send_errors\":%llu,\"handshakes_served\":%llu,"
	    "\"handshakes_refused\":%llu,\"handshakes_sent\":%llu,"
	    "\"handshakes_failed\":%llu,\"layer_ops\":%llu,"
	    "\"layers_deferred\":%llu,\"defer_expired\":%llu,"
	    "\"remote_blocks_sent\":%llu,\"write_done_sent\":%llu,"
	    "\"releases_sent\":%llu,\"remote_blocks_received\":%llu,"
	    "\"write_done_received\":%llu,\"releases_received\":%llu,"
	    "\"write_failed_sent\":%llu,\"write_failed_received\":%llu,"
	    "\"layers_starved\":%llu,"
	    "\"handshake_replies_rejected\":%llu,"
	    "\"logs_suppressed\":%llu,\"unopened_evicted\":%llu,"
	    "\"unopened_held\":%u,"
	    "\"peers_reclaimed\":%llu,\"duplicate_opens\":%llu,"
	    "\"opens_batched\":%llu,\"opens_waiting\":%llu,"
	    "\"handshake_wait_failed\":%llu,\"release_only_sent\":%llu,"
	    "\"release_only_failed\":%llu,"
	    "\"peers_lost\":%llu,"
	    "\"peers_back\":%llu,\"heartbeats_sent\":%llu,"
	    "\"heartbeats_answered\":%llu,\"heartbeats_served\":%llu,"
	    "\"heartbeats_refused\":%llu,\"heartbeat_answers_rejected\":%llu,"
	    "\"unopened_expired\":%llu,\"expects\":%llu,\"withdraws\":%llu,"
	    "\"expects_refused\":%llu,\"unknown_expired\":%llu,"
	    "\"withdrawn_told\":%llu,\"lost_refused\":%llu,"
	    "\"announcements_joined\":%llu,\"descriptor_refreshes\":%llu,",
	    (unsigned long long) rx, (unsigned long long) rej,
	    (unsigned long long) sent, (unsigned long long) serr,
	    (unsigned long long) xn->st.hs_served,
	    (unsigned long long) xn->st.hs_refused,
	    (unsigned long long) xn->st.hs_sent,
	    (unsigned long long) xn->st.hs_failed,
	    (unsigned long long) xn->st.layer_ops,
	    (unsigned long long) xn->st.layers_deferred,
	    (unsigned long long) xn->st.defer_expired,
	    (unsigned long long) xn->st.remote_blocks_sent,
	    (unsigned long long) xn->st.write_done_sent,
	    (unsigned long long) xn->st.releases_sent,
	    (unsigned long long) xn->st.remote_blocks_rx,
	    (unsigned long long) xn->st.write_done_rx,
	    (unsigned long long) xn->st.releases_rx,
	    (unsigned long long) xn->st.write_failed_sent,
	    (unsigned long long) xn->st.write_failed_rx,
	    (unsigned long long) xn->st.layers_starved,
	    (unsigned long long) xn->st.hs_bad_replies,
	    (unsigned long long) xn->st.logs_suppressed,
	    (unsigned long long) xn->st.unopened_evicted, xn->nunopened,
	    (unsigned long long) xn->st.peers_reclaimed,
	    (unsigned long long) xn->st.duplicate_opens,
	    (unsigned long long) xn->st.opens_batched,
	    (unsigned long long) xn->st.opens_waiting,
	    (unsigned long long) xn->st.hs_wait_failed,
	    (unsigned long long) xn->st.release_only_sent,
	    (unsigned long long) xn->st.release_only_failed,
	    (unsigned long long) xn->st.peers_lost,
	    (unsigned long long) xn->st.peers_back,
	    (unsigned long long) xn->st.hb_sent,
	    (unsigned long long) xn->st.hb_answered,
	    (unsigned long long) xn->st.hb_served,
	    (unsigned long long) xn->st.hb_refused,
	    (unsigned long long) xn->st.hb_bad_pongs,
	    (unsigned long long) xn->st.unopened_expired,
	    (unsigned long long) xn->st.expects,
	    (unsigned long long) xn->st.withdraws,
	    (unsigned long long) xn->st.expects_refused,
	    (unsigned long long) xn->st.unknown_expired,
	    (unsigned long long) xn->st.withdrawn_told,
	    (unsigned long long) xn->st.lost_refused,
	    (unsigned long long) xn->st.announce_joined,
	    (unsigned long long) xn->st.desc_refreshes);
	*lenp = len;
}

/* The module's counters, as lines. */
static void counters_text(const struct kvb_xn *xn, const struct notify_sums *t,
			  char *buf, size_t cap, size_t *lenp)
{
	uint64_t rx = t->rx, rej = t->rej, sent = t->sent, serr = t->serr;
	size_t len = *lenp;

	PUT("notify messages        %llu received, %llu rejected, %llu "
	    "sent, %llu send errors\n",
	    (unsigned long long) rx, (unsigned long long) rej,
	    (unsigned long long) sent, (unsigned long long) serr);
	PUT("handshakes             %llu served, %llu refused, %llu "
	    "sent, %llu failed\n",
	    (unsigned long long) xn->st.hs_served,
	    (unsigned long long) xn->st.hs_refused,
	    (unsigned long long) xn->st.hs_sent,
	    (unsigned long long) xn->st.hs_failed);
	PUT("layer ops              %llu (%llu deferred, %llu expired "
	    "waiting)\n",
	    (unsigned long long) xn->st.layer_ops,
	    (unsigned long long) xn->st.layers_deferred,
	    (unsigned long long) xn->st.defer_expired);
	PUT("sent                   %llu remote_blocks, %llu "
	    "write_done, %llu release, %llu kvb_write_failed\n",
	    (unsigned long long) xn->st.remote_blocks_sent,
	    (unsigned long long) xn->st.write_done_sent,
	    (unsigned long long) xn->st.releases_sent,
	    (unsigned long long) xn->st.write_failed_sent);
	PUT("announcements joined   %llu (D opens of an id this node "
	    "announced already)\n",
	    (unsigned long long) xn->st.announce_joined);
	PUT("descriptor refreshes   %llu (opens that first handed a peer "
	    "our descriptor: a worker or region gone since)\n",
	    (unsigned long long) xn->st.desc_refreshes);
	PUT("opens by address       %llu (%llu waited for the peer, %llu "
	    "failed so), %llu duplicate ids refused\n",
	    (unsigned long long) xn->st.opens_batched,
	    (unsigned long long) xn->st.opens_waiting,
	    (unsigned long long) xn->st.hs_wait_failed,
	    (unsigned long long) xn->st.duplicate_opens);
	PUT("release-only           %llu sent, %llu failed\n",
	    (unsigned long long) xn->st.release_only_sent,
	    (unsigned long long) xn->st.release_only_failed);
	PUT("peers lost             %llu (%llu back, %llu opens refused "
	    "while lost); heartbeats %llu sent, "
	    "%llu answered, %llu served, %llu refused, %llu answers "
	    "rejected\n",
	    (unsigned long long) xn->st.peers_lost,
	    (unsigned long long) xn->st.peers_back,
	    (unsigned long long) xn->st.lost_refused,
	    (unsigned long long) xn->st.hb_sent,
	    (unsigned long long) xn->st.hb_answered,
	    (unsigned long long) xn->st.hb_served,
	    (unsigned long long) xn->st.hb_refused,
	    (unsigned long long) xn->st.hb_bad_pongs);
	PUT("unopened expired       %llu (D told: kvb_write_failed "
	    "ENOENT); %u held now (created by a peer's message, not opened "
	    "by a worker yet)\n",
	    (unsigned long long) xn->st.unopened_expired, xn->nunopened);
	PUT("expected ids           %llu declared, %llu withdrawn, %llu "
	    "refused; D told: %llu unknown (ENOENT), %llu withdrawn "
	    "(ECANCELED)\n",
	    (unsigned long long) xn->st.expects,
	    (unsigned long long) xn->st.withdraws,
	    (unsigned long long) xn->st.expects_refused,
	    (unsigned long long) xn->st.unknown_expired,
	    (unsigned long long) xn->st.withdrawn_told);
	*lenp = len;
}

/* One entry (JSON, the k-th) or line per peer, with its transport's
 * per-endpoint counters. */
static void peers_stats(struct kvb_broker *b, struct kvb_xn *xn, int json,
			char *buf, size_t cap, size_t *lenp)
{
	size_t len = *lenp;

	for (uint32_t i = 1, k = 0; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];
		static const char *const sn[] = {"free", "handshaking", "ready",
						 "failed"};
		unsigned ts = kvb_xn_peer_ts(b, p);

		if (p->state == PEER_FREE)
			continue;
		if (json) {
			PUT("%s{\"id\":%u,\"host\":", k++ ? "," : "", i);
			put_jstr(buf, cap, &len, p->host);
			PUT(",\"port\":%u,\"state\":\"%s\",\"stale\":%u,"
			    "\"lost\":%u,\"losses\":%llu,\"node\":",
			    p->port, sn[p->state], p->stale, p->live.lost,
			    (unsigned long long) p->live.losses);
			put_jstr(buf, cap, &len,
				 p->have_desc ? p->desc.node_id : "");
			PUT(",\"workers\":%u,\"transport\":\"%s\","
			    "\"handshakes\":%llu,\"failures\":%llu,\"qps\":[",
			    p->have_desc ? p->desc.nworkers : 0,
			    ts ? b->trs[ts]->ops->name : "none",
			    (unsigned long long) p->handshakes,
			    (unsigned long long) p->failures);
		} else
			PUT("peer %-3u               %s:%u %s%s%s node %s, %u "
			    "workers, over %s\n",
			    i, p->host, p->port, sn[p->state],
			    p->stale ? " (stale)" : "",
			    p->live.lost ? " (lost)" : "",
			    p->have_desc ? p->desc.node_id : "-",
			    p->have_desc ? p->desc.nworkers : 0,
			    ts ? b->trs[ts]->ops->name : "none");
		if (p->ep[KVB_TS_RDMA])
			tr_stats(b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA], json,
				 buf, cap, &len);
		if (json)
			PUT("]}");
	}
	*lenp = len;
}

size_t kvb_xn_stats(struct kvb_broker *b, int json, char *buf, size_t cap)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct notify_sums t;
	size_t len = 0;

	if (!xn || !cap)
		return 0;
	notify_sums(b, xn, &t);
	if (json)
		counters_json(xn, &t, buf, cap, &len);
	else
		counters_text(xn, &t, buf, cap, &len);
	tr_stats(b->trs[KVB_TS_RDMA], NULL, json, buf, cap, &len);
	tr_stats(b->trs[KVB_TS_TCP], NULL, json, buf, cap, &len);
	if (json)
		PUT("\"peers\":[");
	peers_stats(b, xn, json, buf, cap, &len);
	if (json)
		PUT("]},");
	return len;
}

#undef PUT

uint64_t kvb_xn_rejected(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint64_t rej;

	if (!xn)
		return 0;
	rej = xn->st.notify_rejected_closed + xn->st.hs_refused +
	      xn->st.hs_bad_replies + xn->st.hb_refused + xn->st.hb_bad_pongs;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_notify *n =
			kvb_xn_w(xn, &b->workers[b->live[i]])->notify;
		struct kvb_notify_stats st;

		if (!n)
			continue;
		kvb_notify_get_stats(n, &st);
		rej += st.messages_rejected;
	}
	return rej;
}

int kvb_xn_peer_info(struct kvb_broker *b, uint32_t i, struct kvb_peer_info *pi)
{
	static const char *const sn[] = {"free", "handshaking", "ready",
					 "failed"};
	struct kvb_xn *xn = kvb_xn_of(b);
	const struct kvb_peer *p;
	unsigned ts;

	if (!xn || !i || i >= xn->npeers_max)
		return -ERANGE;
	p = &xn->peers[i];
	if (p->state == PEER_FREE || p->state > PEER_FAILED)
		return -ENOENT;
	ts = kvb_xn_peer_ts(b, p);
	memset(pi, 0, sizeof(*pi));
	pi->id = i;
	snprintf(pi->host, sizeof(pi->host), "%s", p->host);
	pi->port = p->port;
	pi->state = sn[p->state];
	pi->stale = p->stale;
	if (p->have_desc)
		snprintf(pi->node, sizeof(pi->node), "%s", p->desc.node_id);
	pi->nworkers = p->have_desc ? p->desc.nworkers : 0;
	pi->transport = ts ? b->trs[ts]->ops->name : "none";
	pi->handshakes = p->handshakes;
	pi->failures = p->failures;
	pi->last_err = p->last_err;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Cross-node opens by the peer's address (XOPEN_BATCH, see xnode.c for the
 * open itself): a worker names the peer broker by host and handshake port,
 * and never waits for its handshake. Where the peer is not known yet (or
 * its handshake runs), the handshake is started or joined and the transfer
 * opened waiting for it (kvb_rxfer.wait_peer): its layer ops wait, what it
 * sends to the peer goes when the handshake ends (kvb_xn_waiting_done),
 * and a failed handshake fails it with that status.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"

/* The entry at q and its parts (the message was checked to hold it). */
struct ent {
	struct kvb_xopen_ent h;
	const char *id, *host;
	const uint32_t *blocks;
};

static void ent_at(const uint8_t *q, struct ent *e)
{
	memcpy(&e->h, q, sizeof(e->h));
	e->id = (const char *) q + sizeof(e->h);
	e->host = e->id + e->h.id_len;
	e->blocks =
		(const uint32_t *) (q + sizeof(e->h) +
				    ((e->h.id_len + e->h.host_len + 3u) & ~3u));
}

/* Does the peer's descriptor lack every worker of `role` and DP rank dp
 * (it was taken while they were not attached, as when the peer broker
 * restarted and answered before its workers attached again)? */
static int peer_lacks(const struct kvb_peer *p, uint32_t role, uint32_t dp)
{
	for (uint32_t i = 0; i < p->desc.nworkers; i++)
		if (p->desc.workers[i].role == role &&
		    p->desc.workers[i].dp_rank == dp)
			return 0;
	return 1;
}

/* One entry: 0 with *handle, or its -errno. */
static int open_entry(struct kvb_broker *b, struct kvb_worker *w,
		      struct kvb_xn *xn, const struct ent *e, uint32_t *handle)
{
	struct kvb_xn_open o = {
		.id = e->id,
		.id_len = e->h.id_len,
		.mode = e->h.mode,
		.flags = e->h.flags,
		.remote_dp = e->h.remote_dp_rank,
		.lb = e->blocks,
		.nlb = e->h.nblocks,
		.rb = e->blocks + e->h.nblocks,
		.nrb = e->h.nremote,
	};
	struct kvb_xfer *x;
	struct kvb_peer *p;
	char host[64];
	int rc;

	if (!e->h.id_len || !e->h.host_len || e->h.host_len >= sizeof(host) ||
	    !e->h.port || memchr(e->id, 0, e->h.id_len) ||
	    memchr(e->host, 0, e->h.host_len))
		return -EINVAL;
	memcpy(host, e->host, e->h.host_len);
	host[e->h.host_len] = 0;
	if (!kvb_xn_trusted(xn, host)) {
		if (kvb_xn_rlog_ok(xn))
			log_warn("worker %u: transfer '%.*s': peer %s is not "
				 "in --trusted-hosts",
				 w->id, (int) e->h.id_len, e->id, host);
		return -EACCES;
	}
	x = kvb_xfer_find(&b->xfers, w->id, e->id, e->h.id_len);
	if (x && x->opened) /* refused there: -EEXIST, -EBUSY */
		return kvb_xn_open_one(b, w, &o, handle);
	if (!x &&
	    (rc = kvb_xfer_admit(b, w, "remote transfer", e->id, e->h.id_len)))
		return rc;
	p = kvb_xn_peer_find(xn, host, e->h.port, 1);
	if (!p) {
		if (kvb_xn_rlog_ok(xn))
			log_warn("worker %u: peer %s:%u: peer table full (%u, "
				 "all in use)",
				 w->id, host, e->h.port, xn->npeers_max - 1);
		return -ENOSPC;
	}
	if (!p->have_desc) {
		if (p->state != PEER_HS) {
			/* failed a moment ago: the same answer, no new ask */
			if (p->last_err && p->hs_failed_ns &&
			    kvb_now_ns() - p->hs_failed_ns < HS_RETRY_NS) {
				xn->st.hs_wait_failed++;
				return p->last_err;
			}
			rc = kvb_xn_peer_start_hs(b, p);
			if (rc) {
				if (kvb_xn_rlog_ok(xn))
					log_warn("peer %s:%u: cannot start the "
						 "handshake: %s",
						 host, e->h.port,
						 strerror(-rc));
				return rc;
			}
		}
		o.wait = 1;
	} else if (!p->live.lost &&
		   !(w->role == KVB_ROLE_P && o.mode == KVB_XFER_READ) &&
		   peer_lacks(p,
			      w->role == KVB_ROLE_D ? KVB_HS_ROLE_P
						    : KVB_HS_ROLE_D,
			      o.remote_dp) &&
		   (p->state == PEER_HS || kvb_now_ns() >= p->next_refresh)) {
		/* the workers this transfer needs at the peer were not there
		 * at our last handshake: ask again before failing it (the
		 * answer may still lack them: then it fails as before). At
		 * most one such refresh a second per peer (REFRESH_NS): a
		 * peer that never has them costs one handshake a second, and
		 * the opens in between fail at once. */
		if (p->state == PEER_HS || !kvb_xn_peer_start_hs(b, p)) {
			o.wait = 1;
			xn->st.desc_refreshes++;
		}
	} else if (p->sent_gen != xn->desc_gen && !p->live.lost) {
		/* one of our workers or regions went since the peer last got
		 * our descriptor, which may still name it (a vLLM worker that
		 * restarted on the same ranks while the brokers ran): it gets
		 * the new one before this transfer tells it anything. Should
		 * the handshake fail, the transfer goes on with what it has */
		if (p->state == PEER_HS || !kvb_xn_peer_start_hs(b, p)) {
			o.wait = 1;
			xn->st.desc_refreshes++;
		}
	}
	o.peer = kvb_xn_peer_id(xn, p);
	rc = kvb_xn_open_one(b, w, &o, handle);
	if (!rc)
		kvb_xn_peer_ref(b, p, w->id); /* keep the peer while in use */
	return rc;
}

int kvb_xn_xopen_batch(struct kvb_broker *b, struct kvb_worker *w,
		       const struct kvb_msg_xopen_batch *m, uint32_t len,
		       struct kvb_open_result *res)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	const uint8_t *q = (const uint8_t *) (m + 1);
	const uint8_t *end = (const uint8_t *) m + len;

	/* the entries fill the message exactly, or it is malformed */
	for (uint32_t i = 0; i < m->n; i++) {
		struct kvb_xopen_ent h;

		if ((size_t) (end - q) < sizeof(h))
			return -EBADMSG;
		memcpy(&h, q, sizeof(h));
		if (kvb_xopen_ent_len(&h) > (uint64_t) (end - q))
			return -EBADMSG;
		q += kvb_xopen_ent_len(&h);
	}
	if (q != end)
		return -EBADMSG;
	if (!xn)
		return -ENOTCONN;
	q = (const uint8_t *) (m + 1);
	for (uint32_t i = 0; i < m->n; i++) {
		struct ent e;

		ent_at(q, &e);
		res[i].handle = 0;
		res[i].status = open_entry(b, w, xn, &e, &res[i].handle);
		q += kvb_xopen_ent_len(&e.h);
	}
	xn->st.opens_batched += m->n;
	return 0;
}

void kvb_xn_fail_waiting(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_rxfer *rx = x->rx;
	struct kvb_peer *p = kvb_xn_peer_get(xn, rx->peer);
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);

	rx->wait_peer = 0;
	xn->st.hs_wait_failed++;
	if (rx->release_only)
		xn->st.release_only_failed++;
	if (kvb_xn_rlog_ok(xn))
		log_warn("transfer '%s' of worker %u: failed waiting for peer "
			 "%s:%u: %s",
			 x->id, x->worker, p ? p->host : "?", p ? p->port : 0,
			 strerror(-status));
	/* its layer ops that waited fail now (counted as ended ops) */
	for (uint32_t i = 0; i < rx->ndef; i++)
		kvb_post_cqe(b, x->worker, KVB_CQ_DESC, rx->def[i].tag, status,
			     0, handle);
	kvb_xfer_ops_failed(x, rx->ndef, status);
	rx->ndef = 0;
	/* reported at its seal, abort or deadline (engine.c); now where it
	 * was sealed already */
	x->held_err = status;
	if (x->tag_set)
		kvb_xfer_finish(b, x, status);
}

void kvb_xn_waiting_done(struct kvb_broker *b, struct kvb_peer *p, int status)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint32_t pid = kvb_xn_peer_id(xn, p);
	/* a failed refresh of a peer known before leaves its descriptor */
	int ok = !status || p->have_desc;

	p->hs_failed_ns = status ? kvb_now_ns() : 0;
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		struct kvb_rxfer *rx = x->rx;

		if (rx && rx->wait_peer && rx->peer == pid) {
			int rc = ok ? kvb_xn_open_ready(b, x) : status;

			if (rc)
				kvb_xn_fail_waiting(b, x, rc);
			else
				kvb_xfer_maybe_finish(b, x);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

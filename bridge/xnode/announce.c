/* SPDX-License-Identifier: MIT */
/*
 * What a D transfer in WRITE mode tells P's broker, once per node and id
 * (docs/cross-node.md, "WRITE mode"): its blocks (remote_blocks), or, for
 * a release-only open, the release. Every D rank of the node opens the id;
 * the first whose peer is known sends, the others do not.
 *
 * Whether this node sent it already is known from two places, so that no
 * interleaving of the ranks' opens, ends and departures sends it twice:
 *
 * - the live D transfers of the id: every one of them is marked when the
 *   node sends (the sender's and those open then) or when it opens after
 *   (it finds the mark), so any one left is a witness, whichever worker
 *   sent and whether that one is still attached;
 * - the node's list of the last XN_SENT_IDS (peer address, id) it sent,
 *   for ranks that open after every transfer of the id here ended. The
 *   transfer table's list of ended ids (4,096 for all workers) is not
 *   used: an id falls out of it after as many later transfers end, and a
 *   transfer that ended without sending (its announce failed) is no
 *   witness of a send.
 *
 * Only a send that went out to at least one P rank marks: after a failed
 * one (no P worker of that DP rank in the peer's descriptor, say), the next
 * rank that opens the id sends it.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"

enum { SENT_BLOCKS = 0, SENT_RELEASE = 1 };

static uint64_t fnv1a(uint64_t h, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char) p[i];
		h *= 1099511628211ull;
	}
	return h;
}

/* The list's key of x's id at x's peer: a 64-bit FNV-1a of the peer's
 * address (what names it also across a reclaim of its slot) and the id. */
static uint64_t sent_key(struct kvb_xn *xn, const struct kvb_xfer *x)
{
	const struct kvb_peer *p = kvb_xn_peer_get(xn, x->rx->peer);
	char addr[80];
	int n;

	if (p)
		n = snprintf(addr, sizeof(addr), "%s:%u/", p->host, p->port);
	else
		n = snprintf(addr, sizeof(addr), "#%u/", x->rx->peer);
	if (n < 0 || (size_t) n >= sizeof(addr))
		n = 0;
	return fnv1a(fnv1a(1469598103934665603ull, addr, (size_t) n), x->id,
		     strlen(x->id));
}

static uint32_t sent_bucket(uint64_t h)
{
	return (uint32_t) (h ^ (h >> 32)) & (XN_SENT_IDS - 1);
}

static uint8_t *mark_of(struct kvb_rxfer *rx, int kind)
{
	return kind == SENT_RELEASE ? &rx->released : &rx->announced;
}

/* Is (kind, h) in the node's list of sent ones? */
static int sent_listed(const struct kvb_xn_sent *s, int kind, uint64_t h)
{
	for (uint32_t e = s->head[sent_bucket(h)]; e; e = s->chain[e - 1])
		if (s->hash[e - 1] == h && s->kind[e - 1] == kind)
			return 1;
	return 0;
}

/* Add it, in place of the oldest entry once the list is full. */
static void sent_add(struct kvb_xn_sent *s, int kind, uint64_t h)
{
	uint32_t i = s->next;
	uint16_t *pp;

	if (sent_listed(s, kind, h))
		return;
	if (i < s->fill) { /* unlink the entry this one replaces */
		pp = &s->head[sent_bucket(s->hash[i])];
		while (*pp && *pp != i + 1)
			pp = &s->chain[*pp - 1];
		if (*pp)
			*pp = s->chain[i];
	} else {
		s->fill = i + 1;
	}
	s->hash[i] = h;
	s->kind[i] = (uint8_t) kind;
	pp = &s->head[sent_bucket(h)];
	s->chain[i] = *pp;
	*pp = (uint16_t) (i + 1);
	s->next = (i + 1) % XN_SENT_IDS;
}

/* Call fn on every live transfer of x's id and peer of another D worker of
 * this node; stops at (and returns) the first nonzero answer. */
static int each_sibling(struct kvb_broker *b, const struct kvb_xfer *x,
			int (*fn)(struct kvb_rxfer *rx, int kind), int kind)
{
	size_t len = strlen(x->id);

	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *v = &b->workers[b->live[i]];
		struct kvb_xfer *y;
		int rc;

		if (v->id == x->worker || v->role != KVB_ROLE_D)
			continue;
		y = kvb_xfer_find(&b->xfers, v->id, x->id, len);
		if (!y || !y->rx || y->rx->peer != x->rx->peer)
			continue;
		rc = fn(y->rx, kind);
		if (rc)
			return rc;
	}
	return 0;
}

static int is_marked(struct kvb_rxfer *rx, int kind)
{
	return *mark_of(rx, kind);
}

static int set_mark(struct kvb_rxfer *rx, int kind)
{
	*mark_of(rx, kind) = 1;
	return 0;
}

/* Did this node send x's message (kind) to x's peer already? If so, x is
 * marked too (a witness from now on). */
static int node_sent(struct kvb_broker *b, struct kvb_xfer *x, int kind)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	if (!is_marked(x->rx, kind) && !each_sibling(b, x, is_marked, kind) &&
	    !sent_listed(&xn->sent, kind, sent_key(xn, x)))
		return 0;
	set_mark(x->rx, kind);
	return 1;
}

/* It went out: x and every live sibling say so, and the node's list. */
static void node_mark(struct kvb_broker *b, struct kvb_xfer *x, int kind)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	set_mark(x->rx, kind);
	each_sibling(b, x, set_mark, kind);
	sent_add(&xn->sent, kind, sent_key(xn, x));
}

int kvb_xn_announce(struct kvb_broker *b, struct kvb_worker *w,
		    struct kvb_xfer *x)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_rxfer *rx = x->rx;
	struct kvb_peer *p = kvb_xn_peer_get(xn, rx->peer);
	struct kvb_zmsg m;
	uint32_t sent = 0;
	int rc;

	if (node_sent(b, x, SENT_BLOCKS)) {
		xn->st.announce_joined++;
		return 0;
	}
	if (!p || !p->have_desc)
		return -EHOSTUNREACH;
	rc = kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, x->id);
	if (rc)
		return rc;
	snprintf(m.req_id, sizeof(m.req_id), "%s", x->id);
	m.decode_rank = w->dp_rank;
	rc = kvb_zmsg_set_blocks(&m, rx->lb, rx->nlb);
	if (!rc)
		rc = kvb_zmsg_check(&m); /* what no peer would take */
	if (rc) {
		log_warn("transfer '%s': cannot announce its blocks (ids up to "
			 "%u, at most %u of them): %s",
			 x->id, (unsigned) KVB_ZMSG_BLOCK_MAX,
			 KVB_ZMSG_BLOCKS_MAX, strerror(-rc));
		kvb_zmsg_fini(&m);
		return rc;
	}
	sent = kvb_xn_send_to_p_ranks(b, w, p, rx, &m);
	xn->st.remote_blocks_sent += sent;
	kvb_zmsg_fini(&m);
	if (!sent) {
		log_warn("transfer '%s': peer %s has no reachable P worker of "
			 "DP rank %u (attach them, then kvb_peer_connect "
			 "again)",
			 x->id, p->desc.node_id, rx->remote_dp);
		return -EHOSTUNREACH;
	}
	node_mark(b, x, SENT_BLOCKS);
	kvb_grant_unfence(b, w->dp_rank, rx->lb, rx->nlb);
	return 0;
}

int kvb_xn_release_only(struct kvb_broker *b, struct kvb_worker *w,
			struct kvb_xfer *x)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_rxfer *rx = x->rx;
	struct kvb_peer *p = kvb_xn_peer_get(xn, rx->peer);
	struct kvb_zmsg m;
	uint32_t sent;
	int rc;

	if (node_sent(b, x, SENT_RELEASE)) /* another D rank here did */
		return 0;
	if (!p || !p->have_desc)
		return -EHOSTUNREACH;
	rc = kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, x->id);
	if (rc)
		return rc;
	sent = kvb_xn_send_to_p_ranks(b, w, p, rx, &m);
	kvb_zmsg_fini(&m);
	xn->st.releases_sent += sent;
	if (!sent) {
		xn->st.release_only_failed++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("transfer '%s': release not sent: peer %s has "
				 "no reachable P worker of DP rank %u",
				 x->id, p->desc.node_id, rx->remote_dp);
		return -EHOSTUNREACH;
	}
	xn->st.release_only_sent++;
	node_mark(b, x, SENT_RELEASE);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Per-worker shares of the node-wide tables (the transfer table and the
 * in-flight table), so that no worker can take what the others need.
 */
#include "broker.h"

#include "kvbroker/kvbroker.h"

/*
 * Fair shares (docs/security.md, "On the node"): of a table of `total` entries
 * each attached worker is guaranteed total / attached (at least `floor`); past
 * its share a worker borrows free entries only while enough stay free for
 * every other attached worker to reach its own share. `cap` (an option, 0 =
 * none) bounds a worker whatever the table holds. used(b, w) is w's count.
 * Returns how many more entries w may take now (at most `want`).
 */
static uint32_t
fair_room(struct kvb_broker *b, const struct kvb_worker *w, uint32_t total,
	  uint32_t nfree, uint32_t cap, uint32_t want,
	  uint32_t (*used)(struct kvb_broker *, const struct kvb_worker *))
{
	uint32_t n = b->nlive ? b->nlive : 1;
	uint32_t share = total / n, mine = used(b, w), room;
	uint64_t reserve = 0;

	if (cap && mine >= cap)
		return 0;
	if (cap && want > cap - mine)
		want = cap - mine;
	room = mine < share ? share - mine : 0;
	if (room >= want)
		return want;
	for (uint32_t i = 0; i < b->nlive; i++) {
		const struct kvb_worker *o = &b->workers[b->live[i]];
		uint32_t u;

		if (o == w)
			continue;
		u = used(b, o);
		if (u < share)
			reserve += share - u;
	}
	if (nfree > reserve && nfree - reserve > room)
		room = (uint32_t) (nfree - reserve);
	return room < want ? room : want;
}

static uint32_t xfers_used(struct kvb_broker *b, const struct kvb_worker *w)
{
	return kvb_xfers_charged(&b->xfers, w->id);
}

static uint32_t inflight_used(struct kvb_broker *b, const struct kvb_worker *w)
{
	(void) b;
	return w->inf_used;
}

int kvb_xfer_room(struct kvb_broker *b, const struct kvb_worker *w)
{
	return fair_room(b, w, KVB_MAX_XFERS - 1,
			 KVB_MAX_XFERS - 1 - b->xfers.nactive,
			 b->opt.max_xfers_per_worker, 1, xfers_used) > 0;
}

/*
 * How many of w's descriptors the round may take: its fair share of the
 * in-flight table (fair_room); at the share its ring waits (and fills: its
 * submissions get -EAGAIN) until its own descriptors complete.
 */
uint32_t kvb_inflight_room(struct kvb_broker *b, struct kvb_worker *w,
			   uint32_t burst)
{
	uint32_t n;

	if (w->inf_used + burst <= (KVB_INFLIGHT_MAX - 1) / (b->nlive ?: 1) &&
	    !b->opt.max_inflight_per_worker)
		return burst; /* the common case: well inside its share */
	n = fair_room(b, w, KVB_INFLIGHT_MAX - 1, b->inf_nfree,
		      b->opt.max_inflight_per_worker, burst, inflight_used);
	if (!n && kvb_ring_count(&w->seg.sq))
		b->st.inflight_quota_stalls++;
	return n;
}

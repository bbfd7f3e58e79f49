/* SPDX-License-Identifier: MIT */
/*
 * Per-worker shares of the node-wide tables (the transfer table and the
 * in-flight table), so that no worker can take what the others need, nor
 * what a worker that attaches next needs.
 */
#include "broker.h"

#include "kvbroker/kvbroker.h"

/*
 * The next worker's seat: while another worker may still attach (fewer
 * than --max-workers are), total / (attached + 1) entries of a table, the
 * share that worker gets, are lent to no one. It gets them at once, not
 * when the transfers of those who borrowed them end (docs/security.md, "On
 * the node"). 0 at --max-workers: nobody can attach.
 */
static uint32_t seat(const struct kvb_broker *b, uint32_t total)
{
	uint32_t n = b->nlive ? b->nlive : 1;

	return n < b->opt.max_workers ? total / (n + 1) : 0;
}

/*
 * A worker's guaranteed share of a table of `total` entries: total /
 * attached, and for a worker alone what the next worker's seat leaves
 * (half of the table).
 */
static uint32_t share_of(const struct kvb_broker *b, uint32_t total)
{
	uint32_t n = b->nlive ? b->nlive : 1, s = seat(b, total);
	uint32_t share = total / n;

	return share > total - s ? total - s : share;
}

/*
 * Fair shares (docs/security.md, "On the node"): of a table of `total` entries
 * each attached worker is guaranteed its share (share_of); past it a worker
 * borrows free entries only while enough stay free for every other attached
 * worker to reach its own share and for the next worker's seat. `cap` (an
 * option, 0 = none) bounds a worker whatever the table holds. used(b, w) is
 * w's count. Returns how many more entries w may take now (at most `want`).
 */
static uint32_t
fair_room(struct kvb_broker *b, const struct kvb_worker *w, uint32_t total,
	  uint32_t nfree, uint32_t cap, uint32_t want,
	  uint32_t (*used)(struct kvb_broker *, const struct kvb_worker *))
{
	uint32_t share = share_of(b, total), mine = used(b, w), room;
	uint64_t reserve = seat(b, total);

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

int kvb_xfer_admit(struct kvb_broker *b, const struct kvb_worker *w,
		   const char *what, const char *id, uint32_t len)
{
	const uint32_t total = KVB_MAX_XFERS - 1;
	uint32_t nfree = total - b->xfers.nactive;

	if (!fair_room(b, w, total, nfree, b->opt.max_xfers_per_worker, 1,
		       xfers_used)) {
		b->st.xfer_quota_refused++;
		log_warn_rl("worker %u: %s '%.*s' refused (-ENOSPC): the "
			    "worker holds %u transfers, its share of the "
			    "table (%u of %u; %u workers attached, %u "
			    "entries in use)",
			    w->id, what, (int) len, id,
			    kvb_xfers_charged(&b->xfers, w->id),
			    share_of(b, total), total, b->nlive,
			    b->xfers.nactive);
		return -ENOSPC;
	}
	if (!nfree) {
		/* within its share: the entries are held by workers past the
		 * shares of now (taken before it attached); each one they
		 * free is its (their opens are refused above their share) */
		b->st.xfer_table_full++;
		log_warn_rl("worker %u: %s '%.*s' refused (-ENOSPC): the "
			    "transfer table is full, the worker holds %u of "
			    "its share of %u; others hold transfers past "
			    "theirs until those end",
			    w->id, what, (int) len, id,
			    kvb_xfers_charged(&b->xfers, w->id),
			    share_of(b, total));
		return -ENOSPC;
	}
	return 0;
}

/*
 * How many of w's descriptors the round may take: its fair share of the
 * in-flight table (fair_room); at the share its ring waits (and fills: its
 * submissions get -EAGAIN) until its own descriptors complete.
 */
uint32_t kvb_inflight_room(struct kvb_broker *b, struct kvb_worker *w,
			   uint32_t burst)
{
	const uint32_t total = KVB_INFLIGHT_MAX - 1;
	uint32_t n;

	if (w->inf_used + burst <= share_of(b, total) &&
	    !b->opt.max_inflight_per_worker)
		return burst; /* the common case: well inside its share */
	n = fair_room(b, w, total, b->inf_nfree, b->opt.max_inflight_per_worker,
		      burst, inflight_used);
	if (!n && kvb_ring_count(&w->seg.sq))
		b->st.inflight_quota_stalls++;
	return n;
}

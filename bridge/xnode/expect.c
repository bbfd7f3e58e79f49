/* SPDX-License-Identifier: MIT */
/*
 * Cross-node: the transfer ids a P worker says it will open
 * (kvb_transfer_expect, XEXPECT in proto.h).
 *
 * D announces its blocks (remote_blocks) as soon as it opens a transfer,
 * often before P opens it: P's broker holds the announcement until P
 * opens, up to --unopened-timeout. A worker that declares what it expects
 * lets its broker tell an id no one will open (a stale or mistyped
 * transfer id, a request P never got) from one P has not reached yet:
 * the unknown one is held --unknown-timeout only, then D is told
 * kvb_write_failed (-ENOENT). A withdrawn id (the request went away before
 * P opened it) is answered at once (-ECANCELED).
 *
 * Per worker: an open-addressing table of 64-bit id hashes (the transfer
 * table's, which names the worker) with their expiry, at most EXPECT_MAX,
 * allocated at the worker's first call; expired entries are dropped when
 * the table fills.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"

#define EXPECT_MAX   4096u
#define EXPECT_SLOTS (2 * EXPECT_MAX) /* a power of two */

struct kvb_xn_expect {
	uint32_t n; /* entries in e[], expired ones included */
	struct {
		uint64_t key;  /* 0: empty */
		int64_t until; /* expiry (ns); negated: withdrawn */
	} e[EXPECT_SLOTS];
};

static uint64_t key_of(const struct kvb_worker *w, const char *id, size_t n)
{
	uint64_t k = kvb_xfer_hash(w->id, id, n);

	return k ? k : 1;
}

static uint32_t find(const struct kvb_xn_expect *t, uint64_t key)
{
	for (uint32_t i = (uint32_t) key & (EXPECT_SLOTS - 1);;
	     i = (i + 1) & (EXPECT_SLOTS - 1)) {
		if (!t->e[i].key)
			return UINT32_MAX;
		if (t->e[i].key == key)
			return i;
	}
}

/* Remove slot i, moving later entries of its probe run back into it. */
static void remove_at(struct kvb_xn_expect *t, uint32_t i)
{
	for (uint32_t j = i;;) {
		uint32_t home;

		j = (j + 1) & (EXPECT_SLOTS - 1);
		if (!t->e[j].key)
			break;
		home = (uint32_t) t->e[j].key & (EXPECT_SLOTS - 1);
		/* stays where it is when its home lies in (i, j] */
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		t->e[i] = t->e[j];
		i = j;
	}
	t->e[i].key = 0;
	t->n--;
}

static int expired(int64_t until, int64_t now)
{
	return (until < 0 ? -until : until) <= now;
}

static void purge(struct kvb_xn_expect *t, int64_t now)
{
	for (uint32_t i = 0; i < EXPECT_SLOTS;) {
		if (t->e[i].key && expired(t->e[i].until, now))
			remove_at(t, i); /* slot i holds another now: again */
		else
			i++;
	}
}

static int put(struct kvb_xn_expect *t, uint64_t key, int64_t until,
	       int64_t now)
{
	uint32_t i = find(t, key);

	if (i != UINT32_MAX) {
		t->e[i].until = until;
		return 0;
	}
	if (t->n >= EXPECT_MAX)
		purge(t, now);
	if (t->n >= EXPECT_MAX)
		return -ENOSPC;
	for (i = (uint32_t) key & (EXPECT_SLOTS - 1); t->e[i].key;
	     i = (i + 1) & (EXPECT_SLOTS - 1))
		;
	t->e[i].key = key;
	t->e[i].until = until;
	t->n++;
	return 0;
}

static struct kvb_xn_expect *table(struct kvb_xn *xn,
				   const struct kvb_worker *w, int create)
{
	struct kvb_xn_wctx *ws = kvb_xn_w(xn, w);

	if (ws->wid != w->id)
		return NULL;
	if (!ws->exp && create)
		ws->exp = calloc(1, sizeof(*ws->exp));
	return ws->exp;
}

enum kvb_xn_expected kvb_xn_expected(struct kvb_broker *b,
				     const struct kvb_worker *w, const char *id,
				     size_t len)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	struct kvb_xn_expect *t = xn ? table(xn, w, 0) : NULL;
	uint32_t i;

	if (!t)
		return XN_EXPECT_UNDECLARED;
	i = find(t, key_of(w, id, len));
	if (i == UINT32_MAX || expired(t->e[i].until, kvb_now_ns()))
		return XN_EXPECT_UNKNOWN;
	return t->e[i].until < 0 ? XN_EXPECT_WITHDRAWN : XN_EXPECT_YES;
}

void kvb_xn_expect_free(struct kvb_xn_wctx *ws)
{
	free(ws->exp);
	ws->exp = NULL;
}

/* An announcement held for the id (created by remote_blocks, not opened),
 * or NULL. */
static struct kvb_xfer *held(struct kvb_broker *b, struct kvb_worker *w,
			     const char *id, size_t len)
{
	struct kvb_xfer *x = kvb_xfer_find(&b->xfers, w->id, id, len);

	return x && !x->opened && x->rx && x->rx->unopened &&
			       x->rx->role == KVB_ROLE_P
		       ? x
		       : NULL;
}

static int expect_one(struct kvb_broker *b, struct kvb_worker *w,
		      struct kvb_xn_expect *t, const char *id, size_t len,
		      int withdraw, int64_t now)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	int64_t until = now + (int64_t) b->opt.unopened_timeout_ms * 1000000;
	uint64_t key = key_of(w, id, len);
	struct kvb_xfer *x = kvb_xfer_find(&b->xfers, w->id, id, len);
	uint32_t i;
	int rc;

	if (withdraw) {
		xn->st.withdraws++;
		if (x) {
			i = find(t, key);
			if (i != UINT32_MAX)
				remove_at(t, i);
			x = held(b, w, id, len);
			if (x) { /* D is told at the next timer pass */
				x->rx->withdrawn = 1;
				x->rx->unknown = 0;
				x->deadline_ns = now;
			}
			return 0;
		}
		if (kvb_xfer_is_terminal(&b->xfers, w->id,
					 kvb_xfer_hash(w->id, id, len)))
			return 0;
		/* its announcement may still come: answer it at once */
		rc = put(t, key, -until, now);
		if (rc)
			xn->st.expects_refused++;
		return rc;
	}
	xn->st.expects++;
	if (x && x->opened)
		return 0;
	x = held(b, w, id, len);
	if (x) { /* announced already: the whole --unopened-timeout now */
		x->rx->unknown = 0;
		x->rx->withdrawn = 0;
		x->deadline_ns = until;
		return 0;
	}
	if (kvb_xfer_is_terminal(&b->xfers, w->id,
				 kvb_xfer_hash(w->id, id, len)))
		return -ESTALE;
	rc = put(t, key, until, now);
	if (rc) {
		xn->st.expects_refused++;
		log_warn_rl("worker %u: transfer id expectations refused "
			    "(-ENOSPC): it holds %u",
			    w->id, EXPECT_MAX);
	}
	return rc;
}

int kvb_xn_expect(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_msg_xexpect *m, uint32_t len,
		  struct kvb_open_result *res)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	const unsigned char *p = (const unsigned char *) (m + 1);
	const unsigned char *end = (const unsigned char *) m + len;
	struct kvb_xn_expect *t;
	int64_t now;

	/* the whole message first: a malformed one changes nothing */
	for (uint32_t i = 0; i < m->n; i++) {
		if (p >= end || !*p || *p > end - p - 1)
			return -EBADMSG;
		p += 1 + *p;
	}
	if (p != end)
		return -EBADMSG;
	if (!xn || !xn->on)
		return -ENOTCONN;
	t = table(xn, w, 1);
	if (!t)
		return -ENOMEM;
	now = kvb_now_ns();
	p = (const unsigned char *) (m + 1);
	for (uint32_t i = 0; i < m->n; i++) {
		res[i].handle = 0;
		res[i].status =
			expect_one(b, w, t, (const char *) p + 1, *p,
				   m->flags & KVB_XEXPECT_F_WITHDRAW, now);
		p += 1 + *p;
	}
	return 0;
}

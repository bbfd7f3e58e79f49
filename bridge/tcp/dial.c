// SPDX-License-Identifier: MIT
/*
 * Endpoints: the requesting side. An endpoint owns one outgoing connection,
 * dialed lazily by post() and again by the first post() after it broke.
 * Each accepted op takes a slot (the credit) until the peer's ACK (WRITE) or
 * READ_RESP (READ) comes back, or the connection fails; then it completes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "tcp/tcp_priv.h"

static void ep_drop_seg(void *owner, struct tcp_frame *f, uint32_t ref,
			int status);

int _kvb_tcp_ep_new(struct tcp_transport *tt, const struct sockaddr_storage *sa,
		    socklen_t salen, struct kvb_ep **out)
{
	struct kvb_ep *ep;
	uint32_t i;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	ep->slots = calloc(tt->depth, sizeof(*ep->slots));
	if (!ep->slots)
		goto err_ep;
	if (_kvb_tcp_rx_init(&ep->rx))
		goto err_slots;
	ep->tag.kind = TCP_K_EP;
	ep->tt = tt;
	_kvb_tcp_txq_init(&ep->tx, ep_drop_seg, ep);
	ep->sa = *sa;
	ep->salen = salen;
	ep->fd = -1;
	ep->state = EP_IDLE;
	ep->depth = tt->depth;
	for (i = 0; i < ep->depth; i++) {
		ep->slots[i].seq = i;
		ep->slots[i].next_free = i + 1;
		ep->slots[i].rider = TCP_NO_SLOT;
	}
	ep->next = tt->eps;
	if (ep->next)
		ep->next->prev = ep;
	tt->eps = ep;
	tt->st.eps_open++;
	*out = ep;
	return 0;

err_slots:
	free(ep->slots);
err_ep:
	free(ep);
	return -ENOMEM;
}

static void ep_close_fd(struct kvb_ep *ep)
{
	if (ep->fd >= 0)
		close(ep->fd);
	ep->fd = -1;
	ep->events = 0;
	ep->state = EP_IDLE;
	_kvb_tcp_txq_clear(&ep->tx);
	_kvb_tcp_rx_reset(&ep->rx);
}

static void slot_complete(struct kvb_ep *ep, uint32_t idx, int status)
{
	struct tcp_transport *tt = ep->tt;
	struct tcp_slot *s = &ep->slots[idx];
	int st = s->err ? s->err : status;

	_kvb_tcp_cq_push(tt, s->cookie, st);
	if (st)
		tt->base.stats.errors++;
	s->used = 0;
	s->answered = 0;
	s->err = 0;
	s->rider = TCP_NO_SLOT;
	s->local = NULL;
	s->dst = NULL;
	s->next_free = ep->free_head;
	ep->free_head = idx;
	ep->inflight_bytes -= s->len;
	ep->used--;
	tt->inflight--;
}

/* The op in slot idx ends with status (its own error first), and so do the
 * WRITEs that rode in its record. */
static void ep_complete(struct kvb_ep *ep, uint32_t idx, int status)
{
	uint32_t r = ep->slots[idx].rider;

	slot_complete(ep, idx, status);
	while (r != TCP_NO_SLOT) {
		uint32_t next = ep->slots[r].rider;

		slot_complete(ep, r, status);
		r = next;
	}
}

/* Complete every op in flight with err and drop the connection. */
static void ep_fail(struct kvb_ep *ep, int err, int dialing)
{
	uint32_t i;

	ep_close_fd(ep);
	/* riders end with the op whose record carries them */
	for (i = 0; i < ep->depth && ep->used; i++)
		if (ep->slots[i].used && !tcp_slot_rider(ep, i))
			ep_complete(ep, i, err);
	ep->last_err = err;
	/* a dial that failed is not retried for a while: fail fast instead */
	if (dialing)
		ep->backoff_until = tcp_now() + TCP_BACKOFF_NS;
	ep->tt->st.conn_failed++;
}

void _kvb_tcp_ep_destroy(struct kvb_ep *ep, int complete)
{
	struct tcp_transport *tt = ep->tt;
	uint32_t i;

	ep_close_fd(ep);
	for (i = 0; complete && i < ep->depth && ep->used; i++)
		if (ep->slots[i].used && !tcp_slot_rider(ep, i))
			ep_complete(ep, i, -ECONNABORTED);
	tt->inflight -= ep->used;
	_kvb_tcp_rx_free(&ep->rx);
	free(ep->slots);
	if (ep->prev)
		ep->prev->next = ep->next;
	else
		tt->eps = ep->next;
	if (ep->next)
		ep->next->prev = ep->prev;
	tt->st.eps_open--;
	free(ep);
}

int _kvb_tcp_ep_group_new(struct tcp_transport *tt,
			  const struct sockaddr_storage *sa, socklen_t salen,
			  uint64_t srv_id, struct kvb_ep **out)
{
	struct kvb_ep *lead = NULL, **link = &lead;
	unsigned i;

	for (i = 0; i < tt->stripes; i++) {
		int rc = _kvb_tcp_ep_new(tt, sa, salen, link);

		if (rc) {
			if (lead)
				_kvb_tcp_ep_group_destroy(lead);
			return rc;
		}
		(*link)->srv_id = srv_id;
		link = &(*link)->stripe;
	}
	*out = lead;
	return 0;
}

void _kvb_tcp_ep_group_destroy(struct kvb_ep *ep)
{
	while (ep) {
		struct kvb_ep *next = ep->stripe;

		_kvb_tcp_ep_destroy(ep, 1);
		ep = next;
	}
}

static int ep_update(struct kvb_ep *ep)
{
	uint32_t want;

	if (ep->state == EP_CONNECTING)
		want = EPOLLOUT;
	else if (ep->state == EP_AUTH)
		want = EPOLLIN;
	else
		want = EPOLLIN | (ep->tx.n ? EPOLLOUT : 0);
	return _kvb_tcp_epoll_set(ep->tt, ep->fd, &ep->tag, &ep->events, want);
}

static int ep_dial(struct kvb_ep *ep)
{
	struct tcp_transport *tt = ep->tt;
	int fd, rc;

	fd = socket(ep->sa.ss_family,
		    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	_kvb_tcp_sock_tune(tt, fd);
	if (ep->dialed)
		tt->st.reconnects++;
	ep->dialed = 1;
	ep->fd = fd;
	ep->events = 0;
	ep->last_progress = tcp_now();
	/* the dial and the authentication together within the timeout */
	ep->deadline = ep->last_progress + tt->timeout_ns;
	if (!connect(fd, (struct sockaddr *) &ep->sa, ep->salen)) {
		rc = _kvb_tcp_ep_auth_start(ep);
		if (rc) {
			ep_close_fd(ep);
			return rc;
		}
	} else if (errno == EINPROGRESS) {
		ep->state = EP_CONNECTING;
	} else {
		rc = -errno;
		ep_close_fd(ep);
		return rc;
	}
	_kvb_tcp_timer_want(tt, ep->deadline);
	rc = ep_update(ep);
	if (rc)
		ep_close_fd(ep);
	return rc;
}

/* Send what is queued, within the per-poll budget; every call a doorbell. */
static int ep_flush(struct kvb_ep *ep)
{
	struct tcp_transport *tt = ep->tt;
	uint64_t sent = 0;

	while (ep->tx.n && sent < TCP_TX_BUDGET) {
		int64_t rc = _kvb_tcp_txq_send(tt, &ep->tx, ep->fd);

		tt->base.stats.doorbells++;
		if (rc == -EAGAIN)
			break;
		if (rc < 0)
			return (int) rc;
		if (rc)
			ep->last_progress = tcp_now();
		sent += (uint64_t) rc;
	}
	return 0;
}

/* 0 if op can go on the wire, else the status it completes with. */
static int op_check(struct tcp_transport *tt, const struct kvb_xop *op)
{
	if (op->opcode != KVB_XOP_WRITE && op->opcode != KVB_XOP_READ)
		return -EINVAL;
	if (!op->local)
		return -EINVAL;
	if (op->len > KVB_TCP_MAX_OP)
		return -EMSGSIZE;
	if (op->local_off > op->local->len ||
	    op->len > op->local->len - op->local_off)
		return -EFAULT;
	if (_kvb_tcp_mr_find(tt, op->local->id) != op->local)
		return -ENOENT;
	return 0;
}

/* Ops [i, n) that go in the frame starting at op i: records and segs. */
static void run_size(struct tcp_transport *tt, const struct kvb_xop *ops,
		     unsigned i, unsigned n, unsigned *nrec, unsigned *nseg)
{
	uint32_t code = ops[i].opcode;

	*nrec = 0;
	*nseg = 0;
	for (; i < n && *nrec < KVB_TCP_MAX_RECS; i++) {
		if (op_check(tt, &ops[i]))
			continue;
		if (ops[i].opcode != code)
			break;
		(*nrec)++;
		if (code == KVB_XOP_WRITE && ops[i].len)
			(*nseg)++;
	}
}

static void frames_free(struct tcp_frame *f)
{
	while (f) {
		struct tcp_frame *next = f->next;

		free(f);
		f = next;
	}
}

/* Allocate the frames ops [0, take) go in (*first: a list), before
 * anything is committed: 0 or -ENOMEM (none left allocated). */
static int frames_alloc(struct tcp_transport *tt, const struct kvb_xop *ops,
			unsigned take, struct tcp_frame **first)
{
	struct tcp_frame **link = first, *f;
	unsigned nrec, nseg, left = 0;
	uint32_t code = 0;

	*first = NULL;
	for (unsigned i = 0; i < take; i++) {
		if (op_check(tt, &ops[i]))
			continue;
		if (left && ops[i].opcode == code) {
			left--;
			continue;
		}
		run_size(tt, ops, i, take, &nrec, &nseg);
		f = _kvb_tcp_frame_new(
			nseg, KVB_TCP_HDR_LEN + nrec * KVB_TCP_REC_LEN, 0);
		if (!f) {
			frames_free(*first);
			*first = NULL;
			return -ENOMEM;
		}
		*link = f;
		link = &f->next;
		code = ops[i].opcode;
		left = nrec - 1;
	}
	return 0;
}

/* The frame being filled: its header, its last record so far (which a
 * WRITE continuing its remote range grows), counts, and the slots of that
 * record's first and last ops. */
struct frame_fill {
	struct tcp_frame *f;
	struct kvb_tcp_hdr h;
	struct kvb_tcp_rec last;
	unsigned rec, seg, fops;
	uint32_t lead, tail;
};

/* Take a free slot of ep for op, filled in; its index. */
static uint32_t slot_take(struct kvb_ep *ep, const struct kvb_xop *op)
{
	uint32_t idx = ep->free_head;
	struct tcp_slot *s = &ep->slots[idx];

	ep->free_head = s->next_free;
	s->seq = (((s->seq >> 32) + 1) << 32) | idx;
	s->cookie = op->cookie;
	s->local = op->local;
	s->len = op->len;
	s->opcode = op->opcode;
	s->err = 0;
	s->used = 1;
	s->answered = 0;
	s->lead = idx;
	s->rider = TCP_NO_SLOT;
	/* set when its frame is queued for a WRITE with payload; a
	 * zero-length one has nothing to wait for, whatever the slot's last
	 * op left here (a stream since cleared by a reconnect starts from 0) */
	s->tx_end = 0;
	s->dst = op->opcode == KVB_XOP_READ
			 ? (char *) op->local->addr + op->local_off
			 : NULL;
	return idx;
}

/* op (slot idx) as a record of the frame: a new one, or the growth of the
 * last one when its remote range continues it. */
static void frame_record(struct kvb_ep *ep, struct frame_fill *ff,
			 const struct kvb_xop *op, uint32_t idx)
{
	struct kvb_tcp_rec *last = &ff->last;

	if (op->opcode == KVB_XOP_WRITE && op->len && ff->lead != TCP_NO_SLOT &&
	    last->len && last->region == op->remote.region &&
	    last->off + last->len == op->remote_off &&
	    last->len < TCP_MERGE_MAX && op->len <= TCP_MERGE_MAX - last->len) {
		/* the remote range continues the frame's last record: it
		 * grows, this payload goes right after, and the op ends with
		 * the record's answer (its own error first) */
		ep->slots[idx].lead = ff->lead;
		ep->slots[ff->tail].rider = idx;
		ff->tail = idx;
		last->len += op->len;
		kvb_tcp_rec_encode(last,
				   ff->f->meta + KVB_TCP_HDR_LEN +
					   (ff->rec - 1) * KVB_TCP_REC_LEN);
		ep->tt->st.ops_merged++;
		return;
	}
	memset(last, 0, sizeof(*last));
	last->seq = ep->slots[idx].seq;
	last->region = op->remote.region;
	last->off = op->remote_off;
	last->len = op->len;
	kvb_tcp_rec_encode(last, ff->f->meta + KVB_TCP_HDR_LEN +
					 ff->rec * KVB_TCP_REC_LEN);
	ff->rec++;
	ff->lead = ff->tail = idx;
}

/* The frame is full: its header, where each record's payload ends in the
 * send stream (its lead op's tx_end), onto the send queue. */
static void frame_close(struct kvb_ep *ep, struct frame_fill *ff)
{
	struct tcp_frame *f = ff->f;
	uint64_t end;

	f->meta_len = KVB_TCP_HDR_LEN + ff->rec * KVB_TCP_REC_LEN;
	ff->h.count = (uint16_t) ff->rec;
	kvb_tcp_hdr_encode(&ff->h, f->meta);
	end = ep->tx.queued + f->meta_len;
	for (unsigned k = 0; k < f->nseg; k++) {
		/* the op whose record it is: its last payload's */
		uint32_t ld = ep->slots[f->seg[k].ref].lead;

		end += f->seg[k].len;
		ep->slots[ld].tx_end = end;
	}
	_kvb_tcp_txq_push(&ep->tx, f);
	ep->tt->st.frames_tx++;
	ff->f = NULL;
}

/* Ops [0, take) into frames; ops failing op_check complete at once. */
static int ep_queue(struct kvb_ep *ep, const struct kvb_xop *ops, unsigned take,
		    uint64_t *bytes, unsigned *good)
{
	struct tcp_transport *tt = ep->tt;
	struct tcp_frame *first;
	struct frame_fill ff = {.f = NULL};

	/* allocate every frame first: nothing is committed on -ENOMEM */
	if (frames_alloc(tt, ops, take, &first))
		return -ENOMEM;
	for (unsigned i = 0; i < take; i++) {
		const struct kvb_xop *op = &ops[i];
		uint32_t idx;
		int err = op_check(tt, op);

		if (err) {
			_kvb_tcp_cq_push(tt, op->cookie, err);
			tt->base.stats.errors++;
			continue;
		}
		if (!ff.f) {
			memset(&ff, 0, sizeof(ff));
			ff.f = first;
			first = ff.f->next;
			ff.h.type = op->opcode == KVB_XOP_WRITE
					    ? KVB_TCP_F_WRITE
					    : KVB_TCP_F_READ_REQ;
			ff.lead = ff.tail = TCP_NO_SLOT;
		}
		idx = slot_take(ep, op);
		frame_record(ep, &ff, op, idx);
		if (op->opcode == KVB_XOP_WRITE && op->len) {
			ff.f->seg[ff.seg].base =
				(const char *) op->local->addr + op->local_off;
			ff.f->seg[ff.seg].len = op->len;
			ff.f->seg[ff.seg].mr = op->local;
			ff.f->seg[ff.seg++].ref = idx;
			ff.h.payload += op->len;
		}
		if (!ep->used)
			ep->last_progress = tcp_now();
		ep->inflight_bytes += op->len;
		ep->used++;
		tt->inflight++;
		(*good)++;
		*bytes += op->len;
		/* the frame was sized for one record per op (run_size) */
		if (++ff.fops * KVB_TCP_REC_LEN + KVB_TCP_HDR_LEN ==
		    ff.f->meta_len)
			frame_close(ep, &ff);
	}
	return 0;
}

/* post() to one connection */
static int ep_post(struct kvb_transport *t, struct kvb_ep *ep,
		   const struct kvb_xop *ops, unsigned n)
{
	struct tcp_transport *tt = to_tcp(t);
	unsigned take, limit, iovs = 0, run = 0, good = 0, i;
	uint32_t prev = 0;
	uint64_t bytes = 0;
	int rc;

	limit = ep->depth - ep->used;
	if (!limit) {
		t->stats.credit_stalls++;
		return 0;
	}
	if (limit > n)
		limit = n;
	/* the chain must fit one sendmsg: one iovec per frame and payload */
	for (take = 0; take < limit; take++) {
		const struct kvb_xop *op = &ops[take];
		unsigned need = 0, fresh;

		if (op_check(tt, op))
			continue;
		fresh = op->opcode != prev || run == KVB_TCP_MAX_RECS;
		need = fresh + (op->opcode == KVB_XOP_WRITE && op->len);
		if (iovs + need > TCP_IOV_MAX)
			break;
		iovs += need;
		if (fresh) {
			prev = op->opcode;
			run = 0;
		}
		run++;
	}
	rc = _kvb_tcp_cq_reserve(tt, take);
	if (rc)
		return rc;

	if (ep->state == EP_IDLE && tcp_now() < ep->backoff_until) {
		for (i = 0; i < take; i++) {
			int err = op_check(tt, &ops[i]);

			_kvb_tcp_cq_push(tt, ops[i].cookie,
					 err ? err : ep->last_err);
			t->stats.errors++;
		}
		_kvb_tcp_timer_want(tt, 1);
		return (int) take;
	}

	rc = ep_queue(ep, ops, take, &bytes, &good);
	if (rc)
		return rc;
	if (!good) {
		_kvb_tcp_timer_want(tt, 1);
		return (int) take;
	}
	if (ep->state == EP_IDLE) {
		rc = ep_dial(ep);
		if (rc)
			ep_fail(ep, rc, 1);
	}
	if (ep->state != EP_CONNECTED) {
		/* queued until the dial completes: no doorbell yet */
		t->stats.wrs += good;
		t->stats.bytes += bytes;
		t->stats.wr_hist[kvb_wr_hist_bucket(good)]++;
	} else {
		int64_t sent = _kvb_tcp_txq_send(tt, &ep->tx, ep->fd);

		kvb_stats_doorbell(&t->stats, good, bytes);
		if (sent > 0)
			ep->last_progress = tcp_now();
		if (sent < 0 && sent != -EAGAIN)
			ep_fail(ep, (int) sent, 0);
		else if (ep_update(ep))
			ep_fail(ep, -ENOMEM, 0);
	}
	if (tt->cq_len)
		_kvb_tcp_timer_want(tt, 1);
	return (int) take;
}

/*
 * The stripe of the group `lead` that takes the next chain: one with
 * credit whose connection is not in a failed dial's backoff, with the
 * fewest bytes in flight (posted and not completed: a stream that drains
 * slower gets less); ties go to the first. NULL (the caller stalls) when
 * the stripes outside backoff have no credit: their acks free it, and the
 * peer answered them. Only when every stripe is in backoff (the peer
 * refused or did not answer each dial within the last 100 ms) does one of
 * them take the chain, whose ops then fail fast, as with one connection.
 */
static struct kvb_ep *stripe_pick(struct kvb_ep *lead, uint64_t now)
{
	struct kvb_ep *best = NULL, *failing = NULL, *s;
	int live = 0;

	for (s = lead; s; s = s->stripe) {
		if (s->state == EP_IDLE && now < s->backoff_until) {
			if (!failing && s->used < s->depth)
				failing = s;
			continue;
		}
		live = 1;
		if (s->used == s->depth)
			continue;
		if (!best || s->inflight_bytes < best->inflight_bytes)
			best = s;
	}
	return best ? best : live ? NULL : failing;
}

/*
 * How many of ops[0..n) a stripe takes so that the live stripes' bytes in
 * flight stay level: up to the level (theirs and the chain's `left`,
 * shared out evenly), never less than KVB_TCP_STRIPE_MIN, at least one op.
 */
static unsigned stripe_share(const struct kvb_ep *lead, const struct kvb_ep *s,
			     uint64_t now, const struct kvb_xop *ops,
			     unsigned n, uint64_t left)
{
	uint64_t sum = 0, level, cap, bytes = 0;
	unsigned live = 0, k;
	const struct kvb_ep *e;

	for (e = lead; e; e = e->stripe) {
		if ((e->state == EP_IDLE && now < e->backoff_until) ||
		    e->used == e->depth)
			continue;
		sum += e->inflight_bytes;
		live++;
	}
	if (!live)
		return n;
	level = (sum + left) / live;
	cap = level > s->inflight_bytes ? level - s->inflight_bytes : 0;
	if (cap < KVB_TCP_STRIPE_MIN)
		cap = KVB_TCP_STRIPE_MIN;
	for (k = 0; k < n; k++) {
		if (k && ops[k].len > cap - bytes)
			break;
		bytes += ops[k].len;
		if (bytes >= cap) {
			k++;
			break;
		}
	}
	return k;
}

/*
 * A chain goes to the stripe with the fewest bytes in flight; a large one
 * is spread: that stripe takes its share (stripe_share) in one sendmsg,
 * like one QP's doorbell, the rest goes on to the next pick. What a
 * stripe has no credit or iovecs for goes on as well. Chains below
 * KVB_TCP_STRIPE_MIN stay whole.
 */
int _kvb_tcp_post(struct kvb_transport *t, struct kvb_ep *ep,
		  const struct kvb_xop *ops, unsigned n)
{
	unsigned done = 0, i;
	uint64_t now, left = 0;

	if (!ep || (!ops && n))
		return -EINVAL;
	if (!n)
		return 0;
	if (!ep->stripe)
		return ep_post(t, ep, ops, n);
	now = tcp_now();
	for (i = 0; i < n; i++)
		left += ops[i].len;
	while (done < n) {
		struct kvb_ep *s = stripe_pick(ep, now);
		unsigned take;
		int rc;

		if (!s) {
			if (!done)
				t->stats.credit_stalls++;
			break;
		}
		take = stripe_share(ep, s, now, ops + done, n - done, left);
		rc = ep_post(t, s, ops + done, take);
		if (rc < 0)
			return done ? (int) done : rc;
		if (!rc)
			break;
		for (i = done; i < done + (unsigned) rc; i++)
			left -= ops[i].len;
		done += (unsigned) rc;
	}
	return (int) done;
}

static int ep_on_recs(struct kvb_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	uint32_t code =
		rx->h.type == KVB_TCP_F_ACK ? KVB_XOP_WRITE : KVB_XOP_READ;
	uint64_t total = 0;
	unsigned i;

	for (i = 0; i < rx->h.count; i++) {
		struct tcp_item *it = &rx->items[i];
		struct kvb_tcp_rec *r = &it->rec;
		uint32_t idx;
		struct tcp_slot *s;

		kvb_tcp_rec_decode(r, rx->rbuf + i * KVB_TCP_REC_LEN);
		idx = (uint32_t) r->seq;
		if (r->region || r->off || r->status > 0 || idx >= ep->depth)
			return -EPROTO;
		s = &ep->slots[idx];
		/* a rider's seq never went on the wire: its record's did */
		if (!s->used || s->seq != r->seq || s->answered ||
		    s->opcode != code || tcp_slot_rider(ep, idx))
			return -EPROTO;
		/* an honest server acknowledges a write once its bytes
		 * landed: not while its frame is still being sent (from the
		 * source region the broker would then release) */
		if (code == KVB_XOP_WRITE
			    ? r->len != 0 || ep->tx.sent < s->tx_end
			    : r->len != (r->status ? 0 : s->len))
			return -EPROTO;
		s->answered = 1;
		total += r->len;
		it->slot = idx;
		it->got = 0;
		it->dst = s->dst;
		it->mr = s->dst ? s->local : NULL;
	}
	if (total != rx->h.payload)
		return -EPROTO;
	if (code == KVB_XOP_READ) {
		_kvb_tcp_rx_begin_pay(rx, rx->h.count, 1);
		return 0;
	}
	for (i = 0; i < rx->h.count; i++)
		ep_complete(ep, rx->items[i].slot, rx->items[i].rec.status);
	_kvb_tcp_rx_begin_pay(rx, 0, 0);
	return 0;
}

static int ep_on(void *owner, enum tcp_rx_ev ev, unsigned idx)
{
	struct kvb_ep *ep = owner;
	struct tcp_rx *rx = &ep->rx;
	unsigned i;

	switch (ev) {
	case EV_HDR:
		if (kvb_tcp_hdr_decode(&rx->h, rx->hbuf))
			return -EPROTO;
		if (rx->h.type != KVB_TCP_F_ACK &&
		    rx->h.type != KVB_TCP_F_READ_RESP)
			return -EPROTO;
		if (rx->h.type == KVB_TCP_F_ACK && rx->h.payload)
			return -EPROTO;
		_kvb_tcp_rx_begin_recs(rx);
		return 0;
	case EV_RECS:
		return ep_on_recs(ep);
	case EV_FRAME:
		if (rx->h.type != KVB_TCP_F_READ_RESP)
			return 0;
		/* a trailer status is 0 or -errno, as a record's: anything
		 * else is a malformed frame, not one failed op */
		for (i = 0; i < rx->n; i++)
			if (!rx->items[i].rec.status &&
			    kvb_tcp_status_get(rx->tbuf + 4 * i) > 0)
				return -EPROTO;
		for (i = 0; i < rx->n; i++) {
			int st = rx->items[i].rec.status;

			if (!st)
				st = kvb_tcp_status_get(rx->tbuf + 4 * i);
			ep_complete(ep, rx->items[i].slot, st);
		}
		return 0;
	default:
		return 0;
	}
}

void _kvb_tcp_ep_event(struct kvb_ep *ep, uint32_t events)
{
	struct tcp_transport *tt = ep->tt;
	int rc, err = 0;
	socklen_t len = sizeof(err);

	if (ep->fd < 0)
		return;
	if (ep->state == EP_CONNECTING) {
		if (getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &len))
			err = errno;
		if (err) {
			ep_fail(ep, -err, 1);
			return;
		}
		rc = _kvb_tcp_ep_auth_start(ep);
		if (rc) {
			ep_fail(ep, rc, 1);
			return;
		}
		if (ep_update(ep))
			ep_fail(ep, -ENOMEM, 0);
		return;
	}
	if (ep->state == EP_AUTH) {
		if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
			return;
		rc = _kvb_tcp_ep_auth_read(ep);
		if (rc < 0) {
			/* refused or not the peer we meant: a failed dial */
			ep_fail(ep, rc, 1);
			return;
		}
		if (!rc)
			return;
		ep->last_progress = tcp_now();
		events = EPOLLOUT; /* the frames queued meanwhile */
	}
	if (events & EPOLLOUT) {
		rc = ep_flush(ep);
		if (rc) {
			ep_fail(ep, rc, 0);
			return;
		}
	}
	if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
		rc = _kvb_tcp_rx_pump(tt, &ep->rx, ep->fd, ep_on, ep,
				      &ep->last_progress);
		if (rc < 0) {
			if (rc == -EPROTO)
				tt->st.rejected++;
			ep_fail(ep, rc, 0);
			return;
		}
	}
	if (ep_update(ep))
		ep_fail(ep, -ENOMEM, 0);
}

void _kvb_tcp_ep_tick(struct kvb_ep *ep, uint64_t now, uint64_t *next)
{
	uint64_t dl;

	if (ep->state == EP_CONNECTING || ep->state == EP_AUTH) {
		dl = ep->deadline;
		if (now >= dl) {
			ep_fail(ep, -ETIMEDOUT, 1);
			return;
		}
	} else if (ep->state == EP_CONNECTED && ep->used) {
		/* ops in flight and not a byte either way: a stalled peer */
		dl = ep->last_progress + ep->tt->timeout_ns;
		if (now >= dl) {
			ep_fail(ep, -ETIMEDOUT, 0);
			return;
		}
	} else {
		return;
	}
	if (dl < *next)
		*next = dl;
}

static void ep_drop_seg(void *owner, struct tcp_frame *f, uint32_t ref,
			int status)
{
	struct kvb_ep *ep = owner;
	struct tcp_slot *s = &ep->slots[ref];

	(void) f;
	if (s->used && s->opcode == KVB_XOP_WRITE && !s->err)
		s->err = status;
}

void _kvb_tcp_ep_drop_mr(struct kvb_ep *ep, struct kvb_mr *mr)
{
	uint32_t i;

	_kvb_tcp_rx_drop_mr(&ep->rx, mr);
	_kvb_tcp_txq_drop_mr(&ep->tx, mr);
	for (i = 0; i < ep->depth; i++) {
		struct tcp_slot *s = &ep->slots[i];

		if (!s->used || s->local != mr || s->opcode != KVB_XOP_READ)
			continue;
		s->dst = NULL;
		s->err = -ENOENT;
	}
}

// SPDX-License-Identifier: MIT
/*
 * The serving side: connections peers dialed to us. Requests are checked
 * record by record against the regions registered here before any payload
 * lands; WRITE payloads go straight into the region (or, when refused, into
 * the discard buffer), READ payloads are sent straight from it. Acks
 * collect per connection and go out as one ACK frame per poll() round.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "tcp/tcp_priv.h"

static void conn_mark(struct tcp_conn *c)
{
	if (c->dirty)
		return;
	c->dirty = 1;
	c->dnext = c->tt->dirty;
	c->tt->dirty = c;
}

void _kvb_tcp_conn_destroy(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	struct tcp_conn **pp;

	if (c->dirty)
		for (pp = &tt->dirty; *pp; pp = &(*pp)->dnext)
			if (*pp == c) {
				*pp = c->dnext;
				break;
			}
	close(c->fd); /* also leaves the epoll set */
	_kvb_tcp_txq_clear(&c->tx);
	_kvb_tcp_rx_free(&c->rx);
	free(c->acks);
	if (c->prev)
		c->prev->next = c->next;
	else
		tt->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	tt->nconns--;
	tt->st.conns_open--;
	free(c);
}

static void conn_drop_seg(void *owner, struct tcp_frame *f, uint32_t ref,
			  int status);

void _kvb_tcp_accept(struct tcp_transport *tt)
{
	unsigned i;

	for (i = 0; i < TCP_ACCEPT_BURST; i++) {
		struct tcp_conn *c;
		int fd;

		fd = accept4(tt->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;
		}
		if (tt->nconns >= TCP_MAX_CONNS)
			goto err_close;
		c = calloc(1, sizeof(*c));
		if (!c)
			goto err_close;
		if (_kvb_tcp_rx_init(&c->rx))
			goto err_free;
		c->tag.kind = TCP_K_CONN;
		c->tt = tt;
		_kvb_tcp_txq_init(&c->tx, conn_drop_seg, c);
		c->fd = fd;
		_kvb_tcp_sock_tune(tt, fd);
		if (_kvb_tcp_epoll_set(tt, fd, &c->tag, &c->events, EPOLLIN))
			goto err_rx;
		c->next = tt->conns;
		if (c->next)
			c->next->prev = c;
		tt->conns = c;
		tt->nconns++;
		tt->st.conns_open++;
		tt->st.conn_accepted++;
		continue;
	err_rx:
		_kvb_tcp_rx_free(&c->rx);
	err_free:
		free(c);
	err_close:
		close(fd);
	}
}

/* 0 or the status the op is answered with. */
static int check_region(struct tcp_transport *tt, const struct kvb_tcp_rec *r,
			uint32_t flag, struct kvb_mr **out)
{
	struct kvb_mr *mr = _kvb_tcp_mr_find(tt, r->region);

	if (!mr)
		return -ENOENT;
	if (!(mr->flags & flag))
		return -EACCES;
	if (r->off > mr->len || r->len > mr->len - r->off)
		return -EFAULT;
	*out = mr;
	return 0;
}

static int ack_push(struct tcp_conn *c, uint64_t seq, int32_t status)
{
	struct kvb_tcp_rec *r;

	if (c->nacks == c->acks_cap) {
		unsigned cap = c->acks_cap ? c->acks_cap * 2 : 64;

		r = realloc(c->acks, cap * sizeof(*r));
		if (!r)
			return -ENOMEM;
		c->acks = r;
		c->acks_cap = cap;
	}
	r = &c->acks[c->nacks++];
	memset(r, 0, sizeof(*r));
	r->seq = seq;
	r->status = status;
	conn_mark(c);
	return 0;
}

/* Answer a READ_REQ frame: one READ_RESP, payload sent from the regions. */
static int serve_reads(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	struct tcp_rx *rx = &c->rx;
	struct kvb_tcp_hdr h = {.type = KVB_TCP_F_READ_RESP};
	struct kvb_mr *mrs[KVB_TCP_MAX_RECS];
	struct tcp_frame *f;
	unsigned i, nseg = 0, k = rx->h.count;

	for (i = 0; i < k; i++) {
		struct tcp_item *it = &rx->items[i];

		mrs[i] = NULL;
		it->rec.status = check_region(tt, &it->rec, KVB_MEM_REMOTE_READ,
					      &mrs[i]);
		if (it->rec.status)
			tt->st.refused_ops++;
		else if (it->rec.len)
			nseg++;
	}
	f = _kvb_tcp_frame_new(nseg, KVB_TCP_HDR_LEN + k * KVB_TCP_REC_LEN,
			       kvb_tcp_trailer_len(k));
	if (!f)
		return -ENOMEM;
	nseg = 0;
	h.count = (uint16_t) k;
	for (i = 0; i < k; i++) {
		struct kvb_tcp_rec r = {.seq = rx->items[i].rec.seq,
					.status = rx->items[i].rec.status};
		uint64_t off = rx->items[i].rec.off;

		if (!r.status)
			r.len = rx->items[i].rec.len;
		kvb_tcp_rec_encode(&r, f->meta + KVB_TCP_HDR_LEN +
					       i * KVB_TCP_REC_LEN);
		if (r.status || !r.len)
			continue;
		f->seg[nseg].base = (const char *) mrs[i]->addr + off;
		f->seg[nseg].len = r.len;
		f->seg[nseg].mr = mrs[i];
		f->seg[nseg++].ref = i;
		h.payload += r.len;
	}
	kvb_tcp_hdr_encode(&h, f->meta);
	_kvb_tcp_txq_push(&c->tx, f);
	tt->st.frames_tx++;
	conn_mark(c);
	return 0;
}

static int conn_on_recs(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	struct tcp_rx *rx = &c->rx;
	uint64_t total = 0;
	unsigned i;

	for (i = 0; i < rx->h.count; i++) {
		struct tcp_item *it = &rx->items[i];

		kvb_tcp_rec_decode(&it->rec, rx->rbuf + i * KVB_TCP_REC_LEN);
		if (it->rec.status || it->rec.len > KVB_TCP_MAX_OP)
			return -EPROTO;
		total += it->rec.len;
		it->got = 0;
		it->dst = NULL;
		it->mr = NULL;
	}
	if (rx->h.type == KVB_TCP_F_READ_REQ) {
		_kvb_tcp_rx_begin_pay(rx, 0, 0);
		return serve_reads(c);
	}
	if (total != rx->h.payload)
		return -EPROTO;
	/* every record is checked before a byte of payload is read */
	for (i = 0; i < rx->h.count; i++) {
		struct tcp_item *it = &rx->items[i];
		struct kvb_mr *mr = NULL;

		it->rec.status =
			check_region(tt, &it->rec, KVB_MEM_REMOTE_WRITE, &mr);
		if (it->rec.status) {
			tt->st.refused_ops++;
			continue;
		}
		it->mr = mr;
		it->dst = (char *) mr->addr + it->rec.off;
	}
	_kvb_tcp_rx_begin_pay(rx, rx->h.count, 0);
	return 0;
}

static int conn_on(void *owner, enum tcp_rx_ev ev, unsigned idx)
{
	struct tcp_conn *c = owner;
	struct tcp_rx *rx = &c->rx;

	switch (ev) {
	case EV_HDR:
		if (kvb_tcp_hdr_decode(&rx->h, rx->hbuf))
			return -EPROTO;
		if (rx->h.type != KVB_TCP_F_WRITE &&
		    rx->h.type != KVB_TCP_F_READ_REQ)
			return -EPROTO;
		if (rx->h.type == KVB_TCP_F_READ_REQ && rx->h.payload)
			return -EPROTO;
		_kvb_tcp_rx_begin_recs(rx);
		return 0;
	case EV_RECS:
		return conn_on_recs(c);
	case EV_ITEM:
		return ack_push(c, rx->items[idx].rec.seq,
				rx->items[idx].rec.status);
	case EV_FRAME:
		return c->tx.n >= TCP_TX_FRAMES_MAX;
	default:
		return 0;
	}
}

static void conn_update(struct tcp_conn *c)
{
	uint32_t want = 0;

	/* a peer that does not read its answers stops being read */
	if (c->tx.n < TCP_TX_FRAMES_MAX)
		want |= EPOLLIN;
	if (c->tx.n)
		want |= EPOLLOUT;
	_kvb_tcp_epoll_set(c->tt, c->fd, &c->tag, &c->events, want);
}

static int conn_send(struct tcp_conn *c)
{
	uint64_t sent = 0;

	while (c->tx.n && sent < TCP_TX_BUDGET) {
		int64_t rc = _kvb_tcp_txq_send(c->tt, &c->tx, c->fd);

		if (rc == -EAGAIN)
			break;
		if (rc < 0)
			return (int) rc;
		sent += (uint64_t) rc;
	}
	return 0;
}

void _kvb_tcp_conn_event(struct tcp_conn *c, uint32_t events)
{
	struct tcp_transport *tt = c->tt;
	int rc;

	if ((events & EPOLLOUT) && conn_send(c)) {
		_kvb_tcp_conn_destroy(c);
		return;
	}
	if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) &&
	    c->tx.n < TCP_TX_FRAMES_MAX) {
		rc = _kvb_tcp_rx_pump(tt, &c->rx, c->fd, conn_on, c, NULL);
		if (rc < 0) {
			if (rc == -EPROTO)
				tt->st.rejected++;
			_kvb_tcp_conn_destroy(c);
			return;
		}
	}
	conn_update(c);
}

/* Frame the pending acks (one ACK frame per KVB_TCP_MAX_RECS). */
static int conn_frame_acks(struct tcp_conn *c)
{
	unsigned done = 0;

	while (done < c->nacks) {
		unsigned k = c->nacks - done, i;
		struct kvb_tcp_hdr h = {.type = KVB_TCP_F_ACK};
		struct tcp_frame *f;

		if (k > KVB_TCP_MAX_RECS)
			k = KVB_TCP_MAX_RECS;
		f = _kvb_tcp_frame_new(0, KVB_TCP_HDR_LEN + k * KVB_TCP_REC_LEN,
				       0);
		if (!f)
			return -ENOMEM;
		h.count = (uint16_t) k;
		kvb_tcp_hdr_encode(&h, f->meta);
		for (i = 0; i < k; i++)
			kvb_tcp_rec_encode(&c->acks[done + i],
					   f->meta + KVB_TCP_HDR_LEN +
						   i * KVB_TCP_REC_LEN);
		_kvb_tcp_txq_push(&c->tx, f);
		c->tt->st.frames_tx++;
		done += k;
	}
	c->nacks = 0;
	return 0;
}

void _kvb_tcp_conn_flush_all(struct tcp_transport *tt)
{
	while (tt->dirty) {
		struct tcp_conn *c = tt->dirty;

		tt->dirty = c->dnext;
		c->dirty = 0;
		if (conn_frame_acks(c) || conn_send(c)) {
			_kvb_tcp_conn_destroy(c);
			continue;
		}
		conn_update(c);
	}
}

static void conn_drop_seg(void *owner, struct tcp_frame *f, uint32_t ref,
			  int status)
{
	(void) owner;
	/* the READ_RESP trailer, sent after every payload, fails the op */
	if (!kvb_tcp_status_get(f->trailer + 4 * ref))
		kvb_tcp_status_put(f->trailer + 4 * ref, status);
}

void _kvb_tcp_conn_drop_mr(struct tcp_conn *c, struct kvb_mr *mr)
{
	_kvb_tcp_rx_drop_mr(&c->rx, mr);
	_kvb_tcp_txq_drop_mr(&c->tx, mr);
}

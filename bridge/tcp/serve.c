// SPDX-License-Identifier: MIT
/*
 * The serving side: connections peers dialed to us. Requests are checked
 * record by record against the regions registered here before any payload
 * lands; WRITE payloads go straight into the region (or, when refused, into
 * the discard buffer), READ payloads are sent straight from it. Acks
 * collect per connection and go out as one ACK frame per poll() round.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
	if (c->evicted)
		tt->nevicted--;
	if (c->state != C_OPEN) {
		if (c->pprev)
			c->pprev->pnext = c->pnext;
		else
			tt->phead = c->pnext;
		if (c->pnext)
			c->pnext->pprev = c->pprev;
		else
			tt->ptail = c->pprev;
		tt->st.conns_unauth--;
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

/* IPv4-mapped IPv6 (a dual-stack listener) made plain IPv4 */
static void sa_norm(struct sockaddr_storage *sa)
{
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *) sa;
	struct sockaddr_in s4;

	if (sa->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
		return;
	memset(&s4, 0, sizeof(s4));
	s4.sin_family = AF_INET;
	s4.sin_port = s6->sin6_port;
	memcpy(&s4.sin_addr, s6->sin6_addr.s6_addr + 12, 4);
	memset(sa, 0, sizeof(*sa));
	memcpy(sa, &s4, sizeof(s4));
}

static const uint8_t *sa_addr(const struct sockaddr_storage *sa)
{
	if (sa->ss_family == AF_INET)
		return (const uint8_t *) &((const struct sockaddr_in *) sa)
			->sin_addr;
	return ((const struct sockaddr_in6 *) sa)->sin6_addr.s6_addr;
}

static int sa_same_host(const struct sockaddr_storage *a,
			const struct sockaddr_storage *b)
{
	return a->ss_family == b->ss_family &&
	       !memcmp(sa_addr(a), sa_addr(b),
		       a->ss_family == AF_INET ? 4 : 16);
}

static int is_trusted(struct tcp_transport *tt,
		      const struct sockaddr_storage *sa)
{
	unsigned i;

	if (!tt->ntrusted)
		return 1;
	for (i = 0; i < tt->ntrusted; i++)
		if (tt->trusted[i].family == sa->ss_family &&
		    !memcmp(tt->trusted[i].addr, sa_addr(sa),
			    sa->ss_family == AF_INET ? 4 : 16))
			return 1;
	return 0;
}

/* Unlink c from the pending list. */
static void pending_unlink(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;

	if (c->pprev)
		c->pprev->pnext = c->pnext;
	else
		tt->phead = c->pnext;
	if (c->pnext)
		c->pnext->pprev = c->pprev;
	else
		tt->ptail = c->pprev;
	c->pprev = c->pnext = NULL;
}

/*
 * A connection that has not authenticated gives its place up: closed after
 * this round's events (not here: an event of it may still be in the batch),
 * by _kvb_tcp_conn_expire, to which it goes first.
 */
static void conn_evict(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;

	pending_unlink(c);
	c->evicted = 1;
	c->deadline = 0;
	c->pnext = tt->phead;
	if (tt->phead)
		tt->phead->pprev = c;
	else
		tt->ptail = c;
	tt->phead = c;
	tt->nevicted++;
	_kvb_tcp_timer_want(tt, 1);
}

/* The oldest connection not authenticated (and not evicted already), of
 * host sa (NULL: of any host), and how many of sa's there are. */
static struct tcp_conn *oldest_pending(struct tcp_transport *tt,
				       const struct sockaddr_storage *sa,
				       unsigned *count)
{
	struct tcp_conn *c, *first = NULL;
	unsigned n = 0;

	for (c = tt->phead; c; c = c->pnext) {
		if (c->evicted || (sa && !sa_same_host(&c->sa, sa)))
			continue;
		if (!first)
			first = c;
		n++;
	}
	if (count)
		*count = n;
	return first;
}

/* Authenticated connections from host sa. */
static unsigned open_from(struct tcp_transport *tt,
			  const struct sockaddr_storage *sa)
{
	const struct tcp_conn *c;
	unsigned n = 0;

	for (c = tt->conns; c; c = c->next)
		n += c->state == C_OPEN && sa_same_host(&c->sa, sa);
	return n;
}

/*
 * Why a connection just accepted is closed at once (its counter bumped and
 * a line logged), or NULL when it may stay. Connections that have not
 * authenticated have a budget of their own, per host: max_per_host at once,
 * for the auth deadline at most; at that budget (or with the port full) a
 * new one takes the place of the oldest one that has not authenticated (of
 * its host; with the port full, of any), which is closed (unauth_evicted).
 * A peer broker authenticates within a round trip of connecting, so a
 * process that keeps partial HELLOs open from the same (trusted) host
 * evicts its own, never takes the slots the broker needs. Authenticated
 * connections count apart (max_per_host per host, checked when they
 * authenticate) and are never evicted.
 */
static const char *accept_check(struct tcp_transport *tt, int fd,
				const struct sockaddr_storage *sa)
{
	struct tcp_conn *old;
	unsigned pending;

	if (!is_trusted(tt, sa)) {
		tt->st.refused_untrusted++;
		return "untrusted_host (not in the trusted hosts)";
	}
	if (fd >= tt->fd_cap) {
		tt->st.refused_conn_limit++;
		return "conn_limit (descriptors nearly exhausted)";
	}
	old = oldest_pending(tt, sa, &pending);
	if (old && pending >= tt->max_per_host)
		conn_evict(old);
	if (tt->nconns - tt->nevicted >= tt->max_conns) {
		old = oldest_pending(tt, NULL, NULL);
		if (!old) {
			tt->st.refused_conn_limit++;
			return "conn_limit (connections in all)";
		}
		conn_evict(old);
	}
	return NULL;
}

/* accept() ran out of descriptors: stop accepting for a while instead of
 * spinning on a listener that stays readable */
static void accept_pause(struct tcp_transport *tt, int err)
{
	tt->st.accept_paused++;
	tt->accept_resume = tcp_now() + TCP_ACCEPT_PAUSE_NS;
	_kvb_tcp_epoll_set(tt, tt->lfd, &tt->ltag, &tt->lev, 0);
	_kvb_tcp_timer_want(tt, tt->accept_resume);
	_kvb_tcp_rlog(tt, RL_EMFILE,
		      "tcp data port: accept: %s: not accepting for 100 ms",
		      strerror(err));
}

static int conn_add(struct tcp_transport *tt, int fd,
		    const struct sockaddr_storage *sa)
{
	struct tcp_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	if (_kvb_tcp_rx_init(&c->rx)) {
		free(c);
		return -ENOMEM;
	}
	c->tag.kind = TCP_K_CONN;
	c->tt = tt;
	_kvb_tcp_txq_init(&c->tx, conn_drop_seg, c);
	c->fd = fd;
	c->sa = *sa;
	c->state = C_HELLO;
	c->deadline = tcp_now() + tt->auth_ns;
	_kvb_tcp_sock_tune(tt, fd);
	if (_kvb_tcp_epoll_set(tt, fd, &c->tag, &c->events, EPOLLIN)) {
		_kvb_tcp_rx_free(&c->rx);
		free(c);
		return -ENOMEM;
	}
	c->next = tt->conns;
	if (c->next)
		c->next->prev = c;
	tt->conns = c;
	/* deadlines in accept order: the head expires first */
	c->pprev = tt->ptail;
	if (tt->ptail)
		tt->ptail->pnext = c;
	else
		tt->phead = c;
	tt->ptail = c;
	tt->nconns++;
	tt->st.conns_open++;
	tt->st.conns_unauth++;
	tt->st.conn_accepted++;
	_kvb_tcp_timer_want(tt, tt->phead->deadline);
	return 0;
}

void _kvb_tcp_accept(struct tcp_transport *tt)
{
	unsigned i;

	for (i = 0; i < TCP_ACCEPT_BURST; i++) {
		struct sockaddr_storage sa;
		socklen_t salen = sizeof(sa);
		char a[INET6_ADDRSTRLEN];
		const char *why;
		int fd;

		memset(&sa, 0, sizeof(sa));
		fd = accept4(tt->lfd, (struct sockaddr *) &sa, &salen,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE ||
			    errno == ENOBUFS || errno == ENOMEM)
				accept_pause(tt, errno);
			return;
		}
		sa_norm(&sa);
		/* before a byte is read */
		why = accept_check(tt, fd, &sa);
		if (!why && conn_add(tt, fd, &sa))
			why = "out of memory";
		if (!why)
			continue;
		close(fd);
		_kvb_tcp_addr_str(&sa, a, sizeof(a));
		_kvb_tcp_rlog(tt, why[0] == 'u' ? RL_UNTRUSTED : RL_CONN_LIMIT,
			      "tcp data port: connection from %s refused: %s",
			      a, why);
	}
}

void _kvb_tcp_conn_expire(struct tcp_transport *tt, uint64_t now,
			  uint64_t *next)
{
	char a[INET6_ADDRSTRLEN];

	while (tt->phead && tt->phead->deadline <= now) {
		struct tcp_conn *c = tt->phead;

		_kvb_tcp_addr_str(&c->sa, a, sizeof(a));
		if (c->evicted) {
			tt->st.unauth_evicted++;
			_kvb_tcp_rlog(tt, RL_CONN_LIMIT,
				      "tcp data port: connection from %s "
				      "closed: not authenticated, its place "
				      "taken by a newer connection",
				      a);
		} else {
			tt->st.refused_auth_timeout++;
			_kvb_tcp_rlog(
				tt, RL_AUTH_TIMEOUT,
				"tcp data port: connection from %s "
				"closed: auth_timeout (%llu ms)",
				a,
				(unsigned long long) (tt->auth_ns / 1000000));
		}
		_kvb_tcp_conn_destroy(c);
	}
	if (tt->phead && tt->phead->deadline < *next)
		*next = tt->phead->deadline;
}

/* Authenticated: off the pending list (and no longer evicted: it proved
 * the key in the same round). 0, or -1 when its host holds max_per_host
 * authenticated connections already (counted; the caller closes it). */
static int conn_opened(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;

	pending_unlink(c);
	if (c->evicted) {
		c->evicted = 0;
		tt->nevicted--;
	}
	tt->st.conns_unauth--;
	if (open_from(tt, &c->sa) > tt->max_per_host) {
		char a[INET6_ADDRSTRLEN];

		tt->st.refused_conn_limit++;
		_kvb_tcp_addr_str(&c->sa, a, sizeof(a));
		_kvb_tcp_rlog(tt, RL_CONN_LIMIT,
			      "tcp data port: connection from %s refused: "
			      "conn_limit (authenticated connections from "
			      "that host)",
			      a);
		return -1;
	}
	return 0;
}

/* 0 or the status the op is answered with. */
static int check_region(struct tcp_conn *c, const struct kvb_tcp_rec *r,
			uint32_t flag, struct kvb_mr **out)
{
	struct tcp_transport *tt = c->tt;
	struct kvb_mr *mr = _kvb_tcp_mr_find(tt, r->region);
	int st = 0;

	/* only what was offered to this peer (whether a region it was not
	 * offered exists is not said), in its access flags */
	if (!_kvb_tcp_peer_has(c->peer, r->region))
		st = -EACCES;
	else if (!mr)
		st = -ENOENT;
	else if (!(mr->flags & flag))
		st = -EACCES;
	if (st) {
		char a[INET6_ADDRSTRLEN];

		tt->st.refused_region++;
		_kvb_tcp_addr_str(&c->sa, a, sizeof(a));
		_kvb_tcp_rlog(tt, RL_REGION,
			      "tcp data port: %s from %s on region %#x "
			      "refused: region_refused",
			      flag == KVB_MEM_REMOTE_READ ? "READ" : "WRITE", a,
			      r->region);
		return st;
	}
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
		it->rec.status =
			check_region(c, &it->rec, KVB_MEM_REMOTE_READ, &mrs[i]);
		if (!it->rec.status && tt->rgate) {
			it->rec.status =
				tt->rgate(tt->rgate_arg, it->rec.region,
					  it->rec.off, it->rec.len);
			if (it->rec.status)
				tt->st.refused_read_gate++;
		}
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
			check_region(c, &it->rec, KVB_MEM_REMOTE_WRITE, &mr);
		if (it->rec.status) {
			tt->st.refused_ops++;
			continue;
		}
		if (tt->gate) {
			it->rec.status = tt->gate(tt->gate_arg, it->rec.region,
						  it->rec.off, it->rec.len);
			if (it->rec.status) {
				tt->st.refused_ops++;
				tt->st.refused_gate++;
				continue;
			}
		}
		it->mr = mr;
		it->dst = (char *) mr->addr + it->rec.off;
	}
	_kvb_tcp_rx_begin_pay(rx, rx->h.count, 0);
	return 0;
}

static int gate_ok(void *arg, const struct tcp_item *it)
{
	struct tcp_transport *tt = arg;

	return !tt->gate(tt->gate_arg, it->rec.region, it->rec.off,
			 it->rec.len);
}

void _kvb_tcp_conn_gate_recheck(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	unsigned n;

	if (!tt->gate || c->state != C_OPEN || c->rx.h.type != KVB_TCP_F_WRITE)
		return;
	n = _kvb_tcp_rx_drop_if(&c->rx, gate_ok, tt, -ECANCELED);
	tt->st.refused_ops += n;
	tt->st.refused_gate += n;
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
	if (c->state != C_OPEN) {
		if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
			return;
		rc = _kvb_tcp_conn_auth_read(c);
		if (rc < 0) {
			/* -EACCES: refused and counted; else it went away (or
			 * broke) before it authenticated: a failure too */
			if (rc != -EACCES) {
				char a[INET6_ADDRSTRLEN];

				tt->st.refused_auth_failed++;
				_kvb_tcp_addr_str(&c->sa, a, sizeof(a));
				_kvb_tcp_rlog(tt, RL_AUTH_FAILED,
					      "tcp data port: connection from "
					      "%s refused: auth_failed (closed "
					      "before authenticating: %s)",
					      a, strerror(-rc));
			}
			_kvb_tcp_conn_destroy(c);
			return;
		}
		if (!rc)
			return;
		if (conn_opened(c)) {
			_kvb_tcp_conn_destroy(c);
			return;
		}
		/* frames may have come right behind the PROOF */
		events |= EPOLLIN;
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

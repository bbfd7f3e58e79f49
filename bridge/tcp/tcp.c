// SPDX-License-Identifier: MIT
/*
 * The `tcp` transport: open/close, regions, the connection blob, and the
 * poll loop that drives endpoints (dial.c) and served connections
 * (serve.c). One epoll fd holds the listening socket, a timerfd and every
 * connection; it is what wait_fd() hands the broker.
 *
 * The timerfd makes wait_fd() honest: it is armed for the next deadline
 * (dial timeout, stalled peer) and fired at once when completions are
 * waiting that the last poll() could not return.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "gpu/gpu_api.h"
#include "tcp/tcp_priv.h"

#define CQ_INIT 1024u

/* ---- helpers shared by the other files ---- */

int _kvb_tcp_sockaddr(const char *ip, uint16_t port,
		      struct sockaddr_storage *sa, socklen_t *len)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *) sa;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *) sa;

	memset(sa, 0, sizeof(*sa));
	if (!ip || !*ip)
		ip = "0.0.0.0";
	if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		*len = sizeof(*s4);
		return 0;
	}
	if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		*len = sizeof(*s6);
		return 0;
	}
	return -EINVAL;
}

static void blob_sockaddr(const struct kvb_tcp_blob *b,
			  struct sockaddr_storage *sa, socklen_t *len)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *) sa;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *) sa;

	memset(sa, 0, sizeof(*sa));
	if (b->family == 4) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(b->port);
		memcpy(&s4->sin_addr, b->addr, 4);
		*len = sizeof(*s4);
	} else {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(b->port);
		memcpy(&s6->sin6_addr, b->addr, 16);
		*len = sizeof(*s6);
	}
}

void _kvb_tcp_sock_tune(struct tcp_transport *tt, int fd)
{
	int one = 1, idle, intvl, cnt = 3;
	unsigned uto = (unsigned) tt->timeout_ms;

	/* best effort: a socket that refuses an option still works */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* unacknowledged data older than the timeout kills the connection */
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
	/* an idle connection to a dead host is noticed within ~timeout */
	idle = tt->timeout_ms / 3000;
	intvl = tt->timeout_ms / 6000;
	idle = idle < 1 ? 1 : idle;
	intvl = intvl < 1 ? 1 : intvl;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	if (tt->sndbuf)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tt->sndbuf,
			   sizeof(tt->sndbuf));
	if (tt->rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tt->rcvbuf,
			   sizeof(tt->rcvbuf));
}

int _kvb_tcp_epoll_set(struct tcp_transport *tt, int fd, struct tcp_tag *tag,
		       uint32_t *cur, uint32_t want)
{
	struct epoll_event ev = {.events = want, .data.ptr = tag};
	int op = *cur ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;

	/* *cur keeps a bit of its own: registered with no events is not 0 */
	want |= TCP_EV_REG;
	if (*cur == want)
		return 0;
	if (epoll_ctl(tt->epfd, op, fd, &ev))
		return -errno;
	*cur = want;
	return 0;
}

struct kvb_mr *_kvb_tcp_mr_find(struct tcp_transport *tt, uint32_t id)
{
	unsigned lo = 0, hi = tt->nmr;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (tt->mrs[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < tt->nmr && tt->mrs[lo]->id == id ? tt->mrs[lo] : NULL;
}

int _kvb_tcp_cq_reserve(struct tcp_transport *tt, uint64_t n)
{
	uint64_t need = tt->cq_len + tt->inflight + n;
	struct kvb_xcqe *ncq;
	unsigned cap = tt->cq_cap, i;

	if (need <= cap)
		return 0;
	while (cap < need) {
		if (cap > (1u << 30))
			return -ENOMEM;
		cap *= 2;
	}
	ncq = malloc((size_t) cap * sizeof(*ncq));
	if (!ncq)
		return -ENOMEM;
	for (i = 0; i < tt->cq_len; i++)
		ncq[i] = tt->cq[(tt->cq_head + i) % tt->cq_cap];
	free(tt->cq);
	tt->cq = ncq;
	tt->cq_cap = cap;
	tt->cq_head = 0;
	return 0;
}

void _kvb_tcp_cq_push(struct tcp_transport *tt, uint64_t cookie, int status)
{
	struct kvb_xcqe *c;

	/* post() reserved room for every op it accepted */
	if (tt->cq_len == tt->cq_cap && _kvb_tcp_cq_reserve(tt, 1))
		return;
	c = &tt->cq[(tt->cq_head + tt->cq_len++) % tt->cq_cap];
	c->cookie = cookie;
	c->status = status;
	c->pad = 0;
}

void _kvb_tcp_timer_want(struct tcp_transport *tt, uint64_t at)
{
	struct itimerspec its;

	if (tt->timer_at && tt->timer_at <= at)
		return; /* fires first anyway; poll() re-arms after it */
	memset(&its, 0, sizeof(its));
	its.it_value.tv_sec = (time_t) (at / 1000000000ull);
	its.it_value.tv_nsec = (long) (at % 1000000000ull);
	if (!timerfd_settime(tt->tfd, TFD_TIMER_ABSTIME, &its, NULL))
		tt->timer_at = at;
}

/* ---- open / close ---- */

static int read_longs(const char *path, long *v, int n)
{
	FILE *f = fopen(path, "r");
	int got = 0;

	if (!f)
		return 0;
	while (got < n && fscanf(f, "%ld", &v[got]) == 1)
		got++;
	fclose(f);
	return got;
}

/*
 * SO_SNDBUF/SO_RCVBUF turn the kernel's autotuning off and are capped by
 * net.core.[rw]mem_max (then doubled). Set TCP_BUF_WANT only where that
 * gives more than autotuning would reach (tcp_[rw]mem max), else 0.
 */
static int pick_buf(const char *core_max, const char *tcp_mem)
{
	long cmax, t[3], want = TCP_BUF_WANT;

	if (read_longs(core_max, &cmax, 1) != 1 ||
	    read_longs(tcp_mem, t, 3) != 3)
		return 0;
	if (want > cmax)
		want = cmax;
	return 2 * want > t[2] ? (int) want : 0;
}

static void set_why(char *why, size_t len, const char *what, const char *ip,
		    unsigned port, int err)
{
	if (why && len)
		snprintf(why, len, "%s %s:%u: %s", what, ip, port,
			 strerror(err));
}

static int tcp_listen(struct tcp_transport *tt, const char *ip, unsigned port,
		      char *why, size_t why_len)
{
	struct sockaddr_storage sa;
	socklen_t salen;
	int one = 1, zero = 0, err;

	if (port > 65535 ||
	    _kvb_tcp_sockaddr(ip, (uint16_t) port, &sa, &salen)) {
		if (why && why_len)
			snprintf(why, why_len,
				 "tcp: host_ip must be a numeric IPv4/IPv6 "
				 "address and tcp_port <= 65535");
		return -EINVAL;
	}
	tt->lfd = socket(sa.ss_family,
			 SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (tt->lfd < 0) {
		err = errno;
		set_why(why, why_len, "tcp: socket for", ip, port, err);
		return -err;
	}
	setsockopt(tt->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (sa.ss_family == AF_INET6)
		setsockopt(tt->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero,
			   sizeof(zero));
	/* before listen(): accepted sockets inherit it, window scale too */
	if (tt->rcvbuf)
		setsockopt(tt->lfd, SOL_SOCKET, SO_RCVBUF, &tt->rcvbuf,
			   sizeof(tt->rcvbuf));
	if (bind(tt->lfd, (struct sockaddr *) &sa, salen) ||
	    listen(tt->lfd, 256)) {
		err = errno;
		set_why(why, why_len, "tcp: cannot listen on", ip, port, err);
		return -err;
	}
	salen = sizeof(sa);
	if (getsockname(tt->lfd, (struct sockaddr *) &sa, &salen))
		return -errno;
	if (sa.ss_family == AF_INET) {
		struct sockaddr_in *s4 = (struct sockaddr_in *) &sa;

		tt->family = 4;
		tt->port = ntohs(s4->sin_port);
		memcpy(tt->addr, &s4->sin_addr, 4);
	} else {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *) &sa;

		tt->family = 6;
		tt->port = ntohs(s6->sin6_port);
		memcpy(tt->addr, &s6->sin6_addr, 16);
	}
	return 0;
}

static void tcp_close(struct kvb_transport *t);

static int tcp_open(const struct kvb_transport_params *p,
		    struct kvb_transport **out, char *why, size_t why_len)
{
	struct tcp_transport *tt;
	uint32_t none = 0;

	int err;

	tt = calloc(1, sizeof(*tt));
	if (!tt)
		return -ENOMEM;
	tt->base.ops = &kvb_tcp_ops;
	tt->epfd = tt->lfd = tt->tfd = -1;
	tt->ltag.kind = TCP_K_LISTEN;
	tt->ttag.kind = TCP_K_TIMER;
	tt->depth = p->sq_depth ? p->sq_depth : TCP_DEPTH_DEFAULT;
	if (tt->depth > (1u << 20))
		tt->depth = 1u << 20;
	if (p->qp_per_peer > (int) TCP_STRIPES_MAX) {
		if (why && why_len)
			snprintf(why, why_len,
				 "tcp: %d connections per peer: at most %u",
				 p->qp_per_peer, TCP_STRIPES_MAX);
		free(tt);
		return -EINVAL;
	}
	tt->stripes = p->qp_per_peer > 0 ? (unsigned) p->qp_per_peer : 1;
	tt->timeout_ms =
		p->timeout_ms > 0 ? p->timeout_ms : TCP_TIMEOUT_DEFAULT;
	tt->timeout_ns = (uint64_t) tt->timeout_ms * 1000000ull;
	tt->nonce = tcp_rand64();
	err = -ENOMEM;
	if (sodium_init() < 0) /* the MACs of the authentication */
		goto err;
	kvb_tcp_set_limits(&tt->base, 0, 0, 0);
	tt->sndbuf = pick_buf("/proc/sys/net/core/wmem_max",
			      "/proc/sys/net/ipv4/tcp_wmem");
	tt->rcvbuf = pick_buf("/proc/sys/net/core/rmem_max",
			      "/proc/sys/net/ipv4/tcp_rmem");
	tt->scratch = malloc(TCP_ZBUF);
	tt->zeros = calloc(1, TCP_ZBUF);
	tt->cq = calloc(CQ_INIT, sizeof(*tt->cq));
	tt->cq_cap = CQ_INIT;
	if (!tt->scratch || !tt->zeros || !tt->cq)
		goto err;
	tt->epfd = epoll_create1(EPOLL_CLOEXEC);
	tt->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tt->epfd < 0 || tt->tfd < 0) {
		err = -errno;
		goto err;
	}
	err = _kvb_tcp_epoll_set(tt, tt->tfd, &tt->ttag, &none, EPOLLIN);
	if (err)
		goto err;
	err = tcp_listen(tt, p->host_ip, p->tcp_port, why, why_len);
	if (err)
		goto err;
	err = _kvb_tcp_epoll_set(tt, tt->lfd, &tt->ltag, &tt->lev, EPOLLIN);
	if (err)
		goto err;
	*out = &tt->base;
	return 0;

err:
	tcp_close(&tt->base);
	return err;
}

static void tcp_close(struct kvb_transport *t)
{
	struct tcp_transport *tt = to_tcp(t);

	while (tt->eps)
		_kvb_tcp_ep_destroy(tt->eps, 0);
	while (tt->conns)
		_kvb_tcp_conn_destroy(tt->conns);
	while (tt->npeers)
		kvb_tcp_peer_forget(t, tt->peers[0]->id);
	free(tt->peers);
	if (tt->lfd >= 0)
		close(tt->lfd);
	if (tt->tfd >= 0)
		close(tt->tfd);
	if (tt->epfd >= 0)
		close(tt->epfd);
	free(tt->mrs);
	free(tt->cq);
	free(tt->scratch);
	free(tt->zeros);
	free(tt);
}

/* ---- regions ---- */

static int tcp_reg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct tcp_transport *tt = to_tcp(t);
	unsigned lo = 0, hi;

	if (!mr || (!mr->addr && mr->len))
		return -EINVAL;
	/* GPU memory goes through host staging buffers, copied by the gpu
	 * runtime: there must be one */
	if (mr->kind != KVB_MEM_HOST &&
	    (mr->kind != KVB_MEM_GPU || !kvb_gpu_backend()))
		return -EOPNOTSUPP;
	if (_kvb_tcp_mr_find(tt, mr->id))
		return -EEXIST;
	if (tt->nmr == tt->mr_cap) {
		unsigned cap = tt->mr_cap ? tt->mr_cap * 2 : 16;
		struct kvb_mr **n = realloc(tt->mrs, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		tt->mrs = n;
		tt->mr_cap = cap;
	}
	hi = tt->nmr;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (tt->mrs[mid]->id < mr->id)
			lo = mid + 1;
		else
			hi = mid;
	}
	memmove(&tt->mrs[lo + 1], &tt->mrs[lo],
		(tt->nmr - lo) * sizeof(tt->mrs[0]));
	tt->mrs[lo] = mr;
	tt->nmr++;
	return 0;
}

static void tcp_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct tcp_transport *tt = to_tcp(t);
	struct tcp_conn *c;
	struct kvb_ep *ep;
	unsigned i;

	if (!mr || _kvb_tcp_mr_find(tt, mr->id) != mr)
		return;
	for (i = 0; tt->mrs[i] != mr; i++)
		;
	memmove(&tt->mrs[i], &tt->mrs[i + 1],
		(tt->nmr - i - 1) * sizeof(tt->mrs[0]));
	tt->nmr--;
	/* from here no byte lands in, or leaves from, mr */
	for (c = tt->conns; c; c = c->next)
		_kvb_tcp_conn_drop_mr(c, mr);
	for (ep = tt->eps; ep; ep = ep->next)
		_kvb_tcp_ep_drop_mr(ep, mr);
}

/* ---- blobs and endpoints ---- */

static int tcp_local_info(struct kvb_transport *t, void *blob, size_t *len)
{
	struct tcp_transport *tt = to_tcp(t);
	struct kvb_tcp_blob b;

	if (!len)
		return -EINVAL;
	if (*len < KVB_TCP_BLOB_LEN || !blob) {
		*len = KVB_TCP_BLOB_LEN;
		return -ENOSPC;
	}
	memset(&b, 0, sizeof(b));
	b.family = (uint8_t) tt->family;
	b.port = tt->port;
	b.nonce = tt->nonce;
	memcpy(b.addr, tt->addr, 16);
	kvb_tcp_blob_encode(&b, blob);
	*len = KVB_TCP_BLOB_LEN;
	return 0;
}

static int tcp_connect(struct kvb_transport *t, const void *blob, size_t len,
		       struct kvb_ep **ep)
{
	struct kvb_tcp_blob b;
	struct sockaddr_storage sa;
	socklen_t salen;

	if (!ep || kvb_tcp_blob_decode(&b, blob, len))
		return -EPROTO;
	if (kvb_tcp_blob_unspec(&b))
		return -EDESTADDRREQ; /* see kvb_tcp_connect_host() */
	blob_sockaddr(&b, &sa, &salen);
	return _kvb_tcp_ep_group_new(to_tcp(t), &sa, salen, b.nonce, ep);
}

int kvb_tcp_connect_host(struct kvb_transport *t, const void *blob, size_t len,
			 const char *host, struct kvb_ep **ep)
{
	struct kvb_tcp_blob b;
	struct sockaddr_storage sa;
	socklen_t salen;

	if (!ep || kvb_tcp_blob_decode(&b, blob, len))
		return -EPROTO;
	if (!host || !*host || _kvb_tcp_sockaddr(host, b.port, &sa, &salen))
		return -EINVAL;
	return _kvb_tcp_ep_group_new(to_tcp(t), &sa, salen, b.nonce, ep);
}

static void tcp_disconnect(struct kvb_transport *t, struct kvb_ep *ep)
{
	struct tcp_transport *tt = to_tcp(t);

	if (!ep)
		return;
	_kvb_tcp_ep_group_destroy(ep);
	if (tt->cq_len)
		_kvb_tcp_timer_want(tt, 1);
}

int kvb_tcp_blob_make(const char *ip, uint16_t port, uint64_t nonce, void *blob,
		      size_t *len)
{
	struct sockaddr_storage sa;
	socklen_t salen;
	struct kvb_tcp_blob b;

	if (!len || !ip || !port || _kvb_tcp_sockaddr(ip, port, &sa, &salen))
		return -EINVAL;
	if (*len < KVB_TCP_BLOB_LEN || !blob) {
		*len = KVB_TCP_BLOB_LEN;
		return -ENOSPC;
	}
	memset(&b, 0, sizeof(b));
	b.port = port;
	b.nonce = nonce;
	if (sa.ss_family == AF_INET) {
		b.family = 4;
		memcpy(b.addr, &((struct sockaddr_in *) &sa)->sin_addr, 4);
	} else {
		b.family = 6;
		memcpy(b.addr, &((struct sockaddr_in6 *) &sa)->sin6_addr, 16);
	}
	kvb_tcp_blob_encode(&b, blob);
	*len = KVB_TCP_BLOB_LEN;
	return 0;
}

/* ---- progress ---- */

static int tcp_poll(struct kvb_transport *t, struct kvb_xcqe *out, unsigned max)
{
	struct tcp_transport *tt = to_tcp(t);
	struct epoll_event ev[TCP_EVENTS];
	uint64_t next = UINT64_MAX, now, x;
	struct kvb_ep *ep;
	unsigned k = 0;
	int n, i;

	tt->rx_budget = TCP_RX_BUDGET;
	n = epoll_wait(tt->epfd, ev, TCP_EVENTS, 0);
	if (n < 0 && errno != EINTR)
		return -errno;
	for (i = 0; i < n; i++) {
		struct tcp_tag *tag = ev[i].data.ptr;

		switch (tag->kind) {
		case TCP_K_LISTEN:
			_kvb_tcp_accept(tt);
			break;
		case TCP_K_TIMER:
			if (read(tt->tfd, &x, sizeof(x)) < 0 && errno != EAGAIN)
				break;
			tt->timer_at = 0;
			break;
		case TCP_K_EP:
			_kvb_tcp_ep_event(container_of(tag, struct kvb_ep, tag),
					  ev[i].events);
			break;
		case TCP_K_CONN:
			_kvb_tcp_conn_event(
				container_of(tag, struct tcp_conn, tag),
				ev[i].events);
			break;
		}
	}
	_kvb_tcp_conn_flush_all(tt);
	now = tcp_now();
	_kvb_tcp_conn_expire(tt, now, &next);
	if (tt->accept_resume) {
		if (now >= tt->accept_resume) {
			tt->accept_resume = 0;
			_kvb_tcp_epoll_set(tt, tt->lfd, &tt->ltag, &tt->lev,
					   EPOLLIN);
		} else if (tt->accept_resume < next) {
			next = tt->accept_resume;
		}
	}
	if (tt->rl_pending) {
		_kvb_tcp_rlog_flush(tt, now);
		if (tt->rl_pending && now + 1000000000ull < next)
			next = now + 1000000000ull;
	}
	for (ep = tt->eps; ep; ep = ep->next)
		_kvb_tcp_ep_tick(ep, now, &next);

	while (k < max && tt->cq_len) {
		out[k++] = tt->cq[tt->cq_head];
		tt->cq_head = (tt->cq_head + 1) % tt->cq_cap;
		tt->cq_len--;
	}
	t->stats.cqes += k;
	if (tt->cq_len)
		next = 1; /* more to hand out: keep wait_fd readable */
	if (next != UINT64_MAX)
		_kvb_tcp_timer_want(tt, next);
	return (int) k;
}

static int tcp_wait_fd(struct kvb_transport *t)
{
	return to_tcp(t)->epfd;
}

int kvb_tcp_port(struct kvb_transport *t)
{
	if (!t || t->ops != &kvb_tcp_ops)
		return -EINVAL;
	return to_tcp(t)->port;
}

void kvb_tcp_get_stats(struct kvb_transport *t, struct kvb_tcp_stats *out)
{
	*out = to_tcp(t)->st;
}

void kvb_tcp_set_write_gate(struct kvb_transport *t, kvb_tcp_gate_fn fn,
			    void *arg)
{
	struct tcp_transport *tt = to_tcp(t);

	tt->gate = fn;
	tt->gate_arg = arg;
}

void kvb_tcp_set_read_gate(struct kvb_transport *t, kvb_tcp_gate_fn fn,
			   void *arg)
{
	struct tcp_transport *tt = to_tcp(t);

	tt->rgate = fn;
	tt->rgate_arg = arg;
}

void kvb_tcp_gate_recheck(struct kvb_transport *t)
{
	struct tcp_transport *tt = to_tcp(t);

	for (struct tcp_conn *c = tt->conns; c; c = c->next)
		_kvb_tcp_conn_gate_recheck(c);
}

uint64_t kvb_tcp_id(struct kvb_transport *t)
{
	return to_tcp(t)->nonce;
}

int kvb_tcp_blob_id(const void *blob, size_t len, uint64_t *id)
{
	struct kvb_tcp_blob b;

	if (kvb_tcp_blob_decode(&b, blob, len))
		return -EPROTO;
	*id = b.nonce;
	return 0;
}

int kvb_tcp_set_trusted(struct kvb_transport *t, const char *const *hosts,
			unsigned n)
{
	struct tcp_transport *tt = to_tcp(t);
	struct tcp_trusted tr[TCP_TRUSTED_MAX];
	unsigned i;

	if (n > TCP_TRUSTED_MAX)
		return -ENOSPC;
	memset(tr, 0, sizeof(tr));
	for (i = 0; i < n; i++) {
		if (inet_pton(AF_INET, hosts[i], tr[i].addr) == 1)
			tr[i].family = AF_INET;
		else if (inet_pton(AF_INET6, hosts[i], tr[i].addr) == 1)
			tr[i].family = AF_INET6;
		else
			return -EINVAL;
		/* an IPv4-mapped entry matches the IPv4 peer it names */
		if (tr[i].family == AF_INET6 &&
		    IN6_IS_ADDR_V4MAPPED((struct in6_addr *) tr[i].addr)) {
			memmove(tr[i].addr, tr[i].addr + 12, 4);
			memset(tr[i].addr + 4, 0, 12);
			tr[i].family = AF_INET;
		}
	}
	memcpy(tt->trusted, tr, sizeof(tr));
	tt->ntrusted = n;
	return 0;
}

void kvb_tcp_set_limits(struct kvb_transport *t, unsigned max_conns,
			unsigned max_per_host, unsigned auth_ms)
{
	struct tcp_transport *tt = to_tcp(t);
	struct rlimit rl;

	tt->max_conns = max_conns ? max_conns : KVB_TCP_MAX_CONNS_DEF;
	if (tt->max_conns > TCP_MAX_CONNS)
		tt->max_conns = TCP_MAX_CONNS;
	tt->max_per_host =
		max_per_host ? max_per_host : KVB_TCP_MAX_CONNS_PER_HOST_DEF;
	tt->auth_ns = (uint64_t) (auth_ms ? auth_ms : KVB_TCP_AUTH_MS_DEF) *
		      1000000ull;
	/* whatever the caps say, an accepted descriptor this close to the
	 * process's limit is closed at once: the rest of the process (libzmq
	 * among it, which aborts on EMFILE in places) keeps descriptors */
	tt->fd_cap = INT_MAX;
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < (rlim_t) INT_MAX)
		tt->fd_cap = (int) rl.rlim_cur > 2 * TCP_FD_RESERVE
				     ? (int) rl.rlim_cur - TCP_FD_RESERVE
				     : (int) rl.rlim_cur / 2;
}

void kvb_tcp_set_log(struct kvb_transport *t,
		     void (*fn)(void *arg, const char *line), void *arg)
{
	struct tcp_transport *tt = to_tcp(t);

	tt->log_fn = fn;
	tt->log_arg = arg;
}

const struct kvb_transport_auth_ops kvb_tcp_auth_ops = {
	.id = kvb_tcp_id,
	.blob_id = kvb_tcp_blob_id,
	.peer_allow = kvb_tcp_peer_allow,
	.peer_forget = kvb_tcp_peer_forget,
	.ep_set_key = kvb_tcp_ep_set_key,
	.set_trusted = kvb_tcp_set_trusted,
	.set_limits = kvb_tcp_set_limits,
	.set_log = kvb_tcp_set_log,
};

const struct kvb_transport_ops kvb_tcp_ops = {
	.name = "tcp",
	.open = tcp_open,
	.close = tcp_close,
	.reg_mr = tcp_reg_mr,
	.dereg_mr = tcp_dereg_mr,
	.local_info = tcp_local_info,
	.connect = tcp_connect,
	.disconnect = tcp_disconnect,
	.post = _kvb_tcp_post,
	.poll = tcp_poll,
	.wait_fd = tcp_wait_fd,
	.connect_host = kvb_tcp_connect_host,
	.port = kvb_tcp_port,
	.stats_format = kvb_tcp_stats_format,
	.auth = &kvb_tcp_auth_ops,
	.set_write_gate = kvb_tcp_set_write_gate,
	.gate_recheck = kvb_tcp_gate_recheck,
	.set_read_gate = kvb_tcp_set_read_gate,
};

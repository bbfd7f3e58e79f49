/* SPDX-License-Identifier: MIT */
/*
 * The metrics endpoint's HTTP/1.x server: non-blocking sockets in the
 * broker's epoll set, one request per connection (the answer says
 * "Connection: close"), at most KVB_MX_MAX_CONNS connections (and
 * KVB_MX_PER_SOURCE of one address; a new connection takes the place of the
 * oldest one still sending its request), requests of at most KVB_MX_REQ_MAX
 * bytes, KVB_MX_TIMEOUT_MS to send one and as long
 * to read the answer. GET /metrics only: other methods 405, other paths
 * 404; each refusal counted (kvbroker_metrics_refused_total) and logged,
 * rate-limited. A scrape is rendered in one go on the broker's thread,
 * from the counters as they are (docs/metrics.md).
 */
#include "metrics_priv.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define ACCEPTS_PER_EVENT 64

const char *const kvb_mx_refusal_names[KVB_MX_REF_MAX] = {
	[KVB_MX_REF_CONNS] = "connections",
	[KVB_MX_REF_TOO_LARGE] = "too_large",
	[KVB_MX_REF_TIMEOUT] = "timeout",
	[KVB_MX_REF_METHOD] = "method",
	[KVB_MX_REF_NOT_FOUND] = "not_found",
	[KVB_MX_REF_BAD] = "bad_request",
	[KVB_MX_REF_EVICTED] = "evicted",
};

static void refuse_count(struct kvb_metrics *mx, enum kvb_mx_refusal r)
{
	mx->refused[r]++;
	kvb_log_rl_keyed(kvb_mx_refusal_names[r], KVB_LOG_WARN,
			 "metrics endpoint: request refused (%s)",
			 kvb_mx_refusal_names[r]);
}

/* "ADDR:PORT" or "[ADDR6]:PORT", numeric, port 0 = any free one. */
static int parse_listen(const char *s, struct addrinfo **ai)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV |
					     AI_PASSIVE};
	char host[64];
	const char *colon = strrchr(s, ':');
	size_t hl;

	if (!colon || !colon[1])
		return -EINVAL;
	hl = (size_t) (colon - s);
	if (s[0] == '[') {
		if (hl < 2 || s[hl - 1] != ']')
			return -EINVAL;
		s++;
		hl -= 2;
	}
	if (!hl || hl >= sizeof(host) || strlen(colon + 1) > 5 ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
	    atoi(colon + 1) > 65535)
		return -EINVAL;
	memcpy(host, s, hl);
	host[hl] = '\0';
	return getaddrinfo(host, colon + 1, &hints, ai) ? -EINVAL : 0;
}

int kvb_metrics_check_listen(const char *spec)
{
	struct addrinfo *ai = NULL;
	int rc = parse_listen(spec, &ai);

	if (!rc)
		freeaddrinfo(ai);
	return rc;
}

static int ep_ctl(struct kvb_broker *b, int op, int fd, uint32_t events,
		  uint32_t idx)
{
	struct epoll_event ev = {.events = events,
				 .data.u64 = KVB_EP_METRICS_TAG | idx};

	return epoll_ctl(b->epfd, op, fd, &ev) < 0 ? -errno : 0;
}

static int open_listener(struct kvb_metrics *mx, const char *spec)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct addrinfo *ai = NULL;
	char h[64], p[16];
	int fd, one = 1, rc;

	rc = parse_listen(spec, &ai);
	if (rc) {
		log_err("--metrics-listen %s: not ADDR:PORT with a numeric "
			"address (127.0.0.1:19476, [::1]:19476)",
			spec);
		return rc;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	if (fd < 0) {
		rc = -errno;
		goto err_ai;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
	    listen(fd, (int) KVB_MX_MAX_CONNS) < 0 ||
	    getsockname(fd, (struct sockaddr *) &ss, &sl) < 0) {
		rc = -errno;
		log_err("--metrics-listen %s: %s", spec, strerror(errno));
		goto err_fd;
	}
	freeaddrinfo(ai);
	if (getnameinfo((struct sockaddr *) &ss, sl, h, sizeof(h), p, sizeof(p),
			NI_NUMERICHOST | NI_NUMERICSERV))
		snprintf(mx->addr, sizeof(mx->addr), "%s", spec);
	else
		snprintf(mx->addr, sizeof(mx->addr),
			 ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
	mx->lfd = fd;
	return 0;

err_fd:
	close(fd);
err_ai:
	freeaddrinfo(ai);
	return rc;
}

int kvb_metrics_init(struct kvb_broker *b)
{
	struct kvb_metrics *mx;
	int rc;

	if (!b->opt.metrics_listen[0])
		return 0;
	mx = calloc(1, sizeof(*mx));
	if (!mx)
		return -ENOMEM;
	mx->wk = calloc(b->opt.max_workers, sizeof(*mx->wk));
	if (!mx->wk) {
		rc = -ENOMEM;
		goto err_mx;
	}
	for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++)
		mx->conns[i].fd = -1;
	rc = open_listener(mx, b->opt.metrics_listen);
	if (rc)
		goto err_wk;
	rc = ep_ctl(b, EPOLL_CTL_ADD, mx->lfd, EPOLLIN, KVB_MX_LISTEN_IDX);
	if (rc)
		goto err_fd;
	b->mx = mx;
	log_info("metrics on http://%s/metrics", mx->addr);
	return 0;

err_fd:
	close(mx->lfd);
err_wk:
	free(mx->wk);
err_mx:
	free(mx);
	return rc;
}

static void conn_close(struct kvb_broker *b, struct kvb_mx_conn *c)
{
	epoll_ctl(b->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c->body);
	c->body = NULL;
	c->fd = -1;
	b->mx->nconns--;
}

void kvb_metrics_fini(struct kvb_broker *b)
{
	struct kvb_metrics *mx = b->mx;

	if (!mx)
		return;
	for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++)
		if (mx->conns[i].fd >= 0)
			conn_close(b, &mx->conns[i]);
	epoll_ctl(b->epfd, EPOLL_CTL_DEL, mx->lfd, NULL);
	close(mx->lfd);
	free(mx->wk);
	free(mx);
	b->mx = NULL;
}

/* The same host (address family and address; the port does not count). */
static int same_host(const struct sockaddr_storage *a,
		     const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return 0;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *) a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *) b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *) a)->sin6_addr,
			       &((const struct sockaddr_in6 *) b)->sin6_addr,
			       sizeof(struct in6_addr));
	return 1;
}

/* Connections from src's host now. */
static unsigned host_conns(const struct kvb_metrics *mx,
			   const struct sockaddr_storage *src)
{
	unsigned n = 0;

	for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++)
		n += mx->conns[i].fd >= 0 && same_host(&mx->conns[i].src, src);
	return n;
}

/*
 * A slot for a new connection from src: a free one, unless src's host holds
 * KVB_MX_PER_SOURCE; else the slot of the oldest connection still sending
 * its request, of src's host when it is at its limit, else of the host that
 * holds the most connections (closed, counted `evicted`). So connections
 * that send slowly, or not at all, cannot keep a scraper out: whoever sends
 * its request at once (Prometheus does) is answered, and one host cannot
 * evict another's connections while it holds fewer than they do. Returns
 * KVB_MX_MAX_CONNS when every candidate is writing an answer.
 */
static unsigned take_slot(struct kvb_broker *b,
			  const struct sockaddr_storage *src)
{
	struct kvb_metrics *mx = b->mx;
	unsigned mine = host_conns(mx, src), victim = KVB_MX_MAX_CONNS,
		 most = 0;

	if (mine < KVB_MX_PER_SOURCE)
		for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++)
			if (mx->conns[i].fd < 0)
				return i;
	for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++) {
		struct kvb_mx_conn *c = &mx->conns[i];
		unsigned n;

		if (c->fd < 0 || c->writing)
			continue;
		if (mine >= KVB_MX_PER_SOURCE) {
			if (!same_host(&c->src, src))
				continue;
			n = mine;
		} else {
			n = host_conns(mx, &c->src);
		}
		if (victim == KVB_MX_MAX_CONNS || n > most ||
		    (n == most && c->accepted < mx->conns[victim].accepted)) {
			victim = i;
			most = n;
		}
	}
	if (victim < KVB_MX_MAX_CONNS) {
		refuse_count(mx, KVB_MX_REF_EVICTED);
		conn_close(b, &mx->conns[victim]);
	}
	return victim;
}

static void accept_all(struct kvb_broker *b)
{
	struct kvb_metrics *mx = b->mx;

	for (int k = 0; k < ACCEPTS_PER_EVENT; k++) {
		struct sockaddr_storage src;
		socklen_t sl = sizeof(src);
		int fd = accept4(mx->lfd, (struct sockaddr *) &src, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct kvb_mx_conn *c;
		unsigned i;

		if (fd < 0)
			return; /* EAGAIN, or an error of that one client */
		i = take_slot(b, &src);
		if (i == KVB_MX_MAX_CONNS ||
		    ep_ctl(b, EPOLL_CTL_ADD, fd, EPOLLIN, i)) {
			close(fd);
			refuse_count(mx, KVB_MX_REF_CONNS);
			continue;
		}
		c = &mx->conns[i];
		c->fd = fd;
		c->src = src;
		c->accepted = kvb_now_ns();
		c->writing = 0;
		c->rlen = 0;
		c->req[0] = '\0';
		c->hlen = c->blen = c->sent = 0;
		c->body = NULL;
		c->deadline =
			kvb_now_ns() + (int64_t) KVB_MX_TIMEOUT_MS * 1000000;
		mx->nconns++;
	}
}

/* Send what is left of the answer; 1 when all went (or the client did). */
static int conn_flush(struct kvb_mx_conn *c)
{
	while (c->sent < c->hlen + c->blen) {
		struct iovec iov[2];
		int n = 0;
		ssize_t w;

		if (c->sent < c->hlen) {
			iov[n].iov_base = c->head + c->sent;
			iov[n++].iov_len = c->hlen - c->sent;
		}
		if (c->blen) {
			size_t off = c->sent > c->hlen ? c->sent - c->hlen : 0;

			iov[n].iov_base = c->body + off;
			iov[n++].iov_len = c->blen - off;
		}
		w = writev(c->fd, iov, n);
		if (w < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : 1;
		c->sent += (size_t) w;
	}
	return 1;
}

/* Answer with the status line, headers and c->body (or, without one, the
 * short text `text`, sent from c->head); the connection closes after. */
static void respond(struct kvb_broker *b, struct kvb_mx_conn *c, unsigned idx,
		    const char *status, const char *ctype, const char *extra,
		    const char *text)
{
	size_t tlen = text ? strlen(text) : 0;
	int n = snprintf(c->head, sizeof(c->head),
			 "HTTP/1.1 %s\r\nContent-Type: %s\r\n"
			 "Content-Length: %zu\r\n%sConnection: close\r\n\r\n%s",
			 status, ctype, text ? tlen : c->blen, extra,
			 text ? text : "");

	c->hlen = n > 0 && (size_t) n < sizeof(c->head) ? (size_t) n : 0;
	c->writing = 1;
	c->deadline = kvb_now_ns() + (int64_t) KVB_MX_TIMEOUT_MS * 1000000;
	if (conn_flush(c)) {
		shutdown(c->fd, SHUT_WR);
		conn_close(b, c);
		return;
	}
	ep_ctl(b, EPOLL_CTL_MOD, c->fd, EPOLLOUT, idx);
}

/* Refuse a request: counted, logged (rate-limited), a short answer. */
static void refuse(struct kvb_broker *b, struct kvb_mx_conn *c, unsigned idx,
		   enum kvb_mx_refusal r, const char *status, const char *extra)
{
	char text[64];

	refuse_count(b->mx, r);
	snprintf(text, sizeof(text), "%s\n", status);
	free(c->body);
	c->body = NULL;
	c->blen = 0;
	respond(b, c, idx, status, "text/plain; charset=utf-8", extra, text);
}

/* Does the Accept header ask for OpenMetrics? */
static int wants_openmetrics(const char *hdrs)
{
	for (const char *l = strchr(hdrs, '\n'); l; l = strchr(l, '\n')) {
		const char *e;

		l++;
		if (strncasecmp(l, "accept:", 7))
			continue;
		e = strchr(l, '\n');
		for (const char *p = l + 7; p && (!e || p < e);
		     p = strchr(p + 1, 'a'))
			if (!strncasecmp(p, "application/openmetrics-text", 28))
				return 1;
	}
	return 0;
}

static void handle_request(struct kvb_broker *b, struct kvb_mx_conn *c,
			   unsigned idx)
{
	char *sp1 = memchr(c->req, ' ', c->rlen), *sp2, *eol;
	const char *path;
	size_t plen;
	int64_t t0;
	int om, rc;

	eol = strpbrk(c->req, "\r\n"); /* the headers are complete */
	if (sp1 && sp1 > eol)
		sp1 = NULL;
	sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t) (eol - sp1 - 1)) : NULL;
	if (!sp1 || !sp2 || (size_t) (eol - sp2 - 1) != 8 ||
	    strncmp(sp2 + 1, "HTTP/1.", 7)) {
		refuse(b, c, idx, KVB_MX_REF_BAD, "400 Bad Request", "");
		return;
	}
	if (sp1 - c->req != 3 || memcmp(c->req, "GET", 3)) {
		refuse(b, c, idx, KVB_MX_REF_METHOD, "405 Method Not Allowed",
		       "Allow: GET\r\n");
		return;
	}
	path = sp1 + 1;
	plen = strcspn(path, "? ");
	if (plen != 8 || memcmp(path, "/metrics", 8)) {
		refuse(b, c, idx, KVB_MX_REF_NOT_FOUND, "404 Not Found", "");
		return;
	}
	om = wants_openmetrics(c->req);
	t0 = kvb_now_ns();
	rc = kvb_metrics_render(b, om, &c->body, &c->blen);
	b->mx->render_ns += (uint64_t) (kvb_now_ns() - t0);
	if (rc) {
		c->body = NULL;
		c->blen = 0;
		respond(b, c, idx, "503 Service Unavailable",
			"text/plain; charset=utf-8", "", "out of memory\n");
		return;
	}
	b->mx->scrapes[om ? 1 : 0]++;
	respond(b, c, idx, "200 OK",
		om ? "application/openmetrics-text; version=1.0.0; "
		     "charset=utf-8"
		   : "text/plain; version=0.0.4; charset=utf-8",
		"", NULL);
}

static void conn_read(struct kvb_broker *b, struct kvb_mx_conn *c, unsigned idx)
{
	char *end, *lf, *nul;
	ssize_t n;

	n = recv(c->fd, c->req + c->rlen, KVB_MX_REQ_MAX - 1 - c->rlen, 0);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) { /* gone before it asked */
		conn_close(b, c);
		return;
	}
	c->rlen += (uint32_t) n;
	c->req[c->rlen] = '\0';
	end = memmem(c->req, c->rlen, "\r\n\r\n", 4);
	lf = memmem(c->req, c->rlen, "\n\n", 2);
	if (lf && (!end || lf < end))
		end = lf;
	/* a NUL byte before the blank line is no HTTP request (and the
	 * request would never be seen complete): 400 at once */
	nul = memchr(c->req, '\0', c->rlen);
	if (nul && (!end || nul < end)) {
		ep_ctl(b, EPOLL_CTL_MOD, c->fd, 0, idx); /* read no more */
		refuse(b, c, idx, KVB_MX_REF_BAD, "400 Bad Request", "");
		return;
	}
	if (end) {
		ep_ctl(b, EPOLL_CTL_MOD, c->fd, 0, idx); /* read no more */
		handle_request(b, c, idx);
		return;
	}
	if (c->rlen >= KVB_MX_REQ_MAX - 1)
		refuse(b, c, idx, KVB_MX_REF_TOO_LARGE,
		       "431 Request Header Fields Too Large", "");
}

void kvb_metrics_event(struct kvb_broker *b, uint64_t tag, uint32_t events)
{
	uint32_t idx = (uint32_t) (tag & 0xffffffffu);
	struct kvb_mx_conn *c;

	if (!b->mx)
		return;
	if (idx == KVB_MX_LISTEN_IDX) {
		accept_all(b);
		return;
	}
	if (idx >= KVB_MX_MAX_CONNS || b->mx->conns[idx].fd < 0)
		return;
	c = &b->mx->conns[idx];
	if (c->writing) {
		if ((events & (EPOLLERR | EPOLLHUP)) || conn_flush(c)) {
			shutdown(c->fd, SHUT_WR);
			conn_close(b, c);
		}
		return;
	}
	conn_read(b, c, idx);
}

void kvb_metrics_timers(struct kvb_broker *b, int64_t now)
{
	struct kvb_metrics *mx = b->mx;

	if (!mx || !mx->nconns)
		return;
	for (unsigned i = 0; i < KVB_MX_MAX_CONNS; i++)
		if (mx->conns[i].fd >= 0 && now >= mx->conns[i].deadline) {
			refuse_count(mx, KVB_MX_REF_TIMEOUT);
			conn_close(b, &mx->conns[i]);
		}
}

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "zmq/notify.h"

#define NOTIFY_EP_MAX	     300 /* "tcp://[" + host + "]:" + port */
#define NOTIFY_HOST_MAX	     255
#define NOTIFY_LOG_BURST     20 /* reject log lines per second */
#define NOTIFY_DEALER_RCVHWM 16 /* nobody should send to us here */
#define NOTIFY_MAX_PARTS     3	/* identity, [empty delimiter,] payload */

struct notify_peer {
	char ep[NOTIFY_EP_MAX];
	void *sock;
	uint64_t last_use;
};

struct kvb_notify {
	void *ctx;
	bool own_ctx;
	char host[NOTIFY_HOST_MAX + 1];
	int nsocks;
	void *socks[KVB_NOTIFY_MAX_SOCKS];
	uint16_t ports[KVB_NOTIFY_MAX_SOCKS];
	int fds[KVB_NOTIFY_MAX_SOCKS];
	int alias_port; /* 0 when none or equal to the primary */

	kvb_notify_msg_fn on_msg;
	bool (*sender_ok)(void *arg, const char *addr);
	kvb_notify_log_fn on_log;
	void *arg;

	int sndhwm;
	int linger_ms;
	uint32_t max_peers;
	uint32_t npeers;
	struct notify_peer *peers;
	uint64_t tick;

	const char *why; /* kvb_notify_reject_why() during on_msg */
	uint64_t log_window_sec;
	uint32_t log_window_lines;
	struct kvb_notify_stats st;
};

__attribute__((format(printf, 3, 4))) static void
nlog(struct kvb_notify *n, int level, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (!n->on_log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	n->on_log(n->arg, level, line);
}

/* A flood of bad messages must not become a flood of log lines. */
static bool reject_log_ok(struct kvb_notify *n)
{
	struct timespec ts;
	uint64_t sec;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	sec = (uint64_t) ts.tv_sec;
	if (sec != n->log_window_sec) {
		if (n->log_window_lines > NOTIFY_LOG_BURST)
			nlog(n, KVB_NOTIFY_LOG_WARN,
			     "notify: %u rejected-message logs suppressed",
			     n->log_window_lines - NOTIFY_LOG_BURST);
		n->log_window_sec = sec;
		n->log_window_lines = 0;
	}
	if (++n->log_window_lines <= NOTIFY_LOG_BURST)
		return true;
	n->st.logs_suppressed++;
	return false;
}

static void hexdump(char *out, size_t outlen, const uint8_t *p, size_t len)
{
	size_t i, o = 0;

	out[0] = '\0';
	for (i = 0; i < len && i < 16 && o + 3 < outlen; i++)
		o += (size_t) snprintf(out + o, outlen - o, "%02x", p[i]);
	if (len > 16 && o + 4 < outlen)
		snprintf(out + o, outlen - o, "...");
}

static void reject(struct kvb_notify *n, uint16_t port, const void *buf,
		   size_t len, const char *why)
{
	char hex[40];

	n->st.messages_rejected++;
	if (!reject_log_ok(n))
		return;
	hexdump(hex, sizeof(hex), buf, len);
	nlog(n, KVB_NOTIFY_LOG_WARN,
	     "notify port %u: dropped %zu-byte message [%s]: %s", port, len,
	     hex, why);
}

static bool host_ok(const char *host)
{
	size_t i, len;

	if (!host)
		return false;
	len = strnlen(host, NOTIFY_HOST_MAX + 1);
	if (len == 0 || len > NOTIFY_HOST_MAX)
		return false;
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char) host[i];

		if (c <= ' ' || c >= 0x7f || c == '/' || c == '[' || c == ']')
			return false;
	}
	return true;
}

static bool host_is_v6(const char *host)
{
	return strchr(host, ':') != NULL;
}

static void make_ep(char *ep, const char *host, unsigned int port)
{
	if (host_is_v6(host))
		snprintf(ep, NOTIFY_EP_MAX, "tcp://[%s]:%u", host, port);
	else
		snprintf(ep, NOTIFY_EP_MAX, "tcp://%s:%u", host, port);
}

static int zerr(void)
{
	return errno ? -errno : -EIO;
}

static int set_int(void *sock, int opt, int v)
{
	return zmq_setsockopt(sock, opt, &v, sizeof(v)) ? zerr() : 0;
}

static int bind_router(struct kvb_notify *n, int port)
{
	char ep[NOTIFY_EP_MAX];
	int64_t maxsz = KVB_ZMSG_BYTES_MAX;
	size_t fdlen = sizeof(int);
	void *s;
	int ret, fd;

	s = zmq_socket(n->ctx, ZMQ_ROUTER);
	if (!s)
		return zerr();
	ret = set_int(s, ZMQ_LINGER, 0);
	if (!ret && host_is_v6(n->host))
		ret = set_int(s, ZMQ_IPV6, 1);
	if (!ret && zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxsz, sizeof(maxsz)))
		ret = zerr();
	/* a connection that never finishes the ZMTP greeting is dropped
	 * after 2 s instead of the default 30 (strangers hold less) */
	if (!ret)
		ret = set_int(s, ZMQ_HANDSHAKE_IVL, 2000);
	if (ret)
		goto err_close;
	make_ep(ep, n->host, (unsigned int) port);
	if (zmq_bind(s, ep)) {
		ret = zerr();
		goto err_close;
	}
	if (zmq_getsockopt(s, ZMQ_FD, &fd, &fdlen)) {
		ret = zerr();
		goto err_close;
	}
	n->socks[n->nsocks] = s;
	n->ports[n->nsocks] = (uint16_t) port;
	n->fds[n->nsocks] = fd;
	n->nsocks++;
	return 0;

err_close:
	zmq_close(s);
	return ret;
}

int kvb_notify_bind_alias(struct kvb_notify *n)
{
	int ret, i;

	if (!n->alias_port)
		return 0;
	for (i = 0; i < n->nsocks; i++)
		if (n->ports[i] == n->alias_port)
			return 0;
	ret = bind_router(n, n->alias_port);
	if (ret == -EADDRINUSE)
		nlog(n, KVB_NOTIFY_LOG_WARN,
		     "notify: alias port %d (other offset formula) is taken; "
		     "listening on %u only",
		     n->alias_port, n->ports[0]);
	else if (ret)
		nlog(n, KVB_NOTIFY_LOG_WARN,
		     "notify: cannot bind alias port %d: %s", n->alias_port,
		     strerror(-ret));
	return ret;
}

int kvb_notify_alias_fd(const struct kvb_notify *n)
{
	for (int i = 1; i < n->nsocks; i++)
		if (n->ports[i] == n->alias_port)
			return n->fds[i];
	return -1;
}

void kvb_notify_drop_alias(struct kvb_notify *n)
{
	for (int i = 1; i < n->nsocks; i++) {
		if (n->ports[i] != n->alias_port)
			continue;
		zmq_close(n->socks[i]);
		for (int k = i + 1; k < n->nsocks; k++) {
			n->socks[k - 1] = n->socks[k];
			n->ports[k - 1] = n->ports[k];
			n->fds[k - 1] = n->fds[k];
		}
		n->nsocks--;
		break;
	}
	n->alias_port = 0;
}

int kvb_notify_open(struct kvb_notify **out, const struct kvb_notify_conf *conf)
{
	enum kvb_port_formula other;
	struct kvb_notify *n;
	uint32_t base;
	int p0, p1, ret;

	if (!out || !conf || !conf->on_msg || !host_ok(conf->host_ip) ||
	    (conf->formula != KVB_PORT_DP_TIMES_TP &&
	     conf->formula != KVB_PORT_DP_PLUS_TP) ||
	    conf->notify_port > 65535)
		return -EINVAL;
	base = conf->notify_port ? conf->notify_port : KVB_NOTIFY_PORT_DEFAULT;
	p0 = kvb_port_of(base, conf->dp_rank, conf->tp_rank, conf->tp_size,
			 conf->formula);
	if (p0 < 0)
		return p0;
	other = conf->formula == KVB_PORT_DP_TIMES_TP ? KVB_PORT_DP_PLUS_TP
						      : KVB_PORT_DP_TIMES_TP;
	p1 = kvb_port_of(base, conf->dp_rank, conf->tp_rank, conf->tp_size,
			 other);

	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	strcpy(n->host, conf->host_ip); /* length checked by host_ok() */
	n->on_msg = conf->on_msg;
	n->sender_ok = conf->sender_ok;
	n->on_log = conf->on_log;
	n->arg = conf->arg;
	n->sndhwm = conf->sndhwm > 0 ? conf->sndhwm : 1000;
	n->linger_ms = conf->linger_ms > 0   ? conf->linger_ms
		       : conf->linger_ms < 0 ? 0
					     : 100;
	n->max_peers = conf->max_peers ? conf->max_peers : 256;
	n->alias_port = (p1 > 0 && p1 != p0) ? p1 : 0;
	n->peers = calloc(n->max_peers, sizeof(*n->peers));
	if (!n->peers) {
		ret = -ENOMEM;
		goto err_free;
	}
	if (conf->zmq_ctx) {
		n->ctx = conf->zmq_ctx;
	} else {
		n->ctx = zmq_ctx_new();
		if (!n->ctx) {
			ret = zerr();
			goto err_peers;
		}
		n->own_ctx = true;
	}
	ret = bind_router(n, p0);
	if (ret)
		goto err_ctx;
	if (p1 == -ERANGE)
		nlog(n, KVB_NOTIFY_LOG_WARN,
		     "notify: alias port past 65535, listening on %d only", p0);
	/* A taken alias is logged inside and is not fatal. */
	if (!conf->defer_alias)
		kvb_notify_bind_alias(n);
	*out = n;
	return 0;

err_ctx:
	if (n->own_ctx)
		zmq_ctx_term(n->ctx);
err_peers:
	free(n->peers);
err_free:
	free(n);
	return ret;
}

void kvb_notify_close(struct kvb_notify *n)
{
	uint32_t i;
	int k;

	if (!n)
		return;
	for (k = 0; k < n->nsocks; k++)
		zmq_close(n->socks[k]);
	for (i = 0; i < n->npeers; i++)
		zmq_close(n->peers[i].sock);
	if (n->own_ctx)
		zmq_ctx_term(n->ctx);
	free(n->peers);
	free(n);
}

int kvb_notify_fds(struct kvb_notify *n, int *fds, int max)
{
	if (max < n->nsocks)
		return -ENOSPC;
	memcpy(fds, n->fds, sizeof(int) * (size_t) n->nsocks);
	return n->nsocks;
}

int kvb_notify_ports(struct kvb_notify *n, uint16_t *ports, int max)
{
	if (max < n->nsocks)
		return -ENOSPC;
	memcpy(ports, n->ports, sizeof(uint16_t) * (size_t) n->nsocks);
	return n->nsocks;
}

static void dispatch(struct kvb_notify *n, uint16_t port, const void *buf,
		     size_t len)
{
	const char *why = "malformed";
	struct kvb_zmsg m;
	int ret;

	ret = kvb_zmsg_decode(&m, buf, len, &why);
	if (ret) {
		reject(n, port, buf, len, why);
		return;
	}
	n->why = NULL;
	ret = n->on_msg(n->arg, &m, port);
	if (ret < 0) {
		n->st.messages_rejected++;
		if (reject_log_ok(n))
			nlog(n, KVB_NOTIFY_LOG_WARN,
			     "notify port %u: %s for '%s' refused: %s%s%s%s",
			     port, kvb_zmsg_type_name(m.type), m.transfer_id,
			     n->why ? n->why : "", n->why ? " (" : "",
			     strerror(-ret), n->why ? ")" : "");
	} else {
		n->st.messages_accepted++;
	}
	kvb_zmsg_fini(&m);
}

/* One multipart message off socket k: 1 handled, 0 none pending, -errno. */
static int recv_one(struct kvb_notify *n, int k)
{
	zmq_msg_t parts[NOTIFY_MAX_PARTS], extra;
	int nparts = 0, total = 0, ret = 1, i;
	zmq_msg_t *payload = NULL;
	int more;

	for (;;) {
		zmq_msg_t *m =
			nparts < NOTIFY_MAX_PARTS ? &parts[nparts] : &extra;

		zmq_msg_init(m);
		if (zmq_msg_recv(m, n->socks[k], ZMQ_DONTWAIT) < 0) {
			ret = zerr();
			zmq_msg_close(m);
			/* Nothing read yet: nothing pending. */
			if (total == 0 && (ret == -EAGAIN || ret == -EINTR))
				ret = 0;
			goto out;
		}
		total++;
		more = zmq_msg_more(m);
		if (m == &extra)
			zmq_msg_close(m);
		else
			nparts++;
		if (!more)
			break;
	}

	n->st.messages_received++;
	if (total == 2)
		payload = &parts[1];
	else if (total == 3 && zmq_msg_size(&parts[1]) == 0)
		payload = &parts[2];
	if (payload && n->sender_ok) {
		const char *addr = zmq_msg_gets(payload, "Peer-Address");

		if (!addr || !n->sender_ok(n->arg, addr)) {
			n->st.messages_rejected++;
			if (reject_log_ok(n))
				nlog(n, KVB_NOTIFY_LOG_WARN,
				     "notify port %u: message from %s refused: "
				     "not a trusted host",
				     n->ports[k], addr ? addr : "(unknown)");
			goto out;
		}
	}
	if (payload) {
		dispatch(n, n->ports[k], zmq_msg_data(payload),
			 zmq_msg_size(payload));
	} else {
		n->st.messages_rejected++;
		if (reject_log_ok(n))
			nlog(n, KVB_NOTIFY_LOG_WARN,
			     "notify port %u: dropped message of %d frames",
			     n->ports[k], total);
	}
out:
	for (i = 0; i < nparts; i++)
		zmq_msg_close(&parts[i]);
	return ret;
}

int kvb_notify_recv(struct kvb_notify *n, unsigned int budget)
{
	unsigned int done = 0;
	bool progress = true;
	int k, ret;

	while (done < budget && progress) {
		progress = false;
		for (k = 0; k < n->nsocks && done < budget; k++) {
			ret = recv_one(n, k);
			if (ret < 0)
				return ret;
			if (ret > 0) {
				done++;
				progress = true;
			}
		}
	}
	return (int) done;
}

static void peer_drop(struct kvb_notify *n, uint32_t i)
{
	zmq_close(n->peers[i].sock);
	n->peers[i] = n->peers[--n->npeers];
	n->st.peers = n->npeers;
}

static int peer_get(struct kvb_notify *n, const char *host, const char *ep,
		    void **sockp)
{
	struct notify_peer *p;
	uint32_t i, lru = 0;
	void *s;
	int ret;

	for (i = 0; i < n->npeers; i++) {
		if (!strcmp(n->peers[i].ep, ep)) {
			n->peers[i].last_use = ++n->tick;
			*sockp = n->peers[i].sock;
			return 0;
		}
		if (n->peers[i].last_use < n->peers[lru].last_use)
			lru = i;
	}
	if (n->npeers == n->max_peers) {
		peer_drop(n, lru);
		n->st.peer_evictions++;
	}

	s = zmq_socket(n->ctx, ZMQ_DEALER);
	if (!s)
		return zerr();
	ret = set_int(s, ZMQ_LINGER, n->linger_ms);
	if (!ret)
		ret = set_int(s, ZMQ_SNDHWM, n->sndhwm);
	if (!ret)
		ret = set_int(s, ZMQ_RCVHWM, NOTIFY_DEALER_RCVHWM);
	if (!ret && host_is_v6(host))
		ret = set_int(s, ZMQ_IPV6, 1);
	if (!ret && zmq_connect(s, ep))
		ret = zerr();
	if (ret)
		goto err_close;

	p = &n->peers[n->npeers++];
	memcpy(p->ep, ep, sizeof(p->ep));
	p->sock = s;
	p->last_use = ++n->tick;
	n->st.peers = n->npeers;
	*sockp = s;
	return 0;

err_close:
	zmq_close(s);
	return ret;
}

int kvb_notify_send(struct kvb_notify *n, const char *host, uint32_t port,
		    const struct kvb_zmsg *msg)
{
	char ep[NOTIFY_EP_MAX];
	size_t len = 0;
	char *buf = NULL;
	void *sock = NULL;
	int ret;

	if (!host_ok(host) || port == 0 || port > 65535) {
		ret = -EINVAL;
		goto out;
	}
	make_ep(ep, host, port);
	ret = kvb_zmsg_encode(msg, &buf, &len);
	if (ret)
		goto out;
	ret = peer_get(n, host, ep, &sock);
	if (ret)
		goto out;
	if (zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0)
		ret = zerr();
out:
	free(buf);
	if (ret) {
		n->st.send_errors++;
		if (reject_log_ok(n))
			nlog(n, KVB_NOTIFY_LOG_WARN,
			     "notify: send %s for %s to %s:%u failed: %s",
			     kvb_zmsg_type_name(msg->type), msg->transfer_id,
			     host ? host : "(null)", port, strerror(-ret));
		return ret;
	}
	n->st.messages_sent++;
	return 0;
}

void kvb_notify_reject_why(struct kvb_notify *n, const char *why)
{
	n->why = why;
}

void kvb_notify_get_stats(const struct kvb_notify *n,
			  struct kvb_notify_stats *st)
{
	*st = n->st;
}

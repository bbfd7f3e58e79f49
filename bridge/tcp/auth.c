// SPDX-License-Identifier: MIT
/*
 * Authentication of data-port connections (docs/tcp.md, "Authentication").
 *
 *   dialer -> server  HELLO      dialer id, server id, nonce_d (32 random)
 *   server -> dialer  CHALLENGE  nonce_s (32 random), MAC(K, 'S', T)
 *   dialer -> server  PROOF      MAC(K, 'C', T)
 *
 * T = label | dialer id | server id | nonce_d | nonce_s; MAC is
 * HMAC-SHA512-256 (libsodium crypto_auth) under the key both brokers
 * derived at their handshake. The server's nonce is fresh for every
 * connection, so a recorded PROOF never fits another challenge; the ids
 * bind the proof to this pair of transports. Only then does the server
 * read a frame. Also here: the table of allowed peers, and the
 * rate-limited log of refusals.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "le.h"
#include "tcp/tcp_priv.h"

#define LABEL	  "kvb-tcp-auth-v1" /* 15 bytes + NUL: 16 */
#define LABEL_LEN 16
#define T_LEN	  (1 + LABEL_LEN + 8 + 8 + 2 * KVB_TCP_NONCE_LEN)

static void transcript(uint8_t *t, char role, uint64_t id_d, uint64_t id_s,
		       const uint8_t *nonce_d, const uint8_t *nonce_s)
{
	t[0] = (uint8_t) role;
	memcpy(t + 1, LABEL, LABEL_LEN);
	kvb_put64(t + 1 + LABEL_LEN, id_d);
	kvb_put64(t + 9 + LABEL_LEN, id_s);
	memcpy(t + 17 + LABEL_LEN, nonce_d, KVB_TCP_NONCE_LEN);
	memcpy(t + 17 + LABEL_LEN + KVB_TCP_NONCE_LEN, nonce_s,
	       KVB_TCP_NONCE_LEN);
}

void _kvb_tcp_mac(const uint8_t key[KVB_TCP_KEY_LEN], char role, uint64_t id_d,
		  uint64_t id_s, const uint8_t *nonce_d, const uint8_t *nonce_s,
		  uint8_t mac[KVB_TCP_MAC_LEN])
{
	uint8_t t[T_LEN];

	_Static_assert(crypto_auth_BYTES == KVB_TCP_MAC_LEN, "mac size");
	_Static_assert(crypto_auth_KEYBYTES == KVB_TCP_KEY_LEN, "key size");
	transcript(t, role, id_d, id_s, nonce_d, nonce_s);
	crypto_auth(mac, t, sizeof(t), key);
}

int _kvb_tcp_mac_ok(const uint8_t key[KVB_TCP_KEY_LEN], char role,
		    uint64_t id_d, uint64_t id_s, const uint8_t *nonce_d,
		    const uint8_t *nonce_s, const uint8_t *mac)
{
	uint8_t t[T_LEN];

	transcript(t, role, id_d, id_s, nonce_d, nonce_s);
	/* constant time */
	return crypto_auth_verify(mac, t, sizeof(t), key) == 0;
}

int _kvb_tcp_send_all(int fd, const void *buf, size_t len)
{
	ssize_t n;

	do
		n = send(fd, buf, len, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	/* a few dozen bytes into a fresh connection's empty buffer */
	return (size_t) n == len ? 0 : -EIO;
}

const uint8_t kvb_tcp_tool_key[KVB_TCP_KEY_LEN] =
	"kvb tcp tool key: no secret!!!!";

/* ---- allowed peers ---- */

struct tcp_peer *_kvb_tcp_peer_find(struct tcp_transport *tt, uint64_t id)
{
	struct tcp_peer *any = NULL;
	unsigned i;

	for (i = 0; i < tt->npeers; i++) {
		if (tt->peers[i]->id == id)
			return tt->peers[i];
		if (!tt->peers[i]->id)
			any = tt->peers[i];
	}
	return any;
}

int _kvb_tcp_peer_has(const struct tcp_peer *p, uint32_t id)
{
	unsigned lo = 0, hi = p->nrids;

	if (p->all)
		return 1;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (p->rids[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < p->nrids && p->rids[lo] == id;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;

	return x < y ? -1 : x > y;
}

int kvb_tcp_peer_allow(struct kvb_transport *t, uint64_t id,
		       const uint8_t key[KVB_TCP_KEY_LEN],
		       const uint32_t *regions, int n)
{
	struct tcp_transport *tt = to_tcp(t);
	struct tcp_peer *p = NULL;
	uint32_t *rids = NULL;
	unsigned i;

	if (!key || (n > 0 && !regions))
		return -EINVAL;
	if (n > 0) {
		rids = malloc((size_t) n * sizeof(*rids));
		if (!rids)
			return -ENOMEM;
		memcpy(rids, regions, (size_t) n * sizeof(*rids));
		qsort(rids, (size_t) n, sizeof(*rids), cmp_u32);
	}
	for (i = 0; i < tt->npeers; i++)
		if (tt->peers[i]->id == id)
			p = tt->peers[i];
	if (!p) {
		struct tcp_peer **np;

		if (tt->npeers >= TCP_PEERS_MAX) {
			free(rids);
			return -ENOSPC;
		}
		np = realloc(tt->peers, (tt->npeers + 1) * sizeof(*np));
		p = calloc(1, sizeof(*p));
		if (np)
			tt->peers = np;
		if (!np || !p) {
			free(p);
			free(rids);
			return -ENOMEM;
		}
		p->id = id;
		tt->peers[tt->npeers++] = p;
	}
	memcpy(p->key, key, KVB_TCP_KEY_LEN);
	free(p->rids);
	p->rids = rids;
	p->nrids = n > 0 ? (unsigned) n : 0;
	p->all = n < 0;
	return 0;
}

void kvb_tcp_peer_forget(struct kvb_transport *t, uint64_t id)
{
	struct tcp_transport *tt = to_tcp(t);
	struct tcp_conn *c, *next;
	unsigned i;

	for (i = 0; i < tt->npeers; i++)
		if (tt->peers[i]->id == id)
			break;
	if (i == tt->npeers)
		return;
	for (c = tt->conns; c; c = next) {
		next = c->next;
		if (c->peer == tt->peers[i])
			_kvb_tcp_conn_destroy(c);
	}
	sodium_memzero(tt->peers[i]->key, KVB_TCP_KEY_LEN);
	free(tt->peers[i]->rids);
	free(tt->peers[i]);
	tt->peers[i] = tt->peers[--tt->npeers];
}

/* ---- rate-limited log ---- */

static const char *const rl_name[TCP_RL_KINDS] = {
	"untrusted_host", "auth_failed",    "auth_timeout",
	"conn_limit",	  "region_refused", "accept_emfile",
};

void _kvb_tcp_rlog(struct tcp_transport *tt, enum tcp_rl_kind k,
		   const char *fmt, ...)
{
	struct tcp_rl *r = &tt->rl[k];
	uint64_t now;
	char line[256];
	va_list ap;

	if (!tt->log_fn)
		return;
	now = tcp_now();
	if (r->since && now - r->since < 1000000000ull) {
		r->suppressed++;
		tt->rl_pending = 1;
		return;
	}
	_kvb_tcp_rlog_flush(tt, now);
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	r->since = now;
	tt->log_fn(tt->log_arg, line);
}

void _kvb_tcp_rlog_flush(struct tcp_transport *tt, uint64_t now)
{
	unsigned k;
	int left = 0;

	if (!tt->rl_pending)
		return;
	for (k = 0; k < TCP_RL_KINDS; k++) {
		struct tcp_rl *r = &tt->rl[k];
		char line[160];

		if (!r->suppressed)
			continue;
		if (now - r->since < 1000000000ull) {
			left = 1;
			continue;
		}
		snprintf(line, sizeof(line),
			 "tcp data port: %llu more %s refusals in the last "
			 "second (log lines suppressed)",
			 (unsigned long long) r->suppressed, rl_name[k]);
		r->suppressed = 0;
		r->since = now;
		if (tt->log_fn)
			tt->log_fn(tt->log_arg, line);
	}
	tt->rl_pending = left;
}

void _kvb_tcp_addr_str(const struct sockaddr_storage *sa, char *buf, size_t len)
{
	if (sa->ss_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr,
			  buf, (socklen_t) len);
	else if (sa->ss_family == AF_INET6)
		inet_ntop(AF_INET6,
			  &((const struct sockaddr_in6 *) sa)->sin6_addr, buf,
			  (socklen_t) len);
	else
		snprintf(buf, len, "?");
}

/* ---- dialer ---- */

int _kvb_tcp_ep_auth_start(struct kvb_ep *ep)
{
	struct tcp_transport *tt = ep->tt;
	uint8_t m[KVB_TCP_HELLO_LEN];

	if (!ep->has_key)
		return -ENOKEY;
	randombytes_buf(ep->nonce, sizeof(ep->nonce));
	kvb_tcp_auth_head(m, KVB_TCP_A_HELLO);
	kvb_put64(m + 8, tt->nonce);
	kvb_put64(m + 16, ep->srv_id);
	memcpy(m + 24, ep->nonce, KVB_TCP_NONCE_LEN);
	ep->agot = 0;
	ep->state = EP_AUTH;
	return _kvb_tcp_send_all(ep->fd, m, sizeof(m));
}

int _kvb_tcp_ep_auth_read(struct kvb_ep *ep)
{
	struct tcp_transport *tt = ep->tt;
	uint8_t m[KVB_TCP_PROOF_LEN];
	const uint8_t *ns = ep->abuf + 8, *smac = ep->abuf + 40;
	ssize_t n;
	int rc;

	/* exactly the CHALLENGE: nothing else comes before our PROOF */
	n = recv(ep->fd, ep->abuf + ep->agot, KVB_TCP_CHAL_LEN - ep->agot, 0);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	if (n == 0)
		return -ECONNREFUSED; /* the server refused us */
	ep->agot += (unsigned) n;
	tt->st.bytes_rx += (uint64_t) n;
	if (ep->agot < KVB_TCP_CHAL_LEN)
		return 0;
	if (kvb_tcp_auth_head_check(ep->abuf, KVB_TCP_A_CHALLENGE) ||
	    !_kvb_tcp_mac_ok(ep->key, 'S', tt->nonce, ep->srv_id, ep->nonce, ns,
			     smac)) {
		tt->st.dial_auth_failed++;
		return -EACCES; /* not the peer the key belongs to */
	}
	kvb_tcp_auth_head(m, KVB_TCP_A_PROOF);
	_kvb_tcp_mac(ep->key, 'C', tt->nonce, ep->srv_id, ep->nonce, ns, m + 8);
	rc = _kvb_tcp_send_all(ep->fd, m, sizeof(m));
	if (rc)
		return rc;
	tt->st.bytes_tx += sizeof(m);
	ep->state = EP_CONNECTED;
	return 1;
}

int kvb_tcp_ep_set_key(struct kvb_transport *t, struct kvb_ep *ep,
		       const uint8_t key[KVB_TCP_KEY_LEN])
{
	if (!t || t->ops != &kvb_tcp_ops || !ep || !key)
		return -EINVAL;
	for (; ep; ep = ep->stripe) {
		memcpy(ep->key, key, KVB_TCP_KEY_LEN);
		ep->has_key = 1;
	}
	return 0;
}

/* ---- server ---- */

static int conn_refuse(struct tcp_conn *c, const char *why)
{
	char a[INET6_ADDRSTRLEN];

	c->tt->st.refused_auth_failed++;
	_kvb_tcp_addr_str(&c->sa, a, sizeof(a));
	_kvb_tcp_rlog(c->tt, RL_AUTH_FAILED,
		      "tcp data port: connection from %s refused: "
		      "auth_failed (%s)",
		      a, why);
	return -EACCES;
}

static int conn_hello(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	uint8_t m[KVB_TCP_CHAL_LEN];
	int rc;

	if (kvb_tcp_auth_head_check(c->abuf, KVB_TCP_A_HELLO))
		return conn_refuse(c, "no HELLO");
	c->dialer_id = kvb_get64(c->abuf + 8);
	c->srv_id = kvb_get64(c->abuf + 16);
	c->peer = _kvb_tcp_peer_find(tt, c->dialer_id);
	if (!c->peer)
		return conn_refuse(c, "no handshake with that peer");
	/* server id 0: a tool that knows only our address, allowed by a
	 * shared-key entry (id 0) alone; a broker's peer names us */
	if (c->srv_id != tt->nonce && (c->srv_id || c->peer->id))
		return conn_refuse(c, "HELLO for another instance");
	memcpy(c->nonce_d, c->abuf + 24, KVB_TCP_NONCE_LEN);
	randombytes_buf(c->nonce_s, sizeof(c->nonce_s));
	kvb_tcp_auth_head(m, KVB_TCP_A_CHALLENGE);
	memcpy(m + 8, c->nonce_s, KVB_TCP_NONCE_LEN);
	_kvb_tcp_mac(c->peer->key, 'S', c->dialer_id, c->srv_id, c->nonce_d,
		     c->nonce_s, m + 40);
	rc = _kvb_tcp_send_all(c->fd, m, sizeof(m));
	if (rc)
		return rc;
	tt->st.bytes_tx += sizeof(m);
	c->state = C_PROOF;
	c->agot = 0;
	return 0;
}

int _kvb_tcp_conn_auth_read(struct tcp_conn *c)
{
	struct tcp_transport *tt = c->tt;
	unsigned want =
		c->state == C_HELLO ? KVB_TCP_HELLO_LEN : KVB_TCP_PROOF_LEN;
	int rc;

	for (;;) {
		/* exactly the auth message: frames behind it stay unread */
		ssize_t n = recv(c->fd, c->abuf + c->agot, want - c->agot, 0);

		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -errno;
		if (n == 0)
			return -ECONNRESET;
		tt->st.bytes_rx += (uint64_t) n;
		c->agot += (unsigned) n;
		if (c->agot < want)
			continue;
		if (c->state == C_HELLO) {
			rc = conn_hello(c);
			if (rc)
				return rc;
			want = KVB_TCP_PROOF_LEN;
			continue;
		}
		if (kvb_tcp_auth_head_check(c->abuf, KVB_TCP_A_PROOF))
			return conn_refuse(c, "no PROOF");
		/* the entry may have been replaced or dropped since HELLO */
		if (_kvb_tcp_peer_find(tt, c->dialer_id) != c->peer)
			return conn_refuse(c, "peer forgotten");
		if (!_kvb_tcp_mac_ok(c->peer->key, 'C', c->dialer_id, c->srv_id,
				     c->nonce_d, c->nonce_s, c->abuf + 8))
			return conn_refuse(c, "wrong MAC");
		c->state = C_OPEN;
		tt->st.auth_ok++;
		return 1;
	}
}

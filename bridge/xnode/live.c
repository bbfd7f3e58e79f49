// SPDX-License-Identifier: MIT
/*
 * Cross-node: is the peer broker still there? (docs/cross-node.md "Peer
 * death", docs/deadlines.md "The peer clock")
 *
 * While transfers use a peer (opened ones, announcements kept for a P
 * worker, layer ops in flight), this broker pings it on its handshake port
 * every second (a quarter of --peer-timeout when that is shorter):
 *
 *   request  [identity]["hb"][struct hb]        (kind HB_PING)
 *   answer   [int32 0]["hb"][struct hb]         (kind HB_PONG)
 *            [int32 -errno]["hb"][reason]       (refused)
 *
 * Both are MACed (HMAC-SHA512-256) with a per-pair key that only the two
 * instances that exchanged descriptors can derive:
 *
 *   H = BLAKE2b-256(key = cluster key or none,
 *                   "kvb-hb-key-v1" | X25519(own sk, peer pk) |
 *                   lower pk | higher pk)
 *
 * and name both instance numbers, so a ping is answered only by the life
 * of the peer that we hand-shook with, and only from --trusted-hosts. A
 * peer that proves nothing (no pong, no ping of its own) for --peer-timeout
 * is declared lost: every transfer with it fails at once with -EHOSTDOWN,
 * whatever it waits for, its data connections are closed (its writes that
 * are still on the way are refused: quiet failure), and it is counted
 * (remote.peers_lost) and logged once. A handshake (or a pong) brings it
 * back; a handshake that shows another instance number is a restart: the
 * old instance's transfers fail the same way.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "zmq/codec.h"
#include "zmq/notify.h"

#define HB_PING	      1u
#define HB_PONG	      2u
#define HB_IVL_NS     (1000ll * 1000000) /* at most a second between pings */
#define LIVE_PASS_NS  (50ll * 1000000)	 /* a pass every 50 ms */
#define LOST_RETRY_NS (2000ll * 1000000) /* a lost peer: a handshake try */

/* The heartbeat message, in host byte order (as the ep message). */
struct hb {
	char host[64]; /* the sender's handshake address */
	uint32_t port;
	uint32_t kind;		/* HB_PING, HB_PONG */
	uint64_t from_instance; /* the sender's */
	uint64_t to_instance;	/* the receiver's, as the sender knows it */
	uint64_t seq;
	uint8_t mac[32]; /* of everything before it, label "kvb-hb-<kind>1" */
};

static const char *hb_label(uint32_t kind)
{
	return kind == HB_PING ? "kvb-hb-ping1" : "kvb-hb-pong1";
}

static void hb_mac(const uint8_t key[32], const struct hb *m, uint8_t mac[32])
{
	crypto_auth_hmacsha512256_state st;
	const char *label = hb_label(m->kind);

	crypto_auth_hmacsha512256_init(&st, key, 32);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *) label,
					 strlen(label) + 1);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *) m,
					 offsetof(struct hb, mac));
	crypto_auth_hmacsha512256_final(&st, mac);
}

static int hb_mac_ok(const uint8_t key[32], const struct hb *m)
{
	uint8_t want[32];
	int ok;

	hb_mac(key, m, want);
	ok = !sodium_memcmp(want, m->mac, sizeof(want));
	sodium_memzero(want, sizeof(want));
	return ok;
}

void kvb_xn_live_key(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint8_t q[crypto_scalarmult_BYTES];
	crypto_generichash_state st;
	const uint8_t *lo = xn->kx_pk, *hi = p->desc.kx;

	p->live.has_key = 0;
	sodium_memzero(p->live.key, sizeof(p->live.key));
	/* all-zero result: a low-order point, no secret at all */
	if (!p->desc.has_kx || crypto_scalarmult(q, xn->kx_sk, p->desc.kx))
		return;
	if (memcmp(lo, hi, 32) > 0) {
		lo = p->desc.kx;
		hi = xn->kx_pk;
	}
	crypto_generichash_init(&st, xn->has_ck ? xn->ck : NULL,
				xn->has_ck ? sizeof(xn->ck) : 0, 32);
	crypto_generichash_update(&st, (const uint8_t *) "kvb-hb-key-v1", 13);
	crypto_generichash_update(&st, q, sizeof(q));
	crypto_generichash_update(&st, lo, 32);
	crypto_generichash_update(&st, hi, 32);
	crypto_generichash_final(&st, p->live.key, 32);
	sodium_memzero(q, sizeof(q));
	p->live.has_key = 1;
}

static int64_t peer_timeout_ns(struct kvb_broker *b)
{
	return (int64_t) b->opt.peer_timeout_ms * 1000000;
}

/* ------------------------------------------------------------------ */
/* a peer lost, a peer back */

/*
 * Fail every transfer with peer pid now (status), whatever it waits for:
 * its deferred layers, D's write_done, P's remote_blocks, ops in flight
 * (their completion waits for them: they end as the connections close).
 * Returns how many.
 */
static uint32_t fail_peer_xfers(struct kvb_broker *b, uint32_t pid, int status)
{
	uint32_t n = 0;

	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		struct kvb_rxfer *rx = x->rx;

		if (!rx || rx->peer != pid || rx->peer_lost)
			continue;
		rx->peer_lost = 1; /* no release to wait for, nothing sent */
		n++;
		if (x->closing) {
			/* it waits for writers asked to stop: not for these */
			kvb_xfer_fence_now(x);
		} else {
			kvb_xfer_finish(b, x, status);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
	return n;
}

/* p is lost (why): its transfers fail, its connections close. Logged and
 * counted once until it is back. */
static void peer_lost(struct kvb_broker *b, struct kvb_peer *p, const char *why)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint32_t pid = kvb_xn_peer_id(xn, p);
	uint32_t n;

	/* the transfers close first (their queued ops dropped), so that they
	 * fail with -EHOSTDOWN, not with the connections' errors */
	n = fail_peer_xfers(b, pid, -EHOSTDOWN);
	kvb_xn_peer_disconnect(b, p);
	p->stale = 1; /* a new handshake before the next use */
	p->live.on = 0;
	if (p->live.lost)
		return;
	p->live.lost = 1;
	p->live.losses++;
	p->live.retry = kvb_now_ns() + LOST_RETRY_NS;
	xn->st.peers_lost++;
	log_warn("peer %u %s:%u (node %s) lost: %s; %u transfer(s) with it "
		 "failed (%s)",
		 pid, p->host, p->port, p->have_desc ? p->desc.node_id : "-",
		 why, n, kvb_strerror(-EHOSTDOWN));
}

void kvb_xn_live_restarted(struct kvb_broker *b, struct kvb_peer *p)
{
	char why[64];

	/* lost already (its death was seen and counted): what the old
	 * instance still holds fails all the same, no second count */
	snprintf(why, sizeof(why), "restarted (instance %016llx)",
		 (unsigned long long) p->desc.instance);
	peer_lost(b, p, why);
}

int kvb_xn_live_refuse(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	int64_t now;

	if (!p || !p->live.lost)
		return 0;
	/* it may be back: ask (at most every LOST_RETRY_NS); a handshake
	 * that succeeds ends the refusals (kvb_xn_live_alive) */
	now = kvb_now_ns();
	if (p->state != PEER_HS && now >= p->live.retry) {
		p->live.retry = now + LOST_RETRY_NS;
		kvb_xn_peer_start_hs(b, p);
	}
	xn->st.lost_refused++;
	if (kvb_xn_rlog_ok(xn))
		log_warn("peer %u %s:%u is lost: new transfers with it refused "
			 "(%s) until it answers again",
			 kvb_xn_peer_id(xn, p), p->host, p->port,
			 kvb_strerror(-EHOSTDOWN));
	return -EHOSTDOWN;
}

void kvb_xn_live_alive(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	p->live.last = kvb_now_ns();
	if (!p->live.lost)
		return;
	p->live.lost = 0;
	xn->st.peers_back++;
	log_info("peer %u %s:%u (node %s) is back", kvb_xn_peer_id(xn, p),
		 p->host, p->port, p->have_desc ? p->desc.node_id : "-");
}

/* ------------------------------------------------------------------ */
/* the messages */

static void hb_fill(struct kvb_broker *b, struct kvb_peer *p, uint32_t kind,
		    uint64_t seq, struct hb *m)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->host, sizeof(m->host), "%s", b->opt.host_ip);
	m->port = b->opt.handshake_port;
	m->kind = kind;
	m->from_instance = kvb_xn_of(b)->instance;
	m->to_instance = p->desc.instance;
	m->seq = seq;
	hb_mac(p->live.key, m, m->mac);
}

static void ping(struct kvb_broker *b, struct kvb_peer *p)
{
	struct hb m;

	if (kvb_xn_peer_dealer(b, p))
		return;
	hb_fill(b, p, HB_PING, ++p->live.seq, &m);
	/* a full queue (a peer that does not read) drops it: its silence
	 * is what counts */
	if (zmq_send(p->dealer, "hb", 2, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 2 &&
	    zmq_send(p->dealer, &m, sizeof(m), ZMQ_DONTWAIT) ==
		    (int) sizeof(m)) {
		p->live.pings++;
		kvb_xn_of(b)->st.hb_sent++;
	}
}

/* [identity][int32 status]["hb"][body] on the handshake port */
static void hb_reply(struct kvb_xn *xn, zmq_msg_t *id, int32_t status,
		     const void *body, size_t len)
{
	zmq_msg_t idc;

	if (zmq_msg_init(&idc))
		return;
	if (zmq_msg_copy(&idc, id) ||
	    zmq_msg_send(&idc, xn->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&idc);
		return;
	}
	if (zmq_send(xn->router, &status, sizeof(status),
		     ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(xn->router, "hb", 2, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(xn->router, body, len, ZMQ_DONTWAIT) < 0)
		xn->st.send_errors++;
}

static void hb_refuse(struct kvb_xn *xn, zmq_msg_t *id, int rc,
		      const char *from, const char *why)
{
	xn->st.hb_refused++;
	/* a peer that knows an older life of ours (we restarted) is no
	 * attack: it hand-shakes again on this answer */
	if (kvb_xn_rlog_ok(xn)) {
		if (rc == -ENOENT || rc == -ESTALE)
			log_info("heartbeat from %s refused: %s", from, why);
		else
			log_warn("heartbeat from %s refused: %s", from, why);
	}
	hb_reply(xn, id, rc, why, strlen(why));
}

void kvb_xn_hb_serve(struct kvb_broker *b, zmq_msg_t *id, zmq_msg_t *body)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	const char *addr = zmq_msg_gets(body, "Peer-Address");
	struct kvb_peer *p;
	struct hb m;
	char from[64];

	snprintf(from, sizeof(from), "%s", addr ? addr : "?");
	if (!kvb_xn_trusted(xn, from)) {
		hb_refuse(xn, id, -EACCES, from, "not in --trusted-hosts");
		return;
	}
	if (zmq_msg_size(body) != sizeof(m)) {
		hb_refuse(xn, id, -EBADMSG, from, "malformed heartbeat");
		return;
	}
	memcpy(&m, zmq_msg_data(body), sizeof(m));
	if (m.kind != HB_PING || !memchr(m.host, 0, sizeof(m.host)) ||
	    m.port == 0 || m.port > 65535) {
		hb_refuse(xn, id, -EBADMSG, from, "malformed heartbeat");
		return;
	}
	if (!kvb_xn_trusted(xn, m.host)) {
		hb_refuse(xn, id, -EACCES, from,
			  "declared host not in --trusted-hosts");
		return;
	}
	p = kvb_xn_peer_find(xn, m.host, (uint16_t) m.port, 0);
	if (!p || !p->have_desc || !p->live.has_key) {
		/* a peer that restarted does not know us: it hand-shakes
		 * again on this answer */
		hb_refuse(xn, id, -ENOENT, from,
			  "unknown peer: hand-shake first");
		return;
	}
	if (m.from_instance != p->desc.instance ||
	    m.to_instance != xn->instance) {
		hb_refuse(xn, id, -ESTALE, from,
			  "another instance: hand-shake again");
		return;
	}
	if (!hb_mac_ok(p->live.key, &m)) {
		hb_refuse(xn, id, -EACCES, from, "heartbeat not authenticated");
		return;
	}
	/* its ping proves it alive too */
	kvb_xn_live_alive(b, p);
	xn->st.hb_served++;
	hb_fill(b, p, HB_PONG, m.seq, &m);
	hb_reply(xn, id, 0, &m, sizeof(m));
}

void kvb_xn_hb_answer(struct kvb_broker *b, struct kvb_peer *p, zmq_msg_t *f)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	int32_t status;
	struct hb m;

	memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
	if (status) {
		int again = (status == -ENOENT || status == -ESTALE) &&
			    p->state != PEER_HS &&
			    kvb_now_ns() >= p->next_refresh;

		xn->st.hb_bad_pongs++;
		/* it does not know this life of ours, or we do not know its
		 * own: a handshake says which (an answer is no proof of life:
		 * the handshake is, its instance number shows a restart) */
		if ((again || (status != -ENOENT && status != -ESTALE)) &&
		    kvb_xn_rlog_ok(xn))
			log_warn("peer %s:%u refused our heartbeat: %.*s%s",
				 p->host, p->port,
				 (int) zmq_msg_size(&f[2]) > 200
					 ? 200
					 : (int) zmq_msg_size(&f[2]),
				 (const char *) zmq_msg_data(&f[2]),
				 again ? " (hand-shaking again)" : "");
		if (again)
			kvb_xn_peer_start_hs(b, p);
		return;
	}
	if (zmq_msg_size(&f[2]) != sizeof(m) || !p->live.has_key) {
		xn->st.hb_bad_pongs++;
		return;
	}
	memcpy(&m, zmq_msg_data(&f[2]), sizeof(m));
	if (m.kind != HB_PONG || m.from_instance != p->desc.instance ||
	    m.to_instance != xn->instance || m.seq == 0 ||
	    m.seq > p->live.seq || !hb_mac_ok(p->live.key, &m)) {
		xn->st.hb_bad_pongs++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("peer %s:%u: heartbeat answer not proven "
				 "(another instance, or not its key)",
				 p->host, p->port);
		return;
	}
	p->live.pongs++;
	xn->st.hb_answered++;
	kvb_xn_live_alive(b, p);
}

/* ------------------------------------------------------------------ */
/* the pass */

void kvb_xn_live_tick(struct kvb_broker *b, int64_t now)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint8_t busy[MAX_PEERS] = {0};
	int64_t tmo = peer_timeout_ns(b);
	int64_t ivl = tmo / 4 < HB_IVL_NS ? tmo / 4 : HB_IVL_NS;

	if (now < xn->live_next)
		return;
	xn->live_next = now + LIVE_PASS_NS;
	/* peers in use: transfers (opened, or announcements kept for a P
	 * worker; a layer op in flight belongs to one of them: a transfer
	 * ends only after its ops) */
	for (uint32_t i = 0; i < b->xfers.nactive; i++) {
		const struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		struct kvb_peer *p = x->rx && !x->rx->peer_lost
					     ? kvb_xn_peer_get(xn, x->rx->peer)
					     : NULL;

		if (p)
			busy[p - xn->peers] = 1;
	}
	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];
		char why[96];

		if (p->state == PEER_FREE || !busy[i] || !p->have_desc) {
			p->live.on = 0;
			continue;
		}
		if (!p->live.has_key) {
			if (!p->live.no_key_logged++)
				log_warn("peer %s:%u offers no key exchange: "
					 "no heartbeat with it (its death is "
					 "seen by the transfers' clocks only)",
					 p->host, p->port);
			continue;
		}
		if (!p->live.on) { /* its silence counts from now */
			p->live.on = 1;
			p->live.last = now;
			p->live.next = now;
		}
		/* a lost peer that new transfers want: ask it again */
		if (p->live.lost && p->state != PEER_HS &&
		    now >= p->live.retry) {
			p->live.retry = now + LOST_RETRY_NS;
			kvb_xn_peer_start_hs(b, p);
		}
		if (now >= p->live.next) {
			p->live.next = now + ivl;
			ping(b, p);
		}
		if (now - p->live.last >= tmo) {
			snprintf(why, sizeof(why),
				 "no heartbeat answer for %lld ms",
				 (long long) ((now - p->live.last) / 1000000));
			peer_lost(b, p, why);
		}
	}
}

/* ------------------------------------------------------------------ */
/* announcements no P worker opened */

uint32_t kvb_xn_live_sender(struct kvb_xn *xn)
{
	struct kvb_peer *found = NULL;

	if (!xn || !xn->notify_from[0])
		return 0;
	for (uint32_t i = 1; i < xn->npeers_max; i++) {
		struct kvb_peer *p = &xn->peers[i];

		if (p->state == PEER_FREE || !p->have_desc ||
		    (strcmp(p->host, xn->notify_from) &&
		     strcmp(p->desc.host, xn->notify_from)))
			continue;
		if (found)
			return 0; /* several brokers on that host */
		found = p;
	}
	return found ? kvb_xn_peer_id(xn, found) : 0;
}

/* kvb_write_failed (status) for `id` to the D ranks that P worker w's
 * rank feeds at peer p (rx: role P, remote_dp; its targets are computed
 * here); how many went out, counted in write_failed_sent. */
static uint32_t tell_d_ranks(struct kvb_broker *b, struct kvb_worker *w,
			     struct kvb_peer *p, struct kvb_rxfer *rx,
			     const char *id, int status)
{
	struct kvb_zmsg m;
	uint32_t sent = 0;

	if (kvb_xn_compute_targets(b, w, p, rx) ||
	    kvb_zmsg_init(&m, KVB_ZMSG_WRITE_FAILED, id))
		return 0;
	m.status = status;
	for (uint32_t t = 0; t < rx->ntargets; t++) {
		int port = kvb_port_of(p->desc.notify_port
					       ? p->desc.notify_port
					       : KVB_NOTIFY_PORT_DEFAULT,
				       rx->remote_dp, rx->targets[t],
				       rx->target_tp, KVB_PORT_DP_TIMES_TP);

		if (port > 0 &&
		    !kvb_xn_send_msg(b, w,
				     p->desc.host[0] ? p->desc.host : p->host,
				     (uint32_t) port, &m))
			sent++;
	}
	kvb_zmsg_fini(&m);
	kvb_xn_of(b)->st.write_failed_sent += sent;
	return sent;
}

void kvb_xn_live_tell_ended(struct kvb_broker *b, struct kvb_worker *w,
			    const char *id, uint32_t remote_dp)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_peer *p = kvb_xn_peer_get(xn, kvb_xn_live_sender(xn));
	struct kvb_rxfer rx = {.role = KVB_ROLE_P, .remote_dp = remote_dp};
	uint32_t sent;

	if (!p || !p->have_desc || p->live.lost)
		return;
	sent = tell_d_ranks(b, w, p, &rx, id, -ESTALE);
	if (sent && kvb_xn_rlog_ok(xn))
		log_info("transfer '%s': remote_blocks after P worker %u ended "
			 "it: told %u D rank(s) (%s)",
			 id, w->id, sent, kvb_strerror(-ESTALE));
}

void kvb_xn_live_unopened_end(struct kvb_broker *b, struct kvb_xfer *x,
			      int status)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_rxfer *rx = x->rx;
	struct kvb_worker *w = kvb_worker_by_id(b, x->worker);
	struct kvb_peer *p = kvb_xn_peer_get(xn, rx->peer);
	uint32_t sent;

	/* only its own clock (not an eviction, not a lost peer) */
	if (status != -ETIMEDOUT || rx->role != KVB_ROLE_P ||
	    !rx->have_rblocks || rx->peer_lost || !w || !p || !p->have_desc ||
	    p->live.lost)
		return;
	sent = tell_d_ranks(b, w, p, rx, x->id,
			    rx->withdrawn ? -ECANCELED : -ENOENT);
	if (rx->withdrawn) {
		xn->st.withdrawn_told++;
		if (kvb_xn_rlog_ok(xn))
			log_info("transfer '%s': withdrawn by P worker %u "
				 "before it opened it: told %u D rank(s) (%s)",
				 x->id, x->worker, sent,
				 kvb_strerror(-ECANCELED));
		return;
	}
	if (rx->unknown)
		xn->st.unknown_expired++;
	else
		xn->st.unopened_expired++;
	if (kvb_xn_rlog_ok(xn))
		log_warn("transfer '%s': %s within %u s of its remote_blocks: "
			 "told %u D rank(s) (%s)",
			 x->id,
			 rx->unknown
				 ? "P worker does not expect it, nor opened it"
				 : "no P worker opened it",
			 (rx->unknown ? b->opt.unknown_timeout_ms
				      : b->opt.unopened_timeout_ms) /
				 1000,
			 sent, kvb_strerror(-ENOENT));
}

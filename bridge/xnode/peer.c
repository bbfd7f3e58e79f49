/* SPDX-License-Identifier: MIT */
/* Cross-node: this node's engine descriptor, peer brokers, the handshake
 * port, and rdma endpoint offers/answers (see xnode.c). */
#include "xnode_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "nic.h"
#include "zmq/blocks.h"
#include "zmq/codec.h"
#include "zmq/handshake.h"
#include "zmq/notify.h"

/* ------------------------------------------------------------------ */
/* engine descriptor of this node */

/* A transport's connection data, as d's next entry named name (a
 * transport that has none to offer is left out; rdma says why). */
static int desc_transport_add(struct kvb_hs_desc *d, struct kvb_transport *t,
			      const char *name)
{
	struct kvb_hs_transport *ht = &d->transports[d->ntransports];
	size_t len = KVB_HS_CONN_MAX;
	int rc;

	ht->conn = malloc(len);
	if (!ht->conn)
		return -ENOMEM;
	rc = t->ops->local_info(t, ht->conn, &len);
	if (rc && !strcmp(name, "rdma"))
		log_warn("rdma: no connection data to offer: %s",
			 strerror(-rc));
	if (rc == 0) {
		snprintf(ht->name, sizeof(ht->name), "%s", name);
		ht->conn_len = (uint32_t) len;
		d->ntransports++;
	} else {
		free(ht->conn);
		ht->conn = NULL;
	}
	return 0;
}

/* Worker w in a descriptor: its KV regions that peers may access. */
static int desc_worker_add(struct kvb_broker *b, struct kvb_worker *w,
			   struct kvb_hs_worker *hw)
{
	uint32_t nr = 0, nkv = kvb_xn_nkv(b, w);

	hw->role = w->role == KVB_ROLE_P ? KVB_HS_ROLE_P : KVB_HS_ROLE_D;
	hw->dp_rank = w->dp_rank;
	hw->tp_rank = w->tp_rank;
	hw->tp_size = w->tp_size;
	if (nkv) {
		hw->regions = calloc(nkv, sizeof(*hw->regions));
		if (!hw->regions)
			return -ENOMEM;
	}
	for (uint32_t l = 0; l < nkv && nr < KVB_HS_REGIONS_MAX; l++) {
		struct kvb_region_ent *r;
		const struct kvb_xn_region *kv = kvb_xn_kv_layer(b, w, l, &r);
		struct kvb_hs_region *hr = &hw->regions[nr];

		/* peers only see what they may access */
		if (!kv || r->dead ||
		    !(r->mr.flags &
		      (KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
			continue;
		hr->id = r->mr.id;
		hr->size = r->mr.len;
		hr->geom = kv->geom;
		hr->addr = (uint64_t) (uintptr_t) r->mr.addr;
		hr->rkey = r->mr.rkey;
		if (kv->rdma_reg)
			kvb_xn_region_keys(b->trs[KVB_TS_RDMA], &r->mr, hr);
		hr->layer = l;
		nr++;
	}
	hw->nregions = nr;
	return 0;
}

static int own_desc(struct kvb_broker *b, struct kvb_hs_desc *d)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	uint32_t nw = 0;
	int rc;

	memset(d, 0, sizeof(*d));
	snprintf(d->node_id, sizeof(d->node_id), "%s:%u", b->opt.host_ip,
		 b->opt.handshake_port);
	snprintf(d->host, sizeof(d->host), "%s", b->opt.host_ip);
	d->notify_port = b->opt.notify_port;
	d->hs_port = b->opt.handshake_port;
	d->instance = xn->instance;
	memcpy(d->kx, xn->kx_pk, sizeof(d->kx));
	d->has_kx = 1;
	if (b->trs[KVB_TS_TCP] &&
	    (rc = desc_transport_add(d, b->trs[KVB_TS_TCP], "tcp")))
		return rc;
	if (b->trs[KVB_TS_RDMA] &&
	    (rc = desc_transport_add(d, b->trs[KVB_TS_RDMA], "rdma")))
		return rc;
	d->workers = calloc(b->nlive ? b->nlive : 1, sizeof(*d->workers));
	if (!d->workers)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];

		if (!w->attached ||
		    (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D))
			continue;
		rc = desc_worker_add(b, w, &d->workers[nw]);
		if (rc)
			return rc;
		nw++;
	}
	d->nworkers = nw;
	return 0;
}

/* ------------------------------------------------------------------ */
/* peers: handshake, transports */

void kvb_xn_fail_dest_ops(struct kvb_broker *b, uint32_t pid, unsigned ts,
			  int status)
{
	kvb_dest_fail(b, ts, PEER_SLOT(pid), status);
}

void kvb_xn_peer_disconnect(struct kvb_broker *b, struct kvb_peer *p)
{
	uint32_t pid = kvb_xn_peer_id(kvb_xn_of(b), p);

	kvb_xn_auth_tcp_forget(b, p); /* its connections to us close too */
	for (unsigned ts = KVB_TS_TCP; ts < KVB_TS_MAX; ts++) {
		if (!p->ep[ts])
			continue;
		kvb_xn_fail_dest_ops(b, pid, ts, -ECONNRESET);
		b->trs[ts]->ops->disconnect(b->trs[ts], p->ep[ts]);
		p->ep[ts] = NULL;
	}
}

/* Take a peer's new descriptor; (re)connect transports when it changed. */
static int peer_adopt(struct kvb_broker *b, struct kvb_peer *p,
		      struct kvb_hs_desc *d)
{
	int same = p->have_desc && p->desc.instance == d->instance &&
		   (p->ep[KVB_TS_TCP] || p->ep[KVB_TS_RDMA]);
	int rc = 0;

	/* another life of the peer: the old one's transfers fail now */
	if (p->have_desc && p->desc.instance != d->instance)
		kvb_xn_live_restarted(b, p);
	kvb_hs_fini(&p->desc);
	p->desc = *d;
	memset(d, 0, sizeof(*d));
	p->have_desc = 1;
	p->stale = 0;
	kvb_xn_live_key(b, p);
	kvb_xn_live_alive(b, p);
	if (same) {
		kvb_xn_rekey_queued(b,
				    PEER_SLOT(kvb_xn_peer_id(kvb_xn_of(b), p)),
				    &p->desc);
		kvb_xn_auth_tcp_peer(
			b, p); /* the regions offered may have grown */
		return 0;
	}
	kvb_xn_peer_disconnect(b, p);
	for (uint32_t i = 0; i < p->desc.ntransports; i++) {
		struct kvb_hs_transport *ht = &p->desc.transports[i];
		struct kvb_transport *t = b->trs[KVB_TS_TCP];

		if (!t || strcmp(ht->name, "tcp"))
			continue;
		/* no key exchange, no key: the data port would refuse us */
		if (!p->desc.has_kx) {
			kvb_xn_auth_tcp_peer(b, p); /* says why */
			continue;
		}
		rc = t->ops->connect_host
			     ? t->ops->connect_host(t, ht->conn, ht->conn_len,
						    p->host, &p->ep[KVB_TS_TCP])
			     : t->ops->connect(t, ht->conn, ht->conn_len,
					       &p->ep[KVB_TS_TCP]);
		if (rc)
			log_warn("peer %s:%u: tcp connect: %s", p->host,
				 p->port, strerror(-rc));
	}
	kvb_xn_auth_tcp_peer(b, p);
	if (kvb_xn_peer_wants_rdma(b, p)) {
		log_info("peer %u %s:%u (node %s, %u workers): rdma (queue "
			 "pairs connect on first use)",
			 kvb_xn_peer_id(kvb_xn_of(b), p), p->host, p->port,
			 p->desc.node_id, p->desc.nworkers);
		return 0;
	}
	if (!kvb_xn_peer_ts(b, p)) {
		char names[128] = "";

		for (uint32_t i = 0; i < p->desc.ntransports; i++)
			snprintf(names + strlen(names),
				 sizeof(names) - strlen(names), "%s%s",
				 i ? "," : "", p->desc.transports[i].name);
		log_warn("peer %s:%u (%s): no transport in common (it offers "
			 "'%s')",
			 p->host, p->port, p->desc.node_id, names);
		return rc ? rc : -EPROTONOSUPPORT;
	}
	log_info("peer %u %s:%u (node %s, %u workers) connected over %s",
		 kvb_xn_peer_id(kvb_xn_of(b), p), p->host, p->port,
		 p->desc.node_id, p->desc.nworkers,
		 b->trs[kvb_xn_peer_ts(b, p)]->ops->name);
	return 0;
}

void kvb_xn_peer_reply_waiters(struct kvb_broker *b, struct kvb_peer *p,
			       int status)
{
	for (uint32_t i = 0; i < p->nwaiters; i++) {
		struct kvb_worker *w = kvb_worker_by_id(b, p->waiters[i]);
		struct kvb_msg_peer_reply rep = {.h.type = KVB_MSG_PEER};

		if (!w || !w->attached)
			continue;
		rep.peer = status ? 0 : kvb_xn_peer_id(kvb_xn_of(b), p);
		if (!status)
			kvb_xn_peer_ref(b, p, w->id);
		kvb_worker_reply(w, &rep.h, sizeof(rep), status);
	}
	p->nwaiters = 0;
}

void kvb_xn_close_dealer(struct kvb_broker *b, struct kvb_peer *p)
{
	if (!p->dealer)
		return;
	kvb_xn_ep_del(b, p->dealer_fd);
	zmq_close(p->dealer);
	p->dealer = NULL;
	p->dealer_fd = -1;
}

static void hs_reply(struct kvb_xn *xn, zmq_msg_t *id, int32_t status,
		     const void *body, size_t len);

void kvb_xn_peer_done(struct kvb_broker *b, struct kvb_peer *p, int status)
{
	p->last_err = status;
	if (status) {
		p->failures++;
		kvb_xn_of(b)->st.hs_failed++;
		p->state = p->have_desc ? PEER_READY : PEER_FAILED;
		p->stale = 1;
		kvb_xn_close_dealer(
			b, p); /* drop what is queued for a dead peer */
	} else {
		p->state = PEER_READY;
		p->handshakes++;
	}
	kvb_xn_waiting_done(b, p, status); /* transfers opened by address */
	kvb_xn_peer_reply_waiters(b, p, status);
	if (!status)
		kvb_xn_issue_deferred_of_peer(b,
					      kvb_xn_peer_id(kvb_xn_of(b), p));
}

static int peer_dealer(struct kvb_broker *b, struct kvb_peer *p)
{
	char ep[96];
	int zero = 0, hwm = 4, rc;
	int64_t maxmsg = KVB_HS_BYTES_MAX + 1024;
	size_t sz = sizeof(p->dealer_fd);

	if (p->dealer)
		return 0;
	p->dealer = zmq_socket(kvb_xn_of(b)->zctx, ZMQ_DEALER);
	if (!p->dealer)
		return -errno;
	snprintf(ep, sizeof(ep),
		 strchr(p->host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u",
		 p->host, p->port);
	if (zmq_setsockopt(p->dealer, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_setsockopt(p->dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm)) ||
	    zmq_setsockopt(p->dealer, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) ||
	    zmq_connect(p->dealer, ep) ||
	    zmq_getsockopt(p->dealer, ZMQ_FD, &p->dealer_fd, &sz)) {
		rc = -errno;
		zmq_close(p->dealer);
		p->dealer = NULL;
		return rc;
	}
	kvb_xn_ep_add(b, p->dealer_fd);
	return 0;
}

int kvb_xn_peer_dealer(struct kvb_broker *b, struct kvb_peer *p)
{
	return peer_dealer(b, p);
}

int kvb_xn_peer_start_hs(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_hs_desc d;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (p->state == PEER_HS)
		return 0;
	rc = peer_dealer(b, p);
	if (rc)
		return rc;
	rc = own_desc(b, &d);
	if (!rc)
		rc = kvb_hs_encode(&d, &buf, &len);
	if (!rc)
		rc = kvb_xn_auth_offer(b, p, &d);
	kvb_hs_fini(&d);
	if (rc) {
		free(buf);
		return rc;
	}
	kvb_xn_auth_tcp_peer(b, p); /* what we offer now */
	p->sent_gen = kvb_xn_of(b)->desc_gen;
	if (kvb_xn_of(b)->has_ck) {
		/* [descriptor][MAC]: the reply's MAC is bound to this one */
		kvb_xn_auth_hs_mac(kvb_xn_of(b), "kvb-hs-req1", NULL, buf, len,
				   p->req_mac);
		rc = zmq_send(p->dealer, buf, len, ZMQ_SNDMORE | ZMQ_DONTWAIT) <
					     0 ||
				     zmq_send(p->dealer, p->req_mac,
					      sizeof(p->req_mac),
					      ZMQ_DONTWAIT) < 0
			     ? -errno
			     : 0;
	} else {
		rc = zmq_send(p->dealer, buf, len, ZMQ_DONTWAIT) < 0 ? -errno
								     : 0;
	}
	free(buf);
	if (rc)
		return rc;
	kvb_xn_of(b)->st.hs_sent++;
	p->state = PEER_HS;
	p->hs_deadline = kvb_now_ns() + HS_TIMEOUT_NS;
	p->next_refresh = kvb_now_ns() + REFRESH_NS;
	return 0;
}

/*
 * rdma: make this peer's endpoint ready. The side that needs to post sends
 * an "ep" offer (its endpoint blob) on the handshake channel; the peer
 * connects it and answers with its own; both QP sets are then in RTS (the
 * rdma transport pairs crossing offers itself, see rdma.h).
 */
/* An endpoint's blob (ops->ep_info): 0 or -errno */
static int ep_blob(struct kvb_transport *t, struct kvb_ep *ep, void *blob,
		   size_t *len)
{
	if (!t || !t->ops->ep_info)
		return -EPROTONOSUPPORT;
	return t->ops->ep_info(t, ep, blob, len);
}

int kvb_xn_rdma_offer(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	const struct kvb_hs_transport *ht =
		kvb_xn_desc_transport(&p->desc, "rdma");
	static struct ep_msg m;
	size_t len = sizeof(m.blob);
	int rc;

	if (!t || !ht || !t->ops->ep_info)
		return -EPROTONOSUPPORT;
	if (p->ep_pending)
		return 0;
	if (!p->ep[KVB_TS_RDMA]) {
		rc = t->ops->connect(t, ht->conn, ht->conn_len,
				     &p->ep[KVB_TS_RDMA]);
		if (rc) {
			log_warn("peer %s:%u: rdma connect: %s", p->host,
				 p->port, strerror(-rc));
			return rc;
		}
	}
	if (kvb_xn_rdma_ready(b, p))
		return 0;
	memset(&m, 0, sizeof(m));
	snprintf(m.host, sizeof(m.host), "%s", b->opt.host_ip);
	m.port = b->opt.handshake_port;
	rc = ep_blob(t, p->ep[KVB_TS_RDMA], m.blob, &len);
	if (rc)
		return rc;
	m.len = (uint32_t) len;
	rc = peer_dealer(b, p);
	if (rc)
		return rc;
	if (zmq_send(p->dealer, "ep", 2, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(p->dealer, &m, offsetof(struct ep_msg, blob) + len,
		     ZMQ_DONTWAIT) < 0)
		return -errno;
	p->ep_pending = 1;
	p->ep_offers++;
	p->ep_deadline = kvb_now_ns() + HS_TIMEOUT_NS;
	return 0;
}

/* An rdma blob from the peer (offer or answer): connect it. */
static int rdma_take(struct kvb_broker *b, struct kvb_peer *p, const void *blob,
		     size_t len)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	struct kvb_ep *ep = NULL;
	int rc;

	if (!t)
		return -EPROTONOSUPPORT;
	rc = t->ops->connect(t, blob, len, &ep);
	if (rc)
		return rc;
	if (p->ep[KVB_TS_RDMA] && p->ep[KVB_TS_RDMA] != ep) {
		/* the peer's endpoint of an older life: drop ours */
		kvb_xn_fail_dest_ops(b, kvb_xn_peer_id(kvb_xn_of(b), p),
				     KVB_TS_RDMA, -ECONNRESET);
		t->ops->disconnect(t, p->ep[KVB_TS_RDMA]);
	}
	p->ep[KVB_TS_RDMA] = ep;
	if (kvb_xn_rdma_ready(b, p)) {
		log_info("peer %u %s:%u: rdma queue pairs ready",
			 kvb_xn_peer_id(kvb_xn_of(b), p), p->host, p->port);
		p->stale = 0;
	}
	return 0;
}

/* "ep" request on the handshake port: [id]["ep"][struct ep_msg]. */
static void hs_serve_ep(struct kvb_broker *b, zmq_msg_t *id, zmq_msg_t *body)
{
	struct ep_msg m;
	size_t n = zmq_msg_size(body);
	struct kvb_peer *p;
	int rc = -EBADMSG;
	static const char why_bad[] = "malformed ep message",
			  why_peer[] = "unknown peer: hand-shake first";

	memset(&m, 0, sizeof(m));
	if (n >= offsetof(struct ep_msg, blob) && n <= sizeof(m)) {
		memcpy(&m, zmq_msg_data(body), n);
		if (memchr(m.host, 0, sizeof(m.host)) &&
		    m.len == n - offsetof(struct ep_msg, blob))
			rc = 0;
	}
	if (rc) {
		kvb_xn_of(b)->st.hs_refused++;
		hs_reply(kvb_xn_of(b), id, rc, why_bad, sizeof(why_bad) - 1);
		return;
	}
	p = kvb_xn_peer_find(kvb_xn_of(b), m.host, (uint16_t) m.port, 0);
	if (!p || !p->have_desc) {
		kvb_xn_of(b)->st.hs_refused++;
		hs_reply(kvb_xn_of(b), id, -ENOENT, why_peer,
			 sizeof(why_peer) - 1);
		return;
	}
	rc = rdma_take(b, p, m.blob, m.len);
	if (!rc) {
		static struct ep_msg a;
		size_t len = sizeof(a.blob);

		memset(&a, 0, sizeof(a));
		snprintf(a.host, sizeof(a.host), "%s", b->opt.host_ip);
		a.port = b->opt.handshake_port;
		rc = ep_blob(b->trs[KVB_TS_RDMA], p->ep[KVB_TS_RDMA], a.blob,
			     &len);
		if (!rc) {
			zmq_msg_t idc;
			int32_t ok = 0;

			a.len = (uint32_t) len;
			zmq_msg_init(&idc);
			if (zmq_msg_copy(&idc, id) ||
			    zmq_msg_send(&idc, kvb_xn_of(b)->router,
					 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
				zmq_msg_close(&idc);
			else if (zmq_send(kvb_xn_of(b)->router, &ok, sizeof(ok),
					  ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
				 zmq_send(kvb_xn_of(b)->router, "ep", 2,
					  ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
				 zmq_send(kvb_xn_of(b)->router, &a,
					  offsetof(struct ep_msg, blob) + len,
					  ZMQ_DONTWAIT) < 0)
				kvb_xn_of(b)->st.send_errors++;
			p->ep_answers++;
			if (kvb_xn_rdma_ready(b, p))
				kvb_xn_issue_deferred_of_peer(
					b, kvb_xn_peer_id(kvb_xn_of(b), p));
			return;
		}
	}
	log_warn("peer %s:%u: rdma endpoint refused: %s", m.host, m.port,
		 strerror(-rc));
	hs_reply(kvb_xn_of(b), id, rc, "rdma endpoint refused", 21);
}

/*
 * Read one multipart message, keeping at most `max` frames in f: 0, -EAGAIN
 * if none, -EBADMSG when it had more than max (the extras are dropped), or
 * another -errno. *nf is set to the frames held in f on every return: the
 * caller closes them whatever the result.
 */
static int recv_frames(void *sock, zmq_msg_t *f, int max, int *nf)
{
	int more = 1, n = 0, extra = 0;

	*nf = 0;
	while (more) {
		zmq_msg_t tmp;
		zmq_msg_t *m = n < max ? &f[n] : &tmp;
		size_t sz = sizeof(more);

		zmq_msg_init(m);
		if (zmq_msg_recv(m, sock, n || extra ? 0 : ZMQ_DONTWAIT) < 0) {
			int e = errno;

			zmq_msg_close(m);
			for (int i = 0; i < n; i++)
				zmq_msg_close(&f[i]);
			return -e;
		}
		if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz))
			more = 0;
		if (n < max)
			n++;
		else {
			zmq_msg_close(&tmp);
			extra++;
		}
	}
	*nf = n;
	return extra ? -EBADMSG : 0;
}

static void close_frames(zmq_msg_t *f, int n)
{
	for (int i = 0; i < n; i++)
		zmq_msg_close(&f[i]);
}

/* A handshake reply on a peer's DEALER: [status][desc | reason]. */
/* The answer to our rdma offer: [status]["ep"][ep_msg]; f closed here. */
static void peer_ep_answer(struct kvb_broker *b, struct kvb_peer *p,
			   zmq_msg_t *f, int n)
{
	struct ep_msg m;
	size_t sz = zmq_msg_size(&f[2]);
	int32_t status;
	int rc;

	memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
	memset(&m, 0, sizeof(m));
	if (sz >= offsetof(struct ep_msg, blob) && sz <= sizeof(m))
		memcpy(&m, zmq_msg_data(&f[2]), sz);
	close_frames(f, n);
	p->ep_pending = 0;
	rc = status ? status
		    : (m.len == sz - offsetof(struct ep_msg, blob)
			       ? rdma_take(b, p, m.blob, m.len)
			       : -EBADMSG);
	if (rc) {
		log_warn("peer %s:%u: rdma answer: %s", p->host, p->port,
			 strerror(-rc));
		return;
	}
	if (kvb_xn_rdma_ready(b, p))
		kvb_xn_issue_deferred_of_peer(b,
					      kvb_xn_peer_id(kvb_xn_of(b), p));
}

/*
 * A descriptor is followed by its MAC with --cluster-key, only then; a
 * refusal (status < 0) has none. Checks it and drops it (*n = 2): 0,
 * -EBADMSG, or 1 when the reply was refused for a wrong MAC (f closed).
 */
static int peer_reply_mac(struct kvb_broker *b, struct kvb_peer *p,
			  zmq_msg_t *f, int *n)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	int32_t status;
	int rc = 0;

	if (*n < 2 || zmq_msg_size(&f[0]) != sizeof(status))
		return 0;
	memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
	if (!status && (*n == 3) != !!xn->has_ck) /* 2 or 3 frames */
		rc = -EBADMSG;
	else if (!status && *n == 3 &&
		 !kvb_xn_auth_hs_mac_ok(
			 xn, "kvb-hs-rep1", p->req_mac, zmq_msg_data(&f[1]),
			 zmq_msg_size(&f[1]), zmq_msg_data(&f[2]),
			 zmq_msg_size(&f[2])))
		rc = -EACCES;
	else if (status && *n != 2)
		rc = -EBADMSG;
	if (rc == -EACCES) {
		close_frames(f, *n);
		xn->st.hs_bad_replies++;
		log_warn("peer %s:%u: handshake reply with a wrong MAC "
			 "(another --cluster-key?)",
			 p->host, p->port);
		if (p->state == PEER_HS)
			kvb_xn_peer_done(b, p, -EACCES);
		return 1;
	}
	if (!rc && *n == 3) {
		zmq_msg_close(&f[2]); /* the MAC, checked */
		*n = 2;
	}
	return rc;
}

/* A well-formed reply [status][body] to our handshake; f closed here. */
static void peer_take_reply(struct kvb_broker *b, struct kvb_peer *p,
			    zmq_msg_t *f, int n)
{
	const char *reason = NULL;
	struct kvb_hs_desc d;
	int32_t status;
	int rc;

	memcpy(&status, zmq_msg_data(&f[0]), sizeof(status));
	if (p->state != PEER_HS) {
		close_frames(f, n); /* late reply to a timed-out ask */
		return;
	}
	if (status) {
		log_warn("peer %s:%u refused the handshake: %.*s (%s)", p->host,
			 p->port, (int) zmq_msg_size(&f[1]),
			 (const char *) zmq_msg_data(&f[1]),
			 strerror(status < 0 ? -status : status));
		close_frames(f, n);
		kvb_xn_peer_done(b, p, status < 0 ? status : -EPROTO);
		return;
	}
	rc = kvb_hs_decode(&d, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]),
			   &reason);
	close_frames(f, n);
	if (rc) {
		log_warn("peer %s:%u: bad engine descriptor: %s", p->host,
			 p->port, reason ? reason : "?");
		kvb_xn_of(b)->st.hs_bad_replies++;
		kvb_xn_peer_done(b, p, rc);
		return;
	}
	rc = peer_adopt(b, p, &d);
	kvb_hs_fini(&d);
	kvb_xn_peer_done(b, p, rc);
}

void kvb_xn_peer_poll(struct kvb_broker *b, struct kvb_peer *p)
{
	for (unsigned k = 0; k < HS_DRAIN && p->dealer; k++) {
		zmq_msg_t f[3];
		int n = 0, rc;

		rc = recv_frames(p->dealer, f, 3, &n);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			close_frames(f, n);
			n = 0;
		}
		if (!rc && n == 3 && zmq_msg_size(&f[0]) == sizeof(int32_t) &&
		    zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "ep", 2)) {
			peer_ep_answer(b, p, f, n);
			continue;
		}
		if (!rc && n == 3 && zmq_msg_size(&f[0]) == sizeof(int32_t) &&
		    zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "hb", 2)) {
			kvb_xn_hb_answer(b, p, f); /* live.c */
			close_frames(f, n);
			continue;
		}
		if (!rc) {
			rc = peer_reply_mac(b, p, f, &n);
			if (rc == 1)
				continue;
		}
		if (!rc && n == 3) {
			close_frames(f, n);
			rc = -EBADMSG;
		}
		if (rc || n != 2 || zmq_msg_size(&f[0]) != sizeof(int32_t)) {
			close_frames(f, n);
			kvb_xn_of(b)->st.hs_bad_replies++;
			if (kvb_xn_rlog_ok(kvb_xn_of(b)))
				log_warn("peer %s:%u: malformed handshake "
					 "reply",
					 p->host, p->port);
			continue;
		}
		peer_take_reply(b, p, f, n);
	}
}

/* [identity][status][body] (and [MAC] when mac) to a ROUTER peer; a
 * reply that cannot be queued is dropped (the peer times out) */
static void hs_reply_mac(struct kvb_xn *xn, zmq_msg_t *id, int32_t status,
			 const void *body, size_t len, const uint8_t *mac)
{
	void *router = xn->router;
	zmq_msg_t idc;
	int more = mac ? ZMQ_SNDMORE : 0;

	if (zmq_msg_init(&idc))
		return;
	if (zmq_msg_copy(&idc, id) ||
	    zmq_msg_send(&idc, router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&idc);
		return;
	}
	/* the rest of a multipart message whose first part was queued is
	 * queued too (libzmq queues whole messages) */
	if (zmq_send(router, &status, sizeof(status),
		     ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(router, body, len, more | ZMQ_DONTWAIT) < 0 ||
	    (mac && zmq_send(router, mac, 32, ZMQ_DONTWAIT) < 0))
		xn->st.send_errors++;
}

static void hs_reply(struct kvb_xn *xn, zmq_msg_t *id, int32_t status,
		     const void *body, size_t len)
{
	hs_reply_mac(xn, id, status, body, len, NULL);
}

/* Refuse a handshake request from host: counted, logged (a few a second),
 * answered with rc and why. */
static void hs_refuse(struct kvb_xn *xn, zmq_msg_t *id, int rc,
		      const char *host, const char *why)
{
	xn->st.hs_refused++;
	if (kvb_xn_rlog_ok(xn))
		log_warn("handshake from %s refused: %s", host, why);
	hs_reply(xn, id, rc, why, strlen(why));
}

/* A request's sender and MAC: 0, or -1 when it was refused. */
static int hs_check(struct kvb_xn *xn, zmq_msg_t *f, int n, const char *host)
{
	if (!kvb_xn_trusted(xn, host)) {
		hs_refuse(xn, &f[0], -EACCES, host, "not in --trusted-hosts");
		return -1;
	}
	/* --cluster-key: [descriptor][MAC], else [descriptor] */
	if (xn->has_ck
		    ? n != 3 || !kvb_xn_auth_hs_mac_ok(xn, "kvb-hs-req1", NULL,
						       zmq_msg_data(&f[1]),
						       zmq_msg_size(&f[1]),
						       zmq_msg_data(&f[2]),
						       zmq_msg_size(&f[2]))
		    : n != 2) {
		hs_refuse(xn, &f[0], -EACCES, host,
			  xn->has_ck ? "handshake not authenticated "
				       "(--cluster-key differs or is missing)"
				     : "this broker has no --cluster-key");
		return -1;
	}
	return 0;
}

/* The requester's descriptor: 0, or -1 when it was refused. */
static int hs_decode_req(struct kvb_xn *xn, zmq_msg_t *f, const char *host,
			 struct kvb_hs_desc *d)
{
	const char *reason = NULL;
	int rc = kvb_hs_decode(d, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]),
			       &reason);

	if (rc) {
		xn->st.hs_refused++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("handshake from %s refused: %s", host,
				 reason ? reason : strerror(-rc));
		if (rc == -EPROTONOSUPPORT && kvb_xn_rlog_ok(xn))
			log_warn("peer %s speaks handshake version %u, this "
				 "broker %u",
				 host, d->version, KVB_HS_VERSION);
		hs_reply(xn, &f[0], rc, reason ? reason : "bad descriptor",
			 strlen(reason ? reason : "bad descriptor"));
		return -1;
	}
	if (d->host[0] && !kvb_xn_trusted(xn, d->host)) {
		static const char why[] =
			"declared host not in --trusted-hosts";

		xn->st.hs_refused++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("handshake from %s (declaring host %s) "
				 "refused: %s",
				 host, d->host, why);
		hs_reply(xn, &f[0], -EACCES, why, sizeof(why) - 1);
		kvb_hs_fini(d);
		return -1;
	}
	return 0;
}

/* Answer with our descriptor (and its MAC, bound to the request's). */
static void hs_answer(struct kvb_broker *b, zmq_msg_t *id, struct kvb_peer *p,
		      const uint8_t reqmac[32])
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_hs_desc mine;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	rc = own_desc(b, &mine);
	if (!rc)
		rc = kvb_hs_encode(&mine, &buf, &len);
	if (!rc && p && !kvb_xn_auth_offer(b, p, &mine))
		kvb_xn_auth_tcp_peer(b, p); /* what this reply offers */
	if (!rc && p)
		p->sent_gen = xn->desc_gen;
	kvb_hs_fini(&mine);
	if (rc) {
		hs_reply(xn, id, rc, "internal error", 14);
	} else {
		uint8_t mac[32];

		if (xn->has_ck)
			kvb_xn_auth_hs_mac(xn, "kvb-hs-rep1", reqmac, buf, len,
					   mac);
		hs_reply_mac(xn, id, 0, buf, len, xn->has_ck ? mac : NULL);
		xn->st.hs_served++;
	}
	free(buf);
}

/* One handshake request, [identity][descriptor]([MAC]): the requester
 * becomes (or refreshes) a peer of ours, and gets our descriptor. */
static void hs_serve_one(struct kvb_broker *b, zmq_msg_t *f, int n)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	const char *addr = zmq_msg_gets(&f[1], "Peer-Address");
	uint8_t reqmac[32] = {0};
	struct kvb_hs_desc d;
	struct kvb_peer *p;
	char host[64];
	int rc;

	snprintf(host, sizeof(host), "%s", addr ? addr : "?");
	if (hs_check(xn, f, n, host))
		return;
	if (n == 3)
		memcpy(reqmac, zmq_msg_data(&f[2]), sizeof(reqmac));
	if (hs_decode_req(xn, f, host, &d))
		return;
	p = kvb_xn_peer_find(xn, d.host[0] ? d.host : host,
			     (uint16_t) d.hs_port, 1);
	if (p) {
		rc = peer_adopt(b, p, &d);
		if (!rc && p->state != PEER_HS)
			p->state = PEER_READY;
		if (!rc)
			kvb_xn_issue_deferred_of_peer(b, kvb_xn_peer_id(xn, p));
	} else if (kvb_xn_rlog_ok(xn)) {
		log_warn("handshake from %s: peer table full (%u, all in use)",
			 host, xn->npeers_max - 1);
	}
	kvb_hs_fini(&d);
	hs_answer(b, &f[0], p, reqmac);
}

/* Requests on the handshake port, HS_DRAIN at most a call. */
void kvb_xn_hs_serve(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	for (unsigned k = 0; k < HS_DRAIN; k++) {
		zmq_msg_t f[3];
		const char *addr;
		int n = 0, rc;

		rc = recv_frames(xn->router, f, 3, &n);
		if (rc == -EAGAIN)
			return;
		if (!rc && n == 3 && zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "ep", 2)) {
			addr = zmq_msg_gets(&f[2], "Peer-Address");
			if (!kvb_xn_trusted(xn, addr ? addr : "?")) {
				xn->st.hs_refused++;
				hs_reply(xn, &f[0], -EACCES,
					 "not in --trusted-hosts", 22);
			} else {
				hs_serve_ep(b, &f[0], &f[2]);
			}
			close_frames(f, n);
			continue;
		}
		if (!rc && n == 3 && zmq_msg_size(&f[1]) == 2 &&
		    !memcmp(zmq_msg_data(&f[1]), "hb", 2)) {
			kvb_xn_hb_serve(b, &f[0], &f[2]); /* live.c */
			close_frames(f, n);
			continue;
		}
		if (rc || (n != 2 && n != 3)) {
			static const char why[] = "malformed request";

			/* f[0] is the sender's identity whenever a frame
			 * came (ROUTER), even for too many frames */
			if (n)
				hs_reply(xn, &f[0], -EBADMSG, why,
					 sizeof(why) - 1);
			close_frames(f, n);
			xn->st.hs_refused++;
			if (kvb_xn_rlog_ok(xn))
				log_warn("handshake port: malformed request "
					 "(%d%s frames) refused",
					 n, rc == -EBADMSG ? "+" : "");
			continue;
		}
		hs_serve_one(b, f, n);
		close_frames(f, n);
	}
}

// SPDX-License-Identifier: MIT
/*
 * The rdma transport's endpoints: QP creation and the RESET/INIT/RTR/RTS
 * transitions, the handshake state machine behind connect() and ep_info(),
 * and recovery after a work-completion error. See docs/rdma.md.
 *
 * Not thread-safe: the broker's loop owns a transport.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdma/rdma_priv.h"

static void qp_destroy(struct kvb_rdma *r, struct kvb_rdma_qp *q)
{
	unsigned i;

	if (q->qp)
		ibv_destroy_qp(q->qp);
	q->qp = NULL;
	if (q->on_ready) {
		for (i = 0; i < r->nready; i++)
			if (r->ready[i] == q) {
				r->ready[i] = r->ready[--r->nready];
				break;
			}
	}
	r->slots[q->slot] = NULL;
	r->nics[q->lnic].cq_used -= 2 * (int) q->ch.p.depth;
	r->nics[q->lnic].qps--;
	kvb_chain_fini(&q->ch);
}

void _kvb_rdma_ep_destroy(struct kvb_rdma *r, struct kvb_ep *ep)
{
	struct kvb_ep **pp;
	unsigned i;

	for (i = 0; i < ep->nqp; i++)
		qp_destroy(r, &ep->qp[i]);
	for (pp = &r->eps; *pp; pp = &(*pp)->next)
		if (*pp == ep) {
			*pp = ep->next;
			break;
		}
	free(ep);
}

/* What every blob of this transport says about its NICs. */
static void conn_fill_dev(struct kvb_rdma *r, struct kvb_rdma_conn *c)
{
	memset(c, 0, sizeof(*c));
	c->version = KVB_RDMA_CONN_VERSION;
	c->node = r->node;
	c->nnic = (uint8_t) r->nnic;
	for (unsigned i = 0; i < r->nnic; i++) {
		const struct kvb_rdma_nic *n = &r->nics[i];

		c->nic[i].lid = n->port.lid;
		c->nic[i].mtu = (uint8_t) n->port.active_mtu;
		c->nic[i].port = (uint8_t) n->port_num;
		memcpy(c->nic[i].gid, n->gid.raw, 16);
	}
}

int _kvb_rdma_local_info(struct kvb_transport *t, void *blob, size_t *len)
{
	struct kvb_rdma_conn c;

	conn_fill_dev(to_rdma(t), &c);
	return kvb_rdma_conn_encode(&c, blob, len);
}

int kvb_rdma_ep_info(struct kvb_transport *t, struct kvb_ep *ep, void *blob,
		     size_t *len)
{
	struct kvb_rdma_conn c;
	unsigned i;

	if (!ep)
		return -EINVAL;
	conn_fill_dev(to_rdma(t), &c);
	c.nqp = (uint16_t) ep->nqp;
	c.ep = ep->token;
	/* A READY endpoint answers the peer's endpoint; others offer. */
	c.to_ep = ep->state == KVB_RDMA_EP_READY ? ep->peer.ep : 0;
	c.epoch = ep->epoch;
	for (i = 0; i < ep->nqp; i++) {
		c.qp[i].qpn = ep->qp[i].qp->qp_num;
		c.qp[i].psn = ep->qp[i].psn;
		c.qp[i].lnic = ep->qp[i].lnic;
		c.qp[i].rnic = ep->qp[i].rnic;
		c.qp[i].flags = ep->qp[i].parked ? KVB_RDMA_QP_PARKED : 0;
	}
	return kvb_rdma_conn_encode(&c, blob, len);
}

int kvb_rdma_ep_state(struct kvb_transport *t, struct kvb_ep *ep)
{
	(void) t;
	return ep ? (int) ep->state : -EINVAL;
}

/* RESET -> INIT with a fresh PSN. Returns 0 or -errno. */
static int qp_to_init(struct kvb_rdma *r, struct kvb_rdma_qp *q)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = (uint8_t) r->nics[q->lnic].port_num,
		.qp_access_flags =
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	int err;

	err = ibv_modify_qp(q->qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS);
	if (err)
		return -err;
	q->psn = rand_psn();
	return 0;
}

/* INIT -> RTR -> RTS against QP i of the peer (on its NIC the blob
 * names). Returns 0 or -errno. */
static int qp_to_rts(struct kvb_rdma *r, struct kvb_rdma_qp *q,
		     const struct kvb_rdma_conn *pc, unsigned i)
{
	const struct kvb_rdma_nic *n = &r->nics[q->lnic];
	const struct kvb_rdma_conn_nic *pn = &pc->nic[pc->qp[i].lnic];
	int rd = n->dev.max_qp_rd_atom < KVB_RDMA_RD_ATOM
			 ? n->dev.max_qp_rd_atom
			 : KVB_RDMA_RD_ATOM;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = pn->mtu < n->port.active_mtu
				    ? (enum ibv_mtu) pn->mtu
				    : n->port.active_mtu,
		.dest_qp_num = pc->qp[i].qpn,
		.rq_psn = pc->qp[i].psn,
		.max_dest_rd_atomic = (uint8_t) (rd > 0 ? rd : 1),
		.min_rnr_timer = 12,
		.ah_attr =
			{
				.dlid = pn->lid,
				.sl = 0,
				.port_num = (uint8_t) n->port_num,
			},
	};
	static const uint8_t zero[16];
	int err;

	/* RoCE needs a GRH; IB uses one when the peer sent a GID. */
	if (n->port.link_layer == IBV_LINK_LAYER_ETHERNET ||
	    memcmp(pn->gid, zero, 16)) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, pn->gid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t) n->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	err = ibv_modify_qp(q->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
	if (err)
		return -err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14; /* 4.096 us * 2^14 = 67 ms per try */
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = q->psn;
	a.max_rd_atomic = (uint8_t) (rd > 0 ? rd : 1);
	err = ibv_modify_qp(q->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC);
	return err ? -err : 0;
}

/* SGEs per WR: gather lists of up to KVB_RDMA_SGE_MAX local pieces, as far
 * as the device allows (1 where it says nothing, as the mock does). */
static uint32_t rdma_sge(struct kvb_rdma_nic *n)
{
	if (!n->sge)
		n->sge = n->dev.max_sge <= 1 ? 1
			 : (uint32_t) n->dev.max_sge < KVB_RDMA_SGE_MAX
				 ? (uint32_t) n->dev.max_sge
				 : KVB_RDMA_SGE_MAX;
	return n->sge;
}

/*
 * A new RC QP on NIC n's CQ (RESET state) for chain ch; NULL with errno
 * set. A device that refuses the gather's SGEs gets QPs of one SGE from
 * then on, and the chain builds WRs of one SGE (its arrays have room for
 * more: only the limit drops).
 */
static struct ibv_qp *qp_new(struct kvb_rdma *r, struct kvb_rdma_nic *n,
			     struct kvb_chain *ch)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = n->cq,
		.recv_cq = n->cq,
		.cap =
			{
				.max_send_wr = r->p.sq_depth,
				.max_recv_wr = 1,
				.max_send_sge = rdma_sge(n),
				.max_recv_sge = 1,
			},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};
	struct ibv_qp *qp = ibv_create_qp(n->pd, &ia);

	if (!qp && n->sge > 1) {
		n->sge = 1;
		ia.cap.max_send_sge = 1;
		qp = ibv_create_qp(n->pd, &ia);
	}
	if (qp && ch->p.max_sge > n->sge)
		ch->p.max_sge = n->sge;
	return qp;
}

/* q on our NIC lnic towards the peer's rnic */
static int qp_create(struct kvb_rdma *r, struct kvb_ep *ep,
		     struct kvb_rdma_qp *q, uint8_t lnic, uint8_t rnic)
{
	struct kvb_rdma_nic *n = &r->nics[lnic];
	struct kvb_chain_params cp = {
		.depth = r->p.sq_depth,
		.post_batch = r->p.post_batch_size,
		.max_sge = rdma_sge(n),
		.signal_every = r->p.signal_every > 0
					? (uint32_t) r->p.signal_every
					: 0,
	};
	unsigned slot;
	int err;

	if (n->cq_used + 2 * (int) r->p.sq_depth > n->cq_size)
		return -ENOSPC;
	for (slot = 0; slot < KVB_RDMA_MAX_SLOTS; slot++)
		if (!r->slots[slot])
			break;
	if (slot == KVB_RDMA_MAX_SLOTS)
		return -ENOSPC;
	cp.qp_index = (uint16_t) slot;
	err = kvb_chain_init(&q->ch, &cp);
	if (err)
		return err;
	/* Never reuse a (slot, generation) pair: old CQEs must not match. */
	q->ch.gen = ++r->slot_gen[slot];
	q->lnic = lnic;
	q->rnic = rnic;
	q->qp = qp_new(r, n, &q->ch);
	if (!q->qp) {
		err = errno ? -errno : -ENOMEM;
		goto err_chain;
	}
	err = qp_to_init(r, q);
	if (err)
		goto err_qp;
	q->ep = ep;
	q->slot = (uint16_t) slot;
	q->on_ready = 0;
	r->slots[slot] = q;
	n->cq_used += 2 * (int) r->p.sq_depth;
	n->qps++;
	return 0;

err_qp:
	ibv_destroy_qp(q->qp);
	q->qp = NULL;
err_chain:
	kvb_chain_fini(&q->ch);
	return err;
}

/* A new endpoint (HALF) with nqp QPs on the NIC pairs lay[] (our NIC,
 * the peer's). NULL with *errp set. */
static struct kvb_ep *ep_create(struct kvb_rdma *r, const uint8_t (*lay)[2],
				unsigned nqp, int *errp)
{
	struct kvb_ep *ep;
	unsigned i;
	int err = 0;

	ep = calloc(1, sizeof(*ep));
	if (!ep) {
		*errp = -ENOMEM;
		return NULL;
	}
	ep->t = r;
	ep->token = rand64();
	ep->state = KVB_RDMA_EP_HALF;
	for (i = 0; i < nqp; i++) {
		err = qp_create(r, ep, &ep->qp[i], lay[i][0], lay[i][1]);
		if (err)
			break;
		ep->nqp++;
	}
	ep->next = r->eps;
	r->eps = ep;
	if (err) {
		_kvb_rdma_ep_destroy(r, ep);
		*errp = err;
		return NULL;
	}
	return ep;
}

/* Rails: our NIC i to the peer's i mod m, the peer's j from our j mod n;
 * each pair once, in that order. Returns how many pairs. */
static unsigned rail_pairs(unsigned n, unsigned m, uint8_t (*pair)[2])
{
	unsigned k = 0, i, j, a, b;

	for (i = 0; i < n + m; i++) {
		a = i < n ? i : (i - n) % n;
		b = i < n ? i % m : i - n;
		for (j = 0; j < k && (pair[j][0] != a || pair[j][1] != b); j++)
			;
		if (j == k) {
			pair[k][0] = (uint8_t) a;
			pair[k][1] = (uint8_t) b;
			k++;
		}
	}
	return k;
}

/* The first of our NICs whose QP budget need[] would pass, or -1. */
static int budget_over(const struct kvb_rdma *r, const unsigned *need)
{
	for (unsigned i = 0; i < r->nnic; i++)
		if (need[i] && r->nics[i].qps + need[i] > r->nics[i].max_qps)
			return (int) i;
	return -1;
}

/* A connect refused by NIC i's budget: counted, logged (the first and
 * then every power of two), -EUSERS. */
static int budget_refuse(struct kvb_rdma *r, unsigned i, unsigned need)
{
	struct kvb_rdma_nic *n = &r->nics[i];

	n->qp_refused++;
	if (!(n->qp_refused & (n->qp_refused - 1)))
		_kvb_rdma_say(r, KVB_RDMA_LOG_WARN,
			      "rdma: %s: connect refused: %u more QPs would "
			      "pass its budget of %u (%u in use; --max-qps); "
			      "%llu refused so far",
			      n->name, need, n->max_qps, n->qps,
			      (unsigned long long) n->qp_refused);
	return -EUSERS;
}

/*
 * Our side's QPs towards a peer with m NICs (we offer): qp_per_peer QPs
 * on each rail pair, fewer (at least one) where a NIC's budget or the
 * blob's limit asks for it. lay[i]: (our NIC, the peer's). Returns 0 with
 * *nqp set, or -EUSERS.
 */
static int ep_plan(struct kvb_rdma *r, unsigned m, uint8_t (*lay)[2],
		   unsigned *nqp)
{
	uint8_t pair[2 * KVB_NIC_MAX][2];
	unsigned np, per, want, i, j, need[KVB_NIC_MAX];
	int over;

	np = rail_pairs(r->nnic, m ? m : 1, pair);
	per = want = (unsigned) r->p.qp_per_peer;
	while (per > 1 && per * np > KVB_RDMA_EP_QP_MAX)
		per--;
	for (;; per--) {
		memset(need, 0, sizeof(need));
		for (i = 0; i < np; i++)
			need[pair[i][0]] += per;
		over = budget_over(r, need);
		if (over < 0 || per == 1)
			break;
	}
	if (over >= 0)
		return budget_refuse(r, (unsigned) over, need[over]);
	if (per < want)
		_kvb_rdma_say(r, KVB_RDMA_LOG_INFO,
			      "rdma: %u QPs per NIC pair instead of %u (%u "
			      "pairs; QP budgets or the %u QPs of an endpoint)",
			      per, want, np, KVB_RDMA_EP_QP_MAX);
	for (i = 0; i < np; i++)
		for (j = 0; j < per; j++) {
			lay[i * per + j][0] = pair[i][0];
			lay[i * per + j][1] = pair[i][1];
		}
	*nqp = np * per;
	return 0;
}

/* Our side of a peer's offer: its QPs mirrored (its rnic is our NIC).
 * -EPROTO for a NIC we do not have, -EUSERS over a budget. */
static int ep_mirror(struct kvb_rdma *r, const struct kvb_rdma_conn *pc,
		     uint8_t (*lay)[2])
{
	unsigned need[KVB_NIC_MAX] = {0}, i;
	int over;

	for (i = 0; i < pc->nqp; i++) {
		if (pc->qp[i].rnic >= r->nnic)
			return -EPROTO;
		lay[i][0] = pc->qp[i].rnic;
		lay[i][1] = pc->qp[i].lnic;
		need[lay[i][0]]++;
	}
	over = budget_over(r, need);
	return over < 0 ? 0 : budget_refuse(r, (unsigned) over, need[over]);
}

static int ep_live(const struct kvb_ep *ep)
{
	unsigned i;

	for (i = 0; i < ep->nqp; i++)
		if (ep->qp[i].ch.done != ep->qp[i].ch.head)
			return 1;
	return 0;
}

/*
 * Let the hardware tell what finished on every QP of ep: move QPs with live
 * WRs to the error state and consume their flush completions. The first
 * flush of a QP retires everything before it as done (RC completes in
 * order) and fails the rest with -ECANCELED, so ops that landed on a healthy
 * sibling QP are not reported failed. Bounded: a provider that never
 * flushes leaves the rest to kvb_chain_fail_all().
 */
static void ep_quiesce(struct kvb_rdma *r, struct kvb_ep *ep)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	uint64_t deadline = now_ns() + KVB_RDMA_FLUSH_WAIT_NS;
	unsigned i;

	_kvb_rdma_cq_drain(r);
	for (i = 0; i < ep->nqp; i++)
		if (ep->qp[i].ch.done != ep->qp[i].ch.head)
			ibv_modify_qp(ep->qp[i].qp, &a, IBV_QP_STATE);
	while (ep_live(ep) && now_ns() < deadline)
		_kvb_rdma_cq_drain(r);
}

/*
 * A fresh QP in INIT in place of q's (its chain, slot and cookies stay),
 * the old one destroyed. soft-RoCE (6.12, emulated guest under load) was
 * seen to move a QP taken through RESET back to INIT on to ERR afterwards,
 * from the error just handled (its INIT -> RTR then failed with EINVAL;
 * after the same RESET -> INIT once more, a QP of the next incarnation
 * broke on its own): a new QP carries nothing over. Returns 0 or -errno
 * (q keeps its old QP then).
 */
static int qp_renew(struct kvb_rdma *r, struct kvb_rdma_qp *q)
{
	struct ibv_qp *old = q->qp;
	int err;

	q->qp = qp_new(r, &r->nics[q->lnic], &q->ch);
	if (!q->qp) {
		q->qp = old;
		return errno ? -errno : -ENOMEM;
	}
	err = qp_to_init(r, q);
	if (err) {
		ibv_destroy_qp(q->qp);
		q->qp = old;
		return err;
	}
	ibv_destroy_qp(old);
	return 0;
}

/*
 * Give every QP of ep a fresh incarnation in INIT with a new PSN, after
 * ep_quiesce() settled what was in flight: a new QP (qp_renew), or where
 * that fails the old one through RESET. The endpoint then needs the peer's
 * blob again. Returns 0 or -errno (the endpoint is unusable then).
 */
static int ep_reset(struct kvb_rdma *r, struct kvb_ep *ep)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	int multi = r->nnic > 1 || ep->peer.nnic > 1;
	unsigned i;
	int err, ret = 0;

	ep_quiesce(r, ep);
	for (i = 0; i < ep->nqp; i++) {
		struct kvb_rdma_qp *q = &ep->qp[i];

		kvb_chain_fail_all(&q->ch, -ECANCELED);
		_kvb_rdma_ready_push(r, q);
		err = 0; /* positive errno here, as ibv_modify_qp's */
		if (qp_renew(r, q)) {
			err = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
			if (!err)
				err = -qp_to_init(r, q);
		}
		if (!err)
			err = -kvb_chain_reset(&q->ch);
		/* kvb_chain_reset cannot fail after fail_all */
		if (err && !ret)
			ret = -err;
		/* a new generation: flushes of the old incarnation are stale */
		q->ch.gen = ++r->slot_gen[q->slot];
		/* what our next offer says of it: parked only if its NIC is
		 * down now (the handshake decides again, ep_establish) */
		q->parked =
			multi && !nic_up(&r->nics[q->lnic]) ? QP_PARK_LOCAL : 0;
		q->parked_ns = 0;
	}
	ep->epoch++;
	ep->state = KVB_RDMA_EP_RESET;
	return ret;
}

/* Another QP of ep than q that takes chains (connected, not broken) */
static int ep_other_live(const struct kvb_ep *ep, const struct kvb_rdma_qp *q)
{
	for (unsigned i = 0; i < ep->nqp; i++)
		if (&ep->qp[i] != q && !ep->qp[i].parked &&
		    !ep->qp[i].ch.broken)
			return 1;
	return 0;
}

/*
 * A QP that failed on an endpoint over several NICs, while a QP of another
 * NIC pair still works (a port going down, a cable pulled): parked alone
 * rather than the whole endpoint reset, so the chains in flight on the
 * other pairs are not cancelled and no re-handshake holds up the chains
 * moved to them. Its chain already failed what it held (chain.c). Like a
 * QP parked at a handshake, it is connected again by the reset that
 * follows once its NIC is up and the endpoint idle
 * (_kvb_rdma_reconnect_idle).
 */
static int qp_park_failed(struct kvb_rdma *r, struct kvb_ep *ep,
			  struct kvb_rdma_qp *q)
{
	if ((r->nnic < 2 && ep->peer.nnic < 2) || !ep_other_live(ep, q))
		return 0;
	q->parked = QP_PARK_LOCAL;
	q->parked_ns = now_ns();
	q->parked_active = r->nics[q->lnic].async.port_active;
	r->nics[q->lnic].qp_parked++;
	r->reconnect_due = 1; /* its NIC may still be up */
	_kvb_rdma_say(r, KVB_RDMA_LOG_WARN,
		      "rdma: QP %u on %s failed: parked; its endpoint goes on "
		      "through its other NIC pairs and re-handshakes once "
		      "%s is up and the endpoint idle",
		      q->qp ? q->qp->qp_num : 0, r->nics[q->lnic].name,
		      r->nics[q->lnic].name);
	return 1;
}

/*
 * A READY endpoint with a failed QP (seen while another endpoint drained the
 * CQ) is reset now, unless the QP can be parked (above). Returns 1 if ep
 * is READY afterwards.
 */
int _kvb_rdma_ep_usable(struct kvb_rdma *r, struct kvb_ep *ep)
{
	unsigned i;

	if (ep->state != KVB_RDMA_EP_READY)
		return 0;
	for (i = 0; i < ep->nqp; i++) {
		struct kvb_rdma_qp *q = &ep->qp[i];

		if (q->ch.broken && !q->parked && !qp_park_failed(r, ep, q)) {
			ep_reset(r, ep);
			return 0;
		}
	}
	return 1;
}

/*
 * Endpoints with a QP parked on a NIC of ours that is up (again): each is
 * reset once nothing is in flight on it (the reset then fails no op), so
 * that the re-handshake connects the parked QPs; a busy one is looked at
 * again at the next call. Called by poll() while r->reconnect_due (a NIC
 * came back, a QP was parked), never by post(): a reset there would fail
 * the chain being posted with -ENOTCONN, while after poll() the
 * cross-node module sees the endpoint not READY before it issues more
 * and re-handshakes first.
 */
void _kvb_rdma_reconnect_idle(struct kvb_rdma *r)
{
	uint64_t now = now_ns();
	struct kvb_ep *ep;
	int busy = 0;

	for (ep = r->eps; ep; ep = ep->next) {
		int back = 0;

		if (ep->state != KVB_RDMA_EP_READY)
			continue;
		for (unsigned i = 0; i < ep->nqp; i++) {
			const struct kvb_rdma_qp *q = &ep->qp[i];
			const struct kvb_rdma_nic *n = &r->nics[q->lnic];

			if (q->parked != QP_PARK_LOCAL || !nic_up(n))
				continue;
			/* failed on a NIC that did not go down and up since:
			 * not before the hold */
			if (q->parked_ns &&
			    n->async.port_active == q->parked_active &&
			    now - q->parked_ns < KVB_RDMA_PARK_HOLD_NS) {
				busy = 1;
				continue;
			}
			back = 1;
		}
		if (!back)
			continue;
		if (ep_live(ep))
			busy = 1;
		else
			ep_reset(r, ep);
	}
	r->reconnect_due = busy;
}

/*
 * The peer's QP for our QP j: the k-th of the peer's QPs on our NIC pair
 * seen from its side, k = our QPs on that pair before j (both sides list
 * a pair's QPs in one order; the pairs' order may differ). -1: none.
 */
static int peer_qp(const struct kvb_ep *ep, const struct kvb_rdma_conn *pc,
		   unsigned j)
{
	const struct kvb_rdma_qp *q = &ep->qp[j];
	unsigned k = 0, i;

	for (i = 0; i < j; i++)
		k += ep->qp[i].lnic == q->lnic && ep->qp[i].rnic == q->rnic;
	for (i = 0; i < pc->nqp; i++)
		if (pc->qp[i].lnic == q->rnic && pc->qp[i].rnic == q->lnic &&
		    !k--)
			return (int) i;
	return -1;
}

/*
 * Connect every QP of ep to its QP of the peer blob pc. A QP on a NIC of
 * ours whose port is down (its route may be gone: RTR fails), or whose
 * peer QP is parked, stays in INIT, parked: the endpoint works through
 * its other NIC pairs; a re-handshake connects it again.
 */
static int ep_establish(struct kvb_rdma *r, struct kvb_ep *ep,
			const struct kvb_rdma_conn *pc)
{
	/* one NIC on both sides: no other pair to go through, as before */
	int multi = r->nnic > 1 || pc->nnic > 1;
	unsigned i;
	int err, k;

	if (pc->nqp != ep->nqp)
		return -EPROTO;
	for (i = 0; i < ep->nqp; i++) {
		struct kvb_rdma_qp *q = &ep->qp[i];

		k = peer_qp(ep, pc, i);
		if (k < 0)
			return -EPROTO;
		q->parked = 0;
		q->parked_ns = 0;
		if (pc->qp[k].flags & KVB_RDMA_QP_PARKED)
			q->parked = QP_PARK_PEER;
		else if (multi && !nic_up(&r->nics[q->lnic]))
			q->parked = QP_PARK_LOCAL;
		if (q->parked)
			continue;
		err = qp_to_rts(r, q, pc, (unsigned) k);
		if (err && multi && !nic_up(&r->nics[q->lnic])) {
			q->parked = QP_PARK_LOCAL; /* went down meanwhile */
			continue;
		}
		if (err)
			return err;
	}
	ep->peer = *pc;
	ep->state = KVB_RDMA_EP_READY;
	return 0;
}

static struct kvb_ep *ep_find(struct kvb_rdma *r, uint64_t token)
{
	struct kvb_ep *ep;

	for (ep = r->eps; ep; ep = ep->next)
		if (ep->token == token)
			return ep;
	return NULL;
}

static struct kvb_ep *ep_find_peer(struct kvb_rdma *r, uint64_t node,
				   uint64_t peer_ep)
{
	struct kvb_ep *ep;

	for (ep = r->eps; ep; ep = ep->next)
		if (ep->peer.node == node && ep->peer.ep == peer_ep)
			return ep;
	return NULL;
}

static int same_qps(const struct kvb_rdma_conn *a,
		    const struct kvb_rdma_conn *b)
{
	unsigned i;

	if (a->nqp != b->nqp || a->epoch != b->epoch)
		return 0;
	for (i = 0; i < a->nqp; i++)
		if (a->qp[i].qpn != b->qp[i].qpn ||
		    a->qp[i].psn != b->qp[i].psn)
			return 0;
	return 1;
}

/* connect() with an answer to one of our offers */
static int conn_answer(struct kvb_rdma *r, const struct kvb_rdma_conn *pc,
		       struct kvb_ep **out)
{
	struct kvb_ep *ep = ep_find(r, pc->to_ep);
	int err;

	if (!ep)
		return -ENOENT;
	/* a late answer of an earlier epoch */
	if (ep->peer.ep == pc->ep && pc->epoch <= ep->peer.epoch &&
	    ep->state == KVB_RDMA_EP_RESET) {
		*out = ep;
		return 0;
	}
	if (ep->state == KVB_RDMA_EP_READY) {
		/* a crossed offer got there first: the same data; or an
		 * older epoch: a late answer, ignore */
		if ((ep->peer.node == pc->node && ep->peer.ep == pc->ep &&
		     same_qps(&ep->peer, pc)) ||
		    (ep->peer.ep == pc->ep && pc->epoch < ep->peer.epoch)) {
			*out = ep;
			return 0;
		}
		return -EPROTO;
	}
	err = ep_establish(r, ep, pc);
	if (!err)
		*out = ep;
	return err;
}

/*
 * connect(): see rdma.h for the broker's rule and docs/rdma.md for the state
 * machine. Returns 0 with *out set, or -errno.
 */
int _kvb_rdma_connect(struct kvb_transport *t, const void *blob, size_t len,
		      struct kvb_ep **out)
{
	struct kvb_rdma *r = to_rdma(t);
	uint8_t lay[KVB_RDMA_EP_QP_MAX][2];
	struct kvb_rdma_conn pc;
	struct kvb_ep *ep;
	unsigned nqp;
	int err, created = 0;

	if (!blob || !len) {
		memset(&pc, 0, sizeof(pc));
	} else {
		err = kvb_rdma_conn_decode(&pc, blob, len);
		if (err)
			return err;
	}
	if (!pc.nqp) {
		/* An offer without QPs: start our side (HALF). */
		err = ep_plan(r, pc.nnic, lay, &nqp);
		if (err)
			return err;
		ep = ep_create(r, lay, nqp, &err);
		if (!ep)
			return err;
		ep->peer = pc; /* node only; ep 0 */
		*out = ep;
		return 0;
	}

	if (pc.to_ep)
		return conn_answer(r, &pc, out);

	/* An offer with QPs: a re-handshake of a known endpoint... */
	ep = ep_find_peer(r, pc.node, pc.ep);
	if (ep) {
		if (pc.epoch < ep->peer.epoch)
			goto out_ok; /* stale */
		if (ep->state == KVB_RDMA_EP_READY) {
			if (same_qps(&ep->peer, &pc))
				goto out_ok; /* duplicate */
			err = ep_reset(r, ep);
			if (err)
				goto done;
		}
		err = ep_establish(r, ep, &pc);
		goto done;
	}
	/* ...or one crossing ours (both sides offered at once)... */
	for (ep = r->eps; ep; ep = ep->next)
		if (ep->state == KVB_RDMA_EP_HALF && ep->peer.node == pc.node &&
		    !ep->peer.ep)
			break;
	/* ...or a new peer: we answer. */
	if (!ep) {
		err = ep_mirror(r, &pc, lay);
		if (err)
			return err;
		ep = ep_create(r, lay, pc.nqp, &err);
		if (!ep)
			return err;
		created = 1;
	}
	err = ep_establish(r, ep, &pc);
	if (err && created) {
		_kvb_rdma_ep_destroy(r, ep);
		return err;
	}
done:
	if (err)
		return err;
out_ok:
	*out = ep;
	return 0;
}

/*
 * Keep ep's accepted ops for poll(): the live ones failed with
 * -ECONNABORTED (their outcome is unknown now), the retired ones with the
 * status they had. 0 or -ENOMEM.
 */
static int ep_orphan_ops(struct kvb_rdma *r, struct kvb_ep *ep)
{
	unsigned i, need = 0;

	for (i = 0; i < ep->nqp; i++) {
		if (!ep->qp[i].qp)
			continue;
		kvb_chain_fail_all(&ep->qp[i].ch, -ECONNABORTED);
		need += kvb_chain_ready(&ep->qp[i].ch);
	}
	if (r->orphan_head == r->norphan)
		r->orphan_head = r->norphan = 0;
	if (r->norphan + need > r->orphan_cap) {
		unsigned cap = r->norphan + need + 64;
		struct kvb_xcqe *n = realloc(r->orphan, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		r->orphan = n;
		r->orphan_cap = cap;
	}
	for (i = 0; i < ep->nqp; i++)
		if (ep->qp[i].qp)
			r->norphan += kvb_chain_reap(
				&ep->qp[i].ch, r->orphan + r->norphan,
				r->orphan_cap - r->norphan);
	return 0;
}

/*
 * Every op accepted on ep still completes once, through poll() (the
 * transport contract; the broker's in-flight entries and region references
 * wait for them). Should the memory for that not be there, the endpoint is
 * kept (its QPs in error, its chains broken) rather than its ops lost, and
 * close() ends it; it no longer answers to its or its peer's tokens, so
 * connect() never hands it back (an answer to its offer is -ENOENT, a
 * re-offer of its peer gets a new endpoint, as when it is freed).
 */
void _kvb_rdma_disconnect(struct kvb_transport *t, struct kvb_ep *ep)
{
	struct kvb_rdma *r = to_rdma(t);

	if (!ep)
		return;
	if (ep_orphan_ops(r, ep)) {
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

		/* no memory: the chains keep the failed cookies, poll()
		 * reaps them from there; the endpoint stays until close() */
		for (unsigned i = 0; i < ep->nqp; i++)
			if (ep->qp[i].qp) {
				ibv_modify_qp(ep->qp[i].qp, &a, IBV_QP_STATE);
				_kvb_rdma_ready_push(r, &ep->qp[i]);
			}
		ep->state = KVB_RDMA_EP_RESET;
		ep->token = 0;
		memset(&ep->peer, 0, sizeof(ep->peer));
		return;
	}
	_kvb_rdma_ep_destroy(r, ep);
}

// SPDX-License-Identifier: MIT
/*
 * The `rdma` transport: libibverbs RC queue pairs, one CQ per NIC (nic.c),
 * chains of RDMA WRITE/READ built by chain.c and posted with one
 * ibv_post_send each, on the QPs of the NIC pair nearest to the regions.
 *
 * Connection data travels in the broker's own handshake (conn.h), not
 * through librdmacm: see docs/rdma.md for why and for the state machine.
 *
 * Not thread-safe: the broker's loop owns a transport.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "rdma/rdma_priv.h"
#include "rdma/resolve.h"

static int rdma_tpriv_slot = -1;

int kvb_rdma_tpriv(void)
{
	return kvb_transport_tpriv_at(&rdma_tpriv_slot, &kvb_rdma_ops);
}

static int rdma_open(const struct kvb_transport_params *p,
		     struct kvb_transport **out, char *why, size_t why_len)
{
	struct kvb_rdma *r;
	int err;

	if (kvb_rdma_tpriv() < 0) {
		if (why && why_len)
			snprintf(why, why_len, "no kvb_mr.tpriv slot left");
		return -ENOSPC;
	}
	if (p->qp_per_peer > KVB_RDMA_MAX_QP || p->max_qps < 0)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->base.ops = &kvb_rdma_ops;
	r->p = *p;
	r->p.dev_name = NULL; /* not ours to keep */
	if (!r->p.sq_depth)
		r->p.sq_depth = KVB_RDMA_DEPTH_DEFAULT;
	if (r->p.qp_per_peer <= 0)
		r->p.qp_per_peer = 1;
	err = _kvb_rdma_nics_open(r, p->dev_name, why, why_len);
	if (err) {
		free(r);
		return err;
	}
	r->node = rand64();
	*out = &r->base;
	return 0;
}

static void rdma_close(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);

	while (r->eps)
		_kvb_rdma_ep_destroy(r, r->eps);
	free(r->orphan);
	_kvb_rdma_nics_close(r);
	free(r);
}

void _kvb_rdma_ready_push(struct kvb_rdma *r, struct kvb_rdma_qp *q)
{
	if (!q->on_ready && kvb_chain_ready(&q->ch)) {
		q->on_ready = 1;
		r->ready[r->nready++] = q;
	}
}

/* Route one work completion of NIC `nic` to its chain; returns 1 if it
 * failed live ops. */
static int wc_apply(struct kvb_rdma *r, unsigned nic, const struct ibv_wc *wc)
{
	uint16_t slot = kvb_chain_wr_id_qp(wc->wr_id);
	int32_t st = kvb_chain_wc_errno(wc->status);
	struct kvb_rdma_qp *q;
	uint64_t err_before;

	q = slot < KVB_RDMA_MAX_SLOTS ? r->slots[slot] : NULL;
	/* a QP destroyed since (QP numbers repeat across devices) */
	if (!q || !q->qp || q->lnic != nic || q->qp->qp_num != wc->qp_num)
		return 0;
	err_before = q->ch.st.wc_errors;
	kvb_chain_complete(&q->ch, wc->wr_id, st);
	_kvb_rdma_ready_push(r, q);
	if (q->ch.st.wc_errors != err_before) {
		r->base.stats.errors++;
		return 1;
	}
	return 0;
}

/*
 * Consume every CQE there is into the chains (nothing handed out). An
 * endpoint whose QP failed here is reset by its next post() or poll().
 */
void _kvb_rdma_cq_drain(struct kvb_rdma *r)
{
	/* its own buffer: rdma_poll's batch may still be in r->wc */
	struct ibv_wc wc[KVB_RDMA_POLL_BATCH];
	unsigned n;
	int k, i;

	for (n = 0; n < r->nnic; n++)
		while ((k = ibv_poll_cq(r->nics[n].cq, KVB_RDMA_POLL_BATCH,
					wc)) > 0) {
			r->base.stats.cqes += (uint64_t) k;
			for (i = 0; i < k; i++)
				wc_apply(r, n, &wc[i]);
		}
}

/* The QPs of ep a chain may take: on our NICs lmask, to the peer's rmask */
static inline int qp_in(const struct kvb_rdma_qp *q, uint32_t lmask,
			uint32_t rmask)
{
	return !q->parked && (lmask >> q->lnic & 1) && (rmask >> q->rnic & 1);
}

/*
 * The QP of ep (among those in the masks) that takes the next chain: one
 * with credit (not broken) with the fewest bytes in flight, ties going
 * round robin from ep->rr; NULL when none has credit. *sum and *usable:
 * the bytes in flight on the QPs with credit and their number.
 */
static struct kvb_rdma_qp *ep_pick(struct kvb_ep *ep, uint32_t lmask,
				   uint32_t rmask, uint64_t *sum,
				   unsigned *usable)
{
	struct kvb_rdma_qp *best = NULL;
	unsigned i, at = 0;

	*sum = 0;
	*usable = 0;
	for (i = 0; i < ep->nqp; i++) {
		unsigned k = (ep->rr + i) % ep->nqp;
		struct kvb_rdma_qp *q = &ep->qp[k];

		if (!qp_in(q, lmask, rmask) || !q->ch.credits || q->ch.broken)
			continue;
		*sum += q->ch.inflight_bytes;
		(*usable)++;
		if (!best || q->ch.inflight_bytes < best->ch.inflight_bytes) {
			best = q;
			at = k;
		}
	}
	if (best)
		ep->rr = (at + 1) % ep->nqp;
	return best;
}

/* The first QP in the masks from ep->rr on (to count a stall on), or NULL */
static struct kvb_rdma_qp *ep_first(struct kvb_ep *ep, uint32_t lmask,
				    uint32_t rmask)
{
	for (unsigned i = 0; i < ep->nqp; i++) {
		struct kvb_rdma_qp *q = &ep->qp[(ep->rr + i) % ep->nqp];

		if (qp_in(q, lmask, rmask))
			return q;
	}
	return NULL;
}

/* One doorbell of nwr WRs through q's NIC: the transport's and its
 * counters */
static void count_doorbell(struct kvb_rdma *r, struct kvb_rdma_qp *q,
			   unsigned nwr)
{
	struct kvb_rdma_nic *n = &r->nics[q->lnic];
	uint64_t bytes = kvb_chain_staged_bytes(&q->ch, nwr);

	kvb_stats_doorbell(&r->base.stats, nwr, bytes);
	n->doorbells++;
	n->wrs += nwr;
	n->bytes += bytes;
}

/* ibv_post_send of q's staged chain of nwr WRs with its wall time (stats
 * post_ns), and on a random 1 in 16 doorbells the thread's CPU time around
 * that (post_cpu_ns, post_cpu_wrs): the wall reads stay inside, so post_ns
 * is what it was without the CPU clock */
static int timed_post(struct kvb_rdma *r, struct kvb_rdma_qp *q, unsigned nwr,
		      struct ibv_send_wr **bad)
{
	int pick = kvb_post_cpu_pick(&r->pcpu);
	uint64_t c0 = pick ? kvb_thread_cpu_ns() : 0, t0 = now_ns();
	int err = ibv_post_send(q->qp, q->ch.wr, bad);

	r->base.stats.post_ns += now_ns() - t0;
	if (pick) {
		r->base.stats.post_cpu_ns += kvb_post_cpu_net(
			c0, kvb_thread_cpu_ns(), r->pcpu.ovh_ns);
		r->base.stats.post_cpu_wrs += nwr;
	}
	return err;
}

/* One chain of ops[0..n) on q, at most max_bytes (ops[0] always): the
 * ops it took (>= 1), 0 on no credit, or -errno as post() */
static int qp_post(struct kvb_rdma *r, struct kvb_rdma_qp *q,
		   const struct kvb_xop *ops, unsigned n, uint64_t max_bytes)
{
	struct ibv_send_wr *bad = NULL;
	uint64_t stalls;
	unsigned nwr, acc;
	int got, err;

	stalls = q->ch.st.credit_stalls;
	got = kvb_chain_build_max(&q->ch, ops, n, max_bytes);
	r->base.stats.credit_stalls += q->ch.st.credit_stalls - stalls;
	if (got <= 0)
		return got;

	nwr = q->ch.staged;
	if (r->time_posts)
		err = timed_post(r, q, nwr, &bad);
	else
		err = ibv_post_send(q->qp, q->ch.wr, &bad);
	if (!err) {
		count_doorbell(r, q, nwr);
		kvb_chain_commit(&q->ch, nwr);
		return got;
	}
	/*
	 * The hardware took the WRs before bad_wr. Credits make ENOMEM
	 * impossible, so this is a QP in a bad state: keep the prefix (it
	 * will complete), and force the QP to the error state because its
	 * last WR may be unsignaled; the flushes then retire it.
	 */
	nwr = bad ? (unsigned) (bad - q->ch.wr) : 0;
	if (nwr > q->ch.staged)
		nwr = 0;
	if (!nwr) {
		q->ch.staged = 0;
		return -err;
	}
	count_doorbell(r, q, nwr);
	acc = kvb_chain_commit(&q->ch, nwr);
	{
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

		ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
	}
	return (int) acc;
}

/*
 * Where an op goes (several NICs): L, our NIC its local region leaves
 * from (its home, or the nearest one up: moved); R, the peer's NIC of the
 * remote region; `allowed`, the peer's NICs we hold a key of it for.
 */
struct route {
	int L;
	unsigned R;
	uint32_t allowed;
	int moved;
};

static uint32_t up_mask(const struct kvb_rdma *r)
{
	uint32_t m = 0;

	for (unsigned i = 0; i < r->nnic; i++)
		if (nic_up(&r->nics[i]))
			m |= 1u << i;
	return m;
}

static void op_route(const struct kvb_rdma *r, const struct kvb_ep *ep,
		     const struct kvb_xop *op, struct route *rt)
{
	unsigned pn = ep->peer.nnic ? ep->peer.nnic : 1, nk = 0;

	rt->L = _kvb_rdma_mr_nic_use(r, op->local, &rt->moved);
	rt->R = op->remote.nic < pn ? op->remote.nic : 0;
	if (op->remote.rkeys)
		nk = op->remote.nrkeys < pn ? op->remote.nrkeys : pn;
	rt->allowed = (nk ? (1u << nk) - 1 : 0) | 1u << rt->R;
}

/* The ops from ops[0] on that go ops[0]'s way (at most RUN_MAX) */
static unsigned run_len(const struct kvb_rdma *r, const struct kvb_ep *ep,
			const struct kvb_xop *ops, unsigned n,
			const struct route *rt)
{
	unsigned k;

	for (k = 1; k < n && k < KVB_RDMA_RUN_MAX; k++) {
		struct route o;

		op_route(r, ep, &ops[k], &o);
		if (o.L != rt->L || o.R != rt->R || o.allowed != rt->allowed ||
		    o.moved != rt->moved)
			break;
	}
	return k;
}

static int ep_has(const struct kvb_ep *ep, uint32_t lmask, uint32_t rmask)
{
	for (unsigned i = 0; i < ep->nqp; i++)
		if (qp_in(&ep->qp[i], lmask, rmask))
			return 1;
	return 0;
}

/*
 * The QPs a run may take, nearest first: the pair (L, R); L to another
 * peer NIC we hold a key for; a NIC up to R (the only key we have may be
 * R's); any up to any allowed. A large run takes every pair up that can
 * carry it. -ENETDOWN when no QP of ep can.
 */
static int run_masks(const struct kvb_rdma *r, const struct kvb_ep *ep,
		     const struct route *rt, int large, uint32_t *lm,
		     uint32_t *rm)
{
	uint32_t up = up_mask(r), rr = 1u << rt->R;
	uint32_t l = rt->L < 0 ? 0 : 1u << rt->L;
	const uint32_t cand[4][2] = {
		{l, rr}, {l, rt->allowed}, {up, rr}, {up, rt->allowed}};

	if (rt->L < 0)
		return -ENETDOWN;
	for (unsigned i = large ? 3 : 0; i < 4; i++)
		if (ep_has(ep, cand[i][0], cand[i][1])) {
			*lm = cand[i][0];
			*rm = cand[i][1];
			return 0;
		}
	return -ENETDOWN;
}

/* ops[0..n) with the keys of q's NIC pair (the local region registered on
 * q's NIC, the remote one's key on the peer's) */
static const struct kvb_xop *xlate(struct kvb_rdma *r,
				   const struct kvb_rdma_qp *q,
				   const struct kvb_xop *ops, unsigned n)
{
	int slot = KVB_RDMA_TPRIV;

	for (unsigned i = 0; i < n; i++) {
		struct kvb_xop *x = &r->xops[i];
		struct kvb_rdma_reg *g;

		*x = ops[i];
		g = x->local ? x->local->tpriv[slot] : NULL;
		if (g)
			x->local = &g->on[q->lnic];
		if (x->remote.rkeys && x->remote.nrkeys > q->rnic)
			x->remote.rkey = x->remote.rkeys[q->rnic];
	}
	return r->xops;
}

/*
 * One run of ops going the same way, spread over the QPs its masks allow
 * so that their bytes in flight stay level: the QP with the fewest takes
 * ops up to the level (its in-flight bytes and the run's shared out
 * evenly), never less than KVB_RDMA_STRIPE_MIN, and the rest goes on to
 * the next pick. Soft-RoCE serves each QP on one kernel thread, a NIC
 * spreads QPs over its engines: one 5 MiB chain on one QP left the others
 * idle. Runs below the minimum (small blocks) stay whole, one doorbell.
 * Returns the ops taken or -errno.
 */
static int post_run(struct kvb_rdma *r, struct kvb_ep *ep,
		    const struct kvb_xop *ops, unsigned n,
		    const struct route *rt, int xl)
{
	uint64_t left = 0;
	uint32_t lm = ~0u, rm = ~0u;
	unsigned done = 0, i;
	int err;

	for (i = 0; i < n; i++)
		left += ops[i].len;
	if (xl) {
		err = run_masks(r, ep, rt, left >= KVB_RDMA_NIC_STRIPE_MIN, &lm,
				&rm);
		if (err)
			return err;
	}
	while (done < n) {
		uint64_t sum, level, cap = UINT64_MAX;
		unsigned usable;
		struct kvb_rdma_qp *q = ep_pick(ep, lm, rm, &sum, &usable);
		int got;

		if (!q) {
			if (done)
				break;
			/* no credit anywhere: build counts the stall */
			q = ep_first(ep, lm, rm);
			if (!q)
				return -ENETDOWN; /* every QP parked */
		} else if (usable > 1) {
			level = (sum + left) / usable;
			cap = level > q->ch.inflight_bytes
				      ? level - q->ch.inflight_bytes
				      : 0;
			if (cap < KVB_RDMA_STRIPE_MIN)
				cap = KVB_RDMA_STRIPE_MIN;
		}
		got = qp_post(r, q,
			      xl ? xlate(r, q, ops + done, n - done)
				 : ops + done,
			      n - done, cap);
		if (got < 0)
			return done ? (int) done : got;
		if (!got)
			break;
		if (rt->moved)
			r->nics[q->lnic].moved++;
		for (i = done; i < done + (unsigned) got; i++)
			left -= ops[i].len;
		done += (unsigned) got;
	}
	return (int) done;
}

/* -ENODEV when every NIC is dead, -ENETDOWN when none is up, else 0 */
static int nics_state(const struct kvb_rdma *r)
{
	unsigned i, dead = 0;

	for (i = 0; i < r->nnic; i++) {
		if (nic_up(&r->nics[i]))
			return 0;
		dead += r->nics[i].async.device_dead;
	}
	return dead == r->nnic ? -ENODEV : -ENETDOWN;
}

/*
 * post(): the ops in runs that go the same way (one NIC pair, see
 * run_masks; one run for a single NIC on both sides), each spread over
 * its QPs by post_run.
 */
static int rdma_post(struct kvb_transport *t, struct kvb_ep *ep,
		     const struct kvb_xop *ops, unsigned n)
{
	struct kvb_rdma *r = to_rdma(t);
	unsigned done = 0;
	int xl, err;

	if (!ep || !_kvb_rdma_ep_usable(r, ep))
		return -ENOTCONN;
	if (!n)
		return 0;
	err = nics_state(r); /* async.c keeps the port states */
	if (err)
		return err;
	xl = r->nnic > 1 || ep->peer.nnic > 1;
	while (done < n) {
		struct route rt = {0};
		unsigned run = n - done;
		int got;

		if (xl) {
			op_route(r, ep, &ops[done], &rt);
			run = run_len(r, ep, ops + done, run, &rt);
		}
		got = post_run(r, ep, ops + done, run, &rt, xl);
		if (got < 0)
			return done ? (int) done : got;
		done += (unsigned) got;
		if ((unsigned) got < run)
			break; /* out of credit */
	}
	return (int) done;
}

/* Hand out cookies retired in the chains. */
static unsigned reap_ready(struct kvb_rdma *r, struct kvb_xcqe *out,
			   unsigned max)
{
	unsigned n = 0, i = 0;

	while (i < r->nready && n < max) {
		struct kvb_rdma_qp *q = r->ready[i];

		n += kvb_chain_reap(&q->ch, out + n, max - n);
		if (!kvb_chain_ready(&q->ch)) {
			q->on_ready = 0;
			r->ready[i] = r->ready[--r->nready];
		} else {
			i++;
		}
	}
	return n;
}

/* Read the completion events that came; ack them in batches. */
static void events_read(struct kvb_rdma_nic *n)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(n->chan, &cq, &ctx) == 0) {
		n->unacked++;
		n->armed = 0;
	}
	if (n->unacked >= 64) {
		ibv_ack_cq_events(n->cq, n->unacked);
		n->unacked = 0;
	}
}

/* NIC `nic`'s CQ into out (up to max); how many, or -EIO */
static int poll_nic(struct kvb_rdma *r, unsigned nic, struct kvb_xcqe *out,
		    unsigned max)
{
	struct kvb_ep *bad[KVB_RDMA_POLL_BATCH];
	unsigned n = 0, nbad;
	int k, i;

	while (n < max) {
		k = ibv_poll_cq(r->nics[nic].cq, KVB_RDMA_POLL_BATCH, r->wc);
		if (k < 0)
			return n ? (int) n : -EIO;
		if (!k)
			break;
		r->base.stats.cqes += (uint64_t) k;
		/*
		 * Apply the whole batch before resetting an endpoint whose QP
		 * failed: the reset drains the CQ and quiesces the endpoint's
		 * other QPs, and a CQE of this batch not applied yet (another
		 * endpoint's success, a sibling QP's) would be lost to it.
		 */
		nbad = 0;
		for (i = 0; i < k; i++) {
			const struct ibv_wc *wc = &r->wc[i];
			struct kvb_ep *ep;
			unsigned j;

			if (!wc_apply(r, nic, wc))
				continue;
			ep = r->slots[kvb_chain_wr_id_qp(wc->wr_id)]->ep;
			for (j = 0; j < nbad && bad[j] != ep; j++)
				;
			if (j == nbad)
				bad[nbad++] = ep;
		}
		/* fail the rest, reset, wait for the peer */
		for (unsigned j = 0; j < nbad; j++)
			_kvb_rdma_ep_usable(r, bad[j]);
		n += reap_ready(r, out + n, max - n);
	}
	return (int) n;
}

static int rdma_poll(struct kvb_transport *t, struct kvb_xcqe *out,
		     unsigned max)
{
	struct kvb_rdma *r = to_rdma(t);
	unsigned n = 0, i;
	int k;

	while (n < max && r->orphan_head < r->norphan)
		out[n++] = r->orphan[r->orphan_head++];
	n += reap_ready(r, out + n, max - n);
	for (i = 0; i < r->nnic && n < max; i++) {
		k = poll_nic(r, i, out + n, max - n);
		if (k < 0)
			return n ? (int) n : k;
		n += (unsigned) k;
	}
	if (r->reconnect_due)
		_kvb_rdma_reconnect_idle(r);
	return (int) n;
}

int kvb_rdma_qp_stats(struct kvb_transport *t, struct kvb_ep *ep, unsigned i,
		      struct kvb_rdma_qp_stats *out)
{
	const struct kvb_rdma_qp *q;

	(void) t;
	if (!ep || i >= ep->nqp)
		return -ENOENT;
	q = &ep->qp[i];
	out->qpn = q->qp ? q->qp->qp_num : 0;
	out->credits = q->ch.credits;
	out->depth = q->ch.p.depth;
	out->in_flight = q->ch.head - q->ch.done;
	out->chain = q->ch.st;
	out->lnic = q->lnic;
	out->rnic = q->rnic;
	return 0;
}

void kvb_rdma_time_posts(struct kvb_transport *t, int on)
{
	if (on)
		kvb_post_cpu_calibrate(&to_rdma(t)->pcpu,
				       now_ns() ^ (uintptr_t) t);
	to_rdma(t)->time_posts = on;
}

uint64_t kvb_rdma_post_ns(struct kvb_transport *t)
{
	return t->stats.post_ns;
}

static int rdma_wait_fd(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);

	if (r->nnic > 1)
		return r->wait_epfd;
	return r->nics[0].chan ? r->nics[0].chan->fd : -1;
}

/*
 * The caller is about to sleep on wait_fd(): ask for an event at the next
 * completion on every NIC (unless one is asked for and has not come), then
 * take what the CQs already hold: a completion that landed before the
 * request has no event of its own. Returns 1 when completions wait for
 * poll(), else 0 (also without a channel, or when the request fails: then
 * only the caller's polls, every 1 ms while work is in flight, reap).
 */
static int rdma_arm(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);
	uint64_t cqes = r->base.stats.cqes;

	for (unsigned i = 0; i < r->nnic; i++) {
		struct kvb_rdma_nic *n = &r->nics[i];

		if (!n->chan)
			continue;
		events_read(n);
		if (!n->armed && !ibv_req_notify_cq(n->cq, 0))
			n->armed = 1;
	}
	_kvb_rdma_cq_drain(r);
	return r->base.stats.cqes != cqes || r->nready ||
	       r->orphan_head < r->norphan;
}

const struct kvb_transport_ops kvb_rdma_ops = {
	.name = "rdma",
	.open = rdma_open,
	.close = rdma_close,
	.reg_mr = _kvb_rdma_reg_mr,
	.dereg_mr = _kvb_rdma_dereg_mr,
	.local_info = _kvb_rdma_local_info,
	.connect = _kvb_rdma_connect,
	.disconnect = _kvb_rdma_disconnect,
	.post = rdma_post,
	.poll = rdma_poll,
	.wait_fd = rdma_wait_fd,
	.arm = rdma_arm,
	.ep_info = kvb_rdma_ep_info,
	.ep_state = kvb_rdma_ep_state,
	.reg_dmabuf = kvb_rdma_reg_dmabuf,
	.events_fd = kvb_rdma_async_fd,
	.events = kvb_rdma_async_service,
	.time_posts = kvb_rdma_time_posts,
	.stats_format = kvb_rdma_stats_format,
	.resolve = kvb_rdma_resolve_op,
	.nics = _kvb_rdma_nics,
	.mr_nic = _kvb_rdma_mr_nic,
	.mr_keys = _kvb_rdma_mr_keys,
};

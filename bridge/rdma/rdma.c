// SPDX-License-Identifier: MIT
/*
 * The `rdma` transport: libibverbs RC queue pairs, one shared CQ, chains of
 * RDMA WRITE/READ built by chain.c and posted with one ibv_post_send each.
 *
 * Connection data travels in the broker's own handshake (conn.h), not
 * through librdmacm: see docs/rdma.md for why and for the state machine.
 *
 * Not thread-safe: the broker's loop owns a transport.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "rdma/rdma_priv.h"
#include "rdma/resolve.h"

static int fd_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* "<what><dev>" into the caller's buffer, if any. */
static void set_why(char *why, size_t len, const char *what, const char *dev)
{
	if (why && len)
		snprintf(why, len, "%s%s", what, dev ? dev : "");
}

/*
 * With gid_index < 0, pick the first RoCE v2 GID holding an IPv4-mapped
 * address (routable, what rxe and most RoCE fabrics use), else index 0.
 */
static int pick_gid(struct kvb_rdma *r, int port)
{
	static const uint8_t v4map[12] = {0, 0, 0, 0, 0,    0,
					  0, 0, 0, 0, 0xff, 0xff};
	union ibv_gid g;
	int i;

	if (r->p.gid_index >= 0)
		return r->p.gid_index;
	if (r->port.link_layer != IBV_LINK_LAYER_ETHERNET)
		return 0;
	for (i = 0; i < r->port.gid_tbl_len && i < 256; i++) {
		struct ibv_gid_entry e;

		if (ibv_query_gid_ex(r->ctx, (uint32_t) port, (uint32_t) i, &e,
				     0))
			continue;
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		memcpy(&g, &e.gid, sizeof(g));
		if (!memcmp(g.raw, v4map, sizeof(v4map)))
			return i;
	}
	return 0;
}

static int rdma_tpriv_slot = -1;

int kvb_rdma_tpriv(void)
{
	return kvb_transport_tpriv_at(&rdma_tpriv_slot, &kvb_rdma_ops);
}

static int rdma_open(const struct kvb_transport_params *p,
		     struct kvb_transport **out, char *why, size_t why_len)
{
	struct ibv_device **list;
	struct ibv_device *dev = NULL;
	struct kvb_rdma *r;
	int i, n = 0, err, port;

	if (kvb_rdma_tpriv() < 0) {
		if (why && why_len)
			snprintf(why, why_len, "no kvb_mr.tpriv slot left");
		return -ENOSPC;
	}
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
	if (r->p.qp_per_peer > KVB_RDMA_MAX_QP) {
		err = -EINVAL;
		goto err_free;
	}
	port = p->ib_port > 0 ? p->ib_port : 1;

	list = ibv_get_device_list(&n);
	if (!list || !n) {
		set_why(why, why_len, "no RDMA device", NULL);
		err = -ENODEV;
		goto err_list;
	}
	for (i = 0; i < n; i++)
		if (!p->dev_name ||
		    !strcmp(ibv_get_device_name(list[i]), p->dev_name)) {
			dev = list[i];
			break;
		}
	if (!dev) {
		set_why(why, why_len, "no RDMA device named ", p->dev_name);
		err = -ENODEV;
		goto err_list;
	}
	r->ctx = ibv_open_device(dev);
	if (!r->ctx) {
		err = errno ? -errno : -ENODEV;
		set_why(why, why_len, "cannot open ", ibv_get_device_name(dev));
		goto err_list;
	}
	err = ibv_query_device(r->ctx, &r->dev);
	if (err) {
		err = -err;
		goto err_ctx;
	}
	err = ibv_query_port(r->ctx, (uint8_t) port, &r->port);
	if (err) {
		err = -err;
		set_why(why, why_len, "cannot query the port of ",
			ibv_get_device_name(dev));
		goto err_ctx;
	}
	if (r->port.state != IBV_PORT_ACTIVE) {
		set_why(why, why_len, "port not active on ",
			ibv_get_device_name(dev));
		err = -ENODEV;
		goto err_ctx;
	}
	r->p.ib_port = port;
	r->p.gid_index = pick_gid(r, port);
	err = ibv_query_gid(r->ctx, (uint8_t) port, r->p.gid_index, &r->gid);
	if (err) {
		err = -EINVAL;
		goto err_ctx;
	}
	if (r->p.sq_depth > (uint32_t) r->dev.max_qp_wr)
		r->p.sq_depth = (uint32_t) r->dev.max_qp_wr;

	r->pd = ibv_alloc_pd(r->ctx);
	if (!r->pd) {
		err = errno ? -errno : -ENOMEM;
		goto err_ctx;
	}
	r->cq_size = r->dev.max_cqe < KVB_RDMA_CQ_MAX ? r->dev.max_cqe
						      : KVB_RDMA_CQ_MAX;
	/* no channel (or no non-blocking fd): poll without wait_fd() */
	r->chan = ibv_create_comp_channel(r->ctx);
	if (r->chan && fd_nonblock(r->chan->fd)) {
		ibv_destroy_comp_channel(r->chan);
		r->chan = NULL;
	}
	r->cq = ibv_create_cq(r->ctx, r->cq_size, NULL, r->chan, 0);
	if (!r->cq) {
		err = errno ? -errno : -ENOMEM;
		goto err_chan;
	}
	/* device events (port down, QP errors) for kvb_rdma_async_service */
	r->async_nb = fd_nonblock(r->ctx->async_fd) == 0;
	r->node = rand64();
	ibv_free_device_list(list);
	*out = &r->base;
	return 0;

err_chan:
	if (r->chan)
		ibv_destroy_comp_channel(r->chan);
	ibv_dealloc_pd(r->pd);
err_ctx:
	ibv_close_device(r->ctx);
err_list:
	if (list)
		ibv_free_device_list(list);
err_free:
	free(r);
	return err;
}

static void rdma_close(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);

	while (r->eps)
		_kvb_rdma_ep_destroy(r, r->eps);
	free(r->orphan);
	/* ibv_destroy_cq waits until every event read has been acked */
	if (r->unacked)
		ibv_ack_cq_events(r->cq, r->unacked);
	ibv_destroy_cq(r->cq);
	if (r->chan)
		ibv_destroy_comp_channel(r->chan);
	/* Fails (EBUSY) if the broker left regions registered; nothing to do.
	 */
	ibv_dealloc_pd(r->pd);
	ibv_close_device(r->ctx);
	free(r);
}

/*
 * The access a region is registered with: LOCAL_WRITE always (the sink of
 * our own READs, and REMOTE_WRITE needs it), REMOTE_WRITE / REMOTE_READ only
 * where its KVB_MEM_REMOTE_* flags grant them. A region offered to nobody
 * then has no remote access at all: a peer that guesses its rkey gets a
 * remote access error, not the bytes.
 */
static int mr_access(const struct kvb_mr *mr)
{
	int access = IBV_ACCESS_LOCAL_WRITE;

	if (mr->flags & KVB_MEM_REMOTE_WRITE)
		access |= IBV_ACCESS_REMOTE_WRITE;
	if (mr->flags & KVB_MEM_REMOTE_READ)
		access |= IBV_ACCESS_REMOTE_READ;
	return access;
}

static void mr_store(struct kvb_mr *mr, struct ibv_mr *imr)
{
	mr->tpriv[KVB_RDMA_TPRIV] = imr;
	mr->lkey = imr->lkey;
	mr->rkey = imr->rkey;
}

static int rdma_reg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct kvb_rdma *r = to_rdma(t);
	struct ibv_mr *imr;

	if (mr->tpriv[KVB_RDMA_TPRIV])
		return -EBUSY;
	if (!mr->addr || !mr->len)
		return -EINVAL;
	imr = ibv_reg_mr(r->pd, mr->addr, mr->len, mr_access(mr));
	if (!imr)
		return errno ? -errno : -ENOMEM;
	mr_store(mr, imr);
	return 0;
}

int kvb_rdma_reg_dmabuf(struct kvb_transport *t, struct kvb_mr *mr, int fd,
			uint64_t offset)
{
	struct kvb_rdma *r = to_rdma(t);
	struct ibv_mr *imr;
	int rc;

	if (mr->tpriv[KVB_RDMA_TPRIV])
		return -EBUSY;
	if (!mr->len)
		return -EINVAL;
	if (fd >= 0) {
		imr = ibv_reg_dmabuf_mr(r->pd, offset, mr->len,
					(uint64_t) (uintptr_t) mr->addr, fd,
					mr_access(mr));
		if (imr) {
			mr_store(mr, imr);
			return 0;
		}
		if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL &&
		    errno != EPROTONOSUPPORT)
			return errno ? -errno : -ENOMEM;
	}
	rc = rdma_reg_mr(t, mr);
	return rc ? rc : 1;
}

static void rdma_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct ibv_mr *imr = mr->tpriv[KVB_RDMA_TPRIV];

	if (!imr)
		return;
	ibv_dereg_mr(imr);
	mr->tpriv[KVB_RDMA_TPRIV] = NULL;
	mr->lkey = 0;
	mr->rkey = 0;
}

void _kvb_rdma_ready_push(struct kvb_rdma *r, struct kvb_rdma_qp *q)
{
	if (!q->on_ready && kvb_chain_ready(&q->ch)) {
		q->on_ready = 1;
		r->ready[r->nready++] = q;
	}
}

/* Route one work completion to its chain; returns 1 if it failed live ops. */
static int wc_apply(struct kvb_rdma *r, const struct ibv_wc *wc)
{
	uint16_t slot = kvb_chain_wr_id_qp(wc->wr_id);
	int32_t st = kvb_chain_wc_errno(wc->status);
	struct kvb_rdma_qp *q;
	uint64_t err_before;

	q = slot < KVB_RDMA_MAX_SLOTS ? r->slots[slot] : NULL;
	if (!q || !q->qp || q->qp->qp_num != wc->qp_num)
		return 0; /* a QP destroyed since */
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
	int k, i;

	while ((k = ibv_poll_cq(r->cq, KVB_RDMA_POLL_BATCH, wc)) > 0) {
		r->base.stats.cqes += (uint64_t) k;
		for (i = 0; i < k; i++)
			wc_apply(r, &wc[i]);
	}
}

/*
 * The QP of ep that takes the next chain: one with credit (not broken)
 * with the fewest bytes in flight, ties going round robin from ep->rr;
 * NULL when none has credit. *sum and *usable: the bytes in flight on
 * the QPs with credit and their number.
 */
static struct kvb_rdma_qp *ep_pick(struct kvb_ep *ep, uint64_t *sum,
				   unsigned *usable)
{
	struct kvb_rdma_qp *best = NULL;
	unsigned i, at = 0;

	*sum = 0;
	*usable = 0;
	for (i = 0; i < ep->nqp; i++) {
		unsigned k = (ep->rr + i) % ep->nqp;
		struct kvb_rdma_qp *q = &ep->qp[k];

		if (!q->ch.credits || q->ch.broken)
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
	if (r->time_posts) {
		uint64_t t0 = now_ns();

		err = ibv_post_send(q->qp, q->ch.wr, &bad);
		r->base.stats.post_ns += now_ns() - t0;
	} else {
		err = ibv_post_send(q->qp, q->ch.wr, &bad);
	}
	if (!err) {
		kvb_stats_doorbell(&r->base.stats, nwr,
				   kvb_chain_staged_bytes(&q->ch, nwr));
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
	kvb_stats_doorbell(&r->base.stats, nwr,
			   kvb_chain_staged_bytes(&q->ch, nwr));
	acc = kvb_chain_commit(&q->ch, nwr);
	{
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

		ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
	}
	return (int) acc;
}

/*
 * With several QPs per peer, a chain is spread so that their bytes in
 * flight stay level: the QP with the fewest takes ops up to the level
 * (its in-flight bytes and the chain's shared out evenly), never less than
 * KVB_RDMA_STRIPE_MIN, and the rest goes on to the next pick. Soft-RoCE
 * serves each QP on one kernel thread, a NIC spreads QPs over its engines:
 * one 5 MiB chain on one QP left the others idle. Chains below the minimum
 * (small blocks) stay whole, one doorbell.
 */
static int rdma_post(struct kvb_transport *t, struct kvb_ep *ep,
		     const struct kvb_xop *ops, unsigned n)
{
	struct kvb_rdma *r = to_rdma(t);
	uint64_t left = 0;
	unsigned done = 0, i;

	if (!ep || !_kvb_rdma_ep_usable(r, ep))
		return -ENOTCONN;
	if (!n)
		return 0;
	if (r->async.device_dead || r->async.port_down) /* async.c */
		return r->async.device_dead ? -ENODEV : -ENETDOWN;
	if (ep->nqp > 1)
		for (i = 0; i < n; i++)
			left += ops[i].len;
	while (done < n) {
		uint64_t sum, level, cap = UINT64_MAX;
		unsigned usable;
		struct kvb_rdma_qp *q = ep_pick(ep, &sum, &usable);
		int got;

		if (!q) {
			if (done)
				break;
			/* no credit anywhere: build counts the stall */
			q = &ep->qp[ep->rr % ep->nqp];
		} else if (ep->nqp > 1) {
			level = (sum + left) / usable;
			cap = level > q->ch.inflight_bytes
				      ? level - q->ch.inflight_bytes
				      : 0;
			if (cap < KVB_RDMA_STRIPE_MIN)
				cap = KVB_RDMA_STRIPE_MIN;
		}
		got = qp_post(r, q, ops + done, n - done, cap);
		if (got < 0)
			return done ? (int) done : got;
		if (!got)
			break;
		for (i = done; i < done + (unsigned) got; i++)
			left -= ep->nqp > 1 ? ops[i].len : 0;
		done += (unsigned) got;
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
static void events_read(struct kvb_rdma *r)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(r->chan, &cq, &ctx) == 0) {
		r->unacked++;
		r->armed = 0;
	}
	if (r->unacked >= 64) {
		ibv_ack_cq_events(r->cq, r->unacked);
		r->unacked = 0;
	}
}

static int rdma_poll(struct kvb_transport *t, struct kvb_xcqe *out,
		     unsigned max)
{
	struct kvb_ep *bad[KVB_RDMA_POLL_BATCH];
	struct kvb_rdma *r = to_rdma(t);
	unsigned n, nbad;
	int k, i;

	n = 0;
	while (n < max && r->orphan_head < r->norphan)
		out[n++] = r->orphan[r->orphan_head++];
	n += reap_ready(r, out + n, max - n);
	while (n < max) {
		k = ibv_poll_cq(r->cq, KVB_RDMA_POLL_BATCH, r->wc);
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

			if (!wc_apply(r, wc))
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
	return 0;
}

void kvb_rdma_time_posts(struct kvb_transport *t, int on)
{
	to_rdma(t)->time_posts = on;
}

uint64_t kvb_rdma_post_ns(struct kvb_transport *t)
{
	return t->stats.post_ns;
}

static int rdma_wait_fd(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);

	return r->chan ? r->chan->fd : -1;
}

/*
 * The caller is about to sleep on wait_fd(): ask for an event at the next
 * completion (unless one is asked for and has not come), then take what
 * the CQ already holds: a completion that landed before the request has
 * no event of its own. Returns 1 when completions wait for poll(), else 0
 * (also without a channel, or when the request fails: then only the
 * caller's polls, every 1 ms while work is in flight, reap).
 */
static int rdma_arm(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);
	uint64_t cqes = r->base.stats.cqes;

	if (r->chan) {
		events_read(r);
		if (!r->armed && !ibv_req_notify_cq(r->cq, 0))
			r->armed = 1;
	}
	_kvb_rdma_cq_drain(r);
	return r->base.stats.cqes != cqes || r->nready ||
	       r->orphan_head < r->norphan;
}

const struct kvb_transport_ops kvb_rdma_ops = {
	.name = "rdma",
	.open = rdma_open,
	.close = rdma_close,
	.reg_mr = rdma_reg_mr,
	.dereg_mr = rdma_dereg_mr,
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
};

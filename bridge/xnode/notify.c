/* SPDX-License-Identifier: MIT */
/* Cross-node: MoRIIO notify messages received on the workers' notify ports
 * (remote_blocks, release, write_done, plain strings) and the ports
 * themselves (see xnode.c). */
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
#include "zmq/blocks.h"
#include "zmq/codec.h"
#include "zmq/handshake.h"
#include "zmq/notify.h"

/* ------------------------------------------------------------------ */
/* notify messages */

static int reject(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_zmsg *m, int rc, const char *why)
{
	/* counted and logged once, rate-limited, by the notify endpoint
	 * that called on_notify (messages_rejected) */
	(void) m;
	kvb_xn_of(b)->st.rejected++;
	kvb_notify_reject_why(kvb_xn_notify(b, w), why);
	return rc;
}

static struct kvb_xfer *find_or_terminal(struct kvb_broker *b,
					 struct kvb_worker *w,
					 const struct kvb_zmsg *m, int *rc)
{
	size_t n = strlen(m->transfer_id);
	struct kvb_xfer *x = kvb_xfer_find(&b->xfers, w->id, m->transfer_id, n);

	*rc = 0;
	if (!x && kvb_xfer_is_terminal(&b->xfers, w->id,
				       kvb_xfer_hash(w->id, m->transfer_id, n)))
		*rc = -ESTALE;
	return x;
}

/* The unopened transfer a FIFO entry names, or NULL (opened or ended). */
static struct kvb_xfer *ufifo_xfer(struct kvb_broker *b, uint32_t i)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_xfer *x;

	i &= UNOPENED_FIFO - 1;
	x = kvb_xfer_get(&b->xfers, xn->ufifo[i].handle, xn->ufifo[i].worker);
	return x && x->rx && x->rx->unopened ? x : NULL;
}

/*
 * End the oldest unopened transfers until at most `keep` remain, or until
 * `ids` block ids fit under UNOPENED_IDS_ALL. 0, or -ENOSPC when none is
 * left to end.
 */
static int unopened_evict(struct kvb_broker *b, uint32_t keep, uint64_t ids)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	while (xn->nunopened > keep ||
	       xn->unopened_ids + ids > UNOPENED_IDS_ALL) {
		struct kvb_xfer *x = NULL;

		while (xn->ufifo_head != xn->ufifo_tail &&
		       !(x = ufifo_xfer(b, xn->ufifo_head++)))
			;
		if (!x)
			return -ENOSPC;
		xn->st.unopened_evicted++;
		if (kvb_xn_rlog_ok(xn))
			log_warn("transfer '%s' dropped: announced by a "
				 "message, "
				 "not opened by worker %u, and the oldest of "
				 "%u such (a flood of notify messages?)",
				 x->id, x->worker, xn->nunopened);
		/* -ECANCELED: no line of its own per transfer */
		kvb_xfer_finish(b, x, -ECANCELED);
	}
	return 0;
}

/* Remember an unopened transfer; 0 or -ENOSPC. */
static int ufifo_push(struct kvb_xn *xn, uint32_t handle, uint32_t worker)
{
	if (!xn->ufifo) {
		xn->ufifo = calloc(UNOPENED_FIFO, sizeof(*xn->ufifo));
		if (!xn->ufifo)
			return -ENOSPC;
	}
	if (xn->ufifo_tail - xn->ufifo_head == UNOPENED_FIFO) {
		/* full of entries opened or ended since: keep the live ones */
		uint32_t j = xn->ufifo_head;

		for (uint32_t i = xn->ufifo_head; i != xn->ufifo_tail; i++)
			if (ufifo_xfer(xn->b, i))
				xn->ufifo[j++ & (UNOPENED_FIFO - 1)] =
					xn->ufifo[i & (UNOPENED_FIFO - 1)];
		xn->ufifo_tail = j;
		if (j - xn->ufifo_head == UNOPENED_FIFO)
			return -ENOSPC; /* cannot be: at most UNOPENED_MAX */
	}
	xn->ufifo[xn->ufifo_tail & (UNOPENED_FIFO - 1)].handle = handle;
	xn->ufifo[xn->ufifo_tail & (UNOPENED_FIFO - 1)].worker = worker;
	xn->ufifo_tail++;
	return 0;
}

/*
 * A cross-node transfer that a message names before its worker opened it
 * (WRITE mode): kept, not opened, until the worker opens it or timeout_ms
 * passes. NULL on failure, the message then rejected and *err what the
 * handler returns (-ENOMEM as such: nothing wrong with the message).
 */
static struct kvb_xfer *unopened_xfer(struct kvb_broker *b,
				      struct kvb_worker *w,
				      const struct kvb_zmsg *m, uint8_t role,
				      uint32_t timeout_ms, int *err)
{
	static const char full[] = "too many transfers not opened yet";
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_xfer *x;
	int rc = 0;

	/* anyone may send to a notify port: keep room for workers' opens.
	 * At the cap the oldest such transfer goes (a flood that ended
	 * does not keep out the announcements that follow it) */
	if (xn->nunopened >= UNOPENED_MAX &&
	    unopened_evict(b, UNOPENED_MAX - 1, 0)) {
		*err = reject(b, w, m, -ENOSPC, full);
		return NULL;
	}
	x = kvb_xfer_open(&b->xfers, w->id, m->transfer_id,
			  strlen(m->transfer_id),
			  kvb_now_ns() + (int64_t) timeout_ms * 1000000, &rc);
	if (!x) {
		*err = reject(b, w, m, rc,
			      rc == -ESTALE   ? "the transfer already ended"
			      : rc == -ENOSPC ? "transfer table full"
					      : "bad transfer id");
		return NULL;
	}
	x->rx = calloc(1, sizeof(*x->rx));
	if (!x->rx) {
		kvb_xfer_end(&b->xfers, x);
		*err = -ENOMEM;
		return NULL;
	}
	x->rx->role = role;
	x->rx->mode = KVB_XFER_WRITE;
	x->rx->unopened = 1;
	xn->nunopened++;
	if (ufifo_push(xn, kvb_xfer_handle(&b->xfers, x), w->id)) {
		/* no slot to remember it by: do not keep it either */
		kvb_xfer_finish(b, x, -ECANCELED);
		*err = reject(b, w, m, -ENOSPC, full);
		return NULL;
	}
	return x;
}

static int p_remote_blocks(struct kvb_broker *b, struct kvb_worker *w,
			   const struct kvb_zmsg *m)
{
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	struct kvb_peer *p;
	int rc, err = 0;

	kvb_xn_of(b)->st.remote_blocks_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc) {
		/* D waits for this transfer's end: say it ended here */
		kvb_xn_live_tell_ended(b, w, m->transfer_id, m->decode_rank);
		return reject(b, w, m, rc, "the transfer already ended");
	}
	if (!x) { /* before P opened it: keep the blocks until it does */
		if (m->nblocks > UNOPENED_IDS ||
		    unopened_evict(b, UINT32_MAX, m->nblocks))
			return reject(b, w, m, -ENOSPC,
				      "too many block ids for a transfer not "
				      "opened yet");
		enum kvb_xn_expected e = kvb_xn_expected(
			b, w, m->transfer_id, strlen(m->transfer_id));

		x = unopened_xfer(
			b, w, m, KVB_ROLE_P,
			e == XN_EXPECT_UNKNOWN	   ? b->opt.unknown_timeout_ms
			: e == XN_EXPECT_WITHDRAWN ? 0
						   : b->opt.unopened_timeout_ms,
			&err);
		if (!x)
			return err;
		x->rx->unknown = e == XN_EXPECT_UNKNOWN;
		x->rx->withdrawn = e == XN_EXPECT_WITHDRAWN;
		/* its sender (a handshaken peer) hears kvb_write_failed if
		 * no worker opens it in time, and its loss ends it */
		x->rx->peer = kvb_xn_live_sender(kvb_xn_of(b));
	}
	rx = x->rx;
	if (!rx)
		return reject(b, w, m, -EINVAL,
			      "the id names a same-node transfer");
	if (rx->mode != KVB_XFER_WRITE)
		return reject(b, w, m, -EPROTO,
			      "remote_blocks for a READ-mode transfer");
	if (rx->have_rblocks) {
		if (rx->nrb == m->nblocks &&
		    !memcmp(rx->rb, m->blocks, m->nblocks * sizeof(*m->blocks)))
			return 0; /* the same again: harmless */
		return reject(b, w, m, -EEXIST,
			      "remote_blocks already received with other "
			      "blocks");
	}
	/* fewer: D had the first blocks in its prefix cache, P writes its
	 * last ones (end-trim) */
	if (x->opened && rx->nlb < m->nblocks)
		return reject(b, w, m, -EINVAL,
			      "block_notify_list longer than P's blocks");
	p = kvb_xn_peer_get(kvb_xn_of(b), rx->peer);
	if (x->opened && p && p->have_desc) {
		const struct kvb_hs_worker *hw = NULL;

		for (uint32_t i = 0; i < p->desc.nworkers && !hw; i++)
			if (p->desc.workers[i].role == KVB_HS_ROLE_D &&
			    p->desc.workers[i].dp_rank == m->decode_rank &&
			    p->desc.workers[i].nregions)
				hw = &p->desc.workers[i];
		if (hw) {
			uint32_t nb = hw->regions[0].geom.num_blocks;

			for (uint32_t i = 0; i < m->nblocks; i++)
				if (m->blocks[i] >= nb)
					return reject(b, w, m, -ERANGE,
						      "a block id is past the "
						      "peer's num_blocks");
		}
	}
	rx->rb = kvb_xn_copy_ids(m->blocks, m->nblocks);
	if (!rx->rb)
		return -ENOMEM;
	rx->nrb = m->nblocks;
	if (rx->unopened)
		kvb_xn_of(b)->unopened_ids += rx->nrb;
	rx->remote_dp = m->decode_rank;
	rx->have_rblocks = 1;
	if (x->opened && rx->ndef)
		kvb_xn_issue_deferred(b, x);
	return 0;
}

static int p_release(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_zmsg *m)
{
	struct kvb_xfer *x;
	struct kvb_rxfer *rx;
	int rc, err = 0;

	kvb_xn_of(b)->st.releases_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc)
		return reject(b, w, m, rc, "the transfer already ended");
	if (m->type == KVB_ZMSG_RELEASE &&
	    (m->flags & KVB_ZMSG_F_CONSUMER_TP) &&
	    kvb_tp_release_acks(w->tp_size, m->consumer_tp_size) < 0)
		return reject(b, w, m, -EINVAL,
			      "consumer_tp_size is not a multiple or divisor "
			      "of this TP size");
	if (!x) { /* abort before P opened it: remember it as ended */
		x = kvb_xfer_open(&b->xfers, w->id, m->transfer_id,
				  strlen(m->transfer_id), 0, &err);
		if (x)
			kvb_xfer_end(&b->xfers, x);
		return 0;
	}
	rx = x->rx;
	if (!rx)
		return reject(b, w, m, -EINVAL,
			      "the id names a same-node transfer");
	if (rx->mode == KVB_XFER_WRITE) {
		log_info("transfer '%s' released (aborted) by the peer", x->id);
		rx->peer_released = 1; /* no kvb_write_failed back to it */
		kvb_xfer_finish(b, x, -ECANCELED);
		return 0;
	}
	if (m->type == KVB_ZMSG_RELEASE && (m->flags & KVB_ZMSG_F_CONSUMER_TP))
		rx->acks_needed = (uint32_t) kvb_tp_release_acks(
			w->tp_size, m->consumer_tp_size);
	if (m->type == KVB_ZMSG_PLAIN && (m->flags & KVB_ZMSG_F_TP_RANK) &&
	    m->tp_rank < 64) {
		/* "<id>:tp<r>" names the D rank: one ACK per rank */
		if (rx->acked_ranks & (1ull << m->tp_rank))
			return reject(b, w, m, -EALREADY,
				      "a second release from the same D rank");
		rx->acked_ranks |= 1ull << m->tp_rank;
	}
	rx->acks_got++;
	kvb_xfer_maybe_finish(b, x);
	return 0;
}

/* write_done (or plain), and kvb_write_failed: one P writer is done, or
 * failed with m->status (then the transfer fails with the first one). */
static int d_write_done(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_zmsg *m)
{
	int failed = m->type == KVB_ZMSG_WRITE_FAILED;
	struct kvb_xfer *x;
	int rc;

	if (failed)
		kvb_xn_of(b)->st.write_failed_rx++;
	else
		kvb_xn_of(b)->st.write_done_rx++;
	x = find_or_terminal(b, w, m, &rc);
	if (rc)
		return reject(b, w, m, rc, "the transfer already ended");
	if (!x) {
		/* another D rank of this node announced it and P wrote every
		 * rank before this one opened: keep the count until it does
		 * (it expires after the transfer timeout if it never does) */
		int err = 0;

		x = unopened_xfer(b, w, m, KVB_ROLE_D,
				  b->opt.transfer_timeout_ms, &err);
		if (!x)
			return err;
	}
	if (!x->rx)
		return reject(b, w, m, -ENOENT,
			      "the id names a same-node transfer");
	if (x->rx->mode != KVB_XFER_WRITE)
		return reject(b, w, m, -EPROTO,
			      "write_done for a READ-mode transfer");
	if (failed && kvb_xn_rlog_ok(kvb_xn_of(b)))
		log_warn("transfer '%s': the P side's writes failed (%s)",
			 x->id, strerror(-m->status));
	kvb_xfer_peer_done(b, x, failed ? m->status : 0);
	return 0;
}

static int on_notify(void *arg, const struct kvb_zmsg *m, uint16_t port)
{
	const struct kvb_xn_wctx *c = arg;
	struct kvb_broker *b = c->xn->b;
	struct kvb_worker *w = kvb_worker_by_id(b, c->wid);

	if (!w || !w->attached)
		return -ENXIO;
	if (w->role == KVB_ROLE_P) {
		switch (m->type) {
		case KVB_ZMSG_REMOTE_BLOCKS:
			return p_remote_blocks(b, w, m);
		case KVB_ZMSG_RELEASE:
		case KVB_ZMSG_PLAIN:
			return p_release(b, w, m);
		default:
			return reject(b, w, m, -EPROTO,
				      "meant for a D worker, this is P");
		}
	}
	switch (m->type) {
	case KVB_ZMSG_WRITE_DONE:
	case KVB_ZMSG_WRITE_FAILED:
	case KVB_ZMSG_PLAIN:
		return d_write_done(b, w, m);
	default:
		return reject(b, w, m, -EPROTO,
			      "meant for a P worker, this is D");
	}
}

static void on_notify_log(void *arg, int level, const char *line)
{
	const struct kvb_xn_wctx *c = arg;

	if (level == KVB_NOTIFY_LOG_WARN)
		log_warn("notify (worker %u): %s", c->wid, line);
	else
		log_info("notify (worker %u): %s", c->wid, line);
}

void kvb_xn_notify_close(struct kvb_broker *b, struct kvb_worker *w)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	struct kvb_xn_wctx *ws = kvb_xn_w(xn, w);
	struct kvb_notify_stats st;
	int fds[KVB_NOTIFY_MAX_SOCKS], n;

	if (!ws->notify)
		return;
	n = kvb_notify_fds(ws->notify, fds, KVB_NOTIFY_MAX_SOCKS);
	for (int i = 0; i < n; i++)
		kvb_xn_ep_del(b, fds[i]);
	kvb_notify_get_stats(ws->notify, &st);
	xn->st.notify_rejected_closed += st.messages_rejected;
	xn->st.notify_received_closed += st.messages_received;
	xn->st.notify_sent_closed += st.messages_sent;
	xn->st.send_errors_closed += st.send_errors;
	kvb_notify_close(ws->notify);
	ws->notify = NULL;
}

/* --trusted-hosts, where given, holds for the notify ports too (an
 * IPv4-mapped IPv6 sender compares as its IPv4 address) */
static bool notify_sender_ok(void *arg, const char *addr)
{
	const struct kvb_xn_wctx *c = arg;
	struct kvb_xn *xn = c->xn;

	if (!strncmp(addr, "::ffff:", 7) && strchr(addr + 7, '.'))
		addr += 7;
	/* the message in hand came from there (kvb_xn_live_sender) */
	snprintf(xn->notify_from, sizeof(xn->notify_from), "%s", addr);
	if (!xn->ntrusted)
		return true;
	return kvb_xn_trusted(xn, addr);
}

static int notify_open(struct kvb_broker *b, struct kvb_worker *w, int alias)
{
	struct kvb_notify_conf c = {
		.host_ip = b->opt.host_ip,
		.notify_port = b->opt.notify_port,
		.dp_rank = w->dp_rank,
		.tp_rank = w->tp_rank,
		.tp_size = w->tp_size,
		.formula = KVB_PORT_DP_TIMES_TP,
		.defer_alias = true,
		.on_msg = on_notify,
		.on_log = on_notify_log,
		.sender_ok = notify_sender_ok,
		.arg = kvb_xn_w(kvb_xn_of(b), w),
		.zmq_ctx = kvb_xn_of(b)->zctx,
	};
	struct kvb_xn_wctx *ws = kvb_xn_w(kvb_xn_of(b), w);
	int fds[KVB_NOTIFY_MAX_SOCKS], n, rc;

	ws->xn = kvb_xn_of(b);
	ws->wid = w->id;
	rc = kvb_notify_open(&ws->notify, &c);
	if (rc) {
		ws->notify = NULL;
		return rc;
	}
	if (alias) {
		int ap = kvb_port_of(b->opt.notify_port, w->dp_rank, w->tp_rank,
				     w->tp_size, KVB_PORT_DP_PLUS_TP);
		int taken = 0;

		/* an alias never takes another worker's primary port */
		for (uint32_t i = 0; i < b->nlive && ap > 0; i++) {
			struct kvb_worker *v = &b->workers[b->live[i]];

			if (v != w &&
			    kvb_port_of(b->opt.notify_port, v->dp_rank,
					v->tp_rank, v->tp_size,
					KVB_PORT_DP_TIMES_TP) == ap)
				taken = 1;
		}
		if (!taken)
			kvb_notify_bind_alias(ws->notify);
	}
	n = kvb_notify_fds(ws->notify, fds, KVB_NOTIFY_MAX_SOCKS);
	for (int i = 0; i < n; i++)
		kvb_xn_ep_add(b, fds[i]);
	return 0;
}

/* w's primary notify port (kvb_port_of), or -errno */
static int primary_port(struct kvb_broker *b, const struct kvb_worker *w)
{
	return kvb_port_of(b->opt.notify_port, w->dp_rank, w->tp_rank,
			   w->tp_size, KVB_PORT_DP_TIMES_TP);
}

/* Open w's notify ports; its primary port is taken back from a worker of
 * ours that holds it as its alias. 0 or -errno. */
static int notify_take(struct kvb_broker *b, struct kvb_worker *w)
{
	int rc = notify_open(b, w, 1);
	uint16_t ports[2];

	if (rc != -EADDRINUSE)
		return rc;
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *v = &b->workers[b->live[i]];

		if (v == w || !kvb_xn_notify(b, v) ||
		    kvb_notify_ports(kvb_xn_notify(b, v), ports, 2) != 2 ||
		    ports[1] != primary_port(b, w))
			continue;
		/* only v's alias goes: its primary port (and the messages and
		 * connections on it) stay. Closing and reopening all of v
		 * left v with no endpoint when libzmq had not released its
		 * primary port yet (it closes in its I/O thread) */
		if (kvb_notify_alias_fd(kvb_xn_notify(b, v)) >= 0)
			kvb_xn_ep_del(b,
				      kvb_notify_alias_fd(kvb_xn_notify(b, v)));
		kvb_notify_drop_alias(kvb_xn_notify(b, v));
		/* the alias port, too, is freed a moment later: taken at a
		 * later timer pass if not now */
		return notify_open(b, w, 1);
	}
	return rc;
}

/* Another attached worker of ours has w's primary port as its own. */
static int port_owned(struct kvb_broker *b, const struct kvb_worker *w)
{
	for (uint32_t i = 0; i < b->nlive; i++) {
		const struct kvb_worker *v = &b->workers[b->live[i]];

		if (v != w &&
		    (v->role == KVB_ROLE_P || v->role == KVB_ROLE_D) &&
		    primary_port(b, v) == primary_port(b, w))
			return 1;
	}
	return 0;
}

static void rebind_stop(struct kvb_xn *xn, struct kvb_xn_wctx *ws)
{
	if (!ws->rebind_until)
		return;
	ws->rebind_until = 0;
	xn->nrebind--;
	xn->b->timers_soon--;
}

/* The outcome of notify_take() for w, logged; since: when its port was
 * first found taken (0: it was not) */
static void notify_opened(struct kvb_broker *b, struct kvb_worker *w, int rc,
			  int64_t since)
{
	uint16_t ports[2];

	if (rc)
		log_warn("worker %u: notify port %d unavailable (%s): no "
			 "cross-node messages for it",
			 w->id, primary_port(b, w), strerror(-rc));
	else if (kvb_notify_ports(kvb_xn_notify(b, w), ports, 2) > 0 && since)
		log_info("worker %u: notify port %u (free after %lld ms)",
			 w->id, ports[0],
			 (long long) ((kvb_now_ns() - since) / 1000000));
	else if (kvb_notify_ports(kvb_xn_notify(b, w), ports, 2) > 0)
		log_info("worker %u: notify port %u", w->id, ports[0]);
}

int kvb_xn_worker_attached(struct kvb_broker *b, struct kvb_worker *w)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	struct kvb_xn_wctx *ws;
	int rc;

	if (!xn || (w->role != KVB_ROLE_P && w->role != KVB_ROLE_D))
		return 0;
	rc = notify_take(b, w);
	if (rc == -EADDRINUSE && !port_owned(b, w)) {
		/* no worker of ours has it: one that just left, whose ROUTER
		 * libzmq has not closed yet (or another process): again at
		 * the next timer passes */
		ws = kvb_xn_w(xn, w);
		ws->rebind_since = kvb_now_ns();
		ws->rebind_until = ws->rebind_since + NOTIFY_REBIND_NS;
		xn->nrebind++;
		b->timers_soon++; /* tried every TIMER_NS, idle or not */
		log_info("worker %u: notify port %d taken: trying again for "
			 "%lld s",
			 w->id, primary_port(b, w),
			 (long long) (NOTIFY_REBIND_NS / 1000000000));
		return 0;
	}
	notify_opened(b, w, rc, 0);
	return rc;
}

void kvb_xn_notify_retry(struct kvb_broker *b, int64_t now)
{
	struct kvb_xn *xn = kvb_xn_of(b);

	for (uint32_t i = 0; xn && xn->nrebind && i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];
		struct kvb_xn_wctx *ws = kvb_xn_w(xn, w);
		int rc;

		if (!ws->rebind_until)
			continue;
		rc = notify_take(b, w);
		if (rc == -EADDRINUSE && now < ws->rebind_until)
			continue;
		rebind_stop(xn, ws);
		notify_opened(b, w, rc, ws->rebind_since);
	}
}

void kvb_xn_worker_gone(struct kvb_broker *b, struct kvb_worker *w)
{
	if (!kvb_xn_of(b))
		return;
	kvb_xn_of(b)->desc_gen++;
	rebind_stop(kvb_xn_of(b), kvb_xn_w(kvb_xn_of(b), w));
	kvb_xn_notify_close(b, w);
}

/* The worker_free hook: w's slot is freed (its transfers ended): what the
 * module kept for it goes (its KV layout, its grants). */
void kvb_xn_worker_free(struct kvb_broker *b, struct kvb_worker *w)
{
	struct kvb_xn *xn = kvb_xn_state(b);
	struct kvb_xn_wctx *ws;

	if (!xn)
		return;
	ws = kvb_xn_w(xn, w);	   /* the slot's: whatever is there goes */
	rebind_stop(xn, ws);	   /* stopped at worker_gone already */
	kvb_xn_notify_close(b, w); /* closed at worker_gone already */
	free(ws->kv_layer);
	kvb_grant_free(ws);
	kvb_xn_expect_free(ws);
	memset(ws, 0, sizeof(*ws));
}

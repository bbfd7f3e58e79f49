/* SPDX-License-Identifier: MIT */
/*
 * How a transfer ends: counting its ops (kvb_xfer_account, and for the
 * extension's ops kvb_op_complete, kvb_xfer_peer_done), deciding it is
 * complete (kvb_xfer_maybe_finish), and failing it quietly
 * (kvb_xfer_finish: queued ops dropped, ops in flight drained first, the
 * extension told through its hooks) before its completion goes out.
 */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "metrics.h"

/*
 * Does transfer x (ending) count for destination worker `dest`'s entry of
 * the same id? Only when a P worker opened x: a D transfer counts the
 * writes of the P workers that opened the same id, never those of a worker
 * that merely wrote into D's region (another D, any worker that looked the
 * region up). Refusals are counted and logged.
 */
static int notify_ok(struct kvb_broker *b, const struct kvb_xfer *x,
		     uint32_t dest)
{
	struct kvb_worker *src = kvb_worker_by_id(b, x->worker);

	if (x->opened && src && src->attached && src->role == KVB_ROLE_P)
		return 1;
	b->st.xfer_notify_refused++;
	log_warn_rl("transfer '%s': writes of worker %u (not a P worker that "
		    "opened it) not counted for worker %u",
		    x->id, x->worker, dest);
	return 0;
}

/* One op of x ended with status: counted (progress, completed or failed
 * with the first error kept), and x finishes if that was its last. */
static void count_op(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	x->progress++;
	if (status) {
		x->failed++;
		if (!x->first_err)
			x->first_err = status;
	} else {
		x->completed++;
	}
	kvb_xfer_maybe_finish(b, x);
}

/* End a transfer now with `status`, tell its worker and its destinations. */
static void finish_now(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	uint32_t handle = kvb_xfer_handle(&b->xfers, x);
	int64_t deadline =
		kvb_now_ns() + (int64_t) b->opt.transfer_deadline_ms * 1000000;
	struct kvb_xfer copy = *x;

	kvb_metrics_xfer_end(b, x, status);
	if (status)
		b->st.transfers_failed++;
	else
		b->st.transfers_done++;
	if (status && status != -ECANCELED && !x->closing)
		log_info_rl("transfer '%s' of worker %u failed: %s", x->id,
			    x->worker, kvb_strerror(status));
	kvb_hook_xfer_end(b, x, status);
	kvb_xfer_end(&b->xfers, x);
	if (copy.opened) /* nobody to tell about an id it never opened */
		kvb_post_cqe(b, copy.worker, KVB_CQ_TRANSFER, copy.seal_tag,
			     status, 0, handle);
	/* the local analogue of write_done: each destination worker's entry
	 * for the same id counts one notification (its seal says how many) */
	for (uint32_t i = 0; i < copy.ndests; i++) {
		struct kvb_xfer *y;
		int err = 0;

		if (copy.dests[i] == copy.worker ||
		    !kvb_worker_by_id(b, copy.dests[i]))
			continue;
		if (!notify_ok(b, &copy, copy.dests[i]))
			continue;
		y = kvb_xfer_open(&b->xfers, copy.dests[i], copy.id,
				  strlen(copy.id), deadline, &err);
		if (!y)
			continue; /* already terminal there, or table full */
		if (!y->opened)	  /* made for D by P's write: in P's share */
			kvb_xfer_charge(&b->xfers, y, copy.worker);
		count_op(b, y, status);
	}
}

static int queued_for(const struct kvb_inflight *e, uint32_t h, uint32_t wid)
{
	return (e->xfer == h && e->worker == wid) ||
	       (e->dxfer == h && e->downer == wid);
}

/*
 * Drop the ops of transfer (h, wid) that wait in the destination queues
 * (not posted: no byte of them moved), its own and those writing into it:
 * they complete with -ECANCELED. Taken out of the queues first, completed
 * after: a completion may end other transfers.
 */
static void drop_queued(struct kvb_broker *b, uint32_t h, uint32_t wid)
{
	uint32_t *gone = NULL, ngone = 0, cap = 0;

	for (uint32_t k = 0; k < b->ndirty; k++) {
		struct kvb_dest *d = &b->dests[b->dirty[k]];
		uint32_t keep = 0;

		for (uint32_t i = 0; i < d->n; i++) {
			uint32_t c = (uint32_t) d->ops[i].cookie;

			if (!queued_for(&b->inf[c], h, wid)) {
				d->ops[keep++] = d->ops[i];
				continue;
			}
			if (ngone == cap) {
				uint32_t nc = cap ? cap * 2 : 64;
				uint32_t *n = realloc(gone, nc * sizeof(*n));

				if (!n) { /* keep it: it completes when posted
					   */
					d->ops[keep++] = d->ops[i];
					continue;
				}
				gone = n;
				cap = nc;
			}
			gone[ngone++] = c;
		}
		d->n = keep;
	}
	for (uint32_t i = 0; i < ngone; i++)
		kvb_complete_inflight(b, gone[i], -ECANCELED);
	free(gone);
}

/* A failing transfer's extension part: its deferred ops fail (counted
 * here), and the peer writers it asked to stop are waited for, the stall
 * timeout at most (kvb_engine_timers). */
static void fence(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	uint32_t failed;
	uint32_t writers = kvb_hook_xfer_fence(b, x, status, &failed);

	x->failed += failed;
	if (writers) {
		uint32_t stall =
			x->stall_ms ? x->stall_ms : b->opt.transfer_timeout_ms;

		x->inbound += writers;
		x->fence_ns = kvb_now_ns() + (int64_t) stall * 1000000;
	}
}

/*
 * End a transfer with `status`, tell its worker and its destinations. A
 * failure with ops still in flight closes it first: nothing new is taken,
 * queued ops are dropped, and the completion waits until the posted ones
 * ended (kvb_xfer_maybe_finish), so that no byte of it lands after its
 * worker heard that it failed.
 */
void kvb_xfer_finish(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	uint32_t h, wid;

	if (x->closing)
		return; /* its drain ends it */
	if (!status || (kvb_xfer_drained(x) && !kvb_hook_xfer_writers(b, x))) {
		finish_now(b, x, status);
		return;
	}
	if (status != -ECANCELED)
		log_info_rl(
			"transfer '%s' of worker %u failed: %s (its completion "
			"waits for %u op(s) in flight)",
			x->id, x->worker, kvb_strerror(status),
			x->submitted - x->completed - x->failed + x->inbound);
	b->st.transfers_fenced++;
	x->closing = 1;
	x->close_err = status;
	fence(b, x, status);
	h = kvb_xfer_handle(&b->xfers, x);
	wid = x->worker;
	drop_queued(b, h, wid);
	x = kvb_xfer_get(&b->xfers, h, wid);
	if (x && x->closing && kvb_xfer_drained(x))
		finish_now(b, x, x->close_err);
}

void kvb_xfer_maybe_finish(struct kvb_broker *b, struct kvb_xfer *x)
{
	if (x->closing) {
		if (kvb_xfer_drained(x))
			finish_now(b, x, x->close_err);
		return;
	}
	if (kvb_hook_xfer_complete(b, x))
		kvb_xfer_finish(b, x, x->first_err);
}

void kvb_xfer_ops_failed(struct kvb_xfer *x, uint32_t n, int status)
{
	x->failed += n;
	if (status && !x->first_err)
		x->first_err = status;
}

void kvb_xfer_fence_now(struct kvb_xfer *x)
{
	if (x->fence_ns)
		x->fence_ns = kvb_now_ns();
}

void kvb_xfer_account(struct kvb_broker *b, uint32_t handle, uint32_t worker,
		      int status)
{
	struct kvb_xfer *x;

	if (!handle)
		return;
	x = kvb_xfer_get(&b->xfers, handle, worker);
	if (!x)
		return; /* ended already (timeout, abort): nothing to count */
	count_op(b, x, status);
}

void kvb_op_complete(struct kvb_broker *b, const struct kvb_op_done *d)
{
	if (d->status || !(d->flags & KVB_SQE_F_UNSIGNALED))
		kvb_post_cqe(b, d->worker, KVB_CQ_DESC, d->tag, d->status,
			     d->status ? 0 : d->bytes, d->xfer);
	kvb_xfer_account(b, d->xfer, d->worker, d->status);
}

void kvb_xfer_peer_done(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	if (x->closing && x->inbound)
		x->inbound--; /* a writer we asked to stop has stopped */
	/* a peer's message: the stall clock runs */
	count_op(b, x, status);
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker's data path: drain every worker's submission ring (fair round
 * robin, a burst each), validate, attach to transfers, merge runs contiguous
 * on both sides, queue per destination, flush each destination as chains
 * (one post = one doorbell), reap transport completions, route completions
 * to the workers' completion rings, finish transfers.
 */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "metrics.h"

#define POLL_BATCH    256u
#define MERGE_MAX_LEN (1ull << 30)

int kvb_engine_init(struct kvb_broker *b)
{
	uint32_t i, nw = b->opt.max_workers;

	b->inf = calloc(KVB_INFLIGHT_MAX, sizeof(*b->inf));
	b->inf_free = calloc(KVB_INFLIGHT_MAX, sizeof(*b->inf_free));
	b->dests = calloc((size_t) nw * KVB_TS_MAX, sizeof(*b->dests));
	b->dirty = calloc((size_t) nw * KVB_TS_MAX, sizeof(*b->dirty));
	if (!b->inf || !b->inf_free || !b->dests || !b->dirty) {
		kvb_engine_fini(b);
		return -ENOMEM;
	}
	/* stack of free slots; slot 0 stays unused so 0 means "none" */
	for (i = KVB_INFLIGHT_MAX - 1; i >= 1; i--)
		b->inf_free[b->inf_nfree++] = i;
	return 0;
}

void kvb_engine_fini(struct kvb_broker *b)
{
	if (b->dests)
		for (uint32_t i = 0; i < b->opt.max_workers * KVB_TS_MAX; i++)
			free(b->dests[i].ops);
	free(b->inf);
	free(b->inf_free);
	free(b->dests);
	free(b->dirty);
	b->inf = NULL;
	b->inf_free = b->dirty = NULL;
	b->dests = NULL;
}

static struct kvb_region_ent *mr_ent(struct kvb_mr *mr)
{
	return container_of(mr, struct kvb_region_ent, mr);
}

static void region_unmap(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_transport *t = kvb_tr_for(b, r->mr.kind);
	struct kvb_region_ent *parent;

	if (t)
		t->ops->dereg_mr(t, &r->mr);
	kvb_hook_region_gone(b, r);
	if (r->mr.kind == KVB_MEM_GPU)
		kvb_broker_gpu_unimport(r);
	else if (r->map_base)
		munmap(r->map_base, r->map_len);
	parent = r->parent ? kvb_region_get(&b->regions, r->parent) : NULL;
	kvb_region_release(&b->regions, r);
	if (parent) /* an alias: the parent's mapping may go now */
		kvb_region_put(b, parent);
}

void kvb_region_put(struct kvb_broker *b, struct kvb_region_ent *r)
{
	if (r->refs)
		r->refs--;
	if (r->dead && !r->refs)
		region_unmap(b, r);
}

void kvb_region_kill(struct kvb_broker *b, struct kvb_region_ent *r)
{
	struct kvb_region_ent *parent =
		r->parent && !r->dead ? kvb_region_get(&b->regions, r->parent)
				      : NULL;

	if (parent && parent->naliases)
		parent->naliases--;
	r->dead = 1;
	if (!r->refs)
		region_unmap(b, r);
}

void kvb_complete(struct kvb_broker *b, struct kvb_worker *w,
		  const struct kvb_cqe *c)
{
	if (!w->ovf_len && kvb_ring_enqueue_burst(&w->seg.cq, c, 1) == 1) {
		w->cq_dirty = 1;
		return;
	}
	if (w->ovf_len == w->ovf_cap) {
		uint32_t cap = w->ovf_cap ? w->ovf_cap * 2 : 256;
		struct kvb_cqe *n = realloc(w->ovf, cap * sizeof(*n));

		if (!n) {
			log_err_rl("worker %u: out of memory queueing a "
				   "completion",
				   w->id);
			return;
		}
		w->ovf = n;
		w->ovf_cap = cap;
	}
	if (!w->ovf_len) /* the worker's reap wakes us from now on */
		atomic_store_explicit(&w->seg.hdr->cq_backlog, 1,
				      memory_order_relaxed);
	w->ovf[w->ovf_len++] = *c;
}

static uint32_t flush_overflow(struct kvb_worker *w)
{
	uint32_t n = kvb_ring_enqueue_burst(&w->seg.cq, w->ovf, w->ovf_len);

	if (!n)
		return 0;
	memmove(w->ovf, w->ovf + n, (w->ovf_len - n) * sizeof(*w->ovf));
	w->ovf_len -= n;
	w->cq_dirty = 1;
	if (!w->ovf_len)
		atomic_store_explicit(&w->seg.hdr->cq_backlog, 0,
				      memory_order_relaxed);
	return n;
}

unsigned kvb_engine_flush_owed(struct kvb_broker *b)
{
	unsigned moved = 0;

	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];

		if (w->ovf_len)
			moved += flush_overflow(w);
	}
	if (moved)
		kvb_wake_workers(b);
	return moved;
}

void kvb_wake_workers(struct kvb_broker *b)
{
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *w = &b->workers[b->live[i]];
		uint64_t one = 1;
		uint32_t want;

		if (!w->cq_dirty)
			continue;
		w->cq_dirty = 0;
		/* pairs with kvb_wait(): flag store, fence, ring re-check */
		atomic_thread_fence(memory_order_seq_cst);
		/*
		 * worker_waiting: how many completions the sleeper waits
		 * for (kvb_wait_min). Fewer queued: it sleeps on; the
		 * completion that makes up the count wakes it. A bogus
		 * count from the worker only keeps that worker asleep.
		 */
		want = atomic_load_explicit(&w->seg.hdr->worker_waiting,
					    memory_order_relaxed);
		if (!want || (!w->ovf_len && kvb_ring_count(&w->seg.cq) < want))
			continue;
		if (write(w->efd, &one, sizeof(one)) < 0)
			log_dbg("worker %u: eventfd write failed", w->id);
	}
}

void kvb_post_cqe(struct kvb_broker *b, uint32_t worker, uint8_t op,
		  uint64_t tag, int32_t status, uint64_t bytes, uint32_t xfer)
{
	struct kvb_worker *w = kvb_worker_by_id(b, worker);
	struct kvb_cqe c = {.tag = tag,
			    .bytes = bytes,
			    .status = status,
			    .transfer = xfer,
			    .opcode = op};

	if (w && w->attached)
		kvb_complete(b, w, &c);
}

/* An op writing into another worker's entry of its transfer's id ended. */
static void inbound_done(struct kvb_broker *b, uint32_t dxfer, uint32_t downer)
{
	struct kvb_xfer *y = kvb_xfer_get(&b->xfers, dxfer, downer);

	if (!y || !y->inbound)
		return;
	y->inbound--;
	y->progress++;
	if (!y->inbound)
		kvb_xfer_maybe_finish(b, y);
}

static void inflight_release(struct kvb_broker *b, uint32_t idx)
{
	struct kvb_inflight *e = &b->inf[idx];

	e->group = 0;
	e->dxfer = 0;
	e->used = 0;
	b->inf_free[b->inf_nfree++] = idx;
}

/*
 * An entry of an extension's group (a piece of a layer op) ended: the
 * group_done hook counts it; when it was the group's last, the engine
 * completes the layer op (kvb_op_complete: its completion, then its count
 * on the transfer); when the hook marked the peer stale, the ops still
 * queued to it fail. The slot is free first: both may re-enter here.
 */
static void complete_group(struct kvb_broker *b, struct kvb_inflight *e,
			   uint32_t idx, int status)
{
	struct kvb_op_done done;
	uint32_t stale = 0;
	uint32_t dx = e->dxfer, downer = e->downer;
	int last = kvb_hook_group_done(b, e->group, status, e->bytes, &done,
				       &stale);

	inflight_release(b, idx);
	if (dx)
		inbound_done(b, dx, downer);
	if (last)
		kvb_op_complete(b, &done);
	for (unsigned ts = KVB_TS_TCP; stale && ts < KVB_TS_MAX; ts++)
		kvb_dest_fail(b, ts, stale, -ECONNRESET);
}

/* Complete a (possibly merged) chain of in-flight descriptors. */
void kvb_complete_inflight(struct kvb_broker *b, uint32_t idx, int status)
{
	while (idx) {
		struct kvb_inflight *e = &b->inf[idx];
		struct kvb_worker *w = kvb_worker_by_id(b, e->worker);
		struct kvb_region_ent *r;
		uint32_t next = e->next;

		if (!e->used) {
			log_err_rl("completion for a free in-flight slot %u",
				   idx);
			return;
		}
		if ((r = kvb_region_get(&b->regions, e->lreg)))
			kvb_region_put(b, r);
		if ((r = kvb_region_get(&b->regions, e->rreg)))
			kvb_region_put(b, r);
		b->st.descriptors_completed++;
		if (!status)
			b->st.bytes += e->bytes;
		if (e->group) {
			complete_group(b, e, idx, status);
			idx = next;
			continue;
		}
		if (w) {
			if (w->inf_used)
				w->inf_used--;
			w->st.completed++;
			if (!status)
				w->st.bytes += e->bytes;
			if (status || !(e->flags & KVB_SQE_F_UNSIGNALED))
				kvb_post_cqe(b, e->worker, KVB_CQ_DESC, e->tag,
					     status, status ? 0 : e->bytes,
					     e->xfer);
		}
		{
			uint32_t dx = e->dxfer, downer = e->downer;
			uint32_t xf = e->xfer, wid = e->worker;

			/* the slot is free before the accounting, which may
			 * end transfers and so re-enter here */
			inflight_release(b, idx);
			if (dx)
				inbound_done(b, dx, downer);
			kvb_xfer_account(b, xf, wid, status);
		}
		idx = next;
	}
}

uint32_t kvb_inflight_alloc(struct kvb_broker *b)
{
	uint32_t idx;

	if (!b->inf_nfree)
		return 0;
	idx = b->inf_free[--b->inf_nfree];
	memset(&b->inf[idx], 0, sizeof(b->inf[idx]));
	b->inf[idx].tail = idx;
	b->inf[idx].used = 1;
	return idx;
}

/* Count a refused op of w; 1 if it may still be logged (the first
 * KVB_REFUSALS_LOGGED of each worker are), with *more set on the last one. */
static int refusal_count(struct kvb_broker *b, struct kvb_worker *w,
			 const char **more)
{
	b->st.descriptors_refused++;
	w->st.refused++;
	if (!kvb_ratelimit_ok(&w->refuse_rl, 0)) /* one window: no clock */
		return 0;
	*more = kvb_ratelimit_left(&w->refuse_rl)
			? ""
			: " (further refusals counted, not logged)";
	return 1;
}

void kvb_layer_refuse(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e, int rc, const char *why)
{
	const char *more;

	/* the first few of each worker, a line a second per reason */
	if (refusal_count(b, w, &more))
		kvb_log_rl_keyed(
			why, KVB_LOG_WARN,
			"worker %u: layer op (tag %llu, transfer %#x, layer "
			"%u) refused: %s%s",
			w->id, (unsigned long long) e->tag, e->transfer,
			e->layer, why, more);
	kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, rc, 0, e->transfer);
}

static void refuse(struct kvb_broker *b, struct kvb_worker *w,
		   const struct kvb_sqe *e, int rc, const char *why)
{
	struct kvb_xfer *x;
	const char *more;

	if (refusal_count(b, w, &more))
		kvb_log_rl_keyed(
			why, KVB_LOG_WARN,
			"worker %u: refused descriptor (tag %llu, region "
			"%#x+%llu -> %#x+%llu, len %llu): %s%s",
			w->id, (unsigned long long) e->tag, e->region,
			(unsigned long long) e->offset, e->peer_region,
			(unsigned long long) e->peer_offset,
			(unsigned long long) e->len, why, more);
	kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, rc, 0, e->transfer);
	if (e->transfer && (x = kvb_xfer_get(&b->xfers, e->transfer, w->id))) {
		x->submitted++;
		x->failed++;
		if (!x->first_err)
			x->first_err = rc;
		kvb_xfer_maybe_finish(b, x);
	}
}

static int dest_push(struct kvb_broker *b, uint32_t di,
		     const struct kvb_xop *op)
{
	struct kvb_dest *d = &b->dests[di];

	if (d->n == d->cap) {
		uint32_t cap = d->cap ? d->cap * 2 : 256;
		struct kvb_xop *n = realloc(d->ops, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		d->ops = n;
		d->cap = cap;
	}
	d->ops[d->n++] = *op;
	if (!d->queued) {
		d->queued = 1;
		b->dirty[b->ndirty++] = di;
	}
	return 0;
}

/* Append an op to its destination, merging with the last one if both
 * sides are contiguous. */
int kvb_dest_append(struct kvb_broker *b, uint32_t di, const struct kvb_xop *op)
{
	struct kvb_dest *d = &b->dests[di];

	if (d->n) {
		struct kvb_xop *last = &d->ops[d->n - 1];

		if (last->opcode == op->opcode && last->local == op->local &&
		    b->inf[last->cookie].xfer == b->inf[op->cookie].xfer &&
		    b->inf[last->cookie].dxfer == b->inf[op->cookie].dxfer &&
		    last->remote.mr == op->remote.mr &&
		    last->remote.region == op->remote.region &&
		    last->remote.addr == op->remote.addr &&
		    last->local_off + last->len == op->local_off &&
		    last->remote_off + last->len == op->remote_off &&
		    last->len + op->len <= MERGE_MAX_LEN) {
			struct kvb_inflight *head = &b->inf[last->cookie];

			last->len += op->len;
			b->inf[head->tail].next = (uint32_t) op->cookie;
			head->tail = (uint32_t) op->cookie;
			return 0;
		}
	}
	return dest_push(b, di, op);
}

/*
 * The entry of worker `owner` for x's id, that a write of x into owner's
 * memory lands in (created if owner has not opened it yet; remembered in
 * x->dests). 0, or -ECANCELED when that entry ended or is failing: the
 * write would land in memory its worker reuses already.
 */
static int dest_entry(struct kvb_broker *b, struct kvb_xfer *x, uint32_t owner,
		      struct kvb_xfer **out)
{
	struct kvb_xfer *y;
	uint32_t i;
	int err = 0;

	for (i = 0; i < x->ndests && x->dests[i] != owner; i++)
		;
	if (i < x->ndests) {
		y = x->dest_xfer[i]
			    ? kvb_xfer_get(&b->xfers, x->dest_xfer[i], owner)
			    : NULL;
		if (x->dest_xfer[i] && (!y || y->closing))
			return -ECANCELED;
		*out = y;
		return 0;
	}
	y = kvb_xfer_open(&b->xfers, owner, x->id, strlen(x->id),
			  kvb_now_ns() + (int64_t) b->opt.transfer_deadline_ms *
						 1000000,
			  &err);
	if (!y && err == -ESTALE)
		return -ECANCELED;
	if (y && y->closing)
		return -ECANCELED;
	if (y && !y->opened) /* made for owner by x's write: in x's share */
		kvb_xfer_charge(&b->xfers, y, x->worker);
	if (i < KVB_XFER_MAX_DESTS) {
		x->dests[x->ndests] = owner;
		x->dest_xfer[x->ndests++] =
			y ? kvb_xfer_handle(&b->xfers, y) : 0;
	}
	*out = y; /* NULL: its table is full; the write goes untracked */
	return 0;
}

/* KVB_OP_SEAL (the transfer expects e->len ops in all) or KVB_OP_ABORT. */
static void seal_or_abort(struct kvb_broker *b, struct kvb_worker *w,
			  const struct kvb_sqe *e)
{
	struct kvb_xfer *x;

	x = kvb_xfer_get(&b->xfers, e->transfer, w->id);
	if (!x) {
		kvb_post_cqe(b, w->id, KVB_CQ_TRANSFER, e->tag, -ESTALE, 0,
			     e->transfer);
		return;
	}
	if (x->closing) {
		/* failed, its ops draining: its one completion takes
		 * the first seal's or abort's tag; another is told
		 * at once that the transfer ended */
		if (x->tag_set) {
			kvb_post_cqe(b, w->id, KVB_CQ_TRANSFER, e->tag, -ESTALE,
				     0, e->transfer);
			return;
		}
		x->tag_set = 1;
		x->seal_tag = e->tag;
		return;
	}
	x->tag_set = 1;
	if (x->held_err) {
		/* it failed before its seal (the extension held the failure
		 * for it): reported now, with this call's tag */
		x->seal_tag = e->tag;
		kvb_xfer_finish(b, x, x->held_err);
		return;
	}
	if (e->opcode == KVB_OP_ABORT) {
		x->seal_tag = e->tag;
		kvb_xfer_finish(b, x, -ECANCELED);
		return;
	}
	if (e->len > UINT32_MAX) {
		/* only a raw ring writer gets here (the library's
		 * count is 32 bits): the transfer fails with -EINVAL,
		 * its one completion carrying the seal's tag */
		b->st.messages_rejected++;
		if (!w->seal_logged) {
			w->seal_logged = 1;
			log_warn_rl("worker %u: seal of transfer %#x "
				    "refused: count %llu too large "
				    "(further ones counted only)",
				    w->id, e->transfer,
				    (unsigned long long) e->len);
		}
		x->seal_tag = e->tag;
		kvb_xfer_finish(b, x, -EINVAL);
		return;
	}
	x->sealed = 1;
	x->expected = (uint32_t) e->len;
	x->seal_tag = e->tag;
	kvb_xfer_maybe_finish(b, x);
}

/* Take a valid descriptor into the in-flight table and queue its op for
 * its destination (merged with the last one there where contiguous). */
static void queue_desc(struct kvb_broker *b, struct kvb_worker *w,
		       const struct kvb_sqe *e, struct kvb_region_ent *l,
		       struct kvb_region_ent *r, struct kvb_xfer *x,
		       struct kvb_xfer *y)
{
	struct kvb_inflight *f;
	struct kvb_xop op;
	uint32_t idx;

	idx = b->inf_free[--b->inf_nfree];
	f = &b->inf[idx];
	f->worker = w->id;
	f->xfer = e->transfer;
	f->tag = e->tag;
	f->bytes = e->len;
	f->next = 0;
	f->tail = idx;
	f->lreg = l->mr.id;
	f->rreg = r->mr.id;
	f->flags = e->flags;
	f->group = 0;
	f->dxfer = y ? kvb_xfer_handle(&b->xfers, y) : 0;
	f->downer = y ? y->worker : 0;
	f->used = 1;
	w->inf_used++;
	l->refs++;
	r->refs++;
	if (x) {
		x->submitted++;
		x->progress++;
	}
	if (y) {
		y->inbound++;
		y->progress++;
	}
	memset(&op, 0, sizeof(op));
	op.opcode = e->opcode == KVB_OP_WRITE ? KVB_XOP_WRITE : KVB_XOP_READ;
	op.local = &l->mr;
	op.local_off = e->offset;
	op.remote.mr = &r->mr;
	op.remote.region = r->mr.id;
	op.remote_off = e->peer_offset;
	op.len = e->len;
	op.cookie = idx;
	{
		/* GPU memory on either side: GPU copy engines; else memcpy */
		unsigned ts =
			(l->mr.kind == KVB_MEM_GPU || r->mr.kind == KVB_MEM_GPU)
				? KVB_TS_GPU
				: KVB_TS_HOST;
		uint32_t di = ts * b->opt.max_workers + KVB_WSLOT(r->owner);

		if (!b->trs[ts]) {
			kvb_complete_inflight(b, idx, -EOPNOTSUPP);
			return;
		}
		b->dests[di].tr = b->trs[ts];
		if (kvb_dest_append(b, di, &op))
			kvb_complete_inflight(b, idx, -ENOMEM);
	}
}

static void process_sqe(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_sqe *e)
{
	struct kvb_region_ent *l, *r;
	struct kvb_xfer *x = NULL, *y;
	const char *why = NULL;
	int rc;

	switch (e->opcode) {
	case KVB_OP_SEAL:
	case KVB_OP_ABORT:
		seal_or_abort(b, w, e);
		return;
	case KVB_OP_NOP:
		kvb_post_cqe(b, w->id, KVB_CQ_DESC, e->tag, 0, 0, e->transfer);
		return;
	case KVB_OP_LAYER: {
		struct kvb_op_done done;

		b->st.descriptors_submitted++;
		w->st.submitted++;
		if (e->flags & ~KVB_SQE_F_UNSIGNALED) {
			kvb_layer_refuse(b, w, e, -EINVAL,
					 "undefined flag bits");
			return;
		}
		if (kvb_hook_layer_op(b, w, e, &done))
			kvb_op_complete(b, &done);
		return;
	}
	default:
		break;
	}
	b->st.descriptors_submitted++;
	w->st.submitted++;
	/* a later flag may mean something: refused, never ignored */
	if (e->flags & ~KVB_SQE_F_UNSIGNALED) {
		refuse(b, w, e, -EINVAL, "undefined flag bits");
		return;
	}
	rc = kvb_validate_desc(&b->regions, w->id, e, &l, &r, &why);
	if (rc) {
		refuse(b, w, e, rc, why);
		return;
	}
	if (l->mr.kind != r->mr.kind) {
		refuse(b, w, e, -EOPNOTSUPP,
		       "copies between host and GPU memory are not supported");
		return;
	}
	if (e->transfer) {
		x = kvb_xfer_get(&b->xfers, e->transfer, w->id);
		if (!x) {
			refuse(b, w, e, -EINVAL, "unknown or ended transfer");
			return;
		}
		if (x->closing) {
			refuse(b, w, e, x->close_err, "the transfer failed");
			return;
		}
	}
	/* kvb_engine_round dequeues a burst only while the table has room for
	 * it, but a layer op in the same burst may take many entries */
	if (!b->inf_nfree) {
		refuse(b, w, e, -ENOBUFS, "in-flight table full");
		return;
	}
	y = NULL;
	if (x && e->opcode == KVB_OP_WRITE && r->owner != w->id) {
		rc = dest_entry(b, x, r->owner, &y);
		if (rc) {
			b->st.late_writes_refused++;
			refuse(b, w, e, rc,
			       "late write: the destination ended this "
			       "transfer");
			return;
		}
	}
	queue_desc(b, w, e, l, r, x, y);
}

/* Post each dirty destination as chains of at most post_batch_size ops. */
static unsigned flush(struct kvb_broker *b)
{
	uint32_t keep = 0, posted = 0;
	unsigned batch = b->opt.post_batch_size < 0
				 ? UINT32_MAX
				 : (unsigned) b->opt.post_batch_size;

	for (uint32_t k = 0; k < b->ndirty; k++) {
		struct kvb_dest *d = &b->dests[b->dirty[k]];
		uint32_t off = 0;

		while (off < d->n) {
			unsigned n = d->n - off < batch ? d->n - off : batch;
			int rc =
				d->tr->ops->post(d->tr, d->ep, d->ops + off, n);

			if (rc < 0) {
				/* the transport took none: fail the chain */
				for (unsigned i = 0; i < n; i++)
					kvb_complete_inflight(
						b,
						(uint32_t) d->ops[off + i]
							.cookie,
						rc);
				off += n;
				continue;
			}
			off += (uint32_t) rc;
			posted += (uint32_t) rc;
			/* short: out of credit (the transport counts its own
			 * credit_stalls, as episodes), or a chain limit */
			if ((unsigned) rc < n)
				break;
		}
		if (off < d->n) {
			memmove(d->ops, d->ops + off,
				(d->n - off) * sizeof(*d->ops));
			d->n -= off;
			b->dirty[keep++] = b->dirty[k];
		} else {
			d->n = 0;
			d->queued = 0;
		}
	}
	b->ndirty = keep;
	return posted;
}

static unsigned reap_one(struct kvb_broker *b, struct kvb_transport *t)
{
	struct kvb_xcqe c[POLL_BATCH];
	unsigned total = 0;
	int n;

	do {
		n = t->ops->poll(t, c, POLL_BATCH);
		if (n < 0) {
			log_err_rl("transport %s: poll failed: %s",
				   t->ops->name, strerror(-n));
			return total;
		}
		for (int i = 0; i < n; i++)
			kvb_complete_inflight(b, (uint32_t) c[i].cookie,
					      c[i].status);
		total += (unsigned) n;
	} while (n == (int) POLL_BATCH);
	return total;
}

static unsigned reap(struct kvb_broker *b)
{
	unsigned total = 0;

	for (unsigned i = 0; i < KVB_TS_MAX; i++) {
		if (!b->trs[i])
			continue;
		/* one slice of queued copies on this thread (local's pool) */
		if (b->trs[i]->ops->progress)
			total += (unsigned) b->trs[i]->ops->progress(b->trs[i]);
		total += reap_one(b, b->trs[i]);
	}
	return total;
}

/* Take up to max (<= KVB_BURST_MAX) descriptors from w's ring. */
static uint32_t drain_burst(struct kvb_broker *b, struct kvb_worker *w,
			    uint32_t max)
{
	struct kvb_sqe sqe[KVB_BURST_MAX];
	uint32_t n = max ? kvb_ring_dequeue_burst(&w->seg.sq, sqe, max) : 0;

	for (uint32_t i = 0; i < n; i++)
		process_sqe(b, w, &sqe[i]);
	return n;
}

unsigned kvb_engine_round(struct kvb_broker *b)
{
	uint32_t nw = b->nlive, burst = b->opt.burst;
	unsigned work = 0;

	if (burst > KVB_BURST_MAX) /* options.c refuses more */
		burst = KVB_BURST_MAX;
	for (uint32_t k = 0; k < nw; k++) {
		struct kvb_worker *w = &b->workers[b->live[(b->rr + k) % nw]];

		if (w->ovf_len) {
			flush_overflow(w);
			if (w->ovf_len)
				continue; /* completions back up: stop draining
					   */
		}
		if (b->inf_nfree < burst)
			break;
		work += drain_burst(b, w, kvb_inflight_room(b, w, burst));
	}
	b->rr++;
	if (b->ndirty)
		work += flush(b);
	work += reap(b);
	kvb_hook_round(b);
	kvb_wake_workers(b);
	return work;
}

uint32_t kvb_engine_drain_worker(struct kvb_broker *b, struct kvb_worker *w)
{
	uint32_t left = kvb_ring_count(&w->seg.sq);

	/* even when w's completions back up (it has not reaped): they go to
	 * its overflow list, which grows by these `left` at most */
	while (left) {
		uint32_t n = left < KVB_BURST_MAX ? left : KVB_BURST_MAX;

		if (w->ovf_len)
			flush_overflow(w);
		if (w->ovf_len >= b->opt.max_undelivered) {
			/* its completions are not reaped: the rest waits */
			b->st.undelivered_refused++;
			break;
		}
		if (b->inf_nfree < n) { /* make room: post, take completions */
			if (b->ndirty)
				flush(b);
			reap(b);
			if (b->inf_nfree < n)
				break;
		}
		n = drain_burst(b, w, n);
		if (!n)
			break;
		left -= n;
	}
	return left;
}

/* Which clock, if any, has run out for x (0: none): its deadline, or its
 * stall clock once it started and is not waiting for the peer's blocks. */
static const char *xfer_expired(struct kvb_broker *b, struct kvb_xfer *x,
				int64_t now)
{
	uint32_t stall = x->stall_ms ? x->stall_ms : b->opt.transfer_timeout_ms;

	if (x->deadline_ns <= now)
		return "its deadline passed";
	if (x->progress != x->progress_seen) {
		x->progress_seen = x->progress;
		x->progress_ns = now;
		return NULL;
	}
	if (!x->progress_ns || kvb_hook_xfer_deferred(b, x))
		return NULL;
	if (now - x->progress_ns >= (int64_t) stall * 1000000)
		return "no progress within its stall timeout";
	return NULL;
}

void kvb_engine_timers(struct kvb_broker *b, int64_t now)
{
	kvb_hook_timers(b, now);
	/* backwards: kvb_xfer_end() swaps the last active entry into place */
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];
		const char *why;

		if (x->closing && x->fence_ns && now >= x->fence_ns) {
			/* its peer's writers did not say they stopped */
			log_warn_rl(
				"transfer '%s' of worker %u: no answer from %u "
				"P writer(s) asked to stop: it ends now",
				x->id, x->worker, x->inbound);
			b->st.fences_expired++;
			x->inbound = 0;
			x->fence_ns = 0;
			kvb_xfer_maybe_finish(b, x);
		} else if (x->closing) {
			/* ends when its ops drained */
		} else if ((why = xfer_expired(b, x, now))) {
			log_dbg("transfer '%s' of worker %u: %s", x->id,
				x->worker, why);
			kvb_xfer_finish(b, x,
					x->held_err ? x->held_err : -ETIMEDOUT);
		}
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
}

/* Does op touch a region owned by worker id? */
static int op_touches(const struct kvb_xop *op, uint32_t id)
{
	return mr_ent(op->local)->owner == id ||
	       (op->remote.mr && mr_ent(op->remote.mr)->owner == id);
}

void kvb_engine_worker_gone(struct kvb_broker *b, struct kvb_worker *w)
{
	uint32_t id = w->id;

	kvb_hook_worker_gone(b, w);
	/* ops not yet posted that read or write its memory: cancel them */
	for (uint32_t k = 0; k < b->ndirty; k++) {
		struct kvb_dest *d = &b->dests[b->dirty[k]];
		uint32_t keep = 0;

		for (uint32_t i = 0; i < d->n; i++) {
			if (op_touches(&d->ops[i], id))
				kvb_complete_inflight(
					b, (uint32_t) d->ops[i].cookie, -ENXIO);
			else
				d->ops[keep++] = d->ops[i];
		}
		d->n = keep;
	}
	/* its transfers end now; nobody is left to tell */
	for (uint32_t i = b->xfers.nactive; i-- > 0;) {
		struct kvb_xfer *x = &b->xfers.v[b->xfers.active[i]];

		if (x->worker == id)
			kvb_xfer_finish(b, x, -ECANCELED);
		if (i > b->xfers.nactive)
			i = b->xfers.nactive;
	}
	/* its regions go once nothing in flight touches them */
	for (uint32_t s = 1; s < KVB_MAX_REGIONS; s++) {
		struct kvb_region_ent *r = &b->regions.v[s];

		if (r->used && !r->dead && r->owner == id)
			kvb_region_kill(b, r);
	}
	w->attached = 0;
}

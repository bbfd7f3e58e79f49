/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the broker's engine (broker/engine.c) in this process: a
 * broker built by hand (one worker with its rings in heap memory, host
 * regions in heap memory) and a fake transport in the host slot that
 * records every chain it is handed, takes what its credit allows and
 * completes ops when the test says so. No daemon, no sockets.
 *
 * Paths: merging of contiguous descriptors into one op, flushing as chains
 * (post_batch_size), credits (a short post keeps the rest queued for the
 * next round), completions (signaled, unsignaled, failed), transfers that
 * end when their sealed count completes, and the hooks of an extension.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"
#include "kvbroker/kvbroker.h"

#define WID	 0x1001u /* gen 1, slot 1 */
#define RSZ	 (1u << 20)
#define BLK	 4096u
#define MAX_OPS	 1024u
#define RING_ENT 1024u

/* ------------------------------------------------------------------ */
/* the fake transport */

struct fake {
	struct kvb_transport base;
	unsigned credit;	     /* ops it takes now (UINT32_MAX: any) */
	unsigned posts;		     /* post() calls that took >= 1 op */
	unsigned chain[64];	     /* ops taken by each of them */
	struct kvb_xop ops[MAX_OPS]; /* every op taken, in order */
	unsigned nops;
	unsigned done;	/* ops[0..done) completed by poll() */
	unsigned ready; /* ops[0..ready) may complete */
	int32_t status; /* status of the completions */
};

static struct fake *to_fake(struct kvb_transport *t)
{
	return container_of(t, struct fake, base);
}

static int fake_post(struct kvb_transport *t, struct kvb_ep *ep,
		     const struct kvb_xop *ops, unsigned n)
{
	struct fake *f = to_fake(t);
	unsigned k = n < f->credit ? n : f->credit;

	(void) ep;
	if (!k)
		return 0;
	assert_true(f->nops + k <= MAX_OPS);
	memcpy(&f->ops[f->nops], ops, k * sizeof(*ops));
	f->nops += k;
	if (f->credit != UINT32_MAX)
		f->credit -= k;
	if (f->posts < 64)
		f->chain[f->posts] = k;
	f->posts++;
	return (int) k;
}

static int fake_poll(struct kvb_transport *t, struct kvb_xcqe *out,
		     unsigned max)
{
	struct fake *f = to_fake(t);
	unsigned n = 0;

	while (f->done < f->ready && n < max) {
		out[n].cookie = f->ops[f->done].cookie;
		out[n].status = f->status;
		n++;
		f->done++;
	}
	return (int) n;
}

static void fake_close(struct kvb_transport *t)
{
	(void) t;
}

static const struct kvb_transport_ops fake_ops = {
	.name = "fake",
	.close = fake_close,
	.post = fake_post,
	.poll = fake_poll,
};

/* ------------------------------------------------------------------ */
/* the broker around it */

struct fix {
	struct kvb_broker b;
	struct fake tr;
	struct kvb_worker *w;
	void *segmem;
	struct kvb_region_ent *src, *dst;
	void *src_mem, *dst_mem;
};

static struct kvb_region_ent *region(struct fix *f, void **mem)
{
	struct kvb_region_ent *r = kvb_region_alloc(&f->b.regions);

	assert_non_null(r);
	*mem = calloc(1, RSZ);
	assert_non_null(*mem);
	r->owner = WID;
	r->mr.kind = KVB_MEM_HOST;
	r->mr.addr = *mem;
	r->mr.len = RSZ;
	return r;
}

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct kvb_broker *b;
	size_t sz = kvb_seg_bytes(RING_ENT, RING_ENT);

	assert_non_null(f);
	b = &f->b;
	kvb_options_default(&b->opt);
	b->opt.max_workers = 4;
	b->epfd = b->listen_fd = b->efd = b->sigfd = -1;
	assert_int_equal(kvb_regions_init(&b->regions), 0);
	assert_int_equal(kvb_xfers_init(&b->xfers), 0);
	assert_int_equal(kvb_engine_init(b), 0);
	b->workers = calloc(b->opt.max_workers, sizeof(*b->workers));
	b->live = calloc(b->opt.max_workers, sizeof(*b->live));
	assert_non_null(b->workers);
	assert_non_null(b->live);
	f->w = &b->workers[KVB_WSLOT(WID)];
	f->w->id = WID;
	f->w->gen = 1;
	f->w->attached = 1;
	f->w->sock = f->w->efd = -1;
	f->w->role = KVB_ROLE_P;
	f->segmem = aligned_alloc(4096, sz);
	assert_non_null(f->segmem);
	memset(f->segmem, 0, sz);
	assert_int_equal(kvb_seg_format(&f->w->seg, f->segmem, sz, RING_ENT,
					RING_ENT, WID),
			 0);
	b->live[b->nlive++] = KVB_WSLOT(WID);
	f->tr.base.ops = &fake_ops;
	f->tr.credit = UINT32_MAX;
	b->trs[KVB_TS_HOST] = &f->tr.base;
	f->src = region(f, &f->src_mem);
	f->dst = region(f, &f->dst_mem);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	kvb_engine_fini(&f->b);
	kvb_xfers_fini(&f->b.xfers);
	kvb_regions_fini(&f->b.regions);
	free(f->w->ovf);
	free(f->b.workers);
	free(f->b.live);
	free(f->segmem);
	free(f->src_mem);
	free(f->dst_mem);
	free(f);
	return 0;
}

static void submit(struct fix *f, uint8_t op, uint64_t off, uint64_t poff,
		   uint64_t len, uint64_t tag, uint8_t flags, uint32_t xfer)
{
	struct kvb_sqe e = {
		.opcode = op,
		.flags = flags,
		.transfer = xfer,
		.region = f->src->mr.id,
		.peer_region = f->dst->mr.id,
		.offset = off,
		.peer_offset = poff,
		.len = len,
		.tag = tag,
	};

	assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1), 1);
}

static void seal(struct fix *f, uint32_t xfer, uint64_t count, uint64_t tag)
{
	struct kvb_sqe e = {.opcode = KVB_OP_SEAL,
			    .transfer = xfer,
			    .len = count,
			    .tag = tag};

	assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1), 1);
}

/* Take the worker's completions (at most max) into c; returns how many. */
static uint32_t reap(struct fix *f, struct kvb_cqe *c, uint32_t max)
{
	return kvb_ring_dequeue_burst(&f->w->seg.cq, c, max);
}

/* Let every op taken so far complete with status, and run a round. */
static void complete_all(struct fix *f, int32_t status)
{
	f->tr.status = status;
	f->tr.ready = f->tr.nops;
	kvb_engine_round(&f->b);
}

/* ------------------------------------------------------------------ */
/* merge */

/* Four descriptors contiguous on both sides go out as one op of four
 * blocks; a fifth that is not contiguous as a second op, in one chain.
 * Each descriptor still completes on its own, with its tag and bytes. */
static void test_merge_contiguous(void **state)
{
	struct fix *f = *state;
	struct kvb_cqe c[16];
	uint32_t n;

	for (uint64_t i = 0; i < 4; i++)
		submit(f, KVB_OP_WRITE, i * BLK, 8 * BLK + i * BLK, BLK,
		       100 + i, 0, 0);
	submit(f, KVB_OP_WRITE, 10 * BLK, 40 * BLK, BLK, 104, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.posts, 1);
	assert_int_equal(f->tr.nops, 2);
	assert_int_equal(f->tr.ops[0].opcode, KVB_XOP_WRITE);
	assert_int_equal(f->tr.ops[0].local_off, 0);
	assert_int_equal(f->tr.ops[0].remote_off, 8 * BLK);
	assert_int_equal(f->tr.ops[0].len, 4 * BLK);
	assert_ptr_equal(f->tr.ops[0].local, &f->src->mr);
	assert_ptr_equal(f->tr.ops[0].remote.mr, &f->dst->mr);
	assert_int_equal(f->tr.ops[1].local_off, 10 * BLK);
	assert_int_equal(f->tr.ops[1].len, BLK);
	assert_int_equal(reap(f, c, 16), 0); /* nothing completed yet */
	assert_int_equal(f->src->refs, 5);
	complete_all(f, 0);
	n = reap(f, c, 16);
	assert_int_equal(n, 5);
	for (uint32_t i = 0; i < n; i++) {
		assert_int_equal(c[i].opcode, KVB_CQ_DESC);
		assert_int_equal(c[i].status, 0);
		assert_int_equal(c[i].bytes, BLK);
		assert_int_equal(c[i].tag, 100 + i);
	}
	assert_int_equal(f->b.st.descriptors_submitted, 5);
	assert_int_equal(f->b.st.descriptors_completed, 5);
	assert_int_equal(f->b.st.bytes, 5 * BLK);
	assert_int_equal(f->src->refs, 0);
	assert_int_equal(f->dst->refs, 0);
	assert_int_equal(f->w->inf_used, 0);
	assert_int_equal(f->b.inf_nfree, KVB_INFLIGHT_MAX - 1);
}

/* Contiguous but not mergeable: a READ after a WRITE, and a run that
 * stops at a gap on the remote side only. */
static void test_merge_needs_both_sides(void **state)
{
	struct fix *f = *state;

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 1, 0, 0);
	submit(f, KVB_OP_READ, BLK, BLK, BLK, 2, 0, 0);
	submit(f, KVB_OP_READ, 2 * BLK, 3 * BLK, BLK, 3, 0, 0); /* gap */
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 3);
	assert_int_equal(f->tr.ops[1].opcode, KVB_XOP_READ);
	complete_all(f, 0);
	assert_int_equal(f->b.st.descriptors_completed, 3);
}

/* ------------------------------------------------------------------ */
/* flush and credits */

/* post_batch_size 2: five separate ops go out as chains of 2, 2, 1. */
static void test_flush_chains(void **state)
{
	struct fix *f = *state;

	f->b.opt.post_batch_size = 2;
	for (uint64_t i = 0; i < 5; i++)
		submit(f, KVB_OP_WRITE, i * 2 * BLK, i * 2 * BLK, BLK, i, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.posts, 3);
	assert_int_equal(f->tr.chain[0], 2);
	assert_int_equal(f->tr.chain[1], 2);
	assert_int_equal(f->tr.chain[2], 1);
	assert_int_equal(f->b.ndirty, 0);
	complete_all(f, 0);
	assert_int_equal(f->b.st.descriptors_completed, 5);
}

/* A transport out of credit takes a prefix; the rest stays queued for its
 * destination (dirty) and goes out, in order, once credit comes back. */
static void test_credit_short_post(void **state)
{
	struct fix *f = *state;
	struct kvb_cqe c[16];

	f->tr.credit = 2;
	for (uint64_t i = 0; i < 5; i++)
		submit(f, KVB_OP_WRITE, i * 2 * BLK, i * 2 * BLK, BLK, i, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 2);
	assert_int_equal(f->b.ndirty, 1);
	/* no credit: a round posts nothing more */
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 2);
	f->tr.credit = 2;
	complete_all(f, 0);
	assert_int_equal(reap(f, c, 16), 2);
	assert_int_equal(f->tr.nops, 4);
	f->tr.credit = UINT32_MAX;
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 5);
	assert_int_equal(f->b.ndirty, 0);
	for (unsigned i = 0; i < 5; i++)
		assert_int_equal(f->tr.ops[i].local_off, i * 2 * BLK);
	complete_all(f, 0);
	assert_int_equal(reap(f, c, 16), 3);
	assert_int_equal(c[2].tag, 4);
}

/* A transport that refuses a chain outright (-errno): every descriptor
 * in it completes with that error. */
static int refusing_post(struct kvb_transport *t, struct kvb_ep *ep,
			 const struct kvb_xop *ops, unsigned n)
{
	(void) t, (void) ep, (void) ops, (void) n;
	return -ENOTCONN;
}

static void test_post_error_fails_chain(void **state)
{
	struct fix *f = *state;
	struct kvb_transport_ops ops = fake_ops;
	struct kvb_cqe c[8];

	ops.post = refusing_post;
	f->tr.base.ops = &ops;
	submit(f, KVB_OP_WRITE, 0, 0, BLK, 7, 0, 0);
	submit(f, KVB_OP_WRITE, 4 * BLK, 8 * BLK, BLK, 8, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(reap(f, c, 8), 2);
	assert_int_equal(c[0].status, -ENOTCONN);
	assert_int_equal(c[1].status, -ENOTCONN);
	assert_int_equal(c[0].bytes, 0);
	assert_int_equal(f->b.st.bytes, 0);
	assert_int_equal(f->b.ndirty, 0);
	f->tr.base.ops = &fake_ops;
}

/* ------------------------------------------------------------------ */
/* completions */

/* Unsignaled: no completion on success, one on failure; a failed merged
 * op fails every descriptor merged into it. */
static void test_unsignaled_and_failed(void **state)
{
	struct fix *f = *state;
	struct kvb_cqe c[8];

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 1, KVB_SQE_F_UNSIGNALED, 0);
	kvb_engine_round(&f->b);
	complete_all(f, 0);
	assert_int_equal(reap(f, c, 8), 0);
	assert_int_equal(f->b.st.descriptors_completed, 1);

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 2, KVB_SQE_F_UNSIGNALED, 0);
	submit(f, KVB_OP_WRITE, BLK, BLK, BLK, 3, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 2); /* the second merged into one */
	complete_all(f, -EIO);
	assert_int_equal(reap(f, c, 8), 2);
	assert_int_equal(c[0].tag, 2);
	assert_int_equal(c[0].status, -EIO);
	assert_int_equal(c[1].tag, 3);
	assert_int_equal(c[1].status, -EIO);
	assert_int_equal(f->b.st.bytes, BLK);
}

/* A bad descriptor is refused at once, counted, and the rest go on. */
static void test_refused_descriptor(void **state)
{
	struct fix *f = *state;
	struct kvb_cqe c[8];

	submit(f, KVB_OP_WRITE, RSZ - BLK, 0, 2 * BLK, 1, 0, 0); /* bounds */
	submit(f, KVB_OP_WRITE, 0, 0, BLK, 2, 0, 0);
	kvb_engine_round(&f->b);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].tag, 1);
	assert_int_equal(c[0].status, -EFAULT);
	assert_int_equal(f->b.st.descriptors_refused, 1);
	assert_int_equal(f->tr.nops, 1);
	complete_all(f, 0);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].tag, 2);
}

/* Completions that do not fit the CQ ring wait in the overflow list and
 * are delivered, in order, once the worker reaps. */
static void nops(struct fix *f, uint64_t first, uint32_t n)
{
	for (uint64_t i = first; i < first + n; i++) {
		struct kvb_sqe e = {.opcode = KVB_OP_NOP, .tag = i};

		assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1),
				 1);
	}
}

static void test_cq_overflow(void **state)
{
	struct fix *f = *state;
	struct kvb_cqe c[RING_ENT];
	uint32_t got = 0, n;

	nops(f, 0, RING_ENT);
	for (int k = 0; k < 64 && kvb_ring_count(&f->w->seg.sq); k++)
		kvb_engine_round(&f->b);
	assert_int_equal(kvb_ring_count(&f->w->seg.sq), 0);
	assert_int_equal(kvb_ring_count(&f->w->seg.cq), RING_ENT);
	nops(f, RING_ENT, 10);
	kvb_engine_round(&f->b);
	assert_int_equal(f->w->ovf_len, 10);
	while ((n = reap(f, c, RING_ENT))) {
		for (uint32_t i = 0; i < n; i++)
			assert_int_equal(c[i].tag, got + i);
		got += n;
		kvb_engine_round(&f->b);
	}
	assert_int_equal(got, RING_ENT + 10);
	assert_int_equal(f->w->ovf_len, 0);
}

/* ------------------------------------------------------------------ */
/* transfers */

static uint32_t open_xfer(struct fix *f, const char *id)
{
	int err = 0;
	struct kvb_xfer *x = kvb_xfer_open(&f->b.xfers, WID, id, strlen(id),
					   kvb_now_ns() + 60000000000ll, &err);

	assert_non_null(x);
	x->opened = 1;
	return kvb_xfer_handle(&f->b.xfers, x);
}

/* A sealed transfer ends when its count of ops completed, with one
 * KVB_CQ_TRANSFER completion carrying the seal's tag. */
static void test_transfer_completes(void **state)
{
	struct fix *f = *state;
	uint32_t h = open_xfer(f, "req-1");
	struct kvb_cqe c[8];

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 1, KVB_SQE_F_UNSIGNALED, h);
	submit(f, KVB_OP_WRITE, BLK, BLK, BLK, 2, KVB_SQE_F_UNSIGNALED, h);
	seal(f, h, 2, 99);
	kvb_engine_round(&f->b);
	assert_int_equal(reap(f, c, 8), 0);
	assert_non_null(kvb_xfer_get(&f->b.xfers, h, WID));
	complete_all(f, 0);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].opcode, KVB_CQ_TRANSFER);
	assert_int_equal(c[0].tag, 99);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(c[0].transfer, h);
	assert_null(kvb_xfer_get(&f->b.xfers, h, WID));
	assert_int_equal(f->b.st.transfers_done, 1);
}

/* A transfer whose op failed ends with that error once everything of it
 * drained; a late op for it is refused. */
static void test_transfer_fails(void **state)
{
	struct fix *f = *state;
	uint32_t h = open_xfer(f, "req-2");
	struct kvb_cqe c[8];

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 1, KVB_SQE_F_UNSIGNALED, h);
	seal(f, h, 1, 50);
	kvb_engine_round(&f->b);
	complete_all(f, -EIO);
	assert_int_equal(reap(f, c, 8), 2);
	assert_int_equal(c[0].opcode, KVB_CQ_DESC);
	assert_int_equal(c[0].status, -EIO);
	assert_int_equal(c[1].opcode, KVB_CQ_TRANSFER);
	assert_int_equal(c[1].status, -EIO);
	assert_int_equal(f->b.st.transfers_failed, 1);
	submit(f, KVB_OP_WRITE, 0, 0, BLK, 3, 0, h);
	kvb_engine_round(&f->b);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].status, -EINVAL);
}

/* Ops of two transfers are never merged into one (each counts its own). */
static void test_no_merge_across_transfers(void **state)
{
	struct fix *f = *state;
	uint32_t h1 = open_xfer(f, "a"), h2 = open_xfer(f, "b");

	submit(f, KVB_OP_WRITE, 0, 0, BLK, 1, 0, h1);
	submit(f, KVB_OP_WRITE, BLK, BLK, BLK, 2, 0, h2);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 2);
	complete_all(f, 0);
}

/* ------------------------------------------------------------------ */
/* hooks */

static struct {
	unsigned layer_ops, groups, ends;
	uint64_t group_bytes;
	int group_status;
	int group_last; /* h_group: say the group completed */
	int layer_now;	/* h_layer: say the layer op completed at once */
} seen;

static int h_layer(struct kvb_broker *b, struct kvb_worker *w,
		   const struct kvb_sqe *e, struct kvb_op_done *done)
{
	(void) b;
	seen.layer_ops++;
	if (!seen.layer_now)
		return 0;
	*done = (struct kvb_op_done){
		.worker = w->id, .tag = e->tag, .status = -ENOENT};
	return 1;
}

static int h_group(struct kvb_broker *b, uint32_t g, int status, uint64_t bytes,
		   struct kvb_op_done *done, uint32_t *stale)
{
	(void) b;
	assert_int_equal(g, 7);
	seen.groups++;
	seen.group_bytes += bytes;
	seen.group_status = status;
	*stale = 0;
	if (!seen.group_last)
		return 0;
	*done = (struct kvb_op_done){.worker = WID,
				     .tag = 77,
				     .bytes = seen.group_bytes,
				     .status = status};
	return 1;
}

static void h_end(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	(void) b, (void) x, (void) status;
	seen.ends++;
}

static const struct kvb_engine_hooks hooks = {
	.layer_op = h_layer,
	.group_done = h_group,
	.xfer_end = h_end,
};

/* Without hooks a layer op is refused (-EINVAL); with them it goes to the
 * extension, and so does an in-flight entry of one of its groups, which
 * then makes no completion of its own. */
static void test_hooks(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e = {.opcode = KVB_OP_LAYER, .tag = 5, .layer = 1};
	struct kvb_cqe c[8];
	struct kvb_xop op = {0};
	uint32_t idx;

	memset(&seen, 0, sizeof(seen));
	assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1), 1);
	kvb_engine_round(&f->b);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].status, -EINVAL);
	assert_int_equal(f->b.st.descriptors_refused, 1);

	kvb_engine_set_hooks(&f->b, &hooks, f);
	assert_ptr_equal(kvb_engine_ctx(&f->b), f);
	assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1), 1);
	kvb_engine_round(&f->b);
	assert_int_equal(seen.layer_ops, 1);
	assert_int_equal(reap(f, c, 8), 0);

	/* what the extension does for a layer op: an in-flight entry of
	 * its group, appended to a destination, flushed, completed */
	idx = kvb_inflight_alloc(&f->b);
	assert_int_not_equal(idx, 0);
	f->b.inf[idx].worker = WID;
	f->b.inf[idx].group = 7;
	f->b.inf[idx].bytes = 3 * BLK;
	op.opcode = KVB_XOP_WRITE;
	op.local = &f->src->mr;
	op.remote.mr = &f->dst->mr;
	op.len = 3 * BLK;
	op.cookie = idx;
	f->b.dests[KVB_TS_HOST * f->b.opt.max_workers].tr = &f->tr.base;
	assert_int_equal(
		kvb_dest_append(&f->b, KVB_TS_HOST * f->b.opt.max_workers, &op),
		0);
	kvb_engine_round(&f->b);
	assert_int_equal(f->tr.nops, 1);
	complete_all(f, 0);
	assert_int_equal(seen.groups, 1);
	assert_int_equal(seen.group_bytes, 3 * BLK);
	assert_int_equal(seen.group_status, 0);
	assert_int_equal(reap(f, c, 8), 0);

	/* the hook says that was the group's last entry: the engine posts
	 * the layer op's completion that the hook handed back */
	seen.group_last = 1;
	idx = kvb_inflight_alloc(&f->b);
	assert_int_not_equal(idx, 0);
	f->b.inf[idx].worker = WID;
	f->b.inf[idx].group = 7;
	f->b.inf[idx].bytes = BLK;
	op.len = BLK;
	op.cookie = idx;
	assert_int_equal(
		kvb_dest_append(&f->b, KVB_TS_HOST * f->b.opt.max_workers, &op),
		0);
	kvb_engine_round(&f->b);
	complete_all(f, 0);
	assert_int_equal(seen.groups, 2);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].opcode, KVB_CQ_DESC);
	assert_int_equal(c[0].tag, 77);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(c[0].bytes, 4 * BLK);

	/* a layer op the hook completes at once: the engine posts it */
	seen.layer_now = 1;
	assert_int_equal(kvb_ring_enqueue_burst(&f->w->seg.sq, &e, 1), 1);
	kvb_engine_round(&f->b);
	assert_int_equal(seen.layer_ops, 2);
	assert_int_equal(reap(f, c, 8), 1);
	assert_int_equal(c[0].tag, 5);
	assert_int_equal(c[0].status, -ENOENT);

	/* a transfer without extension state (x->rx NULL) never reaches
	 * the xfer hooks */
	{
		uint32_t h = open_xfer(f, "local");

		seal(f, h, 0, 1);
		kvb_engine_round(&f->b);
		assert_int_equal(reap(f, c, 8), 1);
		assert_int_equal(c[0].opcode, KVB_CQ_TRANSFER);
		assert_int_equal(seen.ends, 0);
	}
	kvb_engine_set_hooks(&f->b, NULL, NULL);
	assert_null(kvb_engine_ctx(&f->b));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_merge_contiguous, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_merge_needs_both_sides,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_flush_chains, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_credit_short_post, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_post_error_fails_chain,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_unsignaled_and_failed,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_descriptor, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_cq_overflow, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_transfer_completes, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_transfer_fails, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_merge_across_transfers,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_hooks, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

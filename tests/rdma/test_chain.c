// SPDX-License-Identifier: MIT
/*
 * Unit tests of bridge/rdma/chain.c: chain building, merging (gather lists
 * too), batch limits,
 * the signaling policy, credits, retirement and error coverage. No device.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bridge/rdma/chain.h"

#define REGION (1u << 20)

static char lbuf[REGION];
static struct kvb_mr lmr = {
	.id = 1, .addr = lbuf, .len = REGION, .lkey = 0x11, .rkey = 0x22};
static struct kvb_mr lmr2 = {
	.id = 2, .addr = lbuf, .len = REGION, .lkey = 0x33, .rkey = 0x44};

#define RADDR 0x7f0000000000ull

static struct kvb_xop xop(uint32_t code, uint64_t loff, uint64_t roff,
			  uint64_t len, uint64_t cookie)
{
	struct kvb_xop o = {
		.opcode = code,
		.local = &lmr,
		.local_off = loff,
		.remote = {.addr = RADDR, .rkey = 0x99},
		.remote_off = roff,
		.len = len,
		.cookie = cookie,
	};
	return o;
}

/* n ops of `len` bytes; scattered (never mergeable) unless contiguous. */
static struct kvb_xop *mkops(unsigned n, uint64_t len, int contiguous)
{
	struct kvb_xop *ops = calloc(n, sizeof(*ops));
	unsigned i;

	assert_non_null(ops);
	for (i = 0; i < n; i++) {
		uint64_t off = contiguous ? i * len : (uint64_t) i * 2 * len;

		ops[i] = xop(KVB_XOP_WRITE, off % (REGION - 2 * len), off, len,
			     1000 + i);
		if (!contiguous)
			ops[i].local_off = (uint64_t) (i % 64) * 2 * len;
	}
	return ops;
}

static void init(struct kvb_chain *c, uint32_t depth, int batch, uint32_t sig)
{
	struct kvb_chain_params p = {
		.depth = depth,
		.post_batch = batch,
		.signal_every = sig,
		.qp_index = 3,
	};

	assert_int_equal(kvb_chain_init(c, &p), 0);
}

/* Post the staged chain as the hardware would take it all. */
static unsigned post_all(struct kvb_chain *c)
{
	return kvb_chain_commit(c, c->staged);
}

/* Complete every signaled posted WR, in order, successfully. */
static void complete_all(struct kvb_chain *c)
{
	uint32_t s;

	for (s = c->done; s != c->head; s++)
		if (c->wri[s & c->wr_mask].signaled)
			kvb_chain_complete(c,
					   (uint64_t) 3 << 48 |
						   (uint64_t) c->gen << 32 | s,
					   0);
}

static uint64_t wr_id_of(struct kvb_chain *c, uint32_t seq)
{
	return (uint64_t) 3 << 48 | (uint64_t) c->gen << 32 | seq;
}

static void test_single_and_fields(void **state)
{
	struct kvb_chain c;
	struct kvb_xop op = xop(KVB_XOP_READ, 4096, 8192, 512, 42);
	struct kvb_xcqe cq[4];

	(void) state;
	init(&c, 16, -1, 0);
	assert_int_equal(kvb_chain_build(&c, &op, 1), 1);
	assert_int_equal(c.staged, 1);
	assert_int_equal(c.wr[0].opcode, IBV_WR_RDMA_READ);
	assert_int_equal(c.wr[0].send_flags, IBV_SEND_SIGNALED);
	assert_null(c.wr[0].next);
	assert_ptr_equal(c.wr[0].sg_list, &c.sge[0]);
	assert_int_equal(c.wr[0].num_sge, 1);
	assert_int_equal(c.sge[0].addr, (uintptr_t) lbuf + 4096);
	assert_int_equal(c.sge[0].length, 512);
	assert_int_equal(c.sge[0].lkey, 0x11);
	assert_int_equal(c.wr[0].wr.rdma.remote_addr, RADDR + 8192);
	assert_int_equal(c.wr[0].wr.rdma.rkey, 0x99);
	assert_int_equal(kvb_chain_wr_id_qp(c.wr[0].wr_id), 3);
	assert_int_equal(post_all(&c), 1);
	assert_int_equal(c.credits, 15);
	assert_int_equal(kvb_chain_ready(&c), 0);
	assert_int_equal(kvb_chain_complete(&c, c.wr[0].wr_id, 0), 1);
	assert_int_equal(c.credits, 16);
	assert_int_equal(kvb_chain_ready(&c), 1);
	assert_int_equal(kvb_chain_reap(&c, cq, 4), 1);
	assert_int_equal(cq[0].cookie, 42);
	assert_int_equal(cq[0].status, 0);
	kvb_chain_fini(&c);
}

static void test_merge_contiguous(void **state)
{
	struct kvb_chain c;
	struct kvb_xop ops[6];
	struct kvb_xcqe cq[8];
	unsigned i;

	(void) state;
	init(&c, 16, -1, 0);
	/* 0,1,2 contiguous on both sides; 3 local gap; 4 other opcode;
	 * 5 other MR (lkey) but adjacent. */
	ops[0] = xop(KVB_XOP_WRITE, 0, 0, 100, 0);
	ops[1] = xop(KVB_XOP_WRITE, 100, 100, 100, 1);
	ops[2] = xop(KVB_XOP_WRITE, 200, 200, 50, 2);
	ops[3] = xop(KVB_XOP_WRITE, 300, 250, 50, 3);
	ops[4] = xop(KVB_XOP_READ, 350, 300, 50, 4);
	ops[5] = xop(KVB_XOP_READ, 400, 350, 50, 5);
	ops[5].local = &lmr2;
	assert_int_equal(kvb_chain_build(&c, ops, 6), 6);
	assert_int_equal(c.staged, 4);
	assert_int_equal(c.sge[0].length, 250);
	assert_int_equal(c.sge[1].length, 50);
	assert_int_equal(c.wr[2].opcode, IBV_WR_RDMA_READ);
	assert_int_equal(c.sge[3].lkey, 0x33);
	/* remote-only adjacency is not enough either */
	assert_int_equal(c.wr[1].wr.rdma.remote_addr, RADDR + 250);
	assert_int_equal(kvb_chain_staged_bytes(&c, 4), 400);
	assert_int_equal(post_all(&c), 6);
	assert_int_equal(c.st.wrs, 4);
	assert_int_equal(c.st.ops, 6);
	complete_all(&c);
	assert_int_equal(kvb_chain_reap(&c, cq, 8), 6);
	for (i = 0; i < 6; i++)
		assert_int_equal(cq[i].cookie, i);
	kvb_chain_fini(&c);
}

/* max_sge > 1: ops contiguous at the remote side only become one WR with
 * an SGE per local piece (a gather), up to max_sge; both-sides runs still
 * extend the last SGE; an empty first piece is not left as an SGE; a READ
 * scatters the same way; a WR's error covers all its ops. */
static void test_gather(void **state)
{
	struct kvb_chain_params p = {
		.depth = 16, .post_batch = -1, .max_sge = 4, .qp_index = 3};
	struct kvb_xcqe cq[16];
	struct kvb_xop ops[12];
	struct kvb_chain c;
	unsigned i;

	(void) state;
	assert_int_equal(kvb_chain_init(&c, &p), 0);
	/* 6 pieces of 256 B, local stride 1024, remote contiguous: 4 + 2;
	 * then piece 6 continues piece 5 locally too (the same SGE grows) */
	for (i = 0; i < 6; i++)
		ops[i] = xop(KVB_XOP_WRITE, i * 1024, i * 256, 256, i);
	ops[6] = xop(KVB_XOP_WRITE, 5 * 1024 + 256, 6 * 256, 256, 6);
	/* 7: a second MR (another lkey), remote contiguous: an SGE of its
	 * own in the same WR */
	ops[7] = xop(KVB_XOP_WRITE, 9000, 7 * 256, 100, 7);
	ops[7].local = &lmr2;
	/* 8: remote gap: a new WR */
	ops[8] = xop(KVB_XOP_WRITE, 20000, 4096, 100, 8);
	assert_int_equal(kvb_chain_build(&c, ops, 9), 9);
	assert_int_equal(c.staged, 3);
	assert_int_equal(c.wr[0].num_sge, 4);
	for (i = 0; i < 4; i++) {
		assert_int_equal(c.wr[0].sg_list[i].addr,
				 (uint64_t) (uintptr_t) lbuf + i * 1024);
		assert_int_equal(c.wr[0].sg_list[i].length, 256);
		assert_int_equal(c.wr[0].sg_list[i].lkey, 0x11);
	}
	assert_int_equal(c.wr[0].wr.rdma.remote_addr, RADDR);
	assert_int_equal(c.wr[1].num_sge, 3);
	assert_int_equal(c.wr[1].wr.rdma.remote_addr, RADDR + 4 * 256);
	assert_int_equal(c.wr[1].sg_list[1].length, 512); /* 5 and 6 */
	assert_int_equal(c.wr[1].sg_list[2].lkey, 0x33);
	assert_int_equal(c.wr[2].num_sge, 1);
	assert_int_equal(kvb_chain_staged_bytes(&c, 3), 7 * 256 + 200);
	assert_int_equal(post_all(&c), 9);
	assert_int_equal(c.st.wrs, 3);
	/* the first WR fails: its 4 ops fail, the rest are cancelled */
	assert_int_equal(
		kvb_chain_complete(&c, wr_id_of(&c, 0),
				   kvb_chain_wc_errno(IBV_WC_REM_ACCESS_ERR)),
		9);
	assert_int_equal(kvb_chain_reap(&c, cq, 16), 9);
	for (i = 0; i < 9; i++)
		assert_int_equal(cq[i].status, i < 4 ? -EACCES : -ECANCELED);
	assert_int_equal(kvb_chain_reset(&c), 0);

	/* an empty first op is taken over by the next piece; a READ into
	 * scattered local pieces from one remote range */
	ops[0] = xop(KVB_XOP_READ, 500, 0, 0, 20);
	ops[1] = xop(KVB_XOP_READ, 4096, 0, 64, 21);
	ops[2] = xop(KVB_XOP_READ, 8192, 64, 64, 22);
	assert_int_equal(kvb_chain_build(&c, ops, 3), 3);
	assert_int_equal(c.staged, 1);
	assert_int_equal(c.wr[0].opcode, IBV_WR_RDMA_READ);
	assert_int_equal(c.wr[0].num_sge, 2);
	assert_int_equal(c.wr[0].sg_list[0].addr,
			 (uint64_t) (uintptr_t) lbuf + 4096);
	assert_int_equal(c.wr[0].sg_list[0].length, 64);
	kvb_chain_fini(&c);

	/* max_sge 1 (the default): the same strided pieces, one WR each */
	init(&c, 16, -1, 0);
	for (i = 0; i < 6; i++)
		ops[i] = xop(KVB_XOP_WRITE, i * 1024, i * 256, 256, i);
	assert_int_equal(kvb_chain_build(&c, ops, 6), 6);
	assert_int_equal(c.staged, 6);
	assert_int_equal(c.wr[0].num_sge, 1);
	kvb_chain_fini(&c);
}

static void test_merge_limits(void **state)
{
	struct kvb_chain c;
	struct kvb_chain_params p = {
		.depth = 8,
		.post_batch = -1,
		.merge_max = 4,
		.wr_max_bytes = 1000,
	};
	struct kvb_xop *ops = mkops(10, 100, 1);

	(void) state;
	assert_int_equal(kvb_chain_init(&c, &p), 0);
	/* merge_max 4: 10 ops -> 4 + 4 + 2 */
	assert_int_equal(kvb_chain_build(&c, ops, 10), 10);
	assert_int_equal(c.staged, 3);
	assert_int_equal(c.sge[0].length, 400);
	assert_int_equal(c.sge[2].length, 200);
	kvb_chain_fini(&c);

	/* wr_max_bytes 1000 with 300-byte ops -> 3 per WR */
	p.merge_max = 0;
	free(ops);
	ops = mkops(7, 300, 1);
	assert_int_equal(kvb_chain_init(&c, &p), 0);
	assert_int_equal(kvb_chain_build(&c, ops, 7), 7);
	assert_int_equal(c.staged, 3);
	assert_int_equal(c.sge[0].length, 900);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_batch_limits(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(100, 64, 0);

	(void) state;
	/* post_batch 8: 8 WRs per chain */
	init(&c, 64, 8, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 100), 8);
	assert_int_equal(c.staged, 8);
	assert_null(c.wr[7].next);
	assert_ptr_equal(c.wr[6].next, &c.wr[7]);
	assert_int_equal(c.st.credit_stalls, 0); /* a full chain is no stall */
	kvb_chain_fini(&c);

	/* -1 = all pending, bounded by the depth */
	init(&c, 64, -1, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 50), 50);
	assert_int_equal(c.staged, 50);
	assert_int_equal(kvb_chain_build(&c, ops, 100), 64);
	assert_int_equal(c.staged, 64);
	kvb_chain_fini(&c);

	/* 0 behaves like -1; batch larger than depth clamps to depth */
	init(&c, 16, 0, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 100), 16);
	kvb_chain_fini(&c);
	init(&c, 16, 1000, 0);
	assert_int_equal(c.max_wrs, 16);
	kvb_chain_fini(&c);

	/* batch 1: per-op doorbells */
	init(&c, 16, 1, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 100), 1);
	assert_int_equal(c.staged, 1);
	assert_int_equal(c.wr[0].send_flags, IBV_SEND_SIGNALED);
	assert_null(c.wr[0].next);
	kvb_chain_fini(&c);
	free(ops);
}

/* build_max: the chain ends before the op that would pass max_bytes (a
 * merged run counts op by op); the first op always goes; inflight_bytes
 * follows commits and retirements, errors included. */
static void test_byte_cap_and_inflight(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(10, 1000, 0);
	struct kvb_xop *run = mkops(10, 1000, 1);
	struct kvb_xcqe cq[16];

	(void) state;
	init(&c, 64, -1, 0);
	assert_int_equal(kvb_chain_build_max(&c, ops, 10, 3500), 3);
	assert_int_equal(kvb_chain_staged_bytes(&c, c.staged), 3000);
	assert_int_equal(kvb_chain_build_max(&c, ops, 10, 3000), 3);
	assert_int_equal(kvb_chain_build_max(&c, ops, 10, 10), 1);
	assert_int_equal(kvb_chain_build_max(&c, ops, 10, 0), 1);
	assert_int_equal(kvb_chain_build_max(&c, run, 10, 4999), 4);
	assert_int_equal(c.staged, 1); /* one merged WR of 4 ops */
	assert_int_equal(kvb_chain_build(&c, ops, 10), 10);
	assert_int_equal(c.inflight_bytes, 0);
	post_all(&c); /* 10 WRs; completions for WRs 4 and 7 below */
	assert_int_equal(c.inflight_bytes, 10000);
	assert_int_equal(kvb_chain_complete(&c, wr_id_of(&c, 4), 0), 5);
	assert_int_equal(c.inflight_bytes, 5000);
	assert_int_equal(
		kvb_chain_complete(&c, wr_id_of(&c, 7),
				   kvb_chain_wc_errno(IBV_WC_REM_ACCESS_ERR)),
		5);
	assert_int_equal(c.inflight_bytes, 0);
	assert_int_equal(kvb_chain_reap(&c, cq, 16), 10);
	assert_int_equal(kvb_chain_reset(&c), 0);
	assert_int_equal(c.inflight_bytes, 0);
	kvb_chain_fini(&c);
	free(ops);
	free(run);
}

static void test_signaling(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(64, 64, 0);
	unsigned i, sig = 0;

	(void) state;
	/* signal_every 5 over a chain of 23: WRs 4,9,14,19 and the last */
	init(&c, 64, -1, 5);
	assert_int_equal(kvb_chain_build(&c, ops, 23), 23);
	for (i = 0; i < 23; i++) {
		int want = i == 22 || (i + 1) % 5 == 0;

		assert_int_equal(!!(c.wr[i].send_flags & IBV_SEND_SIGNALED),
				 want);
		sig += want;
	}
	assert_int_equal(sig, 5);
	post_all(&c);
	assert_int_equal(c.st.signaled, 5);
	kvb_chain_fini(&c);

	/* default: depth / 2 */
	init(&c, 64, -1, 0);
	assert_int_equal(c.p.signal_every, 32);
	assert_int_equal(kvb_chain_build(&c, ops, 64), 64);
	for (i = 0, sig = 0; i < 64; i++)
		sig += !!(c.wr[i].send_flags & IBV_SEND_SIGNALED);
	assert_int_equal(sig, 2);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_credits(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(1000, 64, 0);
	unsigned posted = 0, in_flight_max = 0, rounds = 0;
	struct kvb_xcqe cq[64];
	uint64_t next_cookie = 1000;

	(void) state;
	init(&c, 16, 6, 4);
	/* Drive 1000 ops through a depth-16 queue; complete lazily. */
	while (posted < 1000 || c.tail != c.head) {
		int r = posted < 1000 ? kvb_chain_build(&c, ops + posted,
							1000 - posted)
				      : 0;
		unsigned got, i;

		assert_true(r >= 0);
		if (r > 0) {
			assert_true(c.staged <= c.credits);
			posted += kvb_chain_commit(&c, c.staged);
		}
		assert_true(c.head - c.done <= 16);
		assert_int_equal(c.credits, 16 - (c.head - c.done));
		if (c.head - c.done > in_flight_max)
			in_flight_max = c.head - c.done;
		/* complete the oldest signaled WR every other round */
		if (rounds++ % 2 == 0 || posted == 1000) {
			uint32_t s;

			for (s = c.done; s != c.head; s++)
				if (c.wri[s & c.wr_mask].signaled) {
					kvb_chain_complete(&c, wr_id_of(&c, s),
							   0);
					break;
				}
		}
		got = kvb_chain_reap(&c, cq, 64);
		for (i = 0; i < got; i++) {
			assert_int_equal(cq[i].cookie, next_cookie++);
			assert_int_equal(cq[i].status, 0);
		}
	}
	assert_int_equal(next_cookie, 2000);
	assert_int_equal(in_flight_max, 16);
	assert_true(c.st.credit_stalls > 0);
	assert_int_equal(c.credits, 16);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_stall_counting(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(40, 64, 0);

	(void) state;
	init(&c, 16, 10, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 40), 10);
	post_all(&c);
	assert_int_equal(c.st.credit_stalls, 0);
	/* 6 credits left, batch 10: a short chain is a stall */
	assert_int_equal(kvb_chain_build(&c, ops + 10, 30), 6);
	assert_int_equal(c.st.credit_stalls, 1);
	post_all(&c);
	/* none left: 0, the same stall (retries don't count again) */
	assert_int_equal(kvb_chain_build(&c, ops + 16, 24), 0);
	assert_int_equal(kvb_chain_build(&c, ops + 16, 24), 0);
	assert_int_equal(c.st.credit_stalls, 1);
	assert_int_equal(c.staged, 0);
	/* fewer ops than credit: no stall */
	complete_all(&c);
	assert_int_equal(kvb_chain_build(&c, ops + 16, 3), 3);
	assert_int_equal(c.st.credit_stalls, 1);
	post_all(&c);
	assert_int_equal(kvb_chain_build(&c, ops + 19, 21), 10);
	post_all(&c);
	assert_int_equal(c.st.credit_stalls, 1);
	/* credit came back in between: a new episode */
	assert_int_equal(kvb_chain_build(&c, ops + 29, 11), 3);
	assert_int_equal(c.st.credit_stalls, 2);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_partial_commit(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(8, 64, 0);

	(void) state;
	init(&c, 16, -1, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 8), 8);
	/* bad_wr at index 5: five went */
	assert_int_equal(kvb_chain_commit(&c, 5), 5);
	assert_int_equal(c.credits, 11);
	assert_int_equal(c.head, 5);
	assert_int_equal(c.ck_head, 5);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_error_coverage(void **state)
{
	struct kvb_chain c;
	struct kvb_xop ops[12];
	struct kvb_xcqe cq[16];
	unsigned i, n;

	(void) state;
	init(&c, 32, -1, 4);
	/* 12 ops; ops 2,3 merge into one WR -> 11 WRs (seq 0..10) */
	for (i = 0; i < 12; i++)
		ops[i] = xop(KVB_XOP_WRITE, i * 1000, i * 1000, 100, i);
	ops[3].local_off = 2 * 1000 + 100;
	ops[3].remote_off = 2 * 1000 + 100;
	assert_int_equal(kvb_chain_build(&c, ops, 12), 12);
	assert_int_equal(c.staged, 11);
	post_all(&c);
	/* WR 3 signaled (signal_every 4) completes fine: WRs 0..3 */
	assert_int_equal(kvb_chain_complete(&c, wr_id_of(&c, 3), 0), 5);
	/* WR 6 (ops 7) fails with a remote access error */
	n = kvb_chain_complete(&c, wr_id_of(&c, 6),
			       kvb_chain_wc_errno(IBV_WC_REM_ACCESS_ERR));
	assert_int_equal(n, 7); /* WRs 4,5 ok; 6 failed; 7..10 cancelled */
	assert_int_equal(c.broken, 1);
	/* flushes that follow are stale */
	assert_int_equal(kvb_chain_complete(&c, wr_id_of(&c, 8), -ECANCELED),
			 0);
	assert_int_equal(c.st.stale_cqes, 1);
	assert_int_equal(kvb_chain_reap(&c, cq, 16), 12);
	for (i = 0; i < 12; i++) {
		int want = i < 7 ? 0 : i == 7 ? -EACCES : -ECANCELED;

		assert_int_equal(cq[i].cookie, i);
		assert_int_equal(cq[i].status, want);
	}
	assert_int_equal(c.st.failed_ops, 5);
	/* broken until reset */
	assert_int_equal(kvb_chain_build(&c, ops, 1), -ENOTCONN);
	assert_int_equal(kvb_chain_reset(&c), 0);
	assert_int_equal(c.credits, 32);
	/* an old-generation completion is ignored after reset */
	assert_int_equal(kvb_chain_build(&c, ops, 1), 1);
	post_all(&c);
	assert_int_equal(
		kvb_chain_complete(&c,
				   (uint64_t) 3 << 48 |
					   (uint64_t) (c.gen - 1) << 32 | 11,
				   -ECANCELED),
		0);
	assert_int_equal(c.done, 11);
	assert_int_equal(kvb_chain_complete(&c, wr_id_of(&c, 11), 0), 1);
	assert_int_equal(kvb_chain_reap(&c, cq, 16), 1);
	assert_int_equal(cq[0].status, 0);
	kvb_chain_fini(&c);
}

static void test_error_first_wr(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(4, 64, 0);
	struct kvb_xcqe cq[8];

	(void) state;
	init(&c, 8, -1, 0);
	kvb_chain_build(&c, ops, 4);
	post_all(&c);
	/* an unsignaled WR reports its error itself (errors always do) */
	assert_int_equal(kvb_chain_complete(&c, wr_id_of(&c, 0), -ETIMEDOUT),
			 4);
	assert_int_equal(kvb_chain_reap(&c, cq, 8), 4);
	assert_int_equal(cq[0].status, -ETIMEDOUT);
	assert_int_equal(cq[3].status, -ECANCELED);
	/* reset refuses while WRs are live */
	kvb_chain_fini(&c);
	init(&c, 8, -1, 0);
	kvb_chain_build(&c, ops, 4);
	post_all(&c);
	assert_int_equal(kvb_chain_reset(&c), -EBUSY);
	assert_int_equal(kvb_chain_fail_all(&c, -ECANCELED), 4);
	assert_int_equal(kvb_chain_reset(&c), 0);
	assert_int_equal(kvb_chain_reap(&c, cq, 8), 4);
	assert_int_equal(cq[0].status, -ECANCELED);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_reap_partial(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(20, 64, 1); /* one merged WR */
	struct kvb_xcqe cq[8];
	unsigned got = 0, n;

	(void) state;
	init(&c, 8, -1, 0);
	assert_int_equal(kvb_chain_build(&c, ops, 20), 20);
	assert_int_equal(c.staged, 1);
	post_all(&c);
	complete_all(&c);
	assert_int_equal(kvb_chain_ready(&c), 20);
	while ((n = kvb_chain_reap(&c, cq, 3)) > 0) {
		assert_int_equal(cq[0].cookie, 1000 + got);
		got += n;
	}
	assert_int_equal(got, 20);
	assert_int_equal(c.tail, c.done);
	kvb_chain_fini(&c);
	free(ops);
}

static void test_bad_ops(void **state)
{
	struct kvb_chain c;
	struct kvb_xop ops[3];

	(void) state;
	init(&c, 8, -1, 0);
	ops[0] = xop(7, 0, 0, 10, 1);
	assert_int_equal(kvb_chain_build(&c, ops, 1), -EINVAL);
	ops[0] = xop(KVB_XOP_WRITE, REGION - 10, 0, 11, 1);
	assert_int_equal(kvb_chain_build(&c, ops, 1), -EFAULT);
	ops[0] = xop(KVB_XOP_WRITE, UINT64_MAX - 2, 0, 11, 1);
	assert_int_equal(kvb_chain_build(&c, ops, 1), -EFAULT);
	ops[0] = xop(KVB_XOP_WRITE, 0, 0, 10, 1);
	ops[0].local = NULL;
	assert_int_equal(kvb_chain_build(&c, ops, 1), -EINVAL);
	/* a bad op later ends the chain before it */
	ops[0] = xop(KVB_XOP_WRITE, 0, 0, 10, 1);
	ops[1] = xop(KVB_XOP_WRITE, REGION, 0, 10, 2);
	assert_int_equal(kvb_chain_build(&c, ops, 2), 1);
	/* zero length: a WR without SGE */
	ops[0] = xop(KVB_XOP_WRITE, 0, 0, 0, 1);
	assert_int_equal(kvb_chain_build(&c, ops, 1), 1);
	assert_int_equal(c.wr[0].num_sge, 0);
	kvb_chain_fini(&c);
	{
		struct kvb_chain_params p = {.depth = 0};

		assert_int_equal(kvb_chain_init(&c, &p), -EINVAL);
		p.depth = 4;
		p.wr_max_bytes = 1ull << 32;
		assert_int_equal(kvb_chain_init(&c, &p), -EINVAL);
	}
}

static void test_wc_errno(void **state)
{
	(void) state;
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_SUCCESS), 0);
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_WR_FLUSH_ERR), -ECANCELED);
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_REM_ACCESS_ERR), -EACCES);
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_RETRY_EXC_ERR), -ETIMEDOUT);
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_LOC_PROT_ERR), -EFAULT);
	assert_int_equal(kvb_chain_wc_errno(IBV_WC_GENERAL_ERR), -EIO);
}

static void test_wraparound(void **state)
{
	struct kvb_chain c;
	struct kvb_xop *ops = mkops(3, 64, 0);
	struct kvb_xcqe cq[4];
	unsigned i;

	(void) state;
	init(&c, 4, -1, 0);
	/* start the sequence numbers just below the u32 wrap */
	c.head = c.done = c.tail = UINT32_MAX - 1;
	c.ck_head = c.ck_tail = UINT32_MAX - 1;
	for (i = 0; i < 3; i++) {
		assert_int_equal(kvb_chain_build(&c, ops, 3), 3);
		post_all(&c);
		complete_all(&c);
		assert_int_equal(kvb_chain_reap(&c, cq, 4), 3);
		assert_int_equal(cq[2].cookie, 1002);
	}
	assert_int_equal(c.credits, 4);
	kvb_chain_fini(&c);
	free(ops);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_single_and_fields),
		cmocka_unit_test(test_merge_contiguous),
		cmocka_unit_test(test_gather),
		cmocka_unit_test(test_merge_limits),
		cmocka_unit_test(test_batch_limits),
		cmocka_unit_test(test_byte_cap_and_inflight),
		cmocka_unit_test(test_signaling),
		cmocka_unit_test(test_credits),
		cmocka_unit_test(test_stall_counting),
		cmocka_unit_test(test_partial_commit),
		cmocka_unit_test(test_error_coverage),
		cmocka_unit_test(test_error_first_wr),
		cmocka_unit_test(test_reap_partial),
		cmocka_unit_test(test_bad_ops),
		cmocka_unit_test(test_wc_errno),
		cmocka_unit_test(test_wraparound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * tcp transport with several connections per peer (params.qp_per_peer,
 * the broker's --tcp-conns): chains spread over the stripes, a large
 * chain cut by bytes in flight, a chain larger than one stripe's credit
 * goes on to the next, every op completes
 * exactly once when the group is disconnected or the peer is gone, and
 * the bound on the count is enforced.
 */
#include "tcp_harness.h"

/* Post one chain, all of it accepted, and track its cookies. */
static void post_chain(struct pair *p, const struct kvb_xop *ops, unsigned n)
{
	int rc = kvb_tcp_ops.post(p->a, p->ep, ops, n);

	assert_int_equal(rc, (int) n);
	for (unsigned i = 0; i < n; i++) {
		assert_int_equal(p->tr.state[ops[i].cookie], 0);
		p->tr.state[ops[i].cookie] = 1;
		p->tr.posted++;
	}
}

/* 16 WRITE and 8 READ chains posted back to back use all four stripes. */
static void test_spread(void **state)
{
	enum { CH = 24, OPS = 4, BS = 64 * KiB };
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[CH * OPS];
	unsigned c, i;

	(void) state;
	pair_open_stripes(&p, 64, 5000, CH * OPS, 4);
	assert_int_equal(stats(p.a).eps_open, 4);
	region_init(&l, 1, CH * OPS * BS, 0);
	region_init(&r, 2, CH * OPS * BS,
		    KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ);
	region_fill(&l, 11);
	region_fill(&r, 12);
	reg(p.a, &l);
	reg(p.b, &r);
	for (c = 0; c < CH; c++) {
		uint32_t code = c < 16 ? KVB_XOP_WRITE : KVB_XOP_READ;

		for (i = 0; i < OPS; i++) {
			unsigned k = c * OPS + i;

			/* block k of l <-> block (k * 7) mod n of r */
			ops[k] = xop(code, &l, k * BS, 2,
				     (k * 7u % (CH * OPS)) * BS, BS, k);
		}
		post_chain(&p, ops + c * OPS, OPS);
	}
	wait_all(&p);
	for (i = 0; i < CH * OPS; i++) {
		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + i * BS,
				    r.mem + (i * 7u % (CH * OPS)) * BS, BS);
	}
	assert_true(guards_ok(&l));
	assert_true(guards_ok(&r));
	/* one connection per stripe, each dialed once */
	assert_int_equal(stats(p.b).conn_accepted, 4);
	assert_int_equal(stats(p.a).reconnects, 0);
	assert_int_equal(stats(p.b).rejected, 0);
	assert_int_equal(p.a->stats.errors, 0);
	assert_int_equal(p.a->stats.wrs, CH * OPS);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* A large chain is spread by bytes in flight: 8 x 256 KiB over 4 stripes
 * is 4 sends of 2 ops (256 KiB at least each); a small chain stays one. */
static void test_large_chain_spread(void **state)
{
	enum { N = 8, BS = 256 * KiB, SMALL = 4 * KiB };
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[2 * N];
	unsigned i;

	(void) state;
	pair_open_stripes(&p, 64, 5000, 2 * N, 4);
	region_init(&l, 1, 2 * N * BS, 0);
	region_init(&r, 2, 2 * N * BS, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 5);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < N; i++) /* every other block: nothing contiguous */
		ops[i] = xop(KVB_XOP_WRITE, &l, 2 * i * BS, 2, 2 * i * BS, BS,
			     i);
	post_chain(&p, ops, N);
	assert_int_equal(p.a->stats.wr_hist[kvb_wr_hist_bucket(2)], 4);
	assert_int_equal(p.a->stats.wr_hist[kvb_wr_hist_bucket(8)], 0);
	wait_all(&p);
	for (i = 0; i < N; i++) {
		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + 2 * i * BS, r.mem + 2 * i * BS, BS);
	}
	for (i = 0; i < N; i++)
		ops[N + i] = xop(KVB_XOP_WRITE, &l, BS + 2 * i * SMALL, 2,
				 BS + 2 * i * SMALL, SMALL, N + i);
	post_chain(&p, ops + N, N);
	assert_int_equal(p.a->stats.wr_hist[kvb_wr_hist_bucket(8)], 1);
	wait_all(&p);
	for (i = N; i < 2 * N; i++)
		assert_int_equal(p.tr.status[i], 0);
	assert_true(guards_ok(&r));
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* Depth 8 per stripe, 2 stripes: a chain of 20 is taken 8 + 8. */
static void test_split_on_credit(void **state)
{
	enum { N = 20, BS = 32 * KiB };
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[N];
	unsigned i;
	int rc;

	(void) state;
	pair_open_stripes(&p, 8, 5000, N, 2);
	region_init(&l, 1, N * BS, 0);
	region_init(&r, 2, N * BS, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 3);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < N; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * BS, 2, i * BS, BS, i);
	rc = kvb_tcp_ops.post(p.a, p.ep, ops, N);
	assert_int_equal(rc, 16);
	for (i = 0; i < 16; i++) {
		p.tr.state[i] = 1;
		p.tr.posted++;
	}
	/* no stripe has credit until acks come back: one stall */
	assert_int_equal(kvb_tcp_ops.post(p.a, p.ep, ops + 16, N - 16), 0);
	assert_int_equal(p.a->stats.credit_stalls, 1);
	post_all(&p, ops + 16, N - 16);
	wait_all(&p);
	for (i = 0; i < N; i++)
		assert_int_equal(p.tr.status[i], 0);
	assert_memory_equal(l.mem, r.mem, l.len);
	assert_int_equal(stats(p.b).conn_accepted, 2);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* disconnect() with chains on every stripe: each op ends once, aborted. */
static void test_disconnect_inflight(void **state)
{
	enum { CH = 9, OPS = 3, BS = 16 * KiB };
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[CH * OPS];
	double end;
	unsigned i;

	(void) state;
	pair_open_stripes(&p, 32, 5000, CH * OPS, 3);
	region_init(&l, 1, CH * OPS * BS, 0);
	region_init(&r, 2, CH * OPS * BS, KVB_MEM_REMOTE_WRITE);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < CH * OPS; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * BS, 2, i * BS, BS, i);
	for (i = 0; i < CH; i++)
		post_chain(&p, ops + i * OPS, OPS);
	/* B was never polled: nothing can have been acknowledged */
	kvb_tcp_ops.disconnect(p.a, p.ep);
	p.ep = NULL;
	assert_int_equal(stats(p.a).eps_open, 0);
	end = now_s() + DEADLINE;
	while (p.tr.done < p.tr.posted) {
		reap(&p);
		assert_true(now_s() < end);
	}
	for (i = 0; i < CH * OPS; i++)
		assert_int_equal(p.tr.status[i], -ECONNABORTED);
	assert_int_equal(p.a->stats.errors, CH * OPS);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* The peer is gone: every stripe's dial fails, every op ends with an
 * error, and the next chains fail fast (backoff) instead of waiting. */
static void test_peer_gone(void **state)
{
	enum { CH = 8, OPS = 2, BS = 4 * KiB };
	struct pair p;
	struct region l;
	struct kvb_xop ops[2 * CH * OPS];
	unsigned i;

	(void) state;
	pair_open_stripes(&p, 16, 2000, 2 * CH * OPS, 4);
	kvb_tcp_ops.close(p.b);
	p.b = NULL;
	region_init(&l, 1, 2 * CH * OPS * BS, 0);
	reg(p.a, &l);
	for (i = 0; i < 2 * CH * OPS; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * BS, 2, i * BS, BS, i);
	for (i = 0; i < CH; i++)
		post_chain(&p, ops + i * OPS, OPS);
	wait_all(&p);
	/* within the backoff: failed at post, no new dial */
	for (i = CH; i < 2 * CH; i++)
		post_chain(&p, ops + i * OPS, OPS);
	wait_all(&p);
	for (i = 0; i < 2 * CH * OPS; i++)
		assert_true(p.tr.status[i] < 0);
	assert_int_equal(p.a->stats.errors, 2 * CH * OPS);
	assert_int_equal(stats(p.a).reconnects, 0);
	pair_close(&p);
	region_free(&l);
}

/*
 * One stripe's dial failed (backoff) and the peer came back: while the
 * live stripe is out of credit the next chain waits (a stall), it is not
 * failed on the stripe in backoff with that stripe's old error.
 */
static void test_backoff_stripe_not_used_while_peer_up(void **state)
{
	enum { BS = 4096 };
	const char *other = "127.0.0.2";
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[8];
	unsigned i;

	(void) state;
	pair_open_stripes(&p, 4, 5000, 8, 2);
	/* the peer refuses us (closes at accept, as a peer that is down
	 * refuses the dial) */
	assert_int_equal(kvb_tcp_set_trusted(p.b, &other, 1), 0);
	region_init(&l, 1, 8 * BS, 0);
	region_fill(&l, 9);
	reg(p.a, &l);
	for (i = 0; i < 8; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * BS, 2, i * BS, BS, i);
	/* peer down: the first stripe's dial fails, 100 ms of backoff */
	post_all(&p, ops, 1);
	wait_all(&p);
	assert_true(p.tr.status[0] < 0);
	/* the peer is back; the second stripe takes 4 ops, all its credit */
	assert_int_equal(kvb_tcp_set_trusted(p.b, NULL, 0), 0);
	region_init(&r, 2, 8 * BS, KVB_MEM_REMOTE_WRITE);
	reg(p.b, &r);
	post_chain(&p, ops + 1, 4);
	/* no live stripe has credit: wait for it, do not fail on stripe 0 */
	assert_int_equal(kvb_tcp_ops.post(p.a, p.ep, ops + 5, 3), 0);
	post_all(&p, ops + 5, 3);
	wait_all(&p);
	for (i = 1; i < 8; i++)
		assert_int_equal(p.tr.status[i], 0);
	assert_memory_equal(l.mem + BS, r.mem + BS, 7 * BS);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

static void test_params(void **state)
{
	struct kvb_transport_params prm;
	struct kvb_transport *t = NULL;
	struct pair p;
	char why[128] = "";

	(void) state;
	memset(&prm, 0, sizeof(prm));
	prm.host_ip = "127.0.0.1";
	prm.qp_per_peer = 17;
	assert_int_equal(kvb_tcp_ops.open(&prm, &t, why, sizeof(why)), -EINVAL);
	assert_null(t);
	assert_non_null(strstr(why, "at most 16"));
	/* 0 and 1: one connection */
	pair_open_stripes(&p, 0, 5000, 1, 1);
	assert_int_equal(stats(p.a).eps_open, 1);
	pair_close(&p);
	pair_open_stripes(&p, 0, 5000, 1, 16);
	assert_int_equal(stats(p.a).eps_open, 16);
	kvb_tcp_ops.disconnect(p.a, p.ep);
	assert_int_equal(stats(p.a).eps_open, 0);
	pair_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_params),
		cmocka_unit_test(test_spread),
		cmocka_unit_test(test_large_chain_spread),
		cmocka_unit_test(test_split_on_credit),
		cmocka_unit_test(test_disconnect_inflight),
		cmocka_unit_test(test_peer_gone),
		cmocka_unit_test(test_backoff_stripe_not_used_while_peer_up),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

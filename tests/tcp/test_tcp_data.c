/* SPDX-License-Identifier: MIT */
/*
 * tcp transport: data paths (WRITE, READ, chains, credits, blobs,
 * connect_host, IPv6, registration, the write gate), byte-verified.
 */
#include "tcp_harness.h"

static void test_write_small(void **state)
{
	(void) state;
	xfer_blocks(KVB_XOP_WRITE, 4096, 4 * KiB);
}

static void test_write_big(void **state)
{
	(void) state;
	xfer_blocks(KVB_XOP_WRITE, 4, 8 * MiB);
}

static void test_read_small(void **state)
{
	(void) state;
	xfer_blocks(KVB_XOP_READ, 4096, 4 * KiB);
}

static void test_read_big(void **state)
{
	(void) state;
	xfer_blocks(KVB_XOP_READ, 4, 8 * MiB);
}

/* WRITEs and READs interleaved in one chain: several frames, one doorbell. */
static void test_mixed_chain(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[300];
	unsigned i;
	uint64_t db;

	(void) state;
	pair_open(&p, 0, 5000, 300);
	region_init(&l, 1, 300 * 8 * KiB, 0);
	region_init(&r, 2, 300 * 8 * KiB,
		    KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ);
	region_fill(&l, 3);
	region_fill(&r, 4);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < 300; i++)
		ops[i] = xop((i / 3) % 2 ? KVB_XOP_READ : KVB_XOP_WRITE, &l,
			     i * 8 * KiB, 2, i * 8 * KiB, 8 * KiB, i);
	db = p.a->stats.doorbells;
	post_all(&p, ops, 300);
	wait_all(&p);
	for (i = 0; i < 300; i++) {
		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + i * 8 * KiB, r.mem + i * 8 * KiB,
				    8 * KiB);
	}
	/* 300 ops in 100 frames went out in few sendmsg calls */
	assert_true(p.a->stats.doorbells - db < 100);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* A chain longer than sq_depth: a prefix is taken, the rest later. */
static void test_chain_over_depth(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[100];
	unsigned i;
	int rc;

	(void) state;
	pair_open(&p, 16, 5000, 100);
	region_init(&l, 1, 100 * 64 * KiB, 0);
	region_init(&r, 2, 100 * 64 * KiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 5);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < 100; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * 64 * KiB, 2, i * 64 * KiB,
			     64 * KiB, i);
	rc = kvb_tcp_ops.post(p.a, p.ep, ops, 100);
	assert_int_equal(rc, 16);
	for (i = 0; i < 16; i++) {
		p.tr.state[i] = 1;
		p.tr.posted++;
	}
	/* no credit left until acks come back */
	assert_int_equal(kvb_tcp_ops.post(p.a, p.ep, ops + 16, 84), 0);
	assert_int_equal(p.a->stats.credit_stalls, 1);
	post_all(&p, ops + 16, 84);
	wait_all(&p);
	for (i = 0; i < 100; i++)
		assert_int_equal(p.tr.status[i], 0);
	assert_memory_equal(l.mem, r.mem, l.len);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

static void test_blob(void **state)
{
	struct kvb_transport *a, *b;
	struct kvb_ep *ep = NULL;
	uint8_t blob[64], bad[64];
	size_t len = 0, i;

	(void) state;
	a = topen("127.0.0.1", 0, 0, 0);
	b = topen("127.0.0.1", 0, 0, 0);
	assert_int_equal(kvb_tcp_ops.local_info(b, blob, &len), -ENOSPC);
	assert_int_equal(len, KVB_TCP_BLOB_LEN);
	assert_int_equal(kvb_tcp_ops.local_info(b, blob, &len), 0);
	/* little-endian magic, version 1, IPv4, the port, 127.0.0.1 */
	assert_int_equal(blob[0], 0x54);
	assert_int_equal(blob[4], 1);
	assert_int_equal(blob[6], 4);
	assert_int_equal(blob[8] | blob[9] << 8, kvb_tcp_port(b));
	assert_int_equal(blob[24], 127);

	assert_int_equal(kvb_tcp_ops.connect(a, blob, len - 1, &ep), -EPROTO);
	assert_int_equal(kvb_tcp_ops.connect(a, blob, len + 1, &ep), -EPROTO);
	assert_int_equal(kvb_tcp_ops.connect(a, NULL, 0, &ep), -EPROTO);
	for (i = 0; i < 16; i++) {
		/* magic, version, family, reserved bytes, port: all checked */
		static const unsigned at[] = {0, 3, 4, 5, 6, 7, 8, 10, 12, 15};

		if (i >= sizeof(at) / sizeof(at[0]))
			break;
		memcpy(bad, blob, len);
		bad[at[i]] ^= 0x5a;
		if (at[i] == 8) /* a zero port */
			bad[8] = bad[9] = 0;
		assert_int_equal(kvb_tcp_ops.connect(a, bad, len, &ep),
				 -EPROTO);
	}
	memcpy(bad, blob, len);
	bad[30] = 1; /* IPv4 with bytes past the address */
	assert_int_equal(kvb_tcp_ops.connect(a, bad, len, &ep), -EPROTO);
	assert_null(ep);
	assert_int_equal(kvb_tcp_ops.connect(a, blob, len, &ep), 0);
	ep_key(a, ep);
	assert_non_null(ep);
	kvb_tcp_ops.disconnect(a, ep);
	kvb_tcp_ops.close(a);
	kvb_tcp_ops.close(b);
}

/* A peer listening on 0.0.0.0 needs kvb_tcp_connect_host(). */
static void test_connect_host(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop op;
	uint8_t blob[64];
	size_t len = sizeof(blob);

	(void) state;
	memset(&p, 0, sizeof(p));
	p.a = topen("127.0.0.1", 0, 0, 3000);
	p.b = topen(NULL, 0, 0, 3000);
	tr_init(&p.tr, 1);
	assert_int_equal(kvb_tcp_ops.local_info(p.b, blob, &len), 0);
	assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep),
			 -EDESTADDRREQ);
	assert_int_equal(
		kvb_tcp_connect_host(p.a, blob, len, "localhost", &p.ep),
		-EINVAL);
	assert_int_equal(
		kvb_tcp_connect_host(p.a, blob, len, "127.0.0.1", &p.ep), 0);
	ep_key(p.a, p.ep);
	region_init(&l, 1, 1 * MiB, 0);
	region_init(&r, 2, 1 * MiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 10);
	reg(p.a, &l);
	reg(p.b, &r);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 1 * MiB, 0);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	assert_memory_equal(l.mem, r.mem, 1 * MiB);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

static void test_ipv6(void **state)
{
	struct kvb_transport_params prm;
	struct kvb_transport *b = NULL;
	struct pair p;
	struct region l, r;
	struct kvb_xop op;
	uint8_t blob[64];
	size_t len = sizeof(blob);

	(void) state;
	memset(&prm, 0, sizeof(prm));
	prm.host_ip = "::1";
	if (kvb_tcp_ops.open(&prm, &b, NULL, 0)) {
		skip(); /* no IPv6 loopback here */
		return;
	}
	memset(&p, 0, sizeof(p));
	p.a = topen("127.0.0.1", 0, 0, 3000);
	p.b = b;
	assert_int_equal(kvb_tcp_peer_allow(b, 0, harness_key, NULL, -1), 0);
	tr_init(&p.tr, 1);
	assert_int_equal(kvb_tcp_ops.local_info(p.b, blob, &len), 0);
	assert_int_equal(blob[6], 6);
	assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep), 0);
	ep_key(p.a, p.ep);
	region_init(&l, 1, 256 * KiB, 0);
	region_init(&r, 2, 256 * KiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 11);
	reg(p.a, &l);
	reg(p.b, &r);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 256 * KiB, 0);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	assert_memory_equal(l.mem, r.mem, 256 * KiB);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/*
 * WRITEs whose remote ranges continue each other share one record (local
 * pieces apart, as a head split's tokens): 3 runs of 16 pieces of 512
 * bytes with a gap between runs, a fourth run into another region, a
 * piece of 256 KiB that needs a record of its own. Every byte lands, each
 * op completes once with 0, and the records merged are counted.
 */
static void test_write_gather(void **state)
{
	struct kvb_xop ops[80];
	struct region l, r, r2;
	struct pair p;
	unsigned i, n = 0;
	uint64_t loff = 0;

	(void) state;
	pair_open(&p, 0, 5000, 80);
	region_init(&l, 1, 4 * MiB, 0);
	region_init(&r, 2, 4 * MiB, KVB_MEM_REMOTE_WRITE);
	region_init(&r2, 3, 64 * KiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 21);
	reg(p.a, &l);
	reg(p.b, &r);
	reg(p.b, &r2);
	for (unsigned run = 0; run < 4; run++) {
		/* runs 0-2 into r, 8 KiB apart; run 3 into r2 */
		uint64_t roff = run < 3 ? run * 16 * KiB : 0;

		for (i = 0; i < 16; i++) {
			ops[n] = xop(KVB_XOP_WRITE, &l, loff, run < 3 ? 2 : 3,
				     roff, 512, n);
			n++;
			loff += 512 + 100; /* local pieces apart */
			roff += 512;
		}
	}
	/* continues run 3's range, but 256 KiB: its own record */
	ops[n] = xop(KVB_XOP_WRITE, &l, 2 * MiB, 2, 3 * 16 * KiB, 256 * KiB, n);
	n++;
	post_all(&p, ops, n);
	wait_all(&p);
	for (i = 0; i < n; i++) {
		struct region *dst = ops[i].remote.region == 2 ? &r : &r2;

		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + ops[i].local_off,
				    dst->mem + ops[i].remote_off, ops[i].len);
	}
	/* 4 runs of 16: 4 records carry 60 ops; the large one its own */
	assert_int_equal(stats(p.a).ops_merged, 60);
	assert_int_equal(stats(p.b).refused_ops, 0);
	assert_true(guards_ok(&r) && guards_ok(&r2));
	pair_close(&p);
	region_free(&l);
	region_free(&r);
	region_free(&r2);
}

/*
 * A merged record's ops end with its answer, each with its own error
 * first: a rider's source deregistered while the frame is still being
 * sent fails that rider alone (-ENOENT); a refused record (its region
 * unknown to the server) fails every op in it; a dial refused fails each
 * op once.
 */
static void test_write_gather_errors(void **state)
{
	struct region l, l2, r;
	struct kvb_xop ops[4];
	struct pair p;
	unsigned i;

	(void) state;
	pair_open(&p, 0, 5000, 12);
	region_init(&l, 1, 64 * MiB, 0);
	region_init(&l2, 4, 64 * KiB, 0);
	region_init(&r, 2, 64 * MiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 22);
	region_fill(&l2, 23);
	reg(p.a, &l);
	reg(p.a, &l2);
	reg(p.b, &r);
	/* a lead of 4 KiB from l, a rider of 4 KiB from l2 (the remote range
	 * continues), then 1 MiB from l in a record of its own; the first
	 * post() of the pair queues them while the connection is dialed */
	ops[0] = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 4 * KiB, 0);
	ops[1] = xop(KVB_XOP_WRITE, &l2, 0, 2, 4 * KiB, 4 * KiB, 1);
	ops[2] = xop(KVB_XOP_WRITE, &l, 8 * KiB, 2, 16 * MiB, 1 * MiB, 2);
	post_all(&p, ops, 3);
	assert_int_equal(stats(p.a).ops_merged, 1);
	/* l2 goes before a byte was sent: the rider's bytes become zeros */
	kvb_tcp_ops.dereg_mr(p.a, &l2.mr);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	assert_int_equal(p.tr.status[1], -ENOENT);
	assert_int_equal(p.tr.status[2], 0);
	assert_memory_equal(l.mem, r.mem, 4 * KiB);
	assert_memory_equal(l.mem + 8 * KiB, r.mem + 16 * MiB, 1 * MiB);

	/* a record into a region the server does not have: all of it fails */
	for (i = 0; i < 3; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * 1000, 9, i * 512, 512,
			     3 + i);
	post_all(&p, ops, 3);
	wait_all(&p);
	for (i = 0; i < 3; i++)
		assert_int_equal(p.tr.status[3 + i], -ENOENT);
	assert_int_equal(stats(p.a).ops_merged, 3);
	assert_int_equal(stats(p.b).refused_ops, 1); /* one record */
	pair_close(&p);

	/* nobody listens: each op of the merged record fails once */
	{
		struct kvb_transport *a = topen("127.0.0.1", 0, 0, 500);
		struct kvb_transport *b = topen("127.0.0.1", 0, 0, 500);
		uint8_t blob[64];
		size_t len = sizeof(blob);
		struct pair q;

		memset(&q, 0, sizeof(q));
		assert_int_equal(kvb_tcp_ops.local_info(b, blob, &len), 0);
		kvb_tcp_ops.close(b); /* its port now refuses */
		q.a = a;
		assert_int_equal(kvb_tcp_ops.connect(a, blob, len, &q.ep), 0);
		ep_key(a, q.ep);
		tr_init(&q.tr, 4);
		reg(a, &l);
		for (i = 0; i < 4; i++)
			ops[i] = xop(KVB_XOP_WRITE, &l, i * 1000, 2, i * 512,
				     512, i);
		post_all(&q, ops, 4);
		wait_all(&q);
		for (i = 0; i < 4; i++)
			assert_true(q.tr.status[i] < 0);
		pair_close(&q);
	}
	region_free(&l);
	region_free(&l2);
	region_free(&r);
}

/* The write gate: refuses WRITEs that touch [lo, hi) of region 2. */
struct gate_arg {
	uint64_t lo, hi;
	unsigned calls;
};

static int test_gate(void *arg, uint32_t region, uint64_t off, uint64_t len)
{
	struct gate_arg *g = arg;

	g->calls++;
	if (region != 2 || off + len <= g->lo || off >= g->hi)
		return 0;
	return -ECANCELED;
}

/* WRITEs the gate refuses: answered -ECANCELED, not a byte landed; the
 * others land. */
static void test_write_gate(void **state)
{
	struct gate_arg g = {.lo = 64 * KiB, .hi = 192 * KiB};
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[4];
	uint8_t *orig;

	(void) state;
	pair_open(&p, 0, 5000, 4);
	region_init(&l, 1, 256 * KiB, 0);
	region_init(&r, 2, 256 * KiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 5);
	region_fill(&r, 6);
	orig = malloc(r.len);
	assert_non_null(orig);
	memcpy(orig, r.mem, r.len);
	reg(p.a, &l);
	reg(p.b, &r);
	kvb_tcp_set_write_gate(p.b, test_gate, &g);
	/* 32 KiB at each 64 KiB: not contiguous, no record shared */
	for (unsigned i = 0; i < 4; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * 64 * KiB, 2, i * 64 * KiB,
			     32 * KiB, i);
	post_all(&p, ops, 4);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	assert_int_equal(p.tr.status[1], -ECANCELED);
	assert_int_equal(p.tr.status[2], -ECANCELED);
	assert_int_equal(p.tr.status[3], 0);
	assert_memory_equal(r.mem, l.mem, 32 * KiB);
	assert_memory_equal(r.mem + 32 * KiB, orig + 32 * KiB, 160 * KiB);
	assert_memory_equal(r.mem + 192 * KiB, l.mem + 192 * KiB, 32 * KiB);
	assert_memory_equal(r.mem + 224 * KiB, orig + 224 * KiB, 32 * KiB);
	assert_true(g.calls >= 4);
	assert_int_equal(stats(p.b).refused_gate, 2);
	assert_true(guards_ok(&r));
	pair_close(&p);
	free(orig);
	region_free(&l);
	region_free(&r);
}

/* The gate changes its mind while a WRITE's payload is being received:
 * after kvb_tcp_gate_recheck() not another byte of it lands, and it is
 * answered -ECANCELED. */
static void test_write_gate_recheck(void **state)
{
	const uint64_t len = 32 * MiB;
	struct gate_arg g = {.lo = 0, .hi = 0}; /* refuses nothing yet */
	double end = now_s() + DEADLINE;
	struct kvb_xcqe c[8];
	struct pair p;
	struct region l, r;
	struct kvb_xop op;
	uint64_t at;
	uint8_t *orig;

	(void) state;
	pair_open(&p, 0, 5000, 1);
	region_init(&l, 1, len, 0);
	region_init(&r, 2, len, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 7);
	region_fill(&r, 8);
	orig = malloc(len);
	assert_non_null(orig);
	memcpy(orig, r.mem, len);
	reg(p.a, &l);
	reg(p.b, &r);
	kvb_tcp_set_write_gate(p.b, test_gate, &g);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, len, 0);
	post_all(&p, &op, 1);
	/* until some of the payload, not all, came in */
	do {
		assert_true(now_s() < end);
		reap(&p);
		assert_int_equal(kvb_tcp_ops.poll(p.b, c, 8), 0);
		at = stats(p.b).bytes_rx;
	} while (at < MiB);
	assert_true(at < len / 2);
	g.hi = len; /* now it refuses the whole region */
	kvb_tcp_gate_recheck(p.b);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], -ECANCELED);
	/* what landed came before `at` bytes were received */
	assert_memory_equal(r.mem + at, orig + at, len - at);
	assert_int_equal(stats(p.b).refused_gate, 1);
	pair_close(&p);
	free(orig);
	region_free(&l);
	region_free(&r);
}

static void test_reg(void **state)
{
	struct kvb_transport *a;
	struct region r, g;

	(void) state;
	a = topen("127.0.0.1", 0, 0, 0);
	assert_true(kvb_tcp_port(a) > 0);
	assert_true(kvb_tcp_ops.wait_fd(a) >= 0);
	region_init(&r, 5, 4 * KiB, KVB_MEM_REMOTE_WRITE);
	region_init(&g, 6, 4 * KiB, KVB_MEM_REMOTE_WRITE);
	g.mr.kind = KVB_MEM_GPU;
	assert_int_equal(kvb_tcp_ops.reg_mr(a, &g.mr), -EOPNOTSUPP);
	assert_int_equal(kvb_tcp_ops.reg_mr(a, &r.mr), 0);
	assert_int_equal(kvb_tcp_ops.reg_mr(a, &r.mr), -EEXIST);
	kvb_tcp_ops.dereg_mr(a, &r.mr);
	assert_int_equal(kvb_tcp_ops.reg_mr(a, &r.mr), 0);
	kvb_tcp_ops.close(a); /* with a region still registered */
	region_free(&r);
	region_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reg),
		cmocka_unit_test(test_blob),
		cmocka_unit_test(test_write_small),
		cmocka_unit_test(test_write_big),
		cmocka_unit_test(test_read_small),
		cmocka_unit_test(test_read_big),
		cmocka_unit_test(test_mixed_chain),
		cmocka_unit_test(test_write_gather),
		cmocka_unit_test(test_write_gather_errors),
		cmocka_unit_test(test_write_gate),
		cmocka_unit_test(test_write_gate_recheck),
		cmocka_unit_test(test_chain_over_depth),
		cmocka_unit_test(test_connect_host),
		cmocka_unit_test(test_ipv6),
	};

	srand(1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

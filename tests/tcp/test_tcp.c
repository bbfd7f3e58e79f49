// SPDX-License-Identifier: MIT
/*
 * test_tcp: the tcp transport between two transports in one process over
 * 127.0.0.1. A posts, B owns the target regions; both are driven by poll()
 * in bounded loops with a deadline (a hang fails the test, it never waits
 * forever). Every cookie must complete exactly once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bridge/tcp/tcp.h"
#include "kvbroker/kvbroker.h"

#define KiB	 1024ull
#define MiB	 (1024ull * KiB)
#define GUARD	 4096u
#define GUARD_B	 0xee
#define DEADLINE 20.0 /* seconds, per wait */

/* ---- harness ---- */

struct region {
	struct kvb_mr mr;
	uint8_t *base; /* guard | mem | guard */
	uint8_t *mem;
	size_t len;
};

struct tracker {
	uint64_t n, posted, done;
	uint8_t *state; /* 0 new, 1 posted, 2 completed */
	int32_t *status;
};

struct pair {
	struct kvb_transport *a, *b;
	struct kvb_ep *ep;
	struct tracker tr;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void region_init(struct region *r, uint32_t id, size_t len,
			uint32_t flags)
{
	memset(r, 0, sizeof(*r));
	r->base = malloc(len + 2 * GUARD);
	assert_non_null(r->base);
	memset(r->base, GUARD_B, len + 2 * GUARD);
	r->mem = r->base + GUARD;
	memset(r->mem, 0, len);
	r->len = len;
	r->mr.id = id;
	r->mr.flags = flags;
	r->mr.kind = KVB_MEM_HOST;
	r->mr.addr = r->mem;
	r->mr.len = len;
}

static void region_fill(struct region *r, unsigned seed)
{
	size_t i;
	uint32_t x = seed * 2654435761u + 1;

	for (i = 0; i < r->len; i++) {
		x = x * 1103515245u + 12345u;
		r->mem[i] = (uint8_t) (x >> 16);
	}
}

static int guards_ok(const struct region *r)
{
	size_t i;

	for (i = 0; i < GUARD; i++)
		if (r->base[i] != GUARD_B || r->mem[r->len + i] != GUARD_B)
			return 0;
	return 1;
}

static void region_free(struct region *r)
{
	free(r->base);
}

static struct kvb_transport *topen(const char *ip, uint32_t port,
				   uint32_t depth, int timeout_ms)
{
	struct kvb_transport_params p;
	struct kvb_transport *t = NULL;
	char why[128] = "";
	int rc;

	memset(&p, 0, sizeof(p));
	p.host_ip = ip;
	p.tcp_port = port;
	p.sq_depth = depth;
	p.timeout_ms = timeout_ms;
	rc = kvb_tcp_ops.open(&p, &t, why, sizeof(why));
	if (rc)
		fprintf(stderr, "open %s:%u: %d %s\n", ip ? ip : "-", port, rc,
			why);
	assert_int_equal(rc, 0);
	assert_non_null(t);
	return t;
}

static void tr_init(struct tracker *tr, uint64_t n)
{
	memset(tr, 0, sizeof(*tr));
	tr->n = n;
	tr->state = calloc(n, 1);
	tr->status = calloc(n, sizeof(int32_t));
	assert_non_null(tr->state);
	assert_non_null(tr->status);
}

static void tr_free(struct tracker *tr)
{
	free(tr->state);
	free(tr->status);
}

static void pair_open(struct pair *p, uint32_t depth, int timeout_ms,
		      uint64_t ncookies)
{
	uint8_t blob[64];
	size_t len = sizeof(blob);

	memset(p, 0, sizeof(*p));
	p->a = topen("127.0.0.1", 0, depth, timeout_ms);
	p->b = topen("127.0.0.1", 0, depth, timeout_ms);
	assert_int_equal(kvb_tcp_ops.local_info(p->b, blob, &len), 0);
	assert_int_equal(len, KVB_TCP_BLOB_LEN);
	assert_int_equal(kvb_tcp_ops.connect(p->a, blob, len, &p->ep), 0);
	assert_non_null(p->ep);
	tr_init(&p->tr, ncookies);
}

static void pair_close(struct pair *p)
{
	if (p->a)
		kvb_tcp_ops.close(p->a);
	if (p->b)
		kvb_tcp_ops.close(p->b);
	tr_free(&p->tr);
}

/* Reap A's completions into the tracker; B must never complete anything. */
static int reap(struct pair *p)
{
	struct kvb_xcqe c[128];
	int n, i, got = 0;

	do {
		n = kvb_tcp_ops.poll(p->a, c, 128);
		assert_true(n >= 0);
		for (i = 0; i < n; i++) {
			uint64_t k = c[i].cookie;

			assert_true(k < p->tr.n);
			assert_int_equal(p->tr.state[k], 1); /* exactly once */
			p->tr.state[k] = 2;
			p->tr.status[k] = c[i].status;
			p->tr.done++;
		}
		got += n;
	} while (n == 128);
	return got;
}

/* One round: A, B, then a short sleep on both wait fds if nothing moved. */
static void pump(struct pair *p)
{
	struct kvb_xcqe c[8];
	struct pollfd pf[2];
	int n = 0;

	if (p->b) {
		assert_int_equal(kvb_tcp_ops.poll(p->b, c, 8), 0);
		pf[n].fd = kvb_tcp_ops.wait_fd(p->b);
		pf[n++].events = POLLIN;
	}
	if (reap(p))
		return;
	pf[n].fd = kvb_tcp_ops.wait_fd(p->a);
	pf[n++].events = POLLIN;
	poll(pf, (nfds_t) n, 2);
}

/* Post ops[0..n) (cookies must be fresh), pumping while out of credit. */
static void post_all(struct pair *p, const struct kvb_xop *ops, unsigned n)
{
	double end = now_s() + DEADLINE;
	unsigned i = 0, j;

	while (i < n) {
		int rc = kvb_tcp_ops.post(p->a, p->ep, ops + i, n - i);

		assert_true(rc >= 0);
		for (j = i; j < i + (unsigned) rc; j++) {
			assert_int_equal(p->tr.state[ops[j].cookie], 0);
			p->tr.state[ops[j].cookie] = 1;
			p->tr.posted++;
		}
		i += (unsigned) rc;
		if (i < n) {
			pump(p);
			assert_true(now_s() < end);
		}
	}
}

static void wait_all(struct pair *p)
{
	double end = now_s() + DEADLINE;

	while (p->tr.done < p->tr.posted) {
		pump(p);
		if (now_s() > end)
			fail_msg("%llu of %llu ops complete after %.0f s",
				 (unsigned long long) p->tr.done,
				 (unsigned long long) p->tr.posted, DEADLINE);
	}
}

static struct kvb_xop xop(uint32_t code, struct region *l, uint64_t loff,
			  uint32_t region, uint64_t roff, uint64_t len,
			  uint64_t cookie)
{
	struct kvb_xop o;

	memset(&o, 0, sizeof(o));
	o.opcode = code;
	o.local = &l->mr;
	o.local_off = loff;
	o.remote.region = region;
	o.remote_off = roff;
	o.len = len;
	o.cookie = cookie;
	return o;
}

static void reg(struct kvb_transport *t, struct region *r)
{
	assert_int_equal(kvb_tcp_ops.reg_mr(t, &r->mr), 0);
}

static struct kvb_tcp_stats stats(struct kvb_transport *t)
{
	struct kvb_tcp_stats s;

	kvb_tcp_get_stats(t, &s);
	return s;
}

/* ---- transfers ---- */

/* n blocks of bs bytes, the remote side scattered by a permutation. */
static void xfer_blocks(uint32_t code, unsigned n, uint64_t bs)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop *ops = calloc(n, sizeof(*ops));
	unsigned *perm = calloc(n, sizeof(*perm));
	unsigned i;
	uint32_t rflag = code == KVB_XOP_WRITE ? KVB_MEM_REMOTE_WRITE
					       : KVB_MEM_REMOTE_READ;

	assert_non_null(ops);
	assert_non_null(perm);
	pair_open(&p, 0, 5000, n);
	region_init(&l, 1, n * bs, 0);
	region_init(&r, 7, n * bs, rflag);
	region_fill(code == KVB_XOP_WRITE ? &l : &r, n);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < n; i++)
		perm[i] = i;
	for (i = n - 1; i > 0; i--) {
		unsigned j = (unsigned) rand() % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (i = 0; i < n; i++)
		ops[i] = xop(code, &l, i * bs, 7, perm[i] * bs, bs, i);
	post_all(&p, ops, n);
	wait_all(&p);
	for (i = 0; i < n; i++) {
		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + i * bs, r.mem + perm[i] * bs, bs);
	}
	assert_true(guards_ok(&l));
	assert_true(guards_ok(&r));
	assert_int_equal(p.a->stats.wrs, n);
	assert_int_equal(p.a->stats.cqes, n);
	assert_int_equal(p.a->stats.errors, 0);
	assert_true(p.a->stats.doorbells >= 1);
	assert_int_equal(stats(p.b).rejected, 0);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
	free(ops);
	free(perm);
}

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

/* Refused ops fail alone with the right status; nothing lands outside. */
static void test_bad_ops(void **state)
{
	struct pair p;
	struct region l, rw, none, ro, unreg;
	struct kvb_xop ops[10];
	static const int32_t want[10] = {-ENOENT, -EACCES, -EFAULT, -EFAULT,
					 -EACCES, -EACCES, -EFAULT, -ENOENT,
					 -EFAULT, 0};
	unsigned i;

	(void) state;
	pair_open(&p, 0, 5000, 10);
	region_init(&l, 1, 256 * KiB, 0);
	region_init(&unreg, 9, 4 * KiB, 0); /* never registered with A */
	region_init(&rw, 1, 64 * KiB, KVB_MEM_REMOTE_WRITE);
	region_init(&none, 2, 64 * KiB, 0);
	region_init(&ro, 3, 64 * KiB, KVB_MEM_REMOTE_READ);
	region_fill(&l, 6);
	reg(p.a, &l);
	reg(p.b, &rw);
	reg(p.b, &none);
	reg(p.b, &ro);
	ops[0] = xop(KVB_XOP_WRITE, &l, 0, 99, 0, 4 * KiB, 0);
	ops[1] = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 4 * KiB, 1);
	ops[2] = xop(KVB_XOP_WRITE, &l, 0, 1, 60 * KiB, 8 * KiB, 2);
	ops[3] = xop(KVB_XOP_WRITE, &l, 0, 1, UINT64_MAX - 100, 4 * KiB, 3);
	ops[4] = xop(KVB_XOP_WRITE, &l, 0, 3, 0, 4 * KiB, 4);
	ops[5] = xop(KVB_XOP_READ, &l, 0, 1, 0, 4 * KiB, 5);
	ops[6] = xop(KVB_XOP_READ, &l, 0, 3, 64 * KiB, 1, 6);
	ops[7] = xop(KVB_XOP_WRITE, &unreg, 0, 1, 0, 4 * KiB, 7);
	ops[8] = xop(KVB_XOP_WRITE, &l, 255 * KiB, 1, 0, 4 * KiB, 8);
	ops[9] = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 64 * KiB, 9);
	post_all(&p, ops, 10);
	wait_all(&p);
	for (i = 0; i < 10; i++)
		assert_int_equal(p.tr.status[i], want[i]);
	assert_memory_equal(rw.mem, l.mem, 64 * KiB);
	for (i = 0; i < 64 * KiB; i++)
		assert_int_equal(none.mem[i] | ro.mem[i], 0);
	assert_true(guards_ok(&rw));
	assert_true(guards_ok(&none));
	assert_true(guards_ok(&ro));
	assert_true(guards_ok(&l));
	assert_int_equal(stats(p.b).refused_ops, 7);
	assert_int_equal(stats(p.b).rejected, 0);
	assert_int_equal(p.a->stats.errors, 9);
	pair_close(&p);
	region_free(&l);
	region_free(&unreg);
	region_free(&rw);
	region_free(&none);
	region_free(&ro);
}

/* ---- hostile input ---- */

static int raw_connect(uint16_t port)
{
	struct sockaddr_in sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	return fd;
}

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
	unsigned i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t) (v >> (8 * i));
}

/* Whether B closed the raw connection (EOF or reset) within the deadline. */
static int raw_closed(struct pair *p, int fd)
{
	double end = now_s() + DEADLINE;
	char buf[64];

	while (now_s() < end) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		ssize_t n;

		pump(p);
		if (poll(&pf, 1, 1) != 1)
			continue;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 1;
	}
	return 0;
}

static void test_garbage(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop op;
	uint8_t junk[64], hdr[24 + 32];
	uint16_t port;
	int fd[3], i;

	(void) state;
	pair_open(&p, 0, 5000, 2);
	port = (uint16_t) kvb_tcp_port(p.b);
	region_init(&l, 1, 1 * MiB, 0);
	region_init(&r, 2, 1 * MiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 8);
	reg(p.a, &l);
	reg(p.b, &r);

	/* A connects first and stays served while the others misbehave */
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 512 * KiB, 0);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);

	memset(junk, 0xab, sizeof(junk));
	fd[0] = raw_connect(port);
	assert_int_equal(send(fd[0], junk, sizeof(junk), 0), sizeof(junk));
	/* a good magic with a bad version */
	memset(hdr, 0, sizeof(hdr));
	put_le(hdr, 0x464b5654u, 4);
	hdr[4] = 9;
	hdr[5] = 1;
	put_le(hdr + 6, 1, 2);
	fd[1] = raw_connect(port);
	assert_int_equal(send(fd[1], hdr, sizeof(hdr), 0), sizeof(hdr));
	/* a good header with an absurd record length */
	hdr[4] = 1;
	put_le(hdr + 16, 1ull << 40, 8);
	put_le(hdr + 24 + 8, 2, 4);	      /* region */
	put_le(hdr + 24 + 24, 1ull << 40, 8); /* len */
	fd[2] = raw_connect(port);
	assert_int_equal(send(fd[2], hdr, sizeof(hdr), 0), sizeof(hdr));
	for (i = 0; i < 3; i++) {
		assert_true(raw_closed(&p, fd[i]));
		close(fd[i]);
	}
	assert_int_equal(stats(p.b).rejected, 3);
	assert_int_equal(stats(p.b).conn_accepted, 4);

	op = xop(KVB_XOP_WRITE, &l, 512 * KiB, 2, 512 * KiB, 512 * KiB, 1);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[1], 0);
	assert_memory_equal(l.mem, r.mem, 1 * MiB);
	assert_int_equal(stats(p.a).reconnects, 0);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* ---- failures and reconnect ---- */

static void test_peer_closed(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[8], op;
	struct pollfd pf;
	uint16_t port;
	unsigned i;
	double t0;

	(void) state;
	pair_open(&p, 0, 3000, 12);
	port = (uint16_t) kvb_tcp_port(p.b);
	region_init(&l, 1, 64 * MiB, 0);
	region_init(&r, 2, 64 * MiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 9);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < 8; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * 8 * MiB, 2, i * 8 * MiB,
			     8 * MiB, i);
	post_all(&p, ops, 8);
	t0 = now_s();
	while (stats(p.b).bytes_rx < 4 * MiB) {
		pump(&p);
		assert_true(now_s() - t0 < DEADLINE);
	}
	assert_true(p.tr.done < 8);
	kvb_tcp_ops.close(p.b);
	p.b = NULL;
	t0 = now_s();
	wait_all(&p);
	assert_true(now_s() - t0 < 3.5); /* within the timeout */
	for (i = 0; i < 8; i++)
		if (p.tr.status[i])
			assert_true(p.tr.status[i] == -ECONNRESET ||
				    p.tr.status[i] == -EPIPE ||
				    p.tr.status[i] == -ETIMEDOUT);
	assert_true(p.a->stats.errors >= 1);

	/* nobody listens: refused, then failed fast during the backoff */
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 4 * KiB, 8);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[8], -ECONNREFUSED);
	assert_int_equal(stats(p.a).conn_failed, 2);
	op.cookie = 9;
	post_all(&p, &op, 1);
	pf.fd = kvb_tcp_ops.wait_fd(p.a);
	pf.events = POLLIN;
	assert_int_equal(poll(&pf, 1, 1000), 1); /* wait_fd tells */
	wait_all(&p);
	assert_int_equal(p.tr.status[9], -ECONNREFUSED);
	assert_int_equal(stats(p.a).conn_failed, 2); /* no new dial */

	/* B is back on the same port: the next post after the backoff lands */
	p.b = topen("127.0.0.1", port, 0, 3000);
	memset(r.mem, 0, r.len);
	reg(p.b, &r);
	t0 = now_s();
	while (now_s() - t0 < 0.15)
		pump(&p);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 8 * MiB, 10);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[10], 0);
	assert_memory_equal(l.mem, r.mem, 8 * MiB);
	assert_true(stats(p.a).reconnects >= 2);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

static void test_disconnect_in_flight(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[64];
	unsigned i, aborted = 0;
	double t0;

	(void) state;
	pair_open(&p, 0, 5000, 64);
	region_init(&l, 1, 64 * MiB, 0);
	region_init(&r, 2, 64 * MiB, KVB_MEM_REMOTE_WRITE);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < 64; i++)
		ops[i] = xop(KVB_XOP_WRITE, &l, i * MiB, 2, i * MiB, MiB, i);
	post_all(&p, ops, 64);
	pump(&p);
	kvb_tcp_ops.disconnect(p.a, p.ep);
	p.ep = NULL;
	wait_all(&p);
	for (i = 0; i < 64; i++) {
		if (p.tr.status[i] == -ECONNABORTED)
			aborted++;
		else
			assert_int_equal(p.tr.status[i], 0);
	}
	assert_true(aborted > 0);
	/* B notices the closed connection and keeps going */
	t0 = now_s();
	while (stats(p.b).conns_open && now_s() - t0 < DEADLINE)
		pump(&p);
	assert_int_equal(stats(p.b).conns_open, 0);
	assert_int_equal(stats(p.a).eps_open, 0);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
}

/* A peer that accepts bytes but never answers: -ETIMEDOUT, no hang. */
static void test_stalled_peer(void **state)
{
	struct pair p;
	struct region l;
	struct kvb_xop ops[2];
	struct sockaddr_in sa;
	socklen_t salen = sizeof(sa);
	uint8_t blob[KVB_TCP_BLOB_LEN];
	size_t len = sizeof(blob);
	int lfd;
	double t0;

	(void) state;
	memset(&p, 0, sizeof(p));
	p.a = topen("127.0.0.1", 0, 0, 500);
	tr_init(&p.tr, 2);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0); /* never accepted */
	assert_int_equal(getsockname(lfd, (struct sockaddr *) &sa, &salen), 0);
	assert_int_equal(kvb_tcp_blob_make("127.0.0.1", ntohs(sa.sin_port), 0,
					   blob, &len),
			 0);
	assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep), 0);
	region_init(&l, 1, 16 * MiB, 0);
	reg(p.a, &l);
	ops[0] = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 4 * KiB, 0);
	ops[1] = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 16 * MiB, 1);
	post_all(&p, ops, 2);
	t0 = now_s();
	wait_all(&p);
	assert_true(now_s() - t0 < 2.0);
	assert_int_equal(p.tr.status[0], -ETIMEDOUT);
	assert_int_equal(p.tr.status[1], -ETIMEDOUT);
	close(lfd);
	pair_close(&p);
	region_free(&l);
}

/* ---- blobs ---- */

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
	tr_init(&p.tr, 1);
	assert_int_equal(kvb_tcp_ops.local_info(p.b, blob, &len), 0);
	assert_int_equal(blob[6], 6);
	assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep), 0);
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

/* ---- deregistration mid-transfer ---- */

static void test_dereg_during_write(void **state)
{
	struct pair p;
	struct region l, r, small;
	struct kvb_xop op;
	uint64_t rx0;
	size_t i;
	double t0;

	(void) state;
	pair_open(&p, 0, 5000, 3);
	region_init(&l, 1, 64 * MiB, 0);
	region_init(&r, 2, 64 * MiB, KVB_MEM_REMOTE_WRITE);
	region_fill(&l, 12);
	reg(p.a, &l);
	reg(p.b, &r);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 64 * MiB, 0);
	post_all(&p, &op, 1);
	t0 = now_s();
	while (!stats(p.b).bytes_rx) {
		pump(&p);
		assert_true(now_s() - t0 < DEADLINE);
	}
	/* some of the payload has landed, most has not */
	assert_true(stats(p.b).bytes_rx < 32 * MiB);
	kvb_tcp_ops.dereg_mr(p.b, &r.mr);
	memset(r.mem, 0x5a, r.len);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], -ENOENT);
	for (i = 0; i < r.len; i++)
		if (r.mem[i] != 0x5a)
			fail_msg("byte %zu landed after dereg_mr", i);
	assert_true(guards_ok(&r));

	/* the connection survived: a new region under the same id works */
	region_init(&small, 2, 64 * KiB, KVB_MEM_REMOTE_WRITE);
	reg(p.b, &small);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 64 * KiB, 1);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[1], 0);
	assert_memory_equal(l.mem, small.mem, 64 * KiB);

	/* the sender's source goes away mid-send: the rest goes as zeros */
	kvb_tcp_ops.dereg_mr(p.b, &small.mr);
	memset(r.mem, 0, r.len);
	reg(p.b, &r);
	rx0 = stats(p.b).bytes_rx;
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 64 * MiB, 2);
	post_all(&p, &op, 1);
	t0 = now_s();
	while (stats(p.b).bytes_rx == rx0) {
		pump(&p);
		assert_true(now_s() - t0 < DEADLINE);
	}
	kvb_tcp_ops.dereg_mr(p.a, &l.mr);
	wait_all(&p);
	assert_int_equal(p.tr.status[2], -ENOENT);
	assert_int_equal(r.mem[r.len - 1], 0);
	assert_int_equal(stats(p.a).reconnects, 0);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
	region_free(&small);
}

/* The served region of a READ goes away mid-send: the trailer fails it. */
static void test_dereg_during_read(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[2];
	uint64_t rx0;
	size_t i;
	double t0;

	(void) state;
	pair_open(&p, 0, 5000, 2);
	region_init(&l, 1, 64 * MiB, 0);
	region_init(&r, 2, 64 * MiB, KVB_MEM_REMOTE_READ);
	region_fill(&r, 13);
	reg(p.a, &l);
	reg(p.b, &r);
	ops[0] = xop(KVB_XOP_READ, &l, 0, 2, 0, 64 * MiB, 0);
	post_all(&p, ops, 1);
	t0 = now_s();
	while (!stats(p.a).bytes_rx) {
		pump(&p);
		assert_true(now_s() - t0 < DEADLINE);
	}
	assert_int_equal(p.tr.done, 0);
	kvb_tcp_ops.dereg_mr(p.b, &r.mr);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], -ENOENT);
	/* the local side: A's landing region goes away mid-READ */
	reg(p.b, &r);
	ops[1] = xop(KVB_XOP_READ, &l, 0, 2, 0, 64 * MiB, 1);
	rx0 = stats(p.a).bytes_rx;
	post_all(&p, ops + 1, 1);
	t0 = now_s();
	while (stats(p.a).bytes_rx == rx0) {
		pump(&p);
		assert_true(now_s() - t0 < DEADLINE);
	}
	assert_int_equal(p.tr.state[1], 1); /* at most 8 MiB per poll */
	kvb_tcp_ops.dereg_mr(p.a, &l.mr);
	memset(l.mem, 0x5a, l.len);
	wait_all(&p);
	assert_int_equal(p.tr.status[1], -ENOENT);
	for (i = 0; i < l.len; i++)
		if (l.mem[i] != 0x5a)
			fail_msg("byte %zu landed after dereg_mr", i);
	assert_true(guards_ok(&l));
	pair_close(&p);
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
		cmocka_unit_test(test_chain_over_depth),
		cmocka_unit_test(test_bad_ops),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_peer_closed),
		cmocka_unit_test(test_disconnect_in_flight),
		cmocka_unit_test(test_stalled_peer),
		cmocka_unit_test(test_connect_host),
		cmocka_unit_test(test_ipv6),
		cmocka_unit_test(test_dereg_during_write),
		cmocka_unit_test(test_dereg_during_read),
	};

	srand(1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * tcp transport: faults (bad ops, garbage on the port, peer closed,
 * disconnect in flight, stalled peer, deregistration mid-transfer).
 */
#include "tcp_harness.h"

#include "bridge/tcp/wire.h"

#define SLACK_S 2.0 /* seconds a loaded CI machine may add to a bound */

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
	/* each authenticated first: the frame checks come after */
	fd[0] = raw_connect(port);
	raw_auth(&p, fd[0], 0x100, harness_key, NULL, NULL);
	assert_int_equal(send(fd[0], junk, sizeof(junk), 0), sizeof(junk));
	/* a good magic with a bad version */
	memset(hdr, 0, sizeof(hdr));
	put_le(hdr, 0x464b5654u, 4);
	hdr[4] = 9;
	hdr[5] = 1;
	put_le(hdr + 6, 1, 2);
	fd[1] = raw_connect(port);
	raw_auth(&p, fd[1], 0x101, harness_key, NULL, NULL);
	assert_int_equal(send(fd[1], hdr, sizeof(hdr), 0), sizeof(hdr));
	/* a good header with an absurd record length */
	hdr[4] = 1;
	put_le(hdr + 16, 1ull << 40, 8);
	put_le(hdr + 24 + 8, 2, 4);	      /* region */
	put_le(hdr + 24 + 24, 1ull << 40, 8); /* len */
	fd[2] = raw_connect(port);
	raw_auth(&p, fd[2], 0x102, harness_key, NULL, NULL);
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

static void test_peer_closed(void **state)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop ops[8], op;
	struct pollfd pf;
	uint16_t port;
	unsigned i;
	double t0, t9;

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
	/* within the 3 s op timeout, and what a loaded machine adds */
	assert_true(now_s() - t0 < 3.0 + SLACK_S);
	for (i = 0; i < 8; i++)
		if (p.tr.status[i])
			assert_true(p.tr.status[i] == -ECONNRESET ||
				    p.tr.status[i] == -EPIPE ||
				    p.tr.status[i] == -ETIMEDOUT);
	assert_true(p.a->stats.errors >= 1);

	/* nobody listens: refused, then failed fast during the backoff */
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 4 * KiB, 8);
	t0 = now_s();
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[8], -ECONNREFUSED);
	assert_int_equal(stats(p.a).conn_failed, 2);
	op.cookie = 9;
	t9 = now_s();
	post_all(&p, &op, 1);
	pf.fd = kvb_tcp_ops.wait_fd(p.a);
	pf.events = POLLIN;
	assert_int_equal(poll(&pf, 1, 1000), 1); /* wait_fd tells */
	wait_all(&p);
	assert_int_equal(p.tr.status[9], -ECONNREFUSED);
	/*
	 * No new dial: op 8's dial failed after t0, so op 9, posted before
	 * t0 + 100 ms, fell inside the backoff. Later (a stalled machine),
	 * it may have dialled again, and been refused too.
	 */
	if (t9 - t0 < 0.1)
		assert_int_equal(stats(p.a).conn_failed, 2);
	else
		assert_true(stats(p.a).conn_failed == 2 ||
			    stats(p.a).conn_failed == 3);

	/* B is back on the same port, a new instance (a new id): the old
	 * endpoint's HELLO names the old one and is refused, nothing lands;
	 * the broker hand-shakes again and connects the new blob, which
	 * lands */
	p.b = topen("127.0.0.1", port, 0, 3000);
	memset(r.mem, 0, r.len);
	reg(p.b, &r);
	t0 = now_s();
	while (now_s() - t0 < 0.15)
		pump(&p);
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 8 * MiB, 10);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_true(p.tr.status[10] < 0);
	assert_int_equal(stats(p.b).refused_auth_failed, 1);
	assert_true(stats(p.a).reconnects >= 2);
	{
		uint8_t blob[KVB_TCP_BLOB_LEN];
		size_t len = sizeof(blob);

		kvb_tcp_ops.disconnect(p.a, p.ep);
		assert_int_equal(kvb_tcp_ops.local_info(p.b, blob, &len), 0);
		assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep), 0);
		ep_key(p.a, p.ep);
	}
	op = xop(KVB_XOP_WRITE, &l, 0, 2, 0, 8 * MiB, 11);
	post_all(&p, &op, 1);
	wait_all(&p);
	assert_int_equal(p.tr.status[11], 0);
	assert_memory_equal(l.mem, r.mem, 8 * MiB);
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
	ep_key(p.a, p.ep);
	region_init(&l, 1, 16 * MiB, 0);
	reg(p.a, &l);
	ops[0] = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 4 * KiB, 0);
	ops[1] = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 16 * MiB, 1);
	post_all(&p, ops, 2);
	t0 = now_s();
	wait_all(&p);
	assert_true(now_s() - t0 < 0.5 + SLACK_S); /* 500 ms timeout */
	assert_int_equal(p.tr.status[0], -ETIMEDOUT);
	assert_int_equal(p.tr.status[1], -ETIMEDOUT);
	close(lfd);
	pair_close(&p);
	region_free(&l);
}

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

/*
 * A server that acknowledges a write before it has its bytes (only a
 * broken or hostile one does): the dialer still sends from the source
 * region, so the ACK is a protocol error, the op fails, and is not
 * reported done while the frame still reads from its memory.
 */
static void test_early_ack(void **state)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	uint8_t blob[64], in[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN];
	uint8_t ack[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN];
	struct kvb_tcp_blob bl;
	struct kvb_tcp_hdr h = {.type = KVB_TCP_F_ACK, .count = 1};
	struct kvb_tcp_rec rec;
	size_t len = sizeof(blob), got = 0;
	struct kvb_xop op;
	struct region l;
	struct pair p;
	double end;
	int lfd, fd = -1;

	(void) state;
	pair_open(&p, 0, 10000, 1);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	assert_true(lfd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *) &sa, &sl), 0);
	/* B's blob, pointed at the fake server */
	assert_int_equal(kvb_tcp_ops.local_info(p.b, blob, &len), 0);
	assert_int_equal(kvb_tcp_blob_decode(&bl, blob, len), 0);
	bl.port = ntohs(sa.sin_port);
	kvb_tcp_blob_encode(&bl, blob);
	kvb_tcp_ops.disconnect(p.a, p.ep);
	assert_int_equal(kvb_tcp_ops.connect(p.a, blob, len, &p.ep), 0);
	ep_key(p.a, p.ep);
	/* far more than the socket buffers take: most of it stays queued */
	region_init(&l, 1, 64 * MiB, 0);
	reg(p.a, &l);
	op = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 64 * MiB, 0);
	post_all(&p, &op, 1);
	end = now_s() + DEADLINE;
	while (got < sizeof(in) && now_s() < end) {
		ssize_t n;

		pump(&p);
		if (fd < 0) {
			fd = accept(lfd, NULL, NULL);
			if (fd >= 0)
				fake_auth(&p, fd, bl.nonce);
			continue;
		}
		n = recv(fd, in + got, sizeof(in) - got, MSG_DONTWAIT);
		if (n > 0)
			got += (size_t) n;
	}
	assert_int_equal(got, sizeof(in));
	kvb_tcp_rec_decode(&rec, in + KVB_TCP_HDR_LEN);
	/* acknowledge it now, without reading the payload */
	kvb_tcp_hdr_encode(&h, ack);
	rec = (struct kvb_tcp_rec){.seq = rec.seq};
	kvb_tcp_rec_encode(&rec, ack + KVB_TCP_HDR_LEN);
	assert_int_equal(send(fd, ack, sizeof(ack), 0), (ssize_t) sizeof(ack));
	while (p.tr.done < 1 && now_s() < end)
		pump(&p);
	assert_int_equal(p.tr.done, 1);
	assert_true(p.tr.status[0] < 0);
	close(fd);
	close(lfd);
	pair_close(&p);
	region_free(&l);
}

/* Listen on 127.0.0.1 and point p->ep at it: the test plays the server. */
static int fake_server(struct pair *p)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	uint8_t blob[64];
	size_t len = sizeof(blob);
	struct kvb_tcp_blob bl;
	int lfd;

	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	assert_true(lfd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *) &sa, &sl), 0);
	assert_int_equal(kvb_tcp_ops.local_info(p->b, blob, &len), 0);
	assert_int_equal(kvb_tcp_blob_decode(&bl, blob, len), 0);
	bl.port = ntohs(sa.sin_port);
	kvb_tcp_blob_encode(&bl, blob);
	kvb_tcp_ops.disconnect(p->a, p->ep);
	assert_int_equal(kvb_tcp_ops.connect(p->a, blob, len, &p->ep), 0);
	ep_key(p->a, p->ep);
	return lfd;
}

/* Accept (if *fd < 0) and read exactly n bytes of requests, pumping A. */
static void fake_recv(struct pair *p, int lfd, int *fd, uint8_t *buf, size_t n)
{
	double end = now_s() + DEADLINE;
	size_t got = 0;

	while (got < n && now_s() < end) {
		ssize_t r;

		pump(p);
		if (*fd < 0) {
			*fd = accept(lfd, NULL, NULL);
			if (*fd >= 0)
				fake_auth(p, *fd, kvb_tcp_id(p->b));
			continue;
		}
		r = recv(*fd, buf + got, n - got, MSG_DONTWAIT);
		if (r > 0)
			got += (size_t) r;
	}
	assert_int_equal(got, n);
}

/* An ACK of one record for seq, status 0. */
static void fake_ack(int fd, uint64_t seq)
{
	uint8_t ack[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN];
	struct kvb_tcp_hdr h = {.type = KVB_TCP_F_ACK, .count = 1};
	struct kvb_tcp_rec rec = {.seq = seq};

	kvb_tcp_hdr_encode(&h, ack);
	kvb_tcp_rec_encode(&rec, ack + KVB_TCP_HDR_LEN);
	assert_int_equal(send(fd, ack, sizeof(ack), 0), (ssize_t) sizeof(ack));
}

/*
 * A READ_RESP whose trailer holds a positive status (fuzz_tcp_dial,
 * corpus/tcp_dial/repro-trailer-positive-status): a status is 0 or -errno,
 * so the frame is malformed: the connection fails with -EPROTO and counts
 * `rejected`, as a positive status in a record does.
 */
static void test_trailer_positive_status(void **state)
{
	uint8_t in[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN];
	uint8_t out[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN + 16 + 8];
	struct kvb_tcp_hdr h = {
		.type = KVB_TCP_F_READ_RESP, .count = 1, .payload = 16};
	struct kvb_tcp_rec rec;
	struct kvb_xop op;
	struct region l;
	struct pair p;
	double end;
	int lfd, fd = -1;

	(void) state;
	pair_open(&p, 0, 10000, 1);
	lfd = fake_server(&p);
	region_init(&l, 1, 4 * KiB, 0);
	reg(p.a, &l);
	op = xop(KVB_XOP_READ, &l, 0, 1, 0, 16, 0);
	post_all(&p, &op, 1);
	fake_recv(&p, lfd, &fd, in, sizeof(in));
	kvb_tcp_rec_decode(&rec, in + KVB_TCP_HDR_LEN);
	kvb_tcp_hdr_encode(&h, out);
	rec = (struct kvb_tcp_rec){.seq = rec.seq, .len = 16};
	kvb_tcp_rec_encode(&rec, out + KVB_TCP_HDR_LEN);
	memset(out + KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN, 0x33, 16);
	memset(out + sizeof(out) - 8, 0, 8);
	kvb_tcp_status_put(out + sizeof(out) - 8, 5);
	assert_int_equal(send(fd, out, sizeof(out), 0), (ssize_t) sizeof(out));
	end = now_s() + DEADLINE;
	while (p.tr.done < 1 && now_s() < end)
		pump(&p);
	assert_int_equal(p.tr.done, 1);
	assert_int_equal(p.tr.status[0], -EPROTO);
	assert_int_equal(stats(p.a).rejected, 1);
	assert_int_equal(stats(p.a).conn_failed, 1);
	assert_true(guards_ok(&l));
	close(fd);
	close(lfd);
	pair_close(&p);
	region_free(&l);
}

/*
 * A zero-length WRITE has no payload to wait for: its ACK is due once its
 * record is sent, even in a slot whose previous WRITE ended further into
 * the send stream of a connection that has since been replaced.
 */
static void test_empty_write_after_reconnect(void **state)
{
	uint8_t in[KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN + 4096];
	struct kvb_tcp_rec rec;
	struct kvb_xop op;
	struct region l;
	struct pair p;
	double end;
	int lfd, fd = -1;

	(void) state;
	pair_open(&p, 0, 10000, 2);
	lfd = fake_server(&p);
	region_init(&l, 1, 4 * KiB, 0);
	reg(p.a, &l);
	op = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 4096, 0);
	post_all(&p, &op, 1);
	fake_recv(&p, lfd, &fd, in, sizeof(in));
	kvb_tcp_rec_decode(&rec, in + KVB_TCP_HDR_LEN);
	fake_ack(fd, rec.seq);
	wait_all(&p);
	assert_int_equal(p.tr.status[0], 0);
	/* the server goes away; the next post dials again */
	close(fd);
	fd = -1;
	end = now_s() + DEADLINE;
	while (!stats(p.a).conn_failed && now_s() < end)
		pump(&p);
	assert_int_equal(stats(p.a).conn_failed, 1);
	op = xop(KVB_XOP_WRITE, &l, 0, 1, 0, 0, 1);
	post_all(&p, &op, 1);
	fake_recv(&p, lfd, &fd, in, KVB_TCP_HDR_LEN + KVB_TCP_REC_LEN);
	kvb_tcp_rec_decode(&rec, in + KVB_TCP_HDR_LEN);
	fake_ack(fd, rec.seq);
	wait_all(&p);
	assert_int_equal(p.tr.status[1], 0);
	assert_int_equal(stats(p.a).rejected, 0);
	close(fd);
	close(lfd);
	pair_close(&p);
	region_free(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_ops),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_peer_closed),
		cmocka_unit_test(test_disconnect_in_flight),
		cmocka_unit_test(test_stalled_peer),
		cmocka_unit_test(test_dereg_during_write),
		cmocka_unit_test(test_dereg_during_read),
		cmocka_unit_test(test_early_ack),
		cmocka_unit_test(test_trailer_positive_status),
		cmocka_unit_test(test_empty_write_after_reconnect),
	};

	srand(1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

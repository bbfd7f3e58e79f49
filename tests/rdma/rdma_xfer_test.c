// SPDX-License-Identifier: MIT
/*
 * rdma_xfer_test: two processes on one verbs device (rxe0 in the soft-RoCE
 * guest), real RC queue pairs through the rdma transport.
 *
 *   A (parent) posts; B (child) owns the target regions and checks bytes.
 *   They exchange connection blobs and commands over a SOCK_SEQPACKET pair.
 *
 * Cases: WRITE and READ of many blocks (merged runs and scattered blocks)
 * byte-verified; a burst of 10,000 ops through a 64-deep send queue (no
 * ENOMEM, credits never exceeded, everything lands); a transfer to a bad
 * rkey fails only its own ops, the endpoint re-handshakes and the next
 * transfer lands; the target deregisters a region mid-transfer, the ops
 * after that fail, the next transfer after reconnect lands; regions are
 * registered with only the remote access their KVB_MEM_REMOTE_* flags
 * grant: a WRITE to a region without REMOTE_WRITE, or a READ from one
 * without REMOTE_READ, fails with -EACCES (its real rkey notwithstanding)
 * and moves no byte, while the access a region has works.
 *
 * Exit: 0 pass, 1 fail, 77 no verbs device. Env: KVB_RDMA_DEV (device).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bridge/rdma/conn.h"
#include "bridge/rdma/rdma.h"
#include "kvbroker/kvbroker.h"

#define BLK	  4096u
#define NBLK	  2048u
#define REGION	  (NBLK * BLK) /* 8 MiB */
#define REGION2	  (2u << 20)
#define REGION3	  (256u << 10) /* regions 2 and 3: access tests */
#define NREG	  4
#define SQ_DEPTH  64
#define NQP	  2
#define BURST	  10000u
#define BURST_SZ  256u
#define BURST_STR 512u
#define PENDING	  0x7fffffff

enum {
	M_BLOB = 1,
	M_MR,
	M_FILL,
	M_VERIFY,
	M_DEREG2,
	M_OK,
	M_FAIL,
	M_SKIP,
	M_QUIT
};

struct msg {
	uint32_t type;
	uint32_t len;
	union {
		uint8_t blob[KVB_RDMA_CONN_MAX];
		struct {
			uint64_t addr[NREG];
			uint32_t rkey[NREG];
		} mr;
		struct {
			uint32_t seed, count, size, stride, region;
			uint64_t off;
		} v;
		uint64_t bad_off;
	} u;
};

static const char *who = "A";

#define CHECK(cond, ...)                                              \
	do {                                                          \
		if (!(cond)) {                                        \
			fprintf(stderr, "[%s] FAIL %s:%d: %s: ", who, \
				__FILE__, __LINE__, #cond);           \
			fprintf(stderr, __VA_ARGS__);                 \
			fprintf(stderr, "\n");                        \
			return -1;                                    \
		}                                                     \
	} while (0)

static uint8_t pat(uint32_t seed, uint64_t off)
{
	uint64_t x = (off + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t) seed << 40;

	return (uint8_t) (x >> 56 ^ x >> 17 ^ off);
}

static void fill(uint8_t *p, uint32_t seed, uint64_t n)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		p[i] = pat(seed, i);
}

/*
 * First offset in count blocks of size bytes, stride apart from `at`, that
 * differs from the pattern, or -1.
 */
static int64_t verify(const uint8_t *p, uint32_t seed, uint64_t at,
		      uint32_t count, uint32_t size, uint32_t stride)
{
	uint64_t i, j;

	for (i = 0; i < count; i++)
		for (j = 0; j < size; j++) {
			uint64_t off = at + i * stride + j;

			if (p[off] != pat(seed, off))
				return (int64_t) off;
		}
	return -1;
}

static int msend(int fd, struct msg *m)
{
	return send(fd, m, sizeof(*m), 0) == (ssize_t) sizeof(*m) ? 0 : -EIO;
}

static int mrecv(int fd, struct msg *m)
{
	return recv(fd, m, sizeof(*m), 0) == (ssize_t) sizeof(*m) ? 0 : -EIO;
}

static int open_transport(struct kvb_transport **t)
{
	struct kvb_transport_params p = {
		.dev_name = getenv("KVB_RDMA_DEV"),
		.ib_port = 1,
		.gid_index = -1,
		.post_batch_size = -1,
		.qp_per_peer = NQP,
		.sq_depth = SQ_DEPTH,
	};
	char why[128] = "";
	int err;

	err = kvb_rdma_ops.open(&p, t, why, sizeof(why));
	if (err == -ENODEV)
		fprintf(stderr, "[%s] SKIP: %s\n", who, why);
	return err;
}

/* ---- B: the target ------------------------------------------------------ */

/*
 * B's regions: 0 the WRITE/READ/burst/bad-rkey target, 1 the one dropped
 * mid-transfer (written only), 2 offered to nobody, 3 read-only. Regions
 * 1 to 3 start with a guard pattern that no refused access may change.
 */
static const struct {
	uint32_t size, flags, guard;
} regs[NREG] = {
	{REGION, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ, 0},
	{REGION2, KVB_MEM_REMOTE_WRITE, 60},
	{REGION3, 0, 61},
	{REGION3, KVB_MEM_REMOTE_READ, 62},
};

static int target(int fd)
{
	static uint8_t *buf[NREG];
	struct kvb_mr mr[NREG];
	struct kvb_transport *t;
	struct kvb_ep *ep;
	struct msg m;
	size_t len;
	int err, i;

	who = "B";
	err = open_transport(&t);
	if (err) {
		m.type = M_SKIP;
		msend(fd, &m);
		return err == -ENODEV ? 77 : -1;
	}
	for (i = 0; i < NREG; i++) {
		buf[i] = aligned_alloc(4096, regs[i].size);
		CHECK(buf[i], "alloc");
		if (regs[i].guard)
			fill(buf[i], regs[i].guard, regs[i].size);
		else
			memset(buf[i], 0, regs[i].size);
		mr[i] = (struct kvb_mr){.id = (uint32_t) i + 1,
					.flags = regs[i].flags,
					.addr = buf[i],
					.len = regs[i].size};
		err = kvb_rdma_ops.reg_mr(t, &mr[i]);
		CHECK(err == 0, "reg_mr %d: %d", i, err);
	}

	for (;;) {
		CHECK(mrecv(fd, &m) == 0, "recv");
		switch (m.type) {
		case M_BLOB:
			/* an offer (first or after a reset): answer it */
			err = kvb_rdma_ops.connect(t, m.u.blob, m.len, &ep);
			CHECK(err == 0, "connect: %d", err);
			len = sizeof(m.u.blob);
			err = kvb_rdma_ep_info(t, ep, m.u.blob, &len);
			CHECK(err == 0, "ep_info: %d", err);
			m.len = (uint32_t) len;
			CHECK(msend(fd, &m) == 0, "send");
			m.type = M_MR;
			for (i = 0; i < NREG; i++) {
				m.u.mr.addr[i] = (uintptr_t) buf[i];
				/* a device may hand out no rkey for a region
				 * without remote access: then the lkey is
				 * what a peer would try (same key on rxe) */
				m.u.mr.rkey[i] =
					mr[i].rkey ? mr[i].rkey : mr[i].lkey;
			}
			CHECK(msend(fd, &m) == 0, "send");
			break;
		case M_FILL:
			fill(buf[0], m.u.v.seed, REGION);
			m.type = M_OK;
			CHECK(msend(fd, &m) == 0, "send");
			break;
		case M_VERIFY: {
			uint32_t rg = m.u.v.region < NREG ? m.u.v.region : 0;
			int64_t bad = -2;

			if (m.u.v.off +
				    (uint64_t) (m.u.v.count ? m.u.v.count - 1
							    : 0) *
					    m.u.v.stride +
				    m.u.v.size <=
			    regs[rg].size)
				bad = verify(buf[rg], m.u.v.seed, m.u.v.off,
					     m.u.v.count, m.u.v.size,
					     m.u.v.stride);

			m.type = bad < 0 ? M_OK : M_FAIL;
			m.u.bad_off = (uint64_t) bad;
			CHECK(msend(fd, &m) == 0, "send");
			break;
		}
		case M_DEREG2:
			kvb_rdma_ops.dereg_mr(t, &mr[1]);
			m.type = M_OK;
			CHECK(msend(fd, &m) == 0, "send");
			break;
		case M_QUIT:
			for (i = 0; i < NREG; i++) {
				kvb_rdma_ops.dereg_mr(t, &mr[i]);
				free(buf[i]);
			}
			kvb_rdma_ops.close(t);
			return 0;
		default:
			CHECK(0, "message %u", m.type);
		}
	}
}

/* ---- A: the poster ------------------------------------------------------ */

struct ctx {
	int fd;
	struct kvb_transport *t;
	struct kvb_ep *ep;
	uint8_t *buf;
	struct kvb_mr mr;
	uint64_t raddr[NREG];
	uint32_t rkey[NREG];
	int32_t *st; /* status per cookie, PENDING until completed */
	unsigned max_in_flight;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One poll() pass into c->st, each cookie exactly once (no waiting). */
static int reap_now(struct ctx *c, unsigned *got)
{
	struct kvb_xcqe cq[64];
	int n = kvb_rdma_ops.poll(c->t, cq, 64), i;

	CHECK(n >= 0, "poll: %d", n);
	for (i = 0; i < n; i++) {
		CHECK(c->st[cq[i].cookie] == PENDING,
		      "cookie %lu completed twice",
		      (unsigned long) cq[i].cookie);
		c->st[cq[i].cookie] = cq[i].status;
	}
	*got += (unsigned) n;
	return 0;
}

/* reap_now() until `want` completions arrived (120 s at most) */
static int reap(struct ctx *c, unsigned want, unsigned *got)
{
	double deadline = now() + 120;

	while (*got < want) {
		unsigned before = *got;

		if (reap_now(c, got))
			return -1;
		if (*got == before)
			CHECK(now() < deadline, "timeout: %u of %u", *got,
			      want);
	}
	return 0;
}

static void note_in_flight(struct ctx *c)
{
	struct kvb_rdma_qp_stats qs;
	unsigned i;

	for (i = 0; i < NQP; i++)
		if (!kvb_rdma_qp_stats(c->t, c->ep, i, &qs) &&
		    qs.in_flight > c->max_in_flight)
			c->max_in_flight = qs.in_flight;
}

/*
 * Post ops[0..n) through the credits, polling as needed, and wait for all.
 * post() must never fail: accepted counts only.
 */
static int run_ops(struct ctx *c, struct kvb_xop *ops, unsigned n)
{
	unsigned done = 0, got = 0, i;
	int r;

	for (i = 0; i < n; i++)
		c->st[ops[i].cookie] = PENDING;
	while (done < n) {
		r = kvb_rdma_ops.post(c->t, c->ep, ops + done, n - done);
		CHECK(r >= 0, "post: %d (%s) after %u ops", r, strerror(-r),
		      done);
		done += (unsigned) r;
		note_in_flight(c);
		if (done < n) {
			struct kvb_xcqe cq[64];
			int k = kvb_rdma_ops.poll(c->t, cq, 64);

			CHECK(k >= 0, "poll: %d", k);
			for (i = 0; i < (unsigned) k; i++) {
				CHECK(c->st[cq[i].cookie] == PENDING,
				      "cookie twice");
				c->st[cq[i].cookie] = cq[i].status;
			}
			got += (unsigned) k;
		}
	}
	return reap(c, n, &got);
}

static int cmd_at(struct ctx *c, uint32_t type, uint32_t seed, uint32_t count,
		  uint32_t size, uint32_t stride, uint32_t region, uint64_t off)
{
	struct msg m = {.type = type};

	m.u.v.off = off;
	m.u.v.seed = seed;
	m.u.v.count = count;
	m.u.v.size = size;
	m.u.v.stride = stride;
	m.u.v.region = region;
	CHECK(msend(c->fd, &m) == 0, "send");
	CHECK(mrecv(c->fd, &m) == 0, "recv");
	CHECK(m.type == M_OK, "B says no (bad offset %ld)", (long) m.u.bad_off);
	return 0;
}

static int cmd(struct ctx *c, uint32_t type, uint32_t seed, uint32_t count,
	       uint32_t size, uint32_t stride, uint32_t region)
{
	return cmd_at(c, type, seed, count, size, stride, region, 0);
}

/* Offer our endpoint's blob, take the answer and B's regions. */
static int handshake(struct ctx *c)
{
	struct kvb_ep *ep2;
	struct msg m = {.type = M_BLOB};
	size_t len = sizeof(m.u.blob);
	int err;

	err = kvb_rdma_ep_info(c->t, c->ep, m.u.blob, &len);
	CHECK(err == 0, "ep_info %d", err);
	m.len = (uint32_t) len;
	CHECK(msend(c->fd, &m) == 0, "send");
	CHECK(mrecv(c->fd, &m) == 0 && m.type == M_BLOB, "answer");
	err = kvb_rdma_ops.connect(c->t, m.u.blob, m.len, &ep2);
	CHECK(err == 0, "connect(answer): %d", err);
	CHECK(ep2 == c->ep, "answer opened another endpoint");
	CHECK(kvb_rdma_ep_state(c->t, c->ep) == KVB_RDMA_EP_READY, "state");
	CHECK(mrecv(c->fd, &m) == 0 && m.type == M_MR, "mr");
	for (int i = 0; i < NREG; i++) {
		c->raddr[i] = m.u.mr.addr[i];
		c->rkey[i] = m.u.mr.rkey[i];
	}
	return 0;
}

static struct kvb_xop op(struct ctx *c, uint32_t code, uint64_t off,
			 uint64_t len, uint64_t cookie, int region)
{
	struct kvb_xop o = {
		.opcode = code,
		.local = &c->mr,
		.local_off = off,
		.remote = {.addr = c->raddr[region], .rkey = c->rkey[region]},
		.remote_off = off,
		.len = len,
		.cookie = cookie,
	};
	return o;
}

/*
 * All NBLK blocks, in runs of 1..8 adjacent blocks (merged into one WR each)
 * posted in shuffled order.
 */
static unsigned block_ops(struct ctx *c, struct kvb_xop *ops, uint32_t code)
{
	unsigned run_start[NBLK], run_len[NBLK], nruns = 0, b = 0, i, j, n = 0;

	srand(7);
	while (b < NBLK) {
		unsigned l = 1 + (unsigned) rand() % 8;

		if (l > NBLK - b)
			l = NBLK - b;
		run_start[nruns] = b;
		run_len[nruns++] = l;
		b += l;
	}
	for (i = nruns - 1; i > 0; i--) {
		unsigned k = (unsigned) rand() % (i + 1), s = run_start[i],
			 l = run_len[i];

		run_start[i] = run_start[k];
		run_len[i] = run_len[k];
		run_start[k] = s;
		run_len[k] = l;
	}
	for (i = 0; i < nruns; i++)
		for (j = 0; j < run_len[i]; j++, n++)
			ops[n] =
				op(c, code, (uint64_t) (run_start[i] + j) * BLK,
				   BLK, n, 0);
	return n;
}

static int all_ok(struct ctx *c, unsigned from, unsigned n)
{
	unsigned i;

	for (i = from; i < from + n; i++)
		CHECK(c->st[i] == 0, "op %u status %d", i, c->st[i]);
	return 0;
}

static int case_write(struct ctx *c, struct kvb_xop *ops)
{
	struct kvb_transport_stats s0 = c->t->stats;
	unsigned n;

	fill(c->buf, 11, REGION);
	n = block_ops(c, ops, KVB_XOP_WRITE);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	CHECK(cmd(c, M_VERIFY, 11, 1, REGION, 0, 0) == 0, "verify");
	CHECK(c->t->stats.wrs - s0.wrs < n, "nothing merged: %lu WRs",
	      (unsigned long) (c->t->stats.wrs - s0.wrs));
	printf("write: %u ops -> %lu WRs in %lu doorbells, verified\n", n,
	       (unsigned long) (c->t->stats.wrs - s0.wrs),
	       (unsigned long) (c->t->stats.doorbells - s0.doorbells));
	return 0;
}

static int case_read(struct ctx *c, struct kvb_xop *ops)
{
	unsigned n;
	int64_t bad;

	CHECK(cmd(c, M_FILL, 23, 0, 0, 0, 0) == 0, "fill");
	memset(c->buf, 0, REGION);
	n = block_ops(c, ops, KVB_XOP_READ);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	bad = verify(c->buf, 23, 0, 1, REGION, 0);
	CHECK(bad < 0, "read data differs at %ld", (long) bad);
	printf("read: %u ops verified\n", n);
	return 0;
}

/*
 * Completion events: post a chain of EV_BATCH writes, arm() (a broker about
 * to sleep; 1 = completions already waiting: hand them out and arm again)
 * and sleep on wait_fd(): a completion after arming must wake it (well
 * before the 5 s limit), and poll() then hands the rest out. When every
 * write completed before arm() said 0 (a loaded host can stall this vCPU
 * that long), try again with the next blocks.
 */
#define EV_BATCH 64u
static int case_events(struct ctx *c, struct kvb_xop *ops)
{
	int fd = kvb_rdma_ops.wait_fd(c->t), tries, woke = 0;
	unsigned nops;

	CHECK(fd >= 0, "no completion channel on this device");
	fill(c->buf, 31, REGION);
	nops = block_ops(c, ops, KVB_XOP_WRITE);
	for (tries = 0;
	     tries < 20 && !woke && (unsigned) (tries + 1) * EV_BATCH <= nops;
	     tries++) {
		struct kvb_xop *b = ops + (unsigned) tries * EV_BATCH;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		unsigned got = 0, i;
		double t0;
		int rc;

		for (i = 0; i < EV_BATCH; i++)
			c->st[b[i].cookie] = PENDING;
		CHECK(kvb_rdma_ops.post(c->t, c->ep, b, EV_BATCH) ==
			      (int) EV_BATCH,
		      "post");
		while ((rc = kvb_rdma_ops.arm(c->t)) == 1 && got < EV_BATCH)
			if (reap_now(c, &got))
				return -1;
		CHECK(rc == 0 || rc == 1, "arm: %d", rc);
		if (rc == 0 && got < EV_BATCH) {
			t0 = now();
			rc = poll(&pf, 1, 5000);
			CHECK(rc == 1, "no completion event within 5 s (%d)",
			      rc);
			woke = 1;
			printf("events: woken %.0f us after arming (%u of %u "
			       "writes done before)\n",
			       (now() - t0) * 1e6, got, EV_BATCH);
		}
		if (reap(c, EV_BATCH, &got) ||
		    all_ok(c, (unsigned) tries * EV_BATCH, EV_BATCH))
			return -1;
	}
	CHECK(woke, "every write had completed before arm()");
	return 0;
}

static int case_burst(struct ctx *c, struct kvb_xop *ops)
{
	struct kvb_transport_stats s0 = c->t->stats;
	unsigned i;

	fill(c->buf, 31, REGION);
	c->max_in_flight = 0;
	/* 256-byte pieces with gaps: nothing merges, 10,000 WRs */
	for (i = 0; i < BURST; i++)
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * BURST_STR,
			    BURST_SZ, i, 0);
	if (run_ops(c, ops, BURST) || all_ok(c, 0, BURST))
		return -1;
	CHECK(cmd(c, M_VERIFY, 31, BURST, BURST_SZ, BURST_STR, 0) == 0,
	      "verify");
	CHECK(c->t->stats.wrs - s0.wrs == BURST, "WRs %lu",
	      (unsigned long) (c->t->stats.wrs - s0.wrs));
	CHECK(c->max_in_flight <= SQ_DEPTH, "in flight %u > depth",
	      c->max_in_flight);
	CHECK(c->t->stats.credit_stalls > s0.credit_stalls, "no stall seen");
	printf("burst: %u ops through depth %u x %u QPs: %lu doorbells, "
	       "max in flight %u, %lu credit stalls, no ENOMEM, verified\n",
	       BURST, SQ_DEPTH, NQP,
	       (unsigned long) (c->t->stats.doorbells - s0.doorbells),
	       c->max_in_flight,
	       (unsigned long) (c->t->stats.credit_stalls - s0.credit_stalls));
	return 0;
}

/* post() on a reset endpoint says so; re-handshake. */
static int recover(struct ctx *c)
{
	struct kvb_xop o = op(c, KVB_XOP_WRITE, 0, 8, 0, 0);
	int r;

	/* completions may still trail in: reap without waiting */
	r = kvb_rdma_ops.post(c->t, c->ep, &o, 1);
	CHECK(r == -ENOTCONN, "post on a failed endpoint: %d", r);
	CHECK(kvb_rdma_ep_state(c->t, c->ep) == KVB_RDMA_EP_RESET, "state");
	return handshake(c);
}

static int case_bad_rkey(struct ctx *c, struct kvb_xop *ops)
{
	unsigned i, n = 64, eacces = 0;

	/* T1 lands */
	fill(c->buf, 41, REGION);
	for (i = 0; i < n; i++)
		ops[i] =
			op(c, KVB_XOP_WRITE, (uint64_t) i * 2 * BLK, BLK, i, 0);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	/* T2 goes to a key B never handed out */
	for (i = 0; i < n; i++) {
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * 2 * BLK + BLK, BLK,
			    n + i, 0);
		ops[i].remote.rkey ^= 0x5a5a00;
	}
	if (run_ops(c, ops, n))
		return -1;
	if (all_ok(c, 0, n)) /* T1 untouched */
		return -1;
	for (i = n; i < 2 * n; i++) {
		CHECK(c->st[i] == -EACCES || c->st[i] == -ECANCELED,
		      "T2 op %u status %d", i, c->st[i]);
		eacces += c->st[i] == -EACCES;
	}
	CHECK(eacces >= 1, "no -EACCES");
	if (recover(c))
		return -1;
	/* T3 lands */
	fill(c->buf, 43, REGION);
	for (i = 0; i < n; i++)
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * BLK, BLK, i, 0);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	CHECK(cmd(c, M_VERIFY, 43, n, BLK, BLK, 0) == 0, "verify T3");
	printf("bad rkey: T1 ok, T2 %u/%u failed (%u EACCES), reconnected, "
	       "T3 verified\n",
	       n, n, eacces);
	return 0;
}

/*
 * n ops of one BLK, 2 * BLK apart (one WR each), between A's buffer and B's
 * region `rg` that lacks the access `code` needs: every op fails, at least
 * one with -EACCES (the rest flushed), the endpoint is reset and taken back.
 * Nothing moved: B's region still holds its guard (checked by B) and, for a
 * READ, A's buffer still holds `seed`.
 */
static int denied(struct ctx *c, struct kvb_xop *ops, uint32_t code, int rg,
		  uint32_t seed, const char *what)
{
	unsigned i, n = REGION3 / (2 * BLK), eacces = 0;
	int64_t bad;
	int err;

	fill(c->buf, seed, REGION3);
	for (i = 0; i < n; i++)
		ops[i] = op(c, code, (uint64_t) i * 2 * BLK, BLK, i, rg);
	if (run_ops(c, ops, n))
		return -1;
	for (i = 0; i < n; i++) {
		CHECK(c->st[i] == -EACCES || c->st[i] == -ECANCELED,
		      "%s region: op %u status %d", what, i, c->st[i]);
		eacces += c->st[i] == -EACCES;
	}
	CHECK(eacces >= 1, "%s region: no -EACCES", what);
	err = cmd(c, M_VERIFY, regs[rg].guard, 1, REGION3, 0, (uint32_t) rg);
	CHECK(err == 0, "%s region: B's region %d changed", what, rg);
	bad = verify(c->buf, seed, 0, 1, REGION3, 0);
	CHECK(bad < 0, "%s region: A's buffer changed at %ld", what,
	      (long) bad);
	if (recover(c))
		return -1;
	printf("access: %s region refused (%u/%u ops failed, %u EACCES), "
	       "nothing moved, reconnected\n",
	       what, n, n, eacces);
	return 0;
}

/*
 * Registration follows the region's flags. B's region 2 (no remote flag)
 * refuses WRITE and READ with its real key, region 3 (REMOTE_READ) refuses
 * WRITE, region 1 (REMOTE_WRITE) refuses READ; then what is granted works:
 * READ from region 3, WRITE to region 0. A's own region has no remote flag:
 * the source of a WRITE and the sink of a READ need only local access.
 */
static int case_access(struct ctx *c, struct kvb_xop *ops)
{
	unsigned i, n = REGION3 / BLK;
	int64_t bad;

	if (denied(c, ops, KVB_XOP_WRITE, 2, 71, "WRITE to a local-only") ||
	    denied(c, ops, KVB_XOP_READ, 2, 72, "READ from a local-only") ||
	    denied(c, ops, KVB_XOP_WRITE, 3, 73, "WRITE to a read-only") ||
	    denied(c, ops, KVB_XOP_READ, 1, 74, "READ from a write-only"))
		return -1;
	/* granted: READ region 3 (its guard pattern) */
	memset(c->buf, 0, REGION3);
	for (i = 0; i < n; i++)
		ops[i] = op(c, KVB_XOP_READ, (uint64_t) i * BLK, BLK, i, 3);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	bad = verify(c->buf, regs[3].guard, 0, 1, REGION3, 0);
	CHECK(bad < 0, "read-only region: READ differs at %ld", (long) bad);
	/* granted: WRITE region 0 */
	fill(c->buf, 75, REGION3);
	for (i = 0; i < n; i++)
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * BLK, BLK, i, 0);
	if (run_ops(c, ops, n) || all_ok(c, 0, n))
		return -1;
	CHECK(cmd(c, M_VERIFY, 75, 1, REGION3, 0, 0) == 0, "verify");
	printf("access: READ from the read-only region and WRITE to the "
	       "read-write region verified\n");
	return 0;
}

/*
 * B drops a region while writes to it are in flight: a first part lands
 * (waited for), a second part races the dereg, a third is posted after it.
 * Each op completes once; the third part fails, the first lands, the
 * racing part may go either way, and every op reported landed is verified.
 */
static int case_dereg(struct ctx *c, struct kvb_xop *ops)
{
	unsigned i, n = 512, q1 = 128, q2 = 256, got = 0, done = 0, ok = 0,
		    fail = 0;
	int r;

	fill(c->buf, 51, REGION);
	for (i = 0; i < n; i++)
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * BLK, BLK, i, 1);
	for (i = 0; i < n; i++)
		c->st[i] = PENDING;
	/* part one: posted and landed */
	if (run_ops(c, ops, q1))
		return -1;
	done = got = q1;
	/* part two: in flight when the region goes */
	while (done < q2) {
		r = kvb_rdma_ops.post(c->t, c->ep, ops + done, q2 - done);
		CHECK(r >= 0, "post %d", r);
		done += (unsigned) r;
		if (done < q2 && reap(c, got + 1, &got))
			return -1;
	}
	CHECK(cmd(c, M_DEREG2, 0, 0, 0, 0, 0) == 0, "dereg");
	while (done < n) {
		r = kvb_rdma_ops.post(c->t, c->ep, ops + done, n - done);
		if (r == -ENOTCONN)
			break; /* the error already reset the endpoint */
		CHECK(r >= 0, "post %d", r);
		done += (unsigned) r;
		if (done < n && reap(c, got + 1, &got))
			return -1;
	}
	if (reap(c, done, &got))
		return -1;
	for (i = 0; i < done; i++) {
		CHECK(c->st[i] == 0 || c->st[i] == -EACCES ||
			      c->st[i] == -ECANCELED,
		      "op %u status %d", i, c->st[i]);
		ok += c->st[i] == 0;
		fail += c->st[i] != 0;
	}
	for (i = 0; i < q1; i++)
		CHECK(c->st[i] == 0, "op %u before the dereg failed", i);
	for (i = q2; i < done; i++)
		CHECK(c->st[i] != 0, "op %u posted after dereg succeeded", i);
	CHECK(fail >= 1, "nothing failed");
	/* what is reported landed did land */
	for (i = 0; i < done; i++)
		if (!c->st[i] &&
		    cmd_at(c, M_VERIFY, 51, 1, BLK, 0, 1, (uint64_t) i * BLK))
			return -1;
	if (recover(c))
		return -1;
	/* the next transfer (region 0) lands */
	fill(c->buf, 53, REGION);
	for (i = 0; i < 256; i++)
		ops[i] = op(c, KVB_XOP_WRITE, (uint64_t) i * BLK, BLK, i, 0);
	if (run_ops(c, ops, 256) || all_ok(c, 0, 256))
		return -1;
	CHECK(cmd(c, M_VERIFY, 53, 256, BLK, BLK, 0) == 0, "verify");
	printf("dereg mid-transfer: %u posted, %u landed (verified), %u "
	       "failed, reconnected, next transfer verified\n",
	       done, ok, fail);
	return 0;
}

static int initiator(int fd)
{
	struct ctx c = {.fd = fd};
	struct kvb_xop *ops = calloc(BURST, sizeof(*ops));
	struct msg m;
	int err;

	c.st = calloc(BURST, sizeof(*c.st));
	c.buf = aligned_alloc(4096, REGION);
	CHECK(ops && c.st && c.buf, "alloc");
	err = open_transport(&c.t);
	if (err == -ENODEV) { /* no RDMA device: skipped */
		free(ops);
		free(c.st);
		free(c.buf);
		return 77;
	}
	CHECK(err == 0, "open: %d", err);
	c.mr.id = 1;
	c.mr.flags = 0; /* local only: WRITE source, READ sink */
	c.mr.addr = c.buf;
	c.mr.len = REGION;
	CHECK(kvb_rdma_ops.reg_mr(c.t, &c.mr) == 0, "reg_mr");
	/* connect(NULL): our endpoint, HALF, offered to B */
	err = kvb_rdma_ops.connect(c.t, NULL, 0, &c.ep);
	CHECK(err == 0, "connect: %d", err);
	CHECK(kvb_rdma_ep_state(c.t, c.ep) == KVB_RDMA_EP_HALF, "half");
	err = handshake(&c);
	if (!err)
		err = case_write(&c, ops);
	if (!err)
		err = case_read(&c, ops);
	if (!err)
		err = case_events(&c, ops);
	if (!err)
		err = case_burst(&c, ops);
	if (!err)
		err = case_bad_rkey(&c, ops);
	if (!err)
		err = case_access(&c, ops);
	if (!err)
		err = case_dereg(&c, ops);
	m.type = M_QUIT;
	msend(fd, &m);
	printf("stats: doorbells %lu wrs %lu bytes %lu cqes %lu stalls %lu "
	       "errors %lu\n",
	       (unsigned long) c.t->stats.doorbells,
	       (unsigned long) c.t->stats.wrs, (unsigned long) c.t->stats.bytes,
	       (unsigned long) c.t->stats.cqes,
	       (unsigned long) c.t->stats.credit_stalls,
	       (unsigned long) c.t->stats.errors);
	kvb_rdma_ops.disconnect(c.t, c.ep);
	kvb_rdma_ops.dereg_mr(c.t, &c.mr);
	kvb_rdma_ops.close(c.t);
	free(c.buf);
	free(c.st);
	free(ops);
	return err ? 1 : 0;
}

int main(void)
{
	int sv[2], status, rc;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv)) {
		perror("socketpair");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (!pid) {
		close(sv[0]);
		rc = target(sv[1]);
		_exit(rc == 77 ? 77 : rc ? 1 : 0);
	}
	close(sv[1]);
	rc = initiator(sv[0]);
	close(sv[0]); /* B's next recv fails if A gave up early */
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
		return 1;
	if (rc == 77 || WEXITSTATUS(status) == 77)
		return 77;
	if (rc || WEXITSTATUS(status)) {
		fprintf(stderr, "FAIL (A %d, B %d)\n", rc, WEXITSTATUS(status));
		return 1;
	}
	printf("PASS\n");
	return 0;
}

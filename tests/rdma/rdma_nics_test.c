// SPDX-License-Identifier: MIT
/*
 * rdma_nics_test: the rdma transport over two verbs devices (rxe0 and rxe1
 * in the soft-RoCE guest, made by nics-guest.sh). Two transports in one
 * process, A (posts) and B (target), each opening KVB_RDMA_DEVS
 * ("rxe0,rxe1"); the handshake as the broker does it (offer, answer, and
 * an offer again after a reset).
 *
 *   test  Device lists: "all" opens both, a name not there, one listed
 *         twice or an empty one is refused with its reason. Two regions on
 *         each side, one homed on each NIC (equally near:
 *         the one with fewer regions). WRITE A's to B's and READ them back,
 *         every byte checked; A's per-NIC counters show each region's
 *         bytes went through its own NIC. Then a stream of writes from the
 *         region on NIC 1 while `KVB_NICS_DOWN` (a shell command: "ip link
 *         set dummy1 down") takes NIC 1's port down mid-run: the port-down
 *         event comes, new chains go through NIC 0 (its `moved` counter),
 *         every op completes (ok or an error) within 60 s, NIC 1's failed
 *         QP is parked (its `qp_parked`) with no re-handshake, and the
 *         writes that completed ok hold the right bytes. Timings printed.
 *   bench DEVS MIB
 *         MIB MiB of large writes (16 MiB chains of 1 MiB ops that do not
 *         merge, 4 chains in flight) from A to B over the devices DEVS,
 *         MiB/s printed: compare "rxe0" with "rxe0,rxe1".
 *   small DEVS N
 *         N small writes (512 B, 4 KiB apart so none merge, chains of
 *         16, 64 in flight) from each of A's two regions in turn, then
 *         from both at once; writes/s and each NIC's WRs and doorbells
 *         printed: with "rxe0,rxe1" each region is homed on its own NIC.
 *
 * Exit: 0 pass, 1 fail, 77 no such devices.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bridge/rdma/conn.h"
#include "bridge/rdma/rdma.h"
#include "kvbroker/kvbroker.h"

#define BLK	(64u << 10)
#define NBLK	64u /* 4 MiB regions */
#define REGION	region_len
#define CHAIN	16u /* 1 MiB chains: below the cross-NIC spread */
#define NCK	(1u << 16)
#define PENDING 0x7fffffff

#define CHECK(cond, ...)                                              \
	do {                                                          \
		if (!(cond)) {                                        \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, \
				__LINE__, #cond);                     \
			fprintf(stderr, __VA_ARGS__);                 \
			fprintf(stderr, "\n");                        \
			return -1;                                    \
		}                                                     \
	} while (0)

static const struct kvb_transport_ops *ops = &kvb_rdma_ops;

struct side {
	struct kvb_transport *t;
	struct kvb_ep *ep;
	uint8_t *buf[2];
	struct kvb_mr mr[2];
	uint32_t rkeys[2][KVB_NIC_MAX];
	unsigned home[2];
	int nrk[2];
};

static struct side A, B;
static uint64_t region_len = BLK * NBLK;
static int qp_per_peer = 1;
static int32_t st[NCK];
static uint64_t next_ck;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint8_t pat(uint32_t seed, uint64_t off)
{
	uint64_t x = (off + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t) seed << 40;

	return (uint8_t) (x >> 56 ^ x >> 17 ^ off);
}

static void fill(uint8_t *p, uint32_t seed, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = pat(seed, i);
}

/* The first byte of p[from, from + n) off the pattern, or -1 */
static int64_t verify(const uint8_t *p, uint32_t seed, uint64_t from,
		      uint64_t n)
{
	for (uint64_t i = from; i < from + n; i++)
		if (p[i] != pat(seed, i))
			return (int64_t) i;
	return -1;
}

static void log_line(void *arg, int level, const char *line)
{
	fprintf(stderr, "  [%s %s] %s\n", (const char *) arg,
		level == KVB_TLOG_ERR	 ? "err"
		: level == KVB_TLOG_WARN ? "warn"
					 : "info",
		line);
}

static int open_side(struct side *s, const char *devs, const char *name,
		     int regions)
{
	struct kvb_transport_params p = {
		.dev_name = devs,
		.ib_port = 1,
		.gid_index = -1,
		.post_batch_size = -1,
		.qp_per_peer = qp_per_peer,
		.sq_depth = 64,
	};
	char why[160] = "";
	int err = ops->open(&p, &s->t, why, sizeof(why));

	if (err) {
		fprintf(stderr, "SKIP: %s: %s (%s)\n", devs, why,
			strerror(-err));
		return 77;
	}
	kvb_rdma_set_log(s->t, log_line, (void *) name);
	for (int i = 0; i < regions; i++) {
		s->buf[i] = aligned_alloc(4096, REGION);
		CHECK(s->buf[i], "alloc");
		memset(s->buf[i], 0, REGION);
		s->mr[i] = (struct kvb_mr){.id = (uint32_t) i + 1,
					   .flags = KVB_MEM_REMOTE_WRITE |
						    KVB_MEM_REMOTE_READ,
					   .addr = s->buf[i],
					   .len = REGION};
		CHECK(ops->reg_mr(s->t, &s->mr[i]) == 0, "reg_mr");
		s->nrk[i] = ops->mr_keys(s->t, &s->mr[i], s->rkeys[i],
					 KVB_NIC_MAX, &s->home[i]);
		CHECK(s->nrk[i] >= 1, "mr_keys %d", s->nrk[i]);
	}
	return 0;
}

static void close_side(struct side *s, int regions)
{
	for (int i = 0; i < regions; i++) {
		ops->dereg_mr(s->t, &s->mr[i]);
		free(s->buf[i]);
	}
	ops->close(s->t);
}

/* A offers (first: to B's local_info), B answers: as the broker does */
static int handshake(int first)
{
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_ep *e2;
	size_t len = sizeof(blob);
	int err;

	if (first) {
		CHECK(ops->local_info(B.t, blob, &len) == 0, "local_info");
		err = ops->connect(A.t, blob, len, &A.ep);
		CHECK(err == 0, "connect(B's info): %d", err);
		len = sizeof(blob);
	}
	CHECK(kvb_rdma_ep_info(A.t, A.ep, blob, &len) == 0, "ep_info A");
	err = ops->connect(B.t, blob, len, &B.ep);
	CHECK(err == 0, "B connect(offer): %d", err);
	len = sizeof(blob);
	CHECK(kvb_rdma_ep_info(B.t, B.ep, blob, &len) == 0, "ep_info B");
	err = ops->connect(A.t, blob, len, &e2);
	CHECK(err == 0 && e2 == A.ep, "A connect(answer): %d", err);
	return 0;
}

/* Device events of both sides (what the broker does on events_fd) */
static void events(void)
{
	ops->events(A.t, log_line, "A");
	ops->events(B.t, log_line, "B");
}

/* poll A once: statuses into st[]; returns completions or -1 */
static int reap_once(void)
{
	struct kvb_xcqe cq[64];
	int n = ops->poll(A.t, cq, 64);

	CHECK(n >= 0, "poll %d", n);
	for (int i = 0; i < n; i++) {
		CHECK(st[cq[i].cookie % NCK] == PENDING, "cookie %llu twice",
		      (unsigned long long) cq[i].cookie);
		st[cq[i].cookie % NCK] = cq[i].status;
	}
	return n;
}

/* op over block b of A's region la and B's region rb */
static struct kvb_xop xop(uint32_t code, int la, int rb, unsigned b)
{
	struct kvb_xop o = {.opcode = code,
			    .local = &A.mr[la],
			    .local_off = (uint64_t) b * BLK,
			    .remote = {.addr = (uintptr_t) B.buf[rb],
				       .rkey = B.mr[rb].rkey,
				       .rkeys = B.rkeys[rb],
				       .nrkeys = (uint8_t) B.nrk[rb],
				       .nic = (uint8_t) B.home[rb]},
			    .remote_off = (uint64_t) b * BLK,
			    .len = BLK,
			    .cookie = next_ck++};

	st[o.cookie % NCK] = PENDING;
	return o;
}

/* One post() of up to n ops (a chain); a reset endpoint re-handshakes
 * first; -ENETDOWN (no NIC up) fails the chain's ops at once. Returns the
 * ops taken or -1. */
static int post_chain(struct kvb_xop *o, unsigned n, unsigned *handshakes)
{
	int k = ops->post(A.t, A.ep, o, n);

	if (k == -ENOTCONN) {
		CHECK(handshake(0) == 0, "re-handshake");
		(*handshakes)++;
		return 0;
	}
	if (k == -ENETDOWN) {
		for (unsigned i = 0; i < n; i++)
			st[o[i].cookie % NCK] = k;
		return (int) n;
	}
	CHECK(k >= 0, "post: %d", k);
	return k;
}

/* Post o[0..n) in chains of CHAIN and wait until each completed, limit
 * seconds at most. Returns the ops that failed, or -1. */
static int run(struct kvb_xop *o, unsigned n, double limit)
{
	double end = now() + limit;
	unsigned done = 0, hs = 0, bad = 0, i;

	while (done < n) {
		int k = post_chain(o + done,
				   n - done < CHAIN ? n - done : CHAIN, &hs);

		CHECK(k >= 0, "post");
		done += (unsigned) k;
		CHECK(reap_once() >= 0, "poll");
		events();
		CHECK(now() < end, "timeout posting: %u of %u", done, n);
	}
	for (i = 0; i < n; i++)
		while (st[o[i].cookie % NCK] == PENDING) {
			CHECK(reap_once() >= 0, "poll");
			events();
			CHECK(now() < end, "timeout: op %u not completed", i);
		}
	for (i = 0; i < n; i++)
		bad += st[o[i].cookie % NCK] != 0;
	return (int) bad;
}

static void nics_get(struct kvb_transport_nic *n)
{
	memset(n, 0, sizeof(*n) * KVB_NIC_MAX);
	ops->nics(A.t, n, KVB_NIC_MAX);
}

static void nics_print(const char *when)
{
	struct kvb_transport_nic n[KVB_NIC_MAX];
	int k = ops->nics(A.t, n, KVB_NIC_MAX);

	for (int i = 0; i < k; i++)
		printf("%s: A %s port %s: %llu bytes, %llu WRs, %llu "
		       "doorbells, %llu regions, %u QPs, %llu moved\n",
		       when, n[i].name, n[i].port_up ? "up" : "down",
		       (unsigned long long) n[i].bytes,
		       (unsigned long long) n[i].wrs,
		       (unsigned long long) n[i].doorbells,
		       (unsigned long long) n[i].regions, n[i].qps,
		       (unsigned long long) n[i].moved);
}

/* WRITE (or READ) both regions, region i to B's i; each region's bytes
 * on its home NIC only; every byte checked. */
static int case_rails(uint32_t code, uint32_t seed)
{
	struct kvb_transport_nic n0[KVB_NIC_MAX], n1[KVB_NIC_MAX];
	static struct kvb_xop o[2 * NBLK];
	double mib = 2.0 * (double) REGION / (1 << 20);
	uint64_t want[KVB_NIC_MAX] = {0};
	struct side *src = code == KVB_XOP_WRITE ? &A : &B;
	struct side *dst = code == KVB_XOP_WRITE ? &B : &A;
	double t0;
	int bad, i;

	for (i = 0; i < 2; i++) {
		fill(src->buf[i], seed + (uint32_t) i, REGION);
		memset(dst->buf[i], 0, REGION);
		want[A.home[i]] += REGION;
		for (unsigned b = 0; b < NBLK; b++)
			o[i * NBLK + b] = xop(code, i, i, b);
	}
	nics_get(n0);
	t0 = now();
	bad = run(o, 2 * NBLK, 60);
	CHECK(bad == 0, "%d ops failed", bad);
	t0 = now() - t0;
	printf("%s: 2 regions, %.0f MiB in %.3f s (%.1f MiB/s)\n",
	       code == KVB_XOP_WRITE ? "write" : "read", mib, t0, mib / t0);
	for (i = 0; i < 2; i++) {
		int64_t at =
			verify(dst->buf[i], seed + (uint32_t) i, 0, REGION);

		CHECK(at < 0, "region %d: byte %lld differs", i,
		      (long long) at);
	}
	nics_get(n1);
	for (i = 0; i < KVB_NIC_MAX; i++)
		CHECK(n1[i].bytes - n0[i].bytes == want[i],
		      "NIC %d carried %llu bytes, want %llu (its regions')", i,
		      (unsigned long long) (n1[i].bytes - n0[i].bytes),
		      (unsigned long long) want[i]);
	return 0;
}

struct fo_times {
	double down, event, moved;
};

/* Post the stream o[0..n) while `cmd` takes NIC 1's port down after a
 * quarter of it; every op completes (ok or not) by `end`. */
static int fo_stream(struct kvb_xop *o, unsigned n, const char *cmd,
		     unsigned nic, unsigned other, double end,
		     struct fo_times *tm, unsigned *hs)
{
	struct kvb_transport_nic nn[KVB_NIC_MAX];
	uint64_t moved0;
	unsigned done = 0, i;
	int k;

	nics_get(nn);
	moved0 = nn[other].moved;
	while (done < n) {
		k = post_chain(o + done, n - done < CHAIN ? n - done : CHAIN,
			       hs);
		CHECK(k >= 0, "post");
		done += (unsigned) k;
		CHECK(reap_once() >= 0, "poll");
		events();
		if (!tm->down && done >= n / 4) {
			tm->down = now();
			printf("failover: %u of %u ops posted: %s\n", done, n,
			       cmd);
			CHECK(system(cmd) == 0, "%s failed", cmd);
		}
		nics_get(nn);
		if (tm->down && !tm->event && !nn[nic].port_up)
			tm->event = now();
		if (tm->event && !tm->moved && nn[other].moved > moved0)
			tm->moved = now();
		CHECK(now() < end, "timeout posting: %u of %u", done, n);
	}
	for (i = 0; i < n; i++)
		while (st[o[i].cookie % NCK] == PENDING) {
			CHECK(reap_once() >= 0, "poll");
			events();
			CHECK(now() < end, "timeout: op %u of %u not completed",
			      i, n);
		}
	return 0;
}

/* Writes from A's region homed on NIC 1 while its port goes down */
static int case_failover(const char *cmd)
{
	enum { N = 1024 }; /* 64 MiB in 64 KiB writes */
	static struct kvb_xop o[N];
	static uint8_t ok[NBLK];
	struct fo_times tm = {0};
	unsigned nic = A.home[1], other = A.home[0], hs = 0, bad = 0, i;
	unsigned checked = 0;
	struct kvb_transport_nic nn[KVB_NIC_MAX];
	uint64_t parked0;
	double t0 = now();

	nics_get(nn);
	parked0 = nn[nic].qp_parked;
	fill(A.buf[1], 7, REGION);
	memset(ok, 0, sizeof(ok));
	for (i = 0; i < N; i++)
		o[i] = xop(KVB_XOP_WRITE, 1, 1, i % NBLK);
	if (fo_stream(o, N, cmd, nic, other, t0 + 60, &tm, &hs))
		return -1;
	for (i = 0; i < N; i++) {
		bad += st[o[i].cookie % NCK] != 0;
		if (!st[o[i].cookie % NCK])
			ok[i % NBLK] = 1;
	}
	printf("failover: %u ops in %.3f s: %u ok, %u failed, %u "
	       "re-handshakes; port-down event %.3f s after the command, "
	       "first chain moved %.3f s after it\n",
	       N, now() - t0, N - bad, bad, hs,
	       tm.event ? tm.event - tm.down : -1.0,
	       tm.moved ? tm.moved - tm.down : -1.0);
	CHECK(tm.event, "no port-down event for NIC %u", nic);
	CHECK(tm.moved, "no chain moved to NIC %u", other);
	nics_get(nn);
	CHECK(nn[nic].qp_parked == parked0 + 1,
	      "NIC %u: %llu QPs parked, want 1", nic,
	      (unsigned long long) (nn[nic].qp_parked - parked0));
	CHECK(hs == 0, "%u re-handshakes: the failed QP was not parked alone",
	      hs);
	for (i = 0; i < NBLK; i++) {
		int64_t at;

		if (!ok[i])
			continue;
		at = verify(B.buf[1], 7, (uint64_t) i * BLK, BLK);
		CHECK(at < 0, "block %u byte %lld differs", i, (long long) at);
		checked++;
	}
	printf("failover: %u blocks written ok, every byte checked\n", checked);
	CHECK(checked > 0, "no write landed");
	return 0;
}

/* Device lists: "all" opens both, a name not there or listed twice is
 * refused with a reason */
static int case_lists(void)
{
	static const struct {
		const char *devs;
		int err;
		const char *why;
	} c[] = {
		{"rxe0,nosuch", -ENODEV, "no RDMA device named nosuch"},
		{"rxe0,rxe0", -EINVAL, "listed twice: rxe0"},
		{"rxe0,", -EINVAL, "no RDMA device named "},
	};
	struct kvb_transport_params p = {.ib_port = 1, .gid_index = -1};
	struct kvb_transport_nic n[KVB_NIC_MAX];
	struct kvb_transport *t;
	char why[160];
	int err;

	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		p.dev_name = c[i].devs;
		why[0] = '\0';
		err = ops->open(&p, &t, why, sizeof(why));
		CHECK(err == c[i].err && strstr(why, c[i].why),
		      "open(%s): %d (%s)", c[i].devs, err, why);
		printf("open(\"%s\"): %s\n", c[i].devs, why);
	}
	p.dev_name = "all";
	CHECK(ops->open(&p, &t, why, sizeof(why)) == 0, "open(all): %s", why);
	err = ops->nics(t, n, KVB_NIC_MAX);
	ops->close(t);
	CHECK(err >= 2, "open(all): %d NICs", err);
	printf("open(\"all\"): %d NICs\n", err);
	return 0;
}

static int test(void)
{
	const char *devs = getenv("KVB_RDMA_DEVS");
	const char *down = getenv("KVB_NICS_DOWN");
	struct kvb_transport_nic n[KVB_NIC_MAX];
	char why[256];
	int rc;

	devs = devs ? devs : "rxe0,rxe1";
	rc = open_side(&A, devs, "A", 2);
	if (!rc)
		rc = open_side(&B, devs, "B", 2);
	if (rc)
		return rc;
	CHECK(ops->nics(A.t, n, KVB_NIC_MAX) >= 2, "one NIC only");
	for (int i = 0; i < 2; i++) {
		CHECK(ops->mr_nic(A.t, &A.mr[i], why, sizeof(why)) ==
			      (int) A.home[i],
		      "mr_nic");
		printf("A region %d: NIC %u, %s\n", i, A.home[i], why);
	}
	CHECK(A.home[0] != A.home[1] && B.home[0] != B.home[1],
	      "regions not spread over the NICs (A %u %u, B %u %u)", A.home[0],
	      A.home[1], B.home[0], B.home[1]);
	CHECK(case_lists() == 0, "device lists");
	CHECK(handshake(1) == 0, "handshake");
	CHECK(case_rails(KVB_XOP_WRITE, 1) == 0, "write");
	CHECK(case_rails(KVB_XOP_READ, 3) == 0, "read");
	nics_print("rails");
	if (down)
		CHECK(case_failover(down) == 0, "failover");
	else
		printf("failover: skipped (no KVB_NICS_DOWN)\n");
	nics_print("end");
	close_side(&A, 2);
	close_side(&B, 2);
	printf("PASS\n");
	return 0;
}

/* MIB MiB of 1 MiB writes in 16 MiB chains, 4 chains in flight */
static int bench(const char *devs, unsigned mib)
{
	enum { OPS = 16, DEPTH = 4 * OPS };
	static struct kvb_xop o[NCK];
	unsigned n = mib, done = 0, i, hs = 0;
	double t0, dt;
	int rc;

	region_len = 64u << 20;
	CHECK(n && n < NCK, "MIB out of range");
	rc = open_side(&A, devs, "A", 1);
	if (!rc)
		rc = open_side(&B, devs, "B", 1);
	if (rc)
		return rc;
	CHECK(handshake(1) == 0, "handshake");
	fill(A.buf[0], 5, REGION);
	for (i = 0; i < n; i++) {
		o[i] = xop(KVB_XOP_WRITE, 0, 0, 0);
		o[i].len = 1u << 20;
		/* 1 MiB apart: no two merge into one WR */
		o[i].local_off = o[i].remote_off = (uint64_t) (i % 32) << 21;
	}
	t0 = now();
	while (done < n) {
		unsigned flying = 0, want = n - done < OPS ? n - done : OPS;
		int k;

		for (i = 0; i < done; i++)
			flying += st[o[i].cookie % NCK] == PENDING;
		k = flying + want <= DEPTH ? post_chain(o + done, want, &hs)
					   : 0;
		CHECK(k >= 0 && !hs, "post");
		done += (unsigned) k;
		CHECK(reap_once() >= 0, "poll");
		CHECK(now() - t0 < 300, "timeout");
	}
	for (i = 0; i < n; i++)
		while (st[o[i].cookie % NCK] == PENDING)
			CHECK(reap_once() >= 0 && now() - t0 < 300, "wait");
	dt = now() - t0;
	for (i = 0; i < n; i++)
		CHECK(st[o[i].cookie % NCK] == 0, "op %u: %d", i,
		      st[o[i].cookie % NCK]);
	for (i = 0; i < 32 && i < n; i++)
		CHECK(verify(B.buf[0], 5, (uint64_t) i << 21, 1u << 20) < 0,
		      "bytes differ");
	printf("bench %s qp_per_peer %d: %u MiB in %.3f s = %.1f MiB/s\n", devs,
	       qp_per_peer, n, dt, n / dt);
	nics_print("bench");
	close_side(&A, 1);
	close_side(&B, 1);
	return 0;
}

/* n small writes from the regions in mask (bit r: A's region r to B's),
 * chains of SMALL_CHAIN taken in turn from each; 64 in flight at most */
enum { SMALL = 512, SMALL_GAP = 4096, SMALL_CHAIN = 16, SMALL_DEPTH = 64 };

static int small_run(unsigned n, unsigned mask)
{
	static const char *const which[4] = {"", "region 0", "region 1",
					     "regions 0+1"};
	static struct kvb_xop o[NCK];
	struct kvb_transport_nic n0[KVB_NIC_MAX], n1[KVB_NIC_MAX];
	unsigned slots = (unsigned) (REGION / SMALL_GAP), done = 0, i, hs = 0;
	unsigned got = 0;
	double t0, dt;

	CHECK(n && n < NCK && mask && mask <= 3, "N out of range");
	for (i = 0; i < n; i++) {
		/* both regions: chains alternate between them */
		unsigned c = i / SMALL_CHAIN, r = mask == 3 ? c % 2 : mask >> 1;

		o[i] = xop(KVB_XOP_WRITE, (int) r, (int) r, 0);
		o[i].len = SMALL;
		o[i].local_off = o[i].remote_off =
			(uint64_t) (i % slots) * SMALL_GAP;
	}
	nics_get(n0);
	t0 = now();
	while (done < n) {
		unsigned want = n - done < SMALL_CHAIN ? n - done : SMALL_CHAIN;
		int k = done - got + want <= SMALL_DEPTH
				? post_chain(o + done, want, &hs)
				: 0;
		int c;

		CHECK(k >= 0 && !hs, "post");
		done += (unsigned) k;
		c = reap_once();
		CHECK(c >= 0, "poll");
		got += (unsigned) c;
		CHECK(now() - t0 < 300, "timeout");
	}
	while (got < n) {
		int c = reap_once();

		CHECK(c >= 0 && now() - t0 < 300, "wait");
		got += (unsigned) c;
	}
	dt = now() - t0;
	for (i = 0; i < n; i++)
		CHECK(st[o[i].cookie % NCK] == 0, "op %u: %d", i,
		      st[o[i].cookie % NCK]);
	for (int r = 0; r < 2; r++)
		for (i = 0; (mask >> r & 1) && i < slots && i < n; i++)
			CHECK(verify(B.buf[r], 7 + (uint32_t) r,
				     (uint64_t) i * SMALL_GAP, SMALL) < 0,
			      "region %d: bytes differ", r);
	nics_get(n1);
	printf("small: %s, %u writes of %u B in %.3f s = %.0f writes/s\n",
	       which[mask], n, SMALL, dt, n / dt);
	for (i = 0; i < KVB_NIC_MAX && n1[i].name[0]; i++)
		printf("small:   NIC %s: %llu WRs, %llu doorbells\n",
		       n1[i].name, (unsigned long long) (n1[i].wrs - n0[i].wrs),
		       (unsigned long long) (n1[i].doorbells -
					     n0[i].doorbells));
	return 0;
}

/* small writes per region (per home NIC), then over both regions */
static int small(const char *devs, unsigned n)
{
	struct kvb_transport_nic nn[KVB_NIC_MAX];
	int rc = open_side(&A, devs, "A", 2);

	if (!rc)
		rc = open_side(&B, devs, "B", 2);
	if (rc)
		return rc;
	CHECK(handshake(1) == 0, "handshake");
	nics_get(nn);
	for (int r = 0; r < 2; r++) {
		fill(A.buf[r], 7 + (uint32_t) r, REGION);
		printf("small %s: region %d homed on %s (B's on its NIC %u)\n",
		       devs, r, nn[A.home[r]].name, B.home[r]);
	}
	CHECK(small_run(n, 1) == 0, "region 0");
	CHECK(small_run(n, 2) == 0, "region 1");
	CHECK(small_run(n, 3) == 0, "regions 0+1");
	close_side(&A, 2);
	close_side(&B, 2);
	return 0;
}

int main(int argc, char **argv)
{
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4 && !strcmp(argv[1], "bench")) {
		if (argc >= 5)
			qp_per_peer = atoi(argv[4]);
		rc = bench(argv[2], (unsigned) atoi(argv[3]));
	} else if (argc >= 4 && !strcmp(argv[1], "small")) {
		rc = small(argv[2], (unsigned) atoi(argv[3]));
	} else {
		rc = test();
	}
	return rc == 77 ? 77 : rc ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * One remote_blocks per node per transfer: however the D workers of one
 * node open the same cross-node WRITE transfer (together, one after the
 * other, before or after the handshake between the brokers, while others
 * come and go), P's broker hears the transfer's remote_blocks once at each
 * of its P ranks: not twice, not never.
 *
 * Two brokers on loopback: A (P's node: PTP P workers of DP rank 0, which
 * open nothing, so that every announcement stays at A as a transfer not
 * opened yet) and B (D's node: D workers, TP ranks of DP rank 0).
 *
 * - concurrent: KD D workers, one process each, open each id at once.
 *   B is restarted ROUNDS times, so that in the first opens of each of its
 *   lives the handshake with A is not done yet (the first open starts it,
 *   the others join it or find it done); in every other round a P worker
 *   of A handshakes with B at the same moment, so that B also learns A's
 *   descriptor from A's side while its own handshake runs. Some workers
 *   open a few microseconds late, in an order that changes with the
 *   iteration. Checked round by round: remote_blocks_received at A is PTP
 *   per transfer (also 300 ms after the last), A holds exactly PTP
 *   transfers per id not opened yet (no id unannounced), B sent as many.
 * - rank_gone: D0 opens (announces), D1 opens (joins), D0 detaches, D2
 *   opens: D1's transfers still say the node announced them.
 * - late_rank: D0 opens (announces) and its transfers end; B then ends
 *   4,160 same-node transfers of another worker (more than its list of
 *   4,096 ended ids) before D1 opens the same ids.
 * - failed_first: D0's open fails (A has no P worker of that DP rank
 *   yet: -EHOSTUNREACH), A's P workers attach, D1 opens: announced now
 *   (before, D0's ended transfer passed for the node's announcement and
 *   nothing went).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define KD	  4u  /* D workers on B */
#define PTP	  2u  /* P workers on A */
#define ROUNDS	  20u /* lives of B */
#define PER_ROUND 10u /* transfers in each */
#define NX	  16u /* transfers of the other cases */

static struct broker_pair pp;
static struct broker bb; /* B, one life a round (pp.b is stopped) */
static int bb_up;

struct cmd {
	uint32_t op; /* 1 = open, 2 = abort what it opened, 0 = quit */
	uint32_t round, iter, delay_us;
};

struct kid {
	pid_t pid;
	int cmd, res; /* parent's ends */
};

static struct kid kids[KD];

static int teardown(void **state)
{
	(void) state;
	for (unsigned k = 0; k < KD; k++)
		if (kids[k].pid > 0) {
			kill(kids[k].pid, SIGKILL);
			waitpid(kids[k].pid, NULL, 0);
			kids[k].pid = 0;
		}
	if (bb_up) {
		broker_kill(&bb);
		broker_cleanup(&bb);
		bb_up = 0;
	}
	broker_pair_kill(&pp);
	return 0;
}

/* A D worker: attach to B, then open what the parent says, one id a time,
 * answering each open's status (its first word: the attach's); abort them
 * all when told (the releases free A's transfers). */
static void d_worker(const char *sock, uint32_t rank, uint16_t a_port, int cmd,
		     int res)
{
	struct kvb_attach_opts o = {.socket_path = sock,
				    .role = KVB_ROLE_D,
				    .tp_rank = rank,
				    .tp_size = KD};
	uint32_t blocks[2] = {2 * rank, 2 * rank + 1};
	uint32_t hs[PER_ROUND], nh = 0;
	struct kvb_ctx *c = NULL;
	struct cmd m;
	int32_t rc = kvb_attach(&o, &c);

	if (write(res, &rc, sizeof(rc)) != sizeof(rc) || rc)
		_exit(1);
	while (read(cmd, &m, sizeof(m)) == sizeof(m) && m.op) {
		if (m.op == 2) {
			rc = 0;
			for (uint32_t i = 0; i < nh && !rc; i++)
				rc = kvb_transfer_abort(c, hs[i], i);
			if (write(res, &rc, sizeof(rc)) != sizeof(rc))
				_exit(2);
			continue;
		}
		char id[64];
		struct kvb_remote_open e = {.transfer_id = id,
					    .host = "127.0.0.1",
					    .port = a_port,
					    .mode = KVB_XFER_WRITE,
					    .remote_dp_rank = 0,
					    .blocks = blocks,
					    .nblocks = 2};
		uint32_t h = 0;
		int32_t st = 0;

		snprintf(id, sizeof(id), "once-r%u-t%u", m.round, m.iter);
		if (m.delay_us)
			usleep(m.delay_us);
		rc = kvb_transfer_open_remote_batch(c, &e, 1, &h, &st);
		if (!rc)
			rc = st;
		if (!rc && nh < PER_ROUND)
			hs[nh++] = h;
		if (write(res, &rc, sizeof(rc)) != sizeof(rc))
			_exit(2);
	}
	kvb_detach(c);
	_exit(0);
}

static void kids_start(const struct broker *b)
{
	for (unsigned k = 0; k < KD; k++) {
		int c[2], r[2];
		int32_t rc = -1;

		assert_int_equal(pipe(c), 0);
		assert_int_equal(pipe(r), 0);
		kids[k].pid = fork();
		assert_true(kids[k].pid >= 0);
		if (kids[k].pid == 0) {
			close(c[1]);
			close(r[0]);
			d_worker(b->sock, k, pp.hs_a, c[0], r[1]);
		}
		close(c[0]);
		close(r[1]);
		kids[k].cmd = c[1];
		kids[k].res = r[0];
		assert_int_equal(read(kids[k].res, &rc, sizeof(rc)),
				 sizeof(rc));
		assert_int_equal(rc, 0);
	}
}

/* Every D worker aborts its transfers: each sends its release to A's P
 * ranks (B counts them) */
static void kids_abort(const struct broker *b, int64_t releases)
{
	struct cmd m = {.op = 2};

	for (unsigned k = 0; k < KD; k++) {
		int32_t rc = -1;

		assert_int_equal(write(kids[k].cmd, &m, sizeof(m)), sizeof(m));
		assert_int_equal(read(kids[k].res, &rc, sizeof(rc)),
				 sizeof(rc));
		assert_int_equal(rc, 0);
	}
	assert_int_equal(broker_wait_stat(b, "releases_sent", releases, 10000),
			 0);
}

static void kids_stop(void)
{
	struct cmd q = {0};

	for (unsigned k = 0; k < KD; k++) {
		int st = -1;

		assert_int_equal(write(kids[k].cmd, &q, sizeof(q)), sizeof(q));
		assert_int_equal(waitpid(kids[k].pid, &st, 0), kids[k].pid);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		kids[k].pid = 0;
		close(kids[k].cmd);
		close(kids[k].res);
	}
}

/* B's life `round`: on the pair's handshake port (the pair's own B was
 * stopped), with fresh notify ports (an old worker's ROUTER may still be
 * closing). */
static struct broker *b_start(unsigned round)
{
	static char nb[8];
	const char *args[] = {"--host-ip",
			      "127.0.0.1",
			      "--handshake-port",
			      pp.hb,
			      "--notify-port",
			      nb,
			      "--trusted-hosts",
			      "127.0.0.1",
			      NULL};
	struct broker_opts o = {.args = args};

	snprintf(nb, sizeof(nb), "%u", pp.hs_b + 1 + 4 * (round % 16));
	memset(&bb, 0, sizeof(bb));
	assert_int_equal(broker_start(&bb, &o), 0);
	bb_up = 1;
	return &bb;
}

static void b_stop(void)
{
	assert_int_equal(broker_stop(&bb), 0);
	broker_cleanup(&bb);
	bb_up = 0;
}

static void test_concurrent(void **state)
{
	struct kvb_ctx *p[PTP];
	int64_t got = 0, held, want = 0, sent_b = 0, joined = 0, t0 = now_ns();
	unsigned waited_opens = 0;

	(void) state;
	assert_int_equal(broker_pair_start(&pp, NULL), 0);
	assert_int_equal(broker_stop(&pp.b), 0);
	broker_cleanup(&pp.b);
	for (unsigned r = 0; r < PTP; r++) {
		p[r] = w_attach(&pp.a, KVB_ROLE_P, r, PTP, 0);
		assert_non_null(p[r]);
	}
	for (unsigned round = 0; round < ROUNDS; round++) {
		struct broker *b = b_start(round);

		kids_start(b);
		for (unsigned it = 0; it < PER_ROUND; it++) {
			for (unsigned k = 0; k < KD; k++) {
				/* who goes late changes with the iteration */
				struct cmd m = {.op = 1,
						.round = round,
						.iter = it,
						.delay_us = ((k + it) % KD) *
							    (it % 3) * 40};

				assert_int_equal(
					write(kids[k].cmd, &m, sizeof(m)),
					sizeof(m));
			}
			if (!it && round % 2) {
				uint32_t peer = 0;

				/* A's side of the handshake, meanwhile */
				assert_int_equal(
					kvb_peer_connect(p[1], "127.0.0.1",
							 pp.hs_b, &peer),
					0);
			}
			for (unsigned k = 0; k < KD; k++) {
				int32_t rc = -1;

				assert_int_equal(
					read(kids[k].res, &rc, sizeof(rc)),
					sizeof(rc));
				if (rc)
					fail_msg("round %u, transfer %u, D "
						 "worker %u: open %d",
						 round, it, k, rc);
			}
		}
		want += (int64_t) PER_ROUND * PTP;
		broker_wait_stat(&pp.a, "remote_blocks_received", want, 5000);
		usleep(300000); /* a second announcement would be here now */
		got = broker_stat(&pp.a, "remote_blocks_received");
		held = broker_stat(&pp.a, "unopened_held");
		sent_b += broker_stat(b, "remote_blocks_sent");
		joined += broker_stat(b, "announcements_joined");
		waited_opens += (unsigned) broker_stat(b, "opens_waiting");
		if (got != want || held != (int64_t) PER_ROUND * PTP) {
			broker_log_dump(b);
			fail_msg(
				"round %u: A received %lld remote_blocks (want "
				"%lld: %u transfers x %u P ranks), holds %lld "
				"announced transfers (want %u)",
				round, (long long) got, (long long) want,
				PER_ROUND * (round + 1), PTP, (long long) held,
				PER_ROUND * PTP);
		}
		/* the D workers abort: their releases end A's transfers */
		kids_abort(b, (int64_t) PER_ROUND * KD * PTP);
		kids_stop();
		assert_int_equal(
			broker_wait_stat(&pp.a, "unopened_held", 0, 10000), 0);
		b_stop();
	}
	fprintf(stderr,
		"%u transfers opened by %u D workers of one node each (%u "
		"opens waited for the handshake): A received %lld "
		"remote_blocks for %u P ranks, B sent %lld, in %.1f s\n",
		ROUNDS * PER_ROUND, KD, waited_opens, (long long) got, PTP,
		(long long) sent_b, ms_since(t0) / 1000);
	assert_int_equal(sent_b, want);
	/* every other open found it sent (counted) */
	assert_int_equal(joined, ROUNDS * PER_ROUND * (KD - 1));
	assert_true(waited_opens > 0);
	for (unsigned r = 0; r < PTP; r++)
		kvb_detach(p[r]);
	assert_int_equal(broker_stop(&pp.a), 0);
	broker_cleanup(&pp.a);
}

/* ------------------------------------------------------------------ */
/* one node's D workers one after the other */

/* A D worker of B, TP rank tp of 3 (DP rank 0). */
static struct kvb_ctx *d_attach(uint32_t tp)
{
	struct kvb_ctx *c = w_attach(&pp.b, KVB_ROLE_D, tp, 3, 4096);

	assert_non_null(c);
	return c;
}

/* c opens "<pfx>-<i>" for i < NX by A's address, in one batch (handles
 * into h); returns how many opened (status 0); st: each one's status. */
static unsigned d_open(struct kvb_ctx *c, const char *pfx, uint32_t *h,
		       int32_t *st)
{
	static char ids[NX][32];
	static const uint32_t blocks[2] = {3, 4};
	struct kvb_remote_open e[NX];
	unsigned ok = 0;

	for (unsigned i = 0; i < NX; i++) {
		snprintf(ids[i], sizeof(ids[i]), "%s-%u", pfx, i);
		e[i] = (struct kvb_remote_open){.transfer_id = ids[i],
						.host = "127.0.0.1",
						.port = pp.hs_a,
						.mode = KVB_XFER_WRITE,
						.blocks = blocks,
						.nblocks = 2};
	}
	assert_int_equal(kvb_transfer_open_remote_batch(c, e, NX, h, st), 0);
	for (unsigned i = 0; i < NX; i++)
		ok += st[i] == 0;
	return ok;
}

/* What A heard, 300 ms after it heard `want` (a late one would be in). */
static int64_t heard(int64_t want)
{
	broker_wait_stat(&pp.a, "remote_blocks_received", want, 5000);
	usleep(300000);
	return broker_stat(&pp.a, "remote_blocks_received");
}

static void p_attach(struct kvb_ctx **p)
{
	for (unsigned r = 0; r < PTP; r++) {
		p[r] = w_attach(&pp.a, KVB_ROLE_P, r, PTP, 0);
		assert_non_null(p[r]);
	}
}

static void pair_end(struct kvb_ctx **p, struct kvb_ctx **d, unsigned nd)
{
	for (unsigned i = 0; i < nd; i++)
		if (d[i])
			kvb_detach(d[i]);
	for (unsigned r = 0; r < PTP; r++)
		kvb_detach(p[r]);
	assert_int_equal(broker_pair_stop(&pp), 0);
}

static void test_rank_gone(void **state)
{
	struct kvb_ctx *p[PTP], *d[3];
	uint32_t h[NX];
	int32_t st[NX];
	int64_t got;

	(void) state;
	assert_int_equal(broker_pair_start(&pp, NULL), 0);
	p_attach(p);
	for (unsigned i = 0; i < 3; i++)
		d[i] = d_attach(i);
	assert_int_equal(d_open(d[0], "gone", h, st), NX);
	assert_int_equal(heard(NX * PTP), NX * PTP);
	assert_int_equal(d_open(d[1], "gone", h, st), NX);
	kvb_detach(d[0]);
	d[0] = NULL;
	assert_int_equal(broker_wait_stat(&pp.b, "workers", 2, 5000), 0);
	assert_int_equal(d_open(d[2], "gone", h, st), NX);
	got = heard(NX * PTP);
	fprintf(stderr,
		"rank_gone: %u transfers, opened by D0, D1, then D2 after D0 "
		"left: A received %lld remote_blocks (want %u)\n",
		NX, (long long) got, NX * PTP);
	assert_int_equal(got, NX * PTP);
	assert_int_equal(broker_stat(&pp.b, "remote_blocks_sent"), NX * PTP);
	pair_end(p, d, 3);
}

/* n same-node transfers of c, each sealed with nothing expected: all end */
static void churn(struct kvb_ctx *c, unsigned n)
{
	static struct kvb_completion cv[256];
	static char names[64][32];
	const char *ids[64];
	uint32_t h[64];
	int st[64];
	unsigned done = 0;

	for (unsigned k = 0; k < n; k += 64) {
		unsigned sealed = 0, got = 0;

		for (unsigned i = 0; i < 64; i++) {
			snprintf(names[i], sizeof(names[i]), "churn-%u", k + i);
			ids[i] = names[i];
		}
		assert_int_equal(kvb_transfer_open_batch(c, ids, 64, h, st), 0);
		while (got < 64) {
			int m;

			while (sealed < 64 &&
			       kvb_transfer_seal(c, h[sealed], 0, sealed) == 0)
				sealed++;
			m = kvb_wait(c, cv, 256, 1000);
			assert_true(m > 0);
			for (int i = 0; i < m; i++)
				got += cv[i].kind == KVB_COMP_TRANSFER;
		}
		done += got;
	}
	assert_int_equal(done, n);
}

static void test_late_rank(void **state)
{
	static struct kvb_completion cv[64];
	struct kvb_ctx *p[PTP], *d[3];
	uint32_t h[NX];
	int32_t st[NX];
	unsigned ended = 0;
	int64_t got, t0;

	(void) state;
	assert_int_equal(broker_pair_start(&pp, NULL), 0);
	p_attach(p);
	d[0] = d_attach(0);
	d[1] = d_attach(1);
	d[2] = w_attach(&pp.b, KVB_ROLE_P, 0, 1, 4096); /* same-node work */
	assert_non_null(d[2]);
	assert_int_equal(d_open(d[0], "late", h, st), NX);
	assert_int_equal(heard(NX * PTP), NX * PTP);
	/* D0's transfers end: aborted, their release to A answered by no
	 * one, waited for 100 ms (their stall timeout) */
	for (unsigned i = 0; i < NX; i++) {
		assert_int_equal(
			kvb_transfer_set_timeouts(d[0], h[i], 0, 100, 0), 0);
		assert_int_equal(kvb_transfer_abort(d[0], h[i], i), 0);
	}
	t0 = now_ns();
	while (ended < NX && ms_since(t0) < 5000) {
		int m = kvb_wait(d[0], cv, 64, 100);

		for (int i = 0; i < m; i++)
			ended += cv[i].kind == KVB_COMP_TRANSFER;
	}
	assert_int_equal(ended, NX);
	churn(d[2], 4160);
	assert_int_equal(d_open(d[1], "late", h, st), NX);
	got = heard(NX * PTP);
	fprintf(stderr,
		"late_rank: %u transfers, D0's ended, 4160 others ended, then "
		"D1 opened them: A received %lld remote_blocks (want %u)\n",
		NX, (long long) got, NX * PTP);
	assert_int_equal(got, NX * PTP);
	pair_end(p, d, 3);
}

/* Every one of D's NX opens failed -EHOSTUNREACH (no P worker at the peer):
 * refused at open, or (the broker asked the peer again first, and its
 * answer still had no P worker) opened, then completed with that status. */
static void failed_unreachable(struct kvb_ctx *c, unsigned opened,
			       const int32_t *st)
{
	struct kvb_completion cv[64];
	unsigned ended = 0;
	int64_t t0 = now_ns();

	for (unsigned i = 0; i < NX; i++)
		if (st[i] != 0)
			assert_int_equal(st[i], -EHOSTUNREACH);
	while (ended < opened && ms_since(t0) < 5000) {
		int m = kvb_wait(c, cv, 64, 100);

		for (int i = 0; i < m; i++) {
			if (cv[i].kind != KVB_COMP_TRANSFER)
				continue;
			assert_int_equal(cv[i].status, -EHOSTUNREACH);
			ended++;
		}
	}
	assert_int_equal(ended, opened);
}

static void test_failed_first(void **state)
{
	struct kvb_ctx *p[PTP], *d[2];
	uint32_t h[NX], peer;
	int32_t st[NX];
	int64_t got;

	(void) state;
	assert_int_equal(broker_pair_start(&pp, NULL), 0);
	d[0] = d_attach(0);
	d[1] = d_attach(1);
	/* B knows A, which has no P worker yet: nothing to announce to */
	assert_int_equal(kvb_peer_connect(d[0], "127.0.0.1", pp.hs_a, &peer),
			 0);
	failed_unreachable(d[0], d_open(d[0], "ff", h, st), st);
	p_attach(p);
	/* B learns A's P workers, then D1 opens */
	assert_int_equal(kvb_peer_connect(d[1], "127.0.0.1", pp.hs_a, &peer),
			 0);
	assert_int_equal(d_open(d[1], "ff", h, st), NX);
	got = heard(NX * PTP);
	fprintf(stderr,
		"failed_first: %u transfers, D0's open failed (no P worker), "
		"D1's after they came: A received %lld remote_blocks (want "
		"%u)\n",
		NX, (long long) got, NX * PTP);
	assert_int_equal(got, NX * PTP);
	pair_end(p, d, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_concurrent, teardown),
		cmocka_unit_test_teardown(test_rank_gone, teardown),
		cmocka_unit_test_teardown(test_late_rank, teardown),
		cmocka_unit_test_teardown(test_failed_first, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * No worker or local client takes the node's broker down or hurts other
 * workers: connections that never say HELLO (closed at the deadline, kept
 * apart from the worker slots), a worker hogging the transfer table (its
 * share, -ENOSPC at once, a log line a second; one trying 100,000 ids
 * while the others keep their share; one alone that leaves the next
 * worker its share, which it opens at once), a worker that never reaps
 * (the broker's memory bounded, its submissions wait, nothing lost), a
 * worker completing another's transfer by its id (not counted), a second
 * worker with an identity that is attached (-EADDRINUSE), rings too large
 * (-E2BIG), empty messages and MEM_REG refusals counted. Figures go to
 * stderr.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"
#include "raw_worker.h"

static struct broker br;
static int running;

static void start(const char *const *args)
{
	const struct broker_opts o = {.args = args};

	assert_int_equal(broker_start(&br, &o), 0);
	running = 1;
}

static void stop(void)
{
	running = 0;
	assert_int_equal(broker_stop(&br), 0);
	broker_cleanup(&br);
}

static int teardown(void **state)
{
	(void) state;
	if (running) {
		broker_log_dump(&br);
		broker_kill(&br);
		broker_cleanup(&br);
		running = 0;
	}
	return 0;
}

/* Lines of the broker's log that contain s. */
static int log_count(const char *s)
{
	char line[1024];
	FILE *f = fopen(br.log, "r");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

static int64_t rss_kib(pid_t pid)
{
	char path[64], line[256];
	int64_t kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			kib = strtoll(line + 6, NULL, 10);
	fclose(f);
	return kib;
}

static struct kvb_ctx *attach(enum kvb_role role, uint32_t dp, uint32_t sq,
			      int *err)
{
	struct kvb_attach_opts o = {.socket_path = br.sock,
				    .role = role,
				    .dp_rank = dp,
				    .tp_size = 1,
				    .sq_entries = sq};
	struct kvb_ctx *c = NULL;
	int rc = kvb_attach(&o, &c);

	if (err)
		*err = rc;
	return rc ? NULL : c;
}

#define SILENT 12

/* At --max-workers 8, 12 connections that never say HELLO: an attach and
 * kvbctl stats still get in; each is closed 2 s (--hello-timeout-ms) after
 * it connected. With --max-pending 4 the oldest make room for new ones. */
static void test_silent_connections(void **state)
{
	static const char *const args[] = {"--max-workers", "8", NULL};
	static const char *const args2[] = {"--max-workers", "8",
					    "--max-pending", "4", NULL};
	static char out[16384];
	char *kvbctl[] = {KVBCTL_BIN, "--socket", br.sock, "stats", NULL};
	int fd[SILENT];
	int64_t t[SILENT], t0;
	double lo = 1e9, hi = 0, att;
	struct kvb_ctx *c;
	int err;

	(void) state;
	start(args);
	kvbctl[2] = br.sock;
	for (int i = 0; i < SILENT; i++) {
		t[i] = now_ns();
		fd[i] = kvb_ctl_connect(br.sock, 3000);
		assert_true(fd[i] >= 0);
	}
	/* and the STATS connection asking */
	assert_int_equal(
		broker_wait_stat(&br, "connections_pending", SILENT + 1, 2000),
		0);
	t0 = now_ns();
	c = attach(KVB_ROLE_P, 0, 0, &err);
	att = ms_since(t0);
	if (!c)
		fail_msg("attach with %d silent connections: %d", SILENT, err);
	assert_int_equal(run_cmd(kvbctl, out, sizeof(out), 10), 0);
	assert_non_null(strstr(out, "hello_timeouts"));
	for (int i = 0; i < SILENT; i++) {
		struct pollfd p = {.fd = fd[i], .events = POLLIN};
		char b[64];
		double ms;

		assert_int_equal(poll(&p, 1, 2000 + SLACK + 2000), 1);
		assert_int_equal(recv(fd[i], b, sizeof(b), 0), 0); /* EOF */
		ms = ms_since(t[i]);
		lo = ms < lo ? ms : lo;
		hi = ms > hi ? ms : hi;
		close(fd[i]);
	}
	fprintf(stderr,
		"%d silent connections at --max-workers 8: attach in %.1f ms, "
		"kvbctl stats ok; closed after %.0f..%.0f ms (deadline 2000)\n",
		SILENT, att, lo, hi);
	assert_true(lo >= 2000);
	assert_true(hi <= 2000 + SLACK);
	assert_int_equal(broker_stat(&br, "hello_timeouts"), SILENT);
	assert_int_equal(broker_stat(&br, "workers"), 1);
	assert_true(log_count("no HELLO within") <= 2);
	kvb_detach(c);
	stop();

	/* a small pre-HELLO table: the oldest silent ones make room */
	start(args2);
	for (int i = 0; i < SILENT; i++)
		fd[i] = kvb_ctl_connect(br.sock, 3000);
	c = attach(KVB_ROLE_P, 0, 0, &err);
	assert_non_null(c);
	assert_true(broker_stat(&br, "pending_evicted") >= SILENT - 4);
	for (int i = 0; i < SILENT; i++)
		close(fd[i]);
	kvb_detach(c);
	stop();
}

/* Open transfers in batches of 64 until one is refused; returns how many
 * were opened (*refused: the -ENOSPC ones among `extra` more tries). */
static unsigned open_until_refused(struct kvb_ctx *c, const char *pfx,
				   unsigned max, unsigned extra, int min_ms,
				   unsigned *refused)
{
	int64_t t_ref = 0;
	static char names[64][32];
	const char *ids[64];
	uint32_t h[64];
	int st[64];
	unsigned opened = 0, tried = 0, after = 0, n = 0;

	*refused = 0;
	while (tried < max &&
	       (after < extra || (t_ref && ms_since(t_ref) < min_ms))) {
		for (unsigned i = 0; i < 64; i++) {
			snprintf(names[i], sizeof(names[i]), "%s-%u", pfx, n++);
			ids[i] = names[i];
		}
		int rc = kvb_transfer_open_batch(c, ids, 64, h, st);

		/* 0, or the first failing id's status */
		assert_true(rc == 0 || rc == -ENOSPC);
		for (unsigned i = 0; i < 64; i++, tried++) {
			if (!st[i] && !*refused)
				opened++;
			else if (st[i] == -ENOSPC)
				(*refused)++;
			else if (st[i])
				fail_msg("open: %d", st[i]);
			if (*refused && !after++)
				t_ref = now_ns();
		}
	}
	return opened;
}

/* One worker opening until refused: -ENOSPC at its share while the other
 * still opens; its refusals, for 2.5 s, log a line a second at most. */
static void test_transfer_hog(void **state)
{
	struct kvb_ctx *hog, *other;
	unsigned opened, refused, ok, r2;
	int64_t t0;
	double s;
	int lines;

	(void) state;
	start(NULL);
	hog = attach(KVB_ROLE_P, 0, 0, NULL);
	other = attach(KVB_ROLE_D, 0, 0, NULL);
	assert_non_null(hog);
	assert_non_null(other);
	t0 = now_ns();
	opened = open_until_refused(hog, "hog", 1u << 30, 6400, 2500, &refused);
	s = ms_since(t0) / 1000;
	ok = open_until_refused(other, "ok", 1024, 1, 0, &r2);
	lines = log_count("refused (-ENOSPC)");
	fprintf(stderr,
		"hog: %u opened, then %u refused (-ENOSPC) in %.2f s, %d log "
		"lines; other worker: %u of 1024 opened\n",
		opened, refused, s, lines, ok);
	/* 2 workers: a share of 16383 / 2, and one borrowed */
	assert_true(opened >= 8191 && opened <= 8192);
	assert_int_equal(ok, 1024);
	assert_int_equal(r2, 0);
	assert_true(refused >= 6400);
	assert_true(lines >= 1 && lines <= (int) s + 2);
	assert_int_equal(log_count("transfer table full"), 0);
	assert_int_equal(broker_stat(&br, "xfer_quota_refused"), refused);
	kvb_detach(hog);
	kvb_detach(other);
	stop();
}

/* An open storm: one of three workers tries 100,000 ids; it gets its share
 * (16383 / 3), every other try is refused, and each other worker still
 * opens its whole share. */
static void test_open_storm(void **state)
{
	struct kvb_ctx *hog, *a, *b;
	unsigned opened, refused, oa, ob, ra, rb;
	const unsigned share = 16383 / 3;
	const unsigned tries = (100000 + 63) / 64 * 64; /* batches of 64 */
	int64_t t0;

	(void) state;
	start(NULL);
	hog = attach(KVB_ROLE_P, 0, 0, NULL);
	a = attach(KVB_ROLE_D, 0, 0, NULL);
	b = attach(KVB_ROLE_P, 1, 0, NULL);
	assert_non_null(hog);
	assert_non_null(a);
	assert_non_null(b);
	t0 = now_ns();
	opened = open_until_refused(hog, "storm", tries, tries, 0, &refused);
	fprintf(stderr, "storm: %u opens in %.2f s: %u opened, %u refused; ",
		tries, ms_since(t0) / 1000, opened, refused);
	oa = open_until_refused(a, "a", share, 1, 0, &ra);
	ob = open_until_refused(b, "b", share, 1, 0, &rb);
	fprintf(stderr, "the others: %u and %u of %u opened\n", oa, ob, share);
	assert_int_equal(opened, share);
	assert_int_equal(opened + refused, tries);
	assert_int_equal(oa, share);
	assert_int_equal(ob, share);
	/* their batches of 64 go past the share: only those tries refused */
	assert_int_equal(ra, (share + 63) / 64 * 64 - share);
	assert_int_equal(rb, ra);
	assert_int_equal(broker_stat(&br, "xfer_quota_refused"),
			 refused + ra + rb);
	assert_int_equal(log_count("transfer table full"), 0);
	kvb_detach(hog);
	kvb_detach(a);
	kvb_detach(b);
	stop();
}

/* Open "<pfx>-<n>" for n = 0.. in batches of 64 until one is refused or
 * `max` are open; their handles into h. Returns how many opened; *err: the
 * refusal (0: none). */
static unsigned open_keep(struct kvb_ctx *c, const char *pfx, unsigned max,
			  uint32_t *h, int *err)
{
	static char names[64][32];
	const char *ids[64];
	unsigned opened = 0;
	int st[64];

	*err = 0;
	while (opened < max && !*err) {
		unsigned k = max - opened < 64 ? max - opened : 64;
		int rc;

		for (unsigned i = 0; i < k; i++) {
			snprintf(names[i], sizeof(names[i]), "%s-%u", pfx,
				 opened + i);
			ids[i] = names[i];
		}
		rc = kvb_transfer_open_batch(c, ids, k, h + opened, st);
		assert_true(rc == 0 || rc == -ENOSPC);
		for (unsigned i = 0; i < k && !*err; i++) {
			if (st[i])
				*err = st[i];
			else
				opened++;
		}
	}
	return opened;
}

/* Seal n transfers with nothing expected and collect their completions;
 * returns how many completed with status 0. */
static unsigned seal_all(struct kvb_ctx *c, const uint32_t *h, unsigned n)
{
	static struct kvb_completion cv[1024];
	unsigned sealed = 0, done = 0, ok = 0;
	int64_t t0 = now_ns();

	while (done < n && ms_since(t0) < 30000) {
		int k;

		while (sealed < n &&
		       kvb_transfer_seal(c, h[sealed], 0, sealed) == 0)
			sealed++;
		k = kvb_wait(c, cv, 1024, 100);
		for (int i = 0; i < k; i++)
			if (cv[i].kind == KVB_COMP_TRANSFER) {
				done++;
				ok += cv[i].status == 0;
			}
	}
	return ok;
}

/*
 * A worker alone, then a second one. The first takes what it may: half of
 * the table (the other half is the next worker's share, kept); the second
 * opens its whole share (16383 / 2) at once, while every transfer of the
 * first stays open; the first is refused above its new share, and its
 * transfers all still complete. Before, the first took all 16383 and the
 * second got -ENOSPC until the first's transfers ended (--transfer-deadline,
 * 600 s, for transfers that only wait).
 */
static void test_late_worker(void **state)
{
	static uint32_t h1[16384], h2[16384];
	const unsigned total = 16383, share = 16383 / 2;
	struct kvb_ctx *w1, *w2;
	unsigned n1, n2, ok;
	double first_ms, share_ms;
	int64_t t0;
	uint32_t h;
	int err, rc;

	(void) state;
	start(NULL);
	w1 = attach(KVB_ROLE_D, 0, 4096, NULL);
	assert_non_null(w1);
	n1 = open_keep(w1, "first", total, h1, &err);
	fprintf(stderr, "worker 1 alone: %u transfers opened, then %d\n", n1,
		err);
	w2 = attach(KVB_ROLE_P, 0, 0, NULL);
	assert_non_null(w2);
	t0 = now_ns();
	rc = kvb_transfer_open(w2, "second-first", &h2[0]);
	first_ms = ms_since(t0);
	if (rc)
		fail_msg("worker 2, attached after worker 1 took %u of %u "
			 "transfers: its first open %d (%s)",
			 n1, total, rc, kvb_strerror(rc));
	n2 = 1 + open_keep(w2, "second", share - 1, h2 + 1, &err);
	share_ms = ms_since(t0);
	fprintf(stderr,
		"worker 2 attached later: its first open in %.2f ms, its "
		"share (%u) in %.1f ms (%u opened, then %d), with worker 1's "
		"%u transfers all open\n",
		first_ms, share, share_ms, n2, err, n1);
	assert_int_equal(n1, total - share);
	assert_int_equal(err, 0);
	assert_int_equal(n2, share);
	assert_true(share_ms < 1000 + SLACK);
	/* the first is at its new share (and past it by the one lent) */
	assert_int_equal(kvb_transfer_open(w1, "first-more", &h), -ENOSPC);
	assert_true(broker_stat(&br, "xfer_quota_refused") >= 2);
	assert_int_equal(broker_stat(&br, "xfer_table_full"), 0);
	/* nothing of the first was broken: every transfer completes */
	ok = seal_all(w1, h1, n1);
	fprintf(stderr, "worker 1: %u of %u transfers completed (status 0)\n",
		ok, n1);
	assert_int_equal(ok, n1);
	assert_int_equal(seal_all(w2, h2, n2), n2);
	/* --max-workers 1: nobody can attach, a worker alone has it all */
	kvb_detach(w1);
	kvb_detach(w2);
	stop();
	{
		static const char *const args[] = {"--max-workers", "1", NULL};

		start(args);
		w1 = attach(KVB_ROLE_D, 0, 4096, NULL);
		assert_non_null(w1);
		assert_int_equal(open_keep(w1, "all", total, h1, &err), total);
		kvb_detach(w1);
		stop();
	}
}

/* A worker that fills its ring and never reaps, while its control calls
 * (a region allocated and freed) make the broker take its ring: the
 * broker's memory stays bounded, its ring waits (-EAGAIN) past
 * --max-undelivered, and once it reaps every descriptor completes. */
static void test_never_reaps(void **state)
{
	static const char *const args[] = {"--max-undelivered", "4096", NULL};
	static struct kvb_completion cv[1024];
	struct kvb_region src, dst, r;
	struct kvb_desc d;
	struct kvb_ctx *c;
	uint64_t submitted = 0, got = 0, bad = 0;
	int64_t rss0, rss1, t0;
	unsigned iters = 0, eagain = 0;

	(void) state;
	start(args);
	c = attach(KVB_ROLE_P, 0, 4096, NULL);
	assert_non_null(c);
	assert_int_equal(kvb_mem_alloc(c, 65536, 0, 1, &src), 0);
	assert_int_equal(kvb_mem_alloc(c, 65536, 0, 2, &dst), 0);
	d = (struct kvb_desc){
		.region = src.id, .peer_region = dst.id, .len = 64};
	rss0 = rss_kib(br.pid);
	t0 = now_ns();
	while (iters < 400 && ms_since(t0) < 8000) {
		int n;

		do {
			d.tag = submitted;
			d.offset = d.peer_offset = (submitted % 1024) * 64;
			n = kvb_submit_write(c, &d, 1);
			submitted += n > 0 ? (uint64_t) n : 0;
		} while (n == 1);
		assert_int_equal(n, -EAGAIN);
		eagain++;
		assert_int_equal(kvb_mem_alloc(c, 4096, 0, 3, &r), 0);
		assert_int_equal(kvb_mem_free(c, &r), 0);
		iters++;
	}
	rss1 = rss_kib(br.pid);
	fprintf(stderr,
		"never reaping: %u rounds, %llu descriptors submitted, broker "
		"RSS %lld -> %lld KiB, undelivered_refused %lld\n",
		iters, (unsigned long long) submitted, (long long) rss0,
		(long long) rss1,
		(long long) broker_stat(&br, "undelivered_refused"));
	assert_true(broker_stat(&br, "undelivered_refused") > 0);
	/* bounded: 4096 undelivered + a ring's worth, not 400 rings' worth */
	assert_true(rss1 - rss0 < 8 * 1024);
	/* transfer opens wait too until it reaps */
	{
		uint32_t h;

		assert_int_equal(kvb_transfer_open(c, "late", &h), -EAGAIN);
	}
	/* it reaps: every descriptor completes, none lost */
	t0 = now_ns();
	while (got < submitted && ms_since(t0) < 30000) {
		int n = kvb_wait(c, cv, 1024, 1000);

		assert_true(n >= 0 || n == -ETIMEDOUT);
		for (int i = 0; i < n; i++)
			bad += cv[i].status != 0 || cv[i].kind != KVB_COMP_DESC;
		got += n > 0 ? (uint64_t) n : 0;
	}
	fprintf(stderr, "reaped %llu of %llu completions, %llu bad\n",
		(unsigned long long) got, (unsigned long long) submitted,
		(unsigned long long) bad);
	assert_int_equal(got, submitted);
	assert_int_equal(bad, 0);
	kvb_detach(c);
	stop();
}

/* Wait up to ms for a TRANSFER completion on c; its status, or 1 if none. */
static int xfer_done(struct kvb_ctx *c, int ms)
{
	struct kvb_completion v[8];
	int64_t t0 = now_ns();

	while (ms_since(t0) < ms) {
		int n = kvb_wait(c, v, 8, 50);

		for (int i = 0; i < n; i++)
			if (v[i].kind == KVB_COMP_TRANSFER)
				return v[i].status;
	}
	return 1;
}

/* A third worker writes a byte into D's region under D's transfer id and
 * seals: D's transfer does not count it; P's write completes it. */
static void test_transfer_spoof(void **state)
{
	struct kvb_ctx *p, *dw, *t;
	struct kvb_region dreg, psrc, tsrc;
	struct kvb_remote_region rr;
	struct kvb_desc d;
	uint32_t hd, hp, ht;

	(void) state;
	start(NULL);
	p = attach(KVB_ROLE_P, 0, 0, NULL);
	dw = attach(KVB_ROLE_D, 0, 0, NULL);
	t = attach(KVB_ROLE_D, 1, 0, NULL);
	assert_true(p && dw && t);
	assert_int_equal(
		kvb_mem_alloc(dw, 4096, KVB_MEM_REMOTE_WRITE, 9, &dreg), 0);
	assert_int_equal(kvb_mem_alloc(p, 4096, 0, 1, &psrc), 0);
	assert_int_equal(kvb_mem_alloc(t, 4096, 0, 1, &tsrc), 0);
	pattern_fill(psrc.addr, 4096, 3, 0);
	/* D expects one write_done for "tx-s" */
	assert_int_equal(kvb_transfer_open(dw, "tx-s", &hd), 0);
	assert_int_equal(kvb_transfer_seal(dw, hd, 1, 100), 0);
	/* the third worker: a 1-byte write under the same id, sealed */
	assert_int_equal(kvb_mem_lookup(t, KVB_ROLE_D, 0, 0, 9, &rr), 0);
	assert_int_equal(kvb_transfer_open(t, "tx-s", &ht), 0);
	d = (struct kvb_desc){.transfer = ht,
			      .region = tsrc.id,
			      .peer_region = rr.id,
			      .len = 1,
			      .tag = 1};
	assert_int_equal(kvb_submit_write(t, &d, 1), 1);
	assert_int_equal(kvb_transfer_seal(t, ht, 1, 200), 0);
	assert_int_equal(xfer_done(t, 5000), 0); /* its own transfer ends */
	assert_int_equal(xfer_done(dw, 300), 1); /* D's does not */
	assert_int_equal(broker_wait_stat(&br, "xfer_notify_refused", 1, 2000),
			 0);
	assert_true(broker_log_has(&br, "not counted for worker"));
	/* P's write completes it */
	assert_int_equal(kvb_mem_lookup(p, KVB_ROLE_D, 0, 0, 9, &rr), 0);
	assert_int_equal(kvb_transfer_open(p, "tx-s", &hp), 0);
	d = (struct kvb_desc){.transfer = hp,
			      .region = psrc.id,
			      .peer_region = rr.id,
			      .len = 4096,
			      .tag = 2};
	assert_int_equal(kvb_submit_write(p, &d, 1), 1);
	assert_int_equal(kvb_transfer_seal(p, hp, 1, 300), 0);
	assert_int_equal(xfer_done(p, 5000), 0);
	assert_int_equal(xfer_done(dw, 5000), 0);
	assert_int_equal(pattern_check(dreg.addr, 4096, 3, 0), 0);
	fprintf(stderr, "spoof: D's transfer ignored the third worker's "
			"write (xfer_notify_refused 1), completed by P's\n");
	kvb_detach(t);
	kvb_detach(p);
	kvb_detach(dw);
	stop();
}

/* A second worker with an attached identity: -EADDRINUSE while the first
 * lives, accepted once it detached. */
static void test_duplicate_identity(void **state)
{
	struct kvb_ctx *a, *b;
	int err = 0;

	(void) state;
	start(NULL);
	a = attach(KVB_ROLE_P, 3, 0, NULL);
	assert_non_null(a);
	b = attach(KVB_ROLE_P, 3, 0, &err);
	assert_null(b);
	assert_int_equal(err, -EADDRINUSE);
	assert_non_null(strstr(kvb_strerror(err), "already attached"));
	assert_int_equal(broker_stat(&br, "duplicate_identity"), 1);
	assert_true(broker_log_has(&br, "is attached already"));
	/* another role or dp rank is another identity */
	b = attach(KVB_ROLE_D, 3, 0, NULL);
	assert_non_null(b);
	kvb_detach(b);
	kvb_detach(a);
	assert_int_equal(broker_wait_stat(&br, "workers", 0, 5000), 0);
	b = attach(KVB_ROLE_P, 3, 0, &err);
	assert_non_null(b);
	kvb_detach(b);
	stop();
}

/* HELLO asking for 2^20-entry rings (128 MiB segments): -E2BIG. */
static void test_ring_cap(void **state)
{
	struct kvb_attach_opts o = {.role = KVB_ROLE_P, .tp_size = 1};
	struct kvb_ctx *c = NULL;

	(void) state;
	start(NULL);
	o.socket_path = br.sock;
	o.sq_entries = 1u << 20;
	assert_int_equal(kvb_attach(&o, &c), -E2BIG);
	assert_non_null(strstr(kvb_strerror(-E2BIG), "--max-ring-entries"));
	o.sq_entries = 0;
	o.cq_entries = 1u << 20;
	assert_int_equal(kvb_attach(&o, &c), -E2BIG);
	assert_true(broker_log_has(&br, "at most 65536 (--max-ring-entries)"));
	assert_int_equal(broker_stat(&br, "hello_refused"), 2);
	o.cq_entries = 1u << 16;
	assert_int_equal(kvb_attach(&o, &c), 0);
	kvb_detach(c);
	stop();
}

/* A zero-length message and a refused MEM_REG: counted. */
static void test_counted(void **state)
{
	struct kvb_msg_mem_reg m;
	struct kvb_msg_mem_reply rep;
	struct raw_worker w;
	int fd, n;

	(void) state;
	start(NULL);
	fd = kvb_ctl_connect(br.sock, 3000);
	assert_true(fd >= 0);
	assert_int_equal(send(fd, "", 0, 0), 0);
	assert_int_equal(broker_wait_stat(&br, "ctl_empty_messages", 1, 3000),
			 0);
	close(fd);
	assert_int_equal(raw_worker_attach(&w, br.sock), 0);
	kvb_msg_init(&m.h, KVB_MSG_MEM_REG, sizeof(m));
	m.size = 0; /* refused: -EINVAL */
	assert_int_equal(kvb_ctl_send(w.sock, &m, sizeof(m), NULL, 0), 0);
	n = kvb_ctl_recv(w.sock, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep.h, n, KVB_MSG_MEM_REG, sizeof(rep)),
		-EINVAL);
	assert_int_equal(broker_stat(&br, "mem_reg_refused"), 1);
	raw_worker_close(&w);
	stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_silent_connections, teardown),
		cmocka_unit_test_teardown(test_transfer_hog, teardown),
		cmocka_unit_test_teardown(test_open_storm, teardown),
		cmocka_unit_test_teardown(test_late_worker, teardown),
		cmocka_unit_test_teardown(test_never_reaps, teardown),
		cmocka_unit_test_teardown(test_transfer_spoof, teardown),
		cmocka_unit_test_teardown(test_duplicate_identity, teardown),
		cmocka_unit_test_teardown(test_ring_cap, teardown),
		cmocka_unit_test_teardown(test_counted, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

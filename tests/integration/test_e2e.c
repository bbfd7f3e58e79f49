/* SPDX-License-Identifier: MIT */
/*
 * End to end: one broker, kvb-demo with 2 P and 2 D workers writing 32
 * layers x many blocks (every byte verified at D), then the broker's counters
 * through `kvbctl stats --json` must balance: every submitted descriptor
 * completed, none refused, no transfer failed, nobody left attached. Last,
 * a region from kvb_mem_alloc() is advised for huge pages in the worker's
 * mapping and in the broker's.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define P	    2
#define D	    2
#define LAYERS	    32
#define BLOCKS	    32
#define BLOCK_BYTES 1024
#define REQUESTS    64

static struct broker br;
static char out[1 << 16];

static int group_setup(void **state)
{
	(void) state;
	return broker_start(&br, NULL);
}

static int group_teardown(void **state)
{
	int rc;

	(void) state;
	rc = broker_stop(&br);
	if (rc)
		fprintf(stderr, "broker exit status %d\n", rc);
	if (access(br.sock, F_OK) == 0) {
		fprintf(stderr, "socket %s left behind\n", br.sock);
		rc = -1;
	}
	broker_cleanup(&br);
	return rc ? -1 : 0;
}

static void test_demo(void **state)
{
	char p[8], d[8], l[8], bl[8], bb[16], rq[8];
	char *argv[] = {KVB_DEMO_BIN,
			"--socket",
			br.sock,
			"--p",
			p,
			"--d",
			d,
			"--layers",
			l,
			"--blocks",
			bl,
			"--block-bytes",
			bb,
			"--requests",
			rq,
			"--inflight",
			"8",
			NULL};
	int64_t t0 = now_ns();
	int rc;

	(void) state;
	snprintf(p, sizeof(p), "%d", P);
	snprintf(d, sizeof(d), "%d", D);
	snprintf(l, sizeof(l), "%d", LAYERS);
	snprintf(bl, sizeof(bl), "%d", BLOCKS);
	snprintf(bb, sizeof(bb), "%d", BLOCK_BYTES);
	snprintf(rq, sizeof(rq), "%d", REQUESTS);
	rc = run_cmd(argv, out, sizeof(out), 90);
	fprintf(stderr, "kvb-demo: exit %d in %.0f ms\n%s", rc, ms_since(t0),
		out);
	if (rc)
		broker_log_dump(&br);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(out, "all bytes verified"));
	/*
	 * The demo exits non-zero when any D rank finds a bad byte or a
	 * failed request. (Its per-rank "D<n>: ... bytes verified" lines are
	 * not checked: the D children print them with printf and leave with
	 * _exit(), so they are lost when stdout is a pipe.)
	 */
}

static void test_stats_balance(void **state)
{
	char *argv[] = {KVBCTL_BIN, "--socket", br.sock,
			"stats",    "--json",	NULL};
	const int64_t writes = (int64_t) P * REQUESTS * LAYERS * BLOCKS;
	int64_t sub, comp, wrs, db;

	(void) state;
	/* workers detach asynchronously: wait until the last one is gone */
	assert_int_equal(broker_wait_stat(&br, "workers", 0, 5000), 0);
	assert_int_equal(run_cmd(argv, out, sizeof(out), 10), 0);
	fprintf(stderr, "kvbctl stats --json: %s", out);
	sub = stat_get(out, "descriptors_submitted");
	comp = stat_get(out, "descriptors_completed");
	assert_int_equal(sub, writes);
	assert_int_equal(comp, sub);
	assert_int_equal(stat_get(out, "descriptors_refused"), 0);
	assert_int_equal(stat_get(out, "bytes"), writes * BLOCK_BYTES);
	assert_int_equal(stat_get(out, "transfers_failed"), 0);
	/* every P transfer, and every D's write_done entry for it */
	assert_int_equal(stat_get(out, "transfers_done"), 2 * P * REQUESTS);
	assert_int_equal(stat_get(out, "transfers_active"), 0);
	assert_int_equal(stat_get(out, "messages_rejected"), 0);
	assert_int_equal(stat_get(out, "workers_lost"), 0);
	assert_int_equal(stat_get(out, "workers"), 0);
	assert_int_equal(stat_get(out, "regions"), 0);
	/* merging and batching: fewer WRs than descriptors, several per
	 * doorbell */
	wrs = stat_get(out, "wrs");
	db = stat_get(out, "doorbells");
	assert_true(wrs > 0 && wrs < sub);
	assert_true(db > 0 && db <= wrs);
	assert_non_null(strstr(out, "\"wr_per_doorbell\":{\"mean\":"));
	assert_non_null(strstr(out, "\"per_worker\":[]"));
}

static void test_kvbctl(void **state)
{
	char *text[] = {KVBCTL_BIN, "--socket", br.sock, "stats", NULL};
	char *nobroker[] = {KVBCTL_BIN, "--socket", "/nonexistent/kvb.sock",
			    "stats", NULL};
	char *badcmd[] = {KVBCTL_BIN, "--socket", br.sock, "frob", NULL};
	static const char *const rows[] = {"workers",
					   "descriptors_submitted",
					   "descriptors_completed",
					   "descriptors_refused",
					   "bytes",
					   "doorbells",
					   "wrs",
					   "wr_per_doorbell",
					   "transfers_done",
					   "transfers_failed",
					   "messages_rejected"};

	(void) state;
	assert_int_equal(run_cmd(text, out, sizeof(out), 10), 0);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (!strstr(out, rows[i]))
			fail_msg("kvbctl stats lacks '%s':\n%s", rows[i], out);
	assert_int_equal(run_cmd(nobroker, out, sizeof(out), 10), 1);
	assert_int_equal(run_cmd(badcmd, out, sizeof(out), 10), 2);
}

/*
 * Whether a mapping of pid has the VmFlags token `flag` (smaps): the one
 * holding addr, or (addr 0) every one whose path has `name`. 1 yes, 0 no,
 * -1 no such mapping.
 */
static int vma_flag(pid_t pid, uintptr_t addr, const char *name,
		    const char *flag)
{
	char path[64], line[512];
	int in = 0, found = 0, all = 1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int) pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		/* a mapping's first line; the others start "Name:" */
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in = addr ? addr >= lo && addr < hi
				  : strstr(line, name) != NULL;
			continue;
		}
		if (in && !strncmp(line, "VmFlags:", 8)) {
			char want[16];

			snprintf(want, sizeof(want), " %s ", flag);
			found = 1;
			/* the line ends " \n": tokens are " xx " */
			all &= strstr(line + 7, want) != NULL;
			in = 0;
		}
	}
	fclose(f);
	return found ? all : -1;
}

static void test_hugepage_advice(void **state)
{
	struct kvb_region r;
	struct kvb_ctx *c;

	(void) state;
	if (access("/sys/kernel/mm/transparent_hugepage", F_OK)) {
		print_message("kernel without transparent huge pages\n");
		skip();
	}
	c = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	assert_non_null(c);
	assert_int_equal(kvb_mem_alloc(c, 4u << 20, 0, 7, &r), 0);
	/* "hg": VM_HUGEPAGE, set by madvise(MADV_HUGEPAGE) */
	assert_int_equal(vma_flag(getpid(), (uintptr_t) r.addr, NULL, "hg"), 1);
	assert_int_equal(vma_flag(br.pid, 0, "memfd:kvb-region", "hg"), 1);
	assert_int_equal(kvb_mem_free(c, &r), 0);
	assert_int_equal(kvb_detach(c), 0);
	/* gone from the broker too */
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);
	assert_int_equal(vma_flag(br.pid, 0, "memfd:kvb-region", "hg"), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_demo),
		cmocka_unit_test(test_stats_balance),
		cmocka_unit_test(test_kvbctl),
		cmocka_unit_test(test_hugepage_advice),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

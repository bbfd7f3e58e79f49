/* SPDX-License-Identifier: MIT */
/*
 * kvbctl's commands against a live broker: `workers` (this process's row:
 * id, role, dp, tp, pid, descriptors, bytes, ring fill), `transfers` (an
 * open transfer with its state and age, gone once it ends), `peers` (none
 * without --host-ip; a ready peer and a failed one between two brokers on
 * loopback), `nics` and `regions` (no NICs without rdma; the fixture's
 * regions), each as a table and as JSON; `--watch S --count N`,
 * `--version`, `-h`, and the usage errors (exit 2).
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
#include "metrics_client.h"

#define SIZE (64u << 10)

static char out[65536];

/* kvbctl --socket SOCK args...: its exit status; stdout in out */
static int ctl(const struct broker *b, const char *a1, const char *a2,
	       const char *a3, const char *a4)
{
	char *argv[10] = {KVBCTL_BIN, "--socket", (char *) b->sock};
	int n = 3;

	if (a1)
		argv[n++] = (char *) a1;
	if (a2)
		argv[n++] = (char *) a2;
	if (a3)
		argv[n++] = (char *) a3;
	if (a4)
		argv[n++] = (char *) a4;
	argv[n] = NULL;
	return run_cmd(argv, out, sizeof(out), 30);
}

static void test_workers(void **state)
{
	struct kvb_completion c[2];
	struct kvb_desc d = {.region = fx.src.id,
			     .peer_region = fx.dst.id,
			     .len = SIZE,
			     .tag = 5};
	char row[128];

	(void) state;
	/* one descriptor done: it shows */
	assert_int_equal(kvb_submit_write(fx.ctx, &d, 1), 1);
	assert_int_equal(w_collect(fx.ctx, c, 1, 5000), 1);
	assert_int_equal(ctl(&fx.br, "workers", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "worker   role dp  tp"));
	assert_non_null(strstr(out, "sq_fill"));
	snprintf(row, sizeof(row), "%-8u %-4s %-3u %3u/%-3u %-8d",
		 kvb_worker_id(fx.ctx), "P", 0, 0, 1, (int) getpid());
	assert_non_null(strstr(out, row));
	assert_int_equal(ctl(&fx.br, "--json", "workers", NULL, NULL), 0);
	assert_int_equal(out[0], '{');
	assert_int_equal(stat_get(out, "id"), kvb_worker_id(fx.ctx));
	assert_int_equal(stat_get(out, "pid"), getpid());
	assert_int_equal(stat_get(out, "dp_rank"), 0);
	assert_int_equal(stat_get(out, "tp_rank"), 0);
	assert_int_equal(stat_get(out, "submitted"), 1);
	assert_int_equal(stat_get(out, "bytes"), SIZE);
	assert_int_equal(stat_get(out, "sq_fill"), 0);
	assert_true(stat_get(out, "sq_entries") > 0);
	assert_non_null(strstr(out, "\"role\":\"P\""));
}

static void test_transfers(void **state)
{
	struct kvb_completion c[1];
	uint32_t h;
	char hs[32];

	(void) state;
	assert_int_equal(ctl(&fx.br, "transfers", "--json", NULL, NULL), 0);
	assert_int_equal(stat_get(out, "active"), 0);
	assert_int_equal(kvb_transfer_open(fx.ctx, "req-\"7\"", &h), 0);
	usleep(300000);
	assert_int_equal(ctl(&fx.br, "transfers", NULL, NULL, NULL), 0);
	snprintf(hs, sizeof(hs), "%#x", h);
	assert_non_null(strstr(out, hs));
	assert_non_null(strstr(out, " open "));
	assert_non_null(strstr(out, "req-\"7\""));
	assert_int_equal(ctl(&fx.br, "transfers", "--json", NULL, NULL), 0);
	assert_int_equal(stat_get(out, "active"), 1);
	assert_int_equal(stat_get(out, "handle"), h);
	assert_int_equal(stat_get(out, "worker"), kvb_worker_id(fx.ctx));
	assert_true(stat_get(out, "age_ms") >= 250);
	assert_true(stat_get(out, "age_ms") < 300 + 2 * SLACK);
	assert_non_null(strstr(out, "\"state\":\"open\""));
	assert_non_null(strstr(out, "\"id\":\"req-\\\"7\\\"\"")); /* escaped */
	assert_int_equal(kvb_transfer_abort(fx.ctx, h, 1), 0);
	assert_int_equal(w_collect(fx.ctx, c, 1, 5000), 1);
	assert_int_equal(ctl(&fx.br, "transfers", "--json", NULL, NULL), 0);
	assert_int_equal(stat_get(out, "active"), 0);
}

static void test_peers_none(void **state)
{
	(void) state;
	assert_int_equal(ctl(&fx.br, "peers", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "without --host-ip"));
	assert_int_equal(ctl(&fx.br, "peers", "--json", NULL, NULL), 0);
	assert_non_null(strstr(out, "\"cross_node\":false,\"peers\":[]"));
}

/* two brokers on loopback: A's worker hand-shakes with B (ready) and
 * with a port nobody serves (failed) */
static void test_peers(void **state)
{
	static const char *const a_args[] = {"--host-ip",
					     "127.0.0.1",
					     "--handshake-port",
					     "17401",
					     "--notify-port",
					     "17405",
					     "--metrics-listen",
					     "127.0.0.1:0",
					     NULL};
	static const char *const b_args[] = {
		"--host-ip", "127.0.0.1",     "--handshake-port",
		"17411",     "--notify-port", "17415",
		NULL};
	const struct broker_opts ao = {.args = a_args}, bo = {.args = b_args};
	struct broker ba, bb;
	struct kvb_ctx *ctx, *bctx;
	uint32_t peer = 0, dead = 0;

	(void) state;
	assert_int_equal(broker_start(&ba, &ao), 0);
	assert_int_equal(broker_start(&bb, &bo), 0);
	ctx = w_attach(&ba, KVB_ROLE_D, 0, 1, 0);
	bctx = w_attach(&bb, KVB_ROLE_P, 0, 1, 0);
	assert_non_null(ctx);
	assert_non_null(bctx);
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", 17411, &peer), 0);
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", 17499, &dead),
			 -ETIMEDOUT);
	assert_int_equal(ctl(&ba, "peers", NULL, NULL, NULL), 0);
	fputs(out, stderr);
	assert_non_null(strstr(out, "127.0.0.1:17411"));
	assert_non_null(strstr(out, "ready"));
	assert_non_null(strstr(out, "127.0.0.1:17499"));
	assert_non_null(strstr(out, "failed"));
	assert_int_equal(ctl(&ba, "peers", "--json", NULL, NULL), 0);
	assert_non_null(strstr(out, "\"cross_node\":true"));
	assert_non_null(strstr(out, "\"port\":17411,\"state\":\"ready\""));
	assert_non_null(strstr(out, "\"port\":17499,\"state\":\"failed\""));
	assert_int_equal(stat_get(out, "workers"), 1); /* B's P worker */
	/* the peers gauge says the same */
	{
		char *r = NULL;

		assert_int_equal(http_get(broker_metrics_port(&ba), "/metrics",
					  NULL, &r, 5000),
				 0);
		assert_true(metric(http_body(r),
				   "kvbroker_peers{state=\"ready\"}") == 1);
		assert_true(metric(http_body(r),
				   "kvbroker_peers{state=\"failed\"}") == 1);
		free(r);
	}
	kvb_detach(ctx);
	kvb_detach(bctx);
	assert_int_equal(broker_stop(&ba), 0);
	assert_int_equal(broker_stop(&bb), 0);
	broker_cleanup(&ba);
	broker_cleanup(&bb);
}

/* `nics` and `regions` on a broker without rdma: no NICs, the regions
 * (each without one) */
static void test_nics_regions(void **state)
{
	char row[128];

	(void) state;
	assert_int_equal(ctl(&fx.br, "nics", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "(no NICs to show"));
	assert_int_equal(ctl(&fx.br, "nics", "--json", NULL, NULL), 0);
	assert_string_equal(out, "{\"transport\":null,\"nics\":[]}\n");
	assert_int_equal(ctl(&fx.br, "--json", "stats", NULL, NULL), 0);
	assert_non_null(strstr(out, ",\"nics\":[],"));

	assert_int_equal(ctl(&fx.br, "regions", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "region     worker"));
	snprintf(row, sizeof(row), "%#-10x %-8u %14u host ", fx.src.id,
		 kvb_worker_id(fx.ctx), SIZE);
	if (!strstr(out, row))
		fail_msg("no row '%s' in:\n%s", row, out);
	snprintf(row, sizeof(row), "%#-10x %-8u %14u host ", fx.dst.id,
		 kvb_worker_id(fx.ctx), SIZE);
	assert_non_null(strstr(out, row));
	assert_non_null(strstr(strstr(out, row), " live    -\n"));
	assert_int_equal(ctl(&fx.br, "regions", "--json", NULL, NULL), 0);
	assert_int_equal(out[0], '{');
	assert_true(stat_get(out, "live") >= 2);
	assert_int_equal(stat_get(out, "omitted"), 0);
	snprintf(row, sizeof(row), "{\"id\":%u,\"worker\":%u,\"size\":%u,",
		 fx.src.id, kvb_worker_id(fx.ctx), SIZE);
	assert_non_null(strstr(out, row));
	assert_non_null(strstr(out, "\"kind\":\"host\""));
	assert_non_null(strstr(out,
			       "\"rdma\":false,\"nic\":null,\"nic_index\":null,"
			       "\"why\":null}"));
}

static void test_watch(void **state)
{
	int64_t t0 = now_ns();
	unsigned n = 0;
	double ms;

	(void) state;
	assert_int_equal(ctl(&fx.br, "--watch=0.2", "--count=3", "stats", NULL),
			 0);
	/* the options may follow the command */
	assert_int_equal(ctl(&fx.br, "stats", "--watch", "0.2", "--count=3"),
			 0);
	ms = ms_since(t0);
	for (const char *p = out; (p = strstr(p, "--- stats ")); p++)
		n++;
	assert_int_equal(n, 3);
	assert_true(ms >= 2 * 2 * 200); /* two naps in each of the two runs */
	assert_int_equal(ctl(&fx.br, "--json", "--watch", "0.1", "--count=2"),
			 2); /* no command */
	assert_int_equal(ctl(&fx.br, "--watch", "0.1", "--count", "2"), 2);
	assert_int_equal(
		ctl(&fx.br, "workers", "--json", "--watch=0.1", "--count=2"),
		0);
	assert_non_null(strstr(strstr(out, "{\"workers\"") + 1,
			       "{\"workers\"")); /* twice */
}

static void test_usage(void **state)
{
	(void) state;
	assert_int_equal(ctl(&fx.br, "--version", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "kvbctl " KVB_VERSION_STRING));
	assert_int_equal(ctl(&fx.br, "-h", NULL, NULL, NULL), 0);
	assert_non_null(strstr(out, "workers"));
	assert_non_null(strstr(out, "--watch"));
	assert_int_equal(ctl(&fx.br, "--help", NULL, NULL, NULL), 0);
	assert_int_equal(ctl(&fx.br, "frobnicate", NULL, NULL, NULL), 2);
	assert_int_equal(ctl(&fx.br, "stats", "extra", NULL, NULL), 2);
	assert_int_equal(ctl(&fx.br, "--count", "2", "stats", NULL), 2);
	assert_int_equal(ctl(&fx.br, "--watch", "0", "stats", NULL), 2);
	assert_int_equal(ctl(&fx.br, "--watch", "x", "stats", NULL), 2);
	assert_int_equal(ctl(&fx.br, "--watch", "1", "--count", "0"), 2);
	assert_int_equal(ctl(&fx.br, NULL, NULL, NULL, NULL), 2);
	/* no broker there: exit 1 */
	{
		char *argv[] = {KVBCTL_BIN, "--socket", "/nonexistent/k.sock",
				"workers", NULL};

		assert_int_equal(run_cmd(argv, out, sizeof(out), 30), 1);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_workers),
		cmocka_unit_test(test_transfers),
		cmocka_unit_test(test_peers_none),
		cmocka_unit_test(test_peers),
		cmocka_unit_test(test_nics_regions),
		cmocka_unit_test(test_watch),
		cmocka_unit_test(test_usage),
	};

	fx.size = SIZE;
	fx.seed = 11;
	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

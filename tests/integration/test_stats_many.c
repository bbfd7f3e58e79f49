/* SPDX-License-Identifier: MIT */
/*
 * `kvbctl stats` with more workers than one reply has room for: the
 * per-worker rows that do not fit are counted (per_worker_omitted in JSON,
 * a last line in text), never cut in the middle, so the JSON stays whole.
 * (The text rows are shorter: 450 workers fit there.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "harness.h"
#include "proto.h"

#define NW 450 /* rows of ~190 bytes: more than 64 KiB */

static struct broker br; /* killed by teardown if a check failed */

static unsigned count(const char *s, const char *what)
{
	unsigned n = 0;

	for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

static void test_many_workers(void **state)
{
	static const char *const args[] = {"--max-workers", "500", NULL};
	const struct broker_opts o = {.args = args};
	static struct kvb_ctx *ctx[NW];
	static char js[KVB_MSG_MAX + 1];
	char *argv[] = {KVBCTL_BIN, "--socket", NULL, "stats", NULL};
	struct rlimit rl;
	int64_t omitted;
	size_t len;
	int rc;

	(void) state;
	/* three fds per attached worker */
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 4 * NW)
		skip();
	rl.rlim_cur = rl.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	rc = broker_start(&br, &o);
	if (rc) {
		broker_cleanup(&br);
		fail_msg("broker: %s", strerror(-rc));
	}
	for (unsigned i = 0; i < NW; i++) {
		ctx[i] = w_attach(&br, i & 1 ? KVB_ROLE_D : KVB_ROLE_P, i / 2,
				  NW / 2, 16);
		if (!ctx[i]) {
			broker_log_dump(&br);
			fail_msg("attach %u: %s", i, strerror(errno));
		}
	}
	assert_int_equal(broker_stats(&br, js, sizeof(js)), 0);
	len = strlen(js);
	assert_true(len > 1000);
	/* whole: ends as the object ends */
	assert_int_equal(js[len - 1], '\n');
	assert_int_equal(js[len - 2], '}');
	assert_int_equal(stat_get(js, "workers"), NW);
	omitted = stat_get(js, "per_worker_omitted");
	assert_true(omitted > 0);
	assert_int_equal(count(js, "{\"id\":") + (unsigned) omitted, NW);
	/* the text form's rows are shorter: all of them fit */
	argv[2] = br.sock;
	rc = run_cmd(argv, js, sizeof(js), 10);
	assert_int_equal(rc, 0);
	assert_null(strstr(js, "more workers: the reply is full)"));
	assert_true(count(js, "\n") > NW);
	for (unsigned i = 0; i < NW; i++)
		kvb_detach(ctx[i]);
	rc = broker_stop(&br);
	br.pid = 0;
	assert_int_equal(rc, 0);
	broker_cleanup(&br);
}

static int teardown(void **state)
{
	(void) state;
	if (br.pid > 0) {
		broker_kill(&br);
		broker_cleanup(&br);
	}
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_workers),
	};

	return cmocka_run_group_tests(tests, NULL, teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * kvb_stats: the broker's counters over an attached context's own control
 * socket. The JSON and table forms are kvbctl's; a buffer too small is
 * -ENOSPC with nothing in it; bad arguments are -EINVAL; the request is not
 * a worker's control request (control_requests does not count it); and it
 * works with every --max-workers slot taken (so does kvbctl's fresh
 * connection, which never takes a worker slot; a third attach is refused).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "proto.h"

#define SIZE (64u << 10)

static char buf[KVB_MSG_MAX];

static void test_json(void **state)
{
	int n;

	(void) state;
	n = kvb_stats(fx.ctx, 1, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal((size_t) n, strlen(buf));
	assert_int_equal(buf[0], '{');
	assert_int_equal(buf[n - 1], '\n'); /* one line */
	assert_int_equal(buf[n - 2], '}');
	assert_int_equal(stat_get(buf, "workers"), 1);
	assert_int_equal(stat_get(buf, "regions"), 2); /* the fixture's */
}

static void test_table(void **state)
{
	int n;

	(void) state;
	n = kvb_stats(fx.ctx, 0, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal((size_t) n, strlen(buf));
	assert_int_not_equal(buf[0], '{');
	assert_non_null(strstr(buf, "workers"));
}

static void test_small_buffer(void **state)
{
	char small[16];
	int n;

	(void) state;
	memset(small, 'x', sizeof(small));
	assert_int_equal(kvb_stats(fx.ctx, 1, small, sizeof(small)), -ENOSPC);
	assert_int_equal(small[0], '\0');
	/* exactly the text and its NUL fits */
	n = kvb_stats(fx.ctx, 1, buf, sizeof(buf));
	assert_true(n > 0);
	/* the counters move between calls (not these: nothing runs) */
	assert_int_equal(kvb_stats(fx.ctx, 1, buf, (unsigned long) n + 1), n);
	assert_int_equal(kvb_stats(fx.ctx, 1, buf, (unsigned long) n), -ENOSPC);
}

static void test_bad_args(void **state)
{
	(void) state;
	assert_int_equal(kvb_stats(NULL, 1, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(kvb_stats(fx.ctx, 1, NULL, 10), -EINVAL);
	assert_int_equal(kvb_stats(fx.ctx, 1, buf, 0), -EINVAL);
}

static void test_not_counted(void **state)
{
	int64_t before;

	(void) state;
	assert_true(kvb_stats(fx.ctx, 1, buf, sizeof(buf)) > 0);
	before = stat_get(buf, "control_requests");
	assert_true(before >= 0);
	for (int i = 0; i < 5; i++)
		assert_true(kvb_stats(fx.ctx, 1, buf, sizeof(buf)) > 0);
	assert_int_equal(stat_get(buf, "control_requests"), before);
	assert_int_equal(stat_get(buf, "messages_rejected"), 0);
}

static void test_max_workers_reached(void **state)
{
	static char other[KVB_MSG_MAX];
	struct kvb_ctx *second;

	(void) state;
	second = w_attach(&fx.br, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(second);
	/* both worker slots are taken: a third worker is refused, a stats
	 * connection (no HELLO, no slot) is still served */
	errno = 0;
	assert_null(w_attach(&fx.br, KVB_ROLE_D, 1, 2, 0));
	assert_int_equal(errno, ECONNREFUSED);
	assert_int_equal(broker_stats(&fx.br, other, sizeof(other)), 0);
	assert_true(kvb_stats(fx.ctx, 1, buf, sizeof(buf)) > 0);
	assert_int_equal(stat_get(buf, "workers"), 2);
	assert_true(kvb_stats(second, 1, buf, sizeof(buf)) > 0);
	assert_int_equal(stat_get(buf, "workers"), 2);
	kvb_detach(second);
}

int main(void)
{
	static const char *const args[] = {"--max-workers", "2", NULL};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_small_buffer),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_not_counted),
		cmocka_unit_test(test_max_workers_reached),
	};

	fx.args = args;
	fx.size = SIZE;
	fx.seed = 7;
	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * xnode_worker (the cross-node tests' worker) leaves the broker through
 * kvb_detach on every path out, its error paths included: before, an error
 * after the attach (here the --barrier directory is missing, and the peer
 * cannot be reached) returned from main() without detaching, which
 * LeakSanitizer reported as a 65,736-byte leak and the broker counted as a
 * lost worker.
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

/* Run xnode_worker against the fixture's broker with extra arguments;
 * its exit status. */
static int worker(const char *a1, const char *a2)
{
	char *argv[] = {(char *) XNODE_WORKER_BIN,
			"--role",
			"P",
			"--socket",
			fx.br.sock,
			"--peer",
			"127.0.0.1:1",
			"--layers",
			"2",
			"--blocks",
			"8",
			"--per-xfer",
			"2",
			"--xfers",
			"1",
			(char *) a1,
			(char *) a2,
			NULL};

	return run_cmd(argv, NULL, 0, 40);
}

static void test_error_path_detaches(void **state)
{
	int64_t lost = broker_stat(&fx.br, "workers_lost");

	(void) state;
	assert_int_equal(lost, 0);
	/* the barrier file cannot be made: an error after the regions */
	assert_int_equal(worker("--barrier", "/nonexistent/kvb-barrier"), 1);
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 5000), 0);
	/* it got as far as attaching and registering its regions */
	assert_true(broker_log_has(&fx.br, "attached: pid"));
	assert_int_equal(broker_stat(&fx.br, "workers_lost"), 0);
	assert_int_equal(broker_stat(&fx.br, "regions"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error_path_detaches),
	};

	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker's log-line rate limiter (broker/log.c): a burst a window, the
 * rest counted and handed out once their window ended; a window that never
 * ends (window 0). The clock is passed in: no sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define SEC 1000000000ll

/* Ask for n lines at `now`; returns how many were let through. */
static unsigned ask(struct kvb_ratelimit *rl, int64_t now, unsigned n)
{
	unsigned ok = 0;

	for (unsigned i = 0; i < n; i++)
		ok += (unsigned) kvb_ratelimit_ok(rl, now);
	return ok;
}

static void burst_then_summary(void **state)
{
	struct kvb_ratelimit rl;
	const int64_t t0 = 5 * SEC + 123;

	(void) state;
	kvb_ratelimit_init(&rl, 20, SEC);
	assert_int_equal(ask(&rl, t0, 25), 20);
	assert_int_equal(kvb_ratelimit_left(&rl), 0);
	/* the window has not ended: nothing to report yet */
	assert_int_equal(kvb_ratelimit_take(&rl, t0 + SEC - 1), 0);
	assert_int_equal(ask(&rl, t0 + SEC - 1, 3), 0);
	/* a second after its first line it ends: 8 suppressed, once */
	assert_int_equal(kvb_ratelimit_take(&rl, t0 + SEC), 8);
	assert_int_equal(kvb_ratelimit_take(&rl, t0 + SEC), 0);
	assert_int_equal(kvb_ratelimit_take(&rl, t0 + 10 * SEC), 0);
	/* the next window starts at its first line, however late */
	assert_int_equal(ask(&rl, t0 + 10 * SEC, 20), 20);
	assert_int_equal(ask(&rl, t0 + 11 * SEC - 1, 1), 0);
	assert_int_equal(ask(&rl, t0 + 11 * SEC, 1), 1);
	assert_int_equal(kvb_ratelimit_left(&rl), 19);
	assert_int_equal(kvb_ratelimit_take(&rl, t0 + 11 * SEC), 1);
}

/* A line asked for after a window ended ends it: its count is kept until
 * taken, and adds up with later windows'. */
static void ok_rolls_and_keeps(void **state)
{
	struct kvb_ratelimit rl;

	(void) state;
	kvb_ratelimit_init(&rl, 1, SEC);
	assert_int_equal(ask(&rl, 0, 4), 1);
	assert_int_equal(ask(&rl, SEC, 3), 1);
	assert_int_equal(ask(&rl, 2 * SEC + 1, 1), 1);
	/* 3 + 2 suppressed in the two ended windows */
	assert_int_equal(kvb_ratelimit_take(&rl, 2 * SEC + 1), 5);
	/* one line a second, counting from the line let through */
	assert_int_equal(ask(&rl, 3 * SEC, 1), 0);
	assert_int_equal(ask(&rl, 3 * SEC + 1, 1), 1);
	assert_int_equal(kvb_ratelimit_take(&rl, 3 * SEC + 1), 1);
	/* a window that suppressed nothing: nothing to report */
	assert_int_equal(kvb_ratelimit_take(&rl, 100 * SEC), 0);
}

static void one_window(void **state)
{
	struct kvb_ratelimit rl;

	(void) state;
	kvb_ratelimit_init(&rl, 16, 0);
	for (unsigned i = 0; i < 15; i++) {
		assert_int_equal(kvb_ratelimit_ok(&rl, 0), 1);
		assert_int_equal(kvb_ratelimit_left(&rl), 15 - i);
	}
	/* the last line let through: the caller can say so */
	assert_int_equal(kvb_ratelimit_ok(&rl, 0), 1);
	assert_int_equal(kvb_ratelimit_left(&rl), 0);
	/* never again, whatever the clock says */
	assert_int_equal(ask(&rl, 0, 100), 0);
	assert_int_equal(ask(&rl, INT64_MAX, 1), 0);
	assert_int_equal(kvb_ratelimit_take(&rl, INT64_MAX), 0);
}

static void none_through(void **state)
{
	struct kvb_ratelimit rl;

	(void) state;
	kvb_ratelimit_init(&rl, 0, SEC);
	assert_int_equal(ask(&rl, 0, 3), 0);
	assert_int_equal(kvb_ratelimit_take(&rl, SEC), 3);
}

/* Capture stderr (the log) into a temporary file; returns the saved fd. */
static int capture_begin(FILE **f)
{
	int saved = dup(2);

	*f = tmpfile();
	assert_non_null(*f);
	fflush(stderr);
	assert_int_equal(dup2(fileno(*f), 2), 2);
	return saved;
}

/* Restore stderr; the captured text into buf. */
static void capture_end(FILE *f, int saved, char *buf, size_t cap)
{
	size_t n;

	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

static unsigned lines(const char *s)
{
	unsigned n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* kvb_log_rl_at: one line a second per call site, the next line says how
 * many were suppressed; sites are independent; lines above the log level
 * are neither logged nor counted. */
static void log_per_site(void **state)
{
	static struct kvb_ratelimit a, b, dbg;
	const int64_t t0 = 7 * SEC;
	char buf[4096];
	unsigned n = 0;
	FILE *f;
	int saved;

	(void) state;
	kvb_log_level = KVB_LOG_INFO;
	saved = capture_begin(&f);
	for (int i = 0; i < 10; i++)
		n += (unsigned) kvb_log_rl_at(&a, t0 + i, KVB_LOG_WARN,
					      "site a %d", i);
	for (int i = 0; i < 5; i++)
		n += (unsigned) kvb_log_rl_at(&a, t0 + SEC / 2, KVB_LOG_WARN,
					      "site a late %d", i);
	n += (unsigned) kvb_log_rl_at(&b, t0 + 1, KVB_LOG_WARN, "site b");
	n += (unsigned) kvb_log_rl_at(&dbg, t0, KVB_LOG_DEBUG, "hidden");
	n += (unsigned) kvb_log_rl_at(&a, t0 + SEC, KVB_LOG_WARN,
				      "site a next");
	n += (unsigned) kvb_log_rl_at(&a, t0 + SEC + 1, KVB_LOG_WARN,
				      "site a again");
	capture_end(f, saved, buf, sizeof(buf));
	assert_int_equal(n, 3);
	assert_int_equal(lines(buf), 3);
	assert_non_null(strstr(buf, "site a 0\n"));
	assert_non_null(strstr(buf, "site b\n"));
	assert_non_null(strstr(buf, "site a next [14 more suppressed]\n"));
	assert_null(strstr(buf, "again"));
	assert_null(strstr(buf, "hidden"));
	assert_int_equal(dbg.held, 0);
}

/* The macro: a static limiter per call site, the real clock. */
static void log_macro_sites(void **state)
{
	char buf[4096];
	FILE *f;
	int saved;

	(void) state;
	saved = capture_begin(&f);
	for (int i = 0; i < 1000; i++) {
		log_warn_rl("flood one %d", i);
		log_warn_rl("flood two %d", i);
	}
	capture_end(f, saved, buf, sizeof(buf));
	/* a 2000-call loop takes far less than a second: one line each */
	assert_int_equal(lines(buf), 2);
	assert_non_null(strstr(buf, "flood one 0"));
	assert_non_null(strstr(buf, "flood two 0"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(burst_then_summary),
		cmocka_unit_test(ok_rolls_and_keeps),
		cmocka_unit_test(one_window),
		cmocka_unit_test(none_through),
		cmocka_unit_test(log_per_site),
		cmocka_unit_test(log_macro_sites),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

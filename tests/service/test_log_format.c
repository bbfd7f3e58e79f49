/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's log lines (broker/log.c): ISO 8601 UTC
 * timestamps with milliseconds, the text, json and journal formats, JSON
 * escaping, cut lines that still end well, --log-format, and telling the
 * journal's stream ($JOURNAL_STREAM) from any other stderr.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "options.h"

static void test_iso8601(void **state)
{
	struct timespec ts = {0, 0};
	char buf[32];

	(void) state;
	assert_int_equal(kvb_log_iso8601(buf, sizeof(buf), &ts), 24);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z");
	ts = (struct timespec){1796300000, 123999999}; /* ms cut, not rounded */
	kvb_log_iso8601(buf, sizeof(buf), &ts);
	assert_string_equal(buf, "2026-12-03T12:13:20.123Z");
	ts = (struct timespec){951825599, 5000000}; /* a leap day */
	kvb_log_iso8601(buf, sizeof(buf), &ts);
	assert_string_equal(buf, "2000-02-29T11:59:59.005Z");
	assert_int_equal(kvb_log_iso8601(buf, 24, &ts), 0); /* no room */
}

static const struct timespec T = {1796300000, 123000000};

static void test_text(void **state)
{
	char buf[256];
	size_t n;

	(void) state;
	n = kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_TEXT,
				KVB_LOG_INFO, &T, 0, "listening on /x.sock");
	assert_string_equal(buf, "kvbroker 2026-12-03T12:13:20.123Z info: "
				 "listening on /x.sock\n");
	assert_int_equal(n, strlen(buf));
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_TEXT, KVB_LOG_WARN,
			    &T, 7, "refused");
	assert_string_equal(buf, "kvbroker 2026-12-03T12:13:20.123Z warn: "
				 "refused [7 more suppressed]\n");
}

static void test_journal(void **state)
{
	static const char *const want[] = {"<3>error: m\n", "<4>warn: m\n",
					   "<6>info: m\n", "<7>debug: m\n"};
	char buf[128];

	(void) state;
	for (int l = KVB_LOG_ERROR; l <= KVB_LOG_DEBUG; l++) {
		kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JOURNAL, l,
				    &T, 0, "m");
		assert_string_equal(buf, want[l]);
	}
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JOURNAL, KVB_LOG_WARN,
			    &T, 3, "m");
	assert_string_equal(buf, "<4>warn: m [3 more suppressed]\n");
}

static void test_json(void **state)
{
	char buf[256];

	(void) state;
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JSON, KVB_LOG_DEBUG,
			    &T, 0, "plain");
	assert_string_equal(buf, "{\"ts\":\"2026-12-03T12:13:20.123Z\","
				 "\"level\":\"debug\",\"msg\":\"plain\"}\n");
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JSON, KVB_LOG_ERROR,
			    &T, 12, "a \"q\" \\ b\nc\td\001e");
	assert_string_equal(buf,
			    "{\"ts\":\"2026-12-03T12:13:20.123Z\",\"level\":"
			    "\"error\",\"msg\":\"a \\\"q\\\" \\\\ b\\nc\\td"
			    "\\u0001e\",\"suppressed\":12}\n");
}

/* UTF-8 passes; bytes that are not UTF-8 become U+FFFD escapes. */
static void test_json_utf8(void **state)
{
	char buf[256];

	(void) state;
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JSON, KVB_LOG_INFO,
			    &T, 0, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
	assert_non_null(strstr(buf, "\"msg\":\"caf\xc3\xa9 \xe2\x82\xac "
				    "\xf0\x9f\x98\x80\"}"));
	/* stray continuation, overlong '/', a surrogate, a cut sequence */
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JSON, KVB_LOG_INFO,
			    &T, 0,
			    "a\x80"
			    "b\xc0\xaf"
			    "c\xed\xa0\x80"
			    "d\xe2\x82");
	assert_non_null(strstr(buf, "\"msg\":\"a\\ufffdb\\ufffd\\ufffdc"
				    "\\ufffd\\ufffd\\ufffdd\\ufffd\\ufffd\"}"));
	/* text lines keep the bytes as they are */
	kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_TEXT, KVB_LOG_INFO,
			    &T, 0,
			    "a\x80"
			    "b");
	assert_non_null(strstr(buf, "info: a\x80"
				    "b\n"));
}

/* A message longer than the line: cut, but the line still ends (the
 * suppressed count and the newline kept; json still closes, and no escape
 * is cut in half). */
static void test_cut(void **state)
{
	char msg[600], buf[160];
	size_t n;

	(void) state;
	memset(msg, '"', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	n = kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_TEXT,
				KVB_LOG_INFO, &T, 5, msg);
	assert_true(n < sizeof(buf));
	assert_int_equal(n, strlen(buf));
	assert_string_equal(buf + n - 21, " [5 more suppressed]\n");
	n = kvb_log_format_line(buf, sizeof(buf), KVB_LOG_FMT_JSON,
				KVB_LOG_INFO, &T, 5, msg);
	assert_true(n < sizeof(buf));
	assert_int_equal(n, strlen(buf));
	assert_string_equal(buf + n - 18, "\",\"suppressed\":5}\n");
	/* the escaped quotes come whole: an even run of backslash-quote */
	assert_non_null(strstr(buf, "\"msg\":\"\\\""));
	assert_int_equal(buf[n - 19], '"');
	assert_int_equal(buf[n - 20], '\\');
}

static void test_parse(void **state)
{
	struct kvb_options o;
	char err[256] = "", prog[] = "kvbroker", a1[] = "--log-format",
	     a2[] = "journal", b2[] = "syslog";
	char *argv[] = {prog, a1, a2, NULL};

	(void) state;
	assert_int_equal(kvb_log_format_parse("auto"), KVB_LOG_FMT_AUTO);
	assert_int_equal(kvb_log_format_parse("text"), KVB_LOG_FMT_TEXT);
	assert_int_equal(kvb_log_format_parse("json"), KVB_LOG_FMT_JSON);
	assert_int_equal(kvb_log_format_parse("journal"), KVB_LOG_FMT_JOURNAL);
	assert_int_equal(kvb_log_format_parse("JSON"), -EINVAL);
	setenv("KVB_SOCKET", "/tmp/kvb-log-test.sock", 1);
	assert_int_equal(kvb_options_parse(&o, 3, argv, err, sizeof(err)), 0);
	assert_int_equal(o.log_format, KVB_LOG_FMT_JOURNAL);
	argv[1] = a1;
	argv[2] = b2;
	assert_int_equal(kvb_options_parse(&o, 3, argv, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "--log-format: 'syslog'"));
}

/* auto: journal only when stderr is the stream $JOURNAL_STREAM names. */
static void test_journal_stream(void **state)
{
	struct stat st;
	char v[64];

	(void) state;
	assert_int_equal(fstat(STDERR_FILENO, &st), 0);
	unsetenv("JOURNAL_STREAM");
	assert_int_equal(kvb_log_journal_stream(), 0);
	kvb_log_set_format(KVB_LOG_FMT_AUTO);
	assert_int_equal(kvb_log_format, KVB_LOG_FMT_TEXT);
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long) st.st_dev,
		 (unsigned long long) st.st_ino);
	setenv("JOURNAL_STREAM", v, 1);
	assert_int_equal(kvb_log_journal_stream(), 1);
	kvb_log_set_format(KVB_LOG_FMT_AUTO);
	assert_int_equal(kvb_log_format, KVB_LOG_FMT_JOURNAL);
	/* inherited by a child whose stderr went elsewhere: not the journal */
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long) st.st_dev,
		 (unsigned long long) st.st_ino + 1);
	setenv("JOURNAL_STREAM", v, 1);
	assert_int_equal(kvb_log_journal_stream(), 0);
	setenv("JOURNAL_STREAM", "garbage", 1);
	assert_int_equal(kvb_log_journal_stream(), 0);
	/* an explicit format stays */
	kvb_log_set_format(KVB_LOG_FMT_JSON);
	assert_int_equal(kvb_log_format, KVB_LOG_FMT_JSON);
	unsetenv("JOURNAL_STREAM");
	kvb_log_set_format(KVB_LOG_FMT_TEXT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_iso8601),
		cmocka_unit_test(test_text),
		cmocka_unit_test(test_journal),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_json_utf8),
		cmocka_unit_test(test_cut),
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_journal_stream),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker under a Type=notify unit, without systemd: $NOTIFY_SOCKET names
 * a datagram socket this test owns. READY=1 (with the socket in STATUS=)
 * comes once the socket answers, WATCHDOG=1 keeps coming at half of
 * $WATCHDOG_USEC while the broker sleeps idle, STOPPING=1 at SIGTERM. Also:
 * the broker started from a --config file (json log lines), and kvbctl's
 * routine stats connection logged at debug, not info. Exits 77 in a build
 * without libsystemd.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define WATCHDOG_USEC 400000 /* a ping every 200 ms */

static char dir[64], npath[96], conf[96];
static int nfd = -1;

/* Next notification within ms into buf; its length, 0 on timeout. */
static int recv_note(char *buf, size_t cap, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	ssize_t n;

	setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = recv(nfd, buf, cap - 1, 0);
	if (n < 0)
		return 0;
	buf[n] = '\0';
	return (int) n;
}

static int setup(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	FILE *f;

	(void) state;
	snprintf(dir, sizeof(dir), "/tmp/kvbsd-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(npath, sizeof(npath), "%s/notify", dir);
	snprintf(conf, sizeof(conf), "%s/kvbroker.conf", dir);
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, npath);
	if (nfd < 0 || bind(nfd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
		return -1;
	f = fopen(conf, "w");
	if (!f)
		return -1;
	fputs("# as the unit's config would say\n"
	      "log-format = json\n"
	      "log-level = info\n"
	      "busy-poll-us = 20\n",
	      f);
	fclose(f);
	return 0;
}

static int teardown(void **state)
{
	(void) state;
	if (nfd >= 0)
		close(nfd);
	unlink(npath);
	unlink(conf);
	rmdir(dir);
	return 0;
}

static void test_notify(void **state)
{
	const char *args[] = {"--config", conf, NULL};
	struct broker_opts o = {.args = args};
	struct broker b;
	char buf[512], want[256];
	int n, pings = 0, stopping = 0;
	int64_t t0;

	(void) state;
	setenv("NOTIFY_SOCKET", npath, 1);
	setenv("WATCHDOG_USEC", "400000", 1);
	unsetenv("WATCHDOG_PID");
	assert_int_equal(broker_start(&b, &o), 0);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");

	/* the socket answered (broker_start): READY=1 came before that */
	n = recv_note(buf, sizeof(buf), 100);
	assert_true(n > 0);
	assert_non_null(strstr(buf, "READY=1"));
	snprintf(want, sizeof(want), "STATUS=listening on %s", b.sock);
	assert_non_null(strstr(buf, want));

	/* idle for 1.5 s: about 7 pings of 200 ms; a loaded machine may
	 * lose some time, none may lose most of them */
	t0 = now_ns();
	while (ms_since(t0) < 1500) {
		if (recv_note(buf, sizeof(buf), 100) &&
		    !strcmp(buf, "WATCHDOG=1"))
			pings++;
	}
	if (pings < 3)
		fail_msg("%d WATCHDOG=1 in 1.5 s at a 200 ms period", pings);

	assert_int_equal(broker_stop(&b), 0);
	while (recv_note(buf, sizeof(buf), 500))
		if (strstr(buf, "STOPPING=1"))
			stopping = 1;
	assert_true(stopping);

	/* the config file was read: json lines */
	assert_true(broker_log_has(&b, "{\"ts\":\"20"));
	assert_true(
		broker_log_has(&b, "\"level\":\"info\",\"msg\":\"listening"));
	assert_true(
		broker_log_has(&b, "systemd watchdog: a ping every 200 ms"));
	/* broker_start's stats query is kvbctl's: not at info */
	if (broker_log_has(&b, "closed: disconnected")) {
		broker_log_dump(&b);
		fail_msg("a stats connection was logged at info");
	}
	broker_cleanup(&b);
}

/* At debug the stats connection is logged; without $NOTIFY_SOCKET there is
 * no notification and no watchdog. */
static void test_debug_no_notify(void **state)
{
	const char *args[] = {"--config",     conf,   "--log-level", "debug",
			      "--log-format", "text", NULL};
	struct broker_opts o = {.args = args};
	struct broker b;
	char buf[256];

	(void) state;
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(broker_start(&b, &o), 0);
	assert_int_equal(recv_note(buf, sizeof(buf), 300), 0);
	assert_int_equal(broker_stop(&b), 0);
	assert_true(broker_log_has(&b, "debug: connection from pid"));
	assert_true(broker_log_has(&b, "closed: disconnected"));
	assert_true(broker_log_has(&b, "Z info: listening on"));
	assert_false(broker_log_has(&b, "watchdog"));
	broker_cleanup(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_notify),
		cmocka_unit_test(test_debug_no_notify),
	};

#ifndef KVB_HAVE_SYSTEMD
	printf("SKIP: kvbroker built without libsystemd (no sd_notify)\n");
	return 77;
#endif
	return cmocka_run_group_tests(tests, setup, teardown);
}

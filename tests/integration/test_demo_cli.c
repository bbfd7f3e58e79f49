/* SPDX-License-Identifier: MIT */
/*
 * kvb-demo and kvbctl from outside: a worker that cannot start or dies ends
 * the demo in bounded time (exit 1, no worker left behind), the demo killed
 * takes its workers with it, bad arguments are refused with a message
 * (exit 2), a --json file that cannot be written is an error (exit 1),
 * more requests than the broker's transfer table holds wait their turn
 * instead of failing, and kvbctl takes its options after `stats` and
 * refuses a socket path that does not fit instead of cutting it.
 *
 * The commands write stdout and stderr into one pipe that their workers
 * inherit: EOF on it means the demo and every worker have exited.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

static struct broker br; /* killed by teardown if a check failed */
static char out[1 << 16];

struct cmd {
	pid_t pid;
	int fd;
};

static void cmd_start(char *const argv[], struct cmd *c)
{
	int pfd[2];

	assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(pfd[1]);
	c->fd = pfd[0];
}

/*
 * Read the command's output until EOF (it and all it started are gone) and
 * reap it, all within timeout_ms. Returns its exit status (128 + signal),
 * -ETIMEDOUT when it was still running (it is killed), -EBUSY when it exited
 * but something it started still holds the output open.
 */
static int cmd_finish(struct cmd *c, int timeout_ms, double *ms)
{
	int64_t t0 = now_ns();
	size_t n = 0;
	int status, rc = -ETIMEDOUT;
	pid_t r;

	for (;;) {
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		ssize_t k;

		if (ms_since(t0) > timeout_ms)
			break;
		if (poll(&p, 1, 50) <= 0)
			continue;
		k = read(c->fd, out + n, sizeof(out) - 1 - n);
		if (k <= 0) {
			rc = 0;
			break;
		}
		n += (size_t) k;
		if (n == sizeof(out) - 1)
			n = 0; /* keep the tail */
	}
	out[n] = '\0';
	close(c->fd);
	if (ms)
		*ms = ms_since(t0);
	/* EOF comes a moment before the exit status */
	while ((r = waitpid(c->pid, &status, WNOHANG)) == 0 &&
	       ms_since(t0) < timeout_ms)
		usleep(2000);
	if (r != c->pid) {
		kill(c->pid, SIGKILL);
		waitpid(c->pid, &status, 0);
		return -ETIMEDOUT;
	}
	if (rc)
		return -EBUSY;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run(char *const argv[], int timeout_ms)
{
	struct cmd c;

	cmd_start(argv, &c);
	return cmd_finish(&c, timeout_ms, NULL);
}

static void start_broker(const char *const *args)
{
	const struct broker_opts o = {.args = args};
	int rc = broker_start(&br, &o);

	if (rc) {
		broker_cleanup(&br);
		fail_msg("broker: %s", strerror(-rc));
	}
}

static void stop_broker(void)
{
	/* every worker of the demo detached or was found gone */
	if (broker_wait_stat(&br, "workers", 0, 5000 + SLACK)) {
		broker_log_dump(&br);
		fail_msg("workers still attached to the broker");
	}
	assert_int_equal(broker_stop(&br), 0);
	br.pid = 0;
	broker_cleanup(&br);
}

/* The first child of pid found in /proc; 0 if none. */
static pid_t child_of(pid_t pid)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = 0;

	assert_non_null(d);
	while (!found && (e = readdir(d))) {
		char path[300], buf[512], *p;
		FILE *f;
		int ppid;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
		if (p && sscanf(p, ") %*c %d", &ppid) == 1 && ppid == pid)
			found = atoi(e->d_name);
		fclose(f);
	}
	closedir(d);
	return found;
}

/* One D worker refused by the broker: before, the other D held the ready
 * pipe open and the demo waited forever. */
static void test_d_refused(void **state)
{
	static const char *const args[] = {"--max-workers", "1", NULL};
	char *argv[] = {KVB_DEMO_BIN, "--socket",   NULL, "--p",
			"1",	      "--d",	    "2",  "--layers",
			"2",	      "--requests", "4",  NULL};
	struct cmd c;
	double ms;
	int rc;

	(void) state;
	start_broker(args);
	argv[2] = br.sock;
	cmd_start(argv, &c);
	rc = cmd_finish(&c, 5000 + SLACK, &ms);
	fprintf(stderr, "kvb-demo: %d in %.0f ms\n%s", rc, ms, out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(out, "Connection refused"));
	assert_non_null(strstr(out, "a D worker failed to start"));
	stop_broker();
}

/* A demo of several seconds, killed 300 ms in: 4 workers, 2 GiB per P
 * worker (5-12 s on an idle fast host; with 2 layers instead of 32 it
 * took 0.4 s there and was sometimes over before the kill). */
static void start_long_demo(struct cmd *c)
{
	char *argv[] = {KVB_DEMO_BIN, "--socket",   br.sock, "--p",
			"2",	      "--d",	    "2",     "--layers",
			"32",	      "--blocks",   "16",    "--block-bytes",
			"4096",	      "--requests", "1024",  NULL};

	start_broker(NULL);
	cmd_start(argv, c);
	if (broker_wait_stat(&br, "workers", 4, 10000 + SLACK)) {
		kill(c->pid, SIGKILL);
		cmd_finish(c, 5000, NULL);
		fail_msg("the demo's 4 workers did not attach:\n%s", out);
	}
	usleep(300 * 1000); /* into the transfers */
}

/* A worker dies mid-run: the demo stops the others and exits 1 at once,
 * not after the survivors' 60 s completion timeout. */
static void test_worker_killed(void **state)
{
	struct cmd c;
	pid_t w;
	double ms;
	int rc;

	(void) state;
	start_long_demo(&c);
	w = child_of(c.pid);
	assert_true(w > 0);
	kill(w, SIGKILL);
	rc = cmd_finish(&c, 5000 + SLACK, &ms);
	fprintf(stderr, "kvb-demo: %d in %.0f ms\n%s", rc, ms, out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(out, "killed by signal 9"));
	assert_non_null(strstr(out, "stopping the other workers"));
	stop_broker();
}

/* The demo itself killed: its workers go with it (PR_SET_PDEATHSIG). */
static void test_demo_killed(void **state)
{
	struct cmd c;
	double ms;
	int rc;

	(void) state;
	start_long_demo(&c);
	kill(c.pid, SIGKILL);
	rc = cmd_finish(&c, 2000 + SLACK, &ms);
	fprintf(stderr, "kvb-demo: %d in %.0f ms\n", rc, ms);
	assert_int_equal(rc, 128 + SIGKILL); /* not -EBUSY: no worker left */
	stop_broker();
}

/* More requests than the broker's transfer table holds (16383, and each D
 * worker opens every request it expects): the D workers keep a window of
 * them open and the rest wait their turn; the P workers' --inflight past
 * that window is cut to it. Before, the D workers' opens failed with
 * -ENOSPC. */
static void test_many_requests(void **state)
{
	char *argv[] = {KVB_DEMO_BIN, "--socket",   br.sock, "--p",
			"2",	      "--d",	    "2",     "--layers",
			"1",	      "--blocks",   "1",     "--block-bytes",
			"64",	      "--requests", "20000", "--inflight",
			"65536",      "--quiet",    NULL};
	int rc;

	(void) state;
	start_broker(NULL);
	rc = run(argv, 60000);
	if (rc) {
		broker_log_dump(&br);
		fail_msg("kvb-demo --requests 20000: exit %d\n%s", rc, out);
	}
	assert_non_null(strstr(out, "20000 requests, up to 4095 open per D"));
	assert_non_null(strstr(out, "all bytes verified"));
	assert_int_equal(broker_stat(&br, "transfers_done"), 4 * 20000);
	assert_int_equal(broker_stat(&br, "transfers_failed"), 0);
	stop_broker();
}

/* More P ranks than D ranks: P0 and P1 share D0, each in its own part of
 * D0's regions (they wrote the same blocks, and D0 found 655360 bad bytes);
 * with 3 P and 2 D, D0 checks P0's and P2's bytes, D1 P1's */
static void test_more_p_than_d(void **state)
{
	char *argv[] = {KVB_DEMO_BIN, "--socket",   br.sock, "--p",
			"2",	      "--d",	    "1",     "--layers",
			"2",	      "--blocks",   "8",     "--block-bytes",
			"4096",	      "--requests", "10",    NULL};
	int rc;

	(void) state;
	start_broker(NULL);
	for (int round = 0; round < 2; round++) {
		rc = run(argv, 60000);
		if (rc) {
			broker_log_dump(&br);
			fail_msg("kvb-demo --p %s --d %s: exit %d\n%s", argv[4],
				 argv[6], rc, out);
		}
		assert_non_null(strstr(out,
				       "D0: 10 requests, 0 failed; 1310720 "
				       "bytes of the completed ones "
				       "verified, 0 wrong"));
		assert_non_null(strstr(out, "all bytes verified"));
		argv[4] = "3";
		argv[6] = "2";
	}
	assert_non_null(strstr(out,
			       "D1: 10 requests, 0 failed; 655360 bytes of the "
			       "completed ones verified, 0 wrong"));
	stop_broker();
}

static void expect(char *const argv[], int want, const char *msg)
{
	int rc = run(argv, 10000);

	if (rc != want || (msg && !strstr(out, msg)))
		fail_msg("%s %s: exit %d (want %d), output:\n%s", argv[1],
			 argv[2] ? argv[2] : "", rc, want, out);
}

static void test_demo_args(void **state)
{
	static const char *const bad[][2] = {
		{"--blocks", "-1"},
		{"--blocks", "0"},
		{"--blocks", " 5"},
		{"--blocks", "5x"},
		{"--p", "65"},
		{"--d", "+1"},
		{"--inflight", "99999999999999999999"},
		{"--requests", "65537"},
		{"--block-bytes", "0x4000000000000000"},
		{"--layers", "65536"},
	};
	char *nosock = "/nonexistent/kvb.sock";
	char longsock[200];

	(void) state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *argv[] = {KVB_DEMO_BIN,
				(char *) bad[i][0],
				(char *) bad[i][1],
				"--socket",
				nosock,
				NULL};

		expect(argv, 2, "wants a number from 1 to");
	}
	{
		/* each in range, the product past 64 bits */
		char *argv[] = {KVB_DEMO_BIN, "--layers",      "65535",
				"--requests", "65536",	       "--blocks",
				"1048576",    "--block-bytes", "1073741824",
				"--socket",   nosock,	       NULL};

		expect(argv, 2, "more memory");
	}
	{
		char *argv[] = {KVB_DEMO_BIN, "--socket", nosock, "extra",
				NULL};

		expect(argv, 2, "unexpected argument 'extra'");
	}
	memset(longsock, 'x', sizeof(longsock) - 1);
	longsock[sizeof(longsock) - 1] = '\0';
	{
		char *argv[] = {KVB_DEMO_BIN, "--socket", longsock, NULL};

		expect(argv, 2, "socket path too long");
	}
	{
		char *argv[] = {
			KVB_DEMO_BIN,	       "--socket", nosock, "--json",
			"/nonexistent/x.json", NULL};

		expect(argv, 1, "/nonexistent/x.json: No such file");
	}
	{
		char *argv[] = {KVB_DEMO_BIN, "--help", NULL};

		expect(argv, 0, "Usage: kvb-demo");
	}
}

static void test_kvbctl_args(void **state)
{
	char p108[109], p107[108];

	(void) state;
	start_broker(NULL);
	{
		char *argv[] = {KVBCTL_BIN, "stats",  "--socket",
				br.sock,    "--json", NULL};

		expect(argv, 0, "\"workers\":0");
	}
	{
		char *argv[] = {KVBCTL_BIN, "--json", "stats",
				"--socket", br.sock,  NULL};

		expect(argv, 0, "\"workers\":0");
	}
	{
		char *argv[] = {KVBCTL_BIN, "stats", "--help", NULL};

		expect(argv, 0, "Usage: kvbctl");
	}
	{
		char *argv[] = {KVBCTL_BIN, "--socket", br.sock,
				"stats",    "extra",	NULL};

		expect(argv, 2, "unknown argument 'extra'");
	}
	{
		char *argv[] = {KVBCTL_BIN, "--socket", br.sock, "frob", NULL};

		expect(argv, 2, "unknown command 'frob'");
	}
	{
		char *argv[] = {KVBCTL_BIN, "--socket", "", "stats", NULL};

		expect(argv, 2, "empty path");
	}
	/* 108 bytes do not fit sun_path; 107 do, and are used whole */
	memset(p108, 'y', sizeof(p108) - 1);
	p108[sizeof(p108) - 1] = '\0';
	memcpy(p107, p108, sizeof(p107) - 1);
	p107[sizeof(p107) - 1] = '\0';
	{
		char *argv[] = {KVBCTL_BIN, "stats", "--socket", p108, NULL};

		expect(argv, 2, "socket path too long");
	}
	{
		char *argv[] = {KVBCTL_BIN, "stats", "--socket", p107, NULL};

		expect(argv, 1, p107);
	}
	stop_broker();
}

static int teardown(void **state)
{
	(void) state;
	if (br.pid > 0) {
		broker_kill(&br);
		broker_cleanup(&br);
		br.pid = 0;
	}
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_d_refused, teardown),
		cmocka_unit_test_teardown(test_worker_killed, teardown),
		cmocka_unit_test_teardown(test_demo_killed, teardown),
		cmocka_unit_test_teardown(test_many_requests, teardown),
		cmocka_unit_test_teardown(test_more_p_than_d, teardown),
		cmocka_unit_test(test_demo_args),
		cmocka_unit_test_teardown(test_kvbctl_args, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker refuses to start, at once, with a log line saying why, when its
 * options cannot work. Exit status 2 (a configuration error, which the
 * systemd unit does not restart): --transport tcp or rdma without --host-ip
 * (the combination; with --host-ip, or with local, it starts), a --host-ip
 * or --metrics-listen address not on this node, a --metrics-listen that is
 * not ADDR:PORT, a --cluster-key file that is missing or not a regular file,
 * a config file that is not a regular file (a FIFO, /dev/zero), larger than
 * 1 MiB or unreadable, a bad option (an --rdma-dev list), an unknown key
 * (its bytes escaped in the message). Exit status 1 (may pass on its own):
 * a socket another broker serves (which keeps serving), a handshake or data
 * port already taken, an rdma device that is not there, a gpu transport
 * without a GPU backend. Nothing is left listening on its socket path.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* "at once": a refusal comes before anything waits on the network */
#define REFUSE_MS 5000

/* A TCP socket bound to 127.0.0.1 on an ephemeral port; listening when
 * `hold` (the port is then taken), else closed (the port is most likely
 * free for a moment). Returns the fd (or -1 when closed), port in *port. */
static int tcp_port(int hold, char *port, size_t len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *) &sa, &sl), 0);
	snprintf(port, len, "%u", ntohs(sa.sin_port));
	if (hold) {
		assert_int_equal(listen(fd, 1), 0);
		return fd;
	}
	close(fd);
	return -1;
}

/* Start the broker with args; it must exit `want` within REFUSE_MS with
 * `why` in its log and no socket left behind. */
static void refused_with(int want, const char *why, const char *const *args)
{
	const struct broker_opts o = {.args = args};
	struct broker b;
	int64_t t0 = now_ns();
	int rc = broker_run_to_exit(&b, &o, REFUSE_MS);
	double ms = ms_since(t0);

	fprintf(stderr, "refused in %.0f ms (exit %d): %s\n", ms, rc, why);
	if (rc != want || !broker_log_has(&b, why)) {
		broker_log_dump(&b);
		broker_cleanup(&b);
		if (rc == -ETIMEDOUT)
			fail_msg("still running after %d ms, want a refusal "
				 "'%s'",
				 REFUSE_MS, why);
		fail_msg("exit %d, want %d with '%s' in the log", rc, want,
			 why);
	}
	assert_true(broker_log_has(&b, "startup failed"));
	assert_int_not_equal(access(b.sock, F_OK), 0);
	broker_cleanup(&b);
}

/* A failure that may pass on its own (a port taken): exit 1, restarted. */
static void refused(const char *why, const char *const *args)
{
	refused_with(1, why, args);
}

/* A failure of the configuration itself: exit 2 (the unit's
 * RestartPreventExitStatus=2: not restarted in a loop). */
static void refused_config(const char *why, const char *const *args)
{
	refused_with(2, why, args);
}

/* Start the broker with args; it must serve, and stop with 0. */
static void starts(const char *const *args)
{
	const struct broker_opts o = {.args = args};
	struct broker b;

	assert_int_equal(broker_start(&b, &o), 0);
	assert_int_equal(broker_stat(&b, "workers"), 0);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

static void test_tcp_needs_host_ip(void **state)
{
	static const char *const tcp[] = {"--transport", "tcp", NULL};
	static const char *const local[] = {"--transport", "local", NULL};
	char hs[8];
	const char *const tcp_ip[] = {
		"--transport",	    "tcp", "--host-ip", "127.0.0.1",
		"--handshake-port", hs,	   NULL};

	(void) state;
	refused_config("transport tcp needs --host-ip", tcp);
	/* the combination, not the transport: with --host-ip it starts,
	 * and without one a same-node transport does */
	tcp_port(0, hs, sizeof(hs));
	starts(tcp_ip);
	starts(local);
}

static void test_rdma_needs_host_ip(void **state)
{
	static const char *const rdma[] = {"--transport", "rdma", NULL};
	static const char *const dev[] = {"--transport", "rdma", "--rdma-dev",
					  "rxe0", NULL};

	(void) state;
	refused_config("transport rdma needs --host-ip", rdma);
	/* refused before any device is looked at */
	refused_config("transport rdma needs --host-ip", dev);
}

/* A second broker on a served socket leaves it to the first. */
static void test_socket_in_use(void **state)
{
	struct broker first;
	const char *args[] = {"--socket", NULL, NULL};

	(void) state;
	assert_int_equal(broker_start(&first, NULL), 0);
	args[1] = first.sock;
	refused("another broker is already serving", args);
	assert_int_equal(broker_stat(&first, "workers"), 0);
	{
		struct kvb_ctx *c = w_attach(&first, KVB_ROLE_P, 0, 1, 0);

		assert_non_null(c);
		kvb_detach(c);
	}
	assert_int_equal(broker_stop(&first), 0);
	broker_cleanup(&first);
}

/* --host-ip of another node (TEST-NET-3, on no interface here). */
static void test_host_ip_not_here(void **state)
{
	static const char *const args[] = {"--transport", "tcp", "--host-ip",
					   "203.0.113.77", NULL};

	(void) state;
	refused_config("transport tcp: cannot listen on 203.0.113.77", args);
}

static void test_ports_taken(void **state)
{
	char hs[8], busy[8];
	const char *const hs_taken[] = {
		"--transport",	    "tcp", "--host-ip", "127.0.0.1",
		"--handshake-port", busy,  NULL};
	const char *const data_taken[] = {"--transport",
					  "tcp",
					  "--host-ip",
					  "127.0.0.1",
					  "--handshake-port",
					  hs,
					  "--data-port",
					  busy,
					  NULL};
	char want[96];
	int fd;

	(void) state;
	fd = tcp_port(1, busy, sizeof(busy));
	snprintf(want, sizeof(want), "handshake port tcp://127.0.0.1:%s", busy);
	refused(want, hs_taken);
	tcp_port(0, hs, sizeof(hs));
	snprintf(want, sizeof(want),
		 "transport tcp: cannot listen on "
		 "127.0.0.1:%s",
		 busy);
	refused(want, data_taken);
	close(fd);
}

static void test_rdma_device_missing(void **state)
{
	char hs[8];
	const char *const args[] = {"--transport",
				    "rdma",
				    "--host-ip",
				    "127.0.0.1",
				    "--handshake-port",
				    hs,
				    "--rdma-dev",
				    "kvb-no-such-dev",
				    NULL};

	(void) state;
	tcp_port(0, hs, sizeof(hs));
	/* "unavailable: <why>", or "this build has no libibverbs" */
	refused("transport rdma: ", args);
}

/* A bad option is a usage error: exit 2 with the option's message. */
static void usage_error(const char *why, const char *const *args)
{
	const struct broker_opts o = {.args = args};
	struct broker b;
	int rc = broker_run_to_exit(&b, &o, REFUSE_MS);

	if (rc != 2 || !broker_log_has(&b, why)) {
		broker_log_dump(&b);
		broker_cleanup(&b);
		fail_msg("exit %d, want 2 with '%s' in the log", rc, why);
	}
	broker_cleanup(&b);
}

static void test_rdma_dev_list_bad(void **state)
{
	static const char *const dup[] = {"--rdma-dev", "rxe0,rxe1,rxe0", NULL};
	static const char *const empty[] = {"--rdma-dev", "rxe0,,rxe1", NULL};
	static const char *const many[] = {"--rdma-dev", "a,b,c,d,e,f,g,h,i",
					   NULL};
	static const char *const qps[] = {"--max-qps", "-1", NULL};

	(void) state;
	usage_error("kvbroker: --rdma-dev: 'rxe0' named twice", dup);
	usage_error("--rdma-dev: 'rxe0,,rxe1' has an empty device name", empty);
	usage_error("--rdma-dev: more than 8 devices", many);
	usage_error("--max-qps: bad value '-1'", qps);
}

/* Configuration errors that only the start finds: exit 2, at once. */
static void test_config_found_at_start(void **state)
{
	static const char *const port[] = {"--metrics-listen", "1.2.3.4:99999",
					   NULL};
	static const char *const missing[] = {
		"--cluster-key", "/nonexistent/kvb-cluster.key", NULL};
	static const char *const dev[] = {"--cluster-key", "/dev/zero", NULL};
	static const char *const away[] = {"--metrics-listen",
					   "203.0.113.77:19476", NULL};

	(void) state;
	usage_error("--metrics-listen 1.2.3.4:99999: not ADDR:PORT", port);
	usage_error("--cluster-key /nonexistent/kvb-cluster.key: No such file",
		    missing);
	usage_error("--cluster-key /dev/zero: not a regular file", dev);
	/* found when it binds: an address of another node */
	refused_config("startup failed: Cannot assign requested address", away);
}

/* --config FILE: only a regular file of at most 1 MiB, read without error;
 * a FIFO or a device is refused at once (a FIFO used to hang the start,
 * /dev/zero grew the broker to 1 GB). */
static void test_config_file_kinds(void **state)
{
	char dir[] = "/tmp/kvb-cfg-XXXXXX", fifo[64], big[64], bin[64];
	const char *args[] = {"--config", NULL, NULL};
	FILE *f;

	(void) state;
	assert_non_null(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/fifo.conf", dir);
	snprintf(big, sizeof(big), "%s/big.conf", dir);
	snprintf(bin, sizeof(bin), "%s/bin.conf", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	args[1] = fifo;
	usage_error(": not a regular file", args);
	args[1] = "/dev/zero";
	usage_error("/dev/zero: not a regular file", args);
	/* a read error is an error, not the end of the file */
	args[1] = "/proc/self/mem";
	usage_error("/proc/self/mem: read: Input/output error", args);
	f = fopen(big, "w");
	assert_non_null(f);
	for (int i = 0; i < 11000; i++) /* 1.1 MB of comments */
		fprintf(f, "# %097d\n", i);
	fclose(f);
	args[1] = big;
	usage_error("more than 1048576", args);
	/* an unknown key's control bytes never reach the terminal raw */
	f = fopen(bin, "w");
	assert_non_null(f);
	fputs("b\x01\x1b[31mogus = 1\n", f);
	fclose(f);
	args[1] = bin;
	usage_error("unknown key 'b\\x01\\x1b[31mogus'", args);
	unlink(fifo);
	unlink(big);
	unlink(bin);
	rmdir(dir);
}

static void test_gpu_unavailable(void **state)
{
	static const char *const args[] = {"--transport", "gpu", NULL};

	(void) state;
	/* a backend that does not exist stands for a node without a GPU */
	assert_int_equal(setenv("KVB_GPU_BACKEND", "kvb-no-such-backend", 1),
			 0);
	refused("transport gpu: unavailable", args);
	assert_int_equal(unsetenv("KVB_GPU_BACKEND"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tcp_needs_host_ip),
		cmocka_unit_test(test_rdma_needs_host_ip),
		cmocka_unit_test(test_socket_in_use),
		cmocka_unit_test(test_host_ip_not_here),
		cmocka_unit_test(test_ports_taken),
		cmocka_unit_test(test_rdma_device_missing),
		cmocka_unit_test(test_gpu_unavailable),
		cmocka_unit_test(test_config_found_at_start),
		cmocka_unit_test(test_config_file_kinds),
		cmocka_unit_test(test_rdma_dev_list_bad),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

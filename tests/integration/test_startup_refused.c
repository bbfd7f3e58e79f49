/* SPDX-License-Identifier: MIT */
/*
 * The broker refuses to start, at once, with exit status 1 and a log line
 * saying why, when its options cannot work: --transport tcp or rdma without
 * --host-ip (the combination; with --host-ip, or with local, it starts),
 * a socket another broker serves (which keeps serving), a --host-ip not on
 * this node, a handshake or data port already taken, an rdma device that is
 * not there, a gpu transport without a GPU backend. Nothing is left
 * listening on its socket path. A bad option (an --rdma-dev list) is a
 * usage error: exit status 2.
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

/* Start the broker with args; it must exit 1 within REFUSE_MS with `why`
 * in its log and no socket left behind. */
static void refused(const char *why, const char *const *args)
{
	const struct broker_opts o = {.args = args};
	struct broker b;
	int64_t t0 = now_ns();
	int rc = broker_run_to_exit(&b, &o, REFUSE_MS);
	double ms = ms_since(t0);

	fprintf(stderr, "refused in %.0f ms (exit %d): %s\n", ms, rc, why);
	if (rc != 1 || !broker_log_has(&b, why)) {
		broker_log_dump(&b);
		broker_cleanup(&b);
		if (rc == -ETIMEDOUT)
			fail_msg("still running after %d ms, want a refusal "
				 "'%s'",
				 REFUSE_MS, why);
		fail_msg("exit %d, want 1 with '%s' in the log", rc, why);
	}
	assert_true(broker_log_has(&b, "startup failed"));
	assert_int_not_equal(access(b.sock, F_OK), 0);
	broker_cleanup(&b);
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
	refused("transport tcp needs --host-ip", tcp);
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
	refused("transport rdma needs --host-ip", rdma);
	/* refused before any device is looked at */
	refused("transport rdma needs --host-ip", dev);
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
	refused("transport tcp: cannot listen on 203.0.113.77", args);
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
		cmocka_unit_test(test_rdma_dev_list_bad),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

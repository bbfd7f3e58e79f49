/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's command line (broker/options.c): defaults,
 * every option parsed, bad values refused with a message that names the
 * option, --help and --version.
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "options.h"
#include "log.h"

#define MAXARGS 96

/*
 * Parse a NULL-terminated argument list (argv[0] added). getopt permutes
 * argv, so each call builds a fresh array.
 */
static int parse_v(struct kvb_options *o, char *err, size_t len, va_list ap)
{
	char *argv[MAXARGS + 2], *copy[MAXARGS + 2];
	char prog[] = "kvbroker";
	const char *a;
	int argc = 0, rc;

	argv[argc++] = prog;
	while ((a = va_arg(ap, const char *)) && argc <= MAXARGS)
		argv[argc++] = strdup(a);
	argv[argc] = NULL;
	memcpy(copy, argv, sizeof(argv));
	rc = kvb_options_parse(o, argc, argv, err, len);
	for (int i = 1; i < argc; i++)
		free(copy[i]);
	return rc;
}

static int parse(struct kvb_options *o, char *err, size_t len, ...)
{
	va_list ap;
	int rc;

	va_start(ap, len);
	rc = parse_v(o, err, len, ap);
	va_end(ap);
	return rc;
}

/* Expect a refusal whose message contains `want`. */
static void refused(const char *want, ...)
{
	struct kvb_options o;
	char err[256] = "";
	va_list ap;
	int rc;

	va_start(ap, want);
	rc = parse_v(&o, err, sizeof(err), ap);
	va_end(ap);
	if (rc != -EINVAL || !strstr(err, want))
		fail_msg("expected -EINVAL with '%s', got %d '%s'", want, rc,
			 err);
}

static void test_defaults(void **state)
{
	struct kvb_options o;
	char err[256] = "";

	(void) state;
	setenv("KVB_SOCKET", "/tmp/kvb-test-default.sock", 1);
	assert_int_equal(parse(&o, err, sizeof(err), NULL), 0);
	assert_string_equal(o.socket_path, "/tmp/kvb-test-default.sock");
	assert_int_equal(o.transport, KVB_TR_LOCAL);
	assert_int_equal(o.log_level, KVB_LOG_INFO);
	assert_int_equal(o.busy_poll_us, 50);
	assert_int_equal(o.sq_entries, 4096);
	assert_int_equal(o.cq_entries, 8192);
	assert_int_equal(o.max_workers, 256);
	assert_int_equal(o.burst, 64);
	assert_int_equal(o.post_batch_size, -1);
	assert_int_equal(o.transfer_timeout_ms, 30000);
	assert_int_equal(o.transfer_deadline_ms, 600000);
	assert_int_equal(o.defer_timeout_ms, 60000);
	assert_string_equal(o.host_ip, "127.0.0.1");
	assert_int_equal(o.notify_port, 61005);
	assert_int_equal(o.handshake_port, 6301);
	assert_int_equal(o.read_mode, 0);
	assert_string_equal(o.trusted_hosts, "");
	assert_string_equal(o.rdma_dev, "");
	assert_int_equal(o.max_qps, 0);
	assert_int_equal(o.ib_port, 1);
	assert_int_equal(o.gid_index, -1);
	assert_int_equal(o.qp_per_transfer, 1);
	assert_int_equal(o.tcp_conns, 4);
	assert_int_equal(o.tcp_max_conns, 256);
	assert_int_equal(o.tcp_max_conns_per_host, 32);
	assert_int_equal(o.tcp_auth_ms, 2000);
	assert_string_equal(o.cluster_key, "");
	assert_int_equal(o.gpu_streams, 64);
	assert_int_equal(o.copy_threads, -1);
	assert_int_equal(o.copy_plain, 0);
	assert_int_equal(o.help, 0);
	assert_int_equal(o.version, 0);

	assert_int_equal(o.hello_timeout_ms, 2000);
	assert_int_equal(o.max_pending, 64);
	assert_int_equal(o.max_ring_entries, 1u << 16);
	assert_int_equal(o.max_xfers_per_worker, 0);
	assert_int_equal(o.max_inflight_per_worker, 0);
	assert_int_equal(o.max_undelivered, 16384);

	/* without $KVB_SOCKET: a private directory, $XDG_RUNTIME_DIR/kvbroker,
	 * then /run/kvbroker for root, /tmp/kvbroker-UID for others */
	unsetenv("KVB_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	assert_int_equal(parse(&o, err, sizeof(err), NULL), 0);
	assert_string_equal(o.socket_path,
			    "/run/user/4242/kvbroker/kvbroker.sock");
	assert_string_equal(o.socket_dir, "/run/user/4242/kvbroker");
	assert_int_equal(o.socket_private, 1);
	unsetenv("XDG_RUNTIME_DIR");
	assert_int_equal(parse(&o, err, sizeof(err), NULL), 0);
	{
		char want[64];

		if (getuid() == 0)
			snprintf(want, sizeof(want),
				 "/run/kvbroker/kvbroker.sock");
		else
			snprintf(want, sizeof(want),
				 "/tmp/kvbroker-%u/kvbroker.sock",
				 (unsigned) getuid());
		assert_string_equal(o.socket_path, want);
		assert_int_equal(o.socket_private, 1);
	}
	/* --socket: no directory rule (the client checks the peer's uid) */
	assert_int_equal(
		parse(&o, err, sizeof(err), "--socket", "/tmp/y.sock", NULL),
		0);
	assert_int_equal(o.socket_private, 0);
	setenv("KVB_SOCKET", "/tmp/z.sock", 1);
	assert_int_equal(parse(&o, err, sizeof(err), NULL), 0);
	assert_int_equal(o.socket_private, 0);
	unsetenv("KVB_SOCKET");
	/* a default too long for a socket: refused (the workers would look
	 * there), unless --socket says where */
	{
		char longdir[200];

		memset(longdir, 'd', sizeof(longdir) - 1);
		longdir[0] = '/';
		longdir[sizeof(longdir) - 1] = '\0';
		setenv("XDG_RUNTIME_DIR", longdir, 1);
		assert_int_equal(parse(&o, err, sizeof(err), NULL), -EINVAL);
		assert_non_null(strstr(err, "give --socket"));
		assert_int_equal(parse(&o, err, sizeof(err), "--socket",
				       "/tmp/x.sock", NULL),
				 0);
		assert_int_equal(parse(&o, err, sizeof(err), "--help", NULL),
				 0);
		unsetenv("XDG_RUNTIME_DIR");
	}
}

/* --stall-timeout and its older name set the stall clock; the deadline */
static void test_clocks(void **state)
{
	struct kvb_options o;
	char err[256] = "";

	(void) state;
	assert_int_equal(parse(&o, err, sizeof(err), "--stall-timeout", "7",
			       "--transfer-deadline", "9", NULL),
			 0);
	assert_int_equal(o.transfer_timeout_ms, 7000);
	assert_int_equal(o.transfer_deadline_ms, 9000);
	assert_int_equal(
		parse(&o, err, sizeof(err), "--transfer-timeout", "3", NULL),
		0);
	assert_int_equal(o.transfer_timeout_ms, 3000);
	assert_int_equal(o.transfer_deadline_ms, 600000);
}

static void test_every_option(void **state)
{
	struct kvb_options o;
	char err[256] = "";

	(void) state;
	assert_int_equal(
		parse(&o, err, sizeof(err), "--socket", "/tmp/x.sock",
		      "--transport", "rdma", "--log-level", "debug",
		      "--busy-poll-us", "0", "--sq-entries", "1024",
		      "--cq-entries", "2", "--max-workers", "4096", "--burst",
		      "256", "--post-batch-size", "16", "--transfer-timeout",
		      "5", "--defer-timeout", "86400", "--host-ip", "10.0.0.7",
		      "--notify-port", "1", "--handshake-port", "65535",
		      "--read-mode", "--trusted-hosts", "a,b,c", "--rdma-dev",
		      "mlx5_0", "--ib-port", "2", "--gid-index", "3",
		      "--qp-per-transfer", "16", "--tcp-conns", "1",
		      "--gpu-streams", "1", "--copy-threads", "3",
		      "--tcp-max-conns", "4096", "--tcp-max-conns-per-host",
		      "1", "--tcp-auth-timeout", "10", "--cluster-key", "/k",
		      "--hello-timeout-ms", "150", "--max-pending", "8",
		      "--max-ring-entries", "1024",
		      "--max-transfers-per-worker", "100",
		      "--max-inflight-per-worker", "200", "--max-undelivered",
		      "300", "--max-qps", "500", NULL),
		0);
	assert_int_equal(o.max_qps, 500);
	assert_int_equal(o.hello_timeout_ms, 150);
	assert_int_equal(o.max_pending, 8);
	assert_int_equal(o.max_ring_entries, 1024);
	assert_int_equal(o.max_xfers_per_worker, 100);
	assert_int_equal(o.max_inflight_per_worker, 200);
	assert_int_equal(o.max_undelivered, 300);
	assert_string_equal(err, "");
	assert_string_equal(o.socket_path, "/tmp/x.sock");
	assert_int_equal(o.transport, KVB_TR_RDMA);
	assert_int_equal(o.log_level, KVB_LOG_DEBUG);
	assert_int_equal(o.busy_poll_us, 0);
	assert_int_equal(o.sq_entries, 1024);
	assert_int_equal(o.cq_entries, 2);
	assert_int_equal(o.max_workers, 4096);
	assert_int_equal(o.burst, 256);
	assert_int_equal(o.post_batch_size, 16);
	assert_int_equal(o.transfer_timeout_ms, 5000);
	assert_int_equal(o.defer_timeout_ms, 86400000u);
	assert_string_equal(o.host_ip, "10.0.0.7");
	assert_int_equal(o.notify_port, 1);
	assert_int_equal(o.handshake_port, 65535);
	assert_int_equal(o.read_mode, 1);
	assert_string_equal(o.trusted_hosts, "a,b,c");
	assert_string_equal(o.rdma_dev, "mlx5_0");
	assert_int_equal(o.ib_port, 2);
	assert_int_equal(o.gid_index, 3);
	assert_int_equal(o.qp_per_transfer, 16);
	assert_int_equal(o.tcp_conns, 1);
	assert_int_equal(o.gpu_streams, 1);
	assert_int_equal(o.copy_threads, 3);
	assert_int_equal(o.tcp_max_conns, 4096);
	assert_int_equal(o.tcp_max_conns_per_host, 1);
	assert_int_equal(o.tcp_auth_ms, 10);
	assert_string_equal(o.cluster_key, "/k");
	assert_int_equal(
		parse(&o, err, sizeof(err), "--copy-threads", "0", NULL), 0);
	assert_int_equal(o.copy_threads, 0);
	assert_int_equal(
		parse(&o, err, sizeof(err), "--copy-threads=auto", NULL), 0);
	assert_int_equal(o.copy_threads, -1);
	assert_int_equal(parse(&o, err, sizeof(err), "--copy-plain", NULL), 0);
	assert_int_equal(o.copy_plain, 1);

	/* --opt=value form, and the other end of the ranges */
	assert_int_equal(parse(&o, err, sizeof(err), "--sq-entries=1048576",
			       "--post-batch-size=-1", "--gid-index=-1",
			       "--log-level=error", NULL),
			 0);
	assert_int_equal(o.sq_entries, 1u << 20);
	assert_int_equal(o.post_batch_size, -1);
	assert_int_equal(o.gid_index, -1);
	assert_int_equal(o.log_level, KVB_LOG_ERROR);

	/* the last occurrence wins */
	assert_int_equal(parse(&o, err, sizeof(err), "--burst", "3", "--burst",
			       "7", NULL),
			 0);
	assert_int_equal(o.burst, 7);
}

static void test_transports(void **state)
{
	static const struct {
		const char *name;
		enum kvb_transport_kind k;
	} t[] = {{"auto", KVB_TR_AUTO},
		 {"local", KVB_TR_LOCAL},
		 {"tcp", KVB_TR_TCP},
		 {"rdma", KVB_TR_RDMA},
		 {"gpu", KVB_TR_GPU}};
	struct kvb_options o;
	char err[256];

	(void) state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		assert_int_equal(parse(&o, err, sizeof(err), "--transport",
				       t[i].name, NULL),
				 0);
		assert_int_equal(o.transport, t[i].k);
		assert_string_equal(kvb_transport_name(t[i].k), t[i].name);
	}
	assert_string_equal(kvb_transport_name((enum kvb_transport_kind) 99),
			    "?");
	refused("--transport", "--transport", "infiniband", NULL);
	refused("'LOCAL'", "--transport", "LOCAL", NULL);
	refused("--log-level", "--log-level", "verbose", NULL);
}

static void test_bad_rings(void **state)
{
	static const char *const bad[] = {
		"0",  "1",   "3",     "1000", "4095", "2097152",
		"-4", "abc", "4096x", "",     "1e3",  "99999999999999999999"};

	(void) state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		refused("--sq-entries", "--sq-entries", bad[i], NULL);
		refused("--cq-entries", "--cq-entries", bad[i], NULL);
		refused("power of two", "--sq-entries", bad[i], NULL);
	}
}

static void test_bad_numbers(void **state)
{
	(void) state;
	/* ports: 1..65535 */
	refused("--notify-port", "--notify-port", "0", NULL);
	refused("--notify-port", "--notify-port", "65536", NULL);
	refused("--notify-port", "--notify-port", "-1", NULL);
	refused("--handshake-port", "--handshake-port", "70000", NULL);
	refused("--handshake-port", "--handshake-port", "http", NULL);
	refused("--handshake-port", "--handshake-port=0", NULL);
	/* seconds: 1..86400 */
	refused("--transfer-timeout", "--transfer-timeout", "0", NULL);
	refused("--transfer-timeout", "--transfer-timeout", "86401", NULL);
	refused("--stall-timeout", "--stall-timeout", "0", NULL);
	refused("--transfer-deadline", "--transfer-deadline", "86401", NULL);
	refused("--defer-timeout", "--defer-timeout", "-5", NULL);
	refused("--busy-poll-us", "--busy-poll-us", "-1", NULL);
	refused("--busy-poll-us", "--busy-poll-us", "10000001", NULL);
	refused("--max-workers", "--max-workers", "0", NULL);
	refused("--max-workers", "--max-workers", "4097", NULL);
	refused("--burst", "--burst", "0", NULL);
	refused("--burst", "--burst", "257", NULL);
	/* numbers are decimal: no octal, no hex */
	refused("--burst", "--burst", "0x10", NULL);
	refused("--post-batch-size", "--post-batch-size", "0", NULL);
	refused("--post-batch-size", "--post-batch-size", "-2", NULL);
	refused("--post-batch-size", "--post-batch-size", "65537", NULL);
	refused("--ib-port", "--ib-port", "0", NULL);
	refused("--ib-port", "--ib-port", "256", NULL);
	refused("--gid-index", "--gid-index", "-2", NULL);
	refused("--qp-per-transfer", "--qp-per-transfer", "17", NULL);
	refused("--tcp-conns", "--tcp-conns", "0", NULL);
	refused("--tcp-conns", "--tcp-conns", "17", NULL);
	refused("--gpu-streams", "--gpu-streams", "0", NULL);
	refused("--tcp-max-conns", "--tcp-max-conns", "0", NULL);
	refused("--tcp-max-conns", "--tcp-max-conns", "4097", NULL);
	refused("--tcp-max-conns-per-host", "--tcp-max-conns-per-host", "0",
		NULL);
	refused("--tcp-auth-timeout", "--tcp-auth-timeout", "9", NULL);
	refused("--tcp-auth-timeout", "--tcp-auth-timeout", "60001", NULL);
	refused("--copy-threads", "--copy-threads", "65", NULL);
	refused("--copy-threads", "--copy-threads", "-1", NULL);
	refused("--copy-threads", "--copy-threads", "Auto", NULL);
	refused("--copy-plain", "--copy-plain=1", NULL); /* takes no value */
}

static void test_bad_strings(void **state)
{
	char longpath[200], longip[80], longhosts[1100];

	(void) state;
	memset(longpath, 'p', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	memset(longip, '1', sizeof(longip) - 1);
	longip[sizeof(longip) - 1] = '\0';
	memset(longhosts, 'h', sizeof(longhosts) - 1);
	longhosts[sizeof(longhosts) - 1] = '\0';
	refused("--socket", "--socket", longpath, NULL);
	refused("--host-ip", "--host-ip", longip, NULL);
	refused("--trusted-hosts", "--trusted-hosts", longhosts, NULL);
	refused("--rdma-dev", "--rdma-dev", longip, NULL);

	/* the longest path that fits sun_path with its NUL */
	{
		struct kvb_options o;
		char err[256], p107[108];

		memset(p107, 'q', 107);
		p107[0] = '/';
		p107[107] = '\0';
		assert_int_equal(
			parse(&o, err, sizeof(err), "--socket", p107, NULL), 0);
		assert_string_equal(o.socket_path, p107);
	}
}

/* --rdma-dev: one device, a list, all; --max-qps */
static void test_rdma_devs(void **state)
{
	static const char *const good[] = {
		"mlx5_0",	  "mlx5_0,mlx5_1",   "all",
		"rxe0,rxe1,rxe2", "a,b,c,d,e,f,g,h", /* KVB_NIC_MAX */
		"alla,all_1", /* names that start with "all" */
	};
	struct kvb_options o;
	char err[256] = "", name63[64], list[KVB_RDMA_DEV_LEN];

	(void) state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		if (parse(&o, err, sizeof(err), "--rdma-dev", good[i], NULL))
			fail_msg("'%s' refused: %s", good[i], err);
		assert_string_equal(o.rdma_dev, good[i]);
	}
	/* the longest list: 8 names of 63 bytes */
	memset(name63, 'n', 63);
	name63[63] = '\0';
	list[0] = '\0';
	for (int i = 0; i < 8; i++) {
		name63[0] = (char) ('a' + i);
		snprintf(list + strlen(list), sizeof(list) - strlen(list),
			 "%s%s", i ? "," : "", name63);
	}
	assert_int_equal(strlen(list), sizeof(list) - 1);
	assert_int_equal(parse(&o, err, sizeof(err), "--rdma-dev", list, NULL),
			 0);
	assert_string_equal(o.rdma_dev, list);

	refused("empty device name", "--rdma-dev", "", NULL);
	refused("empty device name", "--rdma-dev", ",mlx5_0", NULL);
	refused("empty device name", "--rdma-dev", "mlx5_0,", NULL);
	refused("empty device name", "--rdma-dev", "mlx5_0,,mlx5_1", NULL);
	refused("more than 8 devices", "--rdma-dev", "a,b,c,d,e,f,g,h,i", NULL);
	refused("'mlx5_0' named twice", "--rdma-dev", "mlx5_0,mlx5_1,mlx5_0",
		NULL);
	refused("'all' stands alone", "--rdma-dev", "all,mlx5_0", NULL);
	refused("'all' stands alone", "--rdma-dev", "mlx5_0,all", NULL);
	name63[0] = 'x';
	snprintf(list, sizeof(list), "a,%sz", name63); /* a 64-byte name */
	refused("longer than 63", "--rdma-dev", list, NULL);

	assert_int_equal(parse(&o, err, sizeof(err), "--max-qps", "0", NULL),
			 0);
	assert_int_equal(o.max_qps, 0);
	assert_int_equal(
		parse(&o, err, sizeof(err), "--max-qps=16777216", NULL), 0);
	assert_int_equal(o.max_qps, 1 << 24);
	refused("--max-qps", "--max-qps", "-1", NULL);
	refused("--max-qps", "--max-qps", "16777217", NULL);
	refused("--max-qps", "--max-qps", "many", NULL);
}

static void test_bad_usage(void **state)
{
	(void) state;
	refused("unknown option", "--frobnicate", NULL);
	refused("--frobnicate", "--frobnicate", NULL);
	refused("unknown option", "-x", NULL);
	refused("missing argument", "--socket", NULL);
	refused("--socket", "--socket", NULL);
	refused("missing argument", "--busy-poll-us", NULL);
	refused("unexpected argument 'stray'", "stray", NULL);
	refused("unexpected argument 'stray'", "--burst", "4", "stray", NULL);
	refused("unexpected argument", "--read-mode", "yes", NULL);
	/* a flag that takes no argument given one */
	refused("--help", "--help=yes", NULL);
}

static void test_help_version(void **state)
{
	struct kvb_options o;
	char err[256], *buf = NULL;
	size_t len = 0;
	FILE *f;

	(void) state;
	assert_int_equal(parse(&o, err, sizeof(err), "--help", NULL), 0);
	assert_int_equal(o.help, 1);
	assert_int_equal(o.version, 0);
	assert_int_equal(parse(&o, err, sizeof(err), "--version", NULL), 0);
	assert_int_equal(o.version, 1);
	assert_int_equal(o.help, 0);
	assert_int_equal(
		parse(&o, err, sizeof(err), "--help", "--version", NULL), 0);
	assert_true(o.help && o.version);

	/* the usage text names every option */
	f = open_memstream(&buf, &len);
	assert_non_null(f);
	kvb_options_usage(f);
	fclose(f);
	static const char *const names[] = {"--socket",
					    "--transport",
					    "--log-level",
					    "--busy-poll-us",
					    "--sq-entries",
					    "--cq-entries",
					    "--max-workers",
					    "--burst",
					    "--post-batch-size",
					    "--transfer-timeout",
					    "--defer-timeout",
					    "--host-ip",
					    "--notify-port",
					    "--handshake-port",
					    "--read-mode",
					    "--trusted-hosts",
					    "--rdma-dev",
					    "--ib-port",
					    "--gid-index",
					    "--qp-per-transfer",
					    "--max-qps",
					    "--tcp-conns",
					    "--gpu-streams",
					    "--copy-threads",
					    "--help",
					    "--version",
					    "--tcp-max-conns",
					    "--tcp-max-conns-per-host",
					    "--tcp-auth-timeout",
					    "--cluster-key"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strstr(buf, names[i]))
			fail_msg("usage does not mention %s", names[i]);
	if (!strstr(buf, "--stall-timeout") ||
	    !strstr(buf, "--transfer-deadline"))
		fail_msg("usage does not mention the clocks");
	free(buf);
}

/* An error message is truncated to the buffer, never overflows it. */
/* The directory rule of the default socket (client and broker) and the
 * peer check: a private directory passes; a symlink to one, group or other
 * access, another owner, a file do not. */
static void test_socket_dir(void **state)
{
	char dir[64] = "/tmp/kvbo-XXXXXX", sub[96], lnk[96], why[256];
	int sv[2];
	uid_t peer = 12345;

	(void) state;
	assert_non_null(mkdtemp(dir));
	snprintf(sub, sizeof(sub), "%s/d", dir);
	snprintf(lnk, sizeof(lnk), "%s/l", dir);
	assert_int_equal(kvb_sock_dir_check(sub, getuid(), why, sizeof(why)),
			 -ENOENT);
	assert_int_equal(mkdir(sub, 0700), 0);
	assert_int_equal(kvb_sock_dir_check(sub, getuid(), why, sizeof(why)),
			 0);
	assert_int_equal(
		kvb_sock_dir_check(sub, getuid() + 1, why, sizeof(why)),
		-EACCES);
	assert_non_null(strstr(why, "owned by uid"));
	assert_int_equal(chmod(sub, 0750), 0);
	assert_int_equal(kvb_sock_dir_check(sub, getuid(), why, sizeof(why)),
			 -EACCES);
	assert_non_null(strstr(why, "0750"));
	assert_int_equal(chmod(sub, 0701), 0);
	assert_int_equal(kvb_sock_dir_check(sub, getuid(), why, sizeof(why)),
			 -EACCES);
	assert_int_equal(chmod(sub, 0700), 0);
	assert_int_equal(symlink(sub, lnk), 0);
	assert_int_equal(kvb_sock_dir_check(lnk, getuid(), why, sizeof(why)),
			 -EACCES);
	assert_non_null(strstr(why, "symlink"));
	/* the peer check: our own uid is trusted */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	assert_int_equal(kvb_ctl_check_peer(sv[0], &peer), 0);
	assert_int_equal(peer, getuid());
	close(sv[0]);
	close(sv[1]);
	unlink(lnk);
	rmdir(sub);
	rmdir(dir);
	/* $KVB_SOCKET: no directory to check */
	setenv("KVB_SOCKET", "/tmp/z.sock", 1);
	assert_int_equal(kvb_default_socket_dir(why, sizeof(why)), 0);
	unsetenv("KVB_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
	assert_int_equal(kvb_default_socket_dir(why, sizeof(why)),
			 (int) strlen("/run/user/7/kvbroker"));
	assert_string_equal(why, "/run/user/7/kvbroker");
	unsetenv("XDG_RUNTIME_DIR");
}

static void test_small_err_buffer(void **state)
{
	struct kvb_options o;
	char err[8];

	(void) state;
	memset(err, 'z', sizeof(err));
	assert_int_equal(parse(&o, err, 4, "--transport", "nope", NULL),
			 -EINVAL);
	assert_int_equal(strlen(err), 3);
	assert_int_equal(err[4], 'z');
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_every_option),
		cmocka_unit_test(test_clocks),
		cmocka_unit_test(test_transports),
		cmocka_unit_test(test_bad_rings),
		cmocka_unit_test(test_bad_numbers),
		cmocka_unit_test(test_bad_strings),
		cmocka_unit_test(test_rdma_devs),
		cmocka_unit_test(test_bad_usage),
		cmocka_unit_test(test_help_version),
		cmocka_unit_test(test_small_err_buffer),
		cmocka_unit_test(test_socket_dir),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's --config file (broker/config.c): settings
 * applied through the option parser, the command line winning wherever
 * --config stands, flags, comments, quoting, CRLF; every refusal names the
 * file and the line.
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

#include "config.h"
#include "log.h"
#include "options.h"

static char path[64];

static void write_conf(const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* kvb_options_load on a NULL-terminated list (argv[0] added). */
static int load(struct kvb_options *o, char *err, size_t len, ...)
{
	char *argv[32], *copy[32], prog[] = "kvbroker";
	const char *a;
	va_list ap;
	int argc = 0, rc;

	argv[argc++] = prog;
	va_start(ap, len);
	while ((a = va_arg(ap, const char *)) && argc < 31)
		argv[argc++] = strdup(a);
	va_end(ap);
	argv[argc] = NULL;
	memcpy(copy, argv, sizeof(argv));
	rc = kvb_options_load(o, argc, argv, err, len);
	for (int i = 1; i < argc; i++)
		free(copy[i]);
	return rc;
}

static int setup(void **state)
{
	int fd;

	(void) state;
	snprintf(path, sizeof(path), "/tmp/kvb-conf-test.XXXXXX");
	fd = mkstemp(path);
	if (fd < 0)
		return -1;
	close(fd);
	setenv("KVB_SOCKET", "/tmp/kvb-conf-test.sock", 1);
	return 0;
}

static int teardown(void **state)
{
	(void) state;
	unlink(path);
	return 0;
}

static void test_settings(void **state)
{
	struct kvb_options o;
	char err[256] = "";

	(void) state;
	write_conf("# kvbroker.conf\n"
		   "\n"
		   "   # an indented comment\n"
		   "transport = tcp\n"
		   "host-ip=192.0.2.1\n"
		   "  burst   =   8  \n"
		   "log-level = debug\r\n"
		   "log-format = json\n"
		   "copy-plain = yes\n"
		   "read-mode = false\n"
		   "socket = \"/tmp/kvb conf.sock\"\n"
		   "trusted-hosts = 192.0.2.2,192.0.2.3\n"
		   "stall-timeout = 12\n"
		   "rdma-dev = mlx5_0,mlx5_1\n"
		   "max-qps = 256\n");
	assert_int_equal(load(&o, err, sizeof(err), "--config", path, NULL), 0);
	assert_int_equal(o.transport, KVB_TR_TCP);
	assert_string_equal(o.host_ip, "192.0.2.1");
	assert_int_equal(o.xnode, 1);
	assert_int_equal(o.burst, 8);
	assert_int_equal(o.log_level, KVB_LOG_DEBUG);
	assert_int_equal(o.log_format, KVB_LOG_FMT_JSON);
	assert_int_equal(o.copy_plain, 1);
	assert_int_equal(o.read_mode, 0);
	assert_string_equal(o.socket_path, "/tmp/kvb conf.sock");
	assert_string_equal(o.trusted_hosts, "192.0.2.2,192.0.2.3");
	assert_int_equal(o.transfer_timeout_ms, 12000);
	assert_string_equal(o.rdma_dev, "mlx5_0,mlx5_1");
	assert_int_equal(o.max_qps, 256);
	assert_string_equal(o.config_path, path);
	/* what the file does not set keeps its default */
	assert_int_equal(o.sq_entries, 4096);
	assert_int_equal(o.busy_poll_us, 50);
}

/* The command line wins, before or after --config. */
static void test_command_line_wins(void **state)
{
	struct kvb_options o;
	char err[256] = "";

	(void) state;
	write_conf("burst = 8\nbusy-poll-us = 7\nlog-level = debug\n");
	assert_int_equal(load(&o, err, sizeof(err), "--burst", "16", "--config",
			      path, "--log-level=warn", NULL),
			 0);
	assert_int_equal(o.burst, 16);
	assert_int_equal(o.log_level, KVB_LOG_WARN);
	assert_int_equal(o.busy_poll_us, 7);
	/* an empty file (comments only): the defaults */
	write_conf("# nothing\n\n");
	assert_int_equal(load(&o, err, sizeof(err), "--config", path, NULL), 0);
	assert_int_equal(o.burst, 64);
	/* without --config no file is read */
	assert_int_equal(load(&o, err, sizeof(err), NULL), 0);
	assert_string_equal(o.config_path, "");
}

/* A refusal: -EINVAL (or errno) with `want` in the message. */
static void refused(const char *text, int want_rc, const char *want)
{
	struct kvb_options o;
	char err[256] = "";
	int rc;

	write_conf(text);
	rc = load(&o, err, sizeof(err), "--config", path, NULL);
	if (rc != want_rc || !strstr(err, want) || !strstr(err, path))
		fail_msg("'%s': expected %d with '%s', got %d '%s'", text,
			 want_rc, want, rc, err);
}

static void test_refusals(void **state)
{
	char want[128];

	(void) state;
	refused("burst = 8\n# ok\nbogus = 1\n", -EINVAL,
		":3: unknown key 'bogus'");
	refused("\n\nburst = 999\n", -EINVAL, ":3: --burst: bad value '999'");
	refused("rdma-dev = rxe0,rxe0\n", -EINVAL,
		":1: --rdma-dev: 'rxe0' named twice");
	refused("max-qps = -3\n", -EINVAL, ":1: --max-qps: bad value '-3'");
	refused("transport = carrier-pigeon\n", -EINVAL,
		":1: --transport: 'carrier-pigeon' is not one of");
	refused("log-format = xml\n", -EINVAL, ":1: --log-format: 'xml'");
	refused("burst 8\n", -EINVAL, ":1: expected \"key = value\"");
	refused("burst =\n", -EINVAL, ":1: burst: missing value");
	refused("copy-plain = maybe\n", -EINVAL,
		":1: copy-plain: 'maybe' is not true or false");
	refused("config = /etc/other.conf\n", -EINVAL,
		":1: unknown key 'config'");
	refused("help = true\n", -EINVAL, ":1: unknown key 'help'");
	refused("--burst = 8\n", -EINVAL, ":1: unknown key '--burst'");
	refused("sq-entries = 1000\n", -EINVAL,
		":1: --sq-entries: '1000' is not a power of two");
	/* a bad line after good ones: nothing applied, the line named */
	refused("burst = 8\nmax-workers = 0\n", -EINVAL, ":2: --max-workers");
	/* the file itself */
	unlink(path);
	{
		struct kvb_options o;
		char err[256] = "";

		assert_int_equal(
			load(&o, err, sizeof(err), "--config", path, NULL),
			-ENOENT);
		snprintf(want, sizeof(want), "%s: No such file", path);
		assert_non_null(strstr(err, want));
		assert_int_equal(
			load(&o, err, sizeof(err), "--config", "/tmp", NULL),
			-EISDIR);
		assert_non_null(strstr(err, "/tmp: Is a directory"));
		/* the command line's own errors come first, as before */
		assert_int_equal(load(&o, err, sizeof(err), "--config", path,
				      "--burst", "0", NULL),
				 -EINVAL);
		assert_non_null(strstr(err, "--burst"));
	}
}

/* Only a regular file of at most KVB_CONFIG_MAX bytes, read without error;
 * the last line may lack its newline; bytes shown escaped. */
static void test_file_kinds(void **state)
{
	char err[256] = "", **ent = NULL, fifo[80], esc[64];
	int n = 0;
	FILE *f;

	(void) state;
	snprintf(fifo, sizeof(fifo), "%s.fifo", path);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(kvb_config_read(fifo, &ent, &n, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "not a regular file"));
	unlink(fifo);
	assert_int_equal(
		kvb_config_read("/dev/zero", &ent, &n, err, sizeof(err)),
		-EINVAL);
	assert_int_equal(
		kvb_config_read("/proc/self/mem", &ent, &n, err, sizeof(err)),
		-EIO);
	/* exactly the bound: read; one byte more: refused */
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("burst = 8\n", f);
	for (long i = 10; i < KVB_CONFIG_MAX; i++)
		fputc(i % 64 == 63 || i == KVB_CONFIG_MAX - 1 ? '\n' : '#', f);
	fclose(f);
	assert_int_equal(kvb_config_read(path, &ent, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	kvb_config_free(ent, n);
	f = fopen(path, "a");
	fputc('#', f);
	fclose(f);
	assert_int_equal(kvb_config_read(path, &ent, &n, err, sizeof(err)),
			 -EFBIG);
	write_conf("burst = 8"); /* no newline at the end */
	assert_int_equal(kvb_config_read(path, &ent, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_string_equal(ent[0], "--burst=8");
	kvb_config_free(ent, n);
	kvb_config_escape(esc, sizeof(esc), "a\x01\x1b[m\\\xc3\xa9");
	assert_string_equal(esc, "a\\x01\\x1b[m\\\\\\xc3\\xa9");
	/* truncated at a whole escape */
	kvb_config_escape(esc, 5, "ab\x01");
	assert_string_equal(esc, "ab");
}

/* Every option the parser knows is a key; kinds match --help's. */
static void test_keys(void **state)
{
	(void) state;
	assert_int_equal(kvb_option_kind("socket"), 1);
	assert_int_equal(kvb_option_kind("log-format"), 1);
	assert_int_equal(kvb_option_kind("copy-plain"), 0);
	assert_int_equal(kvb_option_kind("read-mode"), 0);
	assert_int_equal(kvb_option_kind("max-undelivered"), 1);
	assert_int_equal(kvb_option_kind("sock"), -ENOENT);
	assert_int_equal(kvb_option_kind(""), -ENOENT);
}

/* kvb_config_read's entries: what the command line would have said. */
static void test_entries(void **state)
{
	char **ent = NULL, err[256] = "";
	int n = -1;

	(void) state;
	write_conf("copy-plain = on\ncopy-plain = off\ndata-port = 7000\n"
		   "cluster-key = /etc/kvbroker/key\n");
	assert_int_equal(kvb_config_read(path, &ent, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3); /* "off": no entry */
	assert_string_equal(ent[0], "--copy-plain");
	assert_string_equal(ent[1], "--data-port=7000");
	assert_string_equal(ent[2], "--cluster-key=/etc/kvbroker/key");
	kvb_config_free(ent, n);
}

/* The example config: all comments as shipped; every setting it shows,
 * uncommented, is accepted as it stands. */
static void test_example(void **state)
{
	char **ent = NULL, err[256] = "", line[512];
	FILE *in, *out;
	int n = -1, shown = 0;

	(void) state;
	assert_int_equal(
		kvb_config_read(KVB_CONF_EXAMPLE, &ent, &n, err, sizeof(err)),
		0);
	assert_int_equal(n, 0);
	kvb_config_free(ent, n);
	in = fopen(KVB_CONF_EXAMPLE, "r");
	out = fopen(path, "w");
	assert_non_null(in);
	assert_non_null(out);
	while (fgets(line, sizeof(line), in)) {
		/* "#key = value": a setting; "# text": prose */
		if (line[0] == '#' && line[1] >= 'a' && line[1] <= 'z') {
			fputs(line + 1, out);
			shown++;
		}
	}
	fclose(in);
	fclose(out);
	if (kvb_config_read(path, &ent, &n, err, sizeof(err)))
		fail_msg("the example, uncommented: %s", err);
	assert_int_equal(n, shown - 1); /* copy-plain = false: no entry */
	assert_true(shown >= 30);
	kvb_config_free(ent, n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_settings),
		cmocka_unit_test(test_command_line_wins),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_keys),
		cmocka_unit_test(test_file_kinds),
		cmocka_unit_test(test_entries),
		cmocka_unit_test(test_example),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

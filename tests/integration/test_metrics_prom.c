/* SPDX-License-Identifier: MIT */
/*
 * The metrics endpoint against the real tools: `promtool check metrics` on
 * a live scrape (a worker attached, after a transfer), then a Prometheus
 * server this test starts (its own config and data directory, scraping
 * every second, on a free loopback port) that must see a counter move
 * after a transfer, through its HTTP API (/api/v1/query), and must have
 * scraped with OpenMetrics. The test stops Prometheus and removes its
 * files itself; every wait is bounded. Skipped (77) without promtool or
 * prometheus (Debian package prometheus).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "metrics_client.h"

#define SIZE (64u << 10)

static uint16_t port, prom_port;
static char dir[64];
static pid_t prom = -1;
static char promtool[256], prometheus[256];

/* path of `name` in $PATH (or /usr/bin) into out: 0 or -ENOENT */
static int which(const char *name, char *out, size_t cap)
{
	const char *path = getenv("PATH");
	char buf[4096];

	snprintf(buf, sizeof(buf), "%s:/usr/bin:/usr/sbin", path ? path : "");
	for (char *save = NULL, *d = strtok_r(buf, ":", &save); d;
	     d = strtok_r(NULL, ":", &save)) {
		snprintf(out, cap, "%s/%s", d, name);
		if (!access(out, X_OK))
			return 0;
	}
	return -ENOENT;
}

static int transfer(const char *id)
{
	struct kvb_desc d = {.region = fx.src.id,
			     .peer_region = fx.dst.id,
			     .len = SIZE,
			     .tag = 1};

	return w_transfer_write(fx.ctx, id, d);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

static void test_promtool(void **state)
{
	char file[128], cmd[512], out[4096];
	char *r = NULL;
	char *const argv[] = {"/bin/sh", "-c", cmd, NULL};
	int rc;

	(void) state;
	assert_int_equal(transfer("prom-1"), 0);
	assert_int_equal(http_get(port, "/metrics", NULL, &r, 5000), 0);
	assert_int_equal(http_status(r), 200);
	snprintf(file, sizeof(file), "%s/scrape.txt", dir);
	write_file(file, http_body(r));
	free(r);
	snprintf(cmd, sizeof(cmd), "'%s' check metrics < '%s' 2>&1", promtool,
		 file);
	rc = run_cmd(argv, out, sizeof(out), 30);
	if (rc)
		fprintf(stderr, "promtool: %s\n", out);
	assert_int_equal(rc, 0);
	assert_string_equal(out, ""); /* not even a lint warning */
}

/* /api/v1/query?query=q: the first result's value, or -1 (none yet) */
static double prom_query(const char *q, int print)
{
	char path[512], *r = NULL;
	const char *v;
	double val = -1;

	snprintf(path, sizeof(path), "/api/v1/query?query=%s", q);
	if (http_get(prom_port, path, NULL, &r, 5000))
		return -1;
	if (print)
		fprintf(stderr, "GET %s -> %s\n", path, http_body(r));
	v = strstr(r, "\"value\":[");
	if (http_status(r) == 200 && v) {
		v = strchr(v, ',');
		if (v && v[1] == '"')
			val = strtod(v + 2, NULL);
	}
	free(r);
	return val;
}

/* poll q until pred(value) (every 200 ms, up to ms); returns the value */
static double prom_wait(const char *q, double want, int ms)
{
	int64_t t0 = now_ns();
	double v = -1;

	while (ms_since(t0) < ms) {
		v = prom_query(q, 0);
		if (v >= want)
			break;
		usleep(200000);
	}
	return v;
}

static pid_t start_prometheus(void)
{
	char cfg[128], data[128], listen[64], logf[128], yml[512];
	pid_t pid;

	snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", dir);
	snprintf(data, sizeof(data), "--storage.tsdb.path=%s/data", dir);
	snprintf(logf, sizeof(logf), "%s/prometheus.log", dir);
	snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%u",
		 prom_port);
	snprintf(yml, sizeof(yml),
		 "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
		 "scrape_configs:\n  - job_name: kvbroker\n"
		 "    static_configs:\n      - targets: ['127.0.0.1:%u']\n",
		 port);
	write_file(cfg, yml);
	pid = fork();
	if (pid == 0) {
		char cfgarg[160];
		int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		/* never outlive the test (a CTest timeout kills it) */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		snprintf(cfgarg, sizeof(cfgarg), "--config.file=%s", cfg);
		execl(prometheus, "prometheus", cfgarg, data, listen,
		      "--storage.tsdb.retention.time=1h", (char *) NULL);
		_exit(127);
	}
	return pid;
}

static void stop_prometheus(void)
{
	int64_t t0 = now_ns();
	int st;

	if (prom <= 0)
		return;
	kill(prom, SIGTERM);
	while (waitpid(prom, &st, WNOHANG) == 0) {
		if (ms_since(t0) > 10000) {
			kill(prom, SIGKILL);
			waitpid(prom, &st, 0);
			break;
		}
		usleep(50000);
	}
	prom = -1;
}

static void dump_prom_log(void)
{
	char path[128], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/prometheus.log", dir);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fclose(f);
}

static void test_prometheus(void **state)
{
	int64_t t0 = now_ns();
	double before, after, up;
	char *r = NULL;

	(void) state;
	prom_port = free_port();
	assert_true(prom_port > 0);
	prom = start_prometheus();
	assert_true(prom > 0);
	/* ready: bounded */
	while (ms_since(t0) < 30000) {
		if (!http_get(prom_port, "/-/ready", NULL, &r, 2000)) {
			int ok = http_status(r) == 200;

			free(r);
			if (ok)
				break;
		}
		usleep(200000);
	}
	fprintf(stderr, "prometheus ready after %.0f ms\n", ms_since(t0));
	up = prom_wait("up%7Bjob%3D%22kvbroker%22%7D", 1, 20000);
	if (up != 1)
		dump_prom_log();
	assert_true(up == 1);
	before = prom_wait("kvbroker_transfers_done_total", 0, 10000);
	assert_true(before >= 1); /* test_promtool's transfer */
	assert_int_equal(transfer("prom-2"), 0);
	after = prom_wait("kvbroker_transfers_done_total", before + 1, 15000);
	fprintf(stderr, "kvbroker_transfers_done_total: %.0f -> %.0f\n", before,
		after);
	prom_query("kvbroker_transfers_done_total", 1);
	assert_true(after == before + 1);
	/* a per-worker series, and the histogram, as Prometheus stored them */
	assert_true(prom_wait("kvbroker_worker_transfers_done_total%7Brole%3D%"
			      "22P%22%2Cdp%3D%220%22%2Ctp%3D%220%22%7D",
			      2, 5000) == 2);
	assert_true(prom_wait("kvbroker_transfer_duration_seconds_count%7B"
			      "outcome%3D%22done%22%7D",
			      2, 5000) == 2);
	/* it asked for, and parsed, OpenMetrics */
	assert_true(prom_query("kvbroker_metrics_scrapes_total%7Bformat%3D%"
			       "22openmetrics%22%7D",
			       1) >= 1);
	stop_prometheus();
}

static int setup(void **state)
{
	char tmpl[] = "/tmp/kvb-prom-XXXXXX";
	int rc;

	if (!mkdtemp(tmpl))
		return -1;
	snprintf(dir, sizeof(dir), "%s", tmpl);
	rc = fixture_setup(state);
	if (rc)
		return rc;
	port = broker_metrics_port(&fx.br);
	return port ? 0 : -1;
}

static int teardown(void **state)
{
	char *const argv[] = {"/bin/rm", "-rf", dir, NULL};

	stop_prometheus();
	if (dir[0])
		run_cmd(argv, NULL, 0, 30);
	return fixture_teardown(state);
}

int main(void)
{
	static const char *const args[] = {"--metrics-listen", "127.0.0.1:0",
					   NULL};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_promtool),
		cmocka_unit_test(test_prometheus),
	};

	if (which("promtool", promtool, sizeof(promtool)) ||
	    which("prometheus", prometheus, sizeof(prometheus))) {
		fprintf(stderr, "SKIP: promtool or prometheus not installed "
				"(Debian package prometheus)\n");
		return 77;
	}
	fx.args = args;
	fx.size = SIZE;
	fx.seed = 3;
	return cmocka_run_group_tests(tests, setup, teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * The metrics endpoint (--metrics-listen) of a live broker: the text
 * format's shape (HELP and TYPE before each family's samples, every sample
 * a name, labels and a number), OpenMetrics on request (its content type,
 * counter families without _total, # EOF last), counters, per-worker
 * series and histograms that move with a transfer, a failure counted by
 * reason, the refusals (405, 404, 400 also for a NUL byte, 431, past 4
 * connections of one address the oldest evicted, an idle client's
 * timeout), each counted, a broker that keeps transferring meanwhile, and
 * scrapes answered while 16 slow clients try to hold every connection.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <errno.h>
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
#include "metrics_client.h"

#define SIZE	   (256u << 10)
#define WORKER	   "role=\"P\",dp=\"0\",tp=\"0\""
#define MAXCONN	   16
#define PER_SOURCE 4

static uint16_t port;

static char *scrape(const char *accept)
{
	char *r = NULL;

	assert_int_equal(http_get(port, "/metrics", accept, &r, 5000), 0);
	assert_int_equal(http_status(r), 200);
	return r;
}

/* One same-node transfer of SIZE bytes from src to dst (or one aborted
 * at once): done (0) or the transfer's status. */
static int transfer(const char *id, int abort_it)
{
	struct kvb_completion c[1];
	struct kvb_desc d = {.region = fx.src.id,
			     .peer_region = fx.dst.id,
			     .len = SIZE,
			     .tag = 1};
	uint32_t h;

	if (!abort_it)
		return w_transfer_write(fx.ctx, id, d);
	assert_int_equal(kvb_transfer_open(fx.ctx, id, &h), 0);
	assert_int_equal(kvb_transfer_abort(fx.ctx, h, 9), 0);
	assert_int_equal(w_collect(fx.ctx, c, 1, 5000), 1);
	return c[0].status;
}

/* name of a sample line: up to '{' or ' ' */
static size_t name_len(const char *l)
{
	return strcspn(l, "{ \n");
}

static int valid_name(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!(isalnum((unsigned char) s[i]) || s[i] == '_' ||
		      s[i] == ':') ||
		    (!i && isdigit((unsigned char) s[i])))
			return 0;
	return n > 0;
}

/* Every line: "# HELP f", "# TYPE f t" right after it, or a sample of the
 * family typed last (f, f_total for counters, f_bucket|_sum|_count). */
static void check_text_format(const char *body, int om)
{
	char fam[128] = "", type[16] = "";
	int nsamples = 0, nfam = 0;

	for (const char *l = body; *l; l = strchr(l, '\n') + 1) {
		const char *e = strchr(l, '\n');
		size_t n;

		assert_non_null(e); /* every line ends with \n */
		if (!strncmp(l, "# HELP ", 7)) {
			n = name_len(l + 7);
			assert_true(valid_name(l + 7, n));
			assert_true(n < sizeof(fam));
			memcpy(fam, l + 7, n);
			fam[n] = '\0';
			type[0] = '\0';
			continue;
		}
		if (!strncmp(l, "# TYPE ", 7)) {
			n = name_len(l + 7);
			assert_int_equal(n, strlen(fam)); /* after its HELP */
			assert_memory_equal(l + 7, fam, n);
			assert_int_equal(sscanf(l + 7 + n, " %15s", type), 1);
			assert_true(!strcmp(type, "counter") ||
				    !strcmp(type, "gauge") ||
				    !strcmp(type, "histogram") ||
				    (om && !strcmp(type, "info")));
			if (!strcmp(type, "counter")) /* 0.0.4: name_total */
				assert_int_equal(!!strstr(fam, "_total"), !om);
			nfam++;
			continue;
		}
		if (!strcmp(l, "# EOF\n")) {
			assert_true(om);
			assert_int_equal(l[6], '\0'); /* the last line */
			return;
		}
		assert_int_not_equal(l[0], '#');
		n = name_len(l);
		assert_true(valid_name(l, n));
		assert_true(type[0]); /* typed before its samples */
		assert_memory_equal(l, fam, strlen(fam));
		{
			const char *suf = l + strlen(fam), *v;
			char *end;

			if (!strcmp(type, "histogram"))
				assert_true(!strncmp(suf, "_bucket", 7) ||
					    !strncmp(suf, "_sum", 4) ||
					    !strncmp(suf, "_count", 6));
			else if (om && !strcmp(type, "counter"))
				assert_true(!strncmp(suf, "_total", 6));
			else if (om && !strcmp(type, "info"))
				assert_true(!strncmp(suf, "_info", 5));
			else
				assert_true(*suf == '{' || *suf == ' ');
			if (l[n] == '{') {
				v = strchr(l, '}');
				assert_non_null(v);
				assert_true(v < e);
				v++;
			} else {
				v = l + n;
			}
			assert_int_equal(*v, ' ');
			strtod(v + 1, &end);
			assert_ptr_equal(end, e); /* a number, then \n */
		}
		nsamples++;
	}
	assert_false(om); /* OpenMetrics ends with # EOF */
	assert_true(nfam > 30);
	assert_true(nsamples > nfam);
}

static void test_format(void **state)
{
	char *r = scrape(NULL), ct[128];

	(void) state;
	assert_int_equal(http_header(r, "Content-Type", ct, sizeof(ct)), 0);
	assert_string_equal(ct, "text/plain; version=0.0.4; charset=utf-8");
	assert_int_equal(http_header(r, "Connection", ct, sizeof(ct)), 0);
	assert_string_equal(ct, "close");
	assert_int_equal(http_header(r, "Content-Length", ct, sizeof(ct)), 0);
	assert_int_equal(strtoul(ct, NULL, 10), strlen(http_body(r)));
	check_text_format(http_body(r), 0);
	/* the attached worker has its series; node gauges are there */
	assert_true(metric(http_body(r),
			   "kvbroker_worker_descriptors_submitted_total{" WORKER
			   "}") >= 0);
	assert_true(metric(http_body(r), "kvbroker_workers") == 1);
	assert_true(metric(http_body(r), "kvbroker_peers{state=\"ready\"}") ==
		    0);
	free(r);
}

static void test_openmetrics(void **state)
{
	char *r, ct[128];
	const char *body;

	(void) state;
	r = scrape("application/openmetrics-text;version=1.0.0,application/"
		   "openmetrics-text;version=0.0.1;q=0.75,text/plain;version="
		   "0.0.4;q=0.5,*/*;q=0.1");
	assert_int_equal(http_header(r, "Content-Type", ct, sizeof(ct)), 0);
	assert_string_equal(
		ct,
		"application/openmetrics-text; version=1.0.0; charset=utf-8");
	body = http_body(r);
	check_text_format(body, 1);
	assert_non_null(strstr(body, "# TYPE kvbroker_bytes counter\n"));
	assert_non_null(strstr(body, "\nkvbroker_bytes_total "));
	assert_int_equal(strcmp(body + strlen(body) - 6, "# EOF\n"), 0);
	free(r);
	/* and plain text for anyone else */
	r = scrape("text/plain");
	assert_null(strstr(r, "# EOF"));
	free(r);
}

static void test_counters_move(void **state)
{
	char *a, *b;
	const char *x, *y;

	(void) state;
	a = scrape(NULL);
	assert_int_equal(transfer("mx-1", 0), 0);
	b = scrape(NULL);
	x = http_body(a);
	y = http_body(b);
	if (getenv("KVB_METRICS_DUMP")) { /* docs/metrics.md's example */
		FILE *f = fopen(getenv("KVB_METRICS_DUMP"), "w");

		if (f) {
			fputs(y, f);
			fclose(f);
		}
	}
#define MOVED(s, d) assert_true(metric(y, s) - metric(x, s) == (d))
	MOVED("kvbroker_transfers_done_total", 1);
	MOVED("kvbroker_descriptors_submitted_total", 1);
	MOVED("kvbroker_descriptors_completed_total", 1);
	MOVED("kvbroker_bytes_total", SIZE);
	MOVED("kvbroker_worker_descriptors_submitted_total{" WORKER "}", 1);
	MOVED("kvbroker_worker_bytes_total{" WORKER "}", SIZE);
	MOVED("kvbroker_worker_transfers_done_total{" WORKER "}", 1);
	MOVED("kvbroker_transfer_duration_seconds_count{outcome=\"done\"}", 1);
	MOVED("kvbroker_transfer_duration_seconds_bucket{outcome=\"done\","
	      "le=\"+Inf\"}",
	      1);
	MOVED("kvbroker_doorbells_total{transport=\"local\"}", 1);
	MOVED("kvbroker_wrs_total{transport=\"local\"}", 1);
	MOVED("kvbroker_wrs_per_doorbell_bucket{transport=\"local\",le="
	      "\"1\"}",
	      1);
	MOVED("kvbroker_wrs_per_doorbell_count{transport=\"local\"}", 1);
	MOVED("kvbroker_metrics_scrapes_total{format=\"text\"}", 1);
	assert_true(metric(y, "kvbroker_transfer_duration_seconds_sum{outcome="
			      "\"done\"}") > 0);
	/* nothing failed */
	MOVED("kvbroker_worker_transfers_failed_total{" WORKER
	      ",reason=\"aborted\"}",
	      0);
	assert_true(metric(y, "kvbroker_transfers_active") == 0);
	free(a);
	free(b);
}

static void test_failure_reason(void **state)
{
	char *a, *b;

	(void) state;
	a = scrape(NULL);
	assert_int_equal(transfer("mx-abort", 1), -ECANCELED);
	b = scrape(NULL);
	assert_true(
		metric(http_body(b),
		       "kvbroker_transfers_failed_total{reason=\"aborted\"}") -
			metric(http_body(a), "kvbroker_transfers_failed_"
					     "total{reason=\"aborted\"}") ==
		1);
	assert_true(metric(http_body(b),
			   "kvbroker_worker_transfers_failed_total{" WORKER
			   ",reason=\"aborted\"}") == 1);
	assert_true(metric(http_body(b), "kvbroker_transfer_duration_seconds_"
					 "count{outcome=\"failed\"}") == 1);
	free(a);
	free(b);
}

/* raw request -> status, and the refusal counted under reason */
static void refused(const char *req, size_t len, int status, const char *reason)
{
	char series[128], *r = NULL, *m;
	double before, after;

	snprintf(series, sizeof(series),
		 "kvbroker_metrics_refused_total{reason=\"%s\"}", reason);
	m = scrape(NULL);
	before = metric(http_body(m), series);
	free(m);
	assert_int_equal(http_raw(port, req, len, &r, 5000), 0);
	assert_int_equal(http_status(r), status);
	free(r);
	m = scrape(NULL);
	after = metric(http_body(m), series);
	free(m);
	assert_true(after - before == 1);
}

static void test_refusals(void **state)
{
	static char big[12000];
	int n;

	(void) state;
	refused("POST /metrics HTTP/1.1\r\n\r\n", 26, 405, "method");
	refused("HEAD /metrics HTTP/1.0\r\n\r\n", 26, 405, "method");
	refused("GET /secret HTTP/1.1\r\n\r\n", 24, 404, "not_found");
	refused("GET /metricsx HTTP/1.1\r\n\r\n", 26, 404, "not_found");
	refused("hello\r\n\r\n", 9, 400, "bad_request");
	refused("GET /metrics SPDY/3\r\n\r\n", 23, 400, "bad_request");
	/* a NUL byte before the blank line: 400 at once (it used to hide the
	 * blank line, and the connection held its slot for the 5 s timeout) */
	{
		int64_t t0 = now_ns();

		refused("GET /metrics\0 HTTP/1.1\r\n\r\n", 27, 400,
			"bad_request");
		refused("GET /metrics HTTP/1.1\r\nX: \0\r\n\r\n", 31, 400,
			"bad_request");
		assert_true(ms_since(t0) < 1000 + SLACK);
	}
	/* a request past 8 KiB without its end */
	n = snprintf(big, sizeof(big), "GET /metrics HTTP/1.1\r\nX-Pad: ");
	memset(big + n, 'a', sizeof(big) - (size_t) n - 1);
	refused(big, sizeof(big) - 1, 431, "too_large");
	/* the query string is allowed */
	{
		char *r = NULL;

		assert_int_equal(http_get(port, "/metrics?x=1", NULL, &r, 5000),
				 0);
		assert_int_equal(http_status(r), 200);
		free(r);
	}
}

/* Connect to port from the loopback address 127.0.0.<host>; fd or -errno. */
static int connect_from(uint8_t host)
{
	struct sockaddr_in me = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(0x7f000000u | host)};
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *) &me, sizeof(me)) < 0 ||
	    connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

/* Has the server closed fd (an EOF or a reset), within ms? */
static int closed_within(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000};
	char byte;
	ssize_t got;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	errno = 0;
	got = recv(fd, &byte, 1, 0);
	return got == 0 || (got < 0 && errno == ECONNRESET);
}

static double refused_count(const char *reason)
{
	char series[128], *r = scrape(NULL);
	double v;

	snprintf(series, sizeof(series),
		 "kvbroker_metrics_refused_total{reason=\"%s\"}", reason);
	v = metric(http_body(r), series);
	free(r);
	return v;
}

/*
 * Idle connections of one address: it holds 4 slots at most; a 5th takes
 * the place of its oldest (closed at once, counted `evicted`); a transfer
 * still runs meanwhile (the loop is not blocked); the idle ones are closed
 * after the 5 s timeout (not before), counted; scrapes work throughout.
 */
static void test_limits(void **state)
{
	int fds[PER_SOURCE + 1], i;
	double ev0 = refused_count("evicted"), to0 = refused_count("timeout");
	int64_t t0 = now_ns();
	char *r;
	double ms;

	(void) state;
	for (i = 0; i < PER_SOURCE; i++) {
		fds[i] = connect_from(9);
		assert_true(fds[i] >= 0);
	}
	assert_int_equal(transfer("mx-busy", 0), 0);
	usleep(100000); /* the broker has accepted them */
	fds[PER_SOURCE] = connect_from(9);
	assert_true(fds[PER_SOURCE] >= 0);
	/* the oldest of that address gave its slot up, at once */
	assert_true(closed_within(fds[0], 1000 + SLACK));
	close(fds[0]);
	assert_true(refused_count("evicted") - ev0 == 1);
	/* the others are closed at the timeout */
	assert_true(closed_within(fds[1], 5000 + SLACK + 1000));
	ms = ms_since(t0);
	fprintf(stderr, "idle connection closed after %.0f ms\n", ms);
	assert_true(ms >= 5000 - 50); /* the accept was a little later */
	assert_true(ms <= 5000 + SLACK + 500);
	for (i = 2; i <= PER_SOURCE; i++)
		assert_true(closed_within(fds[i], 6000 + SLACK));
	for (i = 1; i <= PER_SOURCE; i++)
		close(fds[i]);
	r = scrape(NULL);
	assert_true(metric(http_body(r), "kvbroker_metrics_refused_total{"
					 "reason=\"timeout\"}") -
			    to0 ==
		    PER_SOURCE);
	assert_true(metric(http_body(r), "kvbroker_metrics_connections") == 1);
	free(r);
	assert_true(broker_log_has(&fx.br, "metrics endpoint: request "
					   "refused (timeout)"));
}

/*
 * 16 slow clients (a byte a second, reconnecting when closed) do not blind
 * a scraper: every scrape during 6 s is answered 200, whether the slow ones
 * come from 16 other addresses (127.0.0.2..17) or from the scraper's own
 * (127.0.0.1). Before, the 16 held every slot and each scrape was closed
 * at accept.
 */
static void slow_clients(int own)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nX: ";
	int fds[MAXCONN], sent[MAXCONN] = {0}, ok = 0, scrapes = 0;
	int64_t t0 = now_ns(), last_byte = 0, last_scrape = 0;
	double worst = 0;

	for (int i = 0; i < MAXCONN; i++) {
		fds[i] = connect_from(own ? 1 : (uint8_t) (2 + i));
		assert_true(fds[i] >= 0);
	}
	while (ms_since(t0) < 6000) {
		if (ms_since(last_byte) >= 1000) { /* a byte a second each */
			last_byte = now_ns();
			for (int i = 0; i < MAXCONN; i++) {
				char byte;

				if (recv(fds[i], &byte, 1, MSG_DONTWAIT) == 0 ||
				    send(fds[i], req + sent[i] % 27, 1,
					 MSG_NOSIGNAL) < 0) {
					close(fds[i]); /* evicted: again */
					fds[i] = connect_from(
						own ? 1 : (uint8_t) (2 + i));
					assert_true(fds[i] >= 0);
					sent[i] = 0;
					continue;
				}
				sent[i]++;
			}
		}
		if (ms_since(last_scrape) >= 500) {
			char *r = NULL;
			int64_t s0 = now_ns();

			last_scrape = s0;
			scrapes++;
			if (http_get(port, "/metrics", NULL, &r, 3000) == 0 &&
			    http_status(r) == 200)
				ok++;
			if (ms_since(s0) > worst)
				worst = ms_since(s0);
			free(r);
		}
		usleep(20000);
	}
	fprintf(stderr,
		"16 slow clients from %s: %d of %d scrapes answered 200, the "
		"slowest in %.1f ms\n",
		own ? "the scraper's address" : "16 other addresses", ok,
		scrapes, worst);
	for (int i = 0; i < MAXCONN; i++)
		close(fds[i]);
	assert_int_equal(ok, scrapes);
	assert_true(scrapes >= 10);
}

static void test_slow_clients(void **state)
{
	(void) state;
	slow_clients(0);
	slow_clients(1);
	assert_true(refused_count("evicted") >= 1);
}

/* a bad --metrics-listen, or a port in use: the broker does not start */
static void test_bad_listen(void **state)
{
	static const char *const bad[][3] = {
		{"--metrics-listen", "localhost:19476", NULL},
		{"--metrics-listen", "127.0.0.1", NULL},
		{"--metrics-listen", "127.0.0.1:http", NULL},
		{"--metrics-listen", "[::1:19476", NULL},
		{"--metrics-listen", "127.0.0.1:70000", NULL},
	};
	char used[32];
	const char *const inuse[] = {"--metrics-listen", used, NULL};
	struct broker b;

	(void) state;
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct broker_opts o = {.args = bad[i]};

		/* a configuration error: exit 2 */
		assert_int_equal(broker_run_to_exit(&b, &o, 10000), 2);
		assert_true(broker_log_has(&b, "not ADDR:PORT"));
		broker_cleanup(&b);
	}
	/* the running broker's port */
	snprintf(used, sizeof(used), "127.0.0.1:%u", port);
	{
		struct broker_opts o = {.args = inuse};

		assert_int_equal(broker_run_to_exit(&b, &o, 10000), 1);
		assert_true(broker_log_has(&b, "Address already in use"));
		broker_cleanup(&b);
	}
}

static int fixture_setup_metrics(void **state)
{
	int rc = fixture_setup(state);

	if (rc)
		return rc;
	port = broker_metrics_port(&fx.br);
	if (!port) {
		broker_log_dump(&fx.br);
		return -1;
	}
	return 0;
}

int main(void)
{
	static const char *const args[] = {"--metrics-listen", "127.0.0.1:0",
					   NULL};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_openmetrics),
		cmocka_unit_test(test_counters_move),
		cmocka_unit_test(test_failure_reason),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_slow_clients),
		cmocka_unit_test(test_bad_listen),
	};

	fx.args = args;
	fx.size = SIZE;
	fx.seed = 7;
	return cmocka_run_group_tests(tests, fixture_setup_metrics,
				      fixture_teardown);
}

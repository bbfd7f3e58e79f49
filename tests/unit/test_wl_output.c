/* SPDX-License-Identifier: MIT */
/*
 * kvbench's --repeat arithmetic (bench/kvbench/wl_output.c): the median of
 * the trials figure by figure, n/a and failed trials, the counts summed,
 * and the JSON "trials" arrays (each trial, each pair's ratio).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbench.h"

static struct wl_figs trial(double bw, double rate, double post_cpu)
{
	return (struct wl_figs){.valid = 1,
				.wrs = 100,
				.bw_gbps = bw,
				.msg_rate_mps = rate,
				.post_cpu_us_per_wr = post_cpu,
				.verified_bytes = 10,
				.failed = 0};
}

static void median_odd_even(void **state)
{
	struct wl_figs t[4] = {trial(3, 30, 1), trial(1, 10, 2),
			       trial(2, 20, 3), trial(10, 5, 4)};
	struct wl_figs m;

	(void) state;
	/* odd: the middle value of each figure on its own */
	wl_figs_median(t, 3, &m);
	assert_true(m.valid);
	assert_true(m.bw_gbps == 2);
	assert_true(m.msg_rate_mps == 20);
	assert_true(m.post_cpu_us_per_wr == 2);
	assert_true(m.wrs == 100);
	/* even: the mean of the two middle values */
	wl_figs_median(t, 4, &m);
	assert_true(m.bw_gbps == 2.5);
	assert_true(m.msg_rate_mps == 15);
	assert_true(m.post_cpu_us_per_wr == 2.5);
	/* the trials themselves are not reordered */
	assert_true(t[0].bw_gbps == 3 && t[3].bw_gbps == 10);
}

static void median_na_invalid_counts(void **state)
{
	struct wl_figs t[3] = {trial(1, 10, NAN), trial(5, 50, 1),
			       trial(3, 30, 2)};
	struct wl_figs m;

	(void) state;
	t[1].valid = 0; /* a failed trial: not in the medians */
	t[1].failed = 4;
	t[2].bad_bytes = 7;
	wl_figs_median(t, 3, &m);
	assert_true(m.valid);
	assert_true(m.bw_gbps == 2);		  /* of 1 and 3 */
	assert_true(isnan(m.post_cpu_us_per_wr)); /* n/a in one: n/a */
	assert_int_equal(m.failed, 4);
	assert_int_equal(m.bad_bytes, 7);
	assert_int_equal(m.verified_bytes, 30);
	/* no valid trial: not valid, figures n/a */
	t[0].valid = t[2].valid = 0;
	wl_figs_median(t, 3, &m);
	assert_false(m.valid);
	assert_true(isnan(m.bw_gbps));
}

/* the text of FILE (malloc'd) */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *b = calloc(1, 1 << 16);

	assert_non_null(f);
	assert_non_null(b);
	assert_true(fread(b, 1, (1 << 16) - 1, f) > 0);
	fclose(f);
	return b;
}

static void json_trials(void **state)
{
	static struct wl_figs tr[1][WL_NMODES][KVB_BENCH_MAX_REPEAT];
	struct wl_figs res[1][WL_NMODES] = {{{0}}};
	char path[] = "/tmp/kvb-wl-json.XXXXXX";
	struct wl_cfg c = {.layers = 1,
			   .blocks = 1,
			   .block_bytes = 8,
			   .requests = 1,
			   .iters = 1,
			   .repeat = 3,
			   .json = path};
	unsigned ws[1] = {2};
	int fd = mkstemp(path);
	char *j;

	(void) state;
	assert_true(fd >= 0);
	close(fd);
	tr[0][0][0] = trial(2, 1, 1);
	tr[0][0][1] = trial(4, 1, 1);
	tr[0][0][2] = trial(8, 1, 1);
	tr[0][1][0] = trial(1, 1, 1);
	tr[0][1][1] = trial(4, 1, 1);
	tr[0][1][2] = trial(10, 1, 1);
	tr[0][1][1].valid = 0; /* broker trial 2 failed */
	for (int m = 0; m < 2; m++)
		wl_figs_median(tr[0][m], 3, &res[0][m]);
	assert_true(res[0][0].bw_gbps == 4);
	assert_true(res[0][1].bw_gbps == 5.5);
	assert_int_equal(
		wl_write_json(
			&c, ws, 1, (const struct wl_figs(*)[WL_NMODES]) res,
			(const struct wl_figs(*)[WL_NMODES][KVB_BENCH_MAX_REPEAT]) tr,
			NULL),
		0);
	j = slurp(path);
	unlink(path);
	assert_non_null(strstr(j, "\"repeat\":3"));
	/* each mode: its trials; the ratio: each pair's, null for the failed */
	assert_non_null(strstr(j, "\"bw_gbps\":[2,4,8]"));
	assert_non_null(strstr(j, "\"bw_gbps\":[1,null,10]"));
	assert_non_null(strstr(j, "\"bw_gbps\":[0.5,null,1.25]"));
	/* the ratio of the medians */
	assert_non_null(strstr(j, "\"bw_gbps\":1.375"));
	free(j);
	/* one trial: no "trials" key */
	c.repeat = 1;
	assert_int_equal(wl_write_json(&c, ws, 1,
				       (const struct wl_figs(*)[WL_NMODES]) res, NULL,
				       NULL),
			 0);
	j = slurp(path);
	unlink(path);
	assert_null(strstr(j, "\"trials\""));
	free(j);
}

/* every string written to the JSON is escaped: --broker-opts, the rdma
 * device ($KVB_RDMA_DEV), bytes that are not UTF-8 */
static void json_strings_escaped(void **state)
{
	struct wl_figs res[1][WL_NMODES] = {{trial(1, 1, NAN), trial(1, 1, 1)}};
	char path[] = "/tmp/kvb-wl-json.XXXXXX";
	struct bench_net nw = {.rdma = 1};
	struct wl_cfg c = {.layers = 1,
			   .blocks = 1,
			   .block_bytes = 8,
			   .requests = 1,
			   .iters = 1,
			   .repeat = 1,
			   .transport = KVB_BENCH_TR_RDMA,
			   .nw = &nw,
			   .broker_opts = "a\"b\\c\t\xff\xc3\xa9",
			   .json = path};
	unsigned ws[1] = {1};
	int fd = mkstemp(path);
	char *j;

	(void) state;
	assert_true(fd >= 0);
	close(fd);
	snprintf(nw.rdma_dev, sizeof(nw.rdma_dev), "rx\"e0");
	snprintf(nw.ip[0], sizeof(nw.ip[0]), "192.0.2.1");
	assert_int_equal(wl_write_json(&c, ws, 1,
				       (const struct wl_figs(*)[WL_NMODES]) res, NULL,
				       NULL),
			 0);
	j = slurp(path);
	unlink(path);
	assert_non_null(strstr(
		j, "\"broker_opts\":\"a\\\"b\\\\c\\u0009\\ufffd\xc3\xa9\","));
	assert_non_null(strstr(j, "\"device\":\"rx\\\"e0\","));
	/* post_cpu n/a: null, in the figures and in the ratio */
	assert_non_null(strstr(j, "\"post_cpu_us_per_wr\":null"));
	assert_null(strstr(j, "nan"));
	free(j);
}

/* rdma post_cpu: the sampled CPU over the sampled doorbells' WRs */
static void sampled_post_cpu(void **state)
{
	/* direct: two workers' transports summed */
	double d_ns = 1.5e6 + 2.5e6, d_wrs = 160 + 240;
	/* broker: a delta of the P broker's stats, fewer WRs sampled */
	double b_ns = 9.0e6 - 8.0e6, b_wrs = 3400 - 3000;

	(void) state;
	assert_float_equal(wl_sampled_us_per_wr(d_ns, d_wrs), 10.0, 1e-9);
	assert_float_equal(wl_sampled_us_per_wr(b_ns, b_wrs), 2.5, 1e-9);
	assert_float_equal(wl_sampled_us_per_wr(d_ns, d_wrs) /
				   wl_sampled_us_per_wr(b_ns, b_wrs),
			   4.0, 1e-9);
	/* nothing sampled: n/a, never 0 */
	assert_true(isnan(wl_sampled_us_per_wr(0, 0)));
	assert_true(isnan(wl_sampled_us_per_wr(5e3, 0)));
	/* net of the clock a sum can fall below 0: 0 */
	assert_float_equal(wl_sampled_us_per_wr(-20, 16), 0, 0);
	/* the footer says what is measured */
	assert_non_null(strstr(wl_rdma_post_note, "CLOCK_THREAD_CPUTIME_ID"));
	assert_non_null(strstr(wl_rdma_post_note, "1 in 16 doorbells"));
	assert_non_null(strstr(wl_rdma_post_note, "post_cpu_wrs"));
	assert_null(strstr(wl_rdma_post_note, "not CPU time"));
}

/* rdma JSON: the wall figure next to the CPU one, and what each is */
static void json_rdma_post_wall(void **state)
{
	struct wl_figs res[1][WL_NMODES] = {
		{trial(1, 1, 6.5), trial(1, 1, 2.5)}};
	char path[] = "/tmp/kvb-wl-json.XXXXXX";
	struct bench_net nw = {.rdma = 1};
	struct wl_cfg c = {.layers = 1,
			   .blocks = 1,
			   .block_bytes = 8,
			   .requests = 1,
			   .iters = 1,
			   .repeat = 1,
			   .transport = KVB_BENCH_TR_RDMA,
			   .nw = &nw,
			   .json = path};
	unsigned ws[1] = {8};
	int fd = mkstemp(path);
	char *j;

	(void) state;
	res[0][0].post_wall_us_per_wr = 51.25;
	res[0][0].post_cpu_wrs = 640;
	res[0][1].post_wall_us_per_wr = 20.5;
	res[0][1].post_cpu_wrs = 2752;
	assert_true(fd >= 0);
	close(fd);
	snprintf(nw.rdma_dev, sizeof(nw.rdma_dev), "rxe0");
	snprintf(nw.ip[0], sizeof(nw.ip[0]), "192.0.2.1");
	assert_int_equal(wl_write_json(&c, ws, 1,
				       (const struct wl_figs(*)[WL_NMODES]) res, NULL,
				       NULL),
			 0);
	j = slurp(path);
	unlink(path);
	assert_non_null(strstr(j, "\"post_wall_us_per_wr\":51.25"));
	assert_non_null(strstr(j, "\"post_wall_us_per_wr\":20.5"));
	assert_non_null(strstr(j, "\"post_cpu_wrs\":640"));
	assert_non_null(strstr(j, "\"post_cpu_wrs\":2752"));
	assert_non_null(strstr(j, "thread CPU inside the P workers' "
				  "ibv_post_send on 1 in 16 doorbells"));
	assert_non_null(strstr(j, "thread CPU inside the P broker's "
				  "ibv_post_send on 1 in 16 doorbells"));
	assert_null(strstr(j, "\"wall time inside"));
	free(j);
}

/* wl_output.c names UCX's version in config.ucx (wl_ucx.c is not linked) */
const char *wl_ucx_version(void)
{
	return "9.8.7";
}

/* three modes: each one's figures, the three ratios, config.ucx */
static void json_ucx_modes(void **state)
{
	struct wl_figs res[1][WL_NMODES] = {
		{trial(2, 4, 1), trial(8, 16, 1), trial(4, 2, 1)}};
	char path[] = "/tmp/kvb-wl-json.XXXXXX";
	struct wl_cfg c = {.layers = 1,
			   .blocks = 1,
			   .block_bytes = 8,
			   .requests = 1,
			   .iters = 1,
			   .repeat = 1,
			   .modes = MODE_DIRECT | MODE_BROKER | MODE_UCX,
			   .ucx_tls = "tcp",
			   .json = path};
	unsigned ws[1] = {4};
	int fd = mkstemp(path);
	char *j;

	(void) state;
	assert_true(fd >= 0);
	close(fd);
	res[0][2].doorbells = NAN;
	snprintf(c.ucx_dev[0], sizeof(c.ucx_dev[0]), "veth-p");
	assert_int_equal(wl_write_json(&c, ws, 1,
				       (const struct wl_figs(*)[WL_NMODES]) res,
				       NULL, "tcp/veth-p (am am_bw)"),
			 0);
	j = slurp(path);
	unlink(path);
	assert_non_null(strstr(j, "\"ucx\":{\"version\":\"9.8.7\",\"tls_set\":\"tcp\","));
	assert_non_null(strstr(j, "\"net_devices_set_p\":\"veth-p\""));
	assert_non_null(strstr(j, "\"p0_lanes\":\"tcp/veth-p (am am_bw)\""));
	assert_non_null(strstr(j, ",\"direct\":{"));
	assert_non_null(strstr(j, ",\"broker\":{"));
	assert_non_null(strstr(j, ",\"ucx\":{\"wrs\""));
	/* broker / direct 4, broker / ucx 2, ucx / direct 2 (bandwidth) */
	assert_non_null(strstr(j, "\"ratio\":{"));
	assert_non_null(strstr(j, "\"ratio_broker_ucx\":{"));
	assert_non_null(strstr(j, "\"ratio_ucx_direct\":{"));
	assert_null(strstr(j, "nan"));
	free(j);
	/* ucx not run: no ucx keys */
	res[0][2].valid = 0;
	c.modes = MODE_DIRECT | MODE_BROKER;
	assert_int_equal(wl_write_json(&c, ws, 1,
				       (const struct wl_figs(*)[WL_NMODES]) res,
				       NULL, NULL),
			 0);
	j = slurp(path);
	unlink(path);
	assert_null(strstr(j, "ucx"));
	free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(median_odd_even),
		cmocka_unit_test(median_na_invalid_counts),
		cmocka_unit_test(json_trials),
		cmocka_unit_test(json_strings_escaped),
		cmocka_unit_test(sampled_post_cpu),
		cmocka_unit_test(json_rdma_post_wall),
		cmocka_unit_test(json_ucx_modes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

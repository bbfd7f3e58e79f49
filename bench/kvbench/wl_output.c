/* SPDX-License-Identifier: MIT */
/* `kvbench workload` output: the perftest-style table, JSON, gnuplot PNG. */
#include "kvbench.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define FIG(name)                                     \
	{                                             \
#name, offsetof(struct wl_figs, name) \
	}
const char wl_rdma_post_note[] =
	"post_cpu: thread CPU time (CLOCK_THREAD_CPUTIME_ID) inside "
	"ibv_post_send on a random 1 in 16 doorbells, net of the clock's "
	"cost, / the WRs of those doorbells; direct = the P workers' "
	"transports, broker = the P broker's (stats post_cpu_ns / "
	"post_cpu_wrs); JSON post_wall_us_per_wr = wall time of every call "
	"/ WRs; cpu = P workers + D side + brokers";

double wl_sampled_us_per_wr(double post_cpu_ns, double post_cpu_wrs)
{
	if (!(post_cpu_wrs > 0))
		return NAN; /* no doorbell sampled: not measured */
	return post_cpu_ns > 0 ? post_cpu_ns / 1e3 / post_cpu_wrs : 0;
}

static const struct {
	const char *name;
	size_t off;
} figs[] = {
	FIG(wrs),
	FIG(doorbells),
	FIG(wr_per_doorbell),
	FIG(post_cpu_us_per_wr),
	FIG(msg_rate_mps),
	FIG(bw_gbps),
	FIG(lat_p50_us),
	FIG(lat_p99_us),
	FIG(lat_p999_us),
	FIG(cpu_s),
	FIG(worker_post_cpu_us_per_wr),
	FIG(cpu_workers_s),
	FIG(cpu_broker_s),
	FIG(elapsed_s),
	FIG(descs),
	FIG(bytes),
	FIG(open_wait_s),
	FIG(cpu_d_s),
	FIG(layer_ops),
	FIG(post_wall_us_per_wr),
	FIG(post_cpu_wrs),
};
#define NFIGS_RATIO 10u /* the figures: ratio for these */

static double fig(const struct wl_figs *f, unsigned i)
{
	return *(const double *) ((const char *) f + figs[i].off);
}

/* broker / direct; NAN (n/a) when either is n/a, 0 when direct is 0 */
static double ratio(const struct wl_figs *d, const struct wl_figs *b,
		    unsigned i)
{
	if (isnan(fig(d, i)) || isnan(fig(b, i)))
		return NAN;
	return fig(d, i) > 0 ? fig(b, i) / fig(d, i) : 0;
}

/* a JSON number, null for n/a */
static void json_num(FILE *f, double v)
{
	if (isnan(v))
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
}

/* v with 3 decimals, "n/a" for NAN */
static const char *col3(char *buf, size_t cap, double v)
{
	if (isnan(v))
		snprintf(buf, cap, "n/a");
	else
		snprintf(buf, cap, "%.3f", v);
	return buf;
}

/* the length of the valid UTF-8 sequence at s (1-4), 0 if none */
static unsigned utf8_len(const unsigned char *s)
{
	unsigned n, i;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* overlong, surrogates, past U+10FFFF */
	if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return n;
}

/* s inside a JSON string: quotes, backslashes, control bytes escaped;
 * bytes that are not UTF-8 become U+FFFD (a JSON text is UTF-8) */
static void json_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *) s;

	while (*p) {
		unsigned n = utf8_len(p);

		if (!n) {
			fputs("\\ufffd", f);
			p++;
		} else if (*p == '"' || *p == '\\') {
			fprintf(f, "\\%c", *p++);
		} else if (*p < 0x20 || *p == 0x7f) {
			fprintf(f, "\\u%04x", *p++);
		} else {
			fwrite(p, 1, n, f);
			p += n;
		}
	}
}

/* "key":"s", with s escaped */
static void json_key_str(FILE *f, const char *key, const char *s)
{
	fprintf(f, "\"%s\":\"", key);
	json_str(f, s);
	fputs("\",", f);
}

static const char *tr_name(const struct wl_cfg *c)
{
	return c->transport == KVB_BENCH_TR_RDMA  ? "rdma"
	       : c->transport == KVB_BENCH_TR_TCP ? "tcp"
	       : c->transport == KVB_BENCH_TR_GPU ? "gpu"
						  : "local";
}

static int gpu_host(const struct wl_cfg *c)
{
	return c->transport == KVB_BENCH_TR_GPU && !strcmp(c->gpu_name, "host");
}

void wl_table_header(void)
{
	printf("%-7s %4s %8s %10s %10s %9s %8s %12s %10s %9s %9s %9s %9s %8s\n",
	       "mode", "#W", "#bytes", "#descs", "doorbells", "WR/db",
	       "post_cpu", "MsgRate", "BW", "p50", "p99", "p99.9", "cpu",
	       "verify");
	printf("%-7s %4s %8s %10s %10s %9s %8s %12s %10s %9s %9s %9s %9s %8s\n",
	       "", "", "", "", "", "", "[us/WR]", "[Mdesc/s]", "[GB/s]", "[us]",
	       "[us]", "[us]", "[s]", "");
}

/* v with `prec` decimals, "n/a" for NAN */
static const char *colp(char *buf, size_t cap, double v, int prec)
{
	if (isnan(v))
		snprintf(buf, cap, "n/a");
	else
		snprintf(buf, cap, "%.*f", prec, v);
	return buf;
}

const char *const wl_mode_name[WL_NMODES] = {"direct", "broker", "ucx"};
const struct wl_ratio_def wl_ratios[3] = {
	{1, 0, "ratio", "ratio", "broker / direct"},
	{1, 2, "b/ucx", "ratio_broker_ucx", "broker / ucx"},
	{2, 0, "ucx/d", "ratio_ucx_direct", "ucx / direct"},
};

void wl_table_row(const char *mode, unsigned w, const struct wl_cfg *c,
		  const struct wl_figs *f)
{
	char pc[32], db[32], wd[32];

	printf("%-7s %4u %8llu %10.0f %10s %9s %8s %12.3f %10.3f %9.1f "
	       "%9.1f %9.1f %9.2f %8s\n",
	       mode, w, (unsigned long long) c->block_bytes, f->descs,
	       colp(db, sizeof(db), f->doorbells, 0),
	       colp(wd, sizeof(wd), f->wr_per_doorbell, 2),
	       col3(pc, sizeof(pc), f->post_cpu_us_per_wr), f->msg_rate_mps,
	       f->bw_gbps, f->lat_p50_us, f->lat_p99_us, f->lat_p999_us,
	       f->cpu_s,
	       !c->verify     ? "off"
	       : f->bad_bytes ? "BAD"
			      : "ok");
}

void wl_ratio_row(const char *label, unsigned w, const struct wl_figs *d,
		  const struct wl_figs *b)
{
	double r[16];
	char pc[32], db[32], wd[32];

	for (unsigned i = 0; i < NFIGS_RATIO; i++)
		r[i] = ratio(d, b, i);
	printf("%-7s %4u %8s %10s %10s %9s %8s %12.3f %10.3f %9.2f %9.2f "
	       "%9.2f %9.2f\n",
	       label, w, "", "", colp(db, sizeof(db), r[1], 3),
	       colp(wd, sizeof(wd), r[2], 2), col3(pc, sizeof(pc), r[3]), r[4],
	       r[5], r[6], r[7], r[8], r[9]);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

/* the median of v[0..n) (sorted in place): NAN when any is NAN */
static double median(double *v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (isnan(v[i]))
			return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void wl_figs_median(const struct wl_figs *t, unsigned n, struct wl_figs *out)
{
	double v[KVB_BENCH_MAX_REPEAT];
	unsigned k, m;

	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < sizeof(figs) / sizeof(figs[0]); i++) {
		for (k = 0, m = 0; k < n; k++)
			if (t[k].valid)
				v[m++] = fig(&t[k], i);
		*(double *) ((char *) out + figs[i].off) =
			m ? median(v, m) : NAN;
	}
	for (k = 0; k < n; k++) {
		out->valid |= t[k].valid;
		out->verified_bytes += t[k].verified_bytes;
		out->bad_bytes += t[k].bad_bytes;
		out->failed += t[k].failed;
	}
}

void wl_trials_row(const struct wl_cfg *c, const char *name,
		   const struct wl_figs *den, const struct wl_figs *num)
{
	static const char *const what[2] = {"BW", "MsgRate"};

	for (int w = 0; w < 2; w++) {
		unsigned i = w ? 4 : 5; /* msg_rate_mps, bw_gbps */

		printf("  %s %s per trial pair:", what[w], name ? name : "ratio");
		for (unsigned k = 0; k < c->repeat; k++) {
			if (den[k].valid && num[k].valid)
				printf(" %.3f", ratio(&den[k], &num[k], i));
			else
				printf(" -");
		}
		printf("\n");
	}
}

/*
 * ,"trials":{"wrs":[...],...}: the figures trial by trial; for the
 * ratio (d set) the ratio of each trial pair
 */
static void json_trials(FILE *f, const struct wl_cfg *c,
			const struct wl_figs *d, const struct wl_figs *x)
{
	fputs(",\"trials\":{", f);
	for (unsigned i = 0; i < NFIGS_RATIO; i++) {
		fprintf(f, "%s\"%s\":[", i ? "," : "", figs[i].name);
		for (unsigned k = 0; k < c->repeat; k++) {
			fputs(k ? "," : "", f);
			if (!x[k].valid || (d && !d[k].valid))
				fputs("null", f);
			else
				json_num(f, d ? ratio(&d[k], &x[k], i)
					      : fig(&x[k], i));
		}
		fputs("]", f);
	}
	fputs("}", f);
}

static void json_figs(FILE *f, const struct wl_cfg *c, const char *key,
		      const struct wl_figs *x, const struct wl_figs *tr,
		      int mode)
{
	int broker = mode == 1, ucx = mode == 2;

	fprintf(f, "\"%s\":{", key);
	for (unsigned i = 0; i < sizeof(figs) / sizeof(figs[0]); i++) {
		fprintf(f, "%s\"%s\":", i ? "," : "", figs[i].name);
		json_num(f, fig(x, i));
	}
	if (tr)
		json_trials(f, c, NULL, tr);
	fprintf(f,
		",\"post_cpu_source\":\"%s\",\"verified_bytes\":%llu,"
		"\"bad_bytes\":%llu,\"failed\":%llu}",
		c->transport == KVB_BENCH_TR_TCP
			? "n/a on tcp: sending continues in poll() after "
			  "post() (rest of a sendmsg, acks)"
		: ucx ? "thread CPU of one (request, layer)'s ucp_put_nbx "
			"calls in 16, net of the clock / their puts; doorbells "
			"n/a (UCX counts none)"
		: c->transport == KVB_BENCH_TR_RDMA
			? (broker ? "thread CPU inside the P broker's "
				    "ibv_post_send on 1 in 16 doorbells, net "
				    "of the clock (stats post_cpu_ns) / their "
				    "WRs (post_cpu_wrs); post_wall: wall time "
				    "of every call (post_ns) / WRs"
				  : "thread CPU inside the P workers' "
				    "ibv_post_send on 1 in 16 doorbells, net "
				    "of the clock (stats post_cpu_ns) / their "
				    "WRs (post_cpu_wrs); post_wall: wall time "
				    "of every call (post_ns) / WRs")
		: broker ? "broker process CPU / WRs (upper bound)"
			 : "thread CPU inside post() / WRs",
		(unsigned long long) x->verified_bytes,
		(unsigned long long) x->bad_bytes,
		(unsigned long long) x->failed);
}

/*
 * every mode that ran ("direct", "broker", "ucx") and every ratio whose
 * two modes ran ("ratio" = broker / direct, "ratio_broker_ucx",
 * "ratio_ucx_direct"), each after a comma; with trials (t:
 * [mode][trial]), each also gets "trials"
 */
static void json_modes(FILE *f, const struct wl_cfg *c,
		       const struct wl_figs *res,
		       const struct wl_figs (*t)[KVB_BENCH_MAX_REPEAT])
{
	for (unsigned m = 0; m < WL_NMODES; m++)
		if (res[m].valid) {
			fputs(",", f);
			json_figs(f, c, wl_mode_name[m], &res[m],
				  t ? t[m] : NULL, (int) m);
		}
	for (unsigned r = 0; r < 3; r++) {
		const struct wl_figs *d = &res[wl_ratios[r].den],
				     *b = &res[wl_ratios[r].num];

		if (!d->valid || !b->valid)
			continue;
		fprintf(f, ",\"%s\":{", wl_ratios[r].key);
		for (unsigned i = 0; i < NFIGS_RATIO; i++) {
			fprintf(f, "%s\"%s\":", i ? "," : "", figs[i].name);
			json_num(f, ratio(d, b, i));
		}
		if (t)
			json_trials(f, c, t[wl_ratios[r].den],
				    t[wl_ratios[r].num]);
		fputs("}", f);
	}
}

static void json_point(FILE *f, const struct wl_cfg *c, unsigned w,
		       const struct wl_figs *res,
		       const struct wl_figs (*t)[KVB_BENCH_MAX_REPEAT])
{
	fprintf(f, "{\"workers\":%u,\"iters\":%u", w, wl_iters_for(c, w));
	json_modes(f, c, res, t);
	fputs("}", f);
}

/* "ucx":{...}: the version, what kvbench set, the UCX_* environment and
 * the lanes P0's endpoint used */
static void json_ucx(FILE *f, const struct wl_cfg *c, const char *info)
{
	extern char **environ;
	char env[1024];
	size_t used = 0;

	env[0] = 0;
	for (char **e = environ; *e; e++)
		if (!strncmp(*e, "UCX_", 4) && used < sizeof(env))
			used += (size_t) snprintf(env + used,
						  sizeof(env) - used, "%s%s",
						  used ? " " : "", *e);
	fputs("\"ucx\":{", f);
	json_key_str(f, "version",
		     wl_ucx_version() ? wl_ucx_version() : "");
	json_key_str(f, "tls_set", c->ucx_tls ? c->ucx_tls : "");
	json_key_str(f, "net_devices_set_p", c->ucx_dev[0]);
	json_key_str(f, "net_devices_set_d", c->ucx_dev[1]);
	json_key_str(f, "environment", env);
	fputs("\"p0_lanes\":\"", f);
	json_str(f, info ? info : "");
	fputs("\"},", f);
}

static void json_config(FILE *f, const struct wl_cfg *c, const char *ucx)
{
	fprintf(f, "\"config\":{\"transport\":\"%s\",", tr_name(c));
	if (c->modes & MODE_UCX)
		json_ucx(f, c, ucx);
	if (c->transport == KVB_BENCH_TR_GPU) {
		json_key_str(f, "gpu_backend", c->gpu_name);
		json_key_str(f, "gpu_backend_asked",
			     c->gpu_backend ? c->gpu_backend : "auto");
		fprintf(f, "\"gpu_devices\":%d,", c->gpu_devices);
		json_key_str(f, "measures",
			     gpu_host(c) ? "the host copy path (host backend: "
					   "memfd 'device memory', copies by "
					   "host threads), not a GPU"
					 : "GPU device memory, copies by the "
					   "GPU runtime (device 0)");
	}
	if (c->nw && c->nw->rdma) {
		json_key_str(f, "placement", "rdma");
		json_key_str(f, "device", c->nw->rdma_dev);
		json_key_str(f, "host_ip", c->nw->ip[0]);
		json_key_str(f, "placement_note",
			     "one device, two brokers on one address, "
			     "distinct ports");
	} else if (c->nw) {
		json_key_str(f, "placement",
			     c->nw->netns ? "netns" : "loopback");
		json_key_str(f, "p_ip", c->nw->ip[0]);
		json_key_str(f, "d_ip", c->nw->ip[1]);
		json_key_str(f, "placement_note",
			     c->nw->netns ? "two network namespaces, veth pair"
					  : c->nw->why);
	}
	fprintf(f,
		"\"layers\":%u,\"blocks\":%u,\"block_bytes\":%llu,"
		"\"requests\":%u,",
		c->layers, c->blocks, (unsigned long long) c->block_bytes,
		c->requests);
	/* --iters-total: steps per worker depend on W (each point has its
	 * "iters") */
	if (c->iters_total)
		fprintf(f, "\"iters\":null,\"iters_total\":%u,",
			c->iters_total);
	else
		fprintf(f, "\"iters\":%u,\"iters_total\":null,", c->iters);
	fprintf(f, "\"rate\":%g,\"verify\":%s,", c->rate,
		c->verify ? "true" : "false");
	json_key_str(f, "broker_opts", c->broker_opts ? c->broker_opts : "");
	fprintf(f, "\"repeat\":%u,\"figures_are\":\"%s\"}", c->repeat,
		c->repeat > 1 ? ((c->modes & MODE_UCX)
					 ? "the median of the trials, figure "
					   "by figure; ratio = median broker / "
					   "median direct, ratio_broker_ucx = "
					   "median broker / median ucx, "
					   "ratio_ucx_direct = median ucx / "
					   "median direct"
					 : "the median of the trials, figure "
					   "by figure; ratio = median broker / "
					   "median direct")
			      : "one trial");
}

int wl_write_json(const struct wl_cfg *c, const unsigned *ws, unsigned n,
		  const struct wl_figs (*res)[WL_NMODES],
		  const struct wl_figs (*trials)[WL_NMODES]
					       [KVB_BENCH_MAX_REPEAT],
		  const char *ucx_info)
{
	FILE *f = fopen(c->json, "w");

	if (!f) {
		fprintf(stderr, "kvbench: --json %s: %s\n", c->json,
			strerror(errno));
		return -1;
	}
	fputs("{", f);
	json_config(f, c, ucx_info);
	if (!c->nsweep) {
		/* one point: its keys at the top level */
		fprintf(f, ",\"workers\":%u,\"iters\":%u", ws[0],
			wl_iters_for(c, ws[0]));
		json_modes(f, c, res[0], trials ? trials[0] : NULL);
	} else {
		fputs(",\"sweep\":[", f);
		for (unsigned k = 0; k < n; k++) {
			fputs(k ? "," : "", f);
			json_point(f, c, ws[k], res[k],
				   trials ? trials[k] : NULL);
		}
		fputs("]", f);
	}
	fputs("}\n", f);
	return fclose(f) ? -1 : 0;
}

int wl_plot(const struct wl_cfg *c, const unsigned *ws, unsigned n,
	    const struct wl_figs (*res)[WL_NMODES])
{
	FILE *g = popen("gnuplot", "w");
	unsigned ran[WL_NMODES], nr = 0;
	double wmin = ws[0], wmax = ws[0];
	int rc;

	for (unsigned k = 1; k < n; k++) {
		wmin = ws[k] < wmin ? ws[k] : wmin;
		wmax = ws[k] > wmax ? ws[k] : wmax;
	}
	if (!g) {
		fprintf(stderr, "kvbench: --plot: cannot run gnuplot (apt-get "
				"install gnuplot-nox)\n");
		return -1;
	}
	fprintf(g,
		"set terminal pngcairo size 1200,480 font ',10'\n"
		"set output '%s'\n"
		"set multiplot layout 1,2 title 'kvbench workload, %s "
		"transport%s: "
		"%u layers x %u blocks x %llu B, %u requests/step'\n"
		"set logscale x 2\nset xlabel 'workers (P processes)'\n"
		"set grid\nset key top left\nset yrange [0:*]\n"
		"set xrange [%g:%g]\nset xtics (",
		c->plot, tr_name(c),
		gpu_host(c)    ? " (host backend: host copies, not a GPU)"
		: !c->nw       ? ""
		: c->nw->rdma  ? " (soft-RoCE / verbs device)"
		: c->nw->netns ? " (two network namespaces)"
			       : " (loopback)",
		c->layers, c->blocks, (unsigned long long) c->block_bytes,
		c->requests, wmin / 1.25, wmax * 1.25);
	for (unsigned k = 0; k < n; k++)
		fprintf(g, "%s%u", k ? "," : "", ws[k]);
	fputs(")\n", g);
	/* the modes that ran; ucx has no doorbell count: message rate only */
	for (unsigned m = 0; m < WL_NMODES; m++)
		if (c->modes & (1 << m))
			ran[nr++] = m;
	for (int panel = 0; panel < 2; panel++) {
		unsigned np = 0;

		fprintf(g, "set ylabel '%s'\nset title '%s'\nplot ",
			panel ? "WRs per doorbell" : "Mdesc/s",
			panel ? "WRs per doorbell" : "message rate");
		for (unsigned k = 0; k < nr; k++)
			if (!panel || ran[k] != 2)
				fprintf(g,
					"%s'-' using 1:2 with linespoints lw 2 "
					"title '%s'",
					np++ ? ", " : "", wl_mode_name[ran[k]]);
		fputs(np ? "\n" : "1/0 notitle\n", g);
		for (unsigned kk = 0; kk < nr; kk++) {
			unsigned m = ran[kk];

			if (panel && m == 2)
				continue;
			for (unsigned k = 0; k < n; k++)
				if (res[k][m].valid)
					fprintf(g, "%u %g\n", ws[k],
						panel ? res[k][m]
								.wr_per_doorbell
						      : res[k][m].msg_rate_mps);
			fputs("e\n", g);
		}
	}
	fputs("unset multiplot\n", g);
	rc = pclose(g);
	if (rc) {
		fprintf(stderr, "kvbench: gnuplot failed (status %d)\n", rc);
		return -1;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* `kvbench workload` output: the perftest-style table, JSON, gnuplot PNG. */
#include "kvbench.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

#define FIG(name)                                     \
	{                                             \
#name, offsetof(struct wl_figs, name) \
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
};
#define NFIGS_RATIO 10u /* the figures: ratio for these */

static double fig(const struct wl_figs *f, unsigned i)
{
	return *(const double *) ((const char *) f + figs[i].off);
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

void wl_table_row(const char *mode, unsigned w, const struct wl_cfg *c,
		  const struct wl_figs *f)
{
	printf("%-7s %4u %8llu %10.0f %10.0f %9.2f %8.3f %12.3f %10.3f %9.1f "
	       "%9.1f %9.1f %9.2f %8s\n",
	       mode, w, (unsigned long long) c->block_bytes, f->descs,
	       f->doorbells, f->wr_per_doorbell, f->post_cpu_us_per_wr,
	       f->msg_rate_mps, f->bw_gbps, f->lat_p50_us, f->lat_p99_us,
	       f->lat_p999_us, f->cpu_s,
	       !c->verify     ? "off"
	       : f->bad_bytes ? "BAD"
			      : "ok");
}

void wl_ratio_row(unsigned w, const struct wl_figs *d, const struct wl_figs *b)
{
	const struct wl_figs *x[2] = {d, b};
	double r[16];

	for (unsigned i = 0; i < NFIGS_RATIO; i++)
		r[i] = fig(x[0], i) > 0 ? fig(x[1], i) / fig(x[0], i) : 0;
	printf("%-7s %4u %8s %10s %10.3f %9.2f %8.3f %12.3f %10.3f %9.2f %9.2f "
	       "%9.2f %9.2f\n",
	       "ratio", w, "", "", r[1], r[2], r[3], r[4], r[5], r[6], r[7],
	       r[8], r[9]);
}

static void json_figs(FILE *f, const char *key, const struct wl_figs *x,
		      int broker)
{
	fprintf(f, "\"%s\":{", key);
	for (unsigned i = 0; i < sizeof(figs) / sizeof(figs[0]); i++)
		fprintf(f, "%s\"%s\":%.6g", i ? "," : "", figs[i].name,
			fig(x, i));
	fprintf(f,
		",\"post_cpu_source\":\"%s\",\"verified_bytes\":%llu,"
		"\"bad_bytes\":%llu,\"failed\":%llu}",
		broker ? "broker process CPU / WRs (upper bound)"
		       : "thread CPU inside post() / WRs",
		(unsigned long long) x->verified_bytes,
		(unsigned long long) x->bad_bytes,
		(unsigned long long) x->failed);
}

static void json_point(FILE *f, unsigned w, const struct wl_figs *d,
		       const struct wl_figs *b)
{
	int comma = 0;

	fprintf(f, "{\"workers\":%u", w);
	comma = 1;
	if (d->valid) {
		fputs(comma ? "," : "", f);
		json_figs(f, "direct", d, 0);
	}
	if (b->valid) {
		fputs(",", f);
		json_figs(f, "broker", b, 1);
	}
	if (d->valid && b->valid) {
		fputs(",\"ratio\":{", f);
		for (unsigned i = 0; i < NFIGS_RATIO; i++)
			fprintf(f, "%s\"%s\":%.6g", i ? "," : "", figs[i].name,
				fig(d, i) > 0 ? fig(b, i) / fig(d, i) : 0);
		fputs("}", f);
	}
	fputs("}", f);
}

static void json_config(FILE *f, const struct wl_cfg *c)
{
	fprintf(f,
		"\"config\":{\"transport\":\"local\",\"layers\":%u,\"blocks\":%"
		"u,"
		"\"block_bytes\":%llu,\"requests\":%u,\"iters\":%u,\"rate\":%g,"
		"\"verify\":%s,\"broker_opts\":\"%s\"}",
		c->layers, c->blocks, (unsigned long long) c->block_bytes,
		c->requests, c->iters, c->rate, c->verify ? "true" : "false",
		c->broker_opts ? c->broker_opts : "");
}

int wl_write_json(const struct wl_cfg *c, const unsigned *ws, unsigned n,
		  const struct wl_figs (*res)[2])
{
	FILE *f = fopen(c->json, "w");

	if (!f) {
		fprintf(stderr, "kvbench: --json %s: %s\n", c->json,
			strerror(errno));
		return -1;
	}
	fputs("{", f);
	json_config(f, c);
	if (!c->nsweep) {
		/* one point: its keys at the top level */
		fprintf(f, ",\"workers\":%u", ws[0]);
		if (res[0][0].valid) {
			fputs(",", f);
			json_figs(f, "direct", &res[0][0], 0);
		}
		if (res[0][1].valid) {
			fputs(",", f);
			json_figs(f, "broker", &res[0][1], 1);
		}
		if (res[0][0].valid && res[0][1].valid) {
			fputs(",\"ratio\":{", f);
			for (unsigned i = 0; i < NFIGS_RATIO; i++)
				fprintf(f, "%s\"%s\":%.6g", i ? "," : "",
					figs[i].name,
					fig(&res[0][0], i) > 0
						? fig(&res[0][1], i) /
							  fig(&res[0][0], i)
						: 0);
			fputs("}", f);
		}
	} else {
		fputs(",\"sweep\":[", f);
		for (unsigned k = 0; k < n; k++) {
			fputs(k ? "," : "", f);
			json_point(f, ws[k], &res[k][0], &res[k][1]);
		}
		fputs("]", f);
	}
	fputs("}\n", f);
	return fclose(f) ? -1 : 0;
}

int wl_plot(const struct wl_cfg *c, const unsigned *ws, unsigned n,
	    const struct wl_figs (*res)[2])
{
	FILE *g = popen("gnuplot", "w");
	const char *col[2] = {"direct", "broker"};
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
		"set multiplot layout 1,2 title 'kvbench workload, local "
		"transport: "
		"%u layers x %u blocks x %llu B, %u requests/step'\n"
		"set logscale x 2\nset xlabel 'workers (P processes)'\n"
		"set grid\nset key top left\nset yrange [0:*]\n"
		"set xrange [%g:%g]\nset xtics (",
		c->plot, c->layers, c->blocks,
		(unsigned long long) c->block_bytes, c->requests, wmin / 1.25,
		wmax * 1.25);
	for (unsigned k = 0; k < n; k++)
		fprintf(g, "%s%u", k ? "," : "", ws[k]);
	fputs(")\n", g);
	for (int panel = 0; panel < 2; panel++) {
		fprintf(g, "set ylabel '%s'\nset title '%s'\nplot ",
			panel ? "WRs per doorbell" : "Mdesc/s",
			panel ? "WRs per doorbell" : "message rate");
		for (int m = 0; m < 2; m++)
			fprintf(g,
				"%s'-' using 1:2 with linespoints lw 2 title "
				"'%s'",
				m ? ", " : "", col[m]);
		fputs("\n", g);
		for (int m = 0; m < 2; m++) {
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

/* SPDX-License-Identifier: MIT */
/*
 * kvbench internals: shared by the subcommands (workload, rate, lat, ring).
 * Nothing here is exported: kvbench is one program.
 */
#ifndef KVB_BENCH_KVBENCH_H
#define KVB_BENCH_KVBENCH_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define KVB_BENCH_MAX_WORKERS 64u
#define KVB_BENCH_MAX_SWEEP   16u

enum { MODE_DIRECT = 1, MODE_BROKER = 2 };

/* The workload subcommand's knobs (see workload_usage()). */
struct wl_cfg {
	unsigned workers, layers, requests, blocks, iters;
	uint64_t block_bytes;
	double rate; /* requests/s, 0 = back to back */
	int modes;   /* MODE_* bits */
	int verify, progress;
	const char *json, *plot, *broker, *broker_opts;
	unsigned sweep[KVB_BENCH_MAX_SWEEP], nsweep;
};

/*
 * What one P worker reports (in shared memory, written by the child, read
 * by the parent after it exited). lat_us[] follows the struct.
 */
struct wl_pres {
	uint64_t descs, bytes, doorbells, wrs, failed;
	uint64_t post_cpu_ns; /* thread CPU inside post()/kvb_submit_write() */
	uint64_t ctl_ns;      /* wall time in kvb_transfer_open() round trips */
	uint64_t cpu_ns;      /* the worker process's CPU during the run */
	int64_t end_ns;	      /* CLOCK_MONOTONIC when its last request ended */
	uint64_t nlat;
	volatile uint64_t done; /* requests done so far (progress line) */
	uint64_t dbad;		/* D side: bad bytes (D workers use this) */
	uint64_t dchecked;	/* D side: bytes verified */
	int ok;			/* 1 = finished cleanly */
};

/* One mode's figures, as printed and written to JSON. */
struct wl_figs {
	int valid;
	double wrs, descs, doorbells, wr_per_doorbell, post_cpu_us_per_wr;
	double worker_post_cpu_us_per_wr, msg_rate_mps, bw_gbps;
	double lat_p50_us, lat_p99_us, lat_p999_us, cpu_s;
	double cpu_workers_s, cpu_broker_s, elapsed_s, bytes, open_wait_s;
	uint64_t verified_bytes, bad_bytes, failed;
};

/* A broker process kvbench started. */
struct bench_broker {
	pid_t pid;
	char sock[108];
};

/* common.c */
int64_t kvb_bench_now_ns(void);
uint64_t kvb_bench_thread_cpu_ns(void);
uint64_t kvb_bench_proc_cpu_ns(void);
/* utime + stime of pid from /proc, in seconds; -1 on error */
double kvb_bench_pid_cpu_s(pid_t pid);
/*
 * Parse an unsigned number with an optional K/M/G (binary) suffix into
 * [min, max]; on error print "kvbench: OPT: ..." and return -1.
 */
int kvb_bench_parse_u64(const char *opt, const char *arg, uint64_t min,
			uint64_t max, uint64_t *out);
int kvb_bench_parse_double(const char *opt, const char *arg, double min,
			   double max, double *out);
/* Refuse transports other than local with a clear message; 0 or -1. */
int kvb_bench_check_transport(const char *arg);
/* Sort samples and read the q-quantile (0..1); 0 if none. */
void kvb_bench_sort(double *v, size_t n);
double kvb_bench_quantile(const double *sorted, size_t n, double q);
/* Anonymous shared memory that survives fork; NULL on failure. */
void *kvb_bench_shared(size_t len);

/*
 * Start a broker on a private socket: path from --broker, $KVBROKER, or
 * the build tree next to kvbench. `extra` is a space-separated list of more
 * broker options (may be NULL). Waits until it answers. 0 or -1 (printed).
 */
int kvb_bench_broker_start(struct bench_broker *b, const char *path,
			   const char *extra, const char *more);
void kvb_bench_broker_stop(struct bench_broker *b);
/* The broker's JSON stats into buf; 0 or -errno. */
int kvb_bench_broker_stats(const struct bench_broker *b, char *buf, size_t cap);
/* "key":number in a JSON text; -1 if absent. */
double kvb_bench_json_num(const char *js, const char *key);
/* Is the progress line wanted (--progress, or stderr is a tty)? */
int kvb_bench_progress_wanted(int forced);

/*
 * workload.c / wl_workers.c. Workers pass two barriers with the parent:
 * write a byte to ready_fd, read one from go[0] (setup done), then the same
 * with go[1] (warm-up done); the measured run starts after the second.
 */
int kvb_bench_workload_main(int argc, char **argv);
size_t wl_pres_size(const struct wl_cfg *c);
int wl_direct_p(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go,
		struct wl_pres *res);
int wl_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go,
		struct wl_pres *res);
int wl_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res);
int wl_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res);
/* D-side slots per layer region: every request its own (verify) or R */
uint64_t wl_dslots(const struct wl_cfg *c);
uint64_t wl_region_bytes_p(const struct wl_cfg *c);
uint64_t wl_region_bytes_d(const struct wl_cfg *c);

/* wl_output.c: res[k][0] = direct, res[k][1] = broker at ws[k] workers */
void wl_table_header(void);
void wl_table_row(const char *mode, unsigned w, const struct wl_cfg *c,
		  const struct wl_figs *f);
void wl_ratio_row(unsigned w, const struct wl_figs *d, const struct wl_figs *b);
int wl_write_json(const struct wl_cfg *c, const unsigned *ws, unsigned n,
		  const struct wl_figs (*res)[2]);
int wl_plot(const struct wl_cfg *c, const unsigned *ws, unsigned n,
	    const struct wl_figs (*res)[2]);

/* micro.c */
int kvb_bench_rate_main(int argc, char **argv);
int kvb_bench_lat_main(int argc, char **argv);

#endif /* KVB_BENCH_KVBENCH_H */

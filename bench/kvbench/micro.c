/* SPDX-License-Identifier: MIT */
/*
 * `kvbench rate` and `kvbench lat`: the broker's own limits on the local
 * path, the Speed figures of the foundation issue.
 *
 *  rate: P worker processes keep the broker fed with tiny unsignaled writes
 *        in bursts; descriptors/s from the broker's descriptors_completed.
 *  lat:  one P worker, one small signaled write at a time, spinning on
 *        kvb_poll; the broker busy-polls (huge --busy-poll-us) so it never
 *        sleeps. Round trip = submit -> its completion polled.
 *
 * The D side is kvbench itself: it attaches as D rank 0 and owns the region
 * the writes land in.
 */
#include "kvbench.h"

#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"

#define DREGION_BYTES (1u << 20)

struct micro_cfg {
	unsigned workers, burst, seconds;
	unsigned timeout_s; /* lat: a round trip's deadline */
	uint64_t bytes, samples, warmup;
	const char *json, *broker, *broker_opts;
	int progress;
};

/* Shared with the children. */
struct micro_shared {
	volatile int stop;
	volatile uint64_t eagain[KVB_BENCH_MAX_WORKERS];
	volatile uint64_t errors[KVB_BENCH_MAX_WORKERS];
	volatile int ok[KVB_BENCH_MAX_WORKERS];
	uint64_t nlat;
	double lat_us[]; /* lat only */
};

static int p_setup(const char *sock, unsigned rank, unsigned size,
		   struct kvb_ctx **ctx, struct kvb_region *src,
		   struct kvb_remote_region *dst)
{
	struct kvb_attach_opts o = {.socket_path = sock,
				    .role = KVB_ROLE_P,
				    .tp_rank = rank,
				    .tp_size = size};
	int rc = kvb_attach(&o, ctx);

	if (!rc)
		rc = kvb_mem_alloc(*ctx, DREGION_BYTES, 0, 0, src);
	if (!rc)
		rc = kvb_mem_lookup(*ctx, KVB_ROLE_D, 0, 0, 0, dst);
	if (rc)
		fprintf(stderr, "kvbench: P%u setup: %s\n", rank,
			kvb_strerror(rc));
	return rc;
}

static int rate_worker(const struct micro_cfg *c, const char *sock,
		       unsigned rank, struct micro_shared *sh)
{
	struct kvb_desc *d = calloc(c->burst, sizeof(*d));
	struct kvb_completion comp[64];
	struct kvb_remote_region dst;
	struct kvb_region src;
	struct kvb_ctx *ctx;
	uint64_t slot = 0, nslots;
	unsigned iter = 0;

	if (!d || p_setup(sock, rank, c->workers, &ctx, &src, &dst))
		return 1;
	/* stride 2x the size: never contiguous, so the broker cannot merge
	 * and every descriptor is one WR */
	nslots = DREGION_BYTES / (2 * c->bytes);
	while (!sh->stop) {
		int rc;

		for (unsigned i = 0; i < c->burst; i++, slot++) {
			uint64_t off = (slot % nslots) * 2 * c->bytes;

			d[i] = (struct kvb_desc){.flags = KVB_DESC_UNSIGNALED,
						 .region = src.id,
						 .peer_region = dst.id,
						 .offset = off,
						 .peer_offset = off,
						 .len = c->bytes,
						 .tag = slot};
		}
		for (unsigned sent = 0; sent < c->burst && !sh->stop;) {
			rc = kvb_submit_write(ctx, d + sent, c->burst - sent);
			if (rc == -EAGAIN) {
				sh->eagain[rank]++;
				sched_yield();
				continue;
			}
			if (rc < 0) {
				fprintf(stderr, "kvbench: P%u: submit: %s\n",
					rank, kvb_strerror(rc));
				return 1;
			}
			sent += (unsigned) rc;
		}
		/* unsignaled: only refusals come back */
		if (++iter % 64 == 0 && (rc = kvb_poll(ctx, comp, 64)) > 0)
			sh->errors[rank] += (uint64_t) rc;
	}
	sh->ok[rank] = 1;
	kvb_detach(ctx);
	free(d);
	return 0;
}

static int lat_worker(const struct micro_cfg *c, const char *sock,
		      struct micro_shared *sh)
{
	struct kvb_completion comp[4];
	struct kvb_remote_region dst;
	struct kvb_region src;
	struct kvb_ctx *ctx;
	uint64_t i, total = c->warmup + c->samples;
	int64_t limit = (int64_t) c->timeout_s * 1000000000;
	unsigned spins = 0;
	int rc = 0;

	if (p_setup(sock, 0, 1, &ctx, &src, &dst))
		return 1;
	for (i = 0; i < total && !sh->stop; i++) {
		struct kvb_desc d = {.region = src.id,
				     .peer_region = dst.id,
				     .offset = (i % 1024) * 64,
				     .peer_offset = (i % 1024) * 64,
				     .len = c->bytes,
				     .tag = i};
		int64_t t0 = kvb_bench_now_ns(), t1;

		/* a stalled broker (stopped, starved) answers no more and
		 * does not die: give up at the deadline, the clock read
		 * only every 1024 spins, not to weigh on the round trip */
		while ((rc = kvb_submit_write(ctx, &d, 1)) == -EAGAIN)
			if (++spins % 1024 == 0 &&
			    kvb_bench_now_ns() - t0 > limit)
				goto stalled;
		if (rc < 0)
			goto fail;
		while ((rc = kvb_poll(ctx, comp, 4)) == 0)
			if (++spins % 1024 == 0 &&
			    kvb_bench_now_ns() - t0 > limit)
				goto stalled;
		t1 = kvb_bench_now_ns();
		if (rc < 0)
			goto fail;
		if (comp[0].status || comp[0].tag != i) {
			fprintf(stderr, "kvbench: lat: completion %llu: %s\n",
				(unsigned long long) comp[0].tag,
				kvb_strerror(comp[0].status));
			return 1;
		}
		if (i >= c->warmup)
			sh->lat_us[sh->nlat++] = (double) (t1 - t0) / 1e3;
	}
	sh->ok[0] = 1;
	kvb_detach(ctx);
	return 0;
fail:
	fprintf(stderr, "kvbench: lat: after %llu round trips: %s\n",
		(unsigned long long) i, kvb_strerror(rc));
	return 1;
stalled:
	/* no kvb_detach: it would wait for the stalled broker too */
	fprintf(stderr,
		"kvbench: lat: round trip %llu had no completion within %u s "
		"(--timeout): the broker is stalled (stopped? starved of "
		"CPU?)\n",
		(unsigned long long) i, c->timeout_s);
	return 1;
}

static void micro_usage(FILE *f, int lat)
{
	if (lat)
		fputs("Usage: kvbench lat [OPTIONS]\n"
		      "Broker round trip on the local path: one P worker "
		      "submits one signaled\n"
		      "write at a time and spins on kvb_poll for its "
		      "completion; the broker\n"
		      "busy-polls and never sleeps (--busy-poll-us 10000000). "
		      "Targets: p50 <= 2 us,\n"
		      "p99 <= 20 us.\n"
		      "  --samples N        measured round trips (default "
		      "200000)\n"
		      "  --warmup N         round trips not measured first "
		      "(default 10000)\n"
		      "  --bytes N          write size (default 8)\n"
		      "  --timeout S        give up when a round trip has "
		      "had no completion for S\n"
		      "                     seconds: the broker is stalled "
		      "(default 60)\n"
		      "Percentiles: nearest rank (p99 of N samples: the "
		      "ceil(0.99 N)-th smallest).\n",
		      f);
	else
		fputs("Usage: kvbench rate [OPTIONS]\n"
		      "Descriptors per second through the broker on the local "
		      "path: P workers\n"
		      "submit tiny unsignaled writes in bursts as fast as the "
		      "rings take them;\n"
		      "the rate is the broker's descriptors_completed over the "
		      "run. Writes are\n"
		      "strided so none merge: one descriptor = one WR. Target: "
		      ">= 10 M/s.\n"
		      "  --workers N        P worker processes (default 1, at "
		      "most "
		      "64)\n"
		      "  --burst N          descriptors per kvb_submit_write "
		      "(default 64)\n"
		      "  --bytes N          write size (default 64)\n"
		      "  --seconds S        measured time (default 3)\n",
		      f);
	fputs("  --json FILE        also write the results as JSON\n"
	      "  --transport T      local only (tcp: `kvbench workload "
	      "--transport tcp`)\n"
	      "  --broker PATH      kvbroker binary (default $KVBROKER, else "
	      "the build tree's)\n"
	      "  --broker-opts STR  more broker options, space-separated\n"
	      "  --progress         progress line on stderr (default: only on "
	      "a tty)\n",
	      f);
}

enum {
	O_WORKERS = 256,
	O_BURST,
	O_BYTES,
	O_SECONDS,
	O_SAMPLES,
	O_WARMUP,
	O_TIMEOUT,
	O_JSON,
	O_TRANSPORT,
	O_BROKER,
	O_BOPTS,
	O_PROGRESS,
	O_HELP,
};

static int micro_parse(struct micro_cfg *c, int lat, int argc, char **argv)
{
	static const struct option lo[] = {{"workers", 1, NULL, O_WORKERS},
					   {"burst", 1, NULL, O_BURST},
					   {"bytes", 1, NULL, O_BYTES},
					   {"seconds", 1, NULL, O_SECONDS},
					   {"samples", 1, NULL, O_SAMPLES},
					   {"warmup", 1, NULL, O_WARMUP},
					   {"timeout", 1, NULL, O_TIMEOUT},
					   {"json", 1, NULL, O_JSON},
					   {"transport", 1, NULL, O_TRANSPORT},
					   {"broker", 1, NULL, O_BROKER},
					   {"broker-opts", 1, NULL, O_BOPTS},
					   {"progress", 0, NULL, O_PROGRESS},
					   {"help", 0, NULL, O_HELP},
					   {NULL, 0, NULL, 0}};
	const char *sub = lat ? "lat" : "rate";
	uint64_t v;
	int o, li;

	optind = 1;
	opterr = 0;
	while ((li = -1, o = getopt_long(argc, argv, ":", lo, &li)) != -1) {
		const char *a = optarg;
		int rate_only =
			o == O_WORKERS || o == O_BURST || o == O_SECONDS;
		int lat_only =
			o == O_SAMPLES || o == O_WARMUP || o == O_TIMEOUT;

		if (li >= 0 && (lat ? rate_only : lat_only)) {
			fprintf(stderr,
				"kvbench %s: --%s is a `kvbench %s` option\n",
				sub, lo[li].name, lat ? "rate" : "lat");
			return -1;
		}
		switch (o) {
		case O_WORKERS:
			if (kvb_bench_parse_u64("--workers", a, 1,
						KVB_BENCH_MAX_WORKERS, &v))
				return -1;
			c->workers = (unsigned) v;
			break;
		case O_BURST:
			if (kvb_bench_parse_u64("--burst", a, 1, 4096, &v))
				return -1;
			c->burst = (unsigned) v;
			break;
		case O_BYTES:
			if (kvb_bench_parse_u64("--bytes", a, 1, 64 << 10, &v))
				return -1;
			c->bytes = v;
			break;
		case O_SECONDS:
			if (kvb_bench_parse_u64("--seconds", a, 1, 3600, &v))
				return -1;
			c->seconds = (unsigned) v;
			break;
		case O_SAMPLES:
			if (kvb_bench_parse_u64("--samples", a, 1, 100000000,
						&v))
				return -1;
			c->samples = v;
			break;
		case O_WARMUP:
			if (kvb_bench_parse_u64("--warmup", a, 0, 100000000,
						&v))
				return -1;
			c->warmup = v;
			break;
		case O_TIMEOUT:
			if (kvb_bench_parse_u64("--timeout", a, 1, 3600, &v))
				return -1;
			c->timeout_s = (unsigned) v;
			break;
		case O_JSON:
			c->json = a;
			break;
		case O_TRANSPORT:
			if (kvb_bench_check_transport(a, 0) < 0)
				return -1;
			break;
		case O_BROKER:
			c->broker = a;
			break;
		case O_BOPTS:
			c->broker_opts = a;
			break;
		case O_PROGRESS:
			c->progress = 1;
			break;
		case O_HELP:
			micro_usage(stdout, lat);
			return 1;
		case ':':
			fprintf(stderr, "kvbench: %s needs a value\n",
				argv[optind - 1]);
			return -1;
		default:
			kvb_bench_unknown_option(argv, lo, sub);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvbench: unexpected argument '%s'\n",
			argv[optind]);
		return -1;
	}
	if (lat && c->bytes > 64) {
		fprintf(stderr, "kvbench lat: --bytes: at most 64\n");
		return -1;
	}
	return 0;
}

/* kvbench as D rank 0: the region every write lands in. */
static int d_setup(const char *sock, struct kvb_ctx **ctx, struct kvb_region *r)
{
	struct kvb_attach_opts o = {
		.socket_path = sock, .role = KVB_ROLE_D, .tp_size = 1};
	int rc = kvb_attach(&o, ctx);

	if (!rc)
		rc = kvb_mem_alloc(*ctx, DREGION_BYTES, KVB_MEM_REMOTE_WRITE, 0,
				   r);
	if (rc)
		fprintf(stderr, "kvbench: D setup: %s\n", kvb_strerror(rc));
	return rc;
}

static int progress_end(const struct micro_cfg *c)
{
	if (kvb_bench_progress_wanted(c->progress))
		fprintf(stderr, "\r\033[K");
	return 0;
}

/* The broker's stats into buf; 0, or -1 with the reason printed. */
static int stats(const struct bench_broker *br, int lat, char *buf, size_t cap)
{
	int rc = kvb_bench_broker_stats(br, buf, cap);

	if (rc)
		fprintf(stderr, "kvbench %s: the broker's stats: %s%s\n",
			lat ? "lat" : "rate", kvb_strerror(rc),
			rc == -ETIMEDOUT ? " (the broker is stalled)" : "");
	return rc ? -1 : 0;
}

/*
 * Reap the workers; every run ends: a worker not gone within limit_s (one
 * stuck in the library or starved for minutes) is killed and counts as a
 * failure, named on stderr. limit_s 0: no limit (lat: each round trip has
 * its own --timeout).
 */
static int wait_children(pid_t *pids, unsigned n, unsigned limit_s)
{
	int64_t end =
		limit_s ? kvb_bench_now_ns() + (int64_t) limit_s * 1000000000
			: INT64_MAX;
	unsigned left = 0;
	int st, fails = 0;

	for (unsigned i = 0; i < n; i++)
		left += pids[i] > 0;
	while (left) {
		int late = kvb_bench_now_ns() > end;

		for (unsigned i = 0; i < n; i++) {
			pid_t r;

			if (pids[i] <= 0)
				continue;
			if (late) {
				fprintf(stderr,
					"kvbench: worker %u did not stop "
					"within %u s: killed\n",
					i, limit_s);
				kill(pids[i], SIGKILL);
			}
			r = waitpid(pids[i], &st, late ? 0 : WNOHANG);
			if (r == 0)
				continue;
			if (r != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st))
				fails++;
			pids[i] = 0;
			left--;
		}
		if (left)
			usleep(10000);
	}
	return fails;
}

static int micro_run(struct micro_cfg *c, int lat)
{
	size_t shm_len = sizeof(struct micro_shared) +
			 (lat ? c->samples * sizeof(double) : 0);
	struct micro_shared *sh = kvb_bench_shared(shm_len);
	static char js0[1 << 16], js1[1 << 16];
	pid_t pids[KVB_BENCH_MAX_WORKERS] = {0};
	struct bench_broker br = {0};
	struct kvb_ctx *dctx = NULL;
	struct kvb_region dreg;
	int rc = 1, fails, measured = lat;
	double cpu0, cpu1 = 0;
	int64_t t0, t1 = 0;
	FILE *jf;

	if (!sh) {
		perror("kvbench: shared memory");
		return 1;
	}
	kvb_bench_cleanup_init(); /* the broker's socket, on a signal too */
	if (kvb_bench_broker_start(&br, c->broker, c->broker_opts,
				   lat ? "--busy-poll-us 10000000" : NULL))
		goto out;
	if (d_setup(br.sock, &dctx, &dreg))
		goto out;
	if (stats(&br, lat, js0, sizeof(js0)))
		goto out;
	cpu0 = kvb_bench_pid_cpu_s(br.pid);
	t0 = kvb_bench_now_ns();
	for (unsigned i = 0; i < (lat ? 1 : c->workers); i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("kvbench: fork");
			sh->stop = 1;
			pids[i] = 0;
			goto out_wait;
		}
		if (!pids[i]) {
			/* dies with kvbench, whatever kills it */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			_exit(lat ? lat_worker(c, br.sock, sh)
				  : rate_worker(c, br.sock, i, sh));
		}
	}
	if (!lat) {
		/* attach and warm up, then measure a window of --seconds */
		usleep(300000);
		if (stats(&br, lat, js0, sizeof(js0)))
			goto out_wait;
		cpu0 = kvb_bench_pid_cpu_s(br.pid);
		t0 = kvb_bench_now_ns();
		for (unsigned s = 0; s < c->seconds * 10; s++) {
			usleep(100000);
			if (kvb_bench_progress_wanted(c->progress))
				fprintf(stderr, "\r\033[Kkvbench rate: %.1f s",
					(s + 1) / 10.0);
		}
		t1 = kvb_bench_now_ns();
		cpu1 = kvb_bench_pid_cpu_s(br.pid);
		if (progress_end(c) || stats(&br, lat, js1, sizeof(js1)))
			goto out_wait;
		measured = 1;
	}
out_wait:
	if (!lat)
		sh->stop = 1; /* lat: the worker stops after --samples */
	/* rate: the workers see stop at once (a control call has 5 s) */
	fails = wait_children(pids, lat ? 1 : c->workers, lat ? 0 : 60);
	if (fails) {
		fprintf(stderr, "kvbench %s: %d worker(s) failed\n",
			lat ? "lat" : "rate", fails);
		goto out;
	}
	if (lat) {
		t1 = kvb_bench_now_ns();
		cpu1 = kvb_bench_pid_cpu_s(br.pid);
		if (stats(&br, lat, js1, sizeof(js1)))
			goto out;
	}
	if (!measured) /* printed */
		goto out;
	jf = c->json ? fopen(c->json, "w") : NULL;
	if (c->json && !jf) {
		fprintf(stderr, "kvbench: --json %s: %s\n", c->json,
			strerror(errno));
		goto out;
	}
	if (lat) {
		double *v = sh->lat_us, p50, p99, p999;
		uint64_t n = sh->nlat;

		kvb_bench_sort(v, n);
		p50 = kvb_bench_quantile(v, n, 0.5);
		p99 = kvb_bench_quantile(v, n, 0.99);
		p999 = kvb_bench_quantile(v, n, 0.999);
		printf("kvbench lat: broker round trip, transport local, "
		       "busy-polling\n");
		printf("%8s %10s %9s %9s %9s %9s %9s %10s\n", "#bytes",
		       "#samples", "min[us]", "p50[us]", "p99[us]", "p99.9[us]",
		       "max[us]", "cpu[s]");
		printf("%8llu %10llu %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f\n",
		       (unsigned long long) c->bytes, (unsigned long long) n,
		       n ? v[0] : 0, p50, p99, p999, n ? v[n - 1] : 0,
		       cpu1 - cpu0);
		printf("targets: p50 <= 2 us (%s), p99 <= 20 us (%s)\n",
		       p50 <= 2 ? "met" : "missed",
		       p99 <= 20 ? "met" : "missed");
		if (jf)
			fprintf(jf,
				"{\"lat\":{\"transport\":\"local\",\"bytes\":%"
				"llu,"
				"\"samples\":%llu,\"lat_min_us\":%.3f,\"lat_"
				"p50_us\":%.3f,"
				"\"lat_p99_us\":%.3f,\"lat_p999_us\":%.3f,"
				"\"lat_max_us\":%.3f,"
				"\"broker_cpu_s\":%.3f,\"elapsed_s\":%.3f,"
				"\"target_p50_us\":2,\"target_p99_us\":20}}\n",
				(unsigned long long) c->bytes,
				(unsigned long long) n, n ? v[0] : 0, p50, p99,
				p999, n ? v[n - 1] : 0, cpu1 - cpu0,
				(double) (t1 - t0) / 1e9);
	} else {
		double dt = (double) (t1 - t0) / 1e9;
		double done = kvb_bench_json_num(js1, "descriptors_completed") -
			      kvb_bench_json_num(js0, "descriptors_completed");
		double db = kvb_bench_json_num(js1, "doorbells") -
			    kvb_bench_json_num(js0, "doorbells");
		double wrs = kvb_bench_json_num(js1, "wrs") -
			     kvb_bench_json_num(js0, "wrs");
		double mps = done / dt / 1e6;
		uint64_t eagain = 0, errs = 0;

		for (unsigned i = 0; i < c->workers; i++) {
			eagain += sh->eagain[i];
			errs += sh->errors[i];
		}
		printf("kvbench rate: descriptors through the broker, "
		       "transport local\n");
		printf("%8s %4s %6s %12s %12s %9s %12s %10s %10s\n", "#bytes",
		       "#W", "burst", "#descs", "MsgRate", "WR/db",
		       "broker_cpu", "cpu/desc", "ring_full");
		printf("%8s %4s %6s %12s %12s %9s %12s %10s %10s\n", "", "", "",
		       "", "[Mdesc/s]", "", "[s]", "[ns]", "");
		printf("%8llu %4u %6u %12.0f %12.3f %9.2f %12.2f %10.1f "
		       "%10llu\n",
		       (unsigned long long) c->bytes, c->workers, c->burst,
		       done, mps, db > 0 ? wrs / db : 0, cpu1 - cpu0,
		       done > 0 ? (cpu1 - cpu0) * 1e9 / done : 0,
		       (unsigned long long) eagain);
		printf("target: >= 10 M descriptors/s (%s)\n",
		       mps >= 10 ? "met" : "missed");
		if (errs)
			fprintf(stderr,
				"kvbench rate: %llu descriptors refused\n",
				(unsigned long long) errs);
		if (jf)
			fprintf(jf,
				"{\"rate\":{\"transport\":\"local\","
				"\"workers\":%u,"
				"\"burst\":%u,\"bytes\":%llu,\"seconds\":%.3f,"
				"\"descriptors\":%.0f,\"msg_rate_mps\":%.4f,"
				"\"doorbells\":%.0f,\"wrs\":%.0f,\"wr_per_"
				"doorbell\":%.3f,"
				"\"broker_cpu_s\":%.3f,\"ring_full\":%llu,"
				"\"refused\":%llu,"
				"\"target_mps\":10}}\n",
				c->workers, c->burst,
				(unsigned long long) c->bytes, dt, done, mps,
				db, wrs, db > 0 ? wrs / db : 0, cpu1 - cpu0,
				(unsigned long long) eagain,
				(unsigned long long) errs);
		if (errs)
			goto out_json;
	}
	rc = 0;
out_json:
	if (jf && fclose(jf))
		rc = 1;
out:
	if (dctx)
		kvb_detach(dctx);
	kvb_bench_broker_stop(&br);
	munmap(sh, shm_len);
	return rc;
}

int kvb_bench_rate_main(int argc, char **argv)
{
	struct micro_cfg c = {
		.workers = 1, .burst = 64, .bytes = 64, .seconds = 3};
	int rc = micro_parse(&c, 0, argc, argv);

	if (rc)
		return rc < 0 ? 2 : 0;
	return micro_run(&c, 0);
}

int kvb_bench_lat_main(int argc, char **argv)
{
	struct micro_cfg c = {.bytes = 8,
			      .samples = 200000,
			      .warmup = 10000,
			      .timeout_s = 60};
	int rc = micro_parse(&c, 1, argc, argv);

	if (rc)
		return rc < 0 ? 2 : 0;
	return micro_run(&c, 1);
}

/* SPDX-License-Identifier: MIT */
/*
 * Ring throughput benchmark: kvb SPSC ring between two processes (fork, one
 * memfd mapped MAP_SHARED) and between two threads; rte_ring between two
 * threads for comparison (ring_bench_rte.c, when built with DPDK). Producer
 * and consumer are pinned to two CPUs and move 64-byte entries in fixed
 * bursts.
 *
 * JSON per burst size: kvb_mps (cross-process), kvb_thread_mps, rte_mps,
 * ratio = kvb_mps / rte_mps, thread_ratio = kvb_thread_mps / rte_mps.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ring.h"
#include "ring_bench.h"
#include "ring_bench_priv.h"

#define RB_MAX_BURSTS 16
#define RB_MAX_REPEAT 15

enum rb_mode { RB_KVB_PROC, RB_KVB_THREAD, RB_RTE_THREAD, RB_NMODES };

static const char *const rb_mode_name[RB_NMODES] = {
	"kvb-process",
	"kvb-thread",
	"rte-thread",
};

struct rb_opts {
	uint32_t bursts[RB_MAX_BURSTS];
	unsigned int nbursts;
	double seconds;
	unsigned int repeat;
	uint32_t ring;
	int cpu_p, cpu_c;
	const char *json;
	bool dpdk;
};

struct rb_row {
	uint32_t burst;
	struct rb_result proc, thr, rte;
	bool have_rte;
};

/* What one kvb run shares: the ring, then the control block. */
struct rb_kvb {
	void *mem;
	size_t bytes;
	size_t ring_bytes;
	struct rb_ctl *ctl;
	uint32_t burst;
	int cpu;
};

int _kvb_rb_pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		return -errno;
	return 0;
}

static uint32_t kvb_enq(void *ring, void *buf, uint32_t n)
{
	return kvb_ring_enqueue_burst(ring, buf, n);
}

static uint32_t kvb_deq(void *ring, void *buf, uint32_t n)
{
	return kvb_ring_dequeue_burst(ring, buf, n);
}

static void *rb_buf_new(uint32_t burst)
{
	unsigned char *b = aligned_alloc(64, (size_t) burst * RB_SLOT);
	uint32_t i;

	if (b)
		for (i = 0; i < burst * RB_SLOT; i++)
			b[i] = (unsigned char) i;
	return b;
}

/* Producer side of a kvb run (child process or thread). Returns 0/-errno. */
static int rb_kvb_producer(struct rb_kvb *k)
{
	struct kvb_ring r;
	void *src;
	int rc;

	rc = _kvb_rb_pin(k->cpu);
	if (rc)
		goto err;
	rc = kvb_ring_attach(&r, k->mem, k->ring_bytes);
	if (rc)
		goto err;
	src = rb_buf_new(k->burst);
	if (!src) {
		rc = -ENOMEM;
		goto err;
	}
	rb_produce(k->ctl, &r, kvb_enq, src, k->burst);
	free(src);
	return 0;

err:
	/* let the consumer's start handshake go through, then it sees rc */
	atomic_store(&k->ctl->prod_rc, rc);
	rb_sync_start(k->ctl);
	return rc;
}

static int rb_kvb_consumer(struct rb_kvb *k, double seconds,
			   struct rb_result *res)
{
	struct kvb_ring r;
	void *dst;
	int rc;

	rc = _kvb_rb_pin(k->cpu);
	if (rc)
		return rc;
	rc = kvb_ring_attach(&r, k->mem, k->ring_bytes);
	if (rc)
		return rc;
	dst = rb_buf_new(k->burst);
	if (!dst)
		return -ENOMEM;
	rb_consume(k->ctl, &r, kvb_deq, dst, k->burst, seconds, res);
	free(dst);
	rc = atomic_load(&k->ctl->prod_rc);
	return rc;
}

static void *rb_kvb_producer_thread(void *arg)
{
	rb_kvb_producer(arg);
	return NULL;
}

/* Map a fresh memfd holding the ring and the control block. */
static int rb_kvb_map(struct rb_kvb *k, uint32_t entries)
{
	int fd, rc;

	k->ring_bytes = kvb_ring_bytes(entries);
	k->bytes = k->ring_bytes + sizeof(struct rb_ctl);
	fd = memfd_create("kvb-ring-bench", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t) k->bytes)) {
		rc = -errno;
		goto err_fd;
	}
	k->mem =
		mmap(NULL, k->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (k->mem == MAP_FAILED) {
		rc = -errno;
		goto err_fd;
	}
	close(fd);
	k->ctl = (struct rb_ctl *) ((unsigned char *) k->mem + k->ring_bytes);
	rc = kvb_ring_init(k->mem, entries);
	if (rc)
		goto err_map;
	return 0;

err_map:
	munmap(k->mem, k->bytes);
	return rc;
err_fd:
	close(fd);
	return rc;
}

/* kvb ring, producer in a forked child, consumer here. */
static int rb_run_kvb_proc(const struct rb_opts *o, uint32_t burst,
			   struct rb_result *res)
{
	struct rb_kvb k = {.burst = burst};
	pid_t parent = getpid(), pid;
	int rc, status;

	rc = rb_kvb_map(&k, o->ring);
	if (rc)
		return rc;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		rc = -errno;
		goto out;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		k.cpu = o->cpu_p;
		_exit(rb_kvb_producer(&k) ? 1 : 0);
	}
	k.cpu = o->cpu_c;
	rc = rb_kvb_consumer(&k, o->seconds, res);
	atomic_store(&k.ctl->stop, 1);
	if (rc) /* our child, by pid: it may be waiting for us */
		kill(pid, SIGKILL);
	if (waitpid(pid, &status, 0) < 0 && !rc)
		rc = -errno;
	if (!rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
		rc = -ECHILD;
out:
	munmap(k.mem, k.bytes);
	return rc;
}

/* kvb ring, producer in a thread, consumer here. */
static int rb_run_kvb_thread(const struct rb_opts *o, uint32_t burst,
			     struct rb_result *res)
{
	struct rb_kvb kc = {.burst = burst}, kp;
	pthread_t t;
	int rc;

	rc = rb_kvb_map(&kc, o->ring);
	if (rc)
		return rc;
	kp = kc;
	kp.cpu = o->cpu_p;
	kc.cpu = o->cpu_c;
	rc = -pthread_create(&t, NULL, rb_kvb_producer_thread, &kp);
	if (rc)
		goto out;
	rc = rb_kvb_consumer(&kc, o->seconds, res);
	atomic_store(&kc.ctl->stop, 1);
	pthread_join(t, NULL);
out:
	munmap(kc.mem, kc.bytes);
	return rc;
}

static int rb_parse_list(const char *s, struct rb_opts *o)
{
	char *end;
	unsigned long v;

	o->nbursts = 0;
	while (*s) {
		v = strtoul(s, &end, 10);
		if (end == s || !v || v > RB_MAX_BURST ||
		    o->nbursts == RB_MAX_BURSTS)
			return -EINVAL;
		o->bursts[o->nbursts++] = (uint32_t) v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -EINVAL;
	}
	return o->nbursts ? 0 : -EINVAL;
}

static void rb_usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [--burst 8,32,128] [--seconds 2] [--repeat 1]\n"
		"       [--ring 4096] [--cpus P,C] [--json FILE] [--no-dpdk]\n",
		prog);
}

static int rb_parse(int argc, char **argv, struct rb_opts *o)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--no-dpdk")) {
			o->dpdk = false;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help") || !v)
			return -EINVAL;
		i++;
		if (!strcmp(a, "--burst")) {
			if (rb_parse_list(v, o))
				return -EINVAL;
		} else if (!strcmp(a, "--seconds")) {
			o->seconds = strtod(v, NULL);
			if (!(o->seconds > 0 && o->seconds <= 600))
				return -EINVAL;
		} else if (!strcmp(a, "--repeat")) {
			o->repeat = (unsigned int) strtoul(v, NULL, 0);
			if (!o->repeat || o->repeat > RB_MAX_REPEAT)
				return -EINVAL;
		} else if (!strcmp(a, "--ring")) {
			o->ring = (uint32_t) strtoul(v, NULL, 0);
			if (o->ring < 2 || (o->ring & (o->ring - 1)) ||
			    o->ring > (1u << 24))
				return -EINVAL;
		} else if (!strcmp(a, "--cpus")) {
			if (sscanf(v, "%d,%d", &o->cpu_p, &o->cpu_c) != 2 ||
			    o->cpu_p < 0 || o->cpu_c < 0 ||
			    o->cpu_p >= CPU_SETSIZE || o->cpu_c >= CPU_SETSIZE)
				return -EINVAL;
		} else if (!strcmp(a, "--json")) {
			o->json = v;
		} else {
			return -EINVAL;
		}
	}
	return 0;
}

static void rb_json_num(FILE *f, const char *key, double v, bool valid,
			const char *sep)
{
	if (valid)
		fprintf(f, "\"%s\": %.3f%s", key, v, sep);
	else
		fprintf(f, "\"%s\": null%s", key, sep);
}

static int rb_write_json(const struct rb_opts *o, const struct rb_row *rows,
			 bool dpdk_ran)
{
	FILE *f = fopen(o->json, "w");
	unsigned int i;

	if (!f)
		return -errno;
	fprintf(f,
		"{\n  \"bench\": \"ring\",\n  \"slot_bytes\": %u,\n"
		"  \"ring_entries\": %u,\n  \"seconds\": %.3f,\n"
		"  \"repeat\": %u,\n"
		"  \"cpus\": [%d, %d],\n  \"dpdk\": %s,\n  \"results\": [\n",
		RB_SLOT, o->ring, o->seconds, o->repeat, o->cpu_p, o->cpu_c,
		dpdk_ran ? "true" : "false");
	for (i = 0; i < o->nbursts; i++) {
		const struct rb_row *r = &rows[i];
		bool rte = r->have_rte && r->rte.mps > 0;

		fprintf(f, "    {\"burst\": %u, \"kvb_entries\": %" PRIu64 ", ",
			r->burst, r->proc.entries);
		rb_json_num(f, "kvb_mps", r->proc.mps, true, ", ");
		rb_json_num(f, "kvb_thread_mps", r->thr.mps, true, ", ");
		rb_json_num(f, "rte_mps", r->rte.mps, rte, ", ");
		rb_json_num(f, "ratio", rte ? r->proc.mps / r->rte.mps : 0, rte,
			    ", ");
		rb_json_num(f, "thread_ratio",
			    rte ? r->thr.mps / r->rte.mps : 0, rte, "");
		fprintf(f, "}%s\n", i + 1 < o->nbursts ? "," : "");
	}
	fprintf(f, "  ]\n}\n");
	if (fclose(f))
		return -errno;
	return 0;
}

static void rb_print_row(const char *mode, uint32_t burst,
			 const struct rb_result *r)
{
	printf(" %-12s %7u %14" PRIu64 " %9.2f %14.2f\n", mode, burst,
	       r->entries, r->seconds, r->mps);
	fflush(stdout);
}

static int rb_run_one(const struct rb_opts *o, enum rb_mode mode,
		      uint32_t burst, struct rb_result *res)
{
	switch (mode) {
	case RB_KVB_PROC:
		return rb_run_kvb_proc(o, burst, res);
	case RB_KVB_THREAD:
		return rb_run_kvb_thread(o, burst, res);
#ifdef KVB_HAVE_DPDK
	case RB_RTE_THREAD:
		return _kvb_rb_rte_run(o->ring, burst, o->seconds, o->cpu_p,
				       o->cpu_c, res);
#endif
	default:
		return -ENOTSUP;
	}
}

static int rb_cmp_mps(const void *a, const void *b)
{
	const struct rb_result *x = a, *y = b;

	return (x->mps > y->mps) - (x->mps < y->mps);
}

/* Run o->repeat times and keep the median run (the machine is noisy). */
static int rb_run_median(const struct rb_opts *o, enum rb_mode mode,
			 uint32_t burst, struct rb_result *res)
{
	struct rb_result runs[RB_MAX_REPEAT];
	unsigned int i;
	int rc;

	for (i = 0; i < o->repeat; i++) {
		rc = rb_run_one(o, mode, burst, &runs[i]);
		if (rc) {
			fprintf(stderr, "%s burst %u: %s\n", rb_mode_name[mode],
				burst, strerror(-rc));
			return rc;
		}
	}
	qsort(runs, o->repeat, sizeof(runs[0]), rb_cmp_mps);
	*res = runs[o->repeat / 2];
	rb_print_row(rb_mode_name[mode], burst, res);
	return 0;
}

int kvb_ring_bench_main(int argc, char **argv)
{
	struct rb_opts o = {
		.bursts = {8, 32, 128},
		.nbursts = 3,
		.seconds = 2.0,
		.repeat = 1,
		.ring = 4096,
		.cpu_p = 0,
		.cpu_c = 1,
#ifdef KVB_HAVE_DPDK
		.dpdk = true,
#endif
	};
	const char *prog = argc > 0 ? argv[0] : "kvb-ring-bench";
	struct rb_row rows[RB_MAX_BURSTS];
	bool dpdk_ran = false;
	cpu_set_t saved;
	unsigned int i;
	int rc = 0;

	if (rb_parse(argc, argv, &o)) {
		rb_usage(prog);
		return 2;
	}
	memset(rows, 0, sizeof(rows));
	/* we pin the calling thread for the consumer; give it back after */
	if (sched_getaffinity(0, sizeof(saved), &saved)) {
		perror("sched_getaffinity");
		return 1;
	}

	printf("-----------------------------------------------------------"
	       "----\n");
	printf(" SPSC ring, %u-byte entries, %u slots, producer cpu %d, "
	       "consumer cpu %d\n",
	       RB_SLOT, o.ring, o.cpu_p, o.cpu_c);
	printf(" kvb-process: fork + memfd; kvb-thread, rte-thread: "
	       "pthreads\n");
	printf(" %.1f s per run, median of %u run(s)\n", o.seconds, o.repeat);
	printf("-----------------------------------------------------------"
	       "----\n");
	printf(" %-12s %7s %14s %9s %14s\n", "#mode", "#burst", "#entries",
	       "#time[s]", "Mentries/s");

	for (i = 0; i < o.nbursts; i++)
		rows[i].burst = o.bursts[i];
	for (i = 0; i < o.nbursts && !rc; i++)
		rc = rb_run_median(&o, RB_KVB_PROC, o.bursts[i], &rows[i].proc);
	for (i = 0; i < o.nbursts && !rc; i++)
		rc = rb_run_median(&o, RB_KVB_THREAD, o.bursts[i],
				   &rows[i].thr);
#ifdef KVB_HAVE_DPDK
	/* after all forks: EAL threads do not survive fork */
	if (!rc && o.dpdk) {
		int erc = _kvb_rb_rte_init(prog);

		if (erc)
			fprintf(stderr,
				"rte_eal_init failed (%s): no rte_ring "
				"comparison\n",
				strerror(-erc));
		for (i = 0; i < o.nbursts && !erc; i++) {
			erc = rb_run_median(&o, RB_RTE_THREAD, o.bursts[i],
					    &rows[i].rte);
			rows[i].have_rte = !erc;
			dpdk_ran |= !erc;
		}
	}
#endif
	sched_setaffinity(0, sizeof(saved), &saved);
	if (rc)
		return 1;

	printf("-----------------------------------------------------------"
	       "----\n");
	printf(" %7s %12s %12s %12s %8s %8s\n", "#burst", "kvb-proc",
	       "kvb-thread", "rte-thread", "proc/rte", "thr/rte");
	for (i = 0; i < o.nbursts; i++) {
		const struct rb_row *r = &rows[i];

		if (r->have_rte)
			printf(" %7u %12.2f %12.2f %12.2f %8.2f %8.2f\n",
			       r->burst, r->proc.mps, r->thr.mps, r->rte.mps,
			       r->proc.mps / r->rte.mps,
			       r->thr.mps / r->rte.mps);
		else
			printf(" %7u %12.2f %12.2f %12s %8s %8s\n", r->burst,
			       r->proc.mps, r->thr.mps, "-", "-", "-");
	}
	printf("-----------------------------------------------------------"
	       "----\n");

	if (o.json) {
		rc = rb_write_json(&o, rows, dpdk_ran);
		if (rc) {
			fprintf(stderr, "%s: %s\n", o.json, strerror(-rc));
			return 1;
		}
	}
	return 0;
}

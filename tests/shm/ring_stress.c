/* SPDX-License-Identifier: MIT */
/*
 * Stress test of the SPSC ring across two processes (fork, memfd,
 * MAP_SHARED) or two threads (--threads; built with TSan as
 * ring_stress_tsan).
 *
 * The producer writes `count` entries in bursts of random size 1..64, using
 * burst and bulk enqueue at random; each 64-byte entry holds a sequence
 * number, 48 bytes derived from it and a checksum of the other 56 bytes. The
 * consumer dequeues in random sizes, burst and bulk, and checks order,
 * content, no loss and no duplicate. Fails if it takes more than the time
 * limit (60 s).
 *
 * Usage: ring_stress [--threads] [--entries N] [--ring SLOTS] [--seconds S]
 * Exit: 0 pass, 1 fail.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm/ring.h"

#ifndef KVB_STRESS_THREADS
#define KVB_STRESS_THREADS 0
#endif
#ifndef KVB_STRESS_ENTRIES
#define KVB_STRESS_ENTRIES 10000000ull
#endif

#define MAX_BURST	  64u
#define SPIN_BEFORE_YIELD 256u

/* set by a failed consumer thread so the producer thread gives up */
static _Atomic int stress_stop;

struct stress_entry {
	uint64_t seq;
	uint64_t data[6];
	uint64_t sum;
};
_Static_assert(sizeof(struct stress_entry) == KVB_RING_SLOT, "one slot");

struct stress_opts {
	bool threads;
	uint64_t count;
	uint32_t ring_entries;
	double seconds;
};

struct stress_side {
	void *mem;
	size_t bytes;
	const struct stress_opts *o;
	int rc;
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t entry_sum(const struct stress_entry *e)
{
	uint64_t s = mix64(e->seq);
	unsigned int i;

	for (i = 0; i < 6; i++)
		s = mix64(s ^ e->data[i]);
	return s;
}

static void entry_fill(struct stress_entry *e, uint64_t seq)
{
	uint64_t w = mix64(seq ^ 0x5eedull);
	unsigned int i;

	e->seq = seq;
	for (i = 0; i < 6; i++) {
		e->data[i] = w;
		w = w * 6364136223846793005ull + 1442695040888963407ull;
	}
	e->sum = entry_sum(e);
}

/* 0 if `e` is exactly what the producer writes for `seq`. */
static int entry_verify(const struct stress_entry *e, uint64_t seq)
{
	struct stress_entry want;

	if (e->seq != seq) {
		fprintf(stderr,
			"ring_stress: order: got seq %" PRIu64
			" expected %" PRIu64 " (%s)\n",
			e->seq, seq, e->seq < seq ? "duplicate" : "lost");
		return -1;
	}
	if (e->sum != entry_sum(e)) {
		fprintf(stderr,
			"ring_stress: bad checksum at seq %" PRIu64 "\n", seq);
		return -1;
	}
	entry_fill(&want, seq);
	if (memcmp(e, &want, sizeof(want))) {
		fprintf(stderr, "ring_stress: bad content at seq %" PRIu64 "\n",
			seq);
		return -1;
	}
	return 0;
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Back off while the other side catches up; false once past the deadline. */
static bool idle_wait(unsigned int *spins, double deadline)
{
	if (++*spins < SPIN_BEFORE_YIELD) {
		cpu_relax();
		return true;
	}
	*spins = 0;
	sched_yield(); /* 2 cores shared with others: let the peer run */
	return now_s() < deadline && !atomic_load(&stress_stop);
}

static int run_producer(struct stress_side *p)
{
	struct stress_entry buf[MAX_BURST];
	struct kvb_ring r;
	uint64_t rng = 0x243f6a8885a308d3ull, seq = 0;
	double deadline = now_s() + p->o->seconds;
	unsigned int spins = 0;
	int rc;

	rc = kvb_ring_attach(&r, p->mem, p->bytes);
	if (rc) {
		fprintf(stderr, "ring_stress: producer attach: %d\n", rc);
		return -1;
	}
	while (seq < p->o->count) {
		uint64_t x = rng_next(&rng);
		uint32_t n = 1 + (uint32_t) (x % MAX_BURST), i, done;
		bool bulk = (x >> 32) & 1;

		if (n > p->o->count - seq)
			n = (uint32_t) (p->o->count - seq);
		for (i = 0; i < n; i++)
			entry_fill(&buf[i], seq + i);
		for (done = 0; done < n;) {
			uint32_t k;

			if (bulk)
				k = kvb_ring_enqueue_bulk(&r, buf + done,
							  n - done);
			else
				k = kvb_ring_enqueue_burst(&r, buf + done,
							   n - done);
			if (bulk && k && k != n - done) {
				fprintf(stderr,
					"ring_stress: bulk moved %u of"
					" %u\n",
					k, n - done);
				return -1;
			}
			if (k > n - done) {
				fprintf(stderr,
					"ring_stress: burst moved %u > "
					"%u\n",
					k, n - done);
				return -1;
			}
			done += k;
			if (k) {
				spins = 0;
			} else if (!idle_wait(&spins, deadline)) {
				fprintf(stderr,
					"ring_stress: producer stopped at seq"
					" %" PRIu64 "\n",
					seq + done);
				return -1;
			}
		}
		seq += n;
	}
	return 0;
}

static int run_consumer(struct stress_side *c)
{
	struct stress_entry buf[MAX_BURST];
	struct kvb_ring r;
	uint64_t rng = 0x13198a2e03707344ull, seq = 0;
	double t0 = now_s(), deadline = t0 + c->o->seconds;
	unsigned int spins = 0;
	uint64_t empty_polls = 0;
	int rc;

	rc = kvb_ring_attach(&r, c->mem, c->bytes);
	if (rc) {
		fprintf(stderr, "ring_stress: consumer attach: %d\n", rc);
		return -1;
	}
	while (seq < c->o->count) {
		uint64_t x = rng_next(&rng);
		uint32_t n = 1 + (uint32_t) (x % MAX_BURST), k, i;
		bool bulk = ((x >> 32) & 3) == 0;

		if (n > c->o->count - seq)
			n = (uint32_t) (c->o->count - seq);
		memset(buf, 0, sizeof(buf[0]) * n);
		k = bulk ? kvb_ring_dequeue_bulk(&r, buf, n)
			 : kvb_ring_dequeue_burst(&r, buf, n);
		if (k > n || (bulk && k && k != n)) {
			fprintf(stderr,
				"ring_stress: dequeue %s moved %u of %u\n",
				bulk ? "bulk" : "burst", k, n);
			return -1;
		}
		for (i = 0; i < k; i++)
			if (entry_verify(&buf[i], seq + i))
				return -1;
		seq += k;
		if (k) {
			spins = 0;
		} else {
			empty_polls++;
			if (!idle_wait(&spins, deadline)) {
				fprintf(stderr,
					"ring_stress: consumer timed out at seq"
					" %" PRIu64 " of %" PRIu64 "\n",
					seq, c->o->count);
				return -1;
			}
		}
	}
	/* nothing beyond the last entry: no duplicate, no phantom */
	if (kvb_ring_dequeue_burst(&r, buf, MAX_BURST) != 0 ||
	    kvb_ring_count(&r) != 0) {
		fprintf(stderr, "ring_stress: entries after the last one\n");
		return -1;
	}
	printf("ring_stress: %s: %" PRIu64 " entries verified in %.2f s "
	       "(%.1f M/s, %" PRIu64 " empty polls)\n",
	       c->o->threads ? "threads" : "processes", seq, now_s() - t0,
	       (double) seq / (now_s() - t0) / 1e6, empty_polls);
	return 0;
}

static void *producer_thread(void *arg)
{
	struct stress_side *p = arg;

	p->rc = run_producer(p);
	return NULL;
}

static int run_threads(struct stress_side *s)
{
	struct stress_side prod = *s, cons = *s;
	pthread_t t;
	int rc;

	rc = pthread_create(&t, NULL, producer_thread, &prod);
	if (rc) {
		fprintf(stderr, "ring_stress: pthread_create: %s\n",
			strerror(rc));
		return -1;
	}
	cons.rc = run_consumer(&cons);
	if (cons.rc) /* the producer may be waiting on a full ring */
		atomic_store(&stress_stop, 1);
	pthread_join(t, NULL);
	return cons.rc || prod.rc ? -1 : 0;
}

static int run_processes(struct stress_side *s)
{
	pid_t parent = getpid(), pid;
	int status, rc;

	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("ring_stress: fork");
		return -1;
	}
	if (pid == 0) {
		/* the child produces; it dies with its parent */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		_exit(run_producer(s) ? 1 : 0);
	}
	rc = run_consumer(s);
	if (rc)
		kill(pid, SIGKILL);
	if (waitpid(pid, &status, 0) < 0) {
		perror("ring_stress: waitpid");
		return -1;
	}
	if (!rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
		fprintf(stderr, "ring_stress: producer failed (status %#x)\n",
			status);
		rc = -1;
	}
	return rc;
}

static int parse_args(int argc, char **argv, struct stress_opts *o)
{
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads")) {
			o->threads = true;
		} else if (!strcmp(argv[i], "--processes")) {
			o->threads = false;
		} else if (!strcmp(argv[i], "--entries") && i + 1 < argc) {
			o->count = strtoull(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--ring") && i + 1 < argc) {
			o->ring_entries =
				(uint32_t) strtoul(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			o->seconds = strtod(argv[++i], NULL);
		} else {
			fprintf(stderr,
				"usage: %s [--threads|--processes] [--entries "
				"N]"
				" [--ring SLOTS] [--seconds S]\n",
				argv[0]);
			return -1;
		}
	}
	if (!o->count || o->seconds <= 0)
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct stress_opts o = {
		.threads = KVB_STRESS_THREADS,
		.count = KVB_STRESS_ENTRIES,
		.ring_entries = 1024,
		.seconds = 60.0,
	};
	struct stress_side s = {.o = &o};
	int fd, rc;

	if (parse_args(argc, argv, &o))
		return 1;
	s.bytes = kvb_ring_bytes(o.ring_entries);
	fd = memfd_create("kvb-ring-stress", MFD_CLOEXEC);
	if (fd < 0) {
		perror("ring_stress: memfd_create");
		return 1;
	}
	if (ftruncate(fd, (off_t) s.bytes) < 0) {
		perror("ring_stress: ftruncate");
		goto err_fd;
	}
	s.mem = mmap(NULL, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (s.mem == MAP_FAILED) {
		perror("ring_stress: mmap");
		goto err_fd;
	}
	rc = kvb_ring_init(s.mem, o.ring_entries);
	if (rc) {
		fprintf(stderr, "ring_stress: init %u slots: %d\n",
			o.ring_entries, rc);
		goto err_map;
	}
	rc = o.threads ? run_threads(&s) : run_processes(&s);
	munmap(s.mem, s.bytes);
	close(fd);
	if (rc) {
		fprintf(stderr, "ring_stress: FAIL\n");
		return 1;
	}
	return 0;

err_map:
	munmap(s.mem, s.bytes);
err_fd:
	close(fd);
	return 1;
}

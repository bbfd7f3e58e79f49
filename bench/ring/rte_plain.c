/* SPDX-License-Identifier: MIT */
/*
 * kvb-rte-plain: a plain two-thread rte_ring program, written apart from
 * kvb-ring-bench's shared loops, to check that its rte-thread column is
 * not handicapped: SP/SC ring of `esize`-byte elements (rte_ring_create_elem,
 * RING_F_EXACT_SZ), 4096 slots, producer pinned to cpu 0, consumer to cpu
 * 1, bursts 8, 32, 128, 0.2 s warm-up then 2 s counted at the consumer.
 * Usage: kvb-rte-plain [ESIZE]   (default 64; 8 = a ring of pointers)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rte_eal.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#define MAX_BURST 128u

static struct rte_ring *ring;
static unsigned burst, esize;
static atomic_int stop, ready;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

static void both_ready(void)
{
	atomic_fetch_add(&ready, 1);
	while (atomic_load(&ready) < 2)
		rte_pause();
}

static void *producer(void *arg)
{
	static _Alignas(64) char src[MAX_BURST * 64];

	(void) arg;
	memset(src, 0x5a, sizeof(src));
	pin(0);
	both_ready();
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		if (!rte_ring_sp_enqueue_burst_elem(ring, src, esize, burst,
						    NULL))
			rte_pause();
		__asm__ volatile("" : : "r"(src) : "memory");
	}
	return NULL;
}

int main(int argc, char **argv)
{
	char *eal[] = {argv[0],	    "--no-huge",      "--no-pci",
		       "--no-shconf", "--file-prefix=kvb-rte-plain",
		       "-l",	    "0",	      "-m",
		       "64",	    "--no-telemetry", "--log-level=1",
		       NULL};
	static const unsigned bursts[] = {8, 32, 128};
	static _Alignas(64) char dst[MAX_BURST * 64];

	esize = argc > 1 ? (unsigned) atoi(argv[1]) : 64;
	if (esize == 0 || esize % 4 || esize > 64) {
		fprintf(stderr, "kvb-rte-plain: ESIZE: a multiple of 4, 4-64\n");
		return 2;
	}
	if (rte_eal_init((int) (sizeof(eal) / sizeof(eal[0])) - 1, eal) < 0)
		return 1;
	printf("plain rte_ring, %u-byte elements, 4096 slots, SP/SC, "
	       "cpus 0 -> 1\n",
	       esize);
	for (unsigned k = 0; k < 3; k++) {
		unsigned long long n = 0;
		unsigned i = 0, got;
		double t0, t1, end;
		char name[32];
		pthread_t t;

		burst = bursts[k];
		snprintf(name, sizeof(name), "plain%u", burst);
		ring = rte_ring_create_elem(name, esize, 4096, SOCKET_ID_ANY,
					    RING_F_SP_ENQ | RING_F_SC_DEQ |
						    RING_F_EXACT_SZ);
		if (!ring)
			return 1;
		atomic_store(&stop, 0);
		atomic_store(&ready, 0);
		if (pthread_create(&t, NULL, producer, NULL))
			return 1;
		pin(1);
		both_ready();
		end = now() + 0.2;
		while (now() < end)
			rte_ring_sc_dequeue_burst_elem(ring, dst, esize, burst,
						       NULL);
		t0 = now();
		end = t0 + 2;
		for (;;) {
			got = rte_ring_sc_dequeue_burst_elem(ring, dst, esize,
							     burst, NULL);
			__asm__ volatile("" : : "r"(dst) : "memory");
			n += got;
			if (!got)
				rte_pause();
			if (++i % 256)
				continue;
			if ((t1 = now()) >= end)
				break;
		}
		atomic_store(&stop, 1);
		pthread_join(t, NULL);
		printf("burst %3u: %8.2f Mentries/s\n", burst,
		       (double) n / (t1 - t0) / 1e6);
		rte_ring_free(ring);
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Private to bench/ring: the timed producer/consumer loops shared by the kvb
 * and rte_ring runs, so both are measured the same way.
 */
#ifndef KVB_BENCH_RING_BENCH_PRIV_H
#define KVB_BENCH_RING_BENCH_PRIV_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define RB_SLOT	       64u
#define RB_MAX_BURST   1024u
#define RB_WARMUP_S    0.2
#define RB_CHECK_EVERY 256u /* iterations between clock reads */

/* Start/stop handshake; lives in shared memory for the process runs. */
struct rb_ctl {
	alignas(64) _Atomic uint32_t ready; /* sides attached and pinned */
	alignas(64) _Atomic uint32_t stop;  /* set by the consumer when done */
	alignas(64) _Atomic int32_t prod_rc;
};

/* One timed run: what the consumer measured. */
struct rb_result {
	uint64_t entries;
	double seconds;
	double mps; /* million entries per second */
};

typedef uint32_t (*rb_xfer_fn)(void *ring, void *buf, uint32_t n);

static inline double rb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static inline void rb_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Keep the compiler from dropping copies into a buffer nobody reads. */
static inline void rb_clobber(void *p)
{
	__asm__ volatile("" : : "r"(p) : "memory");
}

static inline void rb_sync_start(struct rb_ctl *ctl)
{
	/* pairs with the other side's fetch_add: both are ready */
	atomic_fetch_add_explicit(&ctl->ready, 1, memory_order_acq_rel);
	while (atomic_load_explicit(&ctl->ready, memory_order_acquire) < 2 &&
	       !atomic_load_explicit(&ctl->stop, memory_order_relaxed))
		rb_relax();
}

/*
 * Producer: enqueue bursts of `burst` from `src` until the consumer says
 * stop. Always inlined so that `enq` (a constant at each call site) is a
 * direct, inlinable call.
 */
static inline __attribute__((always_inline)) void
rb_produce(struct rb_ctl *ctl, void *ring, rb_xfer_fn enq, void *src,
	   uint32_t burst)
{
	rb_sync_start(ctl);
	while (!atomic_load_explicit(&ctl->stop, memory_order_relaxed)) {
		if (!enq(ring, src, burst))
			rb_relax();
		rb_clobber(src);
	}
}

/*
 * Consumer: dequeue bursts into `dst`; warm up, then count for `seconds`,
 * then tell the producer to stop.
 */
static inline __attribute__((always_inline)) void
rb_consume(struct rb_ctl *ctl, void *ring, rb_xfer_fn deq, void *dst,
	   uint32_t burst, double seconds, struct rb_result *res)
{
	uint64_t count = 0;
	double t0, t1, end;
	uint32_t i = 0, n;
	int measuring = 0;

	rb_sync_start(ctl);
	t0 = rb_now();
	end = t0 + RB_WARMUP_S;
	for (;;) {
		n = deq(ring, dst, burst);
		rb_clobber(dst);
		count += n;
		if (!n)
			rb_relax();
		if (++i % RB_CHECK_EVERY)
			continue;
		t1 = rb_now();
		if (t1 < end)
			continue;
		if (measuring)
			break;
		measuring = 1;
		count = 0;
		t0 = t1;
		end = t0 + seconds;
	}
	atomic_store_explicit(&ctl->stop, 1, memory_order_relaxed);
	res->entries = count;
	res->seconds = t1 - t0;
	res->mps = (double) count / res->seconds / 1e6;
}

/* Pin the calling thread to one CPU. Returns 0 or -errno. */
int _kvb_rb_pin(int cpu);

#ifdef KVB_HAVE_DPDK
/* Initialise DPDK's EAL once (no hugepages, no PCI). Returns 0 or -errno. */
int _kvb_rb_rte_init(const char *prog);
/*
 * rte_ring with 64-byte elements, SP/SC, `ring` slots, producer thread on
 * cpu_p and consumer on cpu_c. Returns 0 or -errno.
 */
int _kvb_rb_rte_run(uint32_t ring, uint32_t burst, double seconds, int cpu_p,
		    int cpu_c, struct rb_result *res);
#endif

#endif /* KVB_BENCH_RING_BENCH_PRIV_H */

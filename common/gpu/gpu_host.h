/* SPDX-License-Identifier: MIT */
/*
 * Controls of the host gpu backend, for tests: pause the copy workers, slow
 * every copy down, make one copy fail, and count live objects (leaks).
 * All thread-safe.
 */
#ifndef KVB_GPU_HOST_H
#define KVB_GPU_HOST_H

#include <stdint.h>

struct kvb_gpu_host_counts {
	uint64_t copies;       /* copies executed (failed ones included) */
	uint64_t failed;       /* copies that failed */
	uint64_t bytes;	       /* bytes copied */
	uint64_t memcpys;      /* synchronous memcpy calls (failed included) */
	uint64_t memcpy_bytes; /* bytes those copied */
	int streams;	       /* live streams */
	int events;	       /* live events */
	int allocs;	       /* live allocations */
	int mappings;	       /* live imported mappings */
};

/* Number of fake devices (default 4, or $KVB_GPU_HOST_DEVICES). */
void kvb_gpu_host_set_devices(int n);
/* While paused, queued work stays queued. */
void kvb_gpu_host_pause(int paused);
/* Sleep this long before each copy (0 = none). */
void kvb_gpu_host_set_delay_us(unsigned us);
/*
 * Make the copy_async call after `after` more calls fail: with `sync`, the
 * call itself returns -EIO; otherwise the copy is skipped at execution and
 * the next event recorded on its stream reports -EIO.
 */
void kvb_gpu_host_fail_copy(unsigned after, int sync);
/* Make the synchronous memcpy call after `after` more calls return -EIO. */
void kvb_gpu_host_fail_memcpy(unsigned after);
/* Whether device pointers are opaque ($KVB_GPU_HOST_OPAQUE at load). */
int kvb_gpu_host_opaque(void);
void kvb_gpu_host_counts(struct kvb_gpu_host_counts *c);
/* Stop and join the copy workers (restarted on demand). */
void kvb_gpu_host_shutdown(void);

#endif /* KVB_GPU_HOST_H */

/* SPDX-License-Identifier: MIT */
/*
 * A worker that talks to the broker by hand, past the client library (as a
 * buggy or hostile one could): HELLO over the control socket, the segment
 * mapped and attached, its rings written directly. Used by test_raw_ring
 * and test_ring_fuzz. Functions return 0 or -errno and never call cmocka.
 */
#ifndef KVB_TESTS_RAW_WORKER_H
#define KVB_TESTS_RAW_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "segment.h"

struct raw_worker {
	int sock;		    /* control socket */
	int efd_broker, efd_worker; /* wake the broker / wakes us */
	struct kvb_seg seg;	    /* its rings */
	void *mem;		    /* the segment's mapping */
	size_t mem_len;
};

/* Connect to the broker at sock_path, HELLO as a P worker (tp 1/1), map
 * and attach the segment it sends. On failure w holds nothing open. */
int raw_worker_attach(struct raw_worker *w, const char *sock_path);

/* OPEN transfer `id`: its handle in *handle. */
int raw_worker_open(struct raw_worker *w, const char *id, uint32_t *handle);

/* Unmap and close what attach gave (safe on a zeroed or failed one). */
void raw_worker_close(struct raw_worker *w);

#endif /* KVB_TESTS_RAW_WORKER_H */

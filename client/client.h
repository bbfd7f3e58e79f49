/* SPDX-License-Identifier: MIT */
/* libkvbroker's private parts, shared by its source files. */
#ifndef KVB_CLIENT_CLIENT_H
#define KVB_CLIENT_CLIENT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker/kvbroker.h"
#include "proto.h"
#include "segment.h"

/* Room for any reply to a ctl_call request (the largest: STATS's text,
 * up to a whole message; then OPEN_BATCH's). */
#define CTL_RX_MAX KVB_MSG_MAX
_Static_assert(sizeof(struct kvb_msg_open_batch_reply) +
			       KVB_OPEN_BATCH_MAX *
				       sizeof(struct kvb_open_result) <=
		       CTL_RX_MAX,
	       "CTL_RX_MAX holds every reply");

struct kvb_ctx {
	int sock;
	int broker_efd;
	int worker_efd;
	int timeout_ms;
	uint32_t worker_id;
	int dead; /* broker gone: set once, read by both threads */
	unsigned empty_polls;
	/* kvb_wait's spin budget (ns) and its count of waits; touched by the
	 * single completing thread only */
	int64_t spin_ns;
	unsigned waits;
	struct kvb_seg seg;
	void *seg_mem;
	size_t seg_size;
	pthread_mutex_t ctl_lock;
	/* under ctl_lock: the last request's number (shm/proto.h), the
	 * number of a PEER request still unanswered (0: none), and where
	 * replies are received */
	uint32_t seq;
	uint32_t peer_seq;
	union {
		struct kvb_msg_hdr h;
		char raw[CTL_RX_MAX];
	} rx;
	/* requests whose replies nobody waits for any more: read (and
	 * dropped) by the next control call, or by kvb_wait / kvb_poll;
	 * atomic, a hint */
	unsigned strays;
};

/*
 * One control round trip: send req (with up to nfds fds), wait for the
 * reply that echoes its number, all within ctx->timeout_ms (kvbroker.c).
 * Returns 0 or -errno (the reply's status, -ETIMEDOUT, -EPIPE, -EPROTO).
 */
int kvb_client_call(struct kvb_ctx *ctx, struct kvb_msg_hdr *req,
		    const int *fds, unsigned nfds, void *reply, size_t cap,
		    size_t min_len);

#endif

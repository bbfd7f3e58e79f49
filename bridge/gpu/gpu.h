/* SPDX-License-Identifier: MIT */
/*
 * The `gpu` transport: same-node copies between GPU regions (device
 * pointers the broker opened from IPC handles), batched per (source device,
 * destination device), merged where contiguous on both sides, spread
 * round-robin over a pool of streams per device, completed through events
 * polled in the broker loop.
 *
 * Endpoints: connect() with len == 0 gives ep == NULL, "same node": a chain
 * may then mix device pairs and is split into one batch per pair. connect()
 * with a struct kvb_gpu_ep_blob gives an endpoint for one (local device,
 * remote device) pair; ops of another pair posted to it complete -EINVAL.
 *
 * post(): accepts up to post_batch_size ops (if > 0) and no more than the
 * in-flight credit (sq_depth ops, default 16384); ops it cannot run (bad
 * region, out of bounds, unknown opcode) are accepted and complete with
 * -EINVAL/-EFAULT on their own; a copy that fails fails every op of its
 * batch with -EIO and nothing else. Counting: doorbells = batches, wrs =
 * copies after merging.
 *
 * Regions must be KVB_MEM_GPU and registered with reg_mr (which builds the
 * stream pool of the region's device); the transport keeps its mark in
 * mr->tpriv[KVB_GPU_TPRIV].
 *
 * Not thread-safe: one broker thread drives a transport.
 */
#ifndef KVB_BRIDGE_GPU_H
#define KVB_BRIDGE_GPU_H

#include "transport.h"

extern const struct kvb_transport_ops kvb_gpu_ops;

/* the slot of kvb_mr.tpriv[] this transport owns (kvb_transport_tpriv) */
int kvb_gpu_tpriv(void);
#define KVB_GPU_TPRIV		 kvb_gpu_tpriv()
#define KVB_GPU_STREAMS_DEFAULT	 64
#define KVB_GPU_INFLIGHT_DEFAULT 16384

#define KVB_GPU_EP_MAGIC 0x4b564745u /* "KVGE" */

/* connect() blob naming a device pair (devices in the broker's numbering) */
struct kvb_gpu_ep_blob {
	uint32_t magic;
	int32_t local_dev;
	int32_t remote_dev;
	uint32_t pad;
};

struct kvb_gpu_stats {
	char backend[16]; /* "hip", "cuda", "host" */
	uint64_t ops;	  /* ops accepted into batches */
	uint64_t copies;  /* copies issued after merging */
	uint64_t batches; /* copy batches (= doorbells) */
	uint64_t bytes;	  /* bytes issued */
	uint64_t failed_batches;
	uint64_t failed_ops;   /* ops completed -EIO by a failed copy */
	uint64_t rejected_ops; /* ops completed -EINVAL/-EFAULT */
	uint64_t peer_copies;  /* copies between two different devices */
	uint64_t peer_staged;  /* of those, without peer access */
	uint32_t streams;      /* streams created (all devices) */
	uint32_t streams_busy; /* streams with a batch in flight */
	uint32_t batches_inflight;
	uint32_t ops_inflight;
};

/*
 * Open a gpu transport on a named backend ("hip", "cuda", "host", "auto";
 * NULL = $KVB_GPU_BACKEND or auto). kvb_gpu_ops.open is this with NULL.
 * Returns 0, -ENODEV (why says why), -EBUSY (another backend already chosen
 * in this process), -ENOMEM.
 */
int kvb_gpu_transport_open(const struct kvb_transport_params *p,
			   const char *backend, struct kvb_transport **out,
			   char *why, size_t why_len);

/* GPU counters for kvbctl. Returns 0, or -EINVAL if t is not a gpu one. */
int kvb_gpu_transport_stats(struct kvb_transport *t, struct kvb_gpu_stats *s);

/* ops->stats_format: the counters above ("gpu" object / a line); 0 when
 * there are none (ep given, or no stats) */
size_t kvb_gpu_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			    int json, char *buf, size_t cap);

/*
 * Copies issued on stream `idx` of device `dev` so far (round-robin check).
 * Returns 0, -ENOENT if that device has no pool yet, -EINVAL.
 */
int kvb_gpu_stream_copies(struct kvb_transport *t, int dev, unsigned idx,
			  uint64_t *copies);

#endif /* KVB_BRIDGE_GPU_H */

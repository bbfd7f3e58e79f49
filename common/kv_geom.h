/* SPDX-License-Identifier: MIT */
/*
 * A layer's KV tensor geometry: what a worker registers (kvb_mem_set_kv),
 * what the broker keeps with the region, and what the block and TP mapping
 * of the ZMQ control bridge (bridge/zmq/blocks.h) computes offsets from.
 */
#ifndef KVB_COMMON_KV_GEOM_H
#define KVB_COMMON_KV_GEOM_H

#include <stdint.h>

enum kvb_kv_layout {
	KVB_KV_LAYOUT_KV_FIRST = 0,
	KVB_KV_LAYOUT_BLOCK_FIRST = 1,
	/* [num_blocks, block_size, heads, head_dim]: one plane, K and V of a
	 * head side by side in head_dim (vLLM 0.29 and later) */
	KVB_KV_LAYOUT_PACKED = 2,
};

struct kvb_kv_geom {
	uint32_t layout;     /* enum kvb_kv_layout */
	uint32_t num_blocks; /* of this side */
	uint32_t block_size; /* tokens per block */
	uint32_t num_heads;  /* heads held by this worker */
	uint32_t head_dim;
	uint32_t elem_size; /* bytes per element */
};

#endif

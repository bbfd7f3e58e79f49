/* SPDX-License-Identifier: MIT */
/*
 * KV block geometry, block offsets, transfer lists, notify port offsets and
 * heterogeneous-TP rank mapping (docs/protocol.md "Block offsets", "Sockets and
 * ports", "Rules").
 *
 * A layer's KV tensor is registered once as one region and assumed dense
 * (contiguous strides):
 *   KVB_KV_LAYOUT_KV_FIRST     [2, num_blocks, block_size, heads, head_dim]
 *   KVB_KV_LAYOUT_BLOCK_FIRST  [num_blocks, 2, block_size, heads, head_dim]
 *   KVB_KV_LAYOUT_PACKED       [num_blocks, block_size, heads, head_dim]
 *                              (one plane: head_dim holds a head's K and V)
 *
 * Pure functions, no allocation; thread-safe.
 */
#ifndef KVB_BRIDGE_ZMQ_BLOCKS_H
#define KVB_BRIDGE_ZMQ_BLOCKS_H

#include <stdint.h>

#include "kv_geom.h" /* enum kvb_kv_layout, struct kvb_kv_geom */

/* One transfer entry: len bytes from local_off to remote_off. */
struct kvb_kv_xfer {
	uint64_t local_off;
	uint64_t remote_off;
	uint64_t len;
};

/*
 * Check a geometry: known layout, every dimension > 0, the whole tensor
 * (planes * num_blocks * block_len) representable in 63 bits. Returns 0 or
 * -EINVAL.
 */
int kvb_kv_geom_check(const struct kvb_kv_geom *g);

/* Planes of a layout: 2 (K and V apart) or 1 (PACKED). */
uint32_t kvb_kv_planes(const struct kvb_kv_geom *g);

/* block_size * heads * head_dim * elem_size of a checked geometry: one
 * plane of a block (a whole PACKED block). */
uint64_t kvb_kv_block_len(const struct kvb_kv_geom *g);

/* Bytes of the whole layer tensor (K and V) of a checked geometry. */
uint64_t kvb_kv_region_len(const struct kvb_kv_geom *g);

/*
 * Byte offset of K (v == 0) or V (v == 1) of block b in a checked geometry:
 *   KV_FIRST:    K = e*b*s1            V = e*(s1*num_blocks + b*s1)
 *   BLOCK_FIRST: K = e*b*s0            V = e*(b*s0 + s1)
 *   PACKED:      the block = e*b*s0    (v must be 0)
 * with s0, s1 the element strides of dims 0 and 1. Returns 0 with *off set,
 * -ERANGE when b >= num_blocks, -EINVAL when v is not a plane.
 */
int kvb_kv_block_off(const struct kvb_kv_geom *g, uint32_t b, int v,
		     uint64_t *off);

/*
 * Transfer list copying local blocks lb[i] to remote blocks rb[i], K and V,
 * for i in [0, n). Entries are emitted in list order (all K then all V for a
 * KV_FIRST local side, K and V of each block in turn for BLOCK_FIRST), and an
 * entry that continues the previous one on BOTH sides (local and remote
 * byte-contiguous) is merged into it. Sorting the ids first gives the longest
 * runs; this function does not reorder.
 *
 * Both sides must have the same block_len (same heads per worker; a
 * heterogeneous-TP head split: kvb_kv_build_xfers_split()), and both be
 * PACKED or neither (the same bytes mean other things). out holds
 * max_out entries; 2 * n always suffices.
 *
 * Returns the number of entries, -EINVAL (bad geometry, block_len mismatch,
 * n == 0), -ERANGE (a block id outside its side's num_blocks) or -ENOSPC
 * (max_out too small; out contents are then undefined).
 */
int kvb_kv_build_xfers(const struct kvb_kv_geom *local,
		       const struct kvb_kv_geom *remote, const uint32_t *lb,
		       const uint32_t *rb, uint32_t n, struct kvb_kv_xfer *out,
		       uint32_t max_out);

/*
 * The same where the two sides hold different heads per worker (a
 * heterogeneous-TP head split): the side with more heads holds a multiple
 * m of the other's h, and this pair moves its heads [slice*h, (slice+1)*h)
 * (slice < m) to or from all of the other side's. Block size, head dim
 * and element size must match. Each token of each block is one entry of
 * h * head_dim * elem_size bytes (the layouts put a token's heads side by
 * side), K and V, in the order above; out needs 2 * n * block_size.
 * Equal heads: slice must be 0, and this is kvb_kv_build_xfers().
 * Returns as kvb_kv_build_xfers(); -EINVAL also for a slice out of range
 * or heads that are not multiples.
 */
int kvb_kv_build_xfers_split(const struct kvb_kv_geom *local,
			     const struct kvb_kv_geom *remote, uint32_t slice,
			     const uint32_t *lb, const uint32_t *rb, uint32_t n,
			     struct kvb_kv_xfer *out, uint32_t max_out);

/* The two port-offset formulas found in released vLLM. */
enum kvb_port_formula {
	KVB_PORT_DP_TIMES_TP = 0, /* dp_rank * tp_size + tp_rank (default) */
	KVB_PORT_DP_PLUS_TP = 1,  /* dp_rank + tp_rank (collides if DP,TP>1) */
};

/*
 * base + offset(dp_rank, tp_rank) under formula f. Returns the port
 * (1..65535), -EINVAL (tp_rank >= tp_size, unknown formula, base 0) or
 * -ERANGE (past 65535).
 */
int kvb_port_of(uint32_t base, uint32_t dp_rank, uint32_t tp_rank,
		uint32_t tp_size, enum kvb_port_formula f);

/*
 * Remote TP rank a local rank talks to: equal sizes keep the rank; remote TP
 * larger -> rank * (R / L); smaller -> rank / (L / R). Returns the rank or
 * -EINVAL (a size 0, the larger not a multiple of the smaller, rank >= L).
 */
int kvb_tp_remote_rank(uint32_t rank, uint32_t local_tp, uint32_t remote_tp);

/*
 * Release ACKs a producer rank waits for: consumer_tp / producer_tp when the
 * consumer TP is larger, else 1. Returns the count or -EINVAL (a size 0, the
 * larger not a multiple of the smaller).
 */
int kvb_tp_release_acks(uint32_t producer_tp, uint32_t consumer_tp);

#endif

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#include "zmq/blocks.h"

int kvb_kv_geom_check(const struct kvb_kv_geom *g)
{
	uint32_t dim[4];
	uint64_t t;

	if (g->layout != KVB_KV_LAYOUT_KV_FIRST &&
	    g->layout != KVB_KV_LAYOUT_BLOCK_FIRST &&
	    g->layout != KVB_KV_LAYOUT_PACKED)
		return -EINVAL;
	if (!g->num_blocks || !g->block_size || !g->num_heads || !g->head_dim ||
	    !g->elem_size)
		return -EINVAL;
	/* 2 * num_blocks * the rest, each step checked: five 32-bit factors
	 * can pass 2^128, so no single wide product is safe */
	dim[0] = g->block_size;
	dim[1] = g->num_heads;
	dim[2] = g->head_dim;
	dim[3] = g->elem_size;
	t = kvb_kv_planes(g) * (uint64_t) g->num_blocks; /* < 2^33 */
	for (int i = 0; i < 4; i++) {
		if (t > (uint64_t) INT64_MAX / dim[i])
			return -EINVAL;
		t *= dim[i];
	}
	return 0;
}

uint32_t kvb_kv_planes(const struct kvb_kv_geom *g)
{
	return g->layout == KVB_KV_LAYOUT_PACKED ? 1 : 2;
}

uint64_t kvb_kv_block_len(const struct kvb_kv_geom *g)
{
	return (uint64_t) g->block_size * g->num_heads * g->head_dim *
	       g->elem_size;
}

uint64_t kvb_kv_region_len(const struct kvb_kv_geom *g)
{
	return kvb_kv_planes(g) * (uint64_t) g->num_blocks *
	       kvb_kv_block_len(g);
}

int kvb_kv_block_off(const struct kvb_kv_geom *g, uint32_t b, int v,
		     uint64_t *off)
{
	uint64_t e = g->elem_size;
	uint64_t blk = (uint64_t) g->block_size * g->num_heads * g->head_dim;
	uint64_t s0, s1;

	if (v < 0 || (uint32_t) v >= kvb_kv_planes(g))
		return -EINVAL;
	if (b >= g->num_blocks)
		return -ERANGE;
	if (g->layout == KVB_KV_LAYOUT_PACKED) {
		*off = e * b * blk;
	} else if (g->layout == KVB_KV_LAYOUT_KV_FIRST) {
		s1 = blk;
		*off = v ? e * (s1 * g->num_blocks + b * s1) : e * b * s1;
	} else {
		s0 = 2 * blk;
		s1 = blk;
		*off = v ? e * (b * s0 + s1) : e * b * s0;
	}
	return 0;
}

static int xfer_add(struct kvb_kv_xfer *out, uint32_t *cnt, uint32_t max_out,
		    uint64_t loff, uint64_t roff, uint64_t len)
{
	struct kvb_kv_xfer *last = *cnt ? &out[*cnt - 1] : NULL;

	if (last && last->local_off + last->len == loff &&
	    last->remote_off + last->len == roff) {
		last->len += len;
		return 0;
	}
	if (*cnt == max_out)
		return -ENOSPC;
	out[*cnt].local_off = loff;
	out[*cnt].remote_off = roff;
	out[*cnt].len = len;
	(*cnt)++;
	return 0;
}

/* How one block moves: whole (equal heads), or one piece per token: the
 * smaller side's heads, at slice * piece in the larger side's rows. */
struct xfer_shape {
	uint32_t rows;		 /* 1 (whole block) or block_size */
	uint64_t len;		 /* bytes per entry */
	uint64_t lrow, rrow;	 /* row strides (per token) */
	uint64_t lextra, rextra; /* the slice's offset in a row */
};

static int xfer_one(const struct kvb_kv_geom *local,
		    const struct kvb_kv_geom *remote, uint32_t lb, uint32_t rb,
		    int v, const struct xfer_shape *s, struct kvb_kv_xfer *out,
		    uint32_t *cnt, uint32_t max_out)
{
	uint64_t loff, roff;
	int ret;

	ret = kvb_kv_block_off(local, lb, v, &loff);
	if (ret)
		return ret;
	ret = kvb_kv_block_off(remote, rb, v, &roff);
	if (ret)
		return ret;
	for (uint32_t t = 0; t < s->rows; t++) {
		ret = xfer_add(out, cnt, max_out,
			       loff + t * s->lrow + s->lextra,
			       roff + t * s->rrow + s->rextra, s->len);
		if (ret)
			return ret;
	}
	return 0;
}

/* The shape of a (local, remote, slice) pair, or -EINVAL. */
static int xfer_shape(const struct kvb_kv_geom *local,
		      const struct kvb_kv_geom *remote, uint32_t slice,
		      struct xfer_shape *s)
{
	uint32_t hl = local->num_heads, hr = remote->num_heads;
	uint32_t h = hl < hr ? hl : hr, big = hl < hr ? hr : hl;
	uint64_t unit = (uint64_t) local->head_dim * local->elem_size;

	/* a packed block holds K and V of a token side by side: its bytes
	 * mean something else in a split layout of the same length */
	if ((local->layout == KVB_KV_LAYOUT_PACKED) !=
	    (remote->layout == KVB_KV_LAYOUT_PACKED))
		return -EINVAL;
	if (hl == hr) {
		if (slice ||
		    kvb_kv_block_len(local) != kvb_kv_block_len(remote))
			return -EINVAL;
		*s = (struct xfer_shape){.rows = 1,
					 .len = kvb_kv_block_len(local)};
		return 0;
	}
	if (local->block_size != remote->block_size ||
	    local->head_dim != remote->head_dim ||
	    local->elem_size != remote->elem_size || big % h ||
	    slice >= big / h)
		return -EINVAL;
	*s = (struct xfer_shape){
		.rows = local->block_size,
		.len = h * unit,
		.lrow = hl * unit,
		.rrow = hr * unit,
		.lextra = hl > hr ? slice * h * unit : 0,
		.rextra = hr > hl ? slice * h * unit : 0,
	};
	return 0;
}

int kvb_kv_build_xfers(const struct kvb_kv_geom *local,
		       const struct kvb_kv_geom *remote, const uint32_t *lb,
		       const uint32_t *rb, uint32_t n, struct kvb_kv_xfer *out,
		       uint32_t max_out)
{
	if (local->num_heads != remote->num_heads)
		return -EINVAL; /* a head split: kvb_kv_build_xfers_split() */
	return kvb_kv_build_xfers_split(local, remote, 0, lb, rb, n, out,
					max_out);
}

int kvb_kv_build_xfers_split(const struct kvb_kv_geom *local,
			     const struct kvb_kv_geom *remote, uint32_t slice,
			     const uint32_t *lb, const uint32_t *rb, uint32_t n,
			     struct kvb_kv_xfer *out, uint32_t max_out)
{
	struct xfer_shape s;
	uint32_t cnt = 0, i;
	int ret, v;

	if (kvb_kv_geom_check(local) || kvb_kv_geom_check(remote) || n == 0 ||
	    xfer_shape(local, remote, slice, &s))
		return -EINVAL;

	if (local->layout == KVB_KV_LAYOUT_KV_FIRST) {
		for (v = 0; v < 2; v++) {
			for (i = 0; i < n; i++) {
				ret = xfer_one(local, remote, lb[i], rb[i], v,
					       &s, out, &cnt, max_out);
				if (ret)
					return ret;
			}
		}
	} else {
		for (i = 0; i < n; i++) {
			for (v = 0; v < (int) kvb_kv_planes(local); v++) {
				ret = xfer_one(local, remote, lb[i], rb[i], v,
					       &s, out, &cnt, max_out);
				if (ret)
					return ret;
			}
		}
	}
	return (int) cnt;
}

int kvb_port_of(uint32_t base, uint32_t dp_rank, uint32_t tp_rank,
		uint32_t tp_size, enum kvb_port_formula f)
{
	uint64_t off;

	if (base == 0 || tp_size == 0 || tp_rank >= tp_size)
		return -EINVAL;
	switch (f) {
	case KVB_PORT_DP_TIMES_TP:
		off = (uint64_t) dp_rank * tp_size + tp_rank;
		break;
	case KVB_PORT_DP_PLUS_TP:
		off = (uint64_t) dp_rank + tp_rank;
		break;
	default:
		return -EINVAL;
	}
	if (base + off > 65535)
		return -ERANGE;
	return (int) (base + off);
}

static bool tp_sizes_ok(uint32_t a, uint32_t b)
{
	if (!a || !b)
		return false;
	return a >= b ? a % b == 0 : b % a == 0;
}

int kvb_tp_remote_rank(uint32_t rank, uint32_t local_tp, uint32_t remote_tp)
{
	if (!tp_sizes_ok(local_tp, remote_tp) || rank >= local_tp ||
	    remote_tp > INT32_MAX)
		return -EINVAL;
	if (remote_tp == local_tp)
		return (int) rank;
	if (remote_tp > local_tp)
		return (int) ((uint64_t) rank * (remote_tp / local_tp));
	return (int) (rank / (local_tp / remote_tp));
}

int kvb_tp_release_acks(uint32_t producer_tp, uint32_t consumer_tp)
{
	if (!tp_sizes_ok(producer_tp, consumer_tp) || consumer_tp > INT32_MAX)
		return -EINVAL;
	if (consumer_tp > producer_tp)
		return (int) (consumer_tp / producer_tp);
	return 1;
}

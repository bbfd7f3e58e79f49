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
	    g->layout != KVB_KV_LAYOUT_BLOCK_FIRST)
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
	t = 2 * (uint64_t) g->num_blocks; /* < 2^33 */
	for (int i = 0; i < 4; i++) {
		if (t > (uint64_t) INT64_MAX / dim[i])
			return -EINVAL;
		t *= dim[i];
	}
	return 0;
}

uint64_t kvb_kv_block_len(const struct kvb_kv_geom *g)
{
	return (uint64_t) g->block_size * g->num_heads * g->head_dim *
	       g->elem_size;
}

uint64_t kvb_kv_region_len(const struct kvb_kv_geom *g)
{
	return 2 * (uint64_t) g->num_blocks * kvb_kv_block_len(g);
}

int kvb_kv_block_off(const struct kvb_kv_geom *g, uint32_t b, int v,
		     uint64_t *off)
{
	uint64_t e = g->elem_size;
	uint64_t blk = (uint64_t) g->block_size * g->num_heads * g->head_dim;
	uint64_t s0, s1;

	if (v != 0 && v != 1)
		return -EINVAL;
	if (b >= g->num_blocks)
		return -ERANGE;
	if (g->layout == KVB_KV_LAYOUT_KV_FIRST) {
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

static int xfer_one(const struct kvb_kv_geom *local,
		    const struct kvb_kv_geom *remote, uint32_t lb, uint32_t rb,
		    int v, uint64_t len, struct kvb_kv_xfer *out, uint32_t *cnt,
		    uint32_t max_out)
{
	uint64_t loff, roff;
	int ret;

	ret = kvb_kv_block_off(local, lb, v, &loff);
	if (ret)
		return ret;
	ret = kvb_kv_block_off(remote, rb, v, &roff);
	if (ret)
		return ret;
	return xfer_add(out, cnt, max_out, loff, roff, len);
}

int kvb_kv_build_xfers(const struct kvb_kv_geom *local,
		       const struct kvb_kv_geom *remote, const uint32_t *lb,
		       const uint32_t *rb, uint32_t n, struct kvb_kv_xfer *out,
		       uint32_t max_out)
{
	uint32_t cnt = 0, i;
	uint64_t len;
	int ret, v;

	if (kvb_kv_geom_check(local) || kvb_kv_geom_check(remote) || n == 0)
		return -EINVAL;
	len = kvb_kv_block_len(local);
	if (len != kvb_kv_block_len(remote))
		return -EINVAL;

	if (local->layout == KVB_KV_LAYOUT_KV_FIRST) {
		for (v = 0; v < 2; v++) {
			for (i = 0; i < n; i++) {
				ret = xfer_one(local, remote, lb[i], rb[i], v,
					       len, out, &cnt, max_out);
				if (ret)
					return ret;
			}
		}
	} else {
		for (i = 0; i < n; i++) {
			for (v = 0; v < 2; v++) {
				ret = xfer_one(local, remote, lb[i], rb[i], v,
					       len, out, &cnt, max_out);
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

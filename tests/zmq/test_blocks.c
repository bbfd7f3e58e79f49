/* SPDX-License-Identifier: MIT */
/* Unit tests of bridge/zmq/blocks: offsets, transfer lists, ports, ranks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "zmq/blocks.h"

/* 16 tokens x 8 heads x 128 dims x 2 bytes = 32 KiB per block */
static const struct kvb_kv_geom g_kv = {
	.layout = KVB_KV_LAYOUT_KV_FIRST,
	.num_blocks = 100,
	.block_size = 16,
	.num_heads = 8,
	.head_dim = 128,
	.elem_size = 2,
};

#define BL (16ull * 8 * 128 * 2)

static void test_geom(void **state)
{
	struct kvb_kv_geom g = g_kv;

	assert_int_equal(kvb_kv_geom_check(&g), 0);
	assert_int_equal(kvb_kv_block_len(&g), BL);
	assert_int_equal(kvb_kv_region_len(&g), 2 * 100 * BL);
	g.head_dim = 0;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
	g = g_kv;
	g.layout = 7;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
	g = g_kv;
	g.num_blocks = UINT32_MAX;
	g.block_size = UINT32_MAX;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
	/* every dimension 2^31: the product (2^156) wraps even 128 bits */
	g.num_blocks = g.block_size = g.num_heads = g.head_dim = g.elem_size =
		1u << 31;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
	/* 2 * 2^16 * 2^31 * 2^24 * 2^24 * 2^16 = 2^112: wraps 64 bits */
	g.num_blocks = 1u << 16;
	g.block_size = 1u << 31;
	g.num_heads = g.head_dim = 1u << 24;
	g.elem_size = 1u << 16;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
	/* the limit: 2^62 bytes fit, 2^63 do not */
	g.num_blocks = 1u << 30;
	g.block_size = g.num_heads = g.head_dim = 1u << 8;
	g.elem_size = 1u << 7;
	assert_int_equal(kvb_kv_geom_check(&g), 0);
	assert_int_equal(kvb_kv_region_len(&g), 1ull << 62);
	g.elem_size = 1u << 8;
	assert_int_equal(kvb_kv_geom_check(&g), -EINVAL);
}

static void test_offsets_kv_first(void **state)
{
	uint64_t off;

	/* docs/protocol.md: K = e*b*s1, V = e*(s1*num_blocks + b*s1) */
	assert_int_equal(kvb_kv_block_off(&g_kv, 0, 0, &off), 0);
	assert_int_equal(off, 0);
	assert_int_equal(kvb_kv_block_off(&g_kv, 5, 0, &off), 0);
	assert_int_equal(off, 5 * BL);
	assert_int_equal(kvb_kv_block_off(&g_kv, 0, 1, &off), 0);
	assert_int_equal(off, 100 * BL);
	assert_int_equal(kvb_kv_block_off(&g_kv, 99, 1, &off), 0);
	assert_int_equal(off, 199 * BL);
	assert_int_equal(kvb_kv_block_off(&g_kv, 100, 0, &off), -ERANGE);
	assert_int_equal(kvb_kv_block_off(&g_kv, 1, 2, &off), -EINVAL);
}

static void test_offsets_block_first(void **state)
{
	struct kvb_kv_geom g = g_kv;
	uint64_t off;

	g.layout = KVB_KV_LAYOUT_BLOCK_FIRST;
	/* [num_blocks, 2, ...]: K = e*b*s0, V = e*(b*s0 + s1) */
	assert_int_equal(kvb_kv_block_off(&g, 5, 0, &off), 0);
	assert_int_equal(off, 10 * BL);
	assert_int_equal(kvb_kv_block_off(&g, 5, 1, &off), 0);
	assert_int_equal(off, 11 * BL);
	assert_int_equal(kvb_kv_block_off(&g, 99, 1, &off), 0);
	assert_int_equal(off + BL, kvb_kv_region_len(&g));
}

static void test_xfers_merge_both_sides(void **state)
{
	struct kvb_kv_geom r = g_kv;
	const uint32_t lb[] = {10, 11, 12, 13};
	const uint32_t rb[] = {40, 41, 42, 43};
	struct kvb_kv_xfer x[8];

	r.num_blocks = 50; /* D's V plane starts elsewhere */
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &r, lb, rb, 4, x, 8), 2);
	assert_int_equal(x[0].local_off, 10 * BL);
	assert_int_equal(x[0].remote_off, 40 * BL);
	assert_int_equal(x[0].len, 4 * BL);
	assert_int_equal(x[1].local_off, (100 + 10) * BL);
	assert_int_equal(x[1].remote_off, (50 + 40) * BL);
	assert_int_equal(x[1].len, 4 * BL);
}

static void test_xfers_contiguous_one_side(void **state)
{
	const uint32_t lb[] = {10, 11, 12};
	const uint32_t rb[] = {40, 42, 41};
	const uint32_t lb2[] = {10, 20, 30};
	const uint32_t rb2[] = {1, 2, 3};
	struct kvb_kv_xfer x[8];

	/* local contiguous, remote not (41 after 42 is not a run) */
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, rb, 3, x, 8), 6);
	/* remote contiguous, local not */
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb2, rb2, 3, x, 8),
			 6);
	assert_int_equal(x[0].len, BL);
}

static void test_xfers_partial_runs(void **state)
{
	const uint32_t lb[] = {1, 2, 3, 7, 8};
	const uint32_t rb[] = {5, 6, 9, 10, 11};
	struct kvb_kv_xfer x[16];

	/* runs: (1,2)->(5,6); (3)->(9); (7,8)->(10,11): K and V each */
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, rb, 5, x, 16), 6);
	assert_int_equal(x[0].len, 2 * BL);
	assert_int_equal(x[1].len, BL);
	assert_int_equal(x[2].len, 2 * BL);
	assert_int_equal(x[2].local_off, 7 * BL);
	assert_int_equal(x[2].remote_off, 10 * BL);
}

static void test_xfers_block_first(void **state)
{
	struct kvb_kv_geom l = g_kv, r = g_kv;
	const uint32_t lb[] = {3, 4, 5};
	const uint32_t rb[] = {0, 1, 2};
	struct kvb_kv_xfer x[8];

	/* K and V of consecutive blocks are all adjacent: one entry */
	l.layout = r.layout = KVB_KV_LAYOUT_BLOCK_FIRST;
	assert_int_equal(kvb_kv_build_xfers(&l, &r, lb, rb, 3, x, 8), 1);
	assert_int_equal(x[0].local_off, 6 * BL);
	assert_int_equal(x[0].remote_off, 0);
	assert_int_equal(x[0].len, 6 * BL);

	/* mixed layouts: only per-block pieces line up on neither side */
	r.layout = KVB_KV_LAYOUT_KV_FIRST;
	assert_int_equal(kvb_kv_build_xfers(&l, &r, lb, rb, 3, x, 8), 6);
}

static void test_xfers_errors(void **state)
{
	struct kvb_kv_geom r = g_kv;
	const uint32_t lb[] = {1, 5};
	const uint32_t rb[] = {2, 100};
	struct kvb_kv_xfer x[4];

	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, rb, 2, x, 4),
			 -ERANGE);
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, lb, 2, x, 3),
			 -ENOSPC);
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, lb, 2, x, 4), 4);
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &g_kv, lb, lb, 0, x, 4),
			 -EINVAL);
	r.num_heads = 4; /* heterogeneous head split: not a plain copy */
	assert_int_equal(kvb_kv_build_xfers(&g_kv, &r, lb, lb, 2, x, 4),
			 -EINVAL);
}

/* A head split: the local side holds 4 heads, the remote 1 (or the other
 * way round); slice k moves head k; one entry per token, K and V. */
static void test_xfers_head_split(void **state)
{
	struct kvb_kv_geom big = g_kv, small = g_kv;
	const uint32_t lb[] = {3, 4};
	const uint32_t rb[] = {7, 9};
	const uint64_t unit = 128 * 2; /* head_dim * elem_size */
	struct kvb_kv_xfer x[2 * 2 * 16];
	uint64_t off;

	(void) state;
	big.num_heads = 4;
	small.num_heads = 1;
	small.num_blocks = 20;
	/* big -> small, slice 2: token t of block 3's K at row t, head 2 */
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 2, lb, rb, 2, x, 64),
		64);
	for (int v = 0; v < 2; v++)
		for (int i = 0; i < 2; i++)
			for (uint64_t t = 0; t < 16; t++) {
				const struct kvb_kv_xfer *e =
					&x[(v * 2 + i) * 16 + t];
				uint64_t lo, ro;

				assert_int_equal(
					kvb_kv_block_off(&big, lb[i], v, &lo),
					0);
				assert_int_equal(
					kvb_kv_block_off(&small, rb[i], v, &ro),
					0);
				assert_int_equal(e->local_off,
						 lo + t * 4 * unit + 2 * unit);
				assert_int_equal(e->remote_off, ro + t * unit);
				assert_int_equal(e->len, unit);
			}
	/* small -> big (a READ of the other side's slice 1) */
	assert_int_equal(
		kvb_kv_build_xfers_split(&small, &big, 1, rb, lb, 2, x, 64),
		64);
	assert_int_equal(kvb_kv_block_off(&big, 3, 0, &off), 0);
	assert_int_equal(x[1].remote_off, off + 4 * unit + unit);
	assert_int_equal(x[1].len, unit);
	/* slice out of range, heads not a multiple, other dims differ,
	 * out too small; the plain builder refuses different heads */
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 4, lb, rb, 2, x, 64),
		-EINVAL);
	small.num_heads = 3;
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 0, lb, rb, 2, x, 64),
		-EINVAL);
	small.num_heads = 1;
	small.block_size = 8;
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 0, lb, rb, 2, x, 64),
		-EINVAL);
	small.block_size = 16;
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 0, lb, rb, 2, x, 63),
		-ENOSPC);
	assert_int_equal(kvb_kv_build_xfers(&big, &small, lb, rb, 2, x, 64),
			 -EINVAL);
	/* a BLOCK_FIRST side (K and V of a block side by side): the same
	 * rows, in its order (K then V of each block) */
	big.layout = KVB_KV_LAYOUT_BLOCK_FIRST;
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 3, lb, rb, 2, x, 64),
		64);
	for (int i = 0; i < 2; i++)
		for (int v = 0; v < 2; v++) {
			const struct kvb_kv_xfer *e = &x[(i * 2 + v) * 16 + 5];
			uint64_t lo, ro;

			assert_int_equal(kvb_kv_block_off(&big, lb[i], v, &lo),
					 0);
			assert_int_equal(
				kvb_kv_block_off(&small, rb[i], v, &ro), 0);
			assert_int_equal(e->local_off,
					 lo + 5 * 4 * unit + 3 * unit);
			assert_int_equal(e->remote_off, ro + 5 * unit);
		}
	big.layout = KVB_KV_LAYOUT_KV_FIRST;
	/* equal heads: the plain builder's merged runs, slice 0 only */
	assert_int_equal(
		kvb_kv_build_xfers_split(&g_kv, &g_kv, 0, lb, lb, 2, x, 4), 2);
	assert_int_equal(
		kvb_kv_build_xfers_split(&g_kv, &g_kv, 1, lb, lb, 2, x, 4),
		-EINVAL);
}

/* PACKED (vLLM >= 0.29: [blocks, tokens, heads, K+V]): one plane, whole
 * blocks between equal heads, a token's heads split otherwise, never
 * mixed with a split layout of the same length */
static void test_packed(void **state)
{
	struct kvb_kv_geom p = g_kv, q, big, small;
	struct kvb_kv_xfer x[64];
	uint32_t lb[3] = {4, 5, 9}, rb[3] = {0, 1, 2};
	uint64_t off, unit = 256 * 2;

	(void) state;
	p.layout = KVB_KV_LAYOUT_PACKED;
	p.head_dim = 256; /* K and V of 128 each */
	assert_int_equal(kvb_kv_geom_check(&p), 0);
	assert_int_equal(kvb_kv_planes(&p), 1);
	assert_int_equal(kvb_kv_block_len(&p), 2 * BL);
	assert_int_equal(kvb_kv_region_len(&p), 100 * 2 * BL);
	assert_int_equal(kvb_kv_block_off(&p, 7, 0, &off), 0);
	assert_int_equal(off, 7 * 2 * BL);
	assert_int_equal(kvb_kv_block_off(&p, 7, 1, &off), -EINVAL);
	assert_int_equal(kvb_kv_block_off(&p, 100, 0, &off), -ERANGE);
	/* whole blocks, merged where both sides run on: 4,5 -> 0,1 and 9 */
	assert_int_equal(kvb_kv_build_xfers(&p, &p, lb, rb, 3, x, 64), 2);
	assert_int_equal(x[0].local_off, 4 * 2 * BL);
	assert_int_equal(x[0].remote_off, 0);
	assert_int_equal(x[0].len, 2 * 2 * BL);
	assert_int_equal(x[1].local_off, 9 * 2 * BL);
	assert_int_equal(x[1].remote_off, 2 * 2 * BL);
	assert_int_equal(x[1].len, 2 * BL);
	/* a BLOCK_FIRST side of the same block length: refused */
	q = g_kv;
	q.layout = KVB_KV_LAYOUT_BLOCK_FIRST;
	assert_int_equal(kvb_kv_block_len(&q) * 2, kvb_kv_block_len(&p));
	q.head_dim = 256; /* same bytes per block, other meaning */
	q.num_heads = 4;
	assert_int_equal(kvb_kv_build_xfers(&p, &q, lb, rb, 3, x, 64), -EINVAL);
	/* a head split: 8 heads here, 4 at the peer, slice 1: per token
	 * heads 4..7 (K and V of each) in one piece */
	big = p;
	small = p;
	small.num_heads = 4;
	assert_int_equal(
		kvb_kv_build_xfers_split(&big, &small, 1, lb, rb, 1, x, 64),
		16);
	for (int t = 0; t < 16; t++) {
		assert_int_equal(x[t].local_off,
				 4 * 2 * BL + t * 8 * unit + 4 * unit);
		assert_int_equal(x[t].remote_off, t * 4 * unit);
		assert_int_equal(x[t].len, 4 * unit);
	}
}

static void test_ports(void **state)
{
	/* dp * tp_size + tp */
	assert_int_equal(kvb_port_of(61005, 0, 0, 2, KVB_PORT_DP_TIMES_TP),
			 61005);
	assert_int_equal(kvb_port_of(61005, 1, 1, 2, KVB_PORT_DP_TIMES_TP),
			 61008);
	assert_int_equal(kvb_port_of(61005, 3, 7, 8, KVB_PORT_DP_TIMES_TP),
			 61005 + 31);
	/* dp + tp, and the collision it has with DP>1, TP>1 */
	assert_int_equal(kvb_port_of(61005, 1, 1, 2, KVB_PORT_DP_PLUS_TP),
			 61007);
	assert_int_equal(kvb_port_of(61005, 1, 0, 2, KVB_PORT_DP_PLUS_TP),
			 kvb_port_of(61005, 0, 1, 2, KVB_PORT_DP_PLUS_TP));
	/* equal when dp == 0 */
	assert_int_equal(kvb_port_of(6301, 0, 5, 8, KVB_PORT_DP_PLUS_TP),
			 kvb_port_of(6301, 0, 5, 8, KVB_PORT_DP_TIMES_TP));
	assert_int_equal(kvb_port_of(65535, 0, 1, 2, KVB_PORT_DP_TIMES_TP),
			 -ERANGE);
	assert_int_equal(kvb_port_of(61005, 0, 2, 2, KVB_PORT_DP_TIMES_TP),
			 -EINVAL);
	assert_int_equal(kvb_port_of(61005, 0, 0, 0, KVB_PORT_DP_TIMES_TP),
			 -EINVAL);
	assert_int_equal(kvb_port_of(0, 0, 0, 1, KVB_PORT_DP_TIMES_TP),
			 -EINVAL);
	assert_int_equal(kvb_port_of(61005, 0, 0, 1, 9), -EINVAL);
	assert_int_equal(
		kvb_port_of(61005, UINT32_MAX, 0, 2, KVB_PORT_DP_TIMES_TP),
		-ERANGE);
}

static void test_rank_mapping(void **state)
{
	assert_int_equal(kvb_tp_remote_rank(1, 2, 2), 1);
	/* remote TP larger: rank * (R / L) */
	assert_int_equal(kvb_tp_remote_rank(0, 2, 4), 0);
	assert_int_equal(kvb_tp_remote_rank(1, 2, 4), 2);
	assert_int_equal(kvb_tp_remote_rank(3, 4, 8), 6);
	/* remote TP smaller: rank // (L / R) */
	assert_int_equal(kvb_tp_remote_rank(3, 4, 2), 1);
	assert_int_equal(kvb_tp_remote_rank(2, 4, 2), 1);
	assert_int_equal(kvb_tp_remote_rank(1, 4, 2), 0);
	assert_int_equal(kvb_tp_remote_rank(7, 8, 1), 0);
	/* errors */
	assert_int_equal(kvb_tp_remote_rank(2, 2, 4), -EINVAL);
	assert_int_equal(kvb_tp_remote_rank(0, 2, 3), -EINVAL);
	assert_int_equal(kvb_tp_remote_rank(0, 0, 2), -EINVAL);
}

static void test_ack_fanin(void **state)
{
	assert_int_equal(kvb_tp_release_acks(2, 4), 2);
	assert_int_equal(kvb_tp_release_acks(1, 8), 8);
	assert_int_equal(kvb_tp_release_acks(2, 2), 1);
	assert_int_equal(kvb_tp_release_acks(4, 2), 1);
	assert_int_equal(kvb_tp_release_acks(2, 3), -EINVAL);
	assert_int_equal(kvb_tp_release_acks(0, 2), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_geom),
		cmocka_unit_test(test_offsets_kv_first),
		cmocka_unit_test(test_offsets_block_first),
		cmocka_unit_test(test_xfers_merge_both_sides),
		cmocka_unit_test(test_xfers_contiguous_one_side),
		cmocka_unit_test(test_xfers_partial_runs),
		cmocka_unit_test(test_xfers_block_first),
		cmocka_unit_test(test_xfers_errors),
		cmocka_unit_test(test_xfers_head_split),
		cmocka_unit_test(test_packed),
		cmocka_unit_test(test_ports),
		cmocka_unit_test(test_rank_mapping),
		cmocka_unit_test(test_ack_fanin),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

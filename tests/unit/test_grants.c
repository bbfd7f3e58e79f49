/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for bridge/xnode/grants.c, the tcp write gate: a write into a KV
 * block that a failed transfer held and none holds now is refused (and
 * counted); one into a block never held, held now, left by a transfer that
 * succeeded, or announced again by another D rank of the same DP rank lands;
 * both layouts (the V half of KV_FIRST, the K and V of a BLOCK_FIRST block),
 * writes spanning blocks, two transfers holding one block, a region that is
 * not a KV region. The KV layout is declared as a worker does
 * (kvb_mem_set_kv: the engine's mem_kv hook), into the module's state.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"
#include "xnode/xnode.h"
#include "xnode/xnode_priv.h"
#include "zmq/blocks.h"
#include "kvbroker/kvbroker.h"

#define WID 0x2003u /* worker id, slot 3 */

struct fix {
	struct kvb_broker b;
	uint32_t region;
	uint64_t bl; /* block length */
	struct kvb_kv_geom geom;
};

static int setup_layout(void **state, uint32_t layout)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct kvb_region_ent *r;
	struct kvb_msg_mem_kv m = {.layer = 0};

	assert_non_null(f);
	f->b.opt.max_workers = 8;
	f->b.workers = calloc(8, sizeof(*f->b.workers));
	assert_non_null(f->b.workers);
	assert_int_equal(kvb_regions_init(&f->b.regions), 0);
	/* the module, without --host-ip: it keeps KV layouts all the same */
	assert_int_equal(kvb_xn_init(&f->b), 0);
	assert_non_null(kvb_xn_state(&f->b));
	assert_null(kvb_xn_of(&f->b));
	f->geom = (struct kvb_kv_geom){.layout = layout,
				       .num_blocks = 16,
				       .block_size = 4,
				       .num_heads = 1,
				       .head_dim = 8,
				       .elem_size = 2};
	r = kvb_region_alloc(&f->b.regions);
	assert_non_null(r);
	r->owner = WID;
	r->mr.len = kvb_kv_region_len(&f->geom);
	kvb_hook_region_added(&f->b, r);
	f->region = r->mr.id;
	f->bl = kvb_kv_block_len(&f->geom);
	f->b.workers[3].id = WID;
	f->b.workers[3].attached = 1;
	m.region = r->mr.id;
	m.layout = f->geom.layout;
	m.num_blocks = f->geom.num_blocks;
	m.block_size = f->geom.block_size;
	m.num_heads = f->geom.num_heads;
	m.head_dim = f->geom.head_dim;
	m.elem_size = f->geom.elem_size;
	assert_int_equal(kvb_hook_mem_kv(&f->b, &f->b.workers[3], &m), 0);
	/* once per region */
	assert_int_equal(kvb_hook_mem_kv(&f->b, &f->b.workers[3], &m), -EEXIST);
	*state = f;
	return 0;
}

static int setup_kv_first(void **state)
{
	return setup_layout(state, KVB_KV_LAYOUT_KV_FIRST);
}

static int setup_block_first(void **state)
{
	return setup_layout(state, KVB_KV_LAYOUT_BLOCK_FIRST);
}

static int teardown(void **state)
{
	struct fix *f = *state;

	kvb_engine_hooks_fini(&f->b); /* the module frees what it kept */
	free(f->b.workers);
	kvb_regions_fini(&f->b.regions);
	free(f);
	return 0;
}

static int gate(struct fix *f, uint64_t off, uint64_t len)
{
	return kvb_grant_gate(kvb_xn_state(&f->b), f->region, off, len);
}

/* Byte offset of K (v 0) or V (v 1) of block i. */
static uint64_t at(struct fix *f, uint32_t i, int v)
{
	uint64_t off;

	assert_int_equal(kvb_kv_block_off(&f->geom, i, v, &off), 0);
	return off;
}

static void fenced_after_failure(void **state)
{
	struct fix *f = *state;
	struct kvb_worker *w = &f->b.workers[3];
	const uint32_t a[] = {2, 3}, b[] = {3, 5};

	/* nothing held yet: every write lands */
	assert_int_equal(gate(f, 0, 2 * f->bl), 0);
	/* a transfer that succeeded fences nothing */
	assert_int_equal(kvb_grant_take(&f->b, w, a, 2), 0);
	kvb_grant_drop(&f->b, WID, a, 2, 0);
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), 0);
	/* two transfers hold block 3 */
	assert_int_equal(kvb_grant_take(&f->b, w, a, 2), 0);
	assert_int_equal(kvb_grant_take(&f->b, w, b, 2), 0);
	for (int v = 0; v < 2; v++) {
		assert_int_equal(gate(f, at(f, 2, v), f->bl), 0);
		assert_int_equal(gate(f, at(f, 3, v) + 8, 8), 0);
		/* block 7: never held */
		assert_int_equal(gate(f, at(f, 7, v), f->bl), 0);
	}
	/* the first fails: 2 is late, 3 still held by the second */
	kvb_grant_drop(&f->b, WID, a, 2, 1);
	for (int v = 0; v < 2; v++) {
		assert_int_equal(gate(f, at(f, 2, v), f->bl), -ECANCELED);
		assert_int_equal(gate(f, at(f, 2, v) + f->bl - 1, 1),
				 -ECANCELED);
		assert_int_equal(gate(f, at(f, 3, v), f->bl), 0);
		assert_int_equal(gate(f, at(f, 5, v), f->bl), 0);
	}
	assert_int_equal(f->b.st.late_writes_refused, 4);
	/* a write from block 1 on into block 2 (3 block lengths: K of 1 to 3,
	 * or K and V of 1 and K of 2) touches a late block */
	assert_int_equal(gate(f, at(f, 1, 0), 3 * f->bl), -ECANCELED);
	assert_int_equal(gate(f, at(f, 1, 0), f->bl), 0);
	/* the second succeeds: 3 was fenced by the first, none holds it now */
	kvb_grant_drop(&f->b, WID, b, 2, 0);
	assert_int_equal(gate(f, at(f, 3, 1), 1), -ECANCELED);
	assert_int_equal(gate(f, at(f, 5, 0), f->bl), 0);
	/* held again by a new transfer: lands again, and after it */
	assert_int_equal(kvb_grant_take(&f->b, w, a, 2), 0);
	assert_int_equal(gate(f, at(f, 2, 1), f->bl), 0);
	assert_int_equal(f->b.st.late_writes_refused, 6);
	kvb_grant_drop(&f->b, WID, a, 2, 0);
	assert_int_equal(gate(f, at(f, 2, 1), f->bl), 0);
	/* a second drop of the same blocks does not go below zero */
	kvb_grant_drop(&f->b, WID, a, 2, 1);
	kvb_grant_drop(&f->b, WID, a, 2, 1);
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), -ECANCELED);
	assert_int_equal(kvb_grant_take(&f->b, w, a, 1), 0);
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), 0);
}

/* Another D rank of the same DP rank announced the blocks: P may write
 * this rank before it opened; the fence lifts (not for another DP rank). */
static void unfenced_by_announce(void **state)
{
	struct fix *f = *state;
	struct kvb_worker *w = &f->b.workers[3];
	const uint32_t a[] = {4, 6};

	w->role = KVB_ROLE_D;
	w->dp_rank = 1;
	assert_int_equal(kvb_grant_take(&f->b, w, a, 2), 0);
	kvb_grant_drop(&f->b, WID, a, 2, 1);
	assert_int_equal(gate(f, at(f, 6, 0), f->bl), -ECANCELED);
	kvb_grant_unfence(&f->b, 1, a, 2); /* not live: not looked at */
	assert_int_equal(gate(f, at(f, 6, 0), f->bl), -ECANCELED);
	f->b.live = calloc(1, sizeof(*f->b.live));
	assert_non_null(f->b.live);
	f->b.live[0] = 3;
	f->b.nlive = 1;
	kvb_grant_unfence(&f->b, 0, a, 2);
	assert_int_equal(gate(f, at(f, 6, 0), f->bl), -ECANCELED);
	kvb_grant_unfence(&f->b, 1, a, 1);
	assert_int_equal(gate(f, at(f, 4, 1), f->bl), 0);
	assert_int_equal(gate(f, at(f, 6, 0), f->bl), -ECANCELED);
	kvb_grant_unfence(&f->b, 1, a + 1, 1);
	assert_int_equal(gate(f, at(f, 6, 0), f->bl), 0);
	free(f->b.live);
	f->b.live = NULL;
	f->b.nlive = 0;
}

/* Block ids past the region's blocks are not held (no memory of them); a
 * region that is not a KV region is not looked at; a worker that is gone. */
static void out_of_range(void **state)
{
	struct fix *f = *state;
	struct kvb_worker *w = &f->b.workers[3];
	struct kvb_xn_region *r = kvb_xn_region(kvb_xn_state(&f->b), f->region);
	const uint32_t big[] = {16, 1u << 30, 0};

	assert_int_equal(kvb_grant_take(&f->b, w, big, 3), 0);
	assert_int_equal(kvb_xn_w(kvb_xn_state(&f->b), w)->ngrant, 16);
	kvb_grant_drop(&f->b, WID, big, 3, 1);
	assert_int_equal(gate(f, at(f, 0, 0), f->bl), -ECANCELED);
	/* a zero-length write touches nothing */
	assert_int_equal(gate(f, at(f, 0, 0), 0), 0);
	kvb_grant_drop(&f->b, WID + 0x1000, big, 3, 1); /* not that worker */
	r->has_kv = 0;
	assert_int_equal(gate(f, at(f, 0, 0), f->bl), 0);
	r->has_kv = 1;
	w->id = 0;
	assert_int_equal(gate(f, at(f, 0, 0), f->bl), 0);
	w->id = WID;
}

static int rgate(struct fix *f, uint64_t off, uint64_t len)
{
	return kvb_grant_read_gate(kvb_xn_state(&f->b), f->region, off, len);
}

/* The read gate: a P worker's KV blocks only while a transfer holds them;
 * a D worker's are not looked at; the write gate is not changed by it. */
static void reads_held_only(void **state)
{
	struct fix *f = *state;
	struct kvb_worker *w = &f->b.workers[3];
	const uint32_t a[] = {2, 3};
	uint64_t before = f->b.st.unheld_reads_refused;

	w->role = KVB_ROLE_P;
	/* nothing held: refused (before any grant array exists too) */
	assert_int_equal(rgate(f, at(f, 2, 0), f->bl), -EACCES);
	assert_int_equal(kvb_grant_take(&f->b, w, a, 2), 0);
	for (int v = 0; v < 2; v++) {
		assert_int_equal(rgate(f, at(f, 2, v), 2 * f->bl), 0);
		assert_int_equal(rgate(f, at(f, 3, v) + f->bl - 1, 1), 0);
		/* one byte of block 4, alone or after held bytes */
		assert_int_equal(rgate(f, at(f, 4, v), 1), -EACCES);
		if (f->geom.layout == KVB_KV_LAYOUT_KV_FIRST)
			assert_int_equal(rgate(f, at(f, 3, v), f->bl + 1),
					 -EACCES);
		assert_int_equal(rgate(f, at(f, 1, v), f->bl), -EACCES);
	}
	assert_int_equal(rgate(f, at(f, 2, 0), 0), 0); /* touches nothing */
	/* the hold ended (failed or not): refused again, no write fence */
	kvb_grant_drop(&f->b, WID, a, 2, 0);
	assert_int_equal(rgate(f, at(f, 2, 0), f->bl), -EACCES);
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), 0);
	assert_true(f->b.st.unheld_reads_refused >= before + 6);
	/* a D worker's blocks are not gated for reads */
	w->role = KVB_ROLE_D;
	assert_int_equal(rgate(f, at(f, 5, 0), f->bl), 0);
	w->role = 0;
}

/* The worker's slot is freed (worker_free): its KV layout and grants go;
 * the region's part goes with the region (region_gone). */
static void freed_with_worker(void **state)
{
	struct fix *f = *state;
	struct kvb_worker *w = &f->b.workers[3];
	struct kvb_xn *xn = kvb_xn_state(&f->b);
	struct kvb_region_ent *r;
	const uint32_t a[] = {2};

	assert_non_null(kvb_xn_kv_layer(&f->b, w, 0, &r));
	assert_int_equal(r->mr.id, f->region);
	assert_null(kvb_xn_kv_layer(&f->b, w, 1, &r));
	assert_null(r);
	assert_int_equal(kvb_grant_take(&f->b, w, a, 1), 0);
	kvb_grant_drop(&f->b, WID, a, 1, 1);
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), -ECANCELED);
	kvb_hook_worker_free(&f->b, w);
	assert_null(kvb_xn_w(xn, w)->kv_layer);
	assert_null(kvb_xn_w(xn, w)->grant);
	assert_int_equal(kvb_xn_nkv(&f->b, w), 0);
	assert_null(kvb_xn_kv_layer(&f->b, w, 0, &r));
	assert_int_equal(gate(f, at(f, 2, 0), f->bl), 0);
	r = kvb_region_get(&f->b.regions, f->region);
	assert_non_null(kvb_xn_region(xn, f->region));
	kvb_hook_region_gone(&f->b, r);
	assert_null(kvb_xn_region(xn, f->region));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(fenced_after_failure,
						setup_kv_first, teardown),
		cmocka_unit_test_setup_teardown(fenced_after_failure,
						setup_block_first, teardown),
		cmocka_unit_test_setup_teardown(unfenced_by_announce,
						setup_kv_first, teardown),
		cmocka_unit_test_setup_teardown(out_of_range, setup_kv_first,
						teardown),
		cmocka_unit_test_setup_teardown(freed_with_worker,
						setup_kv_first, teardown),
		cmocka_unit_test_setup_teardown(reads_held_only, setup_kv_first,
						teardown),
		cmocka_unit_test_setup_teardown(reads_held_only,
						setup_block_first, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

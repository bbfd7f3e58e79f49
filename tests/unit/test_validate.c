/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's region table and descriptor validation
 * (broker/regions.c), on a table built by hand: no broker, no mappings.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regions.h"
#include "kvbroker/kvbroker.h"

#define W1 0x1001u /* worker ids as the broker makes them: gen << 12 | slot */
#define W2 0x1002u
#define W3 0x2003u
#define SZ 65536u

struct fix {
	struct kvb_regions t;
	struct kvb_region_ent *p_src;  /* W1, no remote access */
	struct kvb_region_ent *p_priv; /* W1, no remote access */
	struct kvb_region_ent *d_wr;   /* W2, REMOTE_WRITE */
	struct kvb_region_ent *d_rd;   /* W2, REMOTE_READ */
	struct kvb_region_ent *d_none; /* W2, no remote access */
	struct kvb_region_ent *d_rw;   /* W3, both */
};

static struct kvb_region_ent *mk(struct kvb_regions *t, uint32_t owner,
				 uint32_t flags, uint64_t size)
{
	struct kvb_region_ent *r = kvb_region_alloc(t);

	assert_non_null(r);
	r->owner = owner;
	r->mr.flags = flags;
	r->mr.len = size;
	return r;
}

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	assert_int_equal(kvb_regions_init(&f->t), 0);
	f->p_src = mk(&f->t, W1, 0, SZ);
	f->p_priv = mk(&f->t, W1, 0, SZ);
	f->d_wr = mk(&f->t, W2, KVB_MEM_REMOTE_WRITE, SZ);
	f->d_rd = mk(&f->t, W2, KVB_MEM_REMOTE_READ, SZ);
	f->d_none = mk(&f->t, W2, 0, SZ);
	f->d_rw = mk(&f->t, W3, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ, SZ);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	kvb_regions_fini(&f->t);
	free(f);
	return 0;
}

static struct kvb_sqe desc(uint8_t op, const struct kvb_region_ent *l,
			   uint64_t off, const struct kvb_region_ent *r,
			   uint64_t roff, uint64_t len)
{
	struct kvb_sqe e;

	memset(&e, 0, sizeof(e));
	e.opcode = op;
	e.region = l ? l->mr.id : 0;
	e.peer_region = r ? r->mr.id : 0;
	e.offset = off;
	e.peer_offset = roff;
	e.len = len;
	e.tag = 42;
	return e;
}

/* Validate as worker w; on failure check that a reason was given. */
static int check(struct fix *f, uint32_t w, const struct kvb_sqe *e)
{
	struct kvb_region_ent *l = NULL, *r = NULL;
	const char *why = NULL;
	int rc = kvb_validate_desc(&f->t, w, e, &l, &r, &why);

	if (rc) {
		assert_non_null(why);
		assert_true(strlen(why) > 0);
	} else {
		assert_non_null(l);
		assert_non_null(r);
		assert_int_equal(l->mr.id, e->region);
		assert_int_equal(r->mr.id, e->peer_region);
	}
	return rc;
}

static void test_ok(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 4096);
	assert_int_equal(check(f, W1, &e), 0);
	/* exactly up to the end on both sides */
	e = desc(KVB_OP_WRITE, f->p_src, SZ - 100, f->d_wr, SZ - 100, 100);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, SZ);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_WRITE, f->p_src, SZ - 1, f->d_wr, 0, 1);
	assert_int_equal(check(f, W1, &e), 0);
	/* READ from a region granted REMOTE_READ */
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_rd, 128, 512);
	assert_int_equal(check(f, W1, &e), 0);
	/* both rights */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_rw, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_rw, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
	/* a worker may move bytes between its own regions without grants */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_priv, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_READ, f->p_src, 0, f->p_priv, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
	/* the D side writing out of its own region into another D */
	e = desc(KVB_OP_WRITE, f->d_none, 0, f->d_rw, 0, 64);
	assert_int_equal(check(f, W2, &e), 0);
}

static void test_other_workers_region(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	/* local region of another worker, even one granted to everyone */
	e = desc(KVB_OP_WRITE, f->d_wr, 0, f->d_rw, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->d_rw, 0, f->d_wr, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	/* same slot, other generation of the worker id */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	assert_int_equal(check(f, W1 + 0x1000u, &e), -EINVAL);
	assert_int_equal(check(f, W1 & 0xfffu, &e), -EINVAL);
}

static void test_unknown_and_stale(void **state)
{
	struct fix *f = *state;
	struct kvb_region_ent *gone;
	struct kvb_sqe e;
	uint32_t old, slot;

	/* id 0, a never-used slot, a garbage id */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	e.region = 0;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e.region = 0x00017777u;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e.region = 0xffffffffu;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	e.peer_region = 0;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e.peer_region = 0x00017777u;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	/* right slot, wrong generation */
	e.peer_region = f->d_wr->mr.id + 0x10000u;
	assert_int_equal(check(f, W1, &e), -EINVAL);

	/* stale: released, then the slot reused by a new region */
	gone = mk(&f->t, W1, 0, SZ);
	old = gone->mr.id;
	slot = old & 0xffffu;
	kvb_region_release(&f->t, gone);
	assert_null(kvb_region_get(&f->t, old));
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	e.region = old;
	assert_int_equal(check(f, W1, &e), -EINVAL);
	f->t.next_free = slot;
	gone = mk(&f->t, W1, 0, SZ);
	assert_int_equal(gone->mr.id & 0xffffu, slot);
	assert_int_not_equal(gone->mr.id, old);
	assert_null(kvb_region_get(&f->t, old));
	assert_ptr_equal(kvb_region_get(&f->t, gone->mr.id), gone);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e.region = gone->mr.id;
	assert_int_equal(check(f, W1, &e), 0);

	/* a local region freed but still referenced: not usable */
	gone->dead = 1;
	gone->refs = 1;
	assert_int_equal(check(f, W1, &e), -EINVAL);
}

static void test_bounds(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	/* one byte past the end, local and peer */
	e = desc(KVB_OP_WRITE, f->p_src, SZ - 100, f->d_wr, 0, 101);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, SZ - 100, 101);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, SZ, f->d_wr, 0, 1);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, SZ, 1);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, SZ + 1);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_rd, 1u << 20, 64);
	assert_int_equal(check(f, W1, &e), -EFAULT);

	/* offset + len wraps around 2^64 */
	e = desc(KVB_OP_WRITE, f->p_src, UINT64_MAX - 10, f->d_wr, 0, 4096);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, UINT64_MAX - 10, 4096);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, UINT64_MAX, f->d_wr, 0, 1);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, UINT64_MAX, 1);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 1ull << 63, f->d_wr, 0, 1ull << 39);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	/* offset + len == 2^64 + small: wraps to inside the region */
	e = desc(KVB_OP_WRITE, f->p_src, UINT64_MAX - 63, f->d_wr, 0, 128);
	assert_int_equal(check(f, W1, &e), -EFAULT);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, UINT64_MAX - 63, 128);
	assert_int_equal(check(f, W1, &e), -EFAULT);
}

/* Source and destination in one region: refused when the ranges
 * overlap, by one byte or wholly, either way round; touching is fine. */
static void test_overlap(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_src, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_src, 63, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_READ, f->p_src, 63, f->p_src, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->p_src, 100, f->p_src, 0, SZ - 100);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_src, 64, 64);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_READ, f->p_src, 64, f->p_src, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_src, SZ - 1, 1);
	assert_int_equal(check(f, W1, &e), 0);
	/* the same offsets in two regions are not an overlap */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->p_priv, 0, 64);
	assert_int_equal(check(f, W1, &e), 0);
}

static void test_length(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 0);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_rd, 0, 0);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	/* absurd lengths refused before any region arithmetic */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, UINT64_MAX);
	assert_int_not_equal(check(f, W1, &e), 0);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, (1ull << 40) + 1);
	assert_int_not_equal(check(f, W1, &e), 0);
}

static void test_grants(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	/* WRITE needs REMOTE_WRITE */
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_none, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_rd, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	/* READ needs REMOTE_READ */
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_none, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_wr, 0, 64);
	assert_int_equal(check(f, W1, &e), -EINVAL);
	/* another worker's private region */
	e = desc(KVB_OP_WRITE, f->d_none, 0, f->p_priv, 0, 64);
	assert_int_equal(check(f, W2, &e), -EINVAL);
	e = desc(KVB_OP_READ, f->d_none, 0, f->p_priv, 0, 64);
	assert_int_equal(check(f, W2, &e), -EINVAL);
}

static void test_dead_remote(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	/* owner gone, region still referenced by ops in flight */
	f->d_wr->dead = 1;
	f->d_wr->refs = 3;
	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	assert_int_equal(check(f, W1, &e), -ENXIO);
	/* once released it is merely unknown */
	kvb_region_release(&f->t, f->d_wr);
	assert_int_equal(check(f, W1, &e), -EINVAL);
}

static void test_peer_node(void **state)
{
	struct fix *f = *state;
	struct kvb_sqe e;

	e = desc(KVB_OP_WRITE, f->p_src, 0, f->d_wr, 0, 64);
	e.peer = 1;
	assert_int_equal(check(f, W1, &e), -EHOSTUNREACH);
	e.peer = 0xffffffffu;
	assert_int_equal(check(f, W1, &e), -EHOSTUNREACH);
	e = desc(KVB_OP_READ, f->p_src, 0, f->d_rd, 0, 64);
	e.peer = 7;
	assert_int_equal(check(f, W1, &e), -EHOSTUNREACH);
}

static void test_opcodes(void **state)
{
	static const uint8_t bad[] = {KVB_OP_NOP, KVB_OP_SEAL, KVB_OP_ABORT,
				      5,	  0x80,	       0xff};
	struct fix *f = *state;
	struct kvb_sqe e;

	for (size_t i = 0; i < sizeof(bad); i++) {
		e = desc(bad[i], f->p_src, 0, f->d_wr, 0, 64);
		assert_int_equal(check(f, W1, &e), -EINVAL);
	}
}

static void test_table(void **state)
{
	struct kvb_regions t;
	struct kvb_region_ent *r;
	uint32_t n = 0, id;

	(void) state;
	assert_int_equal(kvb_regions_init(&t), 0);
	/* ids never have slot 0 and generations never 0 */
	while ((r = kvb_region_alloc(&t))) {
		assert_int_not_equal(r->mr.id & 0xffffu, 0);
		assert_int_not_equal(r->mr.id >> 16, 0);
		assert_ptr_equal(kvb_region_get(&t, r->mr.id), r);
		n++;
	}
	assert_int_equal(n, KVB_MAX_REGIONS - 1);
	assert_int_equal(t.live, KVB_MAX_REGIONS - 1);
	/* full: free one, the next alloc takes that slot */
	r = &t.v[1234];
	id = r->mr.id;
	kvb_region_release(&t, r);
	assert_int_equal(t.live, KVB_MAX_REGIONS - 2);
	r = kvb_region_alloc(&t);
	assert_non_null(r);
	assert_int_equal(r->mr.id & 0xffffu, 1234);
	assert_int_not_equal(r->mr.id, id);
	assert_null(kvb_region_alloc(&t));

	/* the generation wraps past 0xffff to 1, never to 0 */
	r->gen = 0xffff;
	r->mr.id = (0xffffu << 16) | 1234;
	kvb_region_release(&t, r);
	t.next_free = 1234;
	r = kvb_region_alloc(&t);
	assert_non_null(r);
	assert_int_equal(r->mr.id, (1u << 16) | 1234);
	kvb_regions_fini(&t);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_ok),
		T(test_other_workers_region),
		T(test_unknown_and_stale),
		T(test_bounds),
		T(test_overlap),
		T(test_length),
		T(test_grants),
		T(test_dead_remote),
		T(test_peer_node),
		T(test_opcodes),
		cmocka_unit_test(test_table),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the shared-memory SPSC ring (shm/ring.h): init/attach
 * errors, burst vs bulk, full/empty, wrap-around of the free-running u32
 * indices, count, and what each side does with a corrupt peer index.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shm/ring.h"

#define ENTRIES 16u

struct fixture {
	void *mem;
	size_t bytes;
	struct kvb_ring prod; /* producer's view */
	struct kvb_ring cons; /* consumer's view */
};

/* One slot's worth of payload tagged with a value. */
struct entry {
	uint64_t v;
	uint64_t inv;
	unsigned char fill[48];
};
_Static_assert(sizeof(struct entry) == KVB_RING_SLOT, "entry is one slot");

static void entry_make(struct entry *e, uint64_t v)
{
	unsigned int i;

	e->v = v;
	e->inv = ~v;
	for (i = 0; i < sizeof(e->fill); i++)
		e->fill[i] = (unsigned char) (v * 31 + i);
}

static void entry_check(const struct entry *e, uint64_t v)
{
	struct entry want;

	entry_make(&want, v);
	assert_memory_equal(e, &want, sizeof(want));
}

static void fill_seq(struct entry *e, uint32_t n, uint64_t first)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		entry_make(&e[i], first + i);
}

static void check_seq(const struct entry *e, uint32_t n, uint64_t first)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		entry_check(&e[i], first + i);
}

static void *ring_alloc(uint32_t entries, size_t *bytes)
{
	void *mem;

	*bytes = kvb_ring_bytes(entries);
	mem = aligned_alloc(KVB_CACHELINE, *bytes);
	assert_non_null(mem);
	memset(mem, 0xa5, *bytes);
	return mem;
}

/* Initialise, optionally start both indices at `start`, attach two views. */
static struct fixture *fixture_new(uint32_t entries, uint32_t start)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct kvb_ring_shm *s;

	assert_non_null(f);
	f->mem = ring_alloc(entries, &f->bytes);
	assert_int_equal(kvb_ring_init(f->mem, entries), 0);
	s = f->mem;
	atomic_store(&s->prod, start);
	atomic_store(&s->cons, start);
	assert_int_equal(kvb_ring_attach(&f->prod, f->mem, f->bytes), 0);
	assert_int_equal(kvb_ring_attach(&f->cons, f->mem, f->bytes), 0);
	return f;
}

static void fixture_free(struct fixture *f)
{
	free(f->mem);
	free(f);
}

static int setup(void **state)
{
	*state = fixture_new(ENTRIES, 0);
	return 0;
}

static int teardown(void **state)
{
	fixture_free(*state);
	return 0;
}

static void test_bytes(void **state)
{
	(void) state;
	assert_int_equal(kvb_ring_bytes(2), 192 + 2 * 64);
	assert_int_equal(kvb_ring_bytes(1024), 192 + 1024 * 64);
	assert_int_equal(sizeof(struct kvb_ring_shm), 192);
	assert_int_equal(offsetof(struct kvb_ring_shm, prod), 0);
	assert_int_equal(offsetof(struct kvb_ring_shm, cons), 64);
	assert_int_equal(offsetof(struct kvb_ring_shm, magic), 128);
	assert_int_equal(offsetof(struct kvb_ring_shm, slots), 192);
}

static void test_init_errors(void **state)
{
	size_t bytes;
	void *mem = ring_alloc(64, &bytes);
	struct kvb_ring_shm *s = mem;

	(void) state;
	assert_int_equal(kvb_ring_init(NULL, 16), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, 0), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, 1), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, 3), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, 48), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, (1u << 30) + 1), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, 1u << 31), -EINVAL);
	assert_int_equal(kvb_ring_init(mem, UINT32_MAX), -EINVAL);

	assert_int_equal(kvb_ring_init(mem, 2), 0);
	assert_int_equal(s->entries, 2);
	assert_int_equal(kvb_ring_init(mem, 64), 0);
	assert_int_equal(s->magic, KVB_RING_MAGIC);
	assert_int_equal(s->entries, 64);
	assert_int_equal(s->mask, 63);
	assert_int_equal(s->slot_size, KVB_RING_SLOT);
	assert_int_equal(atomic_load(&s->prod), 0);
	assert_int_equal(atomic_load(&s->cons), 0);
	free(mem);
}

static void test_attach_errors(void **state)
{
	size_t bytes;
	void *mem = ring_alloc(64, &bytes);
	struct kvb_ring_shm *s = mem;
	struct kvb_ring r;

	(void) state;
	assert_int_equal(kvb_ring_init(mem, 64), 0);
	assert_int_equal(kvb_ring_attach(NULL, mem, bytes), -EINVAL);
	assert_int_equal(kvb_ring_attach(&r, NULL, bytes), -EINVAL);
	assert_int_equal(kvb_ring_attach(&r, mem, 0), -EINVAL);
	assert_int_equal(kvb_ring_attach(&r, mem, sizeof(*s) - 1), -EINVAL);
	/* the slots do not fit */
	assert_int_equal(kvb_ring_attach(&r, mem, bytes - 1), -EPROTO);
	assert_int_equal(kvb_ring_attach(&r, mem, sizeof(*s)), -EPROTO);

	assert_int_equal(kvb_ring_attach(&r, mem, bytes), 0);
	assert_ptr_equal(r.shm, mem);
	assert_ptr_equal(r.slots, s->slots);
	assert_int_equal(r.entries, 64);
	assert_int_equal(r.mask, 63);
	/* a bigger mapping is fine */
	assert_int_equal(kvb_ring_attach(&r, mem, bytes + 4096), 0);

	/* corrupt headers, one field at a time */
	s->magic ^= 1;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->magic ^= 1;
	s->slot_size = 128;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->slot_size = KVB_RING_SLOT;
	s->entries = 48;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->entries = 1;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->entries = 0;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->entries = 128; /* claims more slots than the mapping holds */
	s->mask = 127;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->entries = 1u << 31;
	s->mask = (1u << 31) - 1;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->entries = 64;
	s->mask = 31; /* mask disagrees with entries */
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	s->mask = 63;
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), 0);

	/* never initialised (poisoned) memory */
	memset(mem, 0xa5, bytes);
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	memset(mem, 0, bytes);
	assert_int_equal(kvb_ring_attach(&r, mem, bytes), -EPROTO);
	free(mem);
}

static void test_empty(void **state)
{
	struct fixture *f = *state;
	struct entry e[4];

	assert_int_equal(kvb_ring_count(&f->cons), 0);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, e, 4), 0);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, e, 1), 0);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, e, 0), 0);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, e, 0), 0);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, e, 0), 0);
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, e, 0), 0);
	assert_int_equal(kvb_ring_count(&f->prod), 0);
}

static void test_single(void **state)
{
	struct fixture *f = *state;
	struct entry in, out;

	entry_make(&in, 42);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, &in, 1), 1);
	assert_int_equal(kvb_ring_count(&f->prod), 1);
	assert_int_equal(kvb_ring_count(&f->cons), 1);
	memset(&out, 0, sizeof(out));
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, &out, 1), 1);
	entry_check(&out, 42);
	assert_int_equal(kvb_ring_count(&f->cons), 0);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, &out, 1), 0);
}

static void test_full(void **state)
{
	struct fixture *f = *state;
	struct entry in[ENTRIES + 4], out[ENTRIES + 4];

	fill_seq(in, ENTRIES + 4, 100);
	/* burst clamps at capacity */
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, ENTRIES + 4),
			 ENTRIES);
	assert_int_equal(kvb_ring_count(&f->prod), ENTRIES);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 1), 0);
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, in, 1), 0);

	/* one slot freed: exactly one fits */
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 1), 1);
	entry_check(&out[0], 100);
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, &in[ENTRIES], 2), 0);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, &in[ENTRIES], 2), 1);
	assert_int_equal(kvb_ring_count(&f->cons), ENTRIES);

	/* dequeue more than there is: burst gives what is there */
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, ENTRIES + 4),
			 ENTRIES);
	check_seq(out, ENTRIES, 101);
	assert_int_equal(kvb_ring_count(&f->cons), 0);
}

static void test_bulk_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	struct entry in[ENTRIES], out[ENTRIES];
	struct kvb_ring_shm *s = f->mem;

	fill_seq(in, ENTRIES, 1000);
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, in, 10), 10);
	/* 6 free: a bulk of 7 moves nothing, not even the prod index */
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, &in[10], 7), 0);
	assert_int_equal(atomic_load(&s->prod), 10);
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, &in[10], 6), 6);
	assert_int_equal(kvb_ring_count(&f->prod), ENTRIES);
	/* more than capacity can never succeed */
	assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, in, ENTRIES + 1), 0);

	/* dequeue bulk: 16 queued, ask 17 -> nothing, dst untouched */
	memset(out, 0x5a, sizeof(out));
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, ENTRIES + 1), 0);
	assert_int_equal(atomic_load(&s->cons), 0);
	assert_int_equal(out[0].v, 0x5a5a5a5a5a5a5a5aull);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, 5), 5);
	check_seq(out, 5, 1000);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, 12), 0);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, 11), 11);
	check_seq(out, 11, 1005);
	assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, 1), 0);
}

static void test_burst_partial(void **state)
{
	struct fixture *f = *state;
	struct entry in[ENTRIES], out[ENTRIES];

	fill_seq(in, ENTRIES, 7);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 12), 12);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, &in[12], 8), 4);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 3), 3);
	check_seq(out, 3, 7);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, ENTRIES), 13);
	check_seq(out, 13, 10);
}

/* Cycle many times through a small ring with odd-sized steps. */
static void run_cycles(struct fixture *f, uint32_t rounds)
{
	struct entry in[ENTRIES], out[ENTRIES];
	uint64_t wseq = 0, rseq = 0;
	uint32_t i, n, k;

	for (i = 0; i < rounds; i++) {
		n = 1 + (i * 7) % ENTRIES;
		fill_seq(in, n, wseq);
		k = kvb_ring_enqueue_burst(&f->prod, in, n);
		wseq += k;
		assert_true(wseq - rseq <= ENTRIES);
		assert_int_equal(kvb_ring_count(&f->cons), wseq - rseq);
		n = 1 + (i * 5) % ENTRIES;
		k = kvb_ring_dequeue_burst(&f->cons, out, n);
		check_seq(out, k, rseq);
		rseq += k;
	}
	k = kvb_ring_dequeue_burst(&f->cons, out, ENTRIES);
	check_seq(out, k, rseq);
	rseq += k;
	assert_int_equal(rseq, wseq);
	assert_true(wseq > rounds);
}

static void test_wraparound(void **state)
{
	struct fixture *f;
	struct kvb_ring_shm *s;
	struct entry in[ENTRIES], out[ENTRIES];
	uint32_t start;

	(void) state;
	/* indices straddle UINT32_MAX -> 0 in the middle of a burst */
	for (start = UINT32_MAX - ENTRIES; start != ENTRIES; start += 3) {
		f = fixture_new(ENTRIES, start);
		s = f->mem;
		fill_seq(in, ENTRIES, start);
		assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 5), 5);
		assert_int_equal(kvb_ring_count(&f->prod), 5);
		assert_int_equal(
			kvb_ring_enqueue_bulk(&f->prod, &in[5], ENTRIES - 5),
			ENTRIES - 5);
		assert_int_equal(kvb_ring_count(&f->cons), ENTRIES);
		assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 1), 0);
		assert_int_equal(atomic_load(&s->prod), start + ENTRIES);
		assert_int_equal(kvb_ring_dequeue_bulk(&f->cons, out, 9), 9);
		check_seq(out, 9, start);
		assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, ENTRIES),
				 ENTRIES - 9);
		check_seq(out, ENTRIES - 9, (uint64_t) start + 9);
		assert_int_equal(atomic_load(&s->cons), start + ENTRIES);
		assert_int_equal(kvb_ring_count(&f->cons), 0);
		fixture_free(f);
	}

	/* long run across the wrap point */
	f = fixture_new(ENTRIES, UINT32_MAX - 1000);
	run_cycles(f, 2000);
	assert_true(atomic_load(&((struct kvb_ring_shm *) f->mem)->prod) <
		    UINT32_MAX - 1000);
	fixture_free(f);
}

static void test_min_ring(void **state)
{
	struct fixture *f = fixture_new(2, UINT32_MAX);
	struct entry in[3], out[3];

	(void) state;
	fill_seq(in, 3, 1);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 3), 2);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 3), 2);
	check_seq(out, 2, 1);
	fixture_free(f);

	f = fixture_new(ENTRIES, 0);
	run_cycles(f, 500);
	fixture_free(f);
}

/* prod - cons > entries: the consumer must see nothing, every time. */
static void test_corrupt_prod(void **state)
{
	struct fixture *f = *state;
	struct kvb_ring_shm *s = f->mem;
	struct entry in[ENTRIES], out[ENTRIES];
	uint32_t bad[] = {ENTRIES + 1, ENTRIES + 100, 0x80000000u, UINT32_MAX};
	unsigned int i, j;

	fill_seq(in, ENTRIES, 0);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 4), 4);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 4), 4);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		atomic_store(&s->prod, 4 + bad[i]);
		/* twice: a corrupt value must not stick in the cache */
		for (j = 0; j < 3; j++) {
			assert_int_equal(
				kvb_ring_dequeue_burst(&f->cons, out, 1), 0);
			assert_int_equal(
				kvb_ring_dequeue_burst(&f->cons, out, ENTRIES),
				0);
			assert_int_equal(
				kvb_ring_dequeue_bulk(&f->cons, out, 1), 0);
			assert_int_equal(atomic_load(&s->cons), 4);
		}
		assert_int_equal(kvb_ring_count(&f->cons), ENTRIES);
	}
	/* repaired: works again */
	atomic_store(&s->prod, 4);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 1), 0);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 2), 2);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 4), 2);
	check_seq(out, 2, 0);
}

/* cons ahead of prod or too far behind: the producer sees no free slot. */
static void test_corrupt_cons(void **state)
{
	struct fixture *f = *state;
	struct kvb_ring_shm *s = f->mem;
	struct entry in[ENTRIES], out[ENTRIES];
	uint32_t bad[] = {1, 5, 0x80000000u, UINT32_MAX - ENTRIES};
	unsigned int i, j;

	fill_seq(in, ENTRIES, 0);
	/* fill, so the producer must look at cons for any free slot */
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, ENTRIES),
			 ENTRIES);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		/* cons = prod + bad: ahead of prod, or more than a lap behind
		 */
		atomic_store(&s->cons, ENTRIES + bad[i]);
		for (j = 0; j < 3; j++) {
			assert_int_equal(
				kvb_ring_enqueue_burst(&f->prod, in, 1), 0);
			assert_int_equal(kvb_ring_enqueue_bulk(&f->prod, in, 1),
					 0);
			assert_int_equal(atomic_load(&s->prod), ENTRIES);
		}
	}
	/* repaired */
	atomic_store(&s->cons, 0);
	assert_int_equal(kvb_ring_dequeue_burst(&f->cons, out, 3), 3);
	check_seq(out, 3, 0);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, ENTRIES), 3);
}

/* The slots hold exactly what was written, in the expected positions. */
static void test_slot_layout(void **state)
{
	struct fixture *f = *state;
	struct kvb_ring_shm *s = f->mem;
	struct entry in[3];
	struct entry *slot;

	fill_seq(in, 3, 77);
	assert_int_equal(kvb_ring_enqueue_burst(&f->prod, in, 3), 3);
	slot = (struct entry *) s->slots;
	check_seq(slot, 3, 77);
	assert_ptr_equal(kvb_ring_slot(&f->prod, 2), &slot[2]);
	assert_ptr_equal(kvb_ring_slot(&f->prod, ENTRIES + 2), &slot[2]);
	assert_ptr_equal(kvb_ring_slot(&f->prod, UINT32_MAX),
			 &slot[ENTRIES - 1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bytes),
		cmocka_unit_test(test_init_errors),
		cmocka_unit_test(test_attach_errors),
		cmocka_unit_test_setup_teardown(test_empty, setup, teardown),
		cmocka_unit_test_setup_teardown(test_single, setup, teardown),
		cmocka_unit_test_setup_teardown(test_full, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bulk_all_or_nothing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_burst_partial, setup,
						teardown),
		cmocka_unit_test(test_wraparound),
		cmocka_unit_test(test_min_ring),
		cmocka_unit_test_setup_teardown(test_corrupt_prod, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_cons, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_slot_layout, setup,
						teardown),
	};

	return cmocka_run_group_tests_name("shm_ring", tests, NULL, NULL);
}

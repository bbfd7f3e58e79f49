/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the broker's transfer table (broker/xfer.c): interning,
 * handles with generations, owner checks, the terminal LRU, a full table,
 * hash-bucket collisions and the completion rule; the slot table is
 * resident from the start (no page faults on the broker loop later).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "xfer.h"

#define W1 0x1001u
#define W2 0x1002u

static int setup(void **state)
{
	struct kvb_xfers *t = malloc(sizeof(*t));

	assert_non_null(t);
	assert_int_equal(kvb_xfers_init(t), 0);
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	struct kvb_xfers *t = *state;

	kvb_xfers_fini(t);
	free(t);
	return 0;
}

/* Every page of the slot table is in memory right after init (mincore):
 * a lazily zeroed table fails this. */
static void test_slots_resident(void **state)
{
	struct kvb_xfers *t = *state;
	size_t page = (size_t) sysconf(_SC_PAGESIZE);
	size_t len = (size_t) KVB_MAX_XFERS * sizeof(*t->v);
	size_t npages = (len + page - 1) / page, in = 0;
	unsigned char *vec = malloc(npages);

	assert_non_null(vec);
	assert_int_equal((uintptr_t) t->v % page, 0);
	assert_int_equal(mincore(t->v, len, vec), 0);
	for (size_t i = 0; i < npages; i++)
		in += vec[i] & 1;
	free(vec);
	assert_int_equal(in, npages);
}

static struct kvb_xfer *open_ok(struct kvb_xfers *t, uint32_t w, const char *id)
{
	int err = 0;
	struct kvb_xfer *x = kvb_xfer_open(t, w, id, strlen(id), 1000, &err);

	if (!x)
		fail_msg("open '%s' for %#x: %d", id, w, err);
	return x;
}

static int open_err(struct kvb_xfers *t, uint32_t w, const char *id, size_t len)
{
	int err = 0;
	struct kvb_xfer *x = kvb_xfer_open(t, w, id, len, 1000, &err);

	assert_null(x);
	return err;
}

/* Check the active list holds exactly the used slots. */
static void check_active(const struct kvb_xfers *t)
{
	uint32_t used = 0;

	for (uint32_t s = 1; s < KVB_MAX_XFERS; s++)
		used += t->v[s].used;
	assert_int_equal(used, t->nactive);
	for (uint32_t i = 0; i < t->nactive; i++) {
		uint32_t s = t->active[i];

		assert_true(s > 0 && s < KVB_MAX_XFERS);
		assert_true(t->v[s].used);
		assert_int_equal(t->v[s].active_pos, i);
	}
}

static void test_intern(void **state)
{
	struct kvb_xfers *t = *state;
	struct kvb_xfer *a, *b, *c, *d;
	uint32_t ha, hb;

	a = open_ok(t, W1, "tx-1");
	assert_string_equal(a->id, "tx-1");
	assert_int_equal(a->worker, W1);
	assert_int_equal(a->deadline_ns, 1000);
	assert_false(a->sealed);
	/* same id, same worker: same entry, same handle */
	b = open_ok(t, W1, "tx-1");
	assert_ptr_equal(a, b);
	assert_int_equal(t->nactive, 1);
	ha = kvb_xfer_handle(t, a);
	assert_int_not_equal(ha & 0xffffu, 0);
	assert_int_not_equal(ha >> 16, 0);
	/* a different id, and the same id for another worker, are new */
	c = open_ok(t, W1, "tx-2");
	d = open_ok(t, W2, "tx-1");
	assert_ptr_not_equal(c, a);
	assert_ptr_not_equal(d, a);
	assert_ptr_not_equal(d, c);
	hb = kvb_xfer_handle(t, d);
	assert_int_not_equal(ha, hb);
	assert_int_equal(t->nactive, 3);
	/* a prefix is not the id */
	assert_ptr_not_equal(open_ok(t, W1, "tx-"), a);
	assert_ptr_equal(kvb_xfer_find(t, W1, "tx-1", 4), a);
	assert_ptr_equal(kvb_xfer_find(t, W2, "tx-1", 4), d);
	assert_null(kvb_xfer_find(t, W1, "tx-3", 4));
	assert_null(kvb_xfer_find(t, W1, "tx-1x", 5));
	/* ids are bytes with an explicit length, not C strings */
	assert_ptr_equal(kvb_xfer_find(t, W1, "tx-1xyz", 4), a);
	check_active(t);
}

static void test_bad_ids(void **state)
{
	struct kvb_xfers *t = *state;
	char big[KVB_XFER_ID_MAX + 2];

	assert_int_equal(open_err(t, W1, "", 0), -EINVAL);
	assert_int_equal(open_err(t, W1, "a\0b", 3), -EINVAL);
	memset(big, 'x', sizeof(big));
	assert_int_equal(open_err(t, W1, big, KVB_XFER_ID_MAX + 1), -EINVAL);
	/* the longest id fits */
	big[KVB_XFER_ID_MAX] = '\0';
	assert_int_equal(strlen(open_ok(t, W1, big)->id), KVB_XFER_ID_MAX);
	assert_int_equal(t->nactive, 1);
}

static void test_handles(void **state)
{
	struct kvb_xfers *t = *state;
	struct kvb_xfer *x, *y;
	uint32_t h, h2, slot;

	x = open_ok(t, W1, "tx-h");
	h = kvb_xfer_handle(t, x);
	assert_ptr_equal(kvb_xfer_get(t, h, W1), x);
	/* owner check */
	assert_null(kvb_xfer_get(t, h, W2));
	assert_null(kvb_xfer_get(t, h, 0));
	/* wrong generation, slot 0, slot out of range */
	assert_null(kvb_xfer_get(t, h + 0x10000u, W1));
	assert_null(kvb_xfer_get(t, h & 0xffffu, W1));
	assert_null(kvb_xfer_get(t, 0, W1));
	assert_null(kvb_xfer_get(t, h & 0xffff0000u, W1));
	assert_null(kvb_xfer_get(t, (h & 0xffff0000u) | KVB_MAX_XFERS, W1));
	assert_null(kvb_xfer_get(t, 0xffffffffu, W1));

	/* after end the handle is stale, even once the slot is reused */
	slot = h & 0xffffu;
	kvb_xfer_end(t, x);
	assert_null(kvb_xfer_get(t, h, W1));
	assert_null(kvb_xfer_find(t, W1, "tx-h", 4));
	t->free_hint = slot;
	y = open_ok(t, W1, "tx-h2");
	h2 = kvb_xfer_handle(t, y);
	assert_int_equal(h2 & 0xffffu, slot);
	assert_int_not_equal(h2, h);
	assert_null(kvb_xfer_get(t, h, W1));
	assert_ptr_equal(kvb_xfer_get(t, h2, W1), y);

	/* the generation wraps to 1, never 0 */
	kvb_xfer_end(t, y);
	t->v[slot].gen = 0xffff;
	t->free_hint = slot;
	y = open_ok(t, W1, "tx-h3");
	assert_int_equal(kvb_xfer_handle(t, y), (1u << 16) | slot);
	check_active(t);
}

static void test_terminal_lru(void **state)
{
	struct kvb_xfers *t = *state;
	struct kvb_xfer *x;
	char id[32];

	x = open_ok(t, W1, "tx-done");
	kvb_xfer_end(t, x);
	assert_true(
		kvb_xfer_is_terminal(t, W1, kvb_xfer_hash(W1, "tx-done", 7)));
	assert_false(
		kvb_xfer_is_terminal(t, W2, kvb_xfer_hash(W2, "tx-done", 7)));
	/* re-open of an ended id is refused; another worker's is not */
	assert_int_equal(open_err(t, W1, "tx-done", 7), -ESTALE);
	assert_non_null(open_ok(t, W2, "tx-done"));

	/* 4095 more endings: still remembered */
	for (unsigned i = 0; i < KVB_TERMINAL_LRU - 1; i++) {
		snprintf(id, sizeof(id), "tx-fill-%u", i);
		kvb_xfer_end(t, open_ok(t, W1, id));
	}
	assert_int_equal(open_err(t, W1, "tx-done", 7), -ESTALE);
	/* one more pushes it out */
	kvb_xfer_end(t, open_ok(t, W1, "tx-last"));
	assert_false(
		kvb_xfer_is_terminal(t, W1, kvb_xfer_hash(W1, "tx-done", 7)));
	x = open_ok(t, W1, "tx-done");
	assert_false(x->sealed);
	assert_int_equal(x->completed, 0);
	/* the most recent ones are still terminal */
	assert_int_equal(open_err(t, W1, "tx-last", 7), -ESTALE);
	assert_int_equal(open_err(t, W1, "tx-fill-4094", 12), -ESTALE);
	assert_int_equal(t->nactive, 2);
	check_active(t);
}

/*
 * The terminal LRU against a model: 3 x KVB_TERMINAL_LRU + 123 transfers of
 * three workers end one after another; at every 97th ending, exactly the
 * last KVB_TERMINAL_LRU ids (each with its own worker) are terminal and
 * the 256 before them are not. With as many index buckets as entries,
 * chains form, and entries leave them from every position.
 */
static void test_terminal_lru_model(void **state)
{
	struct kvb_xfers *t = *state;
	const unsigned n = 3 * KVB_TERMINAL_LRU + 123;
	char id[32];

	for (unsigned k = 0; k < n; k++) {
		snprintf(id, sizeof(id), "m-%u", k);
		kvb_xfer_end(t, open_ok(t, W1 + k % 3, id));
		if (k % 97 && k != n - 1)
			continue;
		for (unsigned j = k + 1 > KVB_TERMINAL_LRU + 256
					  ? k + 1 - KVB_TERMINAL_LRU - 256
					  : 0;
		     j <= k; j++) {
			int len = snprintf(id, sizeof(id), "m-%u", j);
			uint32_t w = W1 + j % 3;
			int want = k - j < KVB_TERMINAL_LRU;

			if (kvb_xfer_is_terminal(
				    t, w, kvb_xfer_hash(w, id, (size_t) len)) !=
			    want)
				fail_msg("after %u endings: '%s' terminal %d, "
					 "want %d",
					 k + 1, id, !want, want);
			/* another worker's same id never is */
			assert_false(kvb_xfer_is_terminal(
				t, w + 3,
				kvb_xfer_hash(w + 3, id, (size_t) len)));
		}
	}
	assert_int_equal(t->nactive, 0);
}

static void test_full(void **state)
{
	struct kvb_xfers *t = *state;
	struct kvb_xfer *x;
	char id[32];
	uint32_t n;

	for (n = 0; n < KVB_MAX_XFERS - 1; n++) {
		snprintf(id, sizeof(id), "full-%u", n);
		open_ok(t, W1, id);
	}
	assert_int_equal(t->nactive, KVB_MAX_XFERS - 1);
	assert_int_equal(open_err(t, W1, "one-too-many", 12), -ENOSPC);
	assert_int_equal(open_err(t, W2, "one-too-many", 12), -ENOSPC);
	/* existing ids still open (find comes first) */
	x = open_ok(t, W1, "full-77");
	/* free one in the middle: room again */
	kvb_xfer_end(t, x);
	check_active(t);
	x = open_ok(t, W2, "one-too-many");
	assert_int_equal(t->nactive, KVB_MAX_XFERS - 1);
	assert_int_equal(open_err(t, W2, "two-too-many", 12), -ENOSPC);
	/* every entry still findable after the swap-removal */
	for (n = 0; n < KVB_MAX_XFERS - 1; n += 997) {
		snprintf(id, sizeof(id), "full-%u", n);
		if (n != 77)
			assert_non_null(kvb_xfer_find(t, W1, id, strlen(id)));
	}
	check_active(t);
}

/* Ids whose hashes fall in the same bucket stay distinct. */
static void test_bucket_collisions(void **state)
{
	struct kvb_xfers *t = *state;
	char ids[4][32];
	struct kvb_xfer *x[4];
	uint64_t b0 = kvb_xfer_hash(W1, "coll-0", 6) % t->nbuckets;
	unsigned n = 1;

	strcpy(ids[0], "coll-0");
	for (unsigned i = 1; n < 4 && i < 10000000; i++) {
		char id[32];

		snprintf(id, sizeof(id), "coll-%u", i);
		if (kvb_xfer_hash(W1, id, strlen(id)) % t->nbuckets == b0)
			strcpy(ids[n++], id);
	}
	assert_int_equal(n, 4);
	for (n = 0; n < 4; n++)
		x[n] = open_ok(t, W1, ids[n]);
	for (n = 0; n < 4; n++) {
		assert_string_equal(x[n]->id, ids[n]);
		for (unsigned k = 0; k < n; k++)
			assert_ptr_not_equal(x[n], x[k]);
		assert_ptr_equal(open_ok(t, W1, ids[n]), x[n]);
	}
	/* unlink from the middle, the head and the tail of the chain */
	kvb_xfer_end(t, x[1]);
	assert_null(kvb_xfer_find(t, W1, ids[1], strlen(ids[1])));
	assert_ptr_equal(kvb_xfer_find(t, W1, ids[0], strlen(ids[0])), x[0]);
	assert_ptr_equal(kvb_xfer_find(t, W1, ids[2], strlen(ids[2])), x[2]);
	assert_ptr_equal(kvb_xfer_find(t, W1, ids[3], strlen(ids[3])), x[3]);
	kvb_xfer_end(t, x[3]);
	kvb_xfer_end(t, x[0]);
	assert_ptr_equal(kvb_xfer_find(t, W1, ids[2], strlen(ids[2])), x[2]);
	assert_int_equal(t->nactive, 1);
	/* ended ones are terminal, the live one is not */
	assert_int_equal(open_err(t, W1, ids[1], strlen(ids[1])), -ESTALE);
	assert_int_equal(open_err(t, W1, ids[3], strlen(ids[3])), -ESTALE);
	assert_ptr_equal(open_ok(t, W1, ids[2]), x[2]);
	check_active(t);

	/* the worker is part of the hash: same id, other worker differs */
	assert_true(kvb_xfer_hash(W1, "tx", 2) != kvb_xfer_hash(W2, "tx", 2));
	assert_true(kvb_xfer_hash(W1, "ab", 2) != kvb_xfer_hash(W1, "ba", 2));
}

static void test_complete_rule(void **state)
{
	struct kvb_xfer x;

	(void) state;
	memset(&x, 0, sizeof(x));
	/* never complete unsealed, whatever the counters say */
	x.submitted = x.completed = 5;
	assert_false(kvb_xfer_complete(&x));
	/* sealed with 0 expected and nothing submitted: complete */
	memset(&x, 0, sizeof(x));
	x.sealed = 1;
	assert_true(kvb_xfer_complete(&x));
	/* expected 3: 2 done is not enough; 2 done + 1 failed is */
	x.expected = 3;
	x.submitted = 3;
	x.completed = 2;
	assert_false(kvb_xfer_complete(&x));
	x.failed = 1;
	assert_true(kvb_xfer_complete(&x));
	/* more submitted than expected: wait for all of them */
	x.submitted = 5;
	assert_false(kvb_xfer_complete(&x));
	x.completed = 4;
	assert_true(kvb_xfer_complete(&x));
	/* fewer submitted than expected: wait for the expected count */
	memset(&x, 0, sizeof(x));
	x.sealed = 1;
	x.expected = 10;
	x.submitted = 4;
	x.completed = 4;
	assert_false(kvb_xfer_complete(&x));
	/* D side: expected = writers, counted as completed notifications */
	memset(&x, 0, sizeof(x));
	x.sealed = 1;
	x.expected = 2;
	x.completed = 1;
	assert_false(kvb_xfer_complete(&x));
	x.completed = 2;
	assert_true(kvb_xfer_complete(&x));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_slots_resident),
		T(test_intern),
		T(test_bad_ids),
		T(test_handles),
		T(test_terminal_lru),
		T(test_terminal_lru_model),
		T(test_full),
		T(test_bucket_collisions),
		cmocka_unit_test(test_complete_rule),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}

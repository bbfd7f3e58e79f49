/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the per-worker segment (shm/segment.h): sizing, format and
 * attach round trip, refusal of corrupt headers, and static layout facts.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shm/segment.h"

#define SQ_N 64u
#define CQ_N 128u

struct fixture {
	void *mem;
	size_t size;
	struct kvb_seg seg;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->size = kvb_seg_bytes(SQ_N, CQ_N);
	f->mem = aligned_alloc(4096, f->size);
	assert_non_null(f->mem);
	memset(f->mem, 0xa5, f->size);
	assert_int_equal(
		kvb_seg_format(&f->seg, f->mem, f->size, SQ_N, CQ_N, 7), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	free(f->mem);
	free(f);
	return 0;
}

static void test_layout(void **state)
{
	(void) state;
	assert_int_equal(sizeof(struct kvb_seg_hdr), 256);
	assert_int_equal(offsetof(struct kvb_seg_hdr, magic), 0);
	assert_int_equal(offsetof(struct kvb_seg_hdr, version), 4);
	assert_int_equal(offsetof(struct kvb_seg_hdr, seg_size), 8);
	assert_int_equal(offsetof(struct kvb_seg_hdr, broker_sleeping), 64);
	assert_int_equal(offsetof(struct kvb_seg_hdr, broker_state), 68);
	assert_int_equal(offsetof(struct kvb_seg_hdr, worker_waiting), 128);
	assert_int_equal(sizeof(struct kvb_sqe), 64);
	assert_int_equal(sizeof(struct kvb_cqe), 64);
	assert_int_equal(sizeof(struct kvb_sqe), KVB_RING_SLOT);
	assert_int_equal(sizeof(struct kvb_cqe), KVB_RING_SLOT);
	assert_int_equal(offsetof(struct kvb_sqe, tag), 40);
	assert_int_equal(offsetof(struct kvb_cqe, status), 16);
	assert_int_equal(offsetof(struct kvb_cqe, opcode), 24);
}

static void test_bytes(void **state)
{
	size_t b;

	(void) state;
	b = kvb_seg_bytes(SQ_N, CQ_N);
	assert_int_equal(b % 4096, 0);
	assert_true(b >= 256 + kvb_ring_bytes(SQ_N) + kvb_ring_bytes(CQ_N));
	assert_true(b <
		    256 + kvb_ring_bytes(SQ_N) + kvb_ring_bytes(CQ_N) + 4096);
	/* smallest rings still fit one page */
	assert_int_equal(kvb_seg_bytes(2, 2), 4096);
	/* exact: 256 + (192 + 4096 * 64) * 2 rounds to 528 KiB */
	assert_int_equal(kvb_seg_bytes(4096, 4096),
			 (256 + 2 * (192 + 4096 * 64) + 4095) / 4096 * 4096);
	assert_true(kvb_seg_bytes(1024, 4096) > kvb_seg_bytes(1024, 1024));
}

static void test_format(void **state)
{
	struct fixture *f = *state;
	struct kvb_seg_hdr *h = f->mem;
	unsigned char *base = f->mem;

	assert_ptr_equal(f->seg.hdr, h);
	assert_int_equal(f->seg.size, f->size);
	assert_int_equal(h->magic, KVB_SEG_MAGIC);
	assert_int_equal(h->version, KVB_SEG_VERSION);
	assert_int_equal(h->seg_size, f->size);
	assert_int_equal(h->sq_entries, SQ_N);
	assert_int_equal(h->cq_entries, CQ_N);
	assert_int_equal(h->worker_id, 7);
	assert_int_equal(h->sq_off % KVB_CACHELINE, 0);
	assert_int_equal(h->cq_off % KVB_CACHELINE, 0);
	assert_true(h->sq_off >= sizeof(*h));
	assert_true(h->cq_off >= h->sq_off + kvb_ring_bytes(SQ_N));
	assert_true(h->cq_off + kvb_ring_bytes(CQ_N) <= f->size);
	assert_int_equal(atomic_load(&h->broker_sleeping), 0);
	assert_int_equal(atomic_load(&h->broker_state), KVB_BROKER_RUNNING);
	assert_int_equal(atomic_load(&h->worker_waiting), 0);
	assert_ptr_equal(f->seg.sq.shm, base + h->sq_off);
	assert_ptr_equal(f->seg.cq.shm, base + h->cq_off);
	assert_int_equal(f->seg.sq.entries, SQ_N);
	assert_int_equal(f->seg.cq.entries, CQ_N);
	assert_int_equal(kvb_ring_count(&f->seg.sq), 0);
	assert_int_equal(kvb_ring_count(&f->seg.cq), 0);
}

static void test_format_errors(void **state)
{
	struct fixture *f = *state;
	struct kvb_seg seg;

	assert_int_equal(kvb_seg_format(NULL, f->mem, f->size, SQ_N, CQ_N, 0),
			 -EINVAL);
	assert_int_equal(kvb_seg_format(&seg, NULL, f->size, SQ_N, CQ_N, 0),
			 -EINVAL);
	assert_int_equal(
		kvb_seg_format(&seg, f->mem, f->size - 1, SQ_N, CQ_N, 0),
		-EINVAL);
	assert_int_equal(kvb_seg_format(&seg, f->mem, f->size, 48, CQ_N, 0),
			 -EINVAL);
	assert_int_equal(kvb_seg_format(&seg, f->mem, f->size, SQ_N, 1, 0),
			 -EINVAL);
}

/* The worker's view, built from the same memory, talks to the broker's. */
static void test_round_trip(void **state)
{
	struct fixture *f = *state;
	struct kvb_seg w;
	struct kvb_sqe sqe, got;
	struct kvb_cqe cqe, cgot;

	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), 0);
	assert_ptr_equal(w.hdr, f->mem);
	assert_int_equal(w.size, f->size);
	assert_int_equal(w.sq.entries, SQ_N);
	assert_int_equal(w.cq.entries, CQ_N);
	assert_ptr_equal(w.sq.shm, f->seg.sq.shm);
	assert_ptr_equal(w.cq.shm, f->seg.cq.shm);

	memset(&sqe, 0, sizeof(sqe));
	sqe.opcode = KVB_OP_WRITE;
	sqe.transfer = 3;
	sqe.len = 4096;
	sqe.tag = 0x1234567890abcdefull;
	assert_int_equal(kvb_ring_enqueue_burst(&w.sq, &sqe, 1), 1);
	assert_int_equal(kvb_ring_dequeue_burst(&f->seg.sq, &got, 1), 1);
	assert_memory_equal(&sqe, &got, sizeof(sqe));

	memset(&cqe, 0, sizeof(cqe));
	cqe.opcode = KVB_CQ_DESC;
	cqe.tag = sqe.tag;
	cqe.status = -EIO;
	assert_int_equal(kvb_ring_enqueue_burst(&f->seg.cq, &cqe, 1), 1);
	assert_int_equal(kvb_ring_dequeue_burst(&w.cq, &cgot, 1), 1);
	assert_memory_equal(&cqe, &cgot, sizeof(cqe));

	/* the rings do not overlap: filling SQ leaves CQ empty and intact */
	while (kvb_ring_enqueue_burst(&w.sq, &sqe, 1))
		;
	assert_int_equal(kvb_ring_count(&w.sq), SQ_N);
	assert_int_equal(kvb_ring_count(&w.cq), 0);
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), 0);
}

static void test_attach_refuses(void **state)
{
	struct fixture *f = *state;
	struct kvb_seg_hdr *h = f->mem;
	struct kvb_seg_hdr saved = *h;
	struct kvb_seg w;
	unsigned char *base = f->mem;
	struct kvb_ring_shm *sq = (void *) (base + h->sq_off);

	assert_int_equal(kvb_seg_attach(NULL, f->mem, f->size), -EINVAL);
	assert_int_equal(kvb_seg_attach(&w, NULL, f->size), -EINVAL);
	assert_int_equal(kvb_seg_attach(&w, f->mem, 0), -EINVAL);
	assert_int_equal(kvb_seg_attach(&w, f->mem, sizeof(*h) - 1), -EINVAL);
	/* mapping size must match the recorded size */
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size - 4096), -EINVAL);
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size + 4096), -EINVAL);

#define EXPECT_REFUSED(field, value, err)                                     \
	do {                                                                  \
		h->field = (value);                                           \
		assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), (err)); \
		memcpy(h, &saved,                                             \
		       offsetof(struct kvb_seg_hdr, broker_sleeping));        \
	} while (0)

	EXPECT_REFUSED(magic, KVB_SEG_MAGIC ^ 0x100, -EPROTO);
	EXPECT_REFUSED(magic, 0, -EPROTO);
	EXPECT_REFUSED(version, KVB_SEG_VERSION + 1, -EPROTO);
	EXPECT_REFUSED(version, 0, -EPROTO);
	EXPECT_REFUSED(seg_size, f->size * 2, -EINVAL);
	EXPECT_REFUSED(seg_size, 0, -EINVAL);
	/* offsets: inside the header, misaligned, overlapping, past the end */
	EXPECT_REFUSED(sq_off, 0, -EINVAL);
	EXPECT_REFUSED(sq_off, 128, -EINVAL);
	EXPECT_REFUSED(sq_off, saved.sq_off + 8, -EINVAL);
	EXPECT_REFUSED(cq_off, saved.cq_off + 8, -EINVAL);
	EXPECT_REFUSED(cq_off, saved.sq_off, -EINVAL);
	EXPECT_REFUSED(cq_off, saved.cq_off - 64, -EINVAL);
	EXPECT_REFUSED(cq_off, (uint32_t) f->size, -EINVAL);
	EXPECT_REFUSED(cq_off, UINT32_MAX - 63, -EINVAL);
	EXPECT_REFUSED(sq_off, UINT32_MAX - 63, -EINVAL);
	/* sizes: too big to fit, or disagreeing with the ring headers */
	EXPECT_REFUSED(sq_entries, SQ_N * 2, -EINVAL);
	EXPECT_REFUSED(cq_entries, CQ_N * 1024, -EINVAL);
	EXPECT_REFUSED(cq_entries, UINT32_MAX, -EINVAL);
	EXPECT_REFUSED(sq_entries, SQ_N / 2, -EINVAL);
	EXPECT_REFUSED(cq_entries, CQ_N / 2, -EINVAL);
#undef EXPECT_REFUSED
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), 0);

	/* a corrupt ring header inside an intact segment header */
	sq->magic ^= 1;
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), -EPROTO);
	sq->magic ^= 1;
	sq->entries = SQ_N * 2;
	sq->mask = SQ_N * 2 - 1;
	assert_true(kvb_seg_attach(&w, f->mem, f->size) < 0);
	sq->entries = SQ_N;
	sq->mask = SQ_N - 1;
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), 0);

	/* a segment that was never formatted */
	memset(f->mem, 0, f->size);
	assert_int_equal(kvb_seg_attach(&w, f->mem, f->size), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_bytes),
		cmocka_unit_test_setup_teardown(test_format, setup, teardown),
		cmocka_unit_test_setup_teardown(test_format_errors, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_round_trip, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_attach_refuses, setup,
						teardown),
	};

	return cmocka_run_group_tests_name("shm_segment", tests, NULL, NULL);
}

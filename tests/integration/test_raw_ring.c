/* SPDX-License-Identifier: MIT */
/*
 * A worker that writes its submission ring itself, past the library's
 * checks (as a buggy or hostile one could): a SEAL whose count does not
 * fit 32 bits fails its transfer with -EINVAL (one transfer completion,
 * the seal's tag; counted as a rejected message, not as a refused
 * descriptor); an unknown opcode and undefined flag bits are refused as a
 * descriptor; and the broker keeps serving the next seal.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"
#include "raw_worker.h"
#include "segment.h"

static struct raw_worker rw = {.sock = -1, .efd_broker = -1, .efd_worker = -1};

/* HELLO by hand: the segment, mapped and attached, and its eventfds */
static void raw_attach(void)
{
	assert_int_equal(raw_worker_attach(&rw, fx.br.sock), 0);
}

static uint32_t raw_open(const char *id)
{
	uint32_t h = 0;

	assert_int_equal(raw_worker_open(&rw, id, &h), 0);
	return h;
}

/* Put one entry in the ring and wake the broker (it may be asleep). */
static void submit(const struct kvb_sqe *e)
{
	uint64_t one = 1;

	assert_int_equal(kvb_ring_enqueue_burst(&rw.seg.sq, e, 1), 1);
	assert_int_equal(write(rw.efd_broker, &one, sizeof(one)), sizeof(one));
}

/* The next completion, within 5 s. */
static struct kvb_cqe next_cqe(void)
{
	struct kvb_cqe c;
	int64_t t0 = now_ns();

	while (kvb_ring_dequeue_burst(&rw.seg.cq, &c, 1) != 1) {
		if (ms_since(t0) > 5000 + SLACK)
			fail_msg("no completion from the broker");
		usleep(1000);
	}
	return c;
}

static void test_seal_count_too_large(void **state)
{
	int64_t rej = broker_stat(&fx.br, "messages_rejected");
	int64_t refused = broker_stat(&fx.br, "descriptors_refused");
	uint32_t h = raw_open("raw-seal");
	struct kvb_sqe e = {.opcode = KVB_OP_SEAL,
			    .transfer = h,
			    .len = 1ull << 33,
			    .tag = 77};
	struct kvb_cqe c;

	(void) state;
	submit(&e);
	c = next_cqe();
	assert_int_equal(c.opcode, KVB_CQ_TRANSFER);
	assert_int_equal(c.tag, 77);
	assert_int_equal(c.status, -EINVAL);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rej + 1);
	assert_int_equal(broker_stat(&fx.br, "descriptors_refused"), refused);
	assert_true(broker_log_has(&fx.br, "too large"));
	/* that transfer ended: sealing it again finds nothing */
	e.len = 0;
	e.tag = 78;
	submit(&e);
	c = next_cqe();
	assert_int_equal(c.opcode, KVB_CQ_TRANSFER);
	assert_int_equal(c.tag, 78);
	assert_int_equal(c.status, -ESTALE);
}

static void test_unknown_opcode(void **state)
{
	int64_t refused = broker_stat(&fx.br, "descriptors_refused");
	struct kvb_sqe e = {.opcode = 99, .len = 4096, .tag = 79};
	struct kvb_cqe c;

	(void) state;
	submit(&e);
	c = next_cqe();
	assert_int_equal(c.opcode, KVB_CQ_DESC);
	assert_int_equal(c.tag, 79);
	assert_int_equal(c.status, -EINVAL);
	assert_int_equal(broker_stat(&fx.br, "descriptors_refused"),
			 refused + 1);
}

/* Flag bits the protocol does not define are refused (-EINVAL, counted,
 * logged), on a write and on a layer op alike, never completed with
 * success: a later flag may mean something. */
static void test_undefined_flags(void **state)
{
	static const uint8_t bad[] = {0x80, 0xfe, 0x02, 0xff};
	int64_t refused = broker_stat(&fx.br, "descriptors_refused");
	uint32_t h = raw_open("raw-flags");

	(void) state;
	for (unsigned i = 0; i < sizeof(bad); i++) {
		struct kvb_sqe e = {.opcode =
					    i % 2 ? KVB_OP_LAYER : KVB_OP_WRITE,
				    .flags = bad[i],
				    .transfer = i % 2 ? h : 0,
				    .len = 4096,
				    .tag = 90 + i};
		struct kvb_cqe c;

		submit(&e);
		c = next_cqe();
		assert_int_equal(c.opcode, KVB_CQ_DESC);
		assert_int_equal(c.tag, 90 + i);
		assert_int_equal(c.status, -EINVAL);
	}
	assert_int_equal(broker_stat(&fx.br, "descriptors_refused"),
			 refused + (int64_t) sizeof(bad));
	assert_true(broker_log_has(&fx.br, "undefined flag bits"));
}

/* still serving: a good transfer of no writes ends at once with 0 */
static void test_still_serving(void **state)
{
	struct kvb_sqe e = {.opcode = KVB_OP_SEAL,
			    .transfer = raw_open("raw-good"),
			    .len = 0,
			    .tag = 80};
	struct kvb_cqe c;

	(void) state;
	submit(&e);
	c = next_cqe();
	assert_int_equal(c.opcode, KVB_CQ_TRANSFER);
	assert_int_equal(c.tag, 80);
	assert_int_equal(c.status, 0);
}

static int setup(void **state)
{
	int rc = fixture_setup(state);

	if (!rc)
		raw_attach();
	return rc;
}

static int teardown(void **state)
{
	raw_worker_close(&rw);
	return fixture_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_seal_count_too_large),
		cmocka_unit_test(test_unknown_opcode),
		cmocka_unit_test(test_undefined_flags),
		cmocka_unit_test(test_still_serving),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * kvb_submit_layers: n layer ops in one call. Bad arguments are refused in
 * the library; each op reaches the broker and completes with its own tag
 * (here on same-node transfers, where a layer op is refused with -EINVAL:
 * what is checked is that every op arrived, in order, with its tag); a
 * full ring takes a prefix (a burst) and then -EAGAIN; a dead broker gives
 * -EPIPE. kvb_transfer_seal_many: the same for seals.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define N 100

static struct kvb_ctx *attach(struct broker *b, uint32_t sq)
{
	struct kvb_attach_opts o = {.socket_path = b->sock,
				    .role = KVB_ROLE_P,
				    .tp_size = 1,
				    .sq_entries = sq,
				    .cq_entries = 256,
				    .timeout_ms = 10000};
	struct kvb_ctx *ctx = NULL;

	assert_int_equal(kvb_attach(&o, &ctx), 0);
	return ctx;
}

/* reap exactly n DESC completions: tags must come as tag0, tag0+1, ... */
static void reap_in_order(struct kvb_ctx *ctx, unsigned n, uint64_t tag0)
{
	struct kvb_completion c[64];
	unsigned got = 0;

	while (got < n) {
		int k = kvb_wait(ctx, c, 64, 5000);

		assert_true(k > 0);
		for (int i = 0; i < k; i++, got++) {
			assert_int_equal(c[i].kind, KVB_COMP_DESC);
			assert_int_equal(c[i].tag, tag0 + got);
			assert_int_equal(c[i].status, -EINVAL);
		}
	}
	assert_int_equal(kvb_poll(ctx, c, 64), 0);
}

static void test_args_and_order(void **state)
{
	struct broker b;
	struct kvb_ctx *ctx;
	uint32_t h[N];
	uint64_t tags[N];
	char id[32];

	(void) state;
	assert_int_equal(broker_start(&b, NULL), 0);
	ctx = attach(&b, 0);
	for (unsigned i = 0; i < N; i++) {
		snprintf(id, sizeof(id), "tx-%u", i);
		assert_int_equal(kvb_transfer_open(ctx, id, &h[i]), 0);
		tags[i] = 1000 + i;
	}
	assert_int_equal(kvb_submit_layers(NULL, h, tags, 1, 0, 0), -EINVAL);
	assert_int_equal(kvb_submit_layers(ctx, NULL, tags, 1, 0, 0), -EINVAL);
	assert_int_equal(kvb_submit_layers(ctx, h, NULL, 1, 0, 0), -EINVAL);
	assert_int_equal(kvb_submit_layers(ctx, h, tags, 1, 0, 0x80), -EINVAL);
	assert_int_equal(kvb_submit_layers(ctx, NULL, NULL, 0, 0, 0), 0);
	/* more than one chunk of the library's (64): all in, in order */
	assert_int_equal(kvb_submit_layers(ctx, h, tags, N, 3, 0), N);
	reap_in_order(ctx, N, 1000);
	assert_true(broker_log_has(&b, "layer op for an unknown or local"));
	kvb_detach(ctx);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

static void test_ring_full_then_dead(void **state)
{
	struct broker b;
	struct kvb_ctx *ctx;
	uint32_t h[N];
	uint64_t tags[N];
	int n, total = 0;

	(void) state;
	assert_int_equal(broker_start(&b, NULL), 0);
	ctx = attach(&b, 16);
	assert_int_equal(kvb_transfer_open(ctx, "tx-full", &h[0]), 0);
	for (unsigned i = 0; i < N; i++) {
		h[i] = h[0];
		tags[i] = 5000 + i;
	}
	/* stop the broker draining: the 16-slot ring takes a prefix */
	assert_int_equal(kill(b.pid, SIGSTOP), 0);
	n = kvb_submit_layers(ctx, h, tags, N, 0, 0);
	assert_true(n > 0 && n <= 16);
	total = n;
	while ((n = kvb_submit_layers(ctx, h + total, tags + total, N - total,
				      0, 0)) > 0)
		total += n;
	assert_int_equal(n, -EAGAIN);
	assert_int_equal(kill(b.pid, SIGCONT), 0);
	reap_in_order(ctx, (unsigned) total, 5000);
	/* the broker goes: -EPIPE, at once or once the ring is full */
	broker_kill(&b);
	for (int i = 0; i < 64 && n != -EPIPE; i++)
		n = kvb_submit_layers(ctx, h, tags, N, 0, 0);
	assert_int_equal(n, -EPIPE);
	kvb_detach(ctx);
	broker_cleanup(&b);
}

/* kvb_transfer_seal_many: refused arguments; N seals in one call (more
 * than a library chunk), each transfer's completion with its tag; a full
 * ring takes a prefix, then -EAGAIN. */
static void test_seal_many(void **state)
{
	struct broker b;
	struct kvb_ctx *ctx;
	uint32_t h[N], ex[N];
	uint64_t tags[N];
	unsigned seen[N] = {0}, got = 0;
	char id[32];
	int n, total;

	(void) state;
	assert_int_equal(broker_start(&b, NULL), 0);
	ctx = attach(&b, 16);
	for (unsigned i = 0; i < N; i++) {
		snprintf(id, sizeof(id), "tx-s%u", i);
		assert_int_equal(kvb_transfer_open(ctx, id, &h[i]), 0);
		tags[i] = 7000 + i;
		ex[i] = 0;
	}
	assert_int_equal(kvb_transfer_seal_many(NULL, h, ex, tags, 1), -EINVAL);
	assert_int_equal(kvb_transfer_seal_many(ctx, NULL, ex, tags, 1),
			 -EINVAL);
	assert_int_equal(kvb_transfer_seal_many(ctx, h, NULL, tags, 1),
			 -EINVAL);
	assert_int_equal(kvb_transfer_seal_many(ctx, h, ex, NULL, 1), -EINVAL);
	assert_int_equal(kvb_transfer_seal_many(ctx, NULL, NULL, NULL, 0), 0);
	/* the broker stopped: the 16-slot ring takes a prefix, then EAGAIN */
	assert_int_equal(kill(b.pid, SIGSTOP), 0);
	n = kvb_transfer_seal_many(ctx, h, ex, tags, N);
	assert_true(n > 0 && n <= 16);
	assert_int_equal(kvb_transfer_seal_many(ctx, h + n, ex + n, tags + n,
						N - (unsigned) n),
			 -EAGAIN);
	assert_int_equal(kill(b.pid, SIGCONT), 0);
	total = n;
	while (got < N) {
		struct kvb_completion c[64];
		int k;

		if (total < N) {
			n = kvb_transfer_seal_many(ctx, h + total, ex + total,
						   tags + total,
						   N - (unsigned) total);
			assert_true(n > 0 || n == -EAGAIN);
			if (n > 0)
				total += n;
		}
		k = kvb_wait(ctx, c, 64, 5000);
		assert_true(k > 0);
		for (int i = 0; i < k; i++) {
			assert_int_equal(c[i].kind, KVB_COMP_TRANSFER);
			assert_int_equal(c[i].status, 0);
			assert_true(c[i].tag >= 7000 && c[i].tag < 7000 + N);
			assert_int_equal(seen[c[i].tag - 7000]++, 0);
			got++;
		}
	}
	kvb_detach(ctx);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_args_and_order),
		cmocka_unit_test(test_ring_full_then_dead),
		cmocka_unit_test(test_seal_many),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

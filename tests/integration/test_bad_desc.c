/* SPDX-License-Identifier: MIT */
/*
 * Bad descriptors against a real broker: each completes with the right
 * -errno, is counted in descriptors_refused and logged with its reason,
 * while another worker's concurrent transfers into the same D worker
 * complete with every byte verified.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define MiB	    (1ull << 20)
#define KiB	    (1ull << 10)
#define DST_SIZE    (16 * MiB)
#define GOOD_ROUNDS 8
#define GOOD_DESCS  256
#define GOOD_LEN    (4 * KiB)
#define GOOD_AREA   ((uint64_t) GOOD_ROUNDS * GOOD_DESCS * GOOD_LEN) /* 8 MiB */
#define P1_AREA	    (12 * MiB) /* where the bad worker's good writes land */
#define SRC_SIZE    (64 * KiB)
#define KEY_DST	    1
#define KEY_PRIV    2

/*
 * The concurrent good worker (P rank 1): GOOD_ROUNDS transfers of
 * GOOD_DESCS signaled writes into D's region, each checked.
 * Exit 0 when all is well.
 */
static int good_worker(int go_fd)
{
	struct kvb_completion c[GOOD_DESCS + 1];
	struct kvb_remote_region dst;
	struct kvb_desc d[GOOD_DESCS];
	struct kvb_region src;
	struct kvb_ctx *ctx;
	char byte, id[32];
	int n;

	ctx = w_attach(&fx.br, KVB_ROLE_P, 1, 2, 0);
	if (!ctx)
		return 10;
	if (kvb_mem_alloc(ctx, GOOD_AREA, 0, 0, &src))
		return 11;
	pattern_fill(src.addr, GOOD_AREA, 2, 0);
	if (read(go_fd, &byte, 1) != 1)
		return 12;
	if (kvb_mem_lookup(ctx, KVB_ROLE_D, 0, 0, KEY_DST, &dst) ||
	    dst.size != DST_SIZE)
		return 13;
	for (unsigned r = 0; r < GOOD_ROUNDS; r++) {
		uint32_t h;
		unsigned sent = 0;

		snprintf(id, sizeof(id), "good-tx-%u", r);
		if (kvb_transfer_open(ctx, id, &h))
			return 14;
		for (unsigned i = 0; i < GOOD_DESCS; i++) {
			uint64_t off =
				((uint64_t) r * GOOD_DESCS + i) * GOOD_LEN;

			d[i] = (struct kvb_desc){.transfer = h,
						 .region = src.id,
						 .peer_region = dst.id,
						 .offset = off,
						 .peer_offset = off,
						 .len = GOOD_LEN,
						 .tag = 1000 + i};
		}
		while (sent < GOOD_DESCS) {
			int k = kvb_submit_write(ctx, d + sent,
						 GOOD_DESCS - sent);

			if (k == -EAGAIN)
				continue;
			if (k < 0)
				return 15;
			sent += (unsigned) k;
		}
		while (kvb_transfer_seal(ctx, h, GOOD_DESCS, 77 + r) == -EAGAIN)
			;
		n = w_collect(ctx, c, GOOD_DESCS + 1, 20000);
		if (n != GOOD_DESCS + 1)
			return 16;
		for (int i = 0; i < n; i++) {
			if (c[i].status)
				return 17;
			if (c[i].kind == KVB_COMP_DESC &&
			    c[i].bytes != GOOD_LEN)
				return 18;
		}
		if (w_find(c, n, KVB_COMP_TRANSFER, 77 + r) < 0)
			return 19;
	}
	kvb_mem_free(ctx, &src);
	kvb_detach(ctx);
	return 0;
}

static void test_bad_descriptors(void **state)
{
	struct kvb_region dst, priv, src;
	struct kvb_ctx *dctx, *pctx;
	struct kvb_completion c[64];
	uint32_t dh[GOOD_ROUNDS], h;
	int go[2], status, n, i;
	int64_t refused0;
	char id[32];
	pid_t child;

	(void) state;
	assert_int_equal(pipe(go), 0);
	/* fork before attaching: the child must not inherit our contexts */
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		close(go[1]);
		_exit(good_worker(go[0]));
	}
	close(go[0]);

	dctx = w_attach(&fx.br, KVB_ROLE_D, 0, 1, 0);
	pctx = w_attach(&fx.br, KVB_ROLE_P, 0, 2, 0);
	assert_non_null(dctx);
	assert_non_null(pctx);
	assert_int_equal(kvb_mem_alloc(dctx, DST_SIZE, KVB_MEM_REMOTE_WRITE,
				       KEY_DST, &dst),
			 0);
	assert_int_equal(kvb_mem_alloc(dctx, SRC_SIZE, 0, KEY_PRIV, &priv), 0);
	assert_int_equal(kvb_mem_alloc(pctx, SRC_SIZE, 0, 0, &src), 0);
	pattern_fill(src.addr, SRC_SIZE, 1, 0);
	/* D waits for one writer's write_done per good transfer */
	for (i = 0; i < GOOD_ROUNDS; i++) {
		snprintf(id, sizeof(id), "good-tx-%d", i);
		assert_int_equal(kvb_transfer_open(dctx, id, &dh[i]), 0);
		assert_int_equal(kvb_transfer_seal(dctx, dh[i], 1, 500 + i), 0);
	}
	refused0 = broker_stat(&fx.br, "descriptors_refused");
	assert_int_equal(refused0, 0);
	assert_int_equal(write(go[1], "g", 1), 1);

	/* the bad ones, while the good worker runs */
	{
		const struct {
			struct kvb_desc d;
			int read;
			int want;
		} bad[] = {
			/* local offset + len past the end */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .offset = SRC_SIZE - 4 * KiB,
			  .len = 8 * KiB,
			  .tag = 1},
			 0,
			 -EFAULT},
			/* peer offset + len past the end */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .peer_offset = DST_SIZE - 100,
			  .len = 4 * KiB,
			  .tag = 2},
			 0,
			 -EFAULT},
			/* offset + len wraps */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .offset = UINT64_MAX - 100,
			  .len = 4 * KiB,
			  .tag = 3},
			 0,
			 -EFAULT},
			{{.region = src.id,
			  .peer_region = dst.id,
			  .peer_offset = UINT64_MAX - 100,
			  .len = 4 * KiB,
			  .tag = 4},
			 0,
			 -EFAULT},
			/* another worker's region as the local side */
			{{.region = dst.id,
			  .peer_region = dst.id,
			  .len = 4 * KiB,
			  .tag = 5},
			 0,
			 -EINVAL},
			/* a region not granted to anyone */
			{{.region = src.id,
			  .peer_region = priv.id,
			  .len = 4 * KiB,
			  .tag = 6},
			 0,
			 -EINVAL},
			/* READ from a region granted only REMOTE_WRITE */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .len = 4 * KiB,
			  .tag = 7},
			 1,
			 -EINVAL},
			/* unknown region ids */
			{{.region = 0xdead,
			  .peer_region = dst.id,
			  .len = 4 * KiB,
			  .tag = 8},
			 0,
			 -EINVAL},
			{{.region = src.id,
			  .peer_region = 0xbeef0001,
			  .len = 4 * KiB,
			  .tag = 9},
			 0,
			 -EINVAL},
			/* zero length */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .len = 0,
			  .tag = 10},
			 0,
			 -EINVAL},
			/* another node */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .len = 4 * KiB,
			  .peer = 3,
			  .tag = 11},
			 0,
			 -EHOSTUNREACH},
			/* a transfer handle nobody opened */
			{{.transfer = 0x00077777,
			  .region = src.id,
			  .peer_region = dst.id,
			  .peer_offset = P1_AREA,
			  .len = 4 * KiB,
			  .tag = 12},
			 0,
			 -EINVAL},
			/* unsignaled, but errors always complete */
			{{.region = src.id,
			  .peer_region = dst.id,
			  .offset = SRC_SIZE,
			  .len = 1,
			  .flags = KVB_DESC_UNSIGNALED,
			  .tag = 13},
			 0,
			 -EFAULT},
		};
		const int nbad = (int) (sizeof(bad) / sizeof(bad[0]));

		for (i = 0; i < nbad; i++)
			assert_int_equal(
				bad[i].read
					? kvb_submit_read(pctx, &bad[i].d, 1)
					: kvb_submit_write(pctx, &bad[i].d, 1),
				1);
		n = w_collect(pctx, c, (unsigned) nbad, 10000);
		assert_int_equal(n, nbad);
		for (i = 0; i < nbad; i++) {
			int k = w_find(c, n, KVB_COMP_DESC, bad[i].d.tag);

			if (k < 0)
				fail_msg("no completion for tag %llu",
					 (unsigned long long) bad[i].d.tag);
			if (c[k].status != bad[i].want)
				fail_msg("tag %llu: status %d (%s), want %d",
					 (unsigned long long) bad[i].d.tag,
					 c[k].status, kvb_strerror(c[k].status),
					 bad[i].want);
			assert_int_equal(c[k].bytes, 0);
		}
		assert_int_equal(broker_stat(&fx.br, "descriptors_refused"),
				 nbad);

		/* undefined flag bits: the library refuses the call and
		 * queues none of it (it used to drop the bits and the write
		 * completed with success) */
		{
			static const uint16_t undef[] = {0x8000, 0xfffe, 0x2,
							 0x8001};
			struct kvb_desc u[2] = {
				{.region = src.id,
				 .peer_region = dst.id,
				 .peer_offset = P1_AREA,
				 .len = 4 * KiB,
				 .tag = 30},
				{.region = src.id,
				 .peer_region = dst.id,
				 .peer_offset = P1_AREA,
				 .len = 4 * KiB,
				 .tag = 31},
			};

			for (i = 0; i < 4; i++) {
				u[1].flags = undef[i];
				assert_int_equal(kvb_submit_write(pctx, u, 2),
						 -EINVAL);
				assert_int_equal(
					kvb_submit_read(pctx, u + 1, 1),
					-EINVAL);
			}
			assert_int_equal(w_collect(pctx, c, 1, 200), 0);
		}

		/* the same worker's good writes still go through */
		{
			struct kvb_desc g = {.region = src.id,
					     .peer_region = dst.id,
					     .offset = 4 * KiB,
					     .peer_offset = P1_AREA,
					     .len = 16 * KiB,
					     .tag = 40};

			assert_int_equal(kvb_submit_write(pctx, &g, 1), 1);
			assert_int_equal(w_collect(pctx, c, 1, 5000), 1);
			assert_int_equal(c[0].tag, 40);
			assert_int_equal(c[0].status, 0);
			assert_int_equal(c[0].bytes, 16 * KiB);
			assert_int_equal(
				pattern_check((char *) dst.addr + P1_AREA,
					      16 * KiB, 1, 4 * KiB),
				0);
		}

		/* a transfer with one good and one bad write fails with the
		 * bad one's status */
		{
			struct kvb_desc w2[2] = {
				{.region = src.id,
				 .peer_region = dst.id,
				 .peer_offset = P1_AREA + 64 * KiB,
				 .len = 4 * KiB,
				 .tag = 50},
				{.region = src.id,
				 .peer_region = dst.id,
				 .peer_offset = DST_SIZE,
				 .len = 4 * KiB,
				 .tag = 51},
			};

			assert_int_equal(kvb_transfer_open(pctx, "mixed", &h),
					 0);
			w2[0].transfer = w2[1].transfer = h;
			assert_int_equal(kvb_submit_write(pctx, w2, 2), 2);
			assert_int_equal(kvb_transfer_seal(pctx, h, 2, 52), 0);
			n = w_collect(pctx, c, 3, 5000);
			assert_int_equal(n, 3);
			i = w_find(c, n, KVB_COMP_DESC, 50);
			assert_true(i >= 0 && c[i].status == 0);
			i = w_find(c, n, KVB_COMP_DESC, 51);
			assert_true(i >= 0 && c[i].status == -EFAULT);
			i = w_find(c, n, KVB_COMP_TRANSFER, 52);
			assert_true(i >= 0);
			assert_int_equal(c[i].status, -EFAULT);
			assert_int_equal(c[i].transfer, h);
			/* it is terminal now */
			assert_int_equal(kvb_transfer_open(pctx, "mixed", &h),
					 -ESTALE);
		}
		assert_int_equal(broker_stat(&fx.br, "descriptors_refused"),
				 nbad + 1);
	}

	/* the good worker finished, and D saw each transfer's write_done */
	assert_int_equal(waitpid(child, &status, 0), child);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		broker_log_dump(&fx.br);
		fail_msg("good worker failed: status %#x", status);
	}
	n = w_collect(dctx, c, GOOD_ROUNDS, 10000);
	assert_int_equal(n, GOOD_ROUNDS);
	for (i = 0; i < GOOD_ROUNDS; i++) {
		int k = w_find(c, n, KVB_COMP_TRANSFER, 500 + i);

		assert_true(k >= 0);
		assert_int_equal(c[k].status, 0);
		assert_int_equal(c[k].transfer, dh[i]);
	}
	assert_int_equal(pattern_check(dst.addr, GOOD_AREA, 2, 0), 0);

	/* logged with reasons; the broker still serves everyone */
	assert_true(broker_log_has(&fx.br, "refused descriptor"));
	assert_true(broker_log_has(&fx.br, "outside the region"));
	assert_true(broker_log_has(&fx.br, "belongs to another worker"));
	assert_true(broker_log_has(&fx.br, "not granted"));
	assert_int_equal(broker_stat(&fx.br, "transfers_failed"), 1);
	assert_int_equal(broker_stat(&fx.br, "workers_lost"), 0);

	assert_int_equal(kvb_mem_free(pctx, &src), 0);
	assert_int_equal(kvb_mem_free(dctx, &dst), 0);
	assert_int_equal(kvb_mem_free(dctx, &priv), 0);
	/* a freed region is gone for good */
	assert_int_equal(kvb_mem_free(dctx, &priv), -ENOENT);
	kvb_detach(pctx);
	kvb_detach(dctx);
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 5000), 0);
	assert_int_equal(broker_stat(&fx.br, "regions"), 0);
	close(go[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_descriptors),
	};

	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

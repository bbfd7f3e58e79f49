/* SPDX-License-Identifier: MIT */
/*
 * Cross-node layer ops that need more in-flight entries than the broker's
 * table holds (64 Ki), with a plain write right behind them: two brokers on
 * 127.0.0.1, a P worker on A holding 6 KV layers, a D worker on B that opens
 * a READ of 8000 scattered blocks (16000 block halves, one entry each per
 * layer op; P's worker holds them in its READ transfer), submits all 6
 * layer ops and then a same-node write. The table
 * runs out within a burst: the layer ops that do not fit wait for room
 * (counted as layers_starved) instead of failing with -ENOBUFS, and then
 * every one of them completes with 0; the write completes with 0; nothing
 * crashes (the write used to underflow the table's free stack), and both
 * brokers exit cleanly. On the way, a WRITE open naming block 2^31 (no msgpack
 * int32 holds it) is refused -EINVAL.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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

#define NB	  8000u /* blocks of the READ */
#define NL	  6	/* layers: 6 x 16000 entries > 65535 */
#define WRITE_TAG 99

static const struct kvb_kv_geometry g = {.layout = KVB_KV_KV_FIRST,
					 .num_blocks = 2 * NB + 2,
					 .block_size = 1,
					 .num_heads = 1,
					 .head_dim = 64,
					 .elem_size = 2};

static struct broker ba, bb; /* killed by teardown if a check failed */
static pid_t pchild;

static struct kvb_ctx *attach(struct broker *b, enum kvb_role role)
{
	struct kvb_attach_opts o = {.socket_path = b->sock,
				    .role = role,
				    .tp_size = 1,
				    .timeout_ms = 15000};
	struct kvb_ctx *ctx = NULL;

	return kvb_attach(&o, &ctx) ? NULL : ctx;
}

/* 0 or -1: the worker's NL KV layers */
static int kv_layers(struct kvb_ctx *ctx)
{
	for (unsigned l = 0; l < NL; l++) {
		struct kvb_region r;

		if (kvb_mem_alloc(ctx, 2ull * g.num_blocks * 128,
				  KVB_MEM_REMOTE_READ | KVB_MEM_REMOTE_WRITE, l,
				  &r) ||
		    kvb_mem_set_kv(ctx, r.id, l, &g))
			return -1;
	}
	return 0;
}

/* P on A: its layers, then it stays until killed. */
static void p_worker(int ready_fd)
{
	static uint32_t pb[NB];
	struct kvb_ctx *ctx = attach(&ba, KVB_ROLE_P);
	struct kvb_remote_xfer px = {
		.mode = KVB_XFER_READ, .blocks = pb, .nblocks = NB};
	uint32_t h;

	if (!ctx || kv_layers(ctx))
		_exit(2);
	/* P holds the blocks D reads (its broker serves only those) */
	for (uint32_t i = 0; i < NB; i++)
		pb[i] = 2 * i;
	if (kvb_peer_connect(ctx, "127.0.0.1", 17311, &px.peer))
		_exit(4);
	if (kvb_transfer_open_remote(ctx, "tx-burst", &px, &h) ||
	    kvb_transfer_seal(ctx, h, 0, 1))
		_exit(5);
	if (write(ready_fd, "x", 1) != 1)
		_exit(3);
	pause();
	_exit(0);
}

static void test_layer_burst(void **state)
{
	static const char *const a_args[] = {
		"--host-ip", "127.0.0.1",     "--handshake-port",
		"17301",     "--notify-port", "17305",
		NULL};
	static const char *const b_args[] = {
		"--host-ip", "127.0.0.1",     "--handshake-port",
		"17311",     "--notify-port", "17315",
		NULL};
	const struct broker_opts ao = {.args = a_args}, bo = {.args = b_args};
	static uint32_t lb[NB], rb[NB];
	struct kvb_remote_xfer x = {.mode = KVB_XFER_READ};
	struct kvb_region src, dst;
	struct kvb_completion c[64];
	struct kvb_ctx *ctx;
	int64_t t0;
	int ready[2], write_status = 1, nobufs = 0, rc;
	unsigned nlayers = 0, layer_bad = 0;
	uint32_t peer, h;
	char byte;

	(void) state;
	assert_int_equal(broker_start(&ba, &ao), 0);
	assert_int_equal(broker_start(&bb, &bo), 0);
	assert_int_equal(pipe(ready), 0);
	pchild = fork();
	assert_true(pchild >= 0);
	if (!pchild) {
		close(ready[0]);
		p_worker(ready[1]);
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], &byte, 1), 1);
	close(ready[0]);

	ctx = attach(&bb, KVB_ROLE_D);
	assert_non_null(ctx);
	assert_int_equal(kv_layers(ctx), 0);
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", 17301, &peer), 0);
	{
		/* a block id no msgpack int32 holds: refused as invalid,
		 * not as an unreachable peer */
		uint32_t big = 1u << 31;
		struct kvb_remote_xfer wx = {.peer = peer,
					     .mode = KVB_XFER_WRITE,
					     .blocks = &big,
					     .nblocks = 1};

		assert_int_equal(
			kvb_transfer_open_remote(ctx, "tx-bigid", &wx, &h),
			-EINVAL);
	}
	for (uint32_t i = 0; i < NB; i++) /* never contiguous */
		lb[i] = rb[i] = 2 * i;
	x.peer = peer;
	x.blocks = lb;
	x.nblocks = NB;
	x.remote_blocks = rb;
	x.nremote = NB;
	assert_int_equal(kvb_transfer_open_remote(ctx, "tx-burst", &x, &h), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 1 << 16, 0, 100, &src), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 1 << 16, 0, 101, &dst), 0);
	for (unsigned l = 0; l < NL; l++)
		assert_int_equal(kvb_submit_layer(ctx, h, l, l, 0), 1);
	{
		struct kvb_desc d = {.region = src.id,
				     .peer_region = dst.id,
				     .len = 4096,
				     .tag = WRITE_TAG};

		assert_int_equal(kvb_submit_write(ctx, &d, 1), 1);
	}
	/* the write and every layer op complete */
	t0 = now_ns();
	while ((write_status > 0 || nlayers < NL) &&
	       ms_since(t0) < 30000 + SLACK) {
		int n = kvb_wait(ctx, c, 64, 1000);

		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			nobufs += c[i].status == -ENOBUFS;
			if (c[i].kind != KVB_COMP_DESC)
				continue;
			if (c[i].tag == WRITE_TAG) {
				write_status = c[i].status;
			} else if (c[i].tag < NL) {
				nlayers++;
				layer_bad += c[i].status != 0;
			}
		}
	}
	print_message("write: %d; layer ops done %u (%u failed); -ENOBUFS "
		      "completions: %d; layer ops that waited for room: %lld\n",
		      write_status, nlayers, layer_bad, nobufs,
		      (long long) broker_stat(&bb, "layers_starved"));
	assert_int_equal(write_status, 0);
	assert_int_equal(nlayers, NL);
	assert_int_equal(layer_bad, 0);
	assert_int_equal(nobufs, 0);
	assert_true(broker_stat(&bb, "layers_starved") >= 1);
	/* B still serves; the transfer ends when asked */
	assert_true(broker_stat(&bb, "workers") >= 1);
	assert_int_equal(kvb_transfer_abort(ctx, h, 7), 0);
	kvb_detach(ctx);
	kill(pchild, SIGKILL);
	waitpid(pchild, NULL, 0);
	pchild = 0;
	rc = broker_stop(&bb);
	broker_cleanup(&bb);
	assert_int_equal(rc, 0);
	rc = broker_stop(&ba);
	broker_cleanup(&ba);
	assert_int_equal(rc, 0);
}

static int teardown(void **state)
{
	(void) state;
	if (pchild > 0) {
		kill(pchild, SIGKILL);
		waitpid(pchild, NULL, 0);
	}
	if (bb.pid > 0) {
		broker_log_dump(&bb);
		broker_kill(&bb);
		broker_cleanup(&bb);
	}
	if (ba.pid > 0) {
		broker_kill(&ba);
		broker_cleanup(&ba);
	}
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layer_burst),
	};

	return cmocka_run_group_tests(tests, NULL, teardown);
}

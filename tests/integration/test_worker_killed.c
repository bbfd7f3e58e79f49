/* SPDX-License-Identifier: MIT */
/*
 * Workers killed with SIGKILL. First a P worker with thousands of
 * descriptors outstanding, killed while another P worker keeps writing into
 * the same D worker: the broker survives and the other worker's transfers
 * complete with every byte verified. Then 100 attach / allocate / submit /
 * SIGKILL cycles: afterwards the broker's fds and mappings are back to their
 * baseline, it reports no workers and no regions, and /dev/shm holds nothing
 * new.
 */
#include <errno.h>
#include <fcntl.h>
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

#define MiB	     (1ull << 20)
#define KiB	     (1ull << 10)
#define DST_SIZE     (32 * MiB)
#define GOOD_DESCS   256
#define GOOD_LEN     (4 * KiB)
#define GOOD_AREA    ((uint64_t) GOOD_DESCS * GOOD_LEN) /* at 0 */
#define VICTIM_OFF   (16 * MiB)				/* victim's area */
#define VICTIM_LEN   (64 * KiB)
#define VICTIM_READY 10000 /* descriptors submitted before it says so */
#define CYCLES	     100
#define KEY_DST	     1

static int64_t rss_kib(pid_t pid)
{
	char path[64], line[256];
	int64_t v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			v = strtoll(line + 6, NULL, 10);
	fclose(f);
	return v;
}

/* P rank 0: floods the ring and never reaps; SIGKILLed by the test. */
static int victim(int go_fd, int ready_fd)
{
	struct kvb_remote_region dst;
	struct kvb_desc d[64];
	struct kvb_region src;
	struct kvb_ctx *ctx;
	uint64_t total = 0;
	uint32_t h;
	char byte;

	ctx = w_attach(&fx.br, KVB_ROLE_P, 0, 2, 0);
	if (!ctx || kvb_mem_alloc(ctx, VICTIM_LEN, 0, 0, &src))
		return 10;
	pattern_fill(src.addr, VICTIM_LEN, 3, 0);
	if (read(go_fd, &byte, 1) != 1 ||
	    kvb_mem_lookup(ctx, KVB_ROLE_D, 0, 0, KEY_DST, &dst) ||
	    kvb_transfer_open(ctx, "victim-tx", &h))
		return 11;
	for (;;) {
		int n;

		for (unsigned i = 0; i < 64; i++)
			d[i] = (struct kvb_desc){
				.transfer = h,
				.region = src.id,
				.peer_region = dst.id,
				.peer_offset = VICTIM_OFF +
					       ((total + i) % 256) * VICTIM_LEN,
				.len = VICTIM_LEN,
				.tag = total + i};
		n = kvb_submit_write(ctx, d, 64);
		if (n == -EAGAIN) {
			usleep(100);
			continue;
		}
		if (n < 0)
			return 12;
		if (total < VICTIM_READY &&
		    total + (unsigned) n >= VICTIM_READY &&
		    write(ready_fd, "r", 1) != 1)
			return 13;
		total += (unsigned) n;
	}
}

/* P rank 1: transfers of GOOD_DESCS signaled writes, all checked; one
 * progress byte per transfer; stops when `stop_fd` becomes readable. */
static int good(int go_fd, int progress_fd, int stop_fd)
{
	struct kvb_completion c[GOOD_DESCS + 1];
	struct kvb_remote_region dst;
	struct kvb_desc d[GOOD_DESCS];
	struct kvb_region src;
	struct kvb_ctx *ctx;
	char byte, id[32];

	ctx = w_attach(&fx.br, KVB_ROLE_P, 1, 2, 0);
	if (!ctx || kvb_mem_alloc(ctx, GOOD_AREA, 0, 0, &src))
		return 20;
	pattern_fill(src.addr, GOOD_AREA, 4, 0);
	if (read(go_fd, &byte, 1) != 1 ||
	    kvb_mem_lookup(ctx, KVB_ROLE_D, 0, 0, KEY_DST, &dst))
		return 21;
	for (unsigned r = 0; read(stop_fd, &byte, 1) != 1; r++) {
		unsigned sent = 0;
		uint32_t h;
		int n;

		snprintf(id, sizeof(id), "good-%u", r);
		if (kvb_transfer_open(ctx, id, &h))
			return 22;
		for (unsigned i = 0; i < GOOD_DESCS; i++)
			d[i] = (struct kvb_desc){.transfer = h,
						 .region = src.id,
						 .peer_region = dst.id,
						 .offset = i * GOOD_LEN,
						 .peer_offset = i * GOOD_LEN,
						 .len = GOOD_LEN,
						 .tag = i};
		while (sent < GOOD_DESCS) {
			n = kvb_submit_write(ctx, d + sent, GOOD_DESCS - sent);
			if (n == -EAGAIN)
				continue;
			if (n < 0)
				return 23;
			sent += (unsigned) n;
		}
		while (kvb_transfer_seal(ctx, h, GOOD_DESCS, 9999) == -EAGAIN)
			;
		n = w_collect(ctx, c, GOOD_DESCS + 1, 20000);
		if (n != GOOD_DESCS + 1)
			return 24;
		for (int i = 0; i < n; i++)
			if (c[i].status)
				return 25;
		if (w_find(c, n, KVB_COMP_TRANSFER, 9999) < 0)
			return 26;
		if (write(progress_fd, "p", 1) != 1)
			return 27;
	}
	kvb_mem_free(ctx, &src);
	kvb_detach(ctx);
	return 0;
}

static void test_kill_mid_transfer(void **state)
{
	int go[2], ready[2], prog[2], stop[2], status;
	struct kvb_region dst;
	struct kvb_ctx *dctx;
	pid_t v, g;
	char byte;

	(void) state;
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(prog), 0);
	assert_int_equal(pipe2(stop, O_NONBLOCK), 0);
	v = fork();
	assert_true(v >= 0);
	if (v == 0)
		_exit(victim(go[0], ready[1]));
	g = fork();
	assert_true(g >= 0);
	if (g == 0)
		_exit(good(go[0], prog[1], stop[0]));
	close(ready[1]);
	close(prog[1]);

	dctx = w_attach(&fx.br, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(dctx);
	assert_int_equal(kvb_mem_alloc(dctx, DST_SIZE, KVB_MEM_REMOTE_WRITE,
				       KEY_DST, &dst),
			 0);
	assert_int_equal(write(go[1], "gg", 2), 2);

	/* the victim has thousands of descriptors in flight: kill it while
	 * the good worker is going */
	assert_int_equal(read(ready[0], &byte, 1), 1);
	assert_int_equal(read(prog[0], &byte, 1), 1);
	assert_int_equal(kill(v, SIGKILL), 0);
	assert_int_equal(waitpid(v, &status, 0), v);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(broker_wait_stat(&fx.br, "workers_lost", 1, 5000), 0);

	/* the good worker completes more transfers after the kill */
	for (int i = 0; i < 3; i++)
		assert_int_equal(read(prog[0], &byte, 1), 1);
	assert_int_equal(write(stop[1], "s", 1), 1);
	assert_int_equal(waitpid(g, &status, 0), g);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		broker_log_dump(&fx.br);
		fail_msg("good worker: status %#x", status);
	}
	assert_int_equal(pattern_check(dst.addr, GOOD_AREA, 4, 0), 0);
	/* the victim's bytes that did land are its own */
	for (int i = 0; i < 4; i++) {
		const uint8_t *p = (const uint8_t *) dst.addr + VICTIM_OFF +
				   (uint64_t) i * VICTIM_LEN;

		if (p[0] || p[1])
			assert_int_equal(pattern_check(p, VICTIM_LEN, 3, 0), 0);
	}
	assert_true(broker_log_has(&fx.br, "victim-tx") ||
		    broker_log_has(&fx.br, "disconnected"));
	assert_int_equal(broker_stat(&fx.br, "workers_lost"), 1);
	assert_int_equal(kvb_mem_free(dctx, &dst), 0);
	kvb_detach(dctx);
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
	/* a dead worker's regions go when in-flight copies release them */
	assert_int_equal(broker_wait_stat(&fx.br, "regions", 0, 10000), 0);
	/* D's entries for the P transfers (their write_done) went with it */
	assert_int_equal(broker_stat(&fx.br, "transfers_active"), 0);
	close(go[1]);
	close(ready[0]);
	close(prog[0]);
	close(stop[0]);
	close(stop[1]);
}

/* attach, allocate 2 regions, submit, tell the parent, keep submitting */
static int cycle_child(int ready_fd, unsigned i)
{
	struct kvb_region a, b;
	struct kvb_desc d[64];
	struct kvb_ctx *ctx;
	uint32_t h;
	char id[32];

	ctx = w_attach(&fx.br, i % 2 ? KVB_ROLE_P : KVB_ROLE_D, 0, 1, 256);
	if (!ctx || kvb_mem_alloc(ctx, 1 * MiB, KVB_MEM_REMOTE_WRITE, 1, &a) ||
	    kvb_mem_alloc(ctx, 1 * MiB, 0, 2, &b))
		return 1;
	snprintf(id, sizeof(id), "cycle-%u", i);
	if (kvb_transfer_open(ctx, id, &h))
		return 2;
	for (unsigned k = 0; k < 64; k++)
		d[k] = (struct kvb_desc){.transfer = h,
					 .region = a.id,
					 .peer_region = b.id,
					 .offset = k * 16 * KiB,
					 .peer_offset = k * 16 * KiB,
					 .len = 16 * KiB,
					 .tag = k};
	if (kvb_submit_write(ctx, d, 64) <= 0)
		return 3;
	if (write(ready_fd, "r", 1) != 1)
		return 4;
	for (;;)
		if (kvb_submit_write(ctx, d, 64) == -EAGAIN)
			usleep(50);
}

static void test_kill_cycles(void **state)
{
	int fd0, maps0, shm0, fd1, maps1, shm1, ready[2], status;
	int64_t rss0, rss1, lost0;
	char byte;

	(void) state;
	fd0 = proc_fd_wait(fx.br.pid, BROKER_IDLE_FDS, 10000);
	maps0 = proc_map_count(fx.br.pid);
	rss0 = rss_kib(fx.br.pid);
	shm0 = devshm_kvb_count();
	lost0 = broker_stat(&fx.br, "workers_lost");
	assert_int_equal(fd0, BROKER_IDLE_FDS);
	assert_true(maps0 > 0);
	assert_int_equal(pipe(ready), 0);
	for (unsigned i = 0; i < CYCLES; i++) {
		pid_t c = fork();

		assert_true(c >= 0);
		if (c == 0) {
			close(ready[0]);
			_exit(cycle_child(ready[1], i));
		}
		if (read(ready[0], &byte, 1) != 1) {
			waitpid(c, &status, 0);
			broker_log_dump(&fx.br);
			fail_msg("cycle %u: child failed (%#x)", i, status);
		}
		assert_int_equal(kill(c, SIGKILL), 0);
		assert_int_equal(waitpid(c, &status, 0), c);
	}
	close(ready[0]);
	close(ready[1]);
	assert_int_equal(
		broker_wait_stat(&fx.br, "workers_lost", lost0 + CYCLES, 10000),
		0);
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
	/* a dead worker's regions go when in-flight copies release them */
	assert_int_equal(broker_wait_stat(&fx.br, "regions", 0, 10000), 0);
	assert_int_equal(broker_stat(&fx.br, "transfers_active"), 0);

	fd1 = proc_fd_wait(fx.br.pid, fd0, 10000);
	maps1 = proc_map_count(fx.br.pid);
	rss1 = rss_kib(fx.br.pid);
	shm1 = devshm_kvb_count();
	fprintf(stderr,
		"broker after %d kill cycles: fds %d -> %d, maps %d -> %d, "
		"rss %lld -> %lld KiB, /dev/shm kvb %d -> %d\n",
		CYCLES, fd0, fd1, maps0, maps1, (long long) rss0,
		(long long) rss1, shm0, shm1);
	assert_int_equal(fd1, fd0);
	/* a little slack for the allocator's own mappings */
	assert_true(maps1 <= maps0 + 4);
	assert_true(rss1 <= rss0 + 16 * 1024);
	assert_int_equal(shm1, shm0);
	/* still serving */
	{
		struct kvb_ctx *c = w_attach(&fx.br, KVB_ROLE_P, 0, 1, 0);

		assert_non_null(c);
		kvb_detach(c);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill_mid_transfer),
		cmocka_unit_test(test_kill_cycles),
	};

	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

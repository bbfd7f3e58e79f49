/* SPDX-License-Identifier: MIT */
/*
 * Control calls that give up (timeout_ms) while the broker still answers
 * later: the late reply is never taken for a later call's (a PEER to a
 * silent peer, answered when the handshake times out, 3 s later; workers
 * that disconnect meanwhile do not hold its waiter slots), kvb_wait
 * does not spin on it, a region registered that late is freed again.
 * Every control call ends within its timeout: with a periodic signal
 * (SIGALRM every 100 ms) against a stopped broker, and for each of several
 * threads queued behind one another. After the broker's death, what the
 * header promises: kvb_wait says -EPIPE at once, submissions then too.
 * And argument checks of kvb_transfer_open_remote, kvb_strerror(-EEXIST).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define SILENT_PORT 16398 /* nobody listens there */

/* Each test's broker; a failed test leaves it to teardown() (it may be
 * stopped: SIGSTOP), so that the next test finds its ports free. */
static struct broker br;
static int running;

static void start(const char *const *args)
{
	struct broker_opts o = {.args = args};

	assert_int_equal(broker_start(&br, &o), 0);
	running = 1;
}

static void stop(void)
{
	int rc;

	running = 0;
	rc = broker_stop(&br);
	broker_cleanup(&br);
	assert_int_equal(rc, 0);
}

static int teardown(void **state)
{
	(void) state;
	if (running) {
		kill(br.pid, SIGCONT);
		broker_kill(&br);
		broker_cleanup(&br);
		running = 0;
	}
	return 0;
}

static struct kvb_ctx *attach_ms(const struct broker *b, int timeout_ms)
{
	/* each worker a dp rank of its own: a second worker with an identity
	 * that is attached is refused */
	static uint32_t next_dp;
	struct kvb_attach_opts o = {.socket_path = b->sock,
				    .role = KVB_ROLE_P,
				    .dp_rank = next_dp++,
				    .tp_size = 1,
				    .timeout_ms = timeout_ms};
	struct kvb_ctx *ctx = NULL;

	assert_int_equal(kvb_attach(&o, &ctx), 0);
	return ctx;
}

static double thread_cpu_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

/* Wait up to timeout_ms for the broker's log to contain s. */
static int log_wait(const struct broker *b, const char *s, int timeout_ms)
{
	int64_t t0 = now_ns();

	while (!broker_log_has(b, s)) {
		if (ms_since(t0) > timeout_ms)
			return -ETIMEDOUT;
		usleep(10 * 1000);
	}
	return 0;
}

/* Open ids A, B, C, then again: three distinct handles, the same again. */
static void opens_agree(struct kvb_ctx *ctx, const char *tag)
{
	uint32_t h[6];
	char id[6][32];

	for (int i = 0; i < 6; i++) {
		snprintf(id[i], sizeof(id[i]), "%s-%c", tag, 'A' + i % 3);
		h[i] = 0xdead;
		assert_int_equal(kvb_transfer_open(ctx, id[i], &h[i]), 0);
	}
	assert_int_not_equal(h[0], h[1]);
	assert_int_not_equal(h[1], h[2]);
	assert_int_not_equal(h[0], h[2]);
	for (int i = 0; i < 3; i++)
		assert_int_equal(h[i + 3], h[i]);
}

/* A PEER to a silent port: -ETIMEDOUT after 500 ms, its reply 3 s later. */
static void test_late_peer_reply(void **state)
{
	static const char *const args[] = {
		"--host-ip",	   "127.0.0.1",	    "--handshake-port",
		"16311",	   "--notify-port", "16315",
		"--trusted-hosts", "127.0.0.1",	    NULL};
	struct kvb_completion c[4];
	struct kvb_ctx *ctx;
	uint32_t peer = 0;
	double wall, cpu;
	int64_t t0;

	(void) state;
	start(args);
	ctx = attach_ms(&br, 500);
	t0 = now_ns();
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", SILENT_PORT, &peer),
			 -ETIMEDOUT);
	wall = ms_since(t0);
	assert_true(wall >= 500 && wall < 500 + SLACK);
	/* the broker answers when its handshake gives up */
	assert_int_equal(log_wait(&br, "no handshake answer", 10000), 0);
	usleep(100 * 1000);

	/* the late reply sits on the control socket: kvb_wait sleeps */
	t0 = now_ns();
	cpu = thread_cpu_ms();
	assert_int_equal(kvb_wait(ctx, c, 4, 500), -ETIMEDOUT);
	wall = ms_since(t0);
	cpu = thread_cpu_ms() - cpu;
	fprintf(stderr, "kvb_wait(500): %.0f ms, cpu %.1f ms\n", wall, cpu);
	assert_true(wall >= 500);
	assert_true(cpu < 100);

	/* and no later call takes it for its own answer */
	opens_agree(ctx, "p1");

	/* two in a row: the second waits for the first's reply (it has not
	 * come by its own timeout: -ETIMEDOUT, nothing sent) */
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", SILENT_PORT, &peer),
			 -ETIMEDOUT);
	t0 = now_ns();
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", SILENT_PORT, &peer),
			 -ETIMEDOUT);
	wall = ms_since(t0);
	assert_true(wall >= 500 && wall < 500 + SLACK);
	/* the first's reply comes in the middle of these, read by them */
	sleep(3);
	opens_agree(ctx, "p2");
	kvb_detach(ctx);
	stop();
}

/* One worker asking a silent peer, from its own thread: -ETIMEDOUT after
 * 500 ms (the broker answers 3 s later); then it disconnects. */
static void *silent_peer_asker(void *arg)
{
	struct kvb_ctx *ctx = arg;
	uint32_t peer = 0;

	return (void *) (intptr_t) kvb_peer_connect(ctx, "127.0.0.1",
						    SILENT_PORT, &peer);
}

/* Workers that ask for a peer and disconnect during its handshake do not
 * hold its 32 waiter slots: a 33rd worker's request is taken (it times
 * out as the others did), not refused with -EBUSY. */
static void test_peer_waiters_gone(void **state)
{
	static const char *const args[] = {
		"--host-ip",	   "127.0.0.1",	    "--handshake-port",
		"16321",	   "--notify-port", "16325",
		"--trusted-hosts", "127.0.0.1",	    NULL};
	enum { N = 32 }; /* the broker's waiter slots per peer */
	struct kvb_ctx *ctx[N], *last;
	pthread_t th[N];
	uint32_t peer = 0;
	int64_t t0;

	(void) state;
	start(args);
	for (int i = 0; i < N; i++)
		ctx[i] = attach_ms(&br, 500);
	last = attach_ms(&br, 500);
	t0 = now_ns();
	for (int i = 0; i < N; i++)
		assert_int_equal(
			pthread_create(&th[i], NULL, silent_peer_asker, ctx[i]),
			0);
	for (int i = 0; i < N; i++) {
		void *rc;

		assert_int_equal(pthread_join(th[i], &rc), 0);
		assert_int_equal((int) (intptr_t) rc, -ETIMEDOUT);
		kvb_detach(ctx[i]);
	}
	assert_int_equal(broker_wait_stat(&br, "workers", 1, 1000), 0);
	assert_true(ms_since(t0) < 2000); /* the handshake (3 s) is on */
	assert_false(broker_log_has(&br, "no handshake answer"));
	assert_int_equal(
		kvb_peer_connect(last, "127.0.0.1", SILENT_PORT, &peer),
		-ETIMEDOUT);
	assert_int_equal(log_wait(&br, "no handshake answer", 10000), 0);
	kvb_detach(last);
	stop();
}

/* A MEM_REG answered after its call gave up: the region is freed again,
 * by the next control call or by kvb_wait. */
static void test_late_mem_reg(void **state)
{
	struct kvb_completion c[4];
	struct kvb_region r;
	struct kvb_ctx *ctx;
	uint32_t h;

	(void) state;
	start(NULL);
	ctx = attach_ms(&br, 300);
	assert_int_equal(broker_stat(&br, "regions"), 0);

	/* 1: the next control call drops the late reply */
	assert_int_equal(kill(br.pid, SIGSTOP), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 1 << 20, 0, 1, &r), -ETIMEDOUT);
	assert_int_equal(kill(br.pid, SIGCONT), 0);
	assert_int_equal(broker_wait_stat(&br, "regions", 1, 5000), 0);
	assert_int_equal(kvb_transfer_open(ctx, "after-reg", &h), 0);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);

	/* 2: kvb_wait drops it (no control call after) */
	assert_int_equal(kill(br.pid, SIGSTOP), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 1 << 20, 0, 2, &r), -ETIMEDOUT);
	assert_int_equal(kill(br.pid, SIGCONT), 0);
	assert_int_equal(broker_wait_stat(&br, "regions", 1, 5000), 0);
	assert_int_equal(kvb_wait(ctx, c, 4, 200), -ETIMEDOUT);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 5000), 0);

	opens_agree(ctx, "m");
	kvb_detach(ctx);
	stop();
}

static void on_alarm(int sig)
{
	(void) sig;
}

/* SIGALRM every 100 ms (no SA_RESTART) against a stopped broker: a call
 * with timeout_ms 1000 still ends after 1000 ms. */
static void test_eintr(void **state)
{
	struct itimerval it = {{0, 100000}, {0, 100000}}, off = {0};
	struct sigaction sa = {.sa_handler = on_alarm}, old;
	struct kvb_ctx *ctx;
	uint32_t h, hy, hx;
	double wall;
	int64_t t0;
	pid_t guard;
	int rc;

	(void) state;
	start(NULL);
	ctx = attach_ms(&br, 1000);
	assert_int_equal(kill(br.pid, SIGSTOP), 0);
	/* a call that never ends would hang the test: the broker runs again
	 * after 8 s whatever happens */
	guard = fork();
	assert_true(guard >= 0);
	if (guard == 0) {
		sleep(8);
		kill(br.pid, SIGCONT);
		_exit(0);
	}
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	t0 = now_ns();
	rc = kvb_transfer_open(ctx, "x", &h);
	wall = ms_since(t0);
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);
	kill(br.pid, SIGCONT);
	kill(guard, SIGKILL);
	waitpid(guard, NULL, 0);
	fprintf(stderr, "open under SIGALRM: %d after %.0f ms\n", rc, wall);
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true(wall >= 1000 && wall < 1000 + SLACK);
	/* "x" was opened late: its reply is dropped, the next ones are right */
	assert_int_equal(kvb_transfer_open(ctx, "y", &hy), 0);
	assert_int_equal(kvb_transfer_open(ctx, "x", &hx), 0);
	assert_int_not_equal(hx, hy);
	assert_int_equal(kvb_transfer_open(ctx, "y", &h), 0);
	assert_int_equal(h, hy);
	kvb_detach(ctx);
	stop();
}

#define NTHREADS 6

struct opener {
	struct kvb_ctx *ctx;
	pthread_t thread;
	int id, rc;
	double ms;
};

static void *open_one(void *arg)
{
	struct opener *o = arg;
	int64_t t0 = now_ns();
	char id[32];
	uint32_t h;

	snprintf(id, sizeof(id), "t-%d", o->id);
	o->rc = kvb_transfer_open(o->ctx, id, &h);
	o->ms = ms_since(t0);
	return NULL;
}

/* Threads queued behind one another's calls to a stopped broker: each
 * ends within its own timeout, not one timeout after the other. */
static void test_lock_deadline(void **state)
{
	struct opener o[NTHREADS];
	struct kvb_ctx *ctx;

	(void) state;
	start(NULL);
	ctx = attach_ms(&br, 800);
	assert_int_equal(kill(br.pid, SIGSTOP), 0);
	for (int i = 0; i < NTHREADS; i++) {
		o[i] = (struct opener){.ctx = ctx, .id = i};
		assert_int_equal(
			pthread_create(&o[i].thread, NULL, open_one, &o[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(o[i].thread, NULL);
	kill(br.pid, SIGCONT);
	for (int i = 0; i < NTHREADS; i++) {
		fprintf(stderr, "thread %d: %d after %.0f ms\n", i, o[i].rc,
			o[i].ms);
		assert_int_equal(o[i].rc, -ETIMEDOUT);
		assert_true(o[i].ms >= 800 && o[i].ms < 800 + SLACK);
	}
	opens_agree(ctx, "l");
	kvb_detach(ctx);
	stop();
}

/* After SIGKILL: a submission may still be queued (no system call), the
 * next kvb_wait says -EPIPE at once, every submission after it too;
 * kvb_poll says it within 256 calls. */
static void test_dead_broker(void **state)
{
	struct kvb_completion c[4];
	struct kvb_ctx *a, *p;
	struct kvb_desc d;
	uint32_t h;
	int64_t t0;
	int rc, i;

	(void) state;
	start(NULL);
	a = attach_ms(&br, 1000);
	p = attach_ms(&br, 1000);
	assert_int_equal(kvb_transfer_open(a, "d", &h), 0);
	d = (struct kvb_desc){.transfer = h, .len = 64, .tag = 1};
	broker_kill(&br);
	broker_cleanup(&br);
	running = 0;

	rc = kvb_submit_write(a, &d, 1);
	assert_true(rc == 1 || rc == -EPIPE);
	t0 = now_ns();
	assert_int_equal(kvb_wait(a, c, 4, 5000), -EPIPE);
	assert_true(ms_since(t0) < SLACK);
	assert_int_equal(kvb_submit_write(a, &d, 1), -EPIPE);
	assert_int_equal(kvb_submit_read(a, &d, 1), -EPIPE);
	assert_int_equal(kvb_transfer_seal(a, h, 1, 2), -EPIPE);
	assert_int_equal(kvb_submit_layer(a, h, 0, 3, 0), -EPIPE);

	for (i = 0; i < 256 && (rc = kvb_poll(p, c, 4)) == 0; i++)
		;
	assert_int_equal(rc, -EPIPE);
	assert_int_equal(kvb_submit_write(p, &d, 1), -EPIPE);
	assert_int_equal(kvb_transfer_open(p, "late", &h), -EPIPE);
	kvb_detach(a);
	kvb_detach(p);
}

/* Argument checks before any request; the text of -EEXIST. */
static void test_args(void **state)
{
	static uint32_t blocks[20000];
	struct kvb_remote_xfer x = {.peer = 1, .mode = KVB_XFER_READ};
	struct kvb_ctx *ctx;
	int64_t requests;
	uint32_t h;

	(void) state;
	start(NULL);
	ctx = attach_ms(&br, 1000);
	requests = broker_stat(&br, "control_requests");
	x.blocks = blocks;
	x.nblocks = 3;
	x.nremote = 3; /* remote_blocks NULL */
	assert_int_equal(kvb_transfer_open_remote(ctx, "r", &x, &h), -EINVAL);
	x.remote_blocks = blocks;
	x.nblocks = 10000;
	x.nremote = 10000;
	assert_int_equal(kvb_transfer_open_remote(ctx, "r", &x, &h), -E2BIG);
	assert_non_null(strstr(kvb_strerror(-EEXIST), "twice"));
	assert_int_equal(broker_stat(&br, "control_requests"), requests);
	kvb_detach(ctx);
	stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_late_peer_reply, teardown),
		cmocka_unit_test_teardown(test_peer_waiters_gone, teardown),
		cmocka_unit_test_teardown(test_late_mem_reg, teardown),
		cmocka_unit_test_teardown(test_eintr, teardown),
		cmocka_unit_test_teardown(test_lock_deadline, teardown),
		cmocka_unit_test_teardown(test_dead_broker, teardown),
		cmocka_unit_test_teardown(test_args, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * Bad input to the cross-node calls of libkvbroker, each with its error:
 * kvb_mem_set_kv (unknown region, bad layout, tensor larger than the
 * region, a region or a layer declared twice), kvb_peer_connect and
 * kvb_transfer_open_remote on a broker without --host-ip, bad arguments,
 * an unreachable peer, a layer op on a same-node transfer. The broker keeps
 * serving after each.
 *
 * A worker's notify port that is taken when it attaches (the ROUTER of a
 * worker that just detached closes in libzmq's I/O thread, a moment after
 * the broker let it go): the broker binds it as soon as it is free, within
 * 2 s, and says so; one still taken after 2 s, or that another worker of
 * this broker has, is logged unavailable.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static const struct kvb_kv_geometry g = {KVB_KV_KV_FIRST, 8, 16, 1, 64, 2};
#define KV_BYTES (2ull * 8 * 16 * 64 * 2) /* the tensor of g */

static struct kvb_ctx *attach(struct broker *b, enum kvb_role role)
{
	struct kvb_attach_opts o = {
		.socket_path = b->sock,
		.role = role,
		.tp_size = 1,
		.timeout_ms = 15000}; /* > the broker's 3 s handshake timeout */
	struct kvb_ctx *ctx = NULL;

	assert_int_equal(kvb_attach(&o, &ctx), 0);
	return ctx;
}

static void test_mem_set_kv(void **state)
{
	struct broker b;
	struct kvb_ctx *ctx;
	struct kvb_region r1, r2, small;
	struct kvb_kv_geometry bad = g;

	(void) state;
	assert_int_equal(broker_start(&b, NULL), 0);
	ctx = attach(&b, KVB_ROLE_D);
	assert_int_equal(
		kvb_mem_alloc(ctx, KV_BYTES, KVB_MEM_REMOTE_WRITE, 0, &r1), 0);
	assert_int_equal(
		kvb_mem_alloc(ctx, KV_BYTES, KVB_MEM_REMOTE_WRITE, 1, &r2), 0);
	assert_int_equal(kvb_mem_alloc(ctx, KV_BYTES / 2, 0, 2, &small), 0);
	assert_int_equal(kvb_mem_set_kv(ctx, 0xdead0001u, 0, &g), -ENOENT);
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 0, NULL), -EINVAL);
	bad.layout = 7;
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 0, &bad), -EINVAL);
	bad = g;
	bad.head_dim = 0;
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 0, &bad), -EINVAL);
	assert_int_equal(kvb_mem_set_kv(ctx, small.id, 0, &g), -EINVAL);
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 100000, &g), -EINVAL);
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 0, &g), 0);
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 1, &g), -EEXIST);
	assert_int_equal(kvb_mem_set_kv(ctx, r2.id, 0, &g), -EEXIST);
	assert_int_equal(kvb_mem_set_kv(ctx, r2.id, 1, &g), 0);
	/* the layer is free again once its region is */
	assert_int_equal(kvb_mem_free(ctx, &r1), 0);
	assert_int_equal(
		kvb_mem_alloc(ctx, KV_BYTES, KVB_MEM_REMOTE_WRITE, 0, &r1), 0);
	assert_int_equal(kvb_mem_set_kv(ctx, r1.id, 0, &g), 0);
	kvb_detach(ctx);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

static void test_no_host_ip(void **state)
{
	struct broker b;
	struct kvb_ctx *ctx;
	struct kvb_remote_xfer x = {.mode = KVB_XFER_WRITE};
	uint32_t peer = 0, h = 0, blocks[2] = {0, 1};
	struct kvb_completion c[4];
	static char js[8192];
	int n;

	(void) state;
	assert_int_equal(broker_start(&b, NULL), 0);
	ctx = attach(&b, KVB_ROLE_P);
	assert_int_equal(kvb_peer_connect(ctx, "192.0.2.9", 6301, &peer),
			 -ENOTCONN);
	x.blocks = blocks;
	x.nblocks = 2;
	assert_int_equal(kvb_transfer_open_remote(ctx, "tx-a", &x, &h),
			 -ENOTCONN);
	/* argument checks in the library */
	assert_int_equal(kvb_peer_connect(ctx, "", 6301, &peer), -EINVAL);
	assert_int_equal(kvb_peer_connect(ctx, "192.0.2.9", 0, &peer), -EINVAL);
	x.mode = 5;
	assert_int_equal(kvb_transfer_open_remote(ctx, "tx-a", &x, &h),
			 -EINVAL);
	x.mode = KVB_XFER_WRITE;
	x.flags = 0x80;
	assert_int_equal(kvb_transfer_open_remote(ctx, "tx-a", &x, &h),
			 -EINVAL);
	assert_int_equal(kvb_submit_layer(ctx, 1, 0, 1, 0x80), -EINVAL);
	/* a layer op on a same-node transfer completes with -EINVAL */
	assert_int_equal(kvb_transfer_open(ctx, "tx-local", &h), 0);
	assert_int_equal(kvb_submit_layer(ctx, h, 0, 42, 0), 1);
	n = kvb_wait(ctx, c, 4, 5000);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].kind, KVB_COMP_DESC);
	assert_int_equal(c[0].tag, 42);
	assert_int_equal(c[0].status, -EINVAL);
	assert_true(broker_log_has(&b, "layer op for an unknown or local"));
	/* counted for the broker and for the worker, as any refusal */
	assert_int_equal(broker_stats(&b, js, sizeof(js)), 0);
	assert_int_equal(stat_get(js, "descriptors_refused"), 1);
	assert_non_null(strstr(js, "\"refused\":1,"));
	kvb_detach(ctx);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

static void test_unreachable_peer(void **state)
{
	static const char *const args[] = {
		"--host-ip", "127.0.0.1",     "--handshake-port",
		"16301",     "--notify-port", "16305",
		NULL};
	struct broker_opts o = {.args = args};
	struct broker b;
	struct kvb_ctx *ctx;
	uint32_t peer = 0, h = 0;
	struct kvb_remote_xfer x = {.peer = 7, .mode = KVB_XFER_WRITE};
	uint32_t blocks[1] = {0};

	(void) state;
	assert_int_equal(broker_start(&b, &o), 0);
	ctx = attach(&b, KVB_ROLE_P);
	/* nobody on that port: the handshake times out, the call returns */
	assert_int_equal(kvb_peer_connect(ctx, "127.0.0.1", 16399, &peer),
			 -ETIMEDOUT);
	assert_true(broker_log_has(&b, "no handshake answer"));
	/* an unknown peer number */
	x.blocks = blocks;
	x.nblocks = 1;
	assert_int_equal(kvb_transfer_open_remote(ctx, "tx-b", &x, &h),
			 -ENOENT);
	kvb_detach(ctx);
	assert_int_equal(broker_stop(&b), 0);
	broker_cleanup(&b);
}

/* The notify-port tests' broker, workers and the socket that holds its
 * port: a failed test leaves them to np_teardown() */
#define NP_PORT 16345
#define NP_WAIT 2000 /* ms: NOTIFY_REBIND_NS (bridge/xnode) */
static struct broker np_br;
static struct kvb_ctx *np_w[2];
static int np_fd = -1;

static const char *const np_args[] = {
	"--host-ip", "127.0.0.1", "--handshake-port", "16341", "--notify-port",
	"16345",     NULL};

/* A listening socket on 127.0.0.1:NP_PORT, or -errno */
static int hold_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(NP_PORT)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc;

	if (fd < 0)
		return -errno;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *) &a, sizeof(a)) || listen(fd, 1)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

/* Until the broker's log has s: 0, or -ETIMEDOUT after ms */
static int log_wait(const struct broker *b, const char *s, int ms)
{
	int64_t t0 = now_ns();

	while (!broker_log_has(b, s)) {
		if (ms_since(t0) > ms)
			return -ETIMEDOUT;
		usleep(20000);
	}
	return 0;
}

static int np_teardown(void **state)
{
	(void) state;
	for (int i = 0; i < 2; i++)
		kvb_detach(np_w[i]);
	memset(np_w, 0, sizeof(np_w));
	if (np_br.pid > 0) {
		broker_log_dump(&np_br);
		broker_kill(&np_br);
		broker_cleanup(&np_br);
	}
	if (np_fd >= 0)
		close(np_fd);
	np_fd = -1;
	return 0;
}

/* A passing test's end: its workers detach, the broker exits with 0 */
static void np_end(void)
{
	for (int i = 0; i < 2; i++)
		kvb_detach(np_w[i]);
	memset(np_w, 0, sizeof(np_w));
	assert_int_equal(broker_stop(&np_br), 0);
	broker_cleanup(&np_br);
}

/* The port is freed 300 ms after the worker attached: bound then, and the
 * worker has it (nobody else can bind it) */
static void test_notify_port_freed(void **state)
{
	struct broker_opts o = {.args = np_args};

	(void) state;
	np_fd = hold_port();
	assert_true(np_fd >= 0);
	assert_int_equal(broker_start(&np_br, &o), 0);
	np_w[0] = attach(&np_br, KVB_ROLE_P);
	assert_int_equal(log_wait(&np_br,
				  "notify port 16345 taken: trying again",
				  SLACK),
			 0);
	usleep(300000);
	close(np_fd);
	np_fd = -1;
	assert_int_equal(
		log_wait(&np_br, "notify port 16345 (free after", SLACK), 0);
	assert_false(broker_log_has(&np_br, "unavailable (Address"));
	assert_int_equal(hold_port(), -EADDRINUSE);
	np_end();
}

/* The port stays taken: unavailable, not before NP_WAIT */
static void test_notify_port_kept(void **state)
{
	struct broker_opts o = {.args = np_args};
	int64_t t0;

	(void) state;
	np_fd = hold_port();
	assert_true(np_fd >= 0);
	assert_int_equal(broker_start(&np_br, &o), 0);
	t0 = now_ns();
	np_w[0] = attach(&np_br, KVB_ROLE_P);
	assert_int_equal(log_wait(&np_br,
				  "notify port 16345 unavailable (Address "
				  "already in use)",
				  NP_WAIT + SLACK),
			 0);
	assert_true(ms_since(t0) >= NP_WAIT);
	assert_true(broker_log_has(&np_br, "trying again"));
	assert_false(broker_log_has(&np_br, "free after"));
	np_end();
}

/* Another worker of this broker has it (P and D of the same ranks): no
 * second try, unavailable at once */
static void test_notify_port_own(void **state)
{
	struct broker_opts o = {.args = np_args};

	(void) state;
	assert_int_equal(broker_start(&np_br, &o), 0);
	np_w[0] = attach(&np_br, KVB_ROLE_P);
	assert_int_equal(log_wait(&np_br, "notify port 16345\n", SLACK), 0);
	np_w[1] = attach(&np_br, KVB_ROLE_D);
	assert_int_equal(log_wait(&np_br,
				  "notify port 16345 unavailable (Address "
				  "already in use)",
				  SLACK),
			 0);
	assert_false(broker_log_has(&np_br, "trying again"));
	np_end();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mem_set_kv),
		cmocka_unit_test(test_no_host_ip),
		cmocka_unit_test(test_unreachable_peer),
		cmocka_unit_test_teardown(test_notify_port_freed, np_teardown),
		cmocka_unit_test_teardown(test_notify_port_kept, np_teardown),
		cmocka_unit_test_teardown(test_notify_port_own, np_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

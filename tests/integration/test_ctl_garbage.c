/* SPDX-License-Identifier: MIT */
/*
 * Garbage on the broker's control socket: random bytes, a wrong magic, a
 * wrong length, a wrong protocol version, a request before HELLO, oversized
 * and wrongly sized messages, a bad identity, an unknown type, a second
 * HELLO, fds riding on garbage, OPEN_BATCH messages whose ids do not fill
 * them. Each is refused with a logged reason and
 * counted in messages_rejected; no fd leaks; the broker keeps serving. And
 * a peer with another uid is refused (needs root: skipped otherwise).
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
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"

#define NOBODY 65534

static int64_t rejected; /* what messages_rejected should read */

static int raw_connect(void)
{
	int fd = kvb_ctl_connect(fx.br.sock, 3000);

	assert_true(fd >= 0);
	return fd;
}

/* After a refusal the broker hangs up: the next read sees EOF. */
static void expect_hangup(int fd)
{
	char buf[256];
	int n = kvb_ctl_recv(fd, buf, sizeof(buf), NULL, NULL);

	if (n != -EPIPE && n != -ECONNRESET)
		fail_msg("expected the broker to hang up, got %d", n);
	close(fd);
}

static void send_raw(int fd, const void *p, size_t len, int memfd)
{
	int rc = kvb_ctl_send(fd, p, len, memfd >= 0 ? &memfd : NULL,
			      memfd >= 0 ? 1 : 0);

	assert_int_equal(rc, 0);
}

static void expect_rejected(const char *log_text)
{
	rejected++;
	if (broker_wait_stat(&fx.br, "messages_rejected", rejected, 10000)) {
		broker_log_dump(&fx.br);
		fail_msg("messages_rejected is %lld, want %lld (%s)",
			 (long long) broker_stat(&fx.br, "messages_rejected"),
			 (long long) rejected, log_text);
	}
	if (log_text && !broker_log_has(&fx.br, log_text)) {
		broker_log_dump(&fx.br);
		fail_msg("broker log lacks '%s'", log_text);
	}
}

static void hello_init(struct kvb_msg_hello *m)
{
	kvb_msg_init(&m->h, KVB_MSG_HELLO, sizeof(*m));
	m->role = KVB_ROLE_P;
	m->tp_size = 1;
	m->pid = (uint32_t) getpid();
}

static void test_random_bytes(void **state)
{
	unsigned char junk[200];
	int fd = raw_connect();

	(void) state;
	srand(12345);
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char) rand();
	send_raw(fd, junk, sizeof(junk), -1);
	expect_hangup(fd);
	expect_rejected("garbage on the control socket");

	/* shorter than a header */
	fd = raw_connect();
	send_raw(fd, "KVB", 3, -1);
	expect_hangup(fd);
	expect_rejected(NULL);
}

static void test_wrong_magic_and_length(void **state)
{
	struct kvb_msg_hello m;
	int fd;

	(void) state;
	hello_init(&m);
	m.h.magic = 0x12345678;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	expect_hangup(fd);
	expect_rejected("bad magic");

	/* the header's length disagrees with the packet */
	hello_init(&m);
	m.h.len = sizeof(m) + 8;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	expect_hangup(fd);
	expect_rejected(NULL);
}

static void test_wrong_version(void **state)
{
	struct kvb_msg_hello m;
	struct kvb_msg_hdr rep;
	int fd, n;

	(void) state;
	hello_init(&m);
	m.h.version = 99;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	/* told why (-EPROTO), then hung up on */
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(n, sizeof(rep));
	assert_int_equal(
		kvb_ctl_check_reply(&rep, n, KVB_MSG_HELLO, sizeof(rep)),
		-EPROTO);
	assert_int_equal(rep.version, KVB_PROTO_VERSION);
	expect_hangup(fd);
	expect_rejected("protocol version 99");
}

static void test_before_hello(void **state)
{
	struct kvb_msg_open o;
	struct kvb_msg_mem_reg r;
	int fd, memfd;

	(void) state;
	kvb_msg_init(&o.h, KVB_MSG_OPEN, sizeof(o));
	o.id_len = 3;
	memcpy(o.id, "abc", 3);
	fd = raw_connect();
	send_raw(fd, &o, sizeof(o), -1);
	expect_hangup(fd);
	expect_rejected("request before HELLO");

	/* a MEM_REG with an fd before HELLO: refused, the fd not kept */
	memfd = memfd_create("kvb-test", MFD_CLOEXEC);
	assert_true(memfd >= 0);
	assert_int_equal(ftruncate(memfd, 4096), 0);
	kvb_msg_init(&r.h, KVB_MSG_MEM_REG, sizeof(r));
	r.size = 4096;
	fd = raw_connect();
	send_raw(fd, &r, sizeof(r), memfd);
	expect_hangup(fd);
	expect_rejected(NULL);
	/* garbage carrying an fd */
	fd = raw_connect();
	send_raw(fd, "garbage-with-an-fd-attached", 27, memfd);
	expect_hangup(fd);
	expect_rejected(NULL);
	close(memfd);
	assert_int_equal(proc_fd_wait(fx.br.pid, BROKER_IDLE_FDS, 10000),
			 BROKER_IDLE_FDS);
}

static void test_sizes(void **state)
{
	static char big[KVB_MSG_MAX + 4096];
	struct kvb_msg_hello m;
	struct kvb_msg_hdr rep;
	int fd, n;

	(void) state;
	/* bigger than any control message */
	kvb_msg_init((struct kvb_msg_hdr *) big, KVB_MSG_HELLO, sizeof(big));
	fd = raw_connect();
	send_raw(fd, big, sizeof(big), -1);
	expect_hangup(fd);
	expect_rejected("oversized");

	/* a HELLO a few bytes short (header consistent with the packet) */
	hello_init(&m);
	m.h.len = sizeof(m) - 4;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m) - 4, -1);
	expect_hangup(fd);
	expect_rejected("wrong size");

	/* a well-formed HELLO with an impossible identity */
	hello_init(&m);
	m.tp_rank = 5;
	m.tp_size = 2;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep, n, KVB_MSG_HELLO, sizeof(rep)),
		-EINVAL);
	expect_hangup(fd);
	expect_rejected("HELLO refused");

	/* ring sizes that are not powers of two */
	hello_init(&m);
	m.sq_entries = 1000;
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep, n, KVB_MSG_HELLO, sizeof(rep)),
		-EINVAL);
	expect_hangup(fd);
	expect_rejected(NULL);
}

/* A HELLO by hand: the connected, attached socket. */
static int hand_attach(void)
{
	struct kvb_msg_hello m;
	struct kvb_msg_hello_reply rep;
	int fds[3] = {-1, -1, -1};
	unsigned nfds = 3;
	int fd, n;

	hello_init(&m);
	fd = raw_connect();
	send_raw(fd, &m, sizeof(m), -1);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), fds, &nfds);
	assert_int_equal(
		kvb_ctl_check_reply(&rep.h, n, KVB_MSG_HELLO, sizeof(rep)), 0);
	assert_int_equal(nfds, 3);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	return fd;
}

/* A proper HELLO by hand, then nonsense from an attached worker. */
static void test_after_hello(void **state)
{
	struct kvb_msg_hello m;
	struct kvb_msg_hdr h;
	int fd;

	(void) state;
	fd = hand_attach();
	assert_int_equal(broker_stat(&fx.br, "workers"), 1);
	kvb_msg_init(&h, 99, sizeof(h));
	send_raw(fd, &h, sizeof(h), -1);
	expect_hangup(fd);
	expect_rejected("unknown control message type");
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);

	/* a second HELLO */
	fd = hand_attach();
	hello_init(&m);
	send_raw(fd, &m, sizeof(m), -1);
	expect_hangup(fd);
	expect_rejected("second HELLO");
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
}

/* OPEN_BATCH of n ids given as (length byte, bytes) records in rec[0..len) */
static void open_batch_send(int fd, uint32_t n, const void *rec, size_t len)
{
	static char buf[sizeof(struct kvb_msg_open_batch) + 512];
	struct kvb_msg_open_batch *m = (struct kvb_msg_open_batch *) buf;

	assert_true(len <= 512);
	kvb_msg_init(&m->h, KVB_MSG_OPEN_BATCH, sizeof(*m));
	m->n = n;
	memcpy(m + 1, rec, len);
	m->h.len = (uint32_t) (sizeof(*m) + len);
	send_raw(fd, buf, m->h.len, -1);
}

/* Wrongly built OPEN_BATCH messages: n out of range is answered -EINVAL;
 * ids that do not fill the message exactly get the worker dropped. */
static void test_open_batch_garbage(void **state)
{
	static union {
		struct kvb_msg_open_batch_reply r;
		char raw[sizeof(struct kvb_msg_open_batch_reply) +
			 4 * sizeof(struct kvb_open_result)];
	} rep;
	const char two[] = "\3abc\2de";	   /* "abc", "de" */
	const char zero[] = "\3abc\0\2de"; /* "abc", "", "de" */
	int fd, n;

	(void) state;
	fd = hand_attach();
	/* n = 0 and n = 65: -EINVAL, the connection kept */
	open_batch_send(fd, 0, "", 0);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(kvb_ctl_check_reply(&rep.r.h, n, KVB_MSG_OPEN_BATCH,
					     sizeof(rep.r)),
			 -EINVAL);
	open_batch_send(fd, KVB_OPEN_BATCH_MAX + 1, two, sizeof(two) - 1);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(kvb_ctl_check_reply(&rep.r.h, n, KVB_MSG_OPEN_BATCH,
					     sizeof(rep.r)),
			 -EINVAL);
	/* an empty id among good ones: its own -EINVAL, the others opened */
	open_batch_send(fd, 3, zero, sizeof(zero) - 1);
	n = kvb_ctl_recv(fd, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep.r.h, n, KVB_MSG_OPEN_BATCH,
				    sizeof(rep.r) + 3 * sizeof(rep.r.res[0])),
		0);
	assert_int_equal(rep.r.n, 3);
	assert_int_equal(rep.r.res[0].status, 0);
	assert_int_equal(rep.r.res[1].status, -EINVAL);
	assert_int_equal(rep.r.res[2].status, 0);
	assert_int_not_equal(rep.r.res[0].handle, rep.r.res[2].handle);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rejected);
	/* n = 3 but two ids: dropped */
	open_batch_send(fd, 3, two, sizeof(two) - 1);
	expect_hangup(fd);
	expect_rejected("OPEN_BATCH: the ids do not fill the message");
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
	/* an id running past the end (length 9, 2 bytes left): dropped */
	fd = hand_attach();
	open_batch_send(fd, 2, "\3abc\11de", 7);
	expect_hangup(fd);
	expect_rejected(NULL);
	/* bytes left over after the n ids: dropped */
	fd = hand_attach();
	open_batch_send(fd, 1, two, sizeof(two) - 1);
	expect_hangup(fd);
	expect_rejected(NULL);
	/* shorter than the batch header: dropped */
	fd = hand_attach();
	{
		struct kvb_msg_open_batch m;

		kvb_msg_init(&m.h, KVB_MSG_OPEN_BATCH, sizeof(m));
		m.h.len = sizeof(m.h);
		send_raw(fd, &m, sizeof(m.h), -1);
	}
	expect_hangup(fd);
	expect_rejected("control message of the wrong size");
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
}

/* After all that, a normal worker attaches and works; nothing leaked. */
static void test_still_serving(void **state)
{
	struct kvb_region a, b;
	struct kvb_completion c[4];
	struct kvb_ctx *ctx;
	struct kvb_desc d;
	int fd;

	(void) state;
	/* a connection that just closes: a goodbye; an empty packet is a
	 * message (SOCK_SEQPACKET) without a header: refused and counted */
	fd = raw_connect();
	close(fd);
	fd = raw_connect();
	assert_int_equal(send(fd, "", 0, 0), 0);
	expect_hangup(fd);
	expect_rejected("zero-length message");
	assert_int_equal(broker_stat(&fx.br, "ctl_empty_messages"), 1);

	ctx = w_attach(&fx.br, KVB_ROLE_P, 0, 1, 0);
	assert_non_null(ctx);
	assert_int_equal(kvb_mem_alloc(ctx, 65536, 0, 1, &a), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 65536, 0, 2, &b), 0);
	pattern_fill(a.addr, 65536, 9, 0);
	d = (struct kvb_desc){
		.region = a.id, .peer_region = b.id, .len = 65536, .tag = 5};
	assert_int_equal(kvb_submit_write(ctx, &d, 1), 1);
	assert_int_equal(w_collect(ctx, c, 1, 5000), 1);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(pattern_check(b.addr, 65536, 9, 0), 0);
	kvb_detach(ctx);
	assert_int_equal(broker_wait_stat(&fx.br, "workers", 0, 10000), 0);
	assert_int_equal(broker_stat(&fx.br, "regions"), 0);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rejected);
	/* stdio, listen socket, epoll, eventfd, signalfd: nothing else */
	{
		int nfd = proc_fd_wait(fx.br.pid, BROKER_IDLE_FDS, 10000);

		if (nfd != BROKER_IDLE_FDS) {
			char cmd[64];

			snprintf(cmd, sizeof(cmd), "ls -l /proc/%d/fd >&2",
				 (int) fx.br.pid);
			if (system(cmd) != 0)
				fprintf(stderr, "(ls failed)\n");
			fail_msg("broker holds %d fds", nfd);
		}
	}
}

/* A broker running as nobody refuses root. */
static void test_other_uid(void **state)
{
	const struct broker_opts o = {.uid = NOBODY};
	static char js[KVB_MSG_MAX];
	struct broker nb;
	struct kvb_ctx *ctx;
	int rc;

	(void) state;
	if (geteuid() != 0)
		skip();
	rc = broker_start(&nb, &o);
	if (rc) {
		broker_cleanup(&nb);
		fail_msg("broker as uid %d: %s", NOBODY, strerror(-rc));
	}
	ctx = w_attach(&nb, KVB_ROLE_P, 0, 1, 0);
	rc = ctx ? 0 : -errno;
	if (ctx)
		kvb_detach(ctx);
	/* -EACCES: the library refuses a broker of another uid itself */
	if (rc != -EACCES) {
		broker_log_dump(&nb);
		broker_kill(&nb);
		broker_cleanup(&nb);
		fail_msg("attach as root to a nobody broker: %d", rc);
	}
	/* our STATS is refused too; its own uid may ask */
	assert_int_not_equal(broker_stats(&nb, js, sizeof(js)), 0);
	assert_int_equal(broker_stats_as(&nb, NOBODY, js, sizeof(js)), 0);
	assert_int_equal(stat_get(js, "workers"), 0);
	/* the attach and the STATS: two refusals */
	assert_int_equal(stat_get(js, "messages_rejected"), 2);
	assert_true(broker_log_has(&nb, "refused connection"));
	assert_true(broker_log_has(&nb, "uid 0"));
	assert_int_equal(broker_stop(&nb), 0);
	broker_cleanup(&nb);
}

/* Lines of the broker's log that contain s. */
static int log_count(const struct broker *b, const char *s)
{
	char line[512];
	FILE *f = fopen(b->log, "r");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

/*
 * --max-workers: a connection past the limit is refused, counted and
 * logged (a line a second at most, however often it retries); a slot that
 * frees up is taken again.
 */
static struct broker mw_br; /* killed by teardown if a check failed */

static int mw_teardown(void **state)
{
	(void) state;
	if (mw_br.pid > 0) {
		broker_kill(&mw_br);
		broker_cleanup(&mw_br);
	}
	return 0;
}

static void test_max_workers(void **state)
{
	static const char *const args[] = {"--max-workers", "2", NULL};
	const struct broker_opts o = {.args = args};
	struct broker *const nb_ = &mw_br;
	struct kvb_ctx *a, *b, *c;
	int rc, lines;

	(void) state;
	rc = broker_start(nb_, &o);
	if (rc) {
		broker_cleanup(nb_);
		fail_msg("broker --max-workers 2: %s", strerror(-rc));
	}
	a = w_attach(nb_, KVB_ROLE_P, 0, 1, 0);
	b = w_attach(nb_, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(a);
	assert_non_null(b);
	for (int i = 0; i < 5; i++) {
		/* an identity of its own (a duplicate is refused first) */
		c = w_attach(nb_, KVB_ROLE_P, 1, 2, 0);
		assert_null(c);
		assert_int_equal(errno, ECONNREFUSED);
	}
	kvb_detach(b);
	/* stats take a connection too: one slot is free now */
	assert_int_equal(broker_wait_stat(nb_, "workers", 1, 5000), 0);
	/* 5, or more where a stats connection came before the detach */
	assert_true(broker_stat(nb_, "messages_rejected") >= 5);
	assert_true(broker_log_has(nb_, "workers attached (--max-workers"));
	/* the 5 attempts took well under a second: one or two lines */
	lines = log_count(nb_, "workers attached (--max-workers");
	assert_true(lines >= 1 && lines <= 2);
	c = w_attach(nb_, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(c);
	kvb_detach(c);
	kvb_detach(a);
	rc = broker_stop(nb_);
	nb_->pid = 0;
	assert_int_equal(rc, 0);
	broker_cleanup(nb_);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_bytes),
		cmocka_unit_test(test_wrong_magic_and_length),
		cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_before_hello),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_after_hello),
		cmocka_unit_test(test_open_batch_garbage),
		cmocka_unit_test(test_still_serving),
		cmocka_unit_test(test_other_uid),
		cmocka_unit_test_teardown(test_max_workers, mw_teardown),
	};

	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * The notify endpoint over loopback: both offset-formula ports, good and bad
 * messages, counters, the DEALER cache, bounded sends, never a reply.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "zmq/notify.h"

#define HOST "127.0.0.1"

struct seen {
	int n;
	enum kvb_zmsg_type type[64];
	uint32_t flags[64];
	char tid[64][KVB_ZMSG_ID_MAX + 1];
	uint16_t port[64];
	uint32_t nblocks[64];
	int logs;
};

static int on_msg(void *arg, const struct kvb_zmsg *m, uint16_t port)
{
	struct seen *s = arg;

	if (!strcmp(m->transfer_id, "refuse-me"))
		return -EPROTO;
	if (s->n < 64) {
		s->type[s->n] = m->type;
		s->flags[s->n] = m->flags;
		strcpy(s->tid[s->n], m->transfer_id);
		s->port[s->n] = port;
		s->nblocks[s->n] = m->nblocks;
	}
	s->n++;
	return 0;
}

static void on_log(void *arg, int level, const char *line)
{
	struct seen *s = arg;

	s->logs++;
	if (getenv("KVB_TEST_VERBOSE"))
		fprintf(stderr, "log(%d): %s\n", level, line);
}

static uint32_t test_base;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Poll the endpoint's fds and drain until `want` payloads were read. */
static void pump(struct kvb_notify *n, uint64_t want)
{
	struct kvb_notify_stats st;
	struct pollfd pfd[KVB_NOTIFY_MAX_SOCKS];
	int fds[KVB_NOTIFY_MAX_SOCKS], nfd, i;
	uint64_t end = now_ms() + 5000;

	nfd = kvb_notify_fds(n, fds, KVB_NOTIFY_MAX_SOCKS);
	assert_true(nfd >= 1);
	for (;;) {
		while (kvb_notify_recv(n, 8) == 8)
			;
		kvb_notify_get_stats(n, &st);
		if (st.messages_received >= want)
			return;
		assert_true(now_ms() < end);
		for (i = 0; i < nfd; i++)
			pfd[i] =
				(struct pollfd){.fd = fds[i], .events = POLLIN};
		poll(pfd, (nfds_t) nfd, 50);
	}
}

static void conf_for(struct kvb_notify_conf *c, struct seen *s, uint32_t dp,
		     uint32_t tp, uint32_t tps)
{
	memset(c, 0, sizeof(*c));
	c->host_ip = HOST;
	c->notify_port = test_base;
	c->dp_rank = dp;
	c->tp_rank = tp;
	c->tp_size = tps;
	c->on_msg = on_msg;
	c->on_log = on_log;
	c->arg = s;
}

/* A raw DEALER, as a foreign peer, connected to port. */
static void *raw_dealer(void *ctx, unsigned int port)
{
	char ep[64];
	int linger = 0;
	void *s = zmq_socket(ctx, ZMQ_DEALER);

	assert_non_null(s);
	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
	snprintf(ep, sizeof(ep), "tcp://" HOST ":%u", port);
	assert_int_equal(zmq_connect(s, ep), 0);
	return s;
}

static void raw_send(void *s, const void *p, size_t n)
{
	assert_int_equal(zmq_send(s, p, n, 0), (int) n);
}

static void test_ports_and_alias(void **state)
{
	struct kvb_notify *a, *b, *c;
	struct kvb_notify_conf conf;
	struct seen s = {0};
	uint16_t ports[4];
	int fds[4];

	/* dp=1 tp=1 of TP=2: base+3 (dp*tp_size+tp) and base+2 (dp+tp) */
	conf_for(&conf, &s, 1, 1, 2);
	assert_int_equal(kvb_notify_open(&a, &conf), 0);
	assert_int_equal(kvb_notify_ports(a, ports, 4), 2);
	assert_int_equal(ports[0], test_base + 3);
	assert_int_equal(ports[1], test_base + 2);
	assert_int_equal(kvb_notify_fds(a, fds, 4), 2);
	assert_int_equal(kvb_notify_fds(a, fds, 1), -ENOSPC);

	/* dp=0 tp=1: both formulas agree: one socket */
	conf_for(&conf, &s, 0, 1, 2);
	assert_int_equal(kvb_notify_open(&b, &conf), 0);
	assert_int_equal(kvb_notify_ports(b, ports, 4), 1);
	assert_int_equal(ports[0], test_base + 1);

	/* dp=2 tp=0: alias base+2 is a's; tolerated, logged */
	conf_for(&conf, &s, 2, 0, 2);
	s.logs = 0;
	assert_int_equal(kvb_notify_open(&c, &conf), 0);
	assert_int_equal(kvb_notify_ports(c, ports, 4), 1);
	assert_int_equal(ports[0], test_base + 4);
	assert_true(s.logs >= 1);
	assert_int_equal(kvb_notify_bind_alias(c), -EADDRINUSE);
	kvb_notify_close(c);

	/* the same identity twice: its primary port is taken */
	conf_for(&conf, &s, 1, 1, 2);
	assert_int_equal(kvb_notify_open(&c, &conf), -EADDRINUSE);

	/* deferred alias */
	kvb_notify_close(a);
	conf_for(&conf, &s, 1, 1, 2);
	conf.defer_alias = true;
	assert_int_equal(kvb_notify_open(&a, &conf), 0);
	assert_int_equal(kvb_notify_ports(a, ports, 4), 1);
	assert_int_equal(kvb_notify_bind_alias(a), 0);
	assert_int_equal(kvb_notify_ports(a, ports, 4), 2);
	assert_int_equal(kvb_notify_bind_alias(a), 0);

	/* bad configurations */
	conf_for(&conf, &s, 0, 2, 2);
	assert_int_equal(kvb_notify_open(&c, &conf), -EINVAL);
	conf_for(&conf, &s, 0, 0, 1);
	conf.on_msg = NULL;
	assert_int_equal(kvb_notify_open(&c, &conf), -EINVAL);
	conf_for(&conf, &s, 0, 0, 1);
	conf.host_ip = "bad host";
	assert_int_equal(kvb_notify_open(&c, &conf), -EINVAL);
	conf_for(&conf, &s, 65535, 0, 1); /* port base + 65535 */
	assert_int_equal(kvb_notify_open(&c, &conf), -ERANGE);

	kvb_notify_close(a);
	kvb_notify_close(b);
}

static void test_loopback(void **state)
{
	const uint32_t ids[] = {1, 2, 3};
	struct kvb_notify *rx, *tx;
	struct kvb_notify_conf conf;
	struct kvb_notify_stats st;
	struct seen s = {0}, t = {0};
	struct kvb_zmsg m;
	uint32_t p_main = test_base + 3, p_alias = test_base + 2;
	void *ctx, *raw;
	int i;

	conf_for(&conf, &s, 1, 1, 2);
	assert_int_equal(kvb_notify_open(&rx, &conf), 0);
	/* the sender: another identity, on other ports */
	conf_for(&conf, &t, 0, 0, 1);
	conf.notify_port = test_base + 6;
	assert_int_equal(kvb_notify_open(&tx, &conf), 0);

	/* good messages, both ports */
	kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-a");
	strcpy(m.req_id, "req-a");
	kvb_zmsg_set_blocks(&m, ids, 3);
	m.decode_rank = 1;
	assert_int_equal(kvb_notify_send(tx, HOST, p_main, &m), 0);
	m.flags = KVB_ZMSG_F_UNTYPED;
	assert_int_equal(kvb_notify_send(tx, HOST, p_alias, &m), 0);
	kvb_zmsg_fini(&m);
	kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-b");
	assert_int_equal(kvb_notify_send(tx, HOST, p_main, &m), 0);
	kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-c");
	m.flags = KVB_ZMSG_F_CONSUMER_TP;
	m.consumer_tp_size = 4;
	assert_int_equal(kvb_notify_send(tx, HOST, p_main, &m), 0);
	kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-d");
	m.flags = KVB_ZMSG_F_TP_RANK;
	m.tp_rank = 1;
	assert_int_equal(kvb_notify_send(tx, HOST, p_alias, &m), 0);
	pump(rx, 5);

	kvb_notify_get_stats(rx, &st);
	assert_int_equal(st.messages_accepted, 5);
	assert_int_equal(st.messages_rejected, 0);
	assert_int_equal(s.n, 5);
	/* per-socket order is kept; across the two sockets it is not */
	for (i = 0; i < 5; i++) {
		if (!strcmp(s.tid[i], "tx-a") && s.port[i] == p_main) {
			assert_int_equal(s.type[i], KVB_ZMSG_REMOTE_BLOCKS);
			assert_int_equal(s.nblocks[i], 3);
			assert_false(s.flags[i] & KVB_ZMSG_F_UNTYPED);
		} else if (!strcmp(s.tid[i], "tx-a")) {
			assert_int_equal(s.port[i], p_alias);
			assert_true(s.flags[i] & KVB_ZMSG_F_UNTYPED);
		} else if (!strcmp(s.tid[i], "tx-d")) {
			assert_int_equal(s.type[i], KVB_ZMSG_PLAIN);
			assert_int_equal(s.port[i], p_alias);
		}
	}
	kvb_notify_get_stats(tx, &st);
	assert_int_equal(st.messages_sent, 5);
	assert_int_equal(st.peers, 2); /* one DEALER per path, reused */

	/* bad input from a foreign peer: each counted, none kills anything */
	ctx = zmq_ctx_new();
	raw = raw_dealer(ctx, p_main);
	raw_send(raw, "\xc1\xc1\xc1", 3); /* garbage */
	raw_send(raw, "tx-\xff\xfe", 5);  /* not UTF-8 */
	raw_send(raw, "\x82\xa4type\xa3zzz\xabtransfer_id\xa1x", 24);
	raw_send(raw, "\x81\xabtransfer_id\xa1x", 15); /* no type */
	raw_send(raw, "\x82\xa4type\xaawrite_done\xabtransfer_id\xa1x!",
		 33);	      /* trailing */
	raw_send(raw, "", 0); /* empty */
	{
		/* release with consumer_tp_size 0 */
		static const char rel0[] =
			"\x83\xa4type\xa7release\xabtransfer_id\xa1x"
			"\xb0"
			"consumer_tp_size\x00";

		raw_send(raw, rel0, sizeof(rel0) - 1);
	}
	{
		/* remote_blocks with an empty block list */
		static const char rb0[] =
			"\x84\xabtransfer_id\xa1x\xa6req_id\xa1r"
			"\xb1"
			"block_notify_list\x90\xab"
			"decode_rank\x00";

		raw_send(raw, rb0, sizeof(rb0) - 1);
	}
	/* four frames: identity + 3 parts */
	assert_int_equal(zmq_send(raw, "a", 1, ZMQ_SNDMORE), 1);
	assert_int_equal(zmq_send(raw, "b", 1, ZMQ_SNDMORE), 1);
	assert_int_equal(zmq_send(raw, "tx-e", 4, 0), 4);
	/* refused by the handler */
	raw_send(raw, "refuse-me", 9);
	/* an empty delimiter frame (REQ style) before a good payload */
	assert_int_equal(zmq_send(raw, "", 0, ZMQ_SNDMORE), 0);
	assert_int_equal(zmq_send(raw, "tx-f", 4, 0), 4);
	/* and a good message after all that */
	raw_send(raw, "tx-g:tp0", 8);
	pump(rx, 5 + 12);

	kvb_notify_get_stats(rx, &st);
	assert_int_equal(st.messages_received, 17);
	assert_int_equal(st.messages_rejected, 10);
	assert_int_equal(st.messages_accepted, 7);
	assert_string_equal(s.tid[5], "tx-f");
	assert_string_equal(s.tid[6], "tx-g");
	assert_true(s.logs >= 10);

	/* never a reply on the notify socket */
	{
		char buf[16];

		assert_int_equal(zmq_recv(raw, buf, sizeof(buf), ZMQ_DONTWAIT),
				 -1);
		assert_int_equal(errno, EAGAIN);
	}
	zmq_close(raw);
	zmq_ctx_term(ctx);

	/* the sender refuses bad messages and bad addresses */
	kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-h");
	m.flags = KVB_ZMSG_F_CONSUMER_TP;
	assert_int_equal(kvb_notify_send(tx, HOST, p_main, &m), -EINVAL);
	m.flags = 0;
	assert_int_equal(kvb_notify_send(tx, "bad host", p_main, &m), -EINVAL);
	assert_int_equal(kvb_notify_send(tx, HOST, 0, &m), -EINVAL);
	assert_int_equal(kvb_notify_send(tx, HOST, 70000, &m), -EINVAL);
	kvb_notify_get_stats(tx, &st);
	assert_int_equal(st.send_errors, 4);

	kvb_notify_close(tx);
	kvb_notify_close(rx);
}

static void test_send_bounded(void **state)
{
	struct kvb_notify *tx;
	struct kvb_notify_conf conf;
	struct kvb_notify_stats st;
	struct seen t = {0};
	struct kvb_zmsg m;
	uint64_t t0;
	int i, ret = 0;

	conf_for(&conf, &t, 0, 0, 1);
	conf.notify_port = test_base + 7;
	conf.sndhwm = 4;
	conf.max_peers = 2;
	assert_int_equal(kvb_notify_open(&tx, &conf), 0);
	kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-x");

	/* nobody listens on base+5: the queue fills, send says -EAGAIN */
	t0 = now_ms();
	for (i = 0; i < 10000; i++) {
		ret = kvb_notify_send(tx, HOST, test_base + 5, &m);
		if (ret)
			break;
	}
	assert_int_equal(ret, -EAGAIN);
	assert_true(i >= 1);
	assert_true(now_ms() - t0 < 2000);

	/* the cache is bounded: the least recently used peer goes */
	assert_int_equal(kvb_notify_send(tx, HOST, test_base + 8, &m), 0);
	assert_int_equal(kvb_notify_send(tx, HOST, test_base + 9, &m), 0);
	kvb_notify_get_stats(tx, &st);
	assert_int_equal(st.peers, 2);
	assert_int_equal(st.peer_evictions, 1);
	/* base+9 is still cached, base+8 is: no eviction */
	assert_int_equal(kvb_notify_send(tx, HOST, test_base + 9, &m), 0);
	assert_int_equal(kvb_notify_send(tx, HOST, test_base + 8, &m), 0);
	kvb_notify_get_stats(tx, &st);
	assert_int_equal(st.peer_evictions, 1);

	t0 = now_ms();
	kvb_notify_close(tx); /* linger is short: close does not hang */
	assert_true(now_ms() - t0 < 2000);
}

static void test_flood_keeps_serving(void **state)
{
	struct kvb_notify *rx;
	struct kvb_notify_conf conf;
	struct kvb_notify_stats st;
	struct seen s = {0};
	uint8_t junk[64];
	void *ctx, *raw;
	int i, k;

	conf_for(&conf, &s, 0, 0, 1);
	conf.notify_port = test_base + 10;
	assert_int_equal(kvb_notify_open(&rx, &conf), 0);
	ctx = zmq_ctx_new();
	raw = raw_dealer(ctx, test_base + 10);
	srand(7);
	for (i = 0; i < 2000; i++) {
		for (k = 0; k < (int) sizeof(junk); k++)
			junk[k] = (uint8_t) (0x80 | rand());
		junk[0] = 0xc1; /* never msgpack, never UTF-8 */
		raw_send(raw, junk, 1 + (size_t) (rand() % 63));
	}
	raw_send(raw, "tx-last", 7);
	pump(rx, 2001);
	kvb_notify_get_stats(rx, &st);
	assert_int_equal(st.messages_rejected, 2000);
	assert_int_equal(st.messages_accepted, 1);
	assert_string_equal(s.tid[0], "tx-last");
	/* the log is rate limited */
	assert_true(s.logs < 200);
	assert_true(st.logs_suppressed > 0);
	zmq_close(raw);
	zmq_ctx_term(ctx);
	kvb_notify_close(rx);
}

/* sender_ok: a message whose sender it refuses is rejected undecoded;
 * it sees the sender's address */
static char seen_addr[64];
static int trust;

static bool sender_ok(void *arg, const char *addr)
{
	(void) arg;
	snprintf(seen_addr, sizeof(seen_addr), "%s", addr);
	return trust;
}

static void test_sender_check(void **state)
{
	struct kvb_notify *rx;
	struct kvb_notify_conf conf;
	struct kvb_notify_stats st;
	struct seen s = {0};
	void *ctx, *raw;

	(void) state;
	conf_for(&conf, &s, 0, 0, 1);
	conf.notify_port = test_base + 20;
	conf.sender_ok = sender_ok;
	assert_int_equal(kvb_notify_open(&rx, &conf), 0);
	ctx = zmq_ctx_new();
	raw = raw_dealer(ctx, test_base + 20);
	trust = 0;
	raw_send(raw, "tx-untrusted", 12);
	pump(rx, 1);
	kvb_notify_get_stats(rx, &st);
	assert_int_equal(st.messages_rejected, 1);
	assert_int_equal(s.n, 0);
	assert_string_equal(seen_addr, HOST);
	trust = 1;
	raw_send(raw, "tx-trusted", 10);
	pump(rx, 2);
	kvb_notify_get_stats(rx, &st);
	assert_int_equal(st.messages_rejected, 1);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.tid[0], "tx-trusted");
	zmq_close(raw);
	zmq_ctx_term(ctx);
	kvb_notify_close(rx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ports_and_alias),
		cmocka_unit_test(test_loopback),
		cmocka_unit_test(test_send_bounded),
		cmocka_unit_test(test_flood_keeps_serving),
		cmocka_unit_test(test_sender_check),
	};
	const char *env = getenv("KVB_TEST_PORT_BASE");

	/* below the kernel's ephemeral range (32768-60999), which outgoing
	 * connections draw from; spread by pid so parallel runs do not collide
	 */
	test_base = env ? (uint32_t) atoi(env)
			: 20000u + (uint32_t) (getpid() % 1000) * 12u;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

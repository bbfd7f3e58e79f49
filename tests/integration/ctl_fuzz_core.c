/* SPDX-License-Identifier: MIT */
/*
 * test_ctl_fuzz, part two: the shared state, randomness, the trace and
 * failure report, the model of regions and peers, the wire (send, replies,
 * late PEER replies) and connections. See test_ctl_fuzz.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"
#include "ctl_fuzz.h"

struct broker br;
uint16_t hs_port, notify_port, dead_port[2];
uint64_t seed, rng;
uint64_t msgs, max_msgs = 50000;
int64_t t_start, max_ms = 20000;
struct conn conns[NCONN];
struct reg regs[MAX_REGS];
uint32_t nregs;
uint32_t dead_ids[NDEAD], ndead;
uint32_t peers[NPEERS], npeers;
int fd_good, fd_short, fd_unsealed, fd_other;
int base_fds, base_maps, max_fds, max_maps;
int trace_all;
char rbuf[KVB_MSG_MAX];
struct fuzz_stats st;

const char *const type_name[] = {
	"?",	 "HELLO", "MEM_REG", "MEM_DEREG", "MEM_LOOKUP", "OPEN",
	"STATS", "BYE",	  "MEM_KV",  "PEER",	  "XOPEN",	"OPEN_BATCH",
};

static char trace[TRACE_LINES][TRACE_LEN];
static uint32_t ntrace;

/* ------------------------------------------------------------------ */
/* randomness, trace, failure */

uint64_t rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint32_t below(uint32_t n)
{
	return (uint32_t) (rnd() % n);
}

int chance(unsigned pct)
{
	return below(100) < pct;
}

/* A 32-bit field: a boundary value, small, or anything. */
uint32_t edge32(void)
{
	static const uint32_t v[] = {
		0,	   1,	  2,	 255,	     256,	 4095,
		4096,	   65535, 65536, 0x7fffffff, 0x80000000, UINT32_MAX - 1,
		UINT32_MAX};

	if (chance(60))
		return v[below(sizeof(v) / sizeof(v[0]))];
	return chance(50) ? below(16) : (uint32_t) rnd();
}

void tracef(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(trace[ntrace % TRACE_LINES], TRACE_LEN, fmt, ap);
	va_end(ap);
	if (trace_all)
		fprintf(stderr, "  %s\n", trace[ntrace % TRACE_LINES]);
	ntrace++;
}

void fuzz_fail(int line, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	fprintf(stderr, "test_ctl_fuzz: seed %#llx, message %llu: last %u:\n",
		(unsigned long long) seed, (unsigned long long) msgs,
		ntrace < TRACE_LINES ? ntrace : TRACE_LINES);
	for (uint32_t i = ntrace > TRACE_LINES ? ntrace - TRACE_LINES : 0;
	     i < ntrace; i++)
		fprintf(stderr, "  %s\n", trace[i % TRACE_LINES]);
	broker_log_dump(&br);
	fail_msg("line %d: %s (KVB_FUZZ_SEED=%#llx to repeat)", line, why,
		 (unsigned long long) seed);
}

/* ------------------------------------------------------------------ */
/* the model */

struct reg *reg_find(uint32_t id)
{
	for (uint32_t i = 0; i < nregs; i++)
		if (regs[i].id == id)
			return &regs[i];
	return NULL;
}

void reg_gone(struct reg *r)
{
	dead_ids[ndead++ % NDEAD] = r->id;
	*r = regs[--nregs];
}

uint32_t own_regs(int ci)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < nregs; i++)
		n += regs[i].conn == ci;
	return n;
}

/* A region id: own live, another's live, gone, a neighbour of a live one
 * (same slot, other generation), or a boundary value. */
uint32_t pick_region(int ci)
{
	uint32_t k = below(8), n = own_regs(ci);

	if (k < 3 && n) {
		n = below(n);
		for (uint32_t i = 0; i < nregs; i++)
			if (regs[i].conn == ci && !n--)
				return regs[i].id;
	}
	if (k < 5 && nregs)
		return regs[below(nregs)].id;
	if (k < 6 && ndead)
		return dead_ids[below(ndead < NDEAD ? ndead : NDEAD)];
	if (k < 7 && nregs)
		return regs[below(nregs)].id ^ (1u << (16 + below(16)));
	return edge32();
}

int layer_taken(int ci, uint32_t layer)
{
	for (uint32_t i = 0; i < nregs; i++)
		if (regs[i].conn == ci && regs[i].has_kv &&
		    regs[i].layer == layer)
			return 1;
	return 0;
}

uint32_t pick_peer(void)
{
	if (npeers && chance(70)) {
		uint32_t p = peers[below(npeers < NPEERS ? npeers : NPEERS)];

		return chance(85) ? p : p + 64 * (1 + below(3));
	}
	return edge32();
}

void pick_id(char *id, uint32_t *len)
{
	if (chance(75)) {
		*len = (uint32_t) sprintf(id, "fz-%u", below(NIDS));
		return;
	}
	*len = below(256);
	for (uint32_t i = 0; i < *len; i++)
		id[i] = chance(2) ? 0 : (char) ('a' + below(26));
}

/* ------------------------------------------------------------------ */
/* the wire */

void conn_closed(int ci)
{
	struct conn *c = &conns[ci];

	for (uint32_t i = nregs; i-- > 0;)
		if (regs[i].conn == ci)
			reg_gone(&regs[i]);
	close(c->fd);
	c->fd = -1;
}

void send_msg(int ci, struct kvb_msg_hdr *h, const int *fds, unsigned nfds)
{
	struct conn *c = &conns[ci];
	int rc;

	h->seq = c->seq++;
	st.sent[h->type]++;
	msgs++;
	rc = kvb_ctl_send(c->fd, h, h->len, fds, nfds);
	CHECK(!rc, "conn %d: sending %s: %s", ci, type_name[h->type],
	      strerror(-rc));
}

/* A late PEER reply: exactly one per PEER request, of one of its seqs. */
void peer_late(int ci, const struct kvb_msg_hdr *h, int n)
{
	const struct kvb_msg_peer_reply *r = (const void *) h;
	struct conn *c = &conns[ci];
	int known = 0;

	for (uint32_t i = 0; i < 64 && i < c->npeer_seqs; i++)
		known |= c->peer_seqs[i] == h->seq;
	tracef("conn %d: PEER reply seq %u status %d peer %u", ci, h->seq,
	       h->status, n == (int) sizeof(*r) ? r->peer : 0);
	CHECK(n == (int) sizeof(*r), "PEER reply of %d bytes", n);
	CHECK(known, "PEER reply with seq %u of no PEER request", h->seq);
	CHECK(c->peer_out > 0, "a PEER reply too many");
	c->peer_out--;
	st.peer_late++;
	CHECK(h->status == 0 || h->status == -ETIMEDOUT ||
		      h->status == -EBUSY || h->status == -ENOSPC,
	      "PEER status %d", h->status);
	CHECK(!h->status == !!r->peer, "PEER status %d with peer %u", h->status,
	      r->peer);
	if (!h->status) {
		st.ok[KVB_MSG_PEER]++;
		peers[npeers++ % NPEERS] = r->peer;
	}
}

/*
 * Read one message into rbuf by `deadline`: its length, or -EPIPE when the
 * broker hung up. Headers are checked; no reply carries an fd.
 */
int read_one(int ci, int64_t deadline)
{
	struct kvb_msg_hdr *h = (struct kvb_msg_hdr *) rbuf;
	int fds[KVB_CTL_MAX_FDS];
	unsigned nfds = KVB_CTL_MAX_FDS;
	int n;

	n = kvb_ctl_recv_by(conns[ci].fd, rbuf, sizeof(rbuf), fds, &nfds,
			    deadline);
	for (unsigned i = 0; i < nfds && n >= 0; i++)
		close(fds[i]);
	if (n == -EPIPE || n == -ECONNRESET)
		return -EPIPE;
	CHECK(n >= 0, "conn %d: no reply: %s", ci, strerror(-n));
	CHECK(nfds == 0, "conn %d: %u fds with a reply", ci, nfds);
	CHECK(n >= (int) sizeof(*h) && h->magic == KVB_MSG_MAGIC &&
		      h->version == KVB_PROTO_VERSION && h->len == (uint32_t) n,
	      "conn %d: bad reply header (%d bytes)", ci, n);
	CHECK(h->status <= 0, "conn %d: status %d", ci, h->status);
	return n;
}

/* The reply to the request of type/seq just sent (late PEER replies on
 * the way are checked); its length, at least want bytes. */
int await_reply(int ci, uint16_t type, size_t want)
{
	const struct kvb_msg_hdr *h = (const struct kvb_msg_hdr *) rbuf;
	int64_t deadline = kvb_ctl_deadline(REPLY_MS);
	uint32_t seq = conns[ci].seq - 1;

	for (;;) {
		int n = read_one(ci, deadline);

		CHECK(n >= 0, "conn %d: the broker hung up on %s", ci,
		      type_name[type]);
		if (h->type == KVB_MSG_PEER &&
		    !(type == KVB_MSG_PEER && h->seq == seq)) {
			peer_late(ci, h, n);
			continue;
		}
		CHECK(h->type == type && h->seq == seq,
		      "conn %d: reply type %u seq %u to %s seq %u", ci, h->type,
		      h->seq, type_name[type], seq);
		CHECK(n >= (int) want, "conn %d: %s reply of %d bytes", ci,
		      type_name[type], n);
		if (!h->status)
			st.ok[type]++;
		return n;
	}
}

/* After BYE or a malformed OPEN_BATCH: the broker hangs up. */
void await_hangup(int ci)
{
	int64_t deadline = kvb_ctl_deadline(REPLY_MS);
	int n;

	while ((n = read_one(ci, deadline)) >= 0) {
		const struct kvb_msg_hdr *h = (const void *) rbuf;

		CHECK(h->type == KVB_MSG_PEER,
		      "conn %d: a reply of type %u after the last", ci,
		      h->type);
		peer_late(ci, h, n);
	}
	conn_closed(ci);
}

void expect_status(int ci, const char *what, int got, int want)
{
	CHECK(got == want, "conn %d: %s: status %d, want %d", ci, what, got,
	      want);
}

/* got is one of the n statuses that follow */
void expect_one_of(int ci, const char *what, int got, int n, ...)
{
	va_list ap;
	int ok = 0;

	va_start(ap, n);
	while (n--)
		ok |= va_arg(ap, int) == got;
	va_end(ap);
	CHECK(ok, "conn %d: %s: unexpected status %d", ci, what, got);
}

/* ------------------------------------------------------------------ */
/* connections */

void conn_open(int ci)
{
	static const uint32_t tps[] = {1, 2, 4}, ring[] = {0, 2, 64, 4096};
	struct conn *c = &conns[ci];
	struct kvb_msg_hello m;
	const struct kvb_msg_hello_reply *rep = (const void *) rbuf;
	int fds[3];
	unsigned nfds = 3;
	int n;

	memset(c, 0, sizeof(*c));
	c->t_open = now_ns();
	c->fd = kvb_ctl_connect(br.sock, 3000);
	CHECK(c->fd >= 0, "connect: %s", strerror(-c->fd));
	c->role = chance(50) ? KVB_ROLE_P : KVB_ROLE_D;
	/* a dp rank of its own: the broker refuses a second worker with an
	 * identity (role, dp, tp) that is attached (-EADDRINUSE) */
	c->dp = below(4) + 4 * (uint32_t) ci;
	c->tp_size = tps[below(3)];
	c->tp = below(c->tp_size);
	c->seq = chance(80) ? 1 : UINT32_MAX - below(4);
	kvb_msg_init(&m.h, KVB_MSG_HELLO, sizeof(m));
	m.role = c->role;
	m.dp_rank = c->dp;
	m.tp_rank = c->tp;
	m.tp_size = c->tp_size;
	m.pid = (uint32_t) getpid();
	m.sq_entries = ring[below(4)];
	m.cq_entries = ring[below(4)];
	m.h.seq = c->seq++;
	msgs++;
	st.conns++;
	CHECK(!kvb_ctl_send(c->fd, &m, sizeof(m), NULL, 0), "HELLO send");
	n = kvb_ctl_recv_by(c->fd, rbuf, sizeof(rbuf), fds, &nfds,
			    kvb_ctl_deadline(REPLY_MS));
	for (unsigned i = 0; n >= 0 && i < nfds; i++)
		close(fds[i]);
	tracef("conn %d: HELLO %s dp %u tp %u/%u sq %u cq %u -> %d", ci,
	       c->role == KVB_ROLE_P ? "P" : "D", c->dp, c->tp, c->tp_size,
	       m.sq_entries, m.cq_entries, n < 0 ? n : rep->h.status);
	CHECK(n >= 0 &&
		      !kvb_ctl_check_reply(&rep->h, n, KVB_MSG_HELLO,
					   sizeof(*rep)) &&
		      rep->h.seq == m.h.seq && nfds == 3,
	      "HELLO refused (%d)", n);
	c->worker_id = rep->worker_id;
}

/* BYE: its reply, then the broker hangs up. */
void do_bye(int ci)
{
	struct kvb_msg_hdr h;
	int n;

	kvb_msg_init(&h, KVB_MSG_BYE, sizeof(h));
	send_msg(ci, &h, NULL, 0);
	n = await_reply(ci, KVB_MSG_BYE, sizeof(h));
	tracef("conn %d: BYE -> %d", ci, ((struct kvb_msg_hdr *) rbuf)->status);
	expect_status(ci, "BYE", ((struct kvb_msg_hdr *) rbuf)->status, 0);
	CHECK(n == (int) sizeof(h), "BYE reply of %d bytes", n);
	await_hangup(ci);
}

/* SPDX-License-Identifier: MIT */
/*
 * Structured fuzz of the broker's control socket (kvb_worker_ctl(),
 * broker/worker.c), with the cross-node bridge live (--host-ip 127.0.0.1,
 * free ports of our own). test_ctl_garbage sends garbage; this sends only
 * well-formed messages of the right types and sizes, from up to NCONN
 * attached workers at once, with field values picked from a seeded PRNG:
 * boundary values (0, 1, UINT32_MAX, limits +- 1), region ids that are live,
 * freed, another worker's or of a worker gone, memfds that fit, are too
 * short, unsealed or no file at all, KV geometries that fit or overflow,
 * transfer ids reused across OPEN / OPEN_BATCH / XOPEN, XOPEN block counts
 * that do or do not match the message, peers that exist or not.
 *
 * A model of the connections, their regions and KV layers predicts every
 * reply it can (MEM_REG, MEM_DEREG, MEM_LOOKUP, MEM_KV exactly; OPEN,
 * OPEN_BATCH and XOPEN's refusals of malformed fields exactly, the rest
 * within the statuses their code can return); every reply must have the
 * request's type, seq and size, carry no fd, and come within a bound; the
 * broker hangs up only after BYE or an OPEN_BATCH whose ids do not fill it.
 * PEER replies come late (the handshake): each PEER gets exactly one.
 * Every CHECK_EVERY messages and at the end: the broker is alive, answers
 * STATS, its workers and regions counters equal the model's, its fds and
 * mappings stay bounded; at the end no transfer is left either. Then a
 * client of the public API runs a local transfer with every byte checked,
 * and the broker exits 0 with no sanitizer report in its log.
 *
 * Safety: nothing leaves loopback. PEER carries host "127.0.0.1" (or a host
 * the broker refuses before any network: "" or unterminated) and the
 * broker's own handshake port or ports checked free at start; XOPEN's
 * notify host is "" or "127.0.0.1", its notify port 0, the broker's own
 * notify base, a free port, or one over 65535 (refused).
 *
 * KVB_FUZZ_SEED (default 1), KVB_FUZZ_MSGS (50000) and KVB_FUZZ_SECONDS (20)
 * change the run, KVB_FUZZ_TRACE=1 prints every request; the seed fixes the
 * choices, the broker's answers (ids, handshake timing) may still vary between
 * runs.
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

/* ------------------------------------------------------------------ */
/* requests */

static void do_mem_reg(int ci)
{
	static const uint64_t sizes[] = {
		1,	   4096,       4097,
		65535,	   MEMFD_SIZE, MEMFD_SIZE + 1,
		0,	   1ull << 40, (1ull << 40) + 1,
		UINT64_MAX};
	static const uint64_t offs[] = {
		0, 4096, 61440, MEMFD_SIZE, 1, UINT64_MAX & ~4095ull};
	static char buf[sizeof(struct kvb_msg_mem_reg) + 64];
	struct kvb_msg_mem_reg *m = (struct kvb_msg_mem_reg *) buf;
	const struct kvb_msg_mem_reply *rep = (const void *) rbuf;
	struct conn *c = &conns[ci];
	uint32_t plen = chance(85) ? 0 : 1 + below(64);
	int fds[2], nfds = 0, which = below(10), want;
	uint64_t flen = 0;

	kvb_msg_init(&m->h, KVB_MSG_MEM_REG, (uint32_t) (sizeof(*m) + plen));
	m->size = chance(60) ? 1 + below(MEMFD_SIZE) : sizes[below(10)];
	m->fd_offset = chance(70) ? 0 : offs[below(6)];
	m->key = chance(80) ? below(4) : rnd();
	m->flags = chance(85) ? below(4) : edge32();
	m->kind = chance(85) ? KIND_HOST : edge32();
	m->gpu_device = (int32_t) edge32();
	m->payload_len = plen;
	for (uint32_t i = 0; i < plen; i++)
		((uint8_t *) (m + 1))[i] = (uint8_t) rnd();
	/* 0-4 a memfd that fits, then short, unsealed, not a file, two, none */
	if (which < 5)
		fds[nfds++] = fd_good, flen = MEMFD_SIZE;
	else if (which == 5)
		fds[nfds++] = fd_short, flen = 4096;
	else if (which == 6)
		fds[nfds++] = fd_unsealed, flen = MEMFD_SIZE;
	else if (which == 7)
		fds[nfds++] = fd_other;
	else if (which == 8)
		fds[nfds++] = fd_good, fds[nfds++] = fd_other,
		flen = MEMFD_SIZE;
	/* mem_reg()'s checks, in its order */
	if (!m->size || m->size > (1ull << 40) ||
	    (m->flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		want = -EINVAL;
	else if (m->kind == KIND_HOST)
		want = !nfds || (m->fd_offset & 4095) || which == 7 ||
				       flen < m->fd_offset ||
				       flen - m->fd_offset < m->size
			       ? -EINVAL
		       : which == 6 ? -EPERM
				    : 0;
	else
		want = m->kind != KIND_GPU || nfds ? -EINVAL : -ENODEV;
	if (!want && own_regs(ci) >= MAX_REGS / NCONN)
		return; /* enough regions: leave the model room */
	send_msg(ci, &m->h, fds, (unsigned) nfds);
	await_reply(ci, KVB_MSG_MEM_REG, sizeof(*rep));
	tracef("conn %d: MEM_REG size %llu off %llu flags %#x kind %u fd %d "
	       "payload %u -> %d region %#x",
	       ci, (unsigned long long) m->size,
	       (unsigned long long) m->fd_offset, m->flags, m->kind, which,
	       plen, rep->h.status, rep->region);
	expect_status(ci, "MEM_REG", rep->h.status, want);
	if (want)
		return;
	CHECK(rep->region && !reg_find(rep->region) && rep->size == m->size &&
		      rep->flags == m->flags,
	      "MEM_REG reply: region %#x size %llu flags %#x", rep->region,
	      (unsigned long long) rep->size, rep->flags);
	regs[nregs++] = (struct reg){.id = rep->region,
				     .conn = ci,
				     .role = c->role,
				     .dp = c->dp,
				     .tp = c->tp,
				     .flags = m->flags,
				     .key = m->key,
				     .size = m->size};
}

static void do_mem_dereg(int ci)
{
	struct kvb_msg_mem_dereg m;
	struct reg *r;
	int want;

	kvb_msg_init(&m.h, KVB_MSG_MEM_DEREG, sizeof(m));
	m.region = pick_region(ci);
	m.pad = (uint32_t) rnd();
	r = reg_find(m.region);
	want = r && r->conn == ci ? 0 : -ENOENT;
	send_msg(ci, &m.h, NULL, 0);
	await_reply(ci, KVB_MSG_MEM_DEREG, sizeof(m.h));
	tracef("conn %d: MEM_DEREG %#x -> %d", ci, m.region,
	       ((struct kvb_msg_hdr *) rbuf)->status);
	expect_status(ci, "MEM_DEREG", ((struct kvb_msg_hdr *) rbuf)->status,
		      want);
	if (!want)
		reg_gone(r);
}

static void do_mem_lookup(int ci)
{
	const struct kvb_msg_mem_reply *rep = (const void *) rbuf;
	struct kvb_msg_mem_lookup m;
	struct reg *r = nregs ? &regs[below(nregs)] : NULL;
	struct reg *hit;
	int n = 0;

	kvb_msg_init(&m.h, KVB_MSG_MEM_LOOKUP, sizeof(m));
	m.role = r && chance(70) ? r->role : edge32();
	m.dp_rank = r && chance(70) ? r->dp : edge32();
	m.tp_rank = r && chance(70) ? r->tp : edge32();
	m.key = r && chance(70) ? r->key : (chance(50) ? below(4) : rnd());
	for (uint32_t i = 0; i < nregs; i++)
		n += regs[i].role == m.role && regs[i].dp == m.dp_rank &&
		     regs[i].tp == m.tp_rank && regs[i].key == m.key &&
		     (regs[i].flags & 3);
	send_msg(ci, &m.h, NULL, 0);
	await_reply(ci, KVB_MSG_MEM_LOOKUP, sizeof(*rep));
	tracef("conn %d: MEM_LOOKUP role %u dp %u tp %u key %llu -> %d %#x", ci,
	       m.role, m.dp_rank, m.tp_rank, (unsigned long long) m.key,
	       rep->h.status, rep->region);
	expect_status(ci, "MEM_LOOKUP", rep->h.status, n ? 0 : -ENOENT);
	if (!n)
		return;
	hit = reg_find(rep->region);
	CHECK(hit && hit->role == m.role && hit->dp == m.dp_rank &&
		      hit->tp == m.tp_rank && hit->key == m.key &&
		      (hit->flags & 3) && rep->size == hit->size &&
		      rep->flags == hit->flags,
	      "MEM_LOOKUP found region %#x, not a match", rep->region);
}

/* OPEN's answer to a well-formed id: opened, ended already, table full. */
static void check_open(int ci, const char *what, int status, uint32_t handle,
		       int bad_id)
{
	if (bad_id) {
		expect_status(ci, what, status, -EINVAL);
		return;
	}
	expect_one_of(ci, what, status, 3, 0, -ESTALE, -ENOSPC);
	CHECK(status || handle, "conn %d: %s: handle 0", ci, what);
}

static int id_bad(const char *id, uint32_t len)
{
	return len == 0 || len > KVB_XFER_ID_MAX || memchr(id, 0, len);
}

static void do_open(int ci)
{
	const struct kvb_msg_open_reply *rep = (const void *) rbuf;
	struct kvb_msg_open m;

	kvb_msg_init(&m.h, KVB_MSG_OPEN, sizeof(m));
	pick_id(m.id, &m.id_len);
	if (chance(10))
		m.id_len = edge32();
	send_msg(ci, &m.h, NULL, 0);
	await_reply(ci, KVB_MSG_OPEN, sizeof(*rep));
	tracef("conn %d: OPEN len %u '%.12s' -> %d %#x", ci, m.id_len, m.id,
	       rep->h.status, rep->handle);
	check_open(ci, "OPEN", rep->h.status, rep->handle,
		   id_bad(m.id, m.id_len));
}

/* Conn 0 lives past the handshake timeout: its PEERs to free ports time
 * out (-ETIMEDOUT) while it listens. */
static int may_close(int ci)
{
	return ci || ms_since(conns[0].t_open) > HS_MS + 1000;
}

static void do_open_batch(int ci)
{
	static char buf[sizeof(struct kvb_msg_open_batch) +
			KVB_OPEN_BATCH_MAX * 256 + 16];
	static uint8_t bad[KVB_OPEN_BATCH_MAX];
	struct kvb_msg_open_batch *m = (struct kvb_msg_open_batch *) buf;
	const struct kvb_msg_open_batch_reply *rep = (const void *) rbuf;
	uint8_t *p = (uint8_t *) (m + 1);
	uint32_t n = 1 + below(chance(80) ? 8 : KVB_OPEN_BATCH_MAX);
	int mode = below(20); /* 0: n out of range, 1: ids do not fill */

	if (mode == 1 && !may_close(ci))
		mode = 2;
	size_t len = 0;

	for (uint32_t i = 0; i < n; i++) {
		char id[256];
		uint32_t l;

		pick_id(id, &l);
		p[len] = (uint8_t) l;
		memcpy(p + len + 1, id, l);
		bad[i] = id_bad(id, l);
		len += 1 + l;
	}
	kvb_msg_init(&m->h, KVB_MSG_OPEN_BATCH, sizeof(*m));
	m->n = n;
	if (mode == 0)
		m->n = chance(50) ? 0 : KVB_OPEN_BATCH_MAX + 1 + below(3);
	else if (mode == 1 && chance(50))
		len += 1 + below(8); /* bytes left over */
	else if (mode == 1)
		m->n = n + 1; /* one id short */
	m->h.len = (uint32_t) (sizeof(*m) + len);
	send_msg(ci, &m->h, NULL, 0);
	if (mode == 1 && m->n <= KVB_OPEN_BATCH_MAX) {
		tracef("conn %d: OPEN_BATCH n %u of %u ids, %zu bytes: drop",
		       ci, m->n, n, len);
		st.drops++;
		await_hangup(ci);
		return;
	}
	await_reply(ci, KVB_MSG_OPEN_BATCH, sizeof(*rep));
	tracef("conn %d: OPEN_BATCH n %u, %zu bytes -> %d n %u", ci, m->n, len,
	       rep->h.status, rep->n);
	if (m->n == 0 || m->n > KVB_OPEN_BATCH_MAX) {
		expect_status(ci, "OPEN_BATCH", rep->h.status, -EINVAL);
		CHECK(rep->h.len == sizeof(*rep) && rep->n == 0,
		      "OPEN_BATCH -EINVAL reply of %u bytes, n %u", rep->h.len,
		      rep->n);
		return;
	}
	expect_status(ci, "OPEN_BATCH", rep->h.status, 0);
	CHECK(rep->n == n &&
		      rep->h.len == sizeof(*rep) + n * sizeof(rep->res[0]),
	      "OPEN_BATCH reply n %u, %u bytes, want %u", rep->n, rep->h.len,
	      n);
	for (uint32_t i = 0; i < n; i++)
		check_open(ci, "OPEN_BATCH id", rep->res[i].status,
			   rep->res[i].handle, bad[i]);
}

static void do_stats(int ci)
{
	struct kvb_msg_stats m;
	int n;

	kvb_msg_init(&m.h, KVB_MSG_STATS, sizeof(m));
	m.json = chance(50) ? below(2) : edge32();
	/* views 0..3 (counters, workers, transfers, peers); others -EINVAL */
	m.view = chance(50) ? below(4) : (uint32_t) rnd();
	send_msg(ci, &m.h, NULL, 0);
	n = await_reply(ci, KVB_MSG_STATS, sizeof(m.h) + 1);
	tracef("conn %d: STATS json %u view %u -> %d bytes", ci, m.json, m.view,
	       n);
	expect_status(ci, "STATS", ((struct kvb_msg_hdr *) rbuf)->status,
		      m.view <= 3 ? 0 : -EINVAL);
	CHECK(rbuf[n - 1] == '\0' && strlen(rbuf + sizeof(m.h)) ==
					     (size_t) n - sizeof(m.h) - 1,
	      "STATS text not one NUL-terminated string");
}

/* kvb_kv_geom_check(), restated: each factor nonzero, the product of
 * 2 * num_blocks and the other four at most INT64_MAX. */
static int geom_len(const struct kvb_msg_mem_kv *m, uint64_t *len)
{
	const uint32_t f[] = {m->block_size, m->num_heads, m->head_dim,
			      m->elem_size};
	uint64_t t = 2 * (uint64_t) m->num_blocks;

	if (m->layout > KVB_KV_BLOCK_FIRST || !m->num_blocks)
		return -EINVAL;
	for (int i = 0; i < 4; i++)
		if (!f[i] || __builtin_mul_overflow(t, f[i], &t) ||
		    t > (uint64_t) INT64_MAX)
			return -EINVAL;
	*len = t;
	return 0;
}

static void do_mem_kv(int ci)
{
	struct kvb_msg_mem_kv m;
	struct reg *r;
	uint64_t len = 0;
	int want;

	kvb_msg_init(&m.h, KVB_MSG_MEM_KV, sizeof(m));
	m.region = pick_region(ci);
	m.layer = chance(70) ? below(8) : edge32();
	if (chance(70)) { /* a geometry that may fit */
		m.layout = below(2);
		m.num_blocks = 1 + below(4);
		m.block_size = 1 + below(16);
		m.num_heads = 1 + below(2);
		m.head_dim = 1 + below(32);
		m.elem_size = 1 + below(2);
	} else {
		m.layout = chance(50) ? below(3) : edge32();
		m.num_blocks = edge32();
		m.block_size = edge32();
		m.num_heads = edge32();
		m.head_dim = edge32();
		m.elem_size = edge32();
	}
	/* kvb_xn_mem_kv()'s checks, in its order */
	r = reg_find(m.region);
	if (!r || r->conn != ci)
		want = -ENOENT;
	else if (r->has_kv)
		want = -EEXIST;
	else if (m.layer >= 4096 || geom_len(&m, &len) || len > r->size)
		want = -EINVAL;
	else
		want = layer_taken(ci, m.layer) ? -EEXIST : 0;
	send_msg(ci, &m.h, NULL, 0);
	await_reply(ci, KVB_MSG_MEM_KV, sizeof(m.h));
	tracef("conn %d: MEM_KV %#x layer %u geom %u/%u/%u/%u/%u/%u -> %d", ci,
	       m.region, m.layer, m.layout, m.num_blocks, m.block_size,
	       m.num_heads, m.head_dim, m.elem_size,
	       ((struct kvb_msg_hdr *) rbuf)->status);
	expect_status(ci, "MEM_KV", ((struct kvb_msg_hdr *) rbuf)->status,
		      want);
	if (!want) {
		r->has_kv = 1;
		r->layer = m.layer;
	}
}

static void do_peer(int ci)
{
	struct conn *c = &conns[ci];
	struct kvb_msg_peer m;
	int k = below(20), bad;

	kvb_msg_init(&m.h, KVB_MSG_PEER, sizeof(m));
	strcpy(m.host, "127.0.0.1");
	m.port = chance(60) ? hs_port : dead_port[below(2)];
	if (k == 0) /* refused before any network */
		m.host[0] = '\0';
	else if (k == 1)
		memset(m.host + 9, 'x', sizeof(m.host) - 9); /* unterminated */
	else if (k == 2)
		m.port = 0;
	else if (k == 3)
		m.port = 65536u + (chance(50) ? m.port : below(1u << 20));
	else if (k == 4)
		m.port = UINT32_MAX;
	bad = k <= 4;
	/* one PEER unanswered at a time, as the library; now and then not */
	if (!bad && c->peer_out && chance(80))
		return;
	m.pad = (uint32_t) rnd();
	send_msg(ci, &m.h, NULL, 0);
	c->peer_seqs[c->npeer_seqs++ % 64] = m.h.seq;
	tracef("conn %d: PEER %.9s%s:%u seq %u", ci, m.host,
	       k == 1 ? "xx.." : "", m.port, m.h.seq);
	if (!bad) {
		c->peer_out++;
		return;
	}
	await_reply(ci, KVB_MSG_PEER, sizeof(struct kvb_msg_peer_reply));
	expect_status(ci, "PEER", ((struct kvb_msg_hdr *) rbuf)->status,
		      -EINVAL);
}

static void do_xopen(int ci)
{
	static char buf[sizeof(struct kvb_msg_xopen) +
			(2 * MAX_BLOCKS + 2) * sizeof(uint32_t)];
	struct kvb_msg_xopen *m = (struct kvb_msg_xopen *) buf;
	const struct kvb_msg_open_reply *rep = (const void *) rbuf;
	uint32_t *ids = (uint32_t *) (m + 1);
	uint32_t nids, k = below(24);
	int bad;

	memset(m, 0, sizeof(*m));
	pick_id(m->id, &m->id_len);
	m->peer = pick_peer();
	m->mode = chance(90) ? below(2) : edge32();
	m->flags = chance(80) ? below(4) : edge32();
	m->remote_dp_rank = chance(80) ? below(4) : edge32();
	m->nblocks = chance(90) ? below(9) : below(MAX_BLOCKS + 1);
	m->nremote = chance(50) ? m->nblocks : below(9);
	nids = m->nblocks + m->nremote;
	for (uint32_t i = 0; i < nids; i++)
		ids[i] = chance(90) ? below(16) : edge32();
	if (chance(70))
		strcpy(m->notify_host, chance(50) ? "" : "127.0.0.1");
	else
		strcpy(m->notify_host, chance(50) ? "127.0.0.1" : "");
	m->notify_port = chance(50)   ? 0
			 : chance(50) ? notify_port
			 : chance(50) ? dead_port[below(2)]
				      : 65536u + below(1u << 20);
	/* a field each refusal checks */
	if (k == 0)
		nids++; /* one id more than the counts say */
	else if (k == 1 && nids)
		nids--;
	else if (k == 2)
		m->nblocks = UINT32_MAX - below(2); /* sum past 2^32 */
	else if (k == 3)
		m->id_len = chance(50) ? 0 : KVB_XFER_ID_MAX + 1 + below(8);
	else if (k == 4)
		memset(m->notify_host, '1', sizeof(m->notify_host));
	bad = !memchr(m->notify_host, 0, sizeof(m->notify_host)) ||
	      m->mode > KVB_XFER_READ || m->notify_port > 65535 ||
	      (uint64_t) nids != (uint64_t) m->nblocks + m->nremote ||
	      m->id_len == 0 || m->id_len > KVB_XFER_ID_MAX;
	/* the header last: kvb_msg_init() would zero the fields */
	m->h = (struct kvb_msg_hdr){
		.magic = KVB_MSG_MAGIC,
		.version = KVB_PROTO_VERSION,
		.type = KVB_MSG_XOPEN,
		.len = (uint32_t) (sizeof(*m) + nids * sizeof(uint32_t))};
	send_msg(ci, &m->h, NULL, 0);
	await_reply(ci, KVB_MSG_XOPEN, sizeof(*rep));
	tracef("conn %d: XOPEN '%.12s' len %u peer %u mode %u flags %#x dp %u "
	       "nb %u nr %u (%u ids) notify '%.9s':%u -> %d %#x",
	       ci, m->id, m->id_len, m->peer, m->mode, m->flags,
	       m->remote_dp_rank, m->nblocks, m->nremote, nids, m->notify_host,
	       m->notify_port, rep->h.status, rep->handle);
	if (bad) {
		expect_status(ci, "XOPEN", rep->h.status, -EINVAL);
		return;
	}
	/* -EEXIST: the id is open (live) on this connection already */
	expect_one_of(ci, "XOPEN", rep->h.status, 9, 0, -EINVAL, -ENOENT,
		      -EBUSY, -EEXIST, -ESTALE, -ENOSPC, -EHOSTUNREACH,
		      -ERANGE);
	CHECK(rep->h.status || rep->handle, "XOPEN: handle 0");
}

/* ------------------------------------------------------------------ */
/* checks on the broker from outside */

static int open_conns(void)
{
	int n = 0;

	for (int i = 0; i < NCONN; i++)
		n += conns[i].fd >= 0;
	return n;
}

static void check_broker(const char *when, int fd_slack)
{
	int status, nfd, nmap;

	CHECK(waitpid(br.pid, &status, WNOHANG) == 0,
	      "%s: the broker is gone (status %#x)", when, status);
	CHECK(broker_stat(&br, "control_requests") >= 0,
	      "%s: the broker does not answer STATS", when);
	CHECK(!broker_wait_stat(&br, "workers", open_conns(), 5000 + SLACK),
	      "%s: workers %lld, want %d", when,
	      (long long) broker_stat(&br, "workers"), open_conns());
	CHECK(!broker_wait_stat(&br, "regions", nregs, 5000 + SLACK),
	      "%s: regions %lld, want %u", when,
	      (long long) broker_stat(&br, "regions"), nregs);
	nfd = proc_fd_wait(br.pid, base_fds + fd_slack, 5000 + SLACK);
	nmap = proc_map_count(br.pid);
	max_fds = nfd > max_fds ? nfd : max_fds;
	max_maps = nmap > max_maps ? nmap : max_maps;
	tracef("%s after %llu messages: %d fds, %d mappings, %u regions", when,
	       (unsigned long long) msgs, nfd, nmap, nregs);
	CHECK(nfd <= base_fds + fd_slack, "%s: %d fds (idle %d)", when, nfd,
	      base_fds);
	CHECK(nmap <= base_maps + MAP_SLACK + 3 * (int) nregs,
	      "%s: %d mappings (idle %d, %u regions)", when, nmap, base_maps,
	      nregs);
}

/* A client of the public API: a 64 KiB local WRITE, every byte checked. */
static void good_client(void)
{
	struct kvb_region a, b;
	struct kvb_completion c[4];
	struct kvb_ctx *ctx = w_attach(&br, KVB_ROLE_P, 0, 1, 0);
	struct kvb_desc d;

	assert_non_null(ctx);
	assert_int_equal(kvb_mem_alloc(ctx, 65536, 0, 1, &a), 0);
	assert_int_equal(kvb_mem_alloc(ctx, 65536, 0, 2, &b), 0);
	pattern_fill(a.addr, 65536, 7, 0);
	d = (struct kvb_desc){
		.region = a.id, .peer_region = b.id, .len = 65536, .tag = 3};
	assert_int_equal(kvb_submit_write(ctx, &d, 1), 1);
	assert_int_equal(w_collect(ctx, c, 1, 5000 + SLACK), 1);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(c[0].tag, 3);
	assert_int_equal(pattern_check(b.addr, 65536, 7, 0), 0);
	kvb_detach(ctx);
	assert_int_equal(broker_wait_stat(&br, "workers", 0, 10000), 0);
	assert_int_equal(broker_wait_stat(&br, "regions", 0, 10000), 0);
}

/* ------------------------------------------------------------------ */

static int memfd_of(uint64_t size, int seal)
{
	int fd = memfd_create("kvb-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t) size), 0);
	if (seal)
		assert_int_equal(
			fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

static void one_step(void)
{
	int ci = (int) below(NCONN);
	uint32_t k;

	if (conns[ci].fd < 0) {
		conn_open(ci);
		return;
	}
	k = below(100);
	if (k < 20)
		do_mem_reg(ci);
	else if (k < 30)
		do_mem_dereg(ci);
	else if (k < 37)
		do_mem_lookup(ci);
	else if (k < 45)
		do_open(ci);
	else if (k < 52)
		do_open_batch(ci);
	else if (k < 54)
		do_stats(ci);
	else if (k < 66)
		do_mem_kv(ci);
	else if (k < 71)
		do_peer(ci);
	else if (k < 95)
		do_xopen(ci);
	else if (!may_close(ci))
		do_stats(ci);
	else if (k < 97)
		do_bye(ci);
	else { /* hang up with requests, regions and PEERs pending */
		tracef("conn %d: close", ci);
		conn_closed(ci);
	}
}

/* Every PEER answered (within the handshake timeout), then BYE. */
static void drain_and_bye(int ci)
{
	int64_t deadline = kvb_ctl_deadline(HS_MS + REPLY_MS);

	while (conns[ci].peer_out) {
		int n = read_one(ci, deadline);

		CHECK(n >= 0, "conn %d: hung up with %u PEERs unanswered", ci,
		      conns[ci].peer_out);
		CHECK(((struct kvb_msg_hdr *) rbuf)->type == KVB_MSG_PEER,
		      "conn %d: an unasked reply of type %u", ci,
		      ((struct kvb_msg_hdr *) rbuf)->type);
		peer_late(ci, (struct kvb_msg_hdr *) rbuf, n);
	}
	do_bye(ci);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 0) : def;
}

static void test_ctl_fuzz(void **state)
{
	int64_t last_check = 0;

	(void) state;
	fd_good = memfd_of(MEMFD_SIZE, 1);
	fd_short = memfd_of(4096, 1);
	fd_unsealed = memfd_of(MEMFD_SIZE, 0);
	fd_other = eventfd(0, EFD_CLOEXEC);
	assert_true(fd_other >= 0);
	for (int i = 0; i < NCONN; i++)
		conns[i].fd = -1;
	base_fds = proc_fd_count(br.pid);
	base_maps = proc_map_count(br.pid);
	t_start = now_ns();
	while (msgs < max_msgs && ms_since(t_start) < (double) max_ms) {
		one_step();
		if (msgs - (uint64_t) last_check >= CHECK_EVERY) {
			last_check = (int64_t) msgs;
			check_broker("checkpoint", FD_SLACK);
		}
	}
	for (int i = 0; i < NCONN; i++)
		if (conns[i].fd >= 0)
			drain_and_bye(i);
	check_broker("end", FD_SLACK_END);
	/* the transfers of workers gone end with them */
	CHECK(!broker_wait_stat(&br, "transfers_active", 0, 5000 + SLACK),
	      "end: transfers_active %lld",
	      (long long) broker_stat(&br, "transfers_active"));
	fprintf(stderr,
		"test_ctl_fuzz: %llu messages on %llu connections in %.1f s "
		"(%llu dropped by OPEN_BATCH, %llu PEER replies late); fds "
		"idle %d max %d, maps idle %d max %d\n",
		(unsigned long long) msgs, (unsigned long long) st.conns,
		ms_since(t_start) / 1000, (unsigned long long) st.drops,
		(unsigned long long) st.peer_late, base_fds, max_fds, base_maps,
		max_maps);
	for (int t = KVB_MSG_MEM_REG; t <= KVB_MSG_OPEN_BATCH; t++)
		if (t != KVB_MSG_HELLO)
			fprintf(stderr, "  %-10s sent %6llu  status 0 %6llu\n",
				type_name[t], (unsigned long long) st.sent[t],
				(unsigned long long) st.ok[t]);
	good_client();
	close(fd_good);
	close(fd_short);
	close(fd_unsealed);
	close(fd_other);
}

static void test_clean_exit(void **state)
{
	(void) state;
	CHECK(!broker_log_has(&br, "AddressSanitizer") &&
		      !broker_log_has(&br, "runtime error"),
	      "sanitizer report in the broker's log");
	assert_int_equal(broker_stop(&br), 0);
}

static int port_free(uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int ok = s >= 0 && !bind(s, (struct sockaddr *) &a, sizeof(a));

	if (s >= 0)
		close(s);
	return ok;
}

/* PORT_SPAN free ports below the usual ephemeral range (32768-). */
static int pick_ports(void)
{
	for (uint32_t t = 0; t < 200; t++) {
		uint16_t base =
			(uint16_t) (20000 +
				    ((uint32_t) getpid() * 7919u + t * 613u) %
					    (32000 - 20000));
		uint32_t i;

		for (i = 0; i < PORT_SPAN && port_free(base + i); i++)
			;
		if (i < PORT_SPAN)
			continue;
		hs_port = base;
		notify_port = base + NOTIFY_OFF;
		dead_port[0] = base + DEAD_OFF;
		dead_port[1] = base + DEAD_OFF + 1;
		return 0;
	}
	return -EADDRINUSE;
}

static int setup(void **state)
{
	static char hs[8], np[8];
	static const char *args[] = {"--host-ip",
				     "127.0.0.1",
				     "--handshake-port",
				     hs,
				     "--notify-port",
				     np,
				     "--transfer-timeout",
				     "2",
				     "--defer-timeout",
				     "1",
				     NULL};
	const struct broker_opts o = {.args = args};

	(void) state;
	if (pick_ports()) {
		fprintf(stderr, "no %u free ports on 127.0.0.1\n", PORT_SPAN);
		return -1;
	}
	snprintf(hs, sizeof(hs), "%u", hs_port);
	snprintf(np, sizeof(np), "%u", notify_port);
	return broker_start(&br, &o) ? -1 : 0;
}

static int teardown(void **state)
{
	(void) state;
	if (br.pid > 0)
		broker_kill(&br);
	broker_cleanup(&br);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ctl_fuzz),
		cmocka_unit_test(test_clean_exit),
	};

	seed = env_u64("KVB_FUZZ_SEED", 1);
	max_msgs = env_u64("KVB_FUZZ_MSGS", max_msgs);
	max_ms = (int64_t) env_u64("KVB_FUZZ_SECONDS", 20) * 1000;
	trace_all = (int) env_u64("KVB_FUZZ_TRACE", 0);
	rng = seed;
	fprintf(stderr,
		"test_ctl_fuzz: seed %#llx (KVB_FUZZ_SEED), at most %llu "
		"messages (KVB_FUZZ_MSGS) or %lld s (KVB_FUZZ_SECONDS)\n",
		(unsigned long long) seed, (unsigned long long) max_msgs,
		(long long) (max_ms / 1000));
	return cmocka_run_group_tests(tests, setup, teardown);
}

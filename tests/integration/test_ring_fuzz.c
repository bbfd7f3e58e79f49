/* SPDX-License-Identifier: MIT */
/*
 * Seeded fuzz of the submission-ring path (process_sqe(), kvb_validate_desc(),
 * the transfer accounting behind them) against a real broker.
 *
 * The test attaches as a raw P worker (HELLO, MEM_REG, MEM_DEREG and OPEN by
 * hand, as test_raw_ring does) and writes its SQ ring itself, past the
 * library's checks; a second worker (D, through the library) owns regions
 * with and without remote access. Descriptors of every opcode (NOP, WRITE,
 * READ, SEAL, ABORT, LAYER and unknown ones) get fields from a seeded PRNG:
 * lengths and offsets at the boundaries (0, 1, the region's size, one past
 * it, off + len overflowing, 1 TiB, UINT64_MAX), region ids live / freed /
 * never allocated / of the other worker / granted or not, transfer handles
 * live / ended / the other worker's / random, flags (now and then random:
 * undefined bits are refused), peer, layer and
 * reserved words; about a third of the copies are built valid. The ring
 * protocol itself is kept (the producer index only moves forward, a full ring
 * is waited on); garbage indices are test_raw_ring's and the ring unit tests'
 * business.
 *
 * A model predicts each descriptor's completion: kind and exact status
 * (0 for a valid copy, or -ECANCELED when its transfer failed at once by an
 * abort or a bad seal while it still waited in the broker (then also an
 * unsignaled one completes), the validation's -errno otherwise, -ESTALE /
 * -ECANCELED / -EINVAL or the first refusal for a transfer's end). Checks:
 * every completion expected arrives exactly once (matched by tag) within a
 * bound and nothing else arrives; valid unsignaled copies complete without
 * one (descriptors_completed counts them); STATS answers every 500
 * descriptors, descriptors_refused never falls nor passes the model. Every
 * EPOCH descriptors the test waits for quiet (all completions in, all copies
 * done) and checks that descriptors_refused / _submitted equal the model's
 * counts and that the bytes of every region that no valid copy targeted
 * keep their pattern (valid copies are mostly short, so most bytes are
 * checked), then refills the regions. At the end the broker must exit 0 on
 * SIGTERM with no sanitizer report in its log. Copies between overlapping
 * ranges of one region are generated too: under ASan they found the local
 * transport's memcpy on overlapping ranges (now memmove; test_local
 * test_overlap), and validation now refuses them (-EINVAL).
 *
 * Safety: regions are small memfds of this process; transfers are never
 * sealed with a count larger than what they got (no 30 s timeouts); no
 * region is freed while descriptors may touch it (freed ids come from setup);
 * a transfer is opened only once the broker has read the whole ring (a
 * random handle already in it could otherwise become live under it).
 *
 * KVB_FUZZ_SEED (default 1), KVB_FUZZ_DESCS (200000), KVB_FUZZ_SECONDS (10),
 * KVB_FUZZ_TRACE=1 (print each descriptor and what the model expects).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"
#include "raw_worker.h"
#include "segment.h"

#define KiB	     1024ull
#define TIB	     (1ull << 40)
#define NREG	     8
#define MAXDESC	     (1u << 20)
#define STATS_EVERY  500
#define EPOCH	     256 /* descriptors between quiet points */
#define HIST	     4096
#define NSTALE	     64
#define NPEND	     256
#define CQE_BOUND_MS (10000 + SLACK)

enum { OWN = 1, DW = 2 }; /* region owners: the raw worker, the D worker */

struct reg {
	uint32_t id;
	int owner;
	uint32_t flags;
	uint64_t size;
	int live;
	unsigned char *addr;
	unsigned char *wrote; /* 1 where a valid copy may have written */
	uint32_t pat;	      /* pattern_fill() stream of this epoch */
};

/* what a tag must get: kind 0 = nothing */
struct expect {
	uint8_t kind, seen;
	/* a valid copy of a transfer that ended with a failure (abort, a bad
	 * seal) while it was queued: dropped, -ECANCELED (docs/deadlines.md) */
	uint8_t may_cancel;
	uint8_t optional; /* unsignaled valid copy: a completion only then */
	int32_t status;
	uint32_t xfer; /* transfer handle whose end this is, or 0 */
};

/* the current transfer: one at a time is fed descriptors */
struct cur {
	uint32_t h;
	uint32_t submitted;
	int32_t first_err;
};

static struct broker br;
static struct raw_worker rw = {.sock = -1, .efd_broker = -1, .efd_worker = -1};
static struct kvb_ctx *dctx;
static struct reg regs[NREG];
static struct expect *ex;
static struct cur cur;
static uint64_t *curv; /* the valid copies of the current transfer */
static uint32_t ncurv, capcurv;
static uint32_t stale[NSTALE], nstale, other_h;
static uint32_t pend[NPEND], npend; /* sealed, end not seen yet */
static uint64_t rs, seed, tag_hi;
static int64_t n_out, n_valid, n_refused, n_submitted;
static int64_t refused0, sub0, done0; /* the counters before */
static unsigned n_open, n_epochs;
static int trace; /* KVB_FUZZ_TRACE=1: each descriptor and its expectation */
static struct kvb_sqe hist[HIST]; /* the last HIST descriptors, by tag */

#define FAIL(fmt, ...)                               \
	fail_msg("seed %#llx (KVB_FUZZ_SEED): " fmt, \
		 (unsigned long long) seed, ##__VA_ARGS__)

static uint64_t rnd(void)
{
	uint64_t z = (rs += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static int chance(unsigned pct)
{
	return below(100) < pct;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 0) : def;
}

/* ---- the raw worker: control messages by hand ---- */

static void raw_attach(void)
{
	assert_int_equal(raw_worker_attach(&rw, br.sock), 0);
}

static uint32_t raw_open(const char *id)
{
	uint32_t h = 0;

	assert_int_equal(raw_worker_open(&rw, id, &h), 0);
	return h;
}

/* A memfd region of the raw worker, mapped here too. */
static void raw_reg(struct reg *r, uint64_t size, uint32_t flags, uint64_t key)
{
	struct kvb_msg_mem_reg m;
	struct kvb_msg_mem_reply rep;
	int fd = memfd_create("kvb-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int n;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t) size), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL),
			 0);
	r->addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(r->addr != MAP_FAILED);
	memset(&m, 0, sizeof(m));
	kvb_msg_init(&m.h, KVB_MSG_MEM_REG, sizeof(m));
	m.size = size;
	m.key = key;
	m.flags = flags;
	assert_int_equal(kvb_ctl_send(rw.sock, &m, sizeof(m), &fd, 1), 0);
	close(fd);
	n = kvb_ctl_recv(rw.sock, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep.h, n, KVB_MSG_MEM_REG, sizeof(rep)),
		0);
	r->id = rep.region;
	r->owner = OWN;
	r->flags = flags;
	r->size = size;
	r->live = 1;
}

static void raw_dereg(struct reg *r)
{
	struct kvb_msg_mem_dereg m;
	struct kvb_msg_hdr rep;
	int n;

	memset(&m, 0, sizeof(m));
	kvb_msg_init(&m.h, KVB_MSG_MEM_DEREG, sizeof(m));
	m.region = r->id;
	assert_int_equal(kvb_ctl_send(rw.sock, &m, sizeof(m), NULL, 0), 0);
	n = kvb_ctl_recv(rw.sock, &rep, sizeof(rep), NULL, NULL);
	assert_int_equal(
		kvb_ctl_check_reply(&rep, n, KVB_MSG_MEM_DEREG, sizeof(rep)),
		0);
	munmap(r->addr, r->size);
	r->addr = NULL;
	r->live = 0;
}

static void d_reg(struct reg *r, uint64_t size, uint32_t flags, uint64_t key)
{
	struct kvb_region k;

	assert_int_equal(kvb_mem_alloc(dctx, size, flags, key, &k), 0);
	r->id = k.id;
	r->owner = DW;
	r->flags = flags;
	r->size = size;
	r->live = 1;
	r->addr = k.addr;
}

/* ---- completions ---- */

static void wake_broker(void)
{
	uint64_t one = 1;

	assert_int_equal(write(rw.efd_broker, &one, sizeof(one)), sizeof(one));
}

static void stale_add(uint32_t h)
{
	stale[nstale++ % NSTALE] = h;
}

static void pend_del(uint32_t h)
{
	for (uint32_t i = 0; i < npend; i++)
		if (pend[i] == h) {
			pend[i] = pend[--npend];
			return;
		}
}

static void print_sqe(const char *what, const struct kvb_sqe *e)
{
	fprintf(stderr,
		"%s %llu: op %u flags %#x xfer %#x region %#x+%llu -> "
		"%#x+%llu len %llu peer %u\n",
		what, (unsigned long long) (e->tag & 0xffffffffu), e->opcode,
		e->flags, e->transfer, e->region,
		(unsigned long long) e->offset, e->peer_region,
		(unsigned long long) e->peer_offset,
		(unsigned long long) e->len, e->peer);
}

static void print_hist(uint64_t i);

static void check_cqe(const struct kvb_cqe *c)
{
	uint64_t i = c->tag & 0xffffffffu;
	struct expect *e = &ex[i < MAXDESC ? i : 0];

	if ((c->tag >> 32) != tag_hi || i >= MAXDESC || !e->kind)
		FAIL("completion nobody asked for: tag %#llx op %u status %d",
		     (unsigned long long) c->tag, c->opcode, c->status);
	if (e->seen)
		FAIL("second completion for descriptor %llu (status %d)",
		     (unsigned long long) i, c->status);
	if (e->may_cancel && c->opcode == e->kind && c->status == -ECANCELED) {
		e->seen = 1;
		n_out -= !e->optional;
		return;
	}
	if (e->optional)
		FAIL("completion nobody asked for: tag %#llx op %u status %d",
		     (unsigned long long) c->tag, c->opcode, c->status);
	if (c->opcode != e->kind || c->status != e->status)
		print_hist(i);
	if (c->opcode != e->kind || c->status != e->status)
		FAIL("descriptor %llu: completion op %u status %d, expected "
		     "op %u status %d",
		     (unsigned long long) i, c->opcode, c->status, e->kind,
		     e->status);
	e->seen = 1;
	n_out--;
	if (e->xfer) {
		pend_del(e->xfer);
		stale_add(e->xfer);
	}
}

static unsigned drain(void)
{
	struct kvb_cqe c[64];
	unsigned n, total = 0;

	while ((n = kvb_ring_dequeue_burst(&rw.seg.cq, c, 64)) > 0) {
		for (unsigned i = 0; i < n; i++)
			check_cqe(&c[i]);
		total += n;
	}
	return total;
}

/* What a failure prints: descriptor i and, of the last HIST, those on
 * its transfer (the model's view of transfers: cur, sealed, ended). */
static void print_hist(uint64_t i)
{
	const struct kvb_sqe *e = &hist[i % HIST];

	fprintf(stderr, "current transfer %#x, %u sealed:", cur.h, npend);
	for (uint32_t k = 0; k < npend; k++)
		fprintf(stderr, " %#x", pend[k]);
	fprintf(stderr, "\n");
	for (uint64_t k = i > HIST ? i - HIST + 1 : 1; k <= i; k++)
		if (k == i ||
		    (e->transfer && hist[k % HIST].transfer == e->transfer))
			print_sqe(k == i ? "failed" : "same transfer",
				  &hist[k % HIST]);
}

/* Put one entry in the ring, waiting (draining completions) while full. */
static void submit(const struct kvb_sqe *e)
{
	int64_t t0 = now_ns();

	hist[e->tag % HIST] = *e;
	if (trace)
		print_sqe("sqe", e);
	while (kvb_ring_enqueue_burst(&rw.seg.sq, e, 1) != 1) {
		wake_broker();
		if (!drain())
			usleep(100);
		if (ms_since(t0) > 5000 + SLACK)
			FAIL("submission ring stays full");
	}
	if (atomic_load(&rw.seg.hdr->broker_sleeping))
		wake_broker();
}

/* ---- the model ---- */

static struct reg *reg_by_id(uint32_t id)
{
	for (int i = 0; i < NREG; i++)
		if (regs[i].live && regs[i].id == id)
			return &regs[i];
	return NULL;
}

static int live_handle(uint32_t h)
{
	if (h == cur.h || h == other_h)
		return 1;
	for (uint32_t i = 0; i < npend; i++)
		if (pend[i] == h)
			return 1;
	return 0;
}

static uint32_t pick_region(void)
{
	uint32_t id;

	switch (below(10)) {
	case 0:
		return 0;
	case 1:
		return UINT32_MAX;
	case 2: /* a live slot, another generation */
		return regs[below(NREG)].id ^ (uint32_t) (1 + below(0xffff))
						      << 16;
	case 3:
		do
			id = (uint32_t) rnd();
		while (reg_by_id(id));
		return id;
	default:
		return regs[below(NREG)].id;
	}
}

static uint64_t pick_len(uint64_t size)
{
	switch (below(14)) {
	case 0:
		return 0;
	case 1:
		return 1;
	case 2:
		return size;
	case 3:
		return size + 1;
	case 4:
		return UINT32_MAX;
	case 5:
		return TIB;
	case 6:
		return TIB + 1;
	case 7:
		return UINT64_MAX;
	case 8:
		return rnd();
	case 9:
		return 4 * KiB;
	default:
		return 1 + below(size);
	}
}

static uint64_t pick_off(uint64_t size, uint64_t len)
{
	switch (below(12)) {
	case 0:
		return 0;
	case 1:
		return size;
	case 2:
		return size + 1;
	case 3:
		return size - 1;
	case 4:
		return size - len; /* fits exactly, or wraps */
	case 5:
		return UINT64_MAX;
	case 6:
		return UINT64_MAX - len + 1; /* off + len overflows to 0 */
	case 7:
		return rnd();
	default:
		return below(size);
	}
}

static uint32_t pick_xfer(void)
{
	uint32_t h;

	switch (below(10)) {
	case 0:
	case 1:
	case 2:
	case 3:
		return 0;
	case 4:
		return nstale ? stale[below(nstale < NSTALE ? nstale : NSTALE)]
			      : 0;
	case 5:
		return other_h;
	case 6:
		do
			h = chance(50) ? (uint32_t) rnd()
				       : (uint32_t) below(4) << 16 |
						 (uint32_t) below(64);
		while (live_handle(h));
		return h;
	default:
		return cur.h;
	}
}

/* kvb_validate_desc() and process_sqe()'s checks, in their order */
static int32_t predict_copy(const struct kvb_sqe *e)
{
	struct reg *l, *r;
	uint32_t need;

	if (e->flags & ~KVB_SQE_F_UNSIGNALED) /* undefined flag bits */
		return -EINVAL;
	if (e->len == 0 || e->len > TIB)
		return -EINVAL;
	l = reg_by_id(e->region);
	if (!l || l->owner != OWN)
		return -EINVAL;
	if (e->offset > l->size || e->len > l->size - e->offset)
		return -EFAULT;
	if (e->peer)
		return -EHOSTUNREACH;
	r = reg_by_id(e->peer_region);
	if (!r)
		return -EINVAL;
	need = e->opcode == KVB_OP_WRITE ? KVB_MEM_REMOTE_WRITE
					 : KVB_MEM_REMOTE_READ;
	if (r->owner != OWN && !(r->flags & need))
		return -EINVAL;
	if (e->peer_offset > r->size || e->len > r->size - e->peer_offset)
		return -EFAULT;
	if (l == r && e->offset < e->peer_offset + e->len &&
	    e->peer_offset < e->offset + e->len)
		return -EINVAL; /* overlapping ranges of one region */
	if (e->transfer && e->transfer != cur.h) /* ended, another's, random */
		return -EINVAL;
	return 0;
}

static void mark_written(const struct kvb_sqe *e)
{
	struct reg *d = reg_by_id(e->opcode == KVB_OP_WRITE ? e->peer_region
							    : e->region);
	uint64_t off = e->opcode == KVB_OP_WRITE ? e->peer_offset : e->offset;

	memset(d->wrote + off, 1, e->len);
}

/* A copy descriptor, valid on purpose: own local region, any peer region
 * that allows the access, in bounds. */
static void make_valid(struct kvb_sqe *e)
{
	struct reg *l, *r;

	do
		l = &regs[below(NREG)];
	while (!l->live || l->owner != OWN);
	do
		r = &regs[below(NREG)];
	while (!r->live || (r->owner != OWN &&
			    !(r->flags & (e->opcode == KVB_OP_WRITE
						  ? KVB_MEM_REMOTE_WRITE
						  : KVB_MEM_REMOTE_READ))));
	e->region = l->id;
	e->peer_region = r->id;
	/* mostly short: the bytes no copy targets must stay many */
	e->len = 1 + below(chance(80) ? 256 : KiB);
	if (chance(3))
		e->len = l->size < r->size ? l->size : r->size;
	e->offset = below(l->size - e->len + 1);
	e->peer_offset = below(r->size - e->len + 1);
	e->peer = 0;
}

/*
 * Open the next transfer. The broker must have read every descriptor
 * already in the ring first: a random handle in one of them could be the
 * one this open gets, and the ring and the socket are not ordered.
 */
static void new_xfer(void)
{
	int64_t t0 = now_ns();
	char id[64];

	wake_broker();
	while (atomic_load(&rw.seg.sq.shm->cons) !=
	       atomic_load(&rw.seg.sq.shm->prod)) {
		if (!drain())
			usleep(50);
		if (ms_since(t0) > 5000 + SLACK)
			FAIL("the broker stopped reading the submission ring");
	}

	snprintf(id, sizeof(id), "fuzz-%llx-%u", (unsigned long long) seed,
		 n_open++);
	cur.h = raw_open(id);
	cur.submitted = 0;
	cur.first_err = 0;
	ncurv = 0;
}

/* Valid copy i of the current transfer: remembered, in case it fails. */
static void cur_valid(uint64_t i)
{
	if (ncurv == capcurv) {
		uint32_t cap = capcurv ? 2 * capcurv : 256;
		uint64_t *n = realloc(curv, cap * sizeof(*n));

		if (!n)
			FAIL("out of memory");
		curv = n;
		capcurv = cap;
	}
	curv[ncurv++] = i;
}

/* The current transfer fails at once (abort, a bad seal): its valid copies
 * that still wait in the broker are dropped with -ECANCELED. */
static void cur_fails(void)
{
	for (uint32_t k = 0; k < ncurv; k++)
		ex[curv[k]].may_cancel = 1;
}

/* A WRITE/READ/unknown descriptor was refused or taken on e->transfer. */
static void account(const struct kvb_sqe *e, int32_t st)
{
	if (!e->transfer || e->transfer != cur.h)
		return;
	cur.submitted++;
	if (st && !cur.first_err)
		cur.first_err = st;
}

static void expect(uint64_t i, uint8_t kind, int32_t status, uint32_t xfer)
{
	if (trace)
		fprintf(stderr, "  expect op %u status %d\n", kind, status);
	ex[i] = (struct expect){.kind = kind, .status = status, .xfer = xfer};
	n_out++;
}

/* Build descriptor i, predict it, submit it. */
static void fuzz_one(uint64_t i)
{
	struct kvb_sqe e;
	unsigned op = (unsigned) below(100);
	int32_t st;
	uint32_t h;

	memset(&e, 0, sizeof(e));
	e.tag = tag_hi << 32 | i;
	/* unsignaled half the time; now and then random bits, which the
	 * broker refuses when any but KVB_SQE_F_UNSIGNALED is set */
	e.flags = chance(5)    ? (uint8_t) rnd()
		  : chance(50) ? KVB_SQE_F_UNSIGNALED
			       : 0;
	if (chance(10))
		e.layer = (uint16_t) rnd();
	if (chance(5))
		e.rsvd[below(3)] = (uint32_t) rnd();
	e.transfer = pick_xfer();
	if (op < 5) {
		e.opcode = KVB_OP_NOP;
		submit(&e);
		expect(i, KVB_CQ_DESC, 0, 0);
		return;
	}
	if (op < 14) { /* SEAL / ABORT */
		e.opcode = op < 11 ? KVB_OP_SEAL : KVB_OP_ABORT;
		if (chance(70))
			e.transfer = cur.h;
		h = e.transfer;
		switch (below(8)) {
		case 0:
			e.len = 1ull << 32;
			break;
		case 1:
			e.len = UINT64_MAX;
			break;
		case 2:
			e.len = below(cur.submitted + 1);
			break;
		default:
			e.len = cur.submitted;
		}
		submit(&e);
		if (h != cur.h || !h) {
			expect(i, KVB_CQ_TRANSFER, -ESTALE, 0);
			return;
		}
		if (e.opcode == KVB_OP_ABORT)
			st = -ECANCELED;
		else
			st = e.len > UINT32_MAX ? -EINVAL : cur.first_err;
		if (e.opcode == KVB_OP_ABORT || e.len > UINT32_MAX)
			cur_fails();
		expect(i, KVB_CQ_TRANSFER, st, h);
		if (npend == NPEND)
			FAIL("%u transfers never ended", NPEND);
		pend[npend++] = h;
		new_xfer();
		return;
	}
	if (op < 19) { /* LAYER: no remote transfer here */
		e.opcode = KVB_OP_LAYER;
		submit(&e);
		expect(i, KVB_CQ_DESC, -EINVAL, 0);
		n_refused++;
		n_submitted++;
		return;
	}
	if (op < 24) { /* unknown opcode */
		e.opcode = (uint8_t) (6 + below(250));
		submit(&e);
		expect(i, KVB_CQ_DESC, -EINVAL, 0);
		account(&e, -EINVAL);
		n_refused++;
		n_submitted++;
		return;
	}
	e.opcode = op < 62 ? KVB_OP_WRITE : KVB_OP_READ;
	if (chance(35)) {
		make_valid(&e);
	} else {
		struct reg *l, *r;

		e.region = pick_region();
		e.peer_region = pick_region();
		l = reg_by_id(e.region);
		r = reg_by_id(e.peer_region);
		e.len = pick_len(l ? l->size : regs[below(NREG)].size);
		e.offset = pick_off(l ? l->size : 4 * KiB, e.len);
		e.peer_offset = pick_off(r ? r->size : 4 * KiB, e.len);
		if (chance(4))
			e.peer = chance(50) ? 1 : (uint32_t) rnd();
	}
	st = predict_copy(&e);
	submit(&e);
	n_submitted++;
	if (st) {
		n_refused++;
		expect(i, KVB_CQ_DESC, st, 0);
	} else {
		n_valid++;
		mark_written(&e);
		if (!(e.flags & KVB_SQE_F_UNSIGNALED))
			expect(i, KVB_CQ_DESC, 0, 0);
		else
			ex[i] = (struct expect){.kind = KVB_CQ_DESC,
						.optional = 1};
		if (e.transfer && e.transfer == cur.h)
			cur_valid(i);
	}
	account(&e, st);
}

/* ---- the test ---- */

/* The broker answers; it refused no more than the model says (it may
 * lag: the ring holds descriptors it has not read yet), and not fewer than
 * last time. */
static void check_stats(void)
{
	static int64_t last;
	char buf[8192];
	int64_t v;

	if (broker_stats(&br, buf, sizeof(buf)))
		FAIL("broker does not answer STATS");
	v = stat_get(buf, "descriptors_refused");
	if (v < last || v < refused0 || v > refused0 + n_refused)
		FAIL("descriptors_refused %lld: last %lld, model %lld",
		     (long long) v, (long long) last,
		     (long long) (refused0 + n_refused));
	last = v;
}

/* Bytes no valid copy targeted still hold their pattern. */
static void check_bytes(void)
{
	for (int k = 0; k < NREG; k++) {
		struct reg *r = &regs[k];
		uint64_t s = 0;

		if (!r->live)
			continue;
		while (s < r->size) {
			uint64_t t = s;

			if (r->wrote[s]) {
				s++;
				continue;
			}
			while (t < r->size && !r->wrote[t])
				t++;
			if (pattern_check(r->addr + s, t - s, r->pat, s))
				FAIL("region %d (%#x): bytes in [%llu, %llu) "
				     "changed, no valid copy went there",
				     k, r->id, (unsigned long long) s,
				     (unsigned long long) t);
			s = t;
		}
	}
}

/*
 * Wait until every completion expected is in and every valid copy done
 * (descriptors_completed), then check the counters and the bytes, and give
 * the regions a fresh pattern for the next epoch. `last` is the last
 * descriptor submitted (for the report).
 */
static void quiesce(uint64_t last)
{
	int64_t t1 = now_ns();

	wake_broker();
	while (n_out) {
		if (!drain())
			usleep(200);
		if (ms_since(t1) <= CQE_BOUND_MS)
			continue;
		for (uint64_t k = 1; k <= last; k++)
			if (ex[k].kind && !ex[k].seen && !ex[k].optional)
				FAIL("descriptor %llu: no completion (expected "
				     "op %u status %d), %llu missing",
				     (unsigned long long) k, ex[k].kind,
				     ex[k].status, (unsigned long long) n_out);
	}
	if (broker_wait_stat(&br, "descriptors_completed", done0 + n_valid,
			     CQE_BOUND_MS))
		FAIL("descriptors_completed %lld, expected %lld",
		     (long long) broker_stat(&br, "descriptors_completed"),
		     (long long) (done0 + n_valid));
	drain();
	if (broker_stat(&br, "descriptors_refused") != refused0 + n_refused ||
	    broker_stat(&br, "descriptors_submitted") != sub0 + n_submitted)
		FAIL("descriptors_refused %lld / _submitted %lld, model %lld / "
		     "%lld",
		     (long long) broker_stat(&br, "descriptors_refused"),
		     (long long) broker_stat(&br, "descriptors_submitted"),
		     (long long) (refused0 + n_refused),
		     (long long) (sub0 + n_submitted));
	check_bytes();
	for (int k = 0; k < NREG; k++) {
		struct reg *r = &regs[k];

		if (!r->live)
			continue;
		r->pat = (uint32_t) rnd();
		pattern_fill(r->addr, r->size, r->pat, 0);
		memset(r->wrote, 0, r->size);
	}
	n_epochs++;
}

static void test_ring_fuzz(void **state)
{
	uint64_t max_descs = env_u64("KVB_FUZZ_DESCS", 200000);
	uint64_t secs = env_u64("KVB_FUZZ_SECONDS", 10);
	int64_t t0 = now_ns();
	uint64_t i;

	(void) state;
	if (max_descs >= MAXDESC)
		max_descs = MAXDESC - 1;
	refused0 = broker_stat(&br, "descriptors_refused");
	sub0 = broker_stat(&br, "descriptors_submitted");
	done0 = broker_stat(&br, "descriptors_completed");
	assert_true(refused0 >= 0 && sub0 >= 0 && done0 >= 0);
	new_xfer();
	for (i = 1; i <= max_descs && ms_since(t0) < secs * 1000.0; i++) {
		fuzz_one(i);
		if (!(i % 32))
			drain();
		if (!(i % STATS_EVERY))
			check_stats();
		if (!(i % EPOCH))
			quiesce(i);
	}
	/* end the last transfer, wait for everything */
	{
		struct kvb_sqe e = {.opcode = KVB_OP_ABORT,
				    .transfer = cur.h,
				    .tag = tag_hi << 32 | i};

		submit(&e);
		cur_fails();
		expect(i, KVB_CQ_TRANSFER, -ECANCELED, cur.h);
		pend[npend++] = cur.h;
		cur.h = 0;
	}
	quiesce(i);
	assert_int_equal(npend, 0);
	assert_true(n_refused > 0 && n_valid > 0);
	fprintf(stderr,
		"test_ring_fuzz: seed %#llx: %llu descriptors (%llu valid "
		"copies, %llu refused, %u transfers, %u epochs) in %.1f s\n",
		(unsigned long long) seed, (unsigned long long) (i - 1),
		(unsigned long long) n_valid, (unsigned long long) n_refused,
		n_open, n_epochs, ms_since(t0) / 1000.0);
}

static int setup(void **state)
{
	const struct broker_opts o = {0};
	static const struct {
		int owner;
		uint64_t size;
		uint32_t flags;
	} lay[NREG] = {
		{OWN, 64 * KiB, 0},
		{OWN, 4 * KiB, 0},
		{OWN, 12 * KiB, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ},
		{OWN, 4 * KiB, 0}, /* freed */
		{DW, 64 * KiB, KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ},
		{DW, 16 * KiB, KVB_MEM_REMOTE_WRITE},
		{DW, 8 * KiB, 0},
		{DW, 4 * KiB, KVB_MEM_REMOTE_WRITE}, /* freed */
	};

	(void) state;
	seed = env_u64("KVB_FUZZ_SEED", 1);
	trace = env_u64("KVB_FUZZ_TRACE", 0) != 0;
	rs = seed;
	tag_hi = (rnd() & 0x7fffffffu) | 1;
	fprintf(stderr, "test_ring_fuzz: seed %#llx (KVB_FUZZ_SEED)\n",
		(unsigned long long) seed);
	ex = calloc(MAXDESC, sizeof(*ex));
	if (!ex || broker_start(&br, &o))
		return -1;
	raw_attach();
	dctx = w_attach(&br, KVB_ROLE_D, 0, 1, 0);
	assert_non_null(dctx);
	for (int k = 0; k < NREG; k++) {
		if (lay[k].owner == OWN)
			raw_reg(&regs[k], lay[k].size, lay[k].flags, 10 + k);
		else
			d_reg(&regs[k], lay[k].size, lay[k].flags, 10 + k);
		regs[k].wrote = calloc(1, lay[k].size);
		assert_non_null(regs[k].wrote);
		regs[k].pat = 100 + k;
		pattern_fill(regs[k].addr, lay[k].size, regs[k].pat, 0);
	}
	raw_dereg(&regs[3]);
	{
		struct kvb_region k = {.id = regs[7].id,
				       .size = regs[7].size,
				       .addr = regs[7].addr};

		assert_int_equal(kvb_mem_free(dctx, &k), 0);
		regs[7].live = 0;
		regs[7].addr = NULL;
	}
	assert_int_equal(kvb_transfer_open(dctx, "fuzz-other", &other_h), 0);
	return 0;
}

static int teardown(void **state)
{
	int rc;

	(void) state;
	if (dctx)
		kvb_detach(dctx);
	for (int k = 0; k < NREG; k++) {
		if (regs[k].owner == OWN && regs[k].addr)
			munmap(regs[k].addr, regs[k].size);
		free(regs[k].wrote);
	}
	raw_worker_close(&rw);
	free(ex);
	free(curv);
	rc = broker_stop(&br);
	if (rc)
		fprintf(stderr, "broker exited with %d\n", rc);
	if (broker_log_has(&br, "Sanitizer") ||
	    broker_log_has(&br, "runtime error")) {
		fprintf(stderr, "sanitizer report in the broker's log\n");
		broker_log_dump(&br);
		rc = -1;
	}
	broker_cleanup(&br);
	return rc ? -1 : 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_fuzz),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

// SPDX-License-Identifier: MIT
/*
 * Chain building, credits and retirement for one RC send queue. See chain.h
 * for the model; the why of the choices is in docs/rdma.md.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "chain.h"

#define KVB_CHAIN_CK_MAX (1u << 18) /* cookie ring cap, per QP */

static uint32_t roundup_pow2(uint64_t v)
{
	uint32_t r = 1;

	while (r < v && r < (1u << 31))
		r <<= 1;
	return r;
}

/* Is seq inside [lo, hi) on the free-running u32 circle? */
static inline int seq_in(uint32_t seq, uint32_t lo, uint32_t hi)
{
	return (uint32_t) (seq - lo) < (uint32_t) (hi - lo);
}

static inline uint64_t make_wr_id(const struct kvb_chain *c, uint32_t seq)
{
	return (uint64_t) c->p.qp_index << 48 | (uint64_t) c->gen << 32 | seq;
}

int kvb_chain_init(struct kvb_chain *c, const struct kvb_chain_params *p)
{
	uint64_t ck_cap;
	uint32_t i;

	memset(c, 0, sizeof(*c));
	if (!p->depth || p->depth > (1u << 20))
		return -EINVAL;
	if (p->wr_max_bytes > (1ull << 31))
		return -EINVAL;
	c->p = *p;
	if (!c->p.merge_max)
		c->p.merge_max = KVB_CHAIN_MERGE_MAX_DEFAULT;
	if (!c->p.max_sge)
		c->p.max_sge = 1;
	if (!c->p.wr_max_bytes)
		c->p.wr_max_bytes = KVB_CHAIN_WR_BYTES_DEFAULT;
	if (!c->p.signal_every)
		c->p.signal_every = p->depth / 2 ? p->depth / 2 : 1;
	c->max_wrs = p->depth;
	if (p->post_batch > 0 && (uint32_t) p->post_batch < p->depth)
		c->max_wrs = (uint32_t) p->post_batch;
	c->credits = p->depth;

	/* Retired-but-unreaped WRs keep their slot: room for two depths. */
	c->wr_mask = roundup_pow2(2ull * p->depth) - 1;
	ck_cap = 2ull * p->depth * c->p.merge_max;
	if (ck_cap > KVB_CHAIN_CK_MAX)
		ck_cap = KVB_CHAIN_CK_MAX;
	if (ck_cap < 2ull * p->depth)
		ck_cap = 2ull * p->depth;
	c->ck_mask = roundup_pow2(ck_cap) - 1;

	c->wri = calloc((size_t) c->wr_mask + 1, sizeof(*c->wri));
	if (!c->wri)
		goto err_wri;
	c->ck = calloc((size_t) c->ck_mask + 1, sizeof(*c->ck));
	if (!c->ck)
		goto err_ck;
	c->wr = calloc(c->max_wrs, sizeof(*c->wr));
	if (!c->wr)
		goto err_wr;
	c->sge = calloc((size_t) c->max_wrs * c->p.max_sge, sizeof(*c->sge));
	if (!c->sge)
		goto err_sge;
	for (i = 0; i < c->max_wrs; i++) {
		c->wr[i].sg_list = &c->sge[(size_t) i * c->p.max_sge];
		c->wr[i].next = i + 1 < c->max_wrs ? &c->wr[i + 1] : NULL;
	}
	return 0;

err_sge:
	free(c->wr);
err_wr:
	free(c->ck);
err_ck:
	free(c->wri);
err_wri:
	memset(c, 0, sizeof(*c));
	return -ENOMEM;
}

void kvb_chain_fini(struct kvb_chain *c)
{
	free(c->sge);
	free(c->wr);
	free(c->ck);
	free(c->wri);
	memset(c, 0, sizeof(*c));
}

/*
 * Count a stall once per episode: from the first build that found too little
 * credit until credits come back, however often the caller retries.
 */
static void stall(struct kvb_chain *c)
{
	if (!c->stalled)
		c->st.credit_stalls++;
	c->stalled = 1;
}

/* 0 if op can be posted, else why not. */
static int op_check(const struct kvb_chain *c, const struct kvb_xop *op)
{
	if (op->opcode != KVB_XOP_WRITE && op->opcode != KVB_XOP_READ)
		return -EINVAL;
	if (!op->local)
		return -EINVAL;
	if (op->local_off > op->local->len ||
	    op->len > op->local->len - op->local_off)
		return -EFAULT;
	if (op->len > c->p.wr_max_bytes)
		return -EMSGSIZE;
	return 0;
}

static inline uint64_t op_laddr(const struct kvb_xop *op)
{
	return (uint64_t) (uintptr_t) op->local->addr + op->local_off;
}

static inline uint64_t op_raddr(const struct kvb_xop *op)
{
	return op->remote.addr + op->remote_off;
}

static inline enum ibv_wr_opcode op_verb(const struct kvb_xop *op)
{
	return op->opcode == KVB_XOP_READ ? IBV_WR_RDMA_READ
					  : IBV_WR_RDMA_WRITE;
}

/*
 * Can op extend WR w (covering info->bytes from its remote address) without
 * a new WR? 1: it continues the last SGE on both sides; 2: it continues
 * the WR at the remote side only and takes an SGE of its own; 0: no.
 */
static int op_merges(const struct kvb_chain *c, const struct ibv_send_wr *w,
		     const struct kvb_chain_wr *info, const struct kvb_xop *op)
{
	const struct ibv_sge *s = &w->sg_list[w->num_sge - 1];

	if (info->ck_count >= c->p.merge_max || w->opcode != op_verb(op) ||
	    w->wr.rdma.rkey != op->remote.rkey ||
	    w->wr.rdma.remote_addr + info->bytes != op_raddr(op) ||
	    info->bytes + op->len > c->p.wr_max_bytes)
		return 0;
	if ((s->lkey == op->local->lkey &&
	     s->addr + s->length == op_laddr(op)) ||
	    !op->len)
		return 1;
	/* an empty last SGE is taken over (no zero-length SGE before data:
	 * some NICs read a byte count of 0 as 2 GiB) */
	return !s->length || (uint32_t) w->num_sge < c->p.max_sge ? 2 : 0;
}

int kvb_chain_build(struct kvb_chain *c, const struct kvb_xop *ops, unsigned n)
{
	return kvb_chain_build_max(c, ops, n, UINT64_MAX);
}

/* WRs the next chain may have: max_wrs, the credit left and ring space
 * (0: none, or no cookie room) */
static uint32_t chain_room(const struct kvb_chain *c)
{
	uint32_t wr_room = c->wr_mask + 1 - (c->head - c->tail);
	uint32_t ck_room = c->ck_mask + 1 - (c->ck_head - c->ck_tail);
	uint32_t lim = c->max_wrs;

	if (lim > c->credits)
		lim = c->credits;
	if (lim > wr_room)
		lim = wr_room;
	return ck_room ? lim : 0;
}

/* Staged WR nwr starts with op, whose cookie goes to ring slot ck. */
static void wr_start(struct kvb_chain *c, uint32_t nwr,
		     const struct kvb_xop *op, uint32_t ck)
{
	struct ibv_send_wr *w = &c->wr[nwr];
	struct kvb_chain_wr *info = &c->wri[(c->head + nwr) & c->wr_mask];

	w->wr_id = make_wr_id(c, c->head + nwr);
	w->opcode = op_verb(op);
	w->send_flags = 0;
	w->num_sge = 1;
	w->sg_list->addr = op_laddr(op);
	w->sg_list->length = (uint32_t) op->len;
	w->sg_list->lkey = op->local->lkey;
	w->wr.rdma.remote_addr = op_raddr(op);
	w->wr.rdma.rkey = op->remote.rkey;
	info->ck_first = ck;
	info->ck_count = 1;
	info->status = 0;
	info->signaled = 0;
	info->bytes = op->len;
}

/* op merged into WR w (how: op_merges()'s answer) */
static void wr_extend(struct ibv_send_wr *w, struct kvb_chain_wr *info,
		      const struct kvb_xop *op, int how)
{
	struct ibv_sge *s = &w->sg_list[w->num_sge - 1];

	if (how == 2) { /* gather: a local piece of its own */
		if (s->length) {
			s++;
			w->num_sge++;
		}
		s->addr = op_laddr(op);
		s->length = 0;
		s->lkey = op->local->lkey;
	}
	s->length += (uint32_t) op->len;
	info->ck_count++;
	info->bytes += op->len;
}

/* The staged WRs linked, the last and one in every signal_every signaled;
 * k ops staged. */
static void chain_seal(struct kvb_chain *c, uint32_t nwr, unsigned k)
{
	for (uint32_t i = 0; i < nwr; i++) {
		struct kvb_chain_wr *wi = &c->wri[(c->head + i) & c->wr_mask];
		int sig = i + 1 == nwr || (i + 1) % c->p.signal_every == 0;

		/* A zero-length WR carries no SGE. */
		if (!wi->bytes)
			c->wr[i].num_sge = 0;
		c->wr[i].send_flags = sig ? IBV_SEND_SIGNALED : 0;
		c->wr[i].next = i + 1 < nwr ? &c->wr[i + 1] : NULL;
		wi->signaled = (uint32_t) sig;
	}
	c->staged = nwr;
	c->staged_ops = k;
}

int kvb_chain_build_max(struct kvb_chain *c, const struct kvb_xop *ops,
			unsigned n, uint64_t max_bytes)
{
	uint32_t lim, ck_room, nwr = 0, ck = c->ck_head;
	uint64_t bytes = 0;
	struct kvb_chain_wr *info = NULL;
	struct ibv_send_wr *w = NULL;
	unsigned k;
	int err, how;

	c->staged = 0;
	c->staged_ops = 0;
	if (c->broken)
		return -ENOTCONN;
	if (!n)
		return 0;
	err = op_check(c, &ops[0]);
	if (err)
		return err;
	ck_room = c->ck_mask + 1 - (c->ck_head - c->ck_tail);
	lim = chain_room(c);
	if (!lim) {
		stall(c);
		return 0;
	}
	for (k = 0; k < n; k++) {
		const struct kvb_xop *op = &ops[k];

		if (k && (op_check(c, op) || bytes >= max_bytes ||
			  op->len > max_bytes - bytes))
			break;
		if (k == ck_room)
			goto stalled;
		how = w ? op_merges(c, w, info, op) : 0;
		if (how) {
			wr_extend(w, info, op, how);
		} else {
			if (nwr == lim) {
				/* Out of credit (not just a full chain). */
				if (lim < c->max_wrs)
					goto stalled;
				break;
			}
			wr_start(c, nwr, op, ck);
			w = &c->wr[nwr];
			info = &c->wri[(c->head + nwr) & c->wr_mask];
			nwr++;
		}
		bytes += op->len;
		c->ck[ck++ & c->ck_mask] = op->cookie;
	}
	goto built;

stalled:
	stall(c);
built:
	chain_seal(c, nwr, k);
	return (int) k;
}

uint64_t kvb_chain_staged_bytes(const struct kvb_chain *c, unsigned nwr)
{
	uint64_t b = 0;
	unsigned i;

	for (i = 0; i < nwr && i < c->staged; i++)
		b += c->wri[(c->head + i) & c->wr_mask].bytes;
	return b;
}

unsigned kvb_chain_commit(struct kvb_chain *c, unsigned nwr)
{
	unsigned i, ops = 0;

	if (nwr > c->staged)
		nwr = c->staged;
	for (i = 0; i < nwr; i++) {
		struct kvb_chain_wr *wi = &c->wri[(c->head + i) & c->wr_mask];

		ops += wi->ck_count;
		c->inflight_bytes += wi->bytes;
		c->st.bytes += wi->bytes;
		c->st.signaled += wi->signaled;
	}
	if (nwr) {
		c->st.chains++;
		c->st.wrs += nwr;
		c->st.ops += ops;
	}
	c->head += nwr;
	c->ck_head += ops;
	c->credits -= nwr;
	c->staged = 0;
	c->staged_ops = 0;
	return ops;
}

/* Retire live WRs [done, end) with `status`; returns ops retired. */
static unsigned retire(struct kvb_chain *c, uint32_t end, int32_t status)
{
	unsigned ops = 0;

	while (c->done != end) {
		struct kvb_chain_wr *wi = &c->wri[c->done & c->wr_mask];

		wi->status = status;
		ops += wi->ck_count;
		c->inflight_bytes -= wi->bytes;
		c->done++;
		if (!c->broken) {
			c->credits++;
			c->stalled = 0;
		}
	}
	if (status)
		c->st.failed_ops += ops;
	return ops;
}

unsigned kvb_chain_complete(struct kvb_chain *c, uint64_t wr_id, int32_t status)
{
	uint32_t seq = (uint32_t) wr_id;
	unsigned ops;

	c->st.cqes++;
	if ((uint16_t) (wr_id >> 32) != c->gen ||
	    kvb_chain_wr_id_qp(wr_id) != c->p.qp_index ||
	    !seq_in(seq, c->done, c->head)) {
		c->st.stale_cqes++;
		return 0;
	}
	if (!status)
		return retire(c, seq + 1, 0);

	c->st.wc_errors++;
	ops = retire(c, seq, 0);
	ops += retire(c, seq + 1, status);
	/*
	 * The hardware still holds the later WRs until it flushes them, so
	 * no credit comes back before the QP is reset.
	 */
	c->broken = 1;
	ops += retire(c, c->head, -ECANCELED);
	return ops;
}

unsigned kvb_chain_fail_all(struct kvb_chain *c, int32_t status)
{
	c->broken = 1;
	c->staged = 0;
	return retire(c, c->head, status);
}

int kvb_chain_reset(struct kvb_chain *c)
{
	if (c->done != c->head)
		return -EBUSY;
	c->credits = c->p.depth;
	c->gen++;
	c->broken = 0;
	c->stalled = 0;
	c->staged = 0;
	c->st.resets++;
	return 0;
}

unsigned kvb_chain_ready(const struct kvb_chain *c)
{
	if (c->tail == c->done)
		return 0;
	return c->wri[(c->done - 1) & c->wr_mask].ck_first +
	       c->wri[(c->done - 1) & c->wr_mask].ck_count - c->ck_tail;
}

unsigned kvb_chain_reap(struct kvb_chain *c, struct kvb_xcqe *out, unsigned max)
{
	unsigned n = 0;

	while (n < max && c->tail != c->done) {
		struct kvb_chain_wr *wi = &c->wri[c->tail & c->wr_mask];
		uint32_t end = wi->ck_first + wi->ck_count;

		while (n < max && c->ck_tail != end) {
			out[n].cookie = c->ck[c->ck_tail & c->ck_mask];
			out[n].status = wi->status;
			out[n].pad = 0;
			c->ck_tail++;
			n++;
		}
		if (c->ck_tail == end)
			c->tail++;
	}
	return n;
}

int32_t kvb_chain_wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECANCELED;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_MW_BIND_ERR:
		return -EFAULT;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_BAD_RESP_ERR:
		return -EINVAL;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		return -ETIMEDOUT;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_FATAL_ERR:
		return -EREMOTEIO;
	default:
		return -EIO;
	}
}

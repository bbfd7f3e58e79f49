/* SPDX-License-Identifier: MIT */
/*
 * Which of a D worker's KV blocks a failed transfer left behind, so that a
 * tcp WRITE that arrives for a transfer D has finished with is refused at
 * D's receiver (docs/deadlines.md, "Cross-node"); and which of a P
 * worker's KV blocks a READ transfer holds, the only ones a tcp READ may
 * take (kvb_grant_read_gate).
 *
 * A cross-node D transfer in WRITE mode holds the blocks it announced
 * (remote_blocks) from its open until it ends. When it fails (a clock, an
 * abort, a peer's failure), its blocks are fenced: a WRITE into a fenced
 * block that no live transfer of the worker holds is late, refused
 * (-ECANCELED, counted in late_writes_refused), its payload discarded. A
 * fence lifts when a transfer takes the block again: the worker's own open
 * of it, or an announce of it by another D rank of the same DP rank here
 * (P then writes every such rank, maybe before that rank opened: the
 * late_rank case). A transfer that succeeded fences nothing: its writes all
 * landed before its write_done. When a block becomes late, the tcp frames
 * already being received are checked again, so no payload whose header
 * came earlier lands after the transfer ended.
 *
 * The data plane names no transfer; this needs none. Its limit: a late
 * write that arrives after the block was taken again lands. rdma writes
 * are one-sided and not seen here: they are fenced by the release / answer
 * exchange only.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "zmq/blocks.h"

#define FENCED	  0x8000u    /* a transfer that held it failed */
#define HOLDERS	  0x7fffu    /* transfers holding it now */
#define GRANT_MAX (1u << 24) /* blocks tracked per worker at most */
#define ANY_ROLE  0xffu	     /* find_block: a worker of any role */

/* The most blocks any KV region of w has (0: none declared). */
static uint32_t kv_blocks(struct kvb_broker *b, const struct kvb_worker *w)
{
	uint32_t n = 0, nkv = kvb_xn_nkv(b, w);

	for (uint32_t l = 0; l < nkv; l++) {
		struct kvb_region_ent *r;
		const struct kvb_xn_region *kv = kvb_xn_kv_layer(b, w, l, &r);

		if (kv && kv->geom.num_blocks > n)
			n = kv->geom.num_blocks;
	}
	return n < GRANT_MAX ? n : GRANT_MAX;
}

/* Make room for w's blocks (as many as its KV regions have). */
static int grow(struct kvb_broker *b, struct kvb_worker *w,
		struct kvb_xn_wctx *ws)
{
	uint32_t nb = kv_blocks(b, w);
	uint16_t *v;

	if (nb <= ws->ngrant)
		return 0;
	v = realloc(ws->grant, nb * sizeof(*v));
	if (!v)
		return -ENOMEM;
	memset(v + ws->ngrant, 0, (nb - ws->ngrant) * sizeof(*v));
	ws->grant = v;
	ws->ngrant = nb;
	return 0;
}

int kvb_grant_take(struct kvb_broker *b, struct kvb_worker *w,
		   const uint32_t *ids, uint32_t n)
{
	struct kvb_xn_wctx *ws = kvb_xn_w(kvb_xn_state(b), w);

	if (grow(b, w, ws))
		return -ENOMEM;
	/* ids past the regions' blocks name no memory: nothing to hold */
	for (uint32_t i = 0; i < n; i++) {
		uint16_t *g = ids[i] < ws->ngrant ? &ws->grant[ids[i]] : NULL;

		if (g && (*g & HOLDERS) < HOLDERS)
			*g = (uint16_t) (((*g & HOLDERS) + 1) & HOLDERS);
	}
	return 0;
}

static void recheck(struct kvb_broker *b)
{
	for (int i = 0; i < KVB_TS_MAX; i++)
		if (b->trs[i] && b->trs[i]->ops->gate_recheck)
			b->trs[i]->ops->gate_recheck(b->trs[i]);
}

void kvb_grant_drop(struct kvb_broker *b, uint32_t worker, const uint32_t *ids,
		    uint32_t n, int failed)
{
	struct kvb_worker *w = kvb_worker_by_id(b, worker);
	struct kvb_xn_wctx *ws = w ? kvb_xn_w(kvb_xn_state(b), w) : NULL;
	int late = 0;

	if (!ws || !ws->grant)
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint16_t *g = ids[i] < ws->ngrant ? &ws->grant[ids[i]] : NULL;

		if (!g)
			continue;
		if (*g & HOLDERS)
			(*g)--;
		if (failed)
			*g |= FENCED;
		late |= *g == FENCED;
	}
	if (late)
		recheck(b);
}

void kvb_grant_unfence(struct kvb_broker *b, uint32_t dp, const uint32_t *ids,
		       uint32_t n)
{
	struct kvb_xn *xn = kvb_xn_state(b);

	for (uint32_t k = 0; k < b->nlive; k++) {
		struct kvb_worker *w = &b->workers[b->live[k]];
		struct kvb_xn_wctx *ws = kvb_xn_w(xn, w);

		if (w->role != KVB_ROLE_D || w->dp_rank != dp || !ws->grant)
			continue;
		for (uint32_t i = 0; i < n; i++)
			if (ids[i] < ws->ngrant)
				ws->grant[ids[i]] &= (uint16_t) ~FENCED;
	}
}

/* Did a transfer holding block bi of w fail, and none holds it now? */
static int late(const struct kvb_xn_wctx *ws, uint64_t bi)
{
	return bi < ws->ngrant && ws->grant[bi] == FENCED;
}

/* Does no live transfer hold block bi of w? */
static int unheld(const struct kvb_xn_wctx *ws, uint64_t bi)
{
	return bi >= ws->ngrant || !(ws->grant[bi] & HOLDERS);
}

/*
 * The first block of [off, off + len) of KV region `region` for which
 * bad(ws, block) says yes, in *bi: 1, else 0 (0 too for a region that is
 * no KV region, or whose owner is not `role`; ANY_ROLE: any). *wout,
 * *kvout: its worker and KV region.
 */
static int find_block(struct kvb_xn *xn, uint32_t region, uint64_t off,
		      uint64_t len, uint8_t role,
		      int (*bad)(const struct kvb_xn_wctx *, uint64_t),
		      uint64_t *bi, struct kvb_worker **wout,
		      const struct kvb_xn_region **kvout)
{
	struct kvb_broker *b = xn->b;
	struct kvb_region_ent *r = kvb_region_get(&b->regions, region);
	const struct kvb_xn_region *kv = r ? kvb_xn_region(xn, r->mr.id) : NULL;
	const struct kvb_kv_geom *g;
	struct kvb_worker *w;
	const struct kvb_xn_wctx *ws;
	uint64_t bl, nb, half, end = off + len, x = off;
	static const struct kvb_xn_wctx none;

	if (!kv || !kv->has_kv || !len)
		return 0;
	w = kvb_worker_by_id(b, r->owner);
	if (!w || (role != ANY_ROLE && w->role != role))
		return 0;
	ws = kvb_xn_w(xn, w);
	if (!ws)
		ws = &none;
	*wout = w;
	*kvout = kv;
	g = &kv->geom;
	bl = kvb_kv_block_len(g);
	nb = g->num_blocks;
	half = nb * bl; /* KV_FIRST: where the V blocks start */
	while (x < end) {
		uint64_t base = 0, step = bl;

		if (g->layout == KVB_KV_LAYOUT_BLOCK_FIRST)
			step = 2 * bl;
		else if (g->layout == KVB_KV_LAYOUT_KV_FIRST && x >= half)
			base = half; /* a PACKED block is one step of bl */
		*bi = (x - base) / step;
		if (*bi >= nb)
			break;
		if (bad(ws, *bi))
			return 1;
		x = base + (*bi + 1) * step;
	}
	return 0;
}

/*
 * The tcp write gate: 0, or -ECANCELED when [off, off + len) of region
 * `region` touches a block that is late. Only KV regions are
 * looked at.
 */
int kvb_grant_gate(void *arg, uint32_t region, uint64_t off, uint64_t len)
{
	struct kvb_xn *xn = arg;
	const struct kvb_xn_region *kv = NULL;
	struct kvb_worker *w = NULL;
	uint64_t bi = 0;

	if (!find_block(xn, region, off, len, ANY_ROLE, late, &bi, &w, &kv))
		return 0;
	kvb_count_late_write(xn->b);
	log_warn_rl("tcp: a write into block %llu of worker %u's region %#x "
		    "(layer %u) came after the transfer holding it failed: "
		    "refused (late_writes_refused)",
		    (unsigned long long) bi, w->id, region, kv->layer);
	return -ECANCELED;
}

/*
 * The tcp read gate: 0, or -EACCES when [off, off + len) of region
 * `region` touches a P worker's KV block that none of its READ transfers
 * holds now (READ mode: P's worker holds a request's blocks in a READ
 * transfer until D's release; outside it the block may already hold
 * another request's KV). Only KV regions are looked at.
 */
int kvb_grant_read_gate(void *arg, uint32_t region, uint64_t off, uint64_t len)
{
	struct kvb_xn *xn = arg;
	const struct kvb_xn_region *kv = NULL;
	struct kvb_worker *w = NULL;
	uint64_t bi = 0;

	if (!find_block(xn, region, off, len, KVB_ROLE_P, unheld, &bi, &w, &kv))
		return 0;
	xn->b->st.unheld_reads_refused++;
	log_warn_rl("tcp: a read of block %llu of P worker %u's region %#x "
		    "(layer %u), which no READ transfer of it holds: refused "
		    "(unheld_reads_refused)",
		    (unsigned long long) bi, w->id, region, kv->layer);
	return -EACCES;
}

void kvb_grant_free(struct kvb_xn_wctx *ws)
{
	free(ws->grant);
	ws->grant = NULL;
	ws->ngrant = 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Mock verbs shared by the rdma transport's unit tests (mock_verbs.c):
 * the test program links them in place of libibverbs' ibv_create_qp,
 * ibv_modify_qp, ibv_reg_mr & co. (and wraps realloc: -Wl,--wrap=realloc).
 * setup() gives a transport `r` / `t` with one mock NIC (r->nnic = 1; NIC
 * 1 is filled in too, for tests that set r->nnic = 2).
 */
#ifndef KVB_TESTS_RDMA_MOCK_VERBS_H
#define KVB_TESTS_RDMA_MOCK_VERBS_H

#include <stdint.h>

#include "rdma/rdma_priv.h"

#define MAXQ 16

/* two mock devices: NIC 0 and NIC 1 */
extern struct ibv_context mctx[2];
extern struct ibv_cq mcq[2];
extern struct ibv_pd mpd[2];
extern int ncqe; /* completions queued, all CQs */

/* QPs created, in order: what each was posted */
struct posted {
	struct ibv_qp *qp;
	uint64_t id[64]; /* wr_ids posted, not completed */
	int n, err;
	uint32_t lkey, rkey; /* of the last WR posted */
};
extern struct posted P[MAXQ];
extern int np;

/* the next fail_reallocs realloc() calls of the code under test fail */
extern int fail_reallocs, failed_reallocs;
extern int fail_creates; /* the next n ibv_create_qp() calls fail */
extern uint32_t sge_cap; /* SGEs per WR ibv_create_qp takes */

/* Complete the oldest WR posted on P[i] with st (into its QP's CQ). */
void cq_push(int i, enum ibv_wc_status st);

/* completion events: a channel whose reads the test feeds */
extern struct ibv_comp_channel mchan;
extern int events_pending, arms, acked, push_on_arm;

/* device events, read by ibv_get_async_event */
extern int naev, aev_head, aev_acked, aev_reads;
extern char last_log[3][256]; /* the last line logged, by level */
void queue_event_on(int nic, enum ibv_event_type type, int port,
		    struct ibv_qp *qp);
void queue_event(enum ibv_event_type type, int port, struct ibv_qp *qp);
void log_line(void *arg, int level, const char *line);

/* memory registration: lkey 0x1000 * (NIC + 1) + n, rkey lkey + 0x800 */
extern int nreg, ndereg;

extern struct kvb_rdma *r;
extern struct kvb_transport *t;
extern char lbuf[1 << 16];
extern struct kvb_mr mr; /* lbuf, lkey 7, not registered */

int setup(void **state);
int teardown(void **state);
/* an endpoint of qp_per_peer QPs, READY as if the peer's blob came */
struct kvb_ep *ready_ep(void);
/* n writes never contiguous (one WR each), cookies c0, c0 + 1, ... */
void post_n(struct kvb_ep *ep, unsigned n, uint64_t c0);
/* poll() until it gives nothing; statuses into st[cookie & 0xff], each
 * counted in seen[] */
unsigned drain(int32_t *st, unsigned *seen);

#endif /* KVB_TESTS_RDMA_MOCK_VERBS_H */

// SPDX-License-Identifier: MIT
/*
 * Mock verbs for the rdma transport's unit tests (mock_verbs.h): two mock
 * devices, a CQ each (one queue, entries tagged), QPs that record what is
 * posted and "flush" in the error state, completion channel and async
 * events fed by the test, memory registration with keys per device.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mock_verbs.h"
#include "rdma/rdma_priv.h"

struct ibv_context mctx[2];
struct ibv_cq mcq[2];
struct ibv_pd mpd[2];
static struct ibv_wc cqes[256];	 /* the mock CQs, in one queue */
static struct ibv_cq *cqof[256]; /* the CQ of each entry */
int ncqe;
static uint32_t next_qpn = 100;
struct posted P[MAXQ];
int np;

/* realloc() of the code under test (-Wl,--wrap=realloc): the next
 * fail_reallocs calls fail as when memory runs out. */
int fail_reallocs, failed_reallocs;
void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_realloc(void *p, size_t n)
{
	if (fail_reallocs > 0) {
		fail_reallocs--;
		failed_reallocs++;
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

static struct posted *find(struct ibv_qp *qp)
{
	for (int i = 0; i < np; i++)
		if (P[i].qp == qp)
			return &P[i];
	return NULL;
}

/* Complete the oldest WR posted on P[i] with st. */
void cq_push(int i, enum ibv_wc_status st)
{
	struct posted *p = &P[i];

	assert_true(p->n > 0);
	memset(&cqes[ncqe], 0, sizeof(cqes[0]));
	cqes[ncqe].wr_id = p->id[0];
	cqes[ncqe].status = st;
	cqes[ncqe].qp_num = p->qp->qp_num;
	cqof[ncqe] = p->qp->send_cq;
	ncqe++;
	memmove(p->id, p->id + 1, (size_t) --p->n * sizeof(p->id[0]));
}

/* The entries of CQ c, oldest first; the others stay queued in order. */
static int mock_poll(struct ibv_cq *c, int num, struct ibv_wc *wc)
{
	int k = 0, i, j = 0;

	for (i = 0; i < ncqe; i++) {
		if (cqof[i] == c && k < num) {
			wc[k++] = cqes[i];
			continue;
		}
		cqes[j] = cqes[i];
		cqof[j++] = cqof[i];
	}
	ncqe = j;
	return k;
}

static int mock_post(struct ibv_qp *qp, struct ibv_send_wr *wr,
		     struct ibv_send_wr **bad)
{
	struct posted *p = find(qp);

	(void) bad;
	for (; wr; wr = wr->next) {
		assert_true(p->n < 64);
		p->id[p->n++] = wr->wr_id;
		p->lkey = wr->num_sge ? wr->sg_list[0].lkey : 0;
		p->rkey = wr->wr.rdma.rkey;
	}
	return 0;
}

int fail_creates; /* the next n ibv_create_qp() calls fail */

/* SGEs per WR the mock device takes (ibv_create_qp refuses more) */
uint32_t sge_cap = 1;

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct ibv_qp *qp;

	if (a->cap.max_send_sge > sge_cap) {
		errno = EINVAL;
		return NULL;
	}
	if (fail_creates > 0) {
		fail_creates--;
		errno = ENOMEM;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp || np == MAXQ) {
		free(qp);
		return NULL;
	}
	qp->context = pd->context;
	qp->send_cq = a->send_cq;
	qp->qp_num = next_qpn++;
	P[np++] = (struct posted){.qp = qp};
	return qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct posted *p = find(qp);

	(void) mask;
	if (a->qp_state == IBV_QPS_ERR && !p->err) {
		p->err = 1; /* the hardware flushes what the QP holds */
		while (p->n)
			cq_push((int) (p - P), IBV_WC_WR_FLUSH_ERR);
	}
	if (a->qp_state == IBV_QPS_RESET)
		p->err = 0;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct posted *p = find(qp);

	if (p)
		p->qp = NULL;
	free(qp);
	return 0;
}

/* completion events: a channel whose reads the test feeds */
struct ibv_comp_channel mchan = {.fd = -1};
int events_pending, arms, acked, push_on_arm = -1;

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq,
		     void **ctx)
{
	assert_ptr_equal(ch, &mchan);
	if (!events_pending) {
		errno = EAGAIN; /* the fd is non-blocking */
		return -1;
	}
	events_pending--;
	*cq = &mcq[0];
	*ctx = NULL;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	assert_ptr_equal(cq, &mcq[0]);
	acked += (int) n;
}

static int mock_notify(struct ibv_cq *cq, int solicited)
{
	(void) cq;
	(void) solicited;
	arms++;
	/* a completion that lands between the empty poll and the arming */
	if (push_on_arm >= 0) {
		cq_push(push_on_arm, IBV_WC_SUCCESS);
		push_on_arm = -1;
	}
	return 0;
}

/* device events: a queue the test feeds, read by ibv_get_async_event
 * (each entry for one device) */
static struct ibv_async_event aev[128];
static struct ibv_context *aevctx[128];
int naev, aev_head, aev_acked, aev_reads;
char last_log[3][256]; /* by level */

int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	int i;

	assert_true(ctx == &mctx[0] || ctx == &mctx[1]);
	aev_reads++;
	for (i = aev_head; i < naev && aevctx[i] != ctx; i++)
		;
	if (i == naev) {
		errno = EAGAIN; /* the fd is non-blocking */
		return -1;
	}
	*ev = aev[i];
	/* taken out, the others keep their order */
	memmove(aev + aev_head + 1, aev + aev_head,
		(size_t) (i - aev_head) * sizeof(aev[0]));
	memmove(aevctx + aev_head + 1, aevctx + aev_head,
		(size_t) (i - aev_head) * sizeof(aevctx[0]));
	aev_head++;
	return 0;
}

/* memory registration: keys 0x1000 * (NIC + 1) + n (lkey), + 0x800 (rkey) */
int nreg, ndereg;

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			  int access);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			  int access)
{
	struct ibv_mr *m = calloc(1, sizeof(*m));
	uint32_t nic = pd == &mpd[1];

	(void) access;
	assert_true(pd == &mpd[0] || pd == &mpd[1]);
	m->pd = pd;
	m->addr = addr;
	m->length = length;
	m->lkey = 0x1000 * (nic + 1) + (uint32_t) ++nreg;
	m->rkey = m->lkey + 0x800;
	return m;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				uint64_t iova, unsigned int access)
{
	(void) iova;
	return ibv_reg_mr(pd, addr, length, (int) access);
}

int ibv_dereg_mr(struct ibv_mr *m)
{
	ndereg++;
	free(m);
	return 0;
}

void ibv_ack_async_event(struct ibv_async_event *ev)
{
	(void) ev;
	aev_acked++;
}

void queue_event_on(int nic, enum ibv_event_type type, int port,
		    struct ibv_qp *qp)
{
	assert_true(naev < 128);
	memset(&aev[naev], 0, sizeof(aev[naev]));
	aevctx[naev] = qp ? qp->context : &mctx[nic];
	aev[naev].event_type = type;
	if (qp)
		aev[naev].element.qp = qp;
	else
		aev[naev].element.port_num = port;
	naev++;
}

void queue_event(enum ibv_event_type type, int port, struct ibv_qp *qp)
{
	queue_event_on(0, type, port, qp);
}

void log_line(void *arg, int level, const char *line)
{
	(void) arg;
	assert_true(level >= KVB_RDMA_LOG_INFO && level <= KVB_RDMA_LOG_ERR);
	snprintf(last_log[level], sizeof(last_log[level]), "%s", line);
}

struct kvb_rdma *r;
struct kvb_transport *t;
char lbuf[1 << 16];
struct kvb_mr mr = {.id = 1, .addr = lbuf, .len = sizeof(lbuf)};

int setup(void **state)
{
	(void) state;
	memset(P, 0, sizeof(P));
	np = 0;
	ncqe = 0;
	fail_reallocs = failed_reallocs = 0;
	fail_creates = 0;
	sge_cap = 1;
	r = calloc(1, sizeof(*r));
	assert_non_null(r);
	t = &r->base;
	events_pending = arms = acked = 0;
	push_on_arm = -1;
	nreg = ndereg = 0;
	r->base.ops = &kvb_rdma_ops;
	r->wait_epfd = r->async_epfd = -1;
	r->p.sq_depth = 8;
	r->p.qp_per_peer = 2;
	r->p.ib_port = 1;
	for (int i = 0; i < 2; i++) {
		struct kvb_rdma_nic *n = &r->nics[i];

		mctx[i].ops.poll_cq = mock_poll;
		mctx[i].ops.post_send = mock_post;
		mctx[i].ops.req_notify_cq = mock_notify;
		mcq[i].context = &mctx[i];
		mpd[i].context = &mctx[i];
		n->ctx = &mctx[i];
		n->pd = &mpd[i];
		n->cq = &mcq[i];
		n->cq_size = 1 << 16;
		n->port_num = 1;
		n->dev.max_qp_rd_atom = 16;
		n->port.active_mtu = IBV_MTU_1024;
		n->async_nb = 1;
		n->max_qps = 1000;
		n->numa = -1;
		snprintf(n->name, sizeof(n->name), "mock%d", i);
	}
	r->nnic = 1; /* two_nics() adds the second */
	naev = aev_head = aev_acked = aev_reads = 0;
	memset(last_log, 0, sizeof(last_log));
	mr.lkey = 7;
	return 0;
}

int teardown(void **state)
{
	(void) state;
	while (r->eps)
		_kvb_rdma_ep_destroy(r, r->eps);
	free(r->orphan);
	free(r);
	return 0;
}

struct kvb_ep *ready_ep(void)
{
	struct kvb_ep *ep;

	assert_int_equal(_kvb_rdma_connect(t, NULL, 0, &ep), 0);
	ep->state = KVB_RDMA_EP_READY; /* as if the peer's blob came */
	return ep;
}

/* n writes never contiguous (one WR each), cookies c0, c0 + 1, ... */
void post_n(struct kvb_ep *ep, unsigned n, uint64_t c0)
{
	struct kvb_xop op[8];

	assert_true(n <= 8);
	memset(op, 0, sizeof(op));
	for (unsigned i = 0; i < n; i++) {
		op[i].opcode = KVB_XOP_WRITE;
		op[i].local = &mr;
		op[i].local_off = i * 8192;
		op[i].len = 4096;
		op[i].remote.addr = 0x100000;
		op[i].remote.rkey = 9;
		op[i].remote_off = i * 16384;
		op[i].cookie = c0 + i;
	}
	assert_int_equal(t->ops->post(t, ep, op, n), (int) n);
}

/* poll() until it gives nothing; the cookies' statuses into st[cookie &
 * 0xff] (each counted in seen[]) */
unsigned drain(int32_t *st, unsigned *seen)
{
	struct kvb_xcqe out[32];
	unsigned total = 0;

	for (int round = 0; round < 8; round++) {
		int n = t->ops->poll(t, out, 32);

		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			st[out[i].cookie & 0xff] = out[i].status;
			seen[out[i].cookie & 0xff]++;
		}
		total += (unsigned) n;
	}
	return total;
}

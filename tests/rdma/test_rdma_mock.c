/* SPDX-License-Identifier: MIT */
/*
 * The rdma transport's completion paths against mock verbs (no device):
 * this program defines ibv_create_qp / ibv_modify_qp / ibv_destroy_qp,
 * which take the place of libibverbs' for the transport's code, and a CQ
 * and post_send of its own behind the inline ibv_poll_cq / ibv_post_send.
 * A QP moved to the error state "flushes" what it holds, as hardware does.
 *
 *  - one CQ batch holds an endpoint's work-completion error and another
 *    endpoint's success: the error resets its endpoint (which drains the CQ
 *    and quiesces a sibling QP), and still every op completes exactly once;
 *  - disconnect() with ops in flight and ops retired but not reaped: each
 *    completes once through poll(), the in-flight ones -ECONNABORTED;
 *  - completion events (wait_fd, arm): only arm() asks for one, once per
 *    event; completions that came before the request (or were retired
 *    and not handed out) make arm() say "do not sleep"; events read are
 *    acked.
 *  - the same when the orphan queue cannot grow (its realloc fails: linked
 *    with --wrap=realloc, see fail_reallocs): the endpoint is kept until
 *    close(), its ops still complete once each, and no answer or re-offer
 *    of the peer finds it again;
 *  - several QPs per peer: a large chain spread over them by bytes in
 *    flight, a small one whole on one QP;
 *  - device events (ibv_get_async_event, fed by the test): our port down
 *    makes post() refuse with -ENETDOWN until it is active again, while
 *    ops in flight still complete; another port's event changes nothing;
 *    a QP error is counted and names the QP; DEVICE_FATAL is -ENODEV for
 *    good; every event read is acked, at most 64 per call;
 *  - gather lists: QPs and chains get min(device max_sge, 16) SGEs, and
 *    one SGE from then on when the device refuses more at create time;
 *  - two mock devices (NICs): regions registered on both with the nearest
 *    (NUMA node, else fewest regions) as home and its keys in mr; QPs per
 *    NIC pair as the rails go, fewer per pair under a QP budget and a
 *    connect refused (-EUSERS, counted, logged) when one each won't fit;
 *    post() on the pair of the regions' NICs with that pair's keys, large
 *    chains over both; a NIC's port down moves new chains to the other
 *    (counted), what it had in flight completes, none up is -ENETDOWN;
 *    per-NIC counters in nics() and stats_format.
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

#include "rdma/rdma_priv.h"

#define MAXQ 16

/* two mock devices: NIC 0 and NIC 1 */
static struct ibv_context mctx[2];
static struct ibv_cq mcq[2];
static struct ibv_pd mpd[2];
static struct ibv_wc cqes[256]; /* the mock CQs, in one queue */
static struct ibv_cq *cqof[256]; /* the CQ of each entry */
static int ncqe;
static uint32_t next_qpn = 100;
static struct posted {
	struct ibv_qp *qp;
	uint64_t id[64]; /* wr_ids posted, not completed */
	int n, err;
	uint32_t lkey, rkey; /* of the last WR posted */
} P[MAXQ];
static int np;

/* realloc() of the code under test (-Wl,--wrap=realloc): the next
 * fail_reallocs calls fail as when memory runs out. */
static int fail_reallocs, failed_reallocs;
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
static void cq_push(int i, enum ibv_wc_status st)
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

static int fail_creates; /* the next n ibv_create_qp() calls fail */

/* SGEs per WR the mock device takes (ibv_create_qp refuses more) */
static uint32_t sge_cap = 1;

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
static struct ibv_comp_channel mchan = {.fd = -1};
static int events_pending, arms, acked, push_on_arm = -1;

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
static int naev, aev_head, aev_acked, aev_reads;
static char last_log[3][256]; /* by level */

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
static int nreg, ndereg;

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

static void queue_event_on(int nic, enum ibv_event_type type, int port,
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

static void queue_event(enum ibv_event_type type, int port, struct ibv_qp *qp)
{
	queue_event_on(0, type, port, qp);
}

static void log_line(void *arg, int level, const char *line)
{
	(void) arg;
	assert_true(level >= KVB_RDMA_LOG_INFO && level <= KVB_RDMA_LOG_ERR);
	snprintf(last_log[level], sizeof(last_log[level]), "%s", line);
}

static struct kvb_rdma *r;
static struct kvb_transport *t;
static char lbuf[1 << 16];
static struct kvb_mr mr = {.id = 1, .addr = lbuf, .len = sizeof(lbuf)};

static int setup(void **state)
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

static int teardown(void **state)
{
	(void) state;
	while (r->eps)
		_kvb_rdma_ep_destroy(r, r->eps);
	free(r->orphan);
	free(r);
	return 0;
}

static struct kvb_ep *ready_ep(void)
{
	struct kvb_ep *ep;

	assert_int_equal(_kvb_rdma_connect(t, NULL, 0, &ep), 0);
	ep->state = KVB_RDMA_EP_READY; /* as if the peer's blob came */
	return ep;
}

/* n writes never contiguous (one WR each), cookies c0, c0 + 1, ... */
static void post_n(struct kvb_ep *ep, unsigned n, uint64_t c0)
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
static unsigned drain(int32_t *st, unsigned *seen)
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

static void test_device_events(void **state)
{
	struct kvb_rdma_async_stats s;
	struct kvb_ep *ep;
	struct kvb_xop op = {.opcode = KVB_XOP_WRITE,
			     .local = &mr,
			     .len = 64,
			     .remote = {.addr = 0x100000, .rkey = 9},
			     .cookie = 0x20};
	int32_t st[256];
	unsigned seen[256] = {0};
	char want[64];

	(void) state;
	ep = ready_ep();
	post_n(ep, 1, 0x10); /* in flight when the port goes down */
	queue_event(IBV_EVENT_PORT_ERR, 2, NULL); /* not our port */
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_int_equal(t->ops->post(t, ep, &op, 1), 1);

	queue_event(IBV_EVENT_PORT_ERR, 1, NULL);
	queue_event(IBV_EVENT_QP_FATAL, 0, ep->qp[1].qp);
	queue_event(IBV_EVENT_COMM_EST, 0, ep->qp[0].qp);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 3);
	assert_int_equal(aev_acked, 4);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], "QP "));
	snprintf(want, sizeof(want), "QP %u:", ep->qp[1].qp->qp_num);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], want));
	op.cookie = 0x21;
	assert_int_equal(t->ops->post(t, ep, &op, 1), -ENETDOWN);
	/* what was in flight still completes, once */
	cq_push(0, IBV_WC_SUCCESS);
	cq_push(1, IBV_WC_SUCCESS);
	assert_int_equal(drain(st, seen), 2);
	assert_int_equal(seen[0x10], 1);
	assert_int_equal(st[0x10], 0);
	assert_int_equal(seen[0x20], 1);
	kvb_rdma_async_get_stats(t, &s);
	assert_int_equal(s.events, 4);
	assert_int_equal(s.port_errors, 1);
	assert_int_equal(s.qp_errors, 1);
	assert_true(s.port_down);
	assert_false(s.device_dead);

	queue_event(IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_INFO], "active again"));
	assert_int_equal(t->ops->post(t, ep, &op, 1), 1);
	kvb_rdma_async_get_stats(t, &s);
	assert_false(s.port_down);
	assert_int_equal(s.port_active, 1);

	queue_event(IBV_EVENT_DEVICE_FATAL, 0, NULL);
	queue_event(IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, NULL, NULL), 2);
	op.cookie = 0x22;
	assert_int_equal(t->ops->post(t, ep, &op, 1), -ENODEV);
	kvb_rdma_async_get_stats(t, &s);
	assert_true(s.device_dead);

	/* at most 64 a call; every one read is acked */
	for (int i = 0; i < 100; i++)
		queue_event(IBV_EVENT_SQ_DRAINED, 0, ep->qp[0].qp);
	assert_int_equal(kvb_rdma_async_service(t, NULL, NULL), 64);
	assert_int_equal(kvb_rdma_async_service(t, NULL, NULL), 36);
	assert_int_equal(kvb_rdma_async_service(t, NULL, NULL), 0);
	assert_int_equal(aev_acked, naev);

	/* a blocking fd is never read from the loop */
	r->nics[0].async_nb = 0;
	aev_reads = 0;
	queue_event(IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, NULL, NULL), 0);
	assert_int_equal(aev_reads, 0);
	assert_int_equal(kvb_rdma_async_fd(t), -1);
}

/* Gather lists: QPs get min(device max_sge, 16) SGEs and the chain builds
 * WRs of that many; a device that refuses them at create time gets QPs of
 * one SGE from then on, and chains that build WRs of one. */
static void test_sge_choice(void **state)
{
	struct kvb_ep *ep;

	(void) state;
	r->nics[0].dev.max_sge = 32;
	sge_cap = 16;
	ep = ready_ep();
	assert_int_equal(r->nics[0].sge, 16);
	assert_int_equal(ep->qp[0].ch.p.max_sge, 16);
	_kvb_rdma_ep_destroy(r, ep);

	r->nics[0].sge = 0; /* a device that says 8 but takes only 1 */
	r->nics[0].dev.max_sge = 8;
	sge_cap = 1;
	ep = ready_ep();
	assert_int_equal(r->nics[0].sge, 1);
	assert_int_equal(ep->qp[0].ch.p.max_sge, 1);
	assert_int_equal(ep->qp[1].ch.p.max_sge, 1);
	post_n(ep, 1, 0x30); /* and it posts */
}

static void test_error_and_success_in_one_batch(void **state)
{
	struct kvb_ep *a, *b;
	int32_t st[256];
	unsigned seen[256] = {0};
	uint32_t qpn0, qpn1;

	(void) state;
	a = ready_ep(); /* P[0], P[1] */
	b = ready_ep(); /* P[2], P[3] */
	qpn0 = a->qp[0].qp->qp_num;
	qpn1 = a->qp[1].qp->qp_num;
	post_n(a, 1, 0xa0);		   /* a.qp0 */
	post_n(a, 2, 0xa1);		   /* a.qp1, round robin */
	post_n(b, 1, 0xb0);		   /* b.qp0 */
	cq_push(0, IBV_WC_REM_ACCESS_ERR); /* a.qp0 failed remotely */
	cq_push(2, IBV_WC_SUCCESS);	   /* b's write landed */
	assert_int_equal(drain(st, seen), 4);
	for (unsigned c = 0xa0; c <= 0xa2; c++)
		assert_int_equal(seen[c], 1);
	assert_int_equal(seen[0xb0], 1);
	assert_int_equal(st[0xa0], -EACCES);
	assert_int_equal(st[0xb0], 0); /* not lost to a's reset */
	assert_int_equal(b->qp[0].ch.head - b->qp[0].ch.done, 0);
	assert_int_equal(b->qp[0].ch.credits, 8);
	/* a's reset gave it new QPs (nothing of the failed ones carries
	 * over), the old ones destroyed; b kept its own */
	assert_int_equal(t->ops->post(t, a, NULL, 0), -ENOTCONN);
	assert_int_equal(a->state, KVB_RDMA_EP_RESET);
	assert_int_not_equal(a->qp[0].qp->qp_num, qpn0);
	assert_int_not_equal(a->qp[1].qp->qp_num, qpn1);
	assert_null(P[0].qp);
	assert_null(P[1].qp);
	assert_non_null(P[2].qp);
}

/* No memory for new QPs at a reset: the old ones go RESET -> INIT (the
 * mock's error state cleared), same QP numbers, and the ops complete once. */
static void test_reset_without_new_qps(void **state)
{
	struct kvb_ep *a;
	int32_t st[256];
	unsigned seen[256] = {0};
	uint32_t qpn0;

	(void) state;
	a = ready_ep(); /* P[0], P[1] */
	qpn0 = a->qp[0].qp->qp_num;
	post_n(a, 2, 0xa0);
	cq_push(0, IBV_WC_REM_ACCESS_ERR);
	fail_creates = 2;
	assert_int_equal(drain(st, seen), 2);
	assert_int_equal(t->ops->post(t, a, NULL, 0), -ENOTCONN);
	assert_int_equal(fail_creates, 0);
	assert_int_equal(a->state, KVB_RDMA_EP_RESET);
	assert_int_equal(a->qp[0].qp->qp_num, qpn0);
	assert_int_equal(P[0].err, 0);
	assert_int_equal(seen[0xa0] + seen[0xa1], 2);
	assert_int_equal(st[0xa0], -EACCES);
}

/* After disconnecting a (a0..a2 in flight) and b (b0 retired, b1 in
 * flight): each op handed out once, the in-flight ones aborted. */
static void disconnected_ok(const int32_t *st, const unsigned *seen)
{
	for (unsigned c = 0xa0; c <= 0xa2; c++) {
		assert_int_equal(seen[c], 1);
		assert_int_equal(st[c], -ECONNABORTED);
	}
	assert_int_equal(seen[0xb0], 1);
	assert_int_equal(st[0xb0], 0);
	assert_int_equal(seen[0xb1], 1);
	assert_int_equal(st[0xb1], -ECONNABORTED);
}

static void test_disconnect_completes_accepted_ops(void **state)
{
	struct kvb_ep *a, *b;
	int32_t st[256];
	unsigned seen[256] = {0};

	(void) state;
	a = ready_ep();
	b = ready_ep();
	post_n(a, 3, 0xa0); /* one chain on a.qp0 */
	post_n(b, 2, 0xb0);
	/* b's first write landed and was retired, not yet handed out */
	cq_push(2, IBV_WC_SUCCESS);
	_kvb_rdma_cq_drain(r); /* into its chain, not handed out */
	assert_int_equal(ncqe, 0);
	t->ops->disconnect(t, b);
	t->ops->disconnect(t, a);
	assert_null(r->eps);
	assert_int_equal(drain(st, seen), 5);
	disconnected_ok(st, seen);
}

static void test_completion_events(void **state)
{
	struct kvb_xcqe out[32];
	struct kvb_ep *a;

	(void) state;
	/* no channel: nothing to arm, nothing waiting */
	assert_int_equal(t->ops->wait_fd(t), -1);
	assert_int_equal(t->ops->arm(t), 0);
	r->nics[0].chan = &mchan;
	mchan.fd = 42;
	assert_int_equal(t->ops->wait_fd(t), 42);
	/* busy polling never arms */
	assert_int_equal(t->ops->poll(t, out, 32), 0);
	assert_int_equal(arms, 0);
	/* about to sleep: armed once, not again while no event came */
	assert_int_equal(t->ops->arm(t), 0);
	assert_int_equal(t->ops->arm(t), 0);
	assert_int_equal(arms, 1);
	/* the event came: the next arm() reads it and asks again */
	a = ready_ep();
	post_n(a, 1, 0xa0);
	cq_push(0, IBV_WC_SUCCESS);
	events_pending = 1;
	assert_int_equal(t->ops->poll(t, out, 32), 1);
	assert_int_equal(out[0].cookie, 0xa0);
	assert_int_equal(t->ops->arm(t), 0);
	assert_int_equal(events_pending, 0);
	assert_int_equal(arms, 2);
	/* a completion that landed before the request has no event of its
	 * own: arm() says "do not sleep" and poll() hands it out */
	post_n(a, 1, 0xa1); /* round robin: a.qp1, P[1] */
	events_pending = 1;
	push_on_arm = 1;
	assert_int_equal(t->ops->arm(t), 1);
	assert_int_equal(arms, 3);
	assert_int_equal(t->ops->poll(t, out, 32), 1);
	assert_int_equal(out[0].cookie, 0xa1);
	/* a completion retired but not handed out: do not sleep either */
	post_n(a, 1, 0xa2);
	cq_push(0, IBV_WC_SUCCESS);
	_kvb_rdma_cq_drain(r);
	assert_int_equal(t->ops->arm(t), 1);
	assert_int_equal(t->ops->poll(t, out, 32), 1);
	assert_int_equal(out[0].cookie, 0xa2);
	/* acks go in batches of 64; close() acks the rest (ibv_destroy_cq
	 * would wait for them) */
	assert_int_equal(acked, 0);
	events_pending = 70;
	assert_int_equal(t->ops->arm(t), 0);
	assert_int_equal(acked, 72);
	assert_int_equal(r->nics[0].unacked, 0);
	events_pending = 1;
	assert_int_equal(t->ops->arm(t), 0);
	assert_int_equal(r->nics[0].unacked, 1);
	r->nics[0].chan = NULL; /* the mock channel is not the library's */
}

/* A blob of 2 QPs from endpoint `ep` of peer `node`: an answer to our
 * endpoint `to_ep`, or an offer when 0. */
static size_t peer_blob(void *buf, uint64_t node, uint64_t ep, uint64_t to_ep)
{
	struct kvb_rdma_conn c = {.version = KVB_RDMA_CONN_VERSION,
				  .nqp = 2,
				  .node = node,
				  .ep = ep,
				  .to_ep = to_ep,
				  .nnic = 1,
				  .nic = {{.mtu = IBV_MTU_1024, .port = 1}}};
	size_t len = KVB_RDMA_CONN_MAX;

	c.qp[0].qpn = 900;
	c.qp[1].qpn = 901;
	assert_int_equal(kvb_rdma_conn_encode(&c, buf, &len), 0);
	return len;
}

static void test_disconnect_without_memory(void **state)
{
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_ep *a, *b, *e;
	int32_t st[256];
	unsigned seen[256] = {0};
	uint64_t b_token;
	size_t len;

	(void) state;
	a = ready_ep();
	b = ready_ep();
	b->peer.node = 0x5eed; /* as the peer's blob would have set */
	b->peer.ep = 0xb0b;
	b_token = b->token;
	post_n(a, 3, 0xa0);
	post_n(b, 2, 0xb0);
	cq_push(2, IBV_WC_SUCCESS); /* b's first write retired, not reaped */
	_kvb_rdma_cq_drain(r);
	/* b's orphans find no memory: b stays, its QPs in error (which
	 * flushes what the mock holds: stale now) */
	fail_reallocs = 1;
	t->ops->disconnect(t, b);
	assert_int_equal(failed_reallocs, 1);
	assert_ptr_equal(r->eps, b);
	assert_int_equal(P[2].err, 1);
	assert_int_equal(P[3].err, 1);
	assert_int_equal(ncqe, 1); /* b1's flush */
	/* a's go through the orphan queue as usual */
	t->ops->disconnect(t, a);
	assert_int_equal(failed_reallocs, 1);
	assert_int_equal(drain(st, seen), 5);
	assert_int_equal(ncqe, 0);
	disconnected_ok(st, seen);
	assert_int_equal(b->qp[0].ch.st.stale_cqes, 1);
	/* nothing more, from the chains or the flushes */
	assert_int_equal(drain(st, seen), 0);

	/* the broker forgot b: a late answer to its offer is unknown, as for
	 * an endpoint freed, and a re-offer of its peer gets a new one */
	len = peer_blob(blob, 0x5eed, 0xb0b, b_token);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), -ENOENT);
	len = peer_blob(blob, 0x5eed, 0xb0b, 0);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), 0);
	assert_ptr_not_equal(e, b);
	assert_int_equal(e->state, KVB_RDMA_EP_READY);
	/* close() frees b with the rest (teardown, under ASan's leak check) */
}

/* n writes of len bytes, never contiguous, from a region the mock never
 * reads; returns what post() took */
static int post_len(struct kvb_ep *ep, unsigned n, uint32_t len, uint64_t c0)
{
	static struct kvb_mr big = {.id = 2, .addr = lbuf, .len = 1ull << 34};
	struct kvb_xop op[16];

	assert_true(n <= 16);
	memset(op, 0, sizeof(op));
	big.lkey = 8;
	for (unsigned i = 0; i < n; i++) {
		op[i].opcode = KVB_XOP_WRITE;
		op[i].local = &big;
		op[i].local_off = 2ull * i * len;
		op[i].len = len;
		op[i].remote.addr = 0x100000;
		op[i].remote.rkey = 9;
		op[i].remote_off = 2ull * i * len;
		op[i].cookie = c0 + i;
	}
	return t->ops->post(t, ep, op, n);
}

/* Several QPs per peer: a large chain is spread so that their bytes in
 * flight stay level; a small one stays whole on one QP; the next chain
 * goes to the QP with the fewest bytes in flight. */
static void test_chain_spread_over_qps(void **state)
{
	const uint32_t K256 = 256u << 10;
	struct kvb_ep *a;
	uint64_t db;

	(void) state;
	r->p.qp_per_peer = 4;
	a = ready_ep(); /* P[0..3] */
	/* 8 x 256 KiB = 2 MiB: 512 KiB, two WRs, on each QP */
	db = t->stats.doorbells;
	assert_int_equal(post_len(a, 8, K256, 0x10), 8);
	for (int q = 0; q < 4; q++) {
		assert_int_equal(P[q].n, 2);
		assert_int_equal(a->qp[q].ch.inflight_bytes, 2ull * K256);
	}
	assert_int_equal(t->stats.doorbells - db, 4);
	/* QP 2's writes land: the next chain goes there (fewest bytes),
	 * and as the others are at 512 KiB it takes up to the new level
	 * (1.5 MiB + 1 MiB) / 4 = 640 KiB: two writes, the third spills */
	cq_push(2, IBV_WC_SUCCESS);
	cq_push(2, IBV_WC_SUCCESS);
	_kvb_rdma_cq_drain(r);
	assert_int_equal(a->qp[2].ch.inflight_bytes, 0);
	assert_int_equal(post_len(a, 4, K256, 0x20), 4);
	assert_int_equal(P[2].n, 2);
	assert_int_equal(P[0].n + P[1].n + P[3].n, 8);
	/* small writes (below the 256 KiB share) stay one chain, one QP */
	db = t->stats.doorbells;
	assert_int_equal(post_len(a, 5, 4096, 0x30), 5);
	assert_int_equal(t->stats.doorbells - db, 1);
	/* one QP alone: nothing is cut */
	{
		struct kvb_ep *b;

		r->p.qp_per_peer = 1;
		b = ready_ep(); /* P[4] */
		db = t->stats.doorbells;
		assert_int_equal(post_len(b, 8, K256, 0x40), 8);
		assert_int_equal(P[4].n, 8);
		assert_int_equal(t->stats.doorbells - db, 1);
	}
}

/* ---- several NICs ---- */

static void two_nics(void)
{
	r->nnic = 2;
	kvb_rdma_set_log(t, log_line, NULL);
}

/* A peer's local_info with m NICs (no QPs) */
static size_t peer_info(void *buf, uint64_t node, unsigned m)
{
	struct kvb_rdma_conn c = {.nnic = (uint8_t) m, .node = node};
	size_t len = KVB_RDMA_CONN_MAX;

	for (unsigned i = 0; i < m; i++) {
		c.nic[i].mtu = IBV_MTU_1024;
		c.nic[i].port = 1;
		c.nic[i].gid[15] = (uint8_t) i;
	}
	assert_int_equal(kvb_rdma_conn_encode(&c, buf, &len), 0);
	return len;
}

/* Our endpoint to a peer of m NICs, READY as if its answer came */
static struct kvb_ep *ready_ep_to(unsigned m)
{
	uint8_t blob[KVB_RDMA_CONN_MAX];
	size_t len = peer_info(blob, 0x5eed + m, m);
	struct kvb_ep *ep;

	assert_int_equal(_kvb_rdma_connect(t, blob, len, &ep), 0);
	ep->state = KVB_RDMA_EP_READY;
	return ep;
}

static struct kvb_mr reg(uint32_t id, uint64_t len)
{
	struct kvb_mr m = {.id = id, .addr = lbuf, .len = len};

	assert_int_equal(t->ops->reg_mr(t, &m), 0);
	return m;
}

/* Regions are registered on every NIC; the home is the NIC on the
 * memory's NUMA node, else (unknown) the one with fewest regions; mr's
 * keys are the home's, mr_keys gives each NIC's, dereg undoes all. */
static void test_nic_regions(void **state)
{
	struct kvb_transport_nic n[KVB_NIC_MAX];
	int node = _kvb_rdma_mem_numa(lbuf);
	struct kvb_mr a, b, c;
	struct kvb_rdma_reg *g;
	uint32_t keys[KVB_NIC_MAX];
	unsigned home = 9;
	char why[256];

	(void) state;
	two_nics();
	a = reg(1, 4096); /* both NUMA unknown: a tie, NIC 0 */
	b = reg(2, 4096); /* a tie again: NIC 1 has fewer */
	g = a.tpriv[KVB_RDMA_TPRIV];
	assert_non_null(g->mr[0]);
	assert_non_null(g->mr[1]);
	assert_int_equal(g->home, 0);
	assert_int_equal(a.lkey, g->mr[0]->lkey);
	assert_int_equal(a.lkey & 0xf000, 0x1000);
	g = b.tpriv[KVB_RDMA_TPRIV];
	assert_int_equal(g->home, 1);
	assert_int_equal(b.rkey, g->mr[1]->rkey);
	assert_int_equal(b.lkey & 0xf000, 0x2000);
	assert_int_equal(t->ops->mr_keys(t, &b, keys, KVB_NIC_MAX, &home), 2);
	assert_int_equal(home, 1);
	assert_int_equal(keys[0], g->mr[0]->rkey);
	assert_int_equal(keys[1], g->mr[1]->rkey);
	assert_int_equal(t->ops->mr_nic(t, &b, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "mock1"));
	assert_non_null(strstr(why, "equally near"));
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_INFO], "region 0x2"));
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[0].regions, 1);
	assert_int_equal(n[1].regions, 1);
	assert_string_equal(n[1].name, "mock1");

	/* NUMA known: NIC 1 on the memory's node wins though it has more */
	if (node >= 0) {
		r->nics[0].numa = node + 1;
		r->nics[1].numa = node;
		c = reg(3, 4096);
		assert_int_equal(t->ops->mr_nic(t, &c, why, sizeof(why)), 1);
		assert_non_null(strstr(why, "NUMA node"));
		t->ops->dereg_mr(t, &c);
	}
	t->ops->dereg_mr(t, &a);
	t->ops->dereg_mr(t, &b);
	assert_int_equal(ndereg, nreg);
	assert_null(a.tpriv[KVB_RDMA_TPRIV]);
	assert_int_equal(t->ops->mr_nic(t, &a, NULL, 0), -ENOENT);
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[0].regions + n[1].regions, 0);
}

/* QPs per NIC pair, as the rails go: 2 x 2 NICs (0,0) (1,1); 2 x 1
 * (0,0) (1,0); qp_per_peer each, fewer when a budget says so, and a
 * connect refused (-EUSERS, counted, logged) when one each won't fit. */
static void test_nic_pairs_budget(void **state)
{
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_transport_nic n[KVB_NIC_MAX];
	struct kvb_rdma_conn c;
	struct kvb_ep *a, *b, *e;
	size_t len;

	(void) state;
	two_nics();
	a = ready_ep_to(2);
	assert_int_equal(a->nqp, 4);
	assert_int_equal(a->qp[0].lnic, 0);
	assert_int_equal(a->qp[1].rnic, 0);
	assert_int_equal(a->qp[2].lnic, 1);
	assert_int_equal(a->qp[3].rnic, 1);
	b = ready_ep_to(1);
	assert_int_equal(b->nqp, 4);
	assert_int_equal(b->qp[2].lnic, 1);
	assert_int_equal(b->qp[2].rnic, 0);
	assert_int_equal(r->nics[0].qps, 4);
	assert_int_equal(r->nics[1].qps, 4);
	/* our answer lists both NICs and each QP's pair (version 2) */
	len = sizeof(blob);
	assert_int_equal(kvb_rdma_ep_info(t, b, blob, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&c, blob, len), 0);
	assert_int_equal(c.version, 2);
	assert_int_equal(c.nnic, 2);
	assert_int_equal(c.qp[3].lnic, 1);
	assert_int_equal(c.qp[3].rnic, 0);

	/* room for one more QP on NIC 1: one QP per pair */
	r->nics[1].max_qps = 5;
	e = ready_ep_to(2);
	assert_int_equal(e->nqp, 2);
	assert_int_equal(e->qp[1].lnic, 1);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_INFO], "1 QPs per"));
	/* none: refused, counted, logged with the device and its budget */
	len = peer_info(blob, 0x77, 2);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), -EUSERS);
	assert_int_equal(r->nics[1].qp_refused, 1);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], "mock1"));
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], "budget of 5"));
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[1].qps, 5);
	assert_int_equal(n[1].max_qps, 5);
	assert_int_equal(n[1].qp_refused, 1);
	assert_int_equal(n[0].qp_refused, 0);
	/* a peer's offer over the budget is refused too (we cannot choose
	 * fewer: the offer decided) */
	memset(&c, 0, sizeof(c));
	c.nnic = 1;
	c.nic[0].mtu = IBV_MTU_1024;
	c.node = 0x99;
	c.ep = 0x98;
	c.nqp = 2;
	c.qp[0].qpn = 900;
	c.qp[1].qpn = 901;
	c.qp[1].rnic = 1;
	len = sizeof(blob);
	assert_int_equal(kvb_rdma_conn_encode(&c, blob, &len), 0);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), -EUSERS);
	assert_int_equal(r->nics[1].qp_refused, 2);
	/* ... and one naming a NIC we do not have is malformed */
	c.qp[1].rnic = 2;
	len = sizeof(blob);
	assert_int_equal(kvb_rdma_conn_encode(&c, blob, &len), 0);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), -EPROTO);
	/* freed QPs give the budget back */
	_kvb_rdma_ep_destroy(r, a);
	assert_int_equal(r->nics[1].qps, 3);
}

/* The posted WR of P[i]: its keys */
static void assert_keys(int i, uint32_t lkey, uint32_t rkey)
{
	assert_int_equal(P[i].lkey, lkey);
	assert_int_equal(P[i].rkey, rkey);
}

static struct kvb_xop xop(struct kvb_mr *m, uint64_t len, uint8_t nic,
			  const uint32_t *rkeys, uint8_t nrkeys, uint64_t ck)
{
	struct kvb_xop o = {.opcode = KVB_XOP_WRITE,
			    .local = m,
			    .len = len,
			    .remote = {.addr = 0x100000,
				       .rkey = 0x99,
				       .rkeys = rkeys,
				       .nrkeys = nrkeys,
				       .nic = nic},
			    .cookie = ck};
	return o;
}

/* A chain goes on the pair (its region's home, the remote region's NIC)
 * with that pair's keys; without the peer's other keys it must land on
 * the remote region's NIC; a large one spreads over both pairs; the
 * per-NIC counters tell. */
static void test_nic_post_pair(void **state)
{
	static const uint32_t rk[2] = {0x70, 0x71};
	struct kvb_transport_nic n[KVB_NIC_MAX];
	struct kvb_rdma_reg *ga, *gb;
	struct kvb_mr a, b;
	struct kvb_xop o;
	struct kvb_ep *ep;

	(void) state;
	two_nics();
	r->p.qp_per_peer = 1;
	ep = ready_ep_to(2); /* P[0] (0,0), P[1] (1,1) */
	a = reg(1, 1ull << 34); /* home 0 */
	b = reg(2, 1ull << 34); /* home 1 */
	ga = a.tpriv[KVB_RDMA_TPRIV];
	gb = b.tpriv[KVB_RDMA_TPRIV];
	o = xop(&a, 4096, 0, rk, 2, 1);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[0].n, 1);
	assert_keys(0, ga->mr[0]->lkey, 0x70);
	o = xop(&b, 4096, 1, rk, 2, 2);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[1].n, 1);
	assert_keys(1, gb->mr[1]->lkey, 0x71);
	/* a's home NIC 0 to the peer's NIC 1: no such pair; with both keys
	 * it stays on NIC 0 (to the peer's NIC 0, rkeys[0]) */
	o = xop(&a, 4096, 1, rk, 2, 3);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[0].n, 2);
	assert_keys(0, ga->mr[0]->lkey, 0x70);
	/* only rkey (the key on the peer's NIC 1): it must land there, so
	 * it leaves from our NIC 1 with a's key on NIC 1 */
	o = xop(&a, 4096, 1, NULL, 0, 4);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[1].n, 2);
	assert_keys(1, ga->mr[1]->lkey, 0x99);
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[0].doorbells, 2);
	assert_int_equal(n[1].doorbells, 2);
	assert_int_equal(n[0].bytes, 8192);
	assert_int_equal(n[0].moved + n[1].moved, 0);
	/* mixed chain: runs per pair, in order */
	{
		struct kvb_xop m[3] = {xop(&a, 4096, 0, rk, 2, 5),
				       xop(&b, 4096, 1, rk, 2, 6),
				       xop(&a, 4096, 0, rk, 2, 7)};

		m[2].local_off = 8192;
		assert_int_equal(t->ops->post(t, ep, m, 3), 3);
		assert_int_equal(P[0].n, 4);
		assert_int_equal(P[1].n, 3);
	}
	/* 8 x 1 MiB from a: over both pairs, levelled */
	{
		struct kvb_xop m[8];

		for (unsigned i = 0; i < 8; i++) {
			m[i] = xop(&a, 1u << 20, 0, rk, 2, 0x10 + i);
			m[i].local_off = 2ull * i << 20;
			m[i].remote_off = 2ull * i << 20;
		}
		assert_int_equal(t->ops->post(t, ep, m, 8), 8);
		assert_true(P[0].n > 4 && P[1].n > 3);
		assert_int_equal(P[0].n + P[1].n, 7 + 8);
		assert_int_equal(P[1].rkey, 0x71);
		assert_int_equal(P[1].lkey, ga->mr[1]->lkey);
	}
	t->ops->dereg_mr(t, &a);
	t->ops->dereg_mr(t, &b);
}

/* A NIC whose port goes down takes no new chains: its regions' chains go
 * through the next NIC up (counted as moved there), what it had in
 * flight still completes once; with no NIC up post() is -ENETDOWN; back
 * up, its regions come home. */
static void test_nic_failover(void **state)
{
	static const uint32_t rk[2] = {0x70, 0x71};
	struct kvb_transport_nic n[KVB_NIC_MAX];
	struct kvb_rdma_async_stats s;
	int32_t st[256];
	unsigned seen[256] = {0};
	struct kvb_mr a, b;
	struct kvb_xop o;
	struct kvb_ep *ep;
	char why[256];

	(void) state;
	two_nics();
	r->p.qp_per_peer = 1;
	ep = ready_ep_to(2); /* P[0] (0,0), P[1] (1,1) */
	a = reg(1, 1 << 20); /* home 0 */
	b = reg(2, 1 << 20); /* home 1 */
	o = xop(&b, 4096, 1, rk, 2, 0x10); /* in flight on NIC 1 */
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[1].n, 1);
	queue_event_on(1, IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], "mock1 port 1"));
	kvb_rdma_async_get_stats(t, &s);
	assert_false(s.port_down); /* not every NIC */
	/* b's next chain goes through NIC 0, to the peer's NIC 0 */
	o = xop(&b, 4096, 1, rk, 2, 0x11);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[0].n, 1);
	assert_keys(0, ((struct kvb_rdma_reg *) b.tpriv[KVB_RDMA_TPRIV])
			       ->mr[0]
			       ->lkey,
		    0x70);
	assert_int_equal(t->ops->mr_nic(t, &b, why, sizeof(why)), 0);
	assert_non_null(strstr(why, "down: through mock0"));
	o = xop(&a, 4096, 0, rk, 2, 0x12); /* a's own: not moved */
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[0].moved, 1);
	assert_int_equal(n[1].moved, 0);
	assert_int_equal(n[1].port_up, 0);
	/* the chain in flight on NIC 1 ends by its completion (an error),
	 * and every op completes once */
	cq_push(1, IBV_WC_RETRY_EXC_ERR);
	cq_push(0, IBV_WC_SUCCESS);
	cq_push(0, IBV_WC_SUCCESS);
	assert_int_equal(drain(st, seen), 3);
	assert_int_equal(seen[0x10] + seen[0x11] + seen[0x12], 3);
	assert_int_not_equal(st[0x10], 0);
	assert_int_equal(st[0x11], 0);
	/* (the error reset the endpoint: READY again, as after a re-handshake) */
	ep->state = KVB_RDMA_EP_READY;
	/* both down: -ENETDOWN */
	queue_event_on(0, IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	o = xop(&a, 4096, 0, rk, 2, 0x13);
	assert_int_equal(t->ops->post(t, ep, &o, 1), -ENETDOWN);
	kvb_rdma_async_get_stats(t, &s);
	assert_true(s.port_down);
	/* NIC 1 back: b's chains go home again */
	queue_event_on(1, IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	o = xop(&b, 4096, 1, rk, 2, 0x14);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[3].n, 1); /* NIC 1's renewed QP */
	assert_int_equal(P[3].qp->context, &mctx[1]);
	/* a (home NIC 0, down) moves to NIC 1 */
	o = xop(&a, 4096, 0, rk, 2, 0x15);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[3].n, 2);
	assert_int_equal(r->nics[1].moved, 1);
	t->ops->dereg_mr(t, &a);
	t->ops->dereg_mr(t, &b);
}

/* stats_format: a line / an object per NIC */
static void test_nic_stats(void **state)
{
	char buf[4096];
	size_t len;

	(void) state;
	two_nics();
	r->nics[1].bytes = 12345;
	len = t->ops->stats_format(t, NULL, 1, buf, sizeof(buf));
	assert_true(len > 0 && len < sizeof(buf));
	assert_non_null(strstr(buf, "\"rdma_nics\":[{\"name\":\"mock0\""));
	assert_non_null(strstr(buf, "\"bytes\":12345"));
	len = t->ops->stats_format(t, NULL, 0, buf, sizeof(buf));
	assert_non_null(strstr(buf, "rdma nic mock1"));
	assert_non_null(strstr(buf, "12345 bytes"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_error_and_success_in_one_batch, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_disconnect_completes_accepted_ops, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_completion_events, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_disconnect_without_memory,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_spread_over_qps,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_device_events, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sge_choice, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_reset_without_new_qps,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_nic_regions, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_pairs_budget, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_post_pair, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_failover, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_stats, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

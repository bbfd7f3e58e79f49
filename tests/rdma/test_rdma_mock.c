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
 *    one SGE from then on when the device refuses more at create time.
 * The mock verbs are in mock_verbs.c; several NICs: test_rdma_nics.c.
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
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

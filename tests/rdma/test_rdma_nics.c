// SPDX-License-Identifier: MIT
/*
 * The rdma transport over two mock devices (NICs; mock_verbs.c), no
 * hardware:
 *  - regions registered on both with the nearest (NUMA node, else fewest
 *    regions) as home and its keys in mr; mr_keys / mr_nic; dereg undoes
 *    both;
 *  - QPs per NIC pair as the rails go, fewer per pair under a QP budget,
 *    a connect refused (-EUSERS, counted, logged) when one each won't fit,
 *    a peer's offer naming a NIC we lack is -EPROTO;
 *  - post() on the pair of the regions' NICs with that pair's keys; a
 *    large chain over both pairs;
 *  - a NIC's port down moves new chains to the other (counted), what it
 *    had in flight completes, its failed QP is parked (counted) with no
 *    reset, none up is -ENETDOWN; back up and idle, a re-handshake and
 *    chains go home; a handshake while a NIC is down parks its QPs (flag in the
 *    blob) and a re-handshake reconnects them once it is up and idle;
 *  - per-NIC counters in nics() and stats_format.
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

#include "fake_sysfs.h"
#include "mock_verbs.h"
#include "rdma/topo.h"

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

/* GPU memory goes to the NIC under its GPU's PCIe switch: the bus id the
 * broker copies into mr.pci (from the worker's export handle) is looked up
 * in the sysfs tree, whatever the regions' count says. */
static void test_nic_gpu_home(void **state)
{
	static const char desc[] =
		"nic mock0 pci0000:15/0000:15:01.0/0000:16:00.0/"
		"0000:17:00.0/0000:18:00.0 0 1:active:eth\n"
		"nic mock1 pci0000:58/0000:58:01.0/0000:59:00.0/"
		"0000:5a:00.0/0000:5b:00.0 0 1:active:eth\n"
		"pci pci0000:58/0000:58:01.0/0000:59:00.0/"
		"0000:5a:01.0/0000:5c:00.0 0\n";
	struct kvb_topo *saved = r->topo, *topo = NULL;
	struct kvb_mr a, g, u;
	char root[256], why[256];

	(void) state;
	two_nics();
	assert_int_equal(fake_sysfs_build(desc, root, sizeof(root)), 0);
	assert_int_equal(kvb_topo_open(root, &topo, NULL, 0), 0);
	r->topo = topo;
	a = reg(1, 4096); /* host, NUMA unknown to the tree: NIC 0 */
	g = (struct kvb_mr){.id = 2,
			    .addr = lbuf,
			    .len = 4096,
			    .kind = KVB_MEM_GPU,
			    .pci = "0000:5c:00.0"};
	assert_int_equal(t->ops->reg_mr(t, &g), 0);
	/* a tie by count would give NIC 1 too: a second GPU region on the
	 * same GPU shows that the switch, not the count, decides */
	u = (struct kvb_mr){.id = 3,
			    .addr = lbuf,
			    .len = 4096,
			    .kind = KVB_MEM_GPU,
			    .pci = "0000:5c:00.0"};
	assert_int_equal(t->ops->reg_mr(t, &u), 0);
	assert_int_equal(t->ops->mr_nic(t, &g, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "mock1"));
	assert_non_null(strstr(why, "0000:5c:00.0"));
	assert_int_equal(t->ops->mr_nic(t, &u, NULL, 0), 1);
	t->ops->dereg_mr(t, &u);
	t->ops->dereg_mr(t, &g);
	/* without a bus id: the NIC with the fewest regions, said so */
	g.pci[0] = '\0';
	assert_int_equal(t->ops->reg_mr(t, &g), 0);
	assert_int_equal(t->ops->mr_nic(t, &g, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "PCI address unknown"));
	t->ops->dereg_mr(t, &g);
	t->ops->dereg_mr(t, &a);
	r->topo = saved;
	kvb_topo_close(topo);
	fake_sysfs_remove(root);
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
	ep = ready_ep_to(2);	/* P[0] (0,0), P[1] (1,1) */
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

/* The peer's answer to our endpoint e (QPs (0,0) and (1,1)) */
static size_t answer(void *buf, const struct kvb_ep *e)
{
	struct kvb_rdma_conn c = {.nnic = 2,
				  .node = e->peer.node,
				  .ep = 0xabc,
				  .to_ep = e->token,
				  .nqp = 2};
	size_t len = KVB_RDMA_CONN_MAX;

	c.nic[0].mtu = c.nic[1].mtu = IBV_MTU_1024;
	c.qp[0].qpn = 900;
	c.qp[1].qpn = 901;
	c.qp[1].lnic = c.qp[1].rnic = 1;
	assert_int_equal(kvb_rdma_conn_encode(&c, buf, &len), 0);
	return len;
}

/* The peer's offer again (a re-handshake of e, at epoch), its QP on NIC 1
 * flagged f1 */
static size_t reoffer(void *buf, const struct kvb_ep *e, uint32_t epoch,
		      uint8_t f1)
{
	struct kvb_rdma_conn c = {.nnic = 2,
				  .node = e->peer.node,
				  .ep = 0xabc,
				  .epoch = epoch,
				  .nqp = 2};
	size_t len = KVB_RDMA_CONN_MAX;

	c.nic[0].mtu = c.nic[1].mtu = IBV_MTU_1024;
	c.qp[0].qpn = 910;
	c.qp[1].qpn = 911;
	c.qp[1].lnic = c.qp[1].rnic = 1;
	c.qp[1].flags = f1;
	assert_int_equal(kvb_rdma_conn_encode(&c, buf, &len), 0);
	return len;
}

/* Two NICs, one QP per pair: our endpoint to a peer of two NICs, READY
 * by its answer (P[0] on pair (0,0), P[1] on (1,1)), and two regions,
 * *a homed on NIC 0 and *b on NIC 1 */
static struct kvb_ep *answered_ep(struct kvb_mr *a, struct kvb_mr *b)
{
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_ep *ep, *e2;
	size_t len;

	two_nics();
	r->p.qp_per_peer = 1;
	len = peer_info(blob, 0x42, 2);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &ep), 0);
	len = answer(blob, ep);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e2), 0);
	assert_ptr_equal(e2, ep);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	*a = reg(1, 1 << 20); /* home 0 */
	*b = reg(2, 1 << 20); /* home 1 */
	return ep;
}

/* A NIC whose port goes down takes no new chains: its regions' chains go
 * through the next NIC up (counted as moved there), what it had in
 * flight still completes once; its QP that failed is parked (counted)
 * and the endpoint goes on through NIC 0's pair, no reset; with no NIC
 * up post() is -ENETDOWN; back up and idle, the endpoint resets for a
 * re-handshake that reconnects NIC 1's QP, and its regions come home. */
static void test_nic_failover(void **state)
{
	static const uint32_t rk[2] = {0x70, 0x71};
	struct kvb_transport_nic n[KVB_NIC_MAX];
	struct kvb_rdma_async_stats s;
	int32_t st[256];
	unsigned seen[256] = {0};
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_mr a, b;
	struct kvb_xop o;
	struct kvb_ep *ep, *e2;
	char why[256];
	size_t len;

	(void) state;
	ep = answered_ep(&a, &b);
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
	assert_keys(
		0,
		((struct kvb_rdma_reg *) b.tpriv[KVB_RDMA_TPRIV])->mr[0]->lkey,
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
	/* NIC 1's failed QP parked, the endpoint READY on NIC 0's pair */
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	assert_int_equal(ep->qp[1].parked, QP_PARK_LOCAL);
	assert_int_equal(ep->qp[0].parked, 0);
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_int_equal(n[1].qp_parked, 1);
	assert_int_equal(n[0].qp_parked, 0);
	assert_non_null(strstr(last_log[KVB_RDMA_LOG_WARN], "failed: parked"));
	o = xop(&b, 4096, 1, rk, 2, 0x16);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[0].n, 1); /* NIC 0's QP (the others drained) */
	cq_push(0, IBV_WC_SUCCESS);
	assert_int_equal(drain(st, seen), 1);
	assert_int_equal(st[0x16], 0);
	/* both down: -ENETDOWN */
	queue_event_on(0, IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	o = xop(&a, 4096, 0, rk, 2, 0x13);
	assert_int_equal(t->ops->post(t, ep, &o, 1), -ENETDOWN);
	kvb_rdma_async_get_stats(t, &s);
	assert_true(s.port_down);
	/* NIC 1 back, nothing in flight: the next poll() (not a post())
	 * resets the endpoint for a re-handshake, which connects NIC 1's
	 * renewed QP; b's chains go home again */
	queue_event_on(1, IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_RESET);
	o = xop(&b, 4096, 1, rk, 2, 0x14);
	assert_int_equal(t->ops->post(t, ep, &o, 1), -ENOTCONN);
	len = reoffer(blob, ep, 1, 0);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e2), 0);
	assert_ptr_equal(e2, ep);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	assert_int_equal(ep->qp[1].parked, 0);
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

/* A handshake while NIC 1's port is down leaves its QP parked (and says
 * so in our blob); chains take the other pair; once NIC 1 is up and
 * nothing is in flight, poll() resets the endpoint for a re-handshake.
 * A QP parked because the peer's is stays so (no reset loop). */
static void test_nic_parked(void **state)
{
	static const uint32_t rk[2] = {0x70, 0x71};
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn c;
	int32_t st[256];
	unsigned seen[256] = {0};
	struct kvb_mr a, b;
	struct kvb_ep *e, *e2;
	struct kvb_xop o;
	size_t len;

	(void) state;
	two_nics();
	r->p.qp_per_peer = 1;
	a = reg(1, 1 << 20); /* home 0 */
	b = reg(2, 1 << 20); /* home 1 */
	len = peer_info(blob, 0x42, 2);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e), 0); /* HALF */
	queue_event_on(1, IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	len = answer(blob, e);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e2), 0);
	assert_ptr_equal(e2, e);
	assert_int_equal(e->state, KVB_RDMA_EP_READY);
	assert_int_equal(e->qp[0].parked, 0);
	assert_int_equal(e->qp[1].parked, QP_PARK_LOCAL);
	len = sizeof(blob);
	assert_int_equal(kvb_rdma_ep_info(t, e, blob, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&c, blob, len), 0);
	assert_int_equal(c.qp[1].flags, KVB_RDMA_QP_PARKED);
	assert_int_equal(c.qp[0].flags, 0);
	/* b's chain: NIC 0, moved */
	o = xop(&b, 4096, 1, rk, 2, 1);
	assert_int_equal(t->ops->post(t, e, &o, 1), 1);
	assert_int_equal(P[0].n, 1);
	assert_int_equal(r->nics[0].moved, 1);
	/* NIC 1 back, an op in flight: no reset yet (a poll() leaves it
	 * READY), chains still flow on the connected pair */
	queue_event_on(1, IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(e->state, KVB_RDMA_EP_READY);
	o = xop(&b, 4096, 1, rk, 2, 2);
	assert_int_equal(t->ops->post(t, e, &o, 1), 1);
	assert_int_equal(P[0].n, 2);
	cq_push(0, IBV_WC_SUCCESS);
	cq_push(0, IBV_WC_SUCCESS);
	/* idle: the poll() that took the last completions resets it for a
	 * re-handshake; a post() then is -ENOTCONN */
	assert_int_equal(drain(st, seen), 2);
	assert_int_equal(e->state, KVB_RDMA_EP_RESET);
	o = xop(&a, 4096, 0, rk, 2, 3);
	assert_int_equal(t->ops->post(t, e, &o, 1), -ENOTCONN);
	/* the peer re-offers (a new epoch) with its QP on NIC 1 parked:
	 * ours stays parked though NIC 1 is up, and no reset follows */
	len = reoffer(blob, e, 1, KVB_RDMA_QP_PARKED);
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e2), 0);
	assert_ptr_equal(e2, e);
	assert_int_equal(e->state, KVB_RDMA_EP_READY);
	assert_int_equal(e->qp[1].parked, QP_PARK_PEER);
	o = xop(&b, 4096, 1, rk, 2, 4);
	assert_int_equal(t->ops->post(t, e, &o, 1), 1);
	assert_int_equal(e->state, KVB_RDMA_EP_READY);
	t->ops->dereg_mr(t, &a);
	t->ops->dereg_mr(t, &b);
}

/* A QP that fails while its NIC still looks up (its port-down event not
 * read yet, or a failure on the path) is parked; poll() reconnects it
 * only after the hold, or at once once the NIC went down and up since;
 * the offer after that reset flags no QP whose NIC is up. */
static void test_nic_park_hold(void **state)
{
	static const uint32_t rk[2] = {0x70, 0x71};
	uint8_t blob[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn c;
	int32_t st[256];
	unsigned seen[256] = {0};
	struct kvb_mr a, b;
	struct kvb_xop o;
	struct kvb_ep *ep, *e2;
	size_t len;

	(void) state;
	ep = answered_ep(&a, &b);
	o = xop(&b, 4096, 1, rk, 2, 0x20);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[1].n, 1);
	cq_push(1, IBV_WC_RETRY_EXC_ERR);
	assert_int_equal(drain(st, seen), 1);
	assert_int_equal(st[0x20], -ETIMEDOUT);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	assert_int_equal(ep->qp[1].parked, QP_PARK_LOCAL);
	/* idle, NIC 1 up, within the hold: polls leave it READY, and b's
	 * chains go through NIC 0's pair */
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	o = xop(&b, 4096, 1, rk, 2, 0x21);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[0].n, 1);
	cq_push(0, IBV_WC_SUCCESS);
	assert_int_equal(drain(st, seen), 1);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	/* the hold over: the next poll resets it; our offer flags nothing */
	ep->qp[1].parked_ns -= KVB_RDMA_PARK_HOLD_NS;
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_RESET);
	len = sizeof(blob);
	assert_int_equal(kvb_rdma_ep_info(t, ep, blob, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&c, blob, len), 0);
	assert_int_equal(c.qp[0].flags, 0);
	assert_int_equal(c.qp[1].flags, 0);
	len = reoffer(blob, ep, 1, 0); /* P[2] (0,0), P[3] (1,1) */
	assert_int_equal(_kvb_rdma_connect(t, blob, len, &e2), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	assert_int_equal(ep->qp[1].parked, 0);
	/* it fails again; NIC 1 goes down and up: no wait for the hold */
	o = xop(&b, 4096, 1, rk, 2, 0x22);
	assert_int_equal(t->ops->post(t, ep, &o, 1), 1);
	assert_int_equal(P[3].n, 1);
	cq_push(3, IBV_WC_RETRY_EXC_ERR);
	assert_int_equal(drain(st, seen), 1);
	assert_int_equal(ep->qp[1].parked, QP_PARK_LOCAL);
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY);
	queue_event_on(1, IBV_EVENT_PORT_ERR, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_READY); /* NIC 1 down */
	queue_event_on(1, IBV_EVENT_PORT_ACTIVE, 1, NULL);
	assert_int_equal(kvb_rdma_async_service(t, log_line, NULL), 1);
	assert_int_equal(drain(st, seen), 0);
	assert_int_equal(ep->state, KVB_RDMA_EP_RESET);
	t->ops->dereg_mr(t, &a);
	t->ops->dereg_mr(t, &b);
}

/* nics(): each NIC's counters (the broker's stats and metrics show them),
 * no more than asked for */
static void test_nic_stats(void **state)
{
	struct kvb_transport_nic n[KVB_NIC_MAX];

	(void) state;
	two_nics();
	r->nics[1].bytes = 12345;
	assert_int_equal(t->ops->nics(t, n, KVB_NIC_MAX), 2);
	assert_string_equal(n[0].name, "mock0");
	assert_string_equal(n[1].name, "mock1");
	assert_int_equal(n[1].bytes, 12345);
	assert_int_equal(n[0].bytes, 0);
	memset(n, 0, sizeof(n));
	assert_int_equal(t->ops->nics(t, n, 1), 2);
	assert_string_equal(n[0].name, "mock0");
	assert_string_equal(n[1].name, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_nic_regions, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_gpu_home, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_pairs_budget, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_post_pair, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_failover, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_park_hold, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_parked, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nic_stats, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/* Encoding of the rdma connection blob; layout in conn.h. */
#include <errno.h>
#include <string.h>

#include "conn.h"
#include "le.h"

/* Version 1 says it all: one NIC, every QP on it. */
static int conn_v1(const struct kvb_rdma_conn *c)
{
	unsigned i;

	if (c->nnic != 1)
		return 0;
	for (i = 0; i < c->nqp; i++)
		if (c->qp[i].lnic || c->qp[i].rnic || c->qp[i].flags)
			return 0;
	return 1;
}

static void put_head(uint8_t *p, const struct kvb_rdma_conn *c, uint16_t ver)
{
	kvb_put32(p, KVB_RDMA_CONN_MAGIC);
	kvb_put16(p + 4, ver);
	kvb_put16(p + 6, c->nqp);
	kvb_put64(p + 8, c->node);
	kvb_put64(p + 16, c->ep);
	kvb_put64(p + 24, c->to_ep);
	kvb_put32(p + 32, c->epoch);
}

static void put_nic(uint8_t *p, const struct kvb_rdma_conn_nic *n)
{
	kvb_put16(p, n->lid);
	p[2] = n->mtu;
	p[3] = n->port;
	memcpy(p + 4, n->gid, 16);
}

static void encode_v1(const struct kvb_rdma_conn *c, uint8_t *p)
{
	unsigned i;

	put_head(p, c, KVB_RDMA_CONN_VERSION);
	put_nic(p + 36, &c->nic[0]);
	for (i = 0; i < c->nqp; i++) {
		kvb_put32(p + KVB_RDMA_CONN_HDR + 8 * i, c->qp[i].qpn);
		kvb_put32(p + KVB_RDMA_CONN_HDR + 8 * i + 4, c->qp[i].psn);
	}
}

static void encode_v2(const struct kvb_rdma_conn *c, uint8_t *p)
{
	uint8_t *q = p + KVB_RDMA_CONN_HDR2;
	unsigned i;

	put_head(p, c, KVB_RDMA_CONN_V2);
	p[36] = c->nnic;
	p[37] = p[38] = p[39] = 0;
	for (i = 0; i < c->nnic; i++, q += KVB_RDMA_CONN_NIC)
		put_nic(q, &c->nic[i]);
	for (i = 0; i < c->nqp; i++, q += KVB_RDMA_CONN_QP2) {
		kvb_put32(q, c->qp[i].qpn);
		kvb_put32(q + 4, c->qp[i].psn);
		q[8] = c->qp[i].lnic;
		q[9] = c->qp[i].rnic;
		q[10] = c->qp[i].flags;
		q[11] = 0;
	}
}

int kvb_rdma_conn_encode(const struct kvb_rdma_conn *c, void *buf, size_t *len)
{
	int v1 = conn_v1(c);
	size_t need;
	unsigned i;

	if (!c->nnic || c->nnic > KVB_NIC_MAX ||
	    c->nqp > (v1 ? KVB_RDMA_MAX_QP : KVB_RDMA_EP_QP_MAX))
		return -EINVAL;
	for (i = 0; i < c->nqp; i++)
		if (c->qp[i].lnic >= c->nnic || c->qp[i].rnic >= KVB_NIC_MAX ||
		    (c->qp[i].flags & ~KVB_RDMA_QP_PARKED))
			return -EINVAL;
	need = v1 ? KVB_RDMA_CONN_HDR + 8 * (size_t) c->nqp
		  : KVB_RDMA_CONN_HDR2 + KVB_RDMA_CONN_NIC * (size_t) c->nnic +
			       KVB_RDMA_CONN_QP2 * (size_t) c->nqp;
	if (*len < need) {
		*len = need;
		return -ENOSPC;
	}
	if (v1)
		encode_v1(c, buf);
	else
		encode_v2(c, buf);
	*len = need;
	return 0;
}

/* One NIC's fields; -EPROTO for an mtu that is not an ibv_mtu. */
static int get_nic(const uint8_t *p, struct kvb_rdma_conn_nic *n)
{
	n->lid = kvb_get16(p);
	n->mtu = p[2];
	n->port = p[3];
	memcpy(n->gid, p + 4, 16);
	/* ibv_mtu: 1 (256) .. 5 (4096) */
	return n->mtu < 1 || n->mtu > 5 ? -EPROTO : 0;
}

static int qp_check(const struct kvb_rdma_conn *c, unsigned i)
{
	if (!c->qp[i].qpn || c->qp[i].qpn > 0xffffff || c->qp[i].psn > 0xffffff)
		return -EPROTO;
	if (c->qp[i].lnic >= c->nnic || c->qp[i].rnic >= KVB_NIC_MAX ||
	    (c->qp[i].flags & ~KVB_RDMA_QP_PARKED))
		return -EPROTO;
	return 0;
}

static int decode_v1(struct kvb_rdma_conn *c, const uint8_t *p, size_t len)
{
	unsigned i;

	if (c->nqp > KVB_RDMA_MAX_QP ||
	    len != KVB_RDMA_CONN_HDR + 8 * (size_t) c->nqp)
		return -EPROTO;
	c->nnic = 1;
	if (get_nic(p + 36, &c->nic[0]))
		return -EPROTO;
	for (i = 0; i < c->nqp; i++) {
		c->qp[i].qpn = kvb_get32(p + KVB_RDMA_CONN_HDR + 8 * i);
		c->qp[i].psn = kvb_get32(p + KVB_RDMA_CONN_HDR + 8 * i + 4);
		if (qp_check(c, i))
			return -EPROTO;
	}
	return 0;
}

static int decode_v2(struct kvb_rdma_conn *c, const uint8_t *p, size_t len)
{
	const uint8_t *q = p + KVB_RDMA_CONN_HDR2;
	unsigned i;

	c->nnic = p[36];
	if (!c->nnic || c->nnic > KVB_NIC_MAX || c->nqp > KVB_RDMA_EP_QP_MAX ||
	    len != KVB_RDMA_CONN_HDR2 + KVB_RDMA_CONN_NIC * (size_t) c->nnic +
			    KVB_RDMA_CONN_QP2 * (size_t) c->nqp)
		return -EPROTO;
	for (i = 0; i < c->nnic; i++, q += KVB_RDMA_CONN_NIC)
		if (get_nic(q, &c->nic[i]))
			return -EPROTO;
	for (i = 0; i < c->nqp; i++, q += KVB_RDMA_CONN_QP2) {
		c->qp[i].qpn = kvb_get32(q);
		c->qp[i].psn = kvb_get32(q + 4);
		c->qp[i].lnic = q[8];
		c->qp[i].rnic = q[9];
		c->qp[i].flags = q[10];
		if (qp_check(c, i))
			return -EPROTO;
	}
	return 0;
}

int kvb_rdma_conn_decode(struct kvb_rdma_conn *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	int err;

	memset(c, 0, sizeof(*c));
	if (!buf || len < KVB_RDMA_CONN_HDR2 ||
	    kvb_get32(p) != KVB_RDMA_CONN_MAGIC)
		return -EPROTO;
	c->version = kvb_get16(p + 4);
	c->nqp = kvb_get16(p + 6);
	c->node = kvb_get64(p + 8);
	c->ep = kvb_get64(p + 16);
	c->to_ep = kvb_get64(p + 24);
	c->epoch = kvb_get32(p + 32);
	if (c->version == KVB_RDMA_CONN_VERSION)
		err = len < KVB_RDMA_CONN_HDR ? -EPROTO : decode_v1(c, p, len);
	else if (c->version == KVB_RDMA_CONN_V2)
		err = decode_v2(c, p, len);
	else
		err = -EPROTO;
	if (!err && c->nqp && !c->ep)
		err = -EPROTO;
	return err;
}

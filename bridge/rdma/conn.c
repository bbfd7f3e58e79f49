// SPDX-License-Identifier: MIT
/* Encoding of the rdma connection blob; layout in conn.h. */
#include <errno.h>
#include <string.h>

#include "conn.h"

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t) v;
	p[1] = (uint8_t) (v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t) v);
	put16(p + 2, (uint16_t) (v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t) v);
	put32(p + 4, (uint32_t) (v >> 32));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t) (p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return get16(p) | (uint32_t) get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
	return get32(p) | (uint64_t) get32(p + 4) << 32;
}

int kvb_rdma_conn_encode(const struct kvb_rdma_conn *c, void *buf, size_t *len)
{
	size_t need = KVB_RDMA_CONN_HDR + 8 * (size_t) c->nqp;
	uint8_t *p = buf;
	unsigned i;

	if (c->nqp > KVB_RDMA_MAX_QP)
		return -EINVAL;
	if (*len < need) {
		*len = need;
		return -ENOSPC;
	}
	put32(p, KVB_RDMA_CONN_MAGIC);
	put16(p + 4, KVB_RDMA_CONN_VERSION);
	put16(p + 6, c->nqp);
	put64(p + 8, c->node);
	put64(p + 16, c->ep);
	put64(p + 24, c->to_ep);
	put32(p + 32, c->epoch);
	put16(p + 36, c->lid);
	p[38] = c->mtu;
	p[39] = c->port;
	memcpy(p + 40, c->gid, 16);
	for (i = 0; i < c->nqp; i++) {
		put32(p + KVB_RDMA_CONN_HDR + 8 * i, c->qp[i].qpn);
		put32(p + KVB_RDMA_CONN_HDR + 8 * i + 4, c->qp[i].psn);
	}
	*len = need;
	return 0;
}

int kvb_rdma_conn_decode(struct kvb_rdma_conn *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	unsigned i;

	memset(c, 0, sizeof(*c));
	if (!buf || len < KVB_RDMA_CONN_HDR)
		return -EPROTO;
	if (get32(p) != KVB_RDMA_CONN_MAGIC ||
	    get16(p + 4) != KVB_RDMA_CONN_VERSION)
		return -EPROTO;
	c->version = KVB_RDMA_CONN_VERSION;
	c->nqp = get16(p + 6);
	if (c->nqp > KVB_RDMA_MAX_QP ||
	    len != KVB_RDMA_CONN_HDR + 8 * (size_t) c->nqp)
		return -EPROTO;
	c->node = get64(p + 8);
	c->ep = get64(p + 16);
	c->to_ep = get64(p + 24);
	c->epoch = get32(p + 32);
	c->lid = get16(p + 36);
	c->mtu = p[38];
	c->port = p[39];
	memcpy(c->gid, p + 40, 16);
	/* ibv_mtu: 1 (256) .. 5 (4096) */
	if (c->mtu < 1 || c->mtu > 5)
		return -EPROTO;
	if (c->nqp && !c->ep)
		return -EPROTO;
	for (i = 0; i < c->nqp; i++) {
		c->qp[i].qpn = get32(p + KVB_RDMA_CONN_HDR + 8 * i);
		c->qp[i].psn = get32(p + KVB_RDMA_CONN_HDR + 8 * i + 4);
		if (!c->qp[i].qpn || c->qp[i].qpn > 0xffffff ||
		    c->qp[i].psn > 0xffffff)
			return -EPROTO;
	}
	return 0;
}

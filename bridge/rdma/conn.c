// SPDX-License-Identifier: MIT
/* Encoding of the rdma connection blob; layout in conn.h. */
#include <errno.h>
#include <string.h>

#include "conn.h"
#include "le.h"

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
	kvb_put32(p, KVB_RDMA_CONN_MAGIC);
	kvb_put16(p + 4, KVB_RDMA_CONN_VERSION);
	kvb_put16(p + 6, c->nqp);
	kvb_put64(p + 8, c->node);
	kvb_put64(p + 16, c->ep);
	kvb_put64(p + 24, c->to_ep);
	kvb_put32(p + 32, c->epoch);
	kvb_put16(p + 36, c->lid);
	p[38] = c->mtu;
	p[39] = c->port;
	memcpy(p + 40, c->gid, 16);
	for (i = 0; i < c->nqp; i++) {
		kvb_put32(p + KVB_RDMA_CONN_HDR + 8 * i, c->qp[i].qpn);
		kvb_put32(p + KVB_RDMA_CONN_HDR + 8 * i + 4, c->qp[i].psn);
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
	if (kvb_get32(p) != KVB_RDMA_CONN_MAGIC ||
	    kvb_get16(p + 4) != KVB_RDMA_CONN_VERSION)
		return -EPROTO;
	c->version = KVB_RDMA_CONN_VERSION;
	c->nqp = kvb_get16(p + 6);
	if (c->nqp > KVB_RDMA_MAX_QP ||
	    len != KVB_RDMA_CONN_HDR + 8 * (size_t) c->nqp)
		return -EPROTO;
	c->node = kvb_get64(p + 8);
	c->ep = kvb_get64(p + 16);
	c->to_ep = kvb_get64(p + 24);
	c->epoch = kvb_get32(p + 32);
	c->lid = kvb_get16(p + 36);
	c->mtu = p[38];
	c->port = p[39];
	memcpy(c->gid, p + 40, 16);
	/* ibv_mtu: 1 (256) .. 5 (4096) */
	if (c->mtu < 1 || c->mtu > 5)
		return -EPROTO;
	if (c->nqp && !c->ep)
		return -EPROTO;
	for (i = 0; i < c->nqp; i++) {
		c->qp[i].qpn = kvb_get32(p + KVB_RDMA_CONN_HDR + 8 * i);
		c->qp[i].psn = kvb_get32(p + KVB_RDMA_CONN_HDR + 8 * i + 4);
		if (!c->qp[i].qpn || c->qp[i].qpn > 0xffffff ||
		    c->qp[i].psn > 0xffffff)
			return -EPROTO;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The rdma transport's connection blob: what one side tells the other in the
 * broker handshake. Encoded little-endian with explicit offsets (never a C
 * struct on the wire), versioned, checked on decode: it comes from the
 * network.
 *
 *   off size
 *     0    4  magic "KVBR" (0x5242564b)
 *     4    2  version (1)
 *     6    2  nqp: QPs listed (0 = an offer without QPs, from local_info)
 *     8    8  node: random token of the sending transport
 *    16    8  ep: token of the sending endpoint (0 without QPs)
 *    24    8  to_ep: endpoint token of the receiver this answers (0 = offer)
 *    32    4  epoch: bumped by every reset of the sending endpoint
 *    36    2  lid
 *    38    1  mtu (enum ibv_mtu)
 *    39    1  port
 *    40   16  gid
 *    56  8*n  per QP: qpn (4), psn (4)
 */
#ifndef KVB_BRIDGE_RDMA_CONN_H
#define KVB_BRIDGE_RDMA_CONN_H

#include <stddef.h>
#include <stdint.h>

#define KVB_RDMA_CONN_MAGIC   0x5242564bu
#define KVB_RDMA_CONN_VERSION 1
#define KVB_RDMA_MAX_QP	      16
#define KVB_RDMA_CONN_HDR     56
#define KVB_RDMA_CONN_MAX     (KVB_RDMA_CONN_HDR + 8 * KVB_RDMA_MAX_QP)

struct kvb_rdma_conn {
	uint16_t version;
	uint16_t nqp;
	uint64_t node;
	uint64_t ep;
	uint64_t to_ep;
	uint32_t epoch;
	uint16_t lid;
	uint8_t mtu;
	uint8_t port;
	uint8_t gid[16];
	struct {
		uint32_t qpn;
		uint32_t psn;
	} qp[KVB_RDMA_MAX_QP];
};

/*
 * Encode c into buf of *len bytes; *len becomes the encoded size. Returns 0,
 * -ENOSPC when *len is too small (*len then holds the size needed), or
 * -EINVAL when c->nqp is out of range.
 */
int kvb_rdma_conn_encode(const struct kvb_rdma_conn *c, void *buf, size_t *len);

/*
 * Decode and check a peer's blob. Returns 0, or -EPROTO for a bad magic,
 * unknown version, wrong length, too many QPs or a QP without number, PSNs
 * wider than 24 bits, or an mtu that is not an ibv_mtu.
 */
int kvb_rdma_conn_decode(struct kvb_rdma_conn *c, const void *buf, size_t len);

#endif /* KVB_BRIDGE_RDMA_CONN_H */

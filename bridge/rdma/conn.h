/* SPDX-License-Identifier: MIT */
/*
 * The rdma transport's connection blob: what one side tells the other in the
 * broker handshake. Encoded little-endian with explicit offsets (never a C
 * struct on the wire), versioned, checked on decode: it comes from the
 * network.
 *
 * Version 1 (one NIC, every QP on it: what a single-NIC transport sends,
 * byte for byte as before several NICs existed):
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
 *
 * Version 2 (several NICs on either side): the same first 36 bytes, then
 *
 *    36    1  nnic: NICs of the sender listed (1 .. KVB_NIC_MAX)
 *    37    3  zero
 *    40 20*m  per NIC: lid (2), mtu (1), port (1), gid (16)
 *     .  12*n per QP: qpn (4), psn (4), lnic (1): the sender's NIC it is
 *             on (an index into the list above), rnic (1): the receiver's
 *             NIC it connects to (an index into the receiver's list), flags
 *             (1: KVB_RDMA_QP_PARKED), zero (1)
 *
 * The encoder picks version 1 whenever it can (nnic 1, every QP lnic 0 and
 * rnic 0, no flags); a version 1 blob decodes as nnic 1, every QP (0, 0).
 */
#ifndef KVB_BRIDGE_RDMA_CONN_H
#define KVB_BRIDGE_RDMA_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define KVB_RDMA_CONN_MAGIC   0x5242564bu
#define KVB_RDMA_CONN_VERSION 1
#define KVB_RDMA_CONN_V2      2
/* QPs per NIC pair (--qp-per-transfer), and an endpoint's on one NIC */
#define KVB_RDMA_MAX_QP 16
/* QPs of one endpoint over all its NIC pairs */
#define KVB_RDMA_EP_QP_MAX 64
#define KVB_RDMA_CONN_HDR  56
#define KVB_RDMA_CONN_HDR2 40
#define KVB_RDMA_CONN_NIC  20 /* bytes per NIC (v2) */
#define KVB_RDMA_CONN_QP2  12 /* bytes per QP (v2) */
/* a QP flag: not connected (its NIC's port was down at the handshake);
 * the receiver leaves its own QP of the pair unconnected too */
#define KVB_RDMA_QP_PARKED 1u
#define KVB_RDMA_CONN_MAX                                       \
	(KVB_RDMA_CONN_HDR2 + KVB_RDMA_CONN_NIC * KVB_NIC_MAX + \
	 KVB_RDMA_CONN_QP2 * KVB_RDMA_EP_QP_MAX)

struct kvb_rdma_conn_nic {
	uint16_t lid;
	uint8_t mtu;
	uint8_t port;
	uint8_t gid[16];
};

struct kvb_rdma_conn {
	uint16_t version; /* set by decode; encode picks its own */
	uint16_t nqp;
	uint64_t node;
	uint64_t ep;
	uint64_t to_ep;
	uint32_t epoch;
	uint8_t nnic; /* >= 1 */
	struct kvb_rdma_conn_nic nic[KVB_NIC_MAX];
	struct {
		uint32_t qpn;
		uint32_t psn;
		uint8_t lnic;  /* the sender's NIC */
		uint8_t rnic;  /* the receiver's NIC */
		uint8_t flags; /* KVB_RDMA_QP_* */
	} qp[KVB_RDMA_EP_QP_MAX];
};

/*
 * Encode c into buf of *len bytes; *len becomes the encoded size. Returns 0,
 * -ENOSPC when *len is too small (*len then holds the size needed), or
 * -EINVAL when c->nqp, c->nnic or a QP's lnic is out of range.
 */
int kvb_rdma_conn_encode(const struct kvb_rdma_conn *c, void *buf, size_t *len);

/*
 * Decode and check a peer's blob. Returns 0, or -EPROTO for a bad magic,
 * unknown version, wrong length, too many QPs or NICs, a QP without number
 * or on a NIC not listed (or naming a receiver NIC past KVB_NIC_MAX), an
 * unknown QP flag, PSNs
 * wider than 24 bits, or an mtu that is not an ibv_mtu.
 */
int kvb_rdma_conn_decode(struct kvb_rdma_conn *c, const void *buf, size_t len);

#endif /* KVB_BRIDGE_RDMA_CONN_H */

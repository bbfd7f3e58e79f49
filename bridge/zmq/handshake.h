/* SPDX-License-Identifier: MIT */
/*
 * The broker-to-broker engine descriptor exchanged on the handshake port: who
 * the node is, which transports it offers (each with an opaque connection
 * blob: QP numbers and GIDs, a TCP address, ...), and for every taking-part
 * worker its role, ranks and the regions a peer may address (id, size, block
 * geometry, remote address, rkey). Encoded as one msgpack map; the format is
 * in docs/protocol.md.
 *
 * A descriptor of another version is refused as a whole (-EPROTONOSUPPORT),
 * before any other field is looked at, so a future version may change
 * everything but the "kvb" and "version" keys.
 *
 * Thread safety: reentrant; a descriptor belongs to one thread at a time.
 */
#ifndef KVB_BRIDGE_ZMQ_HANDSHAKE_H
#define KVB_BRIDGE_ZMQ_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h" /* KVB_NIC_MAX */
#include "zmq/blocks.h"

#define KVB_HS_VERSION	     1
#define KVB_HS_NODE_ID_MAX   255
#define KVB_HS_TRANSPORT_MAX 8
#define KVB_HS_TNAME_MAX     15
#define KVB_HS_CONN_MAX	     4096 /* connection blob bytes */
#define KVB_HS_WORKERS_MAX   1024
#define KVB_HS_REGIONS_MAX   4096 /* per worker */
#define KVB_HS_BYTES_MAX     (16u << 20)
#define KVB_HS_KX_LEN	     32

enum kvb_hs_role {
	KVB_HS_ROLE_P = 1, /* prefill, KV producer */
	KVB_HS_ROLE_D = 2, /* decode, KV consumer */
};

struct kvb_hs_transport {
	char name[KVB_HS_TNAME_MAX + 1]; /* "tcp", "rdma", ... */
	uint32_t conn_len;
	uint8_t *conn; /* opaque, heap */
};

struct kvb_hs_region {
	uint32_t id;
	uint64_t size;
	struct kvb_kv_geom geom;
	uint64_t addr; /* remote virtual address of offset 0 (0 if none) */
	uint32_t rkey;
	uint32_t layer; /* model layer the region holds ("layer", default 0) */
	/*
	 * Optional ("rkeys", "nic"): a peer with several NICs registers the
	 * region on each; rkeys[i] is its key on NIC i (the order of its
	 * transport blob), nic the NIC nearest the region. nrkeys 0: absent
	 * (rkey alone, one NIC); then nic is 0.
	 */
	uint32_t nrkeys; /* 0..KVB_NIC_MAX */
	uint32_t nic;	 /* < nrkeys */
	uint32_t rkeys[KVB_NIC_MAX];
};

struct kvb_hs_worker {
	uint32_t role; /* enum kvb_hs_role */
	uint32_t dp_rank;
	uint32_t tp_rank;
	uint32_t tp_size;
	uint32_t nregions;
	struct kvb_hs_region *regions; /* heap */
};

struct kvb_hs_desc {
	uint32_t version; /* KVB_HS_VERSION when decoded */
	char node_id[KVB_HS_NODE_ID_MAX + 1];
	/*
	 * Optional (absent = 0 / ""): where the node's control ports are, and
	 * a random number that changes whenever the broker restarts.
	 */
	char host[64];	      /* "host": the address peers reach it on */
	uint32_t notify_port; /* "notify_port": base of the notify ports */
	uint32_t hs_port;     /* "hs_port": its handshake port */
	uint64_t instance;    /* "instance" */
	/* "kx" (optional bin of 32): the broker's X25519 public key, from
	 * which both sides derive the key of the tcp data port's
	 * authentication (docs/security.md) */
	uint8_t kx[KVB_HS_KX_LEN];
	uint8_t has_kx;
	uint32_t ntransports;
	struct kvb_hs_transport transports[KVB_HS_TRANSPORT_MAX];
	uint32_t nworkers;
	struct kvb_hs_worker *workers; /* heap */
};

/*
 * Encode *d (its version field is ignored: KVB_HS_VERSION is written). The
 * descriptor is validated with the decoder's rules first.
 *
 * Returns 0 with *out (malloc'd, caller frees) and *len set; -EINVAL for an
 * invalid descriptor; -ENOMEM.
 */
int kvb_hs_encode(const struct kvb_hs_desc *d, char **out, size_t *len);

/*
 * Decode a peer's descriptor into *d (fully overwritten). On 0 the caller
 * releases it with kvb_hs_fini(); on failure *d holds nothing and *reason (if
 * not NULL) names the problem.
 *
 * Returns 0; -EPROTONOSUPPORT for another version (reason says which);
 * -EBADMSG for anything malformed (types, missing fields, bounds, a region
 * whose geometry does not fit its size, duplicate region ids in a worker,
 * more than KVB_NIC_MAX rkeys or a nic outside them);
 * -ENOMEM.
 */
int kvb_hs_decode(struct kvb_hs_desc *d, const void *buf, size_t len,
		  const char **reason);

/* Free what *d owns and zero it. Safe on a zeroed descriptor. */
void kvb_hs_fini(struct kvb_hs_desc *d);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Byte layouts of the tcp transport: the connection blob and the frames.
 * Little-endian on the wire whatever the host; see docs/tcp.md.
 */
#ifndef KVB_BRIDGE_TCP_WIRE_H
#define KVB_BRIDGE_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define KVB_TCP_BLOB_MAGIC   0x424b5654u /* "TVKB" */
#define KVB_TCP_BLOB_VERSION 1

#define KVB_TCP_FRAME_MAGIC   0x464b5654u /* "TVKF" */
#define KVB_TCP_FRAME_VERSION 1
#define KVB_TCP_HDR_LEN	      24
#define KVB_TCP_REC_LEN	      32
#define KVB_TCP_MAX_RECS      1024 /* records per frame */
#define KVB_TCP_TRAILER_MAX   (KVB_TCP_MAX_RECS * 4)

/*
 * Authentication, before the first frame of a connection (docs/tcp.md,
 * "Authentication"): the dialer sends HELLO, the server CHALLENGE, the
 * dialer PROOF; MACs are HMAC-SHA512-256 (libsodium crypto_auth) under the
 * key both brokers derived at their handshake.
 */
#define KVB_TCP_AUTH_MAGIC   0x414b5654u /* "TVKA" */
#define KVB_TCP_AUTH_VERSION 1
#define KVB_TCP_NONCE_LEN    32
#define KVB_TCP_MAC_LEN	     32
#define KVB_TCP_HELLO_LEN    56 /* 8 head | dialer id | server id | nonce */
#define KVB_TCP_CHAL_LEN     72 /* 8 head | server nonce | server MAC */
#define KVB_TCP_PROOF_LEN    40 /* 8 head | dialer MAC */

enum kvb_tcp_atype {
	KVB_TCP_A_HELLO = 1,
	KVB_TCP_A_CHALLENGE = 2,
	KVB_TCP_A_PROOF = 3,
};

/* 8-byte head of an auth message: magic, version, type, two zero bytes */
void kvb_tcp_auth_head(uint8_t *buf, uint8_t type);
/* 0 if buf starts with a valid head of that type, else -EPROTO */
int kvb_tcp_auth_head_check(const uint8_t *buf, uint8_t type);

enum kvb_tcp_ftype {
	KVB_TCP_F_WRITE = 1,	 /* records + payloads, to the listener */
	KVB_TCP_F_READ_REQ = 2,	 /* records, to the listener */
	KVB_TCP_F_ACK = 3,	 /* records with status, to the dialer */
	KVB_TCP_F_READ_RESP = 4, /* records + payloads + trailer, to dialer */
};

struct kvb_tcp_blob {
	uint8_t family; /* 4 or 6 */
	uint16_t port;
	uint64_t nonce;
	uint8_t addr[16]; /* IPv4: first 4 bytes, network order */
};

struct kvb_tcp_hdr {
	uint8_t type;
	uint16_t count;	  /* records that follow, 1 .. KVB_TCP_MAX_RECS */
	uint64_t payload; /* payload bytes after the records */
};

struct kvb_tcp_rec {
	uint64_t seq;
	uint32_t region;
	int32_t status;
	uint64_t off;
	uint64_t len;
};

/* Encode into exactly KVB_TCP_BLOB_LEN bytes. */
void kvb_tcp_blob_encode(const struct kvb_tcp_blob *b, void *buf);
/* 0 or -EPROTO (magic, version, length, family, reserved bytes, port). */
int kvb_tcp_blob_decode(struct kvb_tcp_blob *b, const void *buf, size_t len);
/* Whether the blob's address is 0.0.0.0 / ::. */
int kvb_tcp_blob_unspec(const struct kvb_tcp_blob *b);

void kvb_tcp_hdr_encode(const struct kvb_tcp_hdr *h, uint8_t *buf);
/* 0 or -EPROTO (magic, version, reserved, count, type out of range). */
int kvb_tcp_hdr_decode(struct kvb_tcp_hdr *h, const uint8_t *buf);

void kvb_tcp_rec_encode(const struct kvb_tcp_rec *r, uint8_t *buf);
void kvb_tcp_rec_decode(struct kvb_tcp_rec *r, const uint8_t *buf);

/* One int32 status of a READ_RESP trailer. */
void kvb_tcp_status_put(uint8_t *buf, int32_t status);
int32_t kvb_tcp_status_get(const uint8_t *buf);

/* Trailer of a READ_RESP with n records: n int32 statuses, padded to 8. */
static inline uint32_t kvb_tcp_trailer_len(unsigned n)
{
	return (uint32_t) ((n * 4u + 7u) & ~7u);
}

#endif /* KVB_BRIDGE_TCP_WIRE_H */

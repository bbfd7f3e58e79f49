// SPDX-License-Identifier: MIT
/* Encoding and strict decoding of the tcp transport's blob and frames. */
#include <errno.h>
#include <string.h>

#include "tcp/tcp.h"
#include "tcp/wire.h"
#include "le.h"

/*
 * Blob, 40 bytes:
 *   0 magic u32 | 4 version u16 | 6 family u8 | 7 zero u8 | 8 port u16 |
 *  10 zero u16 | 12 zero u32 | 16 nonce u64 | 24 addr[16]
 */
void kvb_tcp_blob_encode(const struct kvb_tcp_blob *b, void *buf)
{
	uint8_t *p = buf;

	memset(p, 0, KVB_TCP_BLOB_LEN);
	kvb_put32(p, KVB_TCP_BLOB_MAGIC);
	kvb_put16(p + 4, KVB_TCP_BLOB_VERSION);
	p[6] = b->family;
	kvb_put16(p + 8, b->port);
	kvb_put64(p + 16, b->nonce);
	memcpy(p + 24, b->addr, b->family == 4 ? 4 : 16);
}

int kvb_tcp_blob_decode(struct kvb_tcp_blob *b, const void *buf, size_t len)
{
	static const uint8_t zero[16];
	const uint8_t *p = buf;

	if (!buf || len != KVB_TCP_BLOB_LEN)
		return -EPROTO;
	if (kvb_get32(p) != KVB_TCP_BLOB_MAGIC ||
	    kvb_get16(p + 4) != KVB_TCP_BLOB_VERSION)
		return -EPROTO;
	if ((p[6] != 4 && p[6] != 6) || p[7] || kvb_get16(p + 10) ||
	    kvb_get32(p + 12))
		return -EPROTO;
	if (!kvb_get16(p + 8))
		return -EPROTO;
	if (p[6] == 4 && memcmp(p + 28, zero, 12))
		return -EPROTO;
	memset(b, 0, sizeof(*b));
	b->family = p[6];
	b->port = kvb_get16(p + 8);
	b->nonce = kvb_get64(p + 16);
	memcpy(b->addr, p + 24, 16);
	return 0;
}

int kvb_tcp_blob_unspec(const struct kvb_tcp_blob *b)
{
	static const uint8_t zero[16];

	return !memcmp(b->addr, zero, b->family == 4 ? 4 : 16);
}

/*
 * Frame header, 24 bytes:
 *   0 magic u32 | 4 version u8 | 5 type u8 | 6 count u16 | 8 zero u64 |
 *  16 payload u64
 */
void kvb_tcp_hdr_encode(const struct kvb_tcp_hdr *h, uint8_t *buf)
{
	kvb_put32(buf, KVB_TCP_FRAME_MAGIC);
	buf[4] = KVB_TCP_FRAME_VERSION;
	buf[5] = h->type;
	kvb_put16(buf + 6, h->count);
	kvb_put64(buf + 8, 0);
	kvb_put64(buf + 16, h->payload);
}

int kvb_tcp_hdr_decode(struct kvb_tcp_hdr *h, const uint8_t *buf)
{
	if (kvb_get32(buf) != KVB_TCP_FRAME_MAGIC ||
	    buf[4] != KVB_TCP_FRAME_VERSION || kvb_get64(buf + 8))
		return -EPROTO;
	h->type = buf[5];
	h->count = kvb_get16(buf + 6);
	h->payload = kvb_get64(buf + 16);
	if (h->type < KVB_TCP_F_WRITE || h->type > KVB_TCP_F_READ_RESP)
		return -EPROTO;
	if (!h->count || h->count > KVB_TCP_MAX_RECS)
		return -EPROTO;
	return 0;
}

/* Record, 32 bytes: 0 seq u64 | 8 region u32 | 12 status s32 | 16 off u64 |
 * 24 len u64 */
void kvb_tcp_rec_encode(const struct kvb_tcp_rec *r, uint8_t *buf)
{
	kvb_put64(buf, r->seq);
	kvb_put32(buf + 8, r->region);
	kvb_put32(buf + 12, (uint32_t) r->status);
	kvb_put64(buf + 16, r->off);
	kvb_put64(buf + 24, r->len);
}

void kvb_tcp_rec_decode(struct kvb_tcp_rec *r, const uint8_t *buf)
{
	r->seq = kvb_get64(buf);
	r->region = kvb_get32(buf + 8);
	r->status = (int32_t) kvb_get32(buf + 12);
	r->off = kvb_get64(buf + 16);
	r->len = kvb_get64(buf + 24);
}

void kvb_tcp_status_put(uint8_t *buf, int32_t status)
{
	kvb_put32(buf, (uint32_t) status);
}

int32_t kvb_tcp_status_get(const uint8_t *buf)
{
	return (int32_t) kvb_get32(buf);
}

/* Auth message head: 0 magic u32 | 4 version u8 | 5 type u8 | 6 zero u16 */
void kvb_tcp_auth_head(uint8_t *buf, uint8_t type)
{
	kvb_put32(buf, KVB_TCP_AUTH_MAGIC);
	buf[4] = KVB_TCP_AUTH_VERSION;
	buf[5] = type;
	buf[6] = 0;
	buf[7] = 0;
}

int kvb_tcp_auth_head_check(const uint8_t *buf, uint8_t type)
{
	if (kvb_get32(buf) != KVB_TCP_AUTH_MAGIC ||
	    buf[4] != KVB_TCP_AUTH_VERSION || buf[5] != type || buf[6] ||
	    buf[7])
		return -EPROTO;
	return 0;
}

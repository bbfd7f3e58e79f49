// SPDX-License-Identifier: MIT
/* Encoding and strict decoding of the tcp transport's blob and frames. */
#include <errno.h>
#include <string.h>

#include "tcp/tcp.h"
#include "tcp/wire.h"

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
	return (uint32_t) get16(p) | (uint32_t) get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t) get32(p) | (uint64_t) get32(p + 4) << 32;
}

/*
 * Blob, 40 bytes:
 *   0 magic u32 | 4 version u16 | 6 family u8 | 7 zero u8 | 8 port u16 |
 *  10 zero u16 | 12 zero u32 | 16 nonce u64 | 24 addr[16]
 */
void kvb_tcp_blob_encode(const struct kvb_tcp_blob *b, void *buf)
{
	uint8_t *p = buf;

	memset(p, 0, KVB_TCP_BLOB_LEN);
	put32(p, KVB_TCP_BLOB_MAGIC);
	put16(p + 4, KVB_TCP_BLOB_VERSION);
	p[6] = b->family;
	put16(p + 8, b->port);
	put64(p + 16, b->nonce);
	memcpy(p + 24, b->addr, b->family == 4 ? 4 : 16);
}

int kvb_tcp_blob_decode(struct kvb_tcp_blob *b, const void *buf, size_t len)
{
	static const uint8_t zero[16];
	const uint8_t *p = buf;

	if (!buf || len != KVB_TCP_BLOB_LEN)
		return -EPROTO;
	if (get32(p) != KVB_TCP_BLOB_MAGIC ||
	    get16(p + 4) != KVB_TCP_BLOB_VERSION)
		return -EPROTO;
	if ((p[6] != 4 && p[6] != 6) || p[7] || get16(p + 10) || get32(p + 12))
		return -EPROTO;
	if (!get16(p + 8))
		return -EPROTO;
	if (p[6] == 4 && memcmp(p + 28, zero, 12))
		return -EPROTO;
	memset(b, 0, sizeof(*b));
	b->family = p[6];
	b->port = get16(p + 8);
	b->nonce = get64(p + 16);
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
	put32(buf, KVB_TCP_FRAME_MAGIC);
	buf[4] = KVB_TCP_FRAME_VERSION;
	buf[5] = h->type;
	put16(buf + 6, h->count);
	put64(buf + 8, 0);
	put64(buf + 16, h->payload);
}

int kvb_tcp_hdr_decode(struct kvb_tcp_hdr *h, const uint8_t *buf)
{
	if (get32(buf) != KVB_TCP_FRAME_MAGIC ||
	    buf[4] != KVB_TCP_FRAME_VERSION || get64(buf + 8))
		return -EPROTO;
	h->type = buf[5];
	h->count = get16(buf + 6);
	h->payload = get64(buf + 16);
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
	put64(buf, r->seq);
	put32(buf + 8, r->region);
	put32(buf + 12, (uint32_t) r->status);
	put64(buf + 16, r->off);
	put64(buf + 24, r->len);
}

void kvb_tcp_rec_decode(struct kvb_tcp_rec *r, const uint8_t *buf)
{
	r->seq = get64(buf);
	r->region = get32(buf + 8);
	r->status = (int32_t) get32(buf + 12);
	r->off = get64(buf + 16);
	r->len = get64(buf + 24);
}

void kvb_tcp_status_put(uint8_t *buf, int32_t status)
{
	put32(buf, (uint32_t) status);
}

int32_t kvb_tcp_status_get(const uint8_t *buf)
{
	return (int32_t) get32(buf);
}

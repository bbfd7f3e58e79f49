/* SPDX-License-Identifier: MIT */
/*
 * Little-endian loads and stores of fixed-width integers at any alignment:
 * the connection blobs and frames the transports exchange (rdma/conn.c,
 * tcp/wire.c) are little-endian whatever the host.
 */
#ifndef KVB_BRIDGE_LE_H
#define KVB_BRIDGE_LE_H

#include <stdint.h>

static inline void kvb_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t) v;
	p[1] = (uint8_t) (v >> 8);
}

static inline void kvb_put32(uint8_t *p, uint32_t v)
{
	kvb_put16(p, (uint16_t) v);
	kvb_put16(p + 2, (uint16_t) (v >> 16));
}

static inline void kvb_put64(uint8_t *p, uint64_t v)
{
	kvb_put32(p, (uint32_t) v);
	kvb_put32(p + 4, (uint32_t) (v >> 32));
}

static inline uint16_t kvb_get16(const uint8_t *p)
{
	return (uint16_t) (p[0] | p[1] << 8);
}

static inline uint32_t kvb_get32(const uint8_t *p)
{
	return (uint32_t) kvb_get16(p) | (uint32_t) kvb_get16(p + 2) << 16;
}

static inline uint64_t kvb_get64(const uint8_t *p)
{
	return (uint64_t) kvb_get32(p) | (uint64_t) kvb_get32(p + 4) << 32;
}

#endif

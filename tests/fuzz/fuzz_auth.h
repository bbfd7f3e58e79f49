/* SPDX-License-Identifier: MIT */
/*
 * The data port's authentication as a test peer speaks it (docs/tcp.md,
 * "Authentication"), for the tcp fuzz harnesses: MACs computed here, from
 * the documentation, not by the transport's code.
 */
#ifndef KVB_TESTS_FUZZ_AUTH_H
#define KVB_TESTS_FUZZ_AUTH_H

#include <sodium.h>
#include <string.h>

#include "le.h"
#include "tcp/wire.h"

/* MAC(key, role | "kvb-tcp-auth-v1\0" | id_d | id_s | nonce_d | nonce_s) */
static inline void fa_mac(const uint8_t *key, char role, uint64_t id_d,
			  uint64_t id_s, const uint8_t *nd, const uint8_t *ns,
			  uint8_t *mac)
{
	uint8_t t[1 + 16 + 8 + 8 + 64];

	t[0] = (uint8_t) role;
	memcpy(t + 1, "kvb-tcp-auth-v1", 16);
	kvb_put64(t + 17, id_d);
	kvb_put64(t + 25, id_s);
	memcpy(t + 33, nd, 32);
	memcpy(t + 65, ns, 32);
	crypto_auth(mac, t, sizeof(t), key);
}

#endif

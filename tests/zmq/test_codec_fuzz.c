/* SPDX-License-Identifier: MIT */
/*
 * The notify codec against random input: 200,000 random byte strings (half
 * drawn from msgpack markers) and 300,000 mutations of valid messages of
 * every type. Whatever the decoder accepts, the encoder accepts and decodes
 * back to the same message; whatever it refuses comes with a reason. The
 * generator is seeded: a failure reproduces.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zmq/codec.h"

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* Anything the decoder accepts, the encoder accepts and round-trips. */
static void fuzz_one(const uint8_t *p, size_t n, uint64_t *accepted)
{
	struct kvb_zmsg m, m2;
	const char *why = NULL;
	size_t len;
	char *out;
	int ret;

	ret = kvb_zmsg_decode(&m, p, n, &why);
	if (ret) {
		assert_true(ret == -EBADMSG || ret == -EPROTO);
		assert_non_null(why);
		return;
	}
	(*accepted)++;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(kvb_zmsg_decode(&m2, out, len, &why), 0);
	assert_string_equal(m.transfer_id, m2.transfer_id);
	assert_int_equal(m.type, m2.type);
	assert_int_equal(m.nblocks, m2.nblocks);
	assert_int_equal(m.status, m2.status);
	kvb_zmsg_fini(&m2);
	kvb_zmsg_fini(&m);
	free(out);
}

static void test_fuzz(void **state)
{
	static const uint8_t alphabet[] = {
		0x80, 0x81, 0x82, 0x83, 0x85, 0x90, 0x91, 0x92, 0xa1, 0xa4,
		0xc0, 0xc1, 0xc3, 0xcc, 0xcd, 0xce, 0xd0, 0xd9, 0xdc, 0xdd,
		0xde, 0xdf, 0xff, 0x00, 0x01, 0x7f, 't',  'x',	':',  'p'};
	uint8_t buf[96], seed[7][256];
	size_t seed_len[7];
	uint64_t accepted = 0;
	struct kvb_zmsg m;
	const uint32_t ids[] = {4, 5, 6, 9};
	char *out;
	size_t len;
	int i, s;

	/* pure random bytes, and random bytes from msgpack-ish markers */
	for (i = 0; i < 200000; i++) {
		size_t n = rnd() % sizeof(buf), k;
		bool markers = i & 1;

		for (k = 0; k < n; k++)
			buf[k] = markers ? alphabet[rnd() % sizeof(alphabet)]
					 : (uint8_t) rnd();
		fuzz_one(buf, n, &accepted);
	}

	/* mutations of valid messages */
	kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-abc");
	strcpy(m.req_id, "req");
	kvb_zmsg_set_blocks(&m, ids, 4);
	for (s = 0; s < 7; s++) {
		if (s == 1)
			m.flags = KVB_ZMSG_F_UNTYPED;
		if (s == 2) {
			kvb_zmsg_fini(&m);
			kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-abc");
		}
		if (s == 3) {
			kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-abc");
			m.flags = KVB_ZMSG_F_CONSUMER_TP;
			m.consumer_tp_size = 2;
		}
		if (s == 4)
			kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-abc");
		if (s == 5) {
			m.flags = KVB_ZMSG_F_TP_RANK;
			m.tp_rank = 1;
		}
		if (s == 6) {
			kvb_zmsg_init(&m, KVB_ZMSG_WRITE_FAILED, "tx-abc");
			m.status = -110;
		}
		assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
		assert_true(len <= sizeof(seed[s]));
		memcpy(seed[s], out, len);
		seed_len[s] = len;
		free(out);
	}
	for (i = 0; i < 300000; i++) {
		uint8_t mut[300];
		size_t n;
		int flips, f;

		s = (int) (rnd() % 7);
		n = seed_len[s];
		memcpy(mut, seed[s], n);
		flips = 1 + (int) (rnd() % 3);
		for (f = 0; f < flips; f++) {
			switch (rnd() % 4) {
			case 0:
				mut[rnd() % n] = (uint8_t) rnd();
				break;
			case 1:
				mut[rnd() % n] ^= (uint8_t) (1u << (rnd() % 8));
				break;
			case 2:
				n = rnd() % (n + 1);
				break;
			default:
				if (n < sizeof(mut))
					mut[n++] = (uint8_t) rnd();
				break;
			}
			if (n == 0)
				break;
		}
		fuzz_one(mut, n, &accepted);
	}
	/* the mutations keep some messages valid: the success path ran */
	assert_true(accepted > 1000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fuzz),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

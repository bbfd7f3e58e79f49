// SPDX-License-Identifier: MIT
/* Unit tests of the rdma connection blob (bridge/rdma/conn.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bridge/rdma/conn.h"

static struct kvb_rdma_conn sample(unsigned nqp)
{
	struct kvb_rdma_conn c;
	unsigned i;

	memset(&c, 0, sizeof(c));
	c.version = KVB_RDMA_CONN_VERSION;
	c.nqp = (uint16_t) nqp;
	c.node = 0x1122334455667788ull;
	c.ep = nqp ? 0xabcdef0123456789ull : 0;
	c.to_ep = 0x42;
	c.epoch = 7;
	c.lid = 0x1234;
	c.mtu = 3;
	c.port = 1;
	for (i = 0; i < 16; i++)
		c.gid[i] = (uint8_t) (0xf0 + i);
	for (i = 0; i < nqp; i++) {
		c.qp[i].qpn = 0x11 + i;
		c.qp[i].psn = 0xabcde0 + i;
	}
	return c;
}

static void test_roundtrip(void **state)
{
	uint8_t buf[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample(3), b;
	size_t len = sizeof(buf);

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(len, KVB_RDMA_CONN_HDR + 3 * 8);
	/* little-endian on the wire whatever the host */
	assert_int_equal(buf[0], 0x4b);
	assert_int_equal(buf[8], 0x88);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), 0);
	assert_memory_equal(&a, &b, sizeof(a));

	a = sample(0);
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(len, KVB_RDMA_CONN_HDR);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), 0);
	assert_memory_equal(&a, &b, sizeof(a));
}

static void test_encode_limits(void **state)
{
	uint8_t buf[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample(2);
	size_t len = 10;

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), -ENOSPC);
	assert_int_equal(len, KVB_RDMA_CONN_HDR + 16);
	a.nqp = KVB_RDMA_MAX_QP + 1;
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), -EINVAL);
}

static void test_decode_rejects(void **state)
{
	uint8_t buf[KVB_RDMA_CONN_MAX], bad[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample(2), b;
	size_t len = sizeof(buf), i;

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&b, NULL, 0), -EPROTO);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len - 1), -EPROTO);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len + 1), -EPROTO);
	for (i = 0; i < len; i++) {
		memcpy(bad, buf, len);
		bad[i] ^= 0xff;
		/* any field that has a check must trip it */
		if (i < 8 || i == 38 || (i >= 56 && (i - 56) % 4 == 3))
			assert_int_equal(kvb_rdma_conn_decode(&b, bad, len),
					 -EPROTO);
	}
	/* QPs without an endpoint token */
	a.ep = 0;
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), -EPROTO);
	/* QP number 0 */
	a = sample(1);
	a.qp[0].qpn = 0;
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_encode_limits),
		cmocka_unit_test(test_decode_rejects),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

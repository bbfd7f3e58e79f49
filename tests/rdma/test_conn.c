// SPDX-License-Identifier: MIT
/* Unit tests of the rdma connection blob (bridge/rdma/conn.c): version 1
 * (one NIC) byte for byte as before, version 2 (several NICs) round trip
 * and its malformed forms. */
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
	c.nnic = 1;
	c.nic[0].lid = 0x1234;
	c.nic[0].mtu = 3;
	c.nic[0].port = 1;
	for (i = 0; i < 16; i++)
		c.nic[0].gid[i] = (uint8_t) (0xf0 + i);
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

/* The version 1 wire, byte for byte: a blob of one NIC is what a
 * single-NIC transport always sent. */
static void test_v1_bytes(void **state)
{
	static const uint8_t want[KVB_RDMA_CONN_HDR + 8] = {
		0x4b, 0x56, 0x42, 0x52, 1,    0,    1,	  0,	0x88, 0x77,
		0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x89, 0x67, 0x45, 0x23,
		0x01, 0xef, 0xcd, 0xab, 0x42, 0,    0,	  0,	0,    0,
		0,    0,    7,	  0,	0,    0,    0x34, 0x12, 3,    1,
		0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9,
		0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff, 0x11, 0,	0,    0,
		0xe0, 0xcd, 0xab, 0};
	uint8_t buf[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample(1);
	size_t len = sizeof(buf);

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(len, sizeof(want));
	assert_memory_equal(buf, want, sizeof(want));
}

/* Two NICs, QPs on (0, 0), (1, 1) and (1, 0) (parked) */
static struct kvb_rdma_conn sample2(void)
{
	struct kvb_rdma_conn c = sample(3);

	c.nnic = 2;
	c.nic[1] = c.nic[0];
	c.nic[1].lid = 0x5678;
	c.nic[1].mtu = 5;
	c.nic[1].gid[15] = 0x01;
	c.qp[1].lnic = 1;
	c.qp[1].rnic = 1;
	c.qp[2].lnic = 1;
	c.qp[2].flags = KVB_RDMA_QP_PARKED;
	return c;
}

static void test_v2_roundtrip(void **state)
{
	uint8_t buf[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample2(), b;
	size_t len = sizeof(buf);

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(len, KVB_RDMA_CONN_HDR2 + 2 * KVB_RDMA_CONN_NIC +
				      3 * KVB_RDMA_CONN_QP2);
	assert_int_equal(buf[4], 2); /* version 2 */
	assert_int_equal(buf[36], 2);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), 0);
	assert_int_equal(b.version, 2);
	a.version = 2;
	assert_memory_equal(&a, &b, sizeof(a));

	/* one NIC but a QP to the receiver's second: version 2 as well */
	a = sample(2);
	a.qp[1].rnic = 1;
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(buf[4], 2);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), 0);
	assert_int_equal(b.nnic, 1);
	assert_int_equal(b.qp[1].rnic, 1);

	/* more QPs than version 1 allows, over NIC pairs */
	a = sample2();
	a.nqp = KVB_RDMA_EP_QP_MAX;
	for (unsigned i = 0; i < a.nqp; i++) {
		a.qp[i].qpn = 0x100 + i;
		a.qp[i].lnic = (uint8_t) (i & 1);
	}
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len), 0);
	assert_int_equal(b.nqp, KVB_RDMA_EP_QP_MAX);
}

static void test_v2_rejects(void **state)
{
	uint8_t buf[KVB_RDMA_CONN_MAX], bad[KVB_RDMA_CONN_MAX];
	struct kvb_rdma_conn a = sample2(), b;
	size_t len = sizeof(buf), q0;

	(void) state;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), 0);
	assert_int_equal(kvb_rdma_conn_decode(&b, buf, len - 1), -EPROTO);
	/* no NIC, or more than KVB_NIC_MAX (the length matching neither) */
	memcpy(bad, buf, len);
	bad[36] = 0;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	bad[36] = KVB_NIC_MAX + 1;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* a QP on a NIC the blob does not list */
	q0 = KVB_RDMA_CONN_HDR2 + 2 * KVB_RDMA_CONN_NIC;
	memcpy(bad, buf, len);
	bad[q0 + KVB_RDMA_CONN_QP2 + 8] = 2;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* ... or to a receiver NIC past any list */
	memcpy(bad, buf, len);
	bad[q0 + 9] = KVB_NIC_MAX;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* a QP flag not known */
	memcpy(bad, buf, len);
	bad[q0 + 10] = 2;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* the second NIC's mtu, a QP's number */
	memcpy(bad, buf, len);
	bad[KVB_RDMA_CONN_HDR2 + KVB_RDMA_CONN_NIC + 2] = 9;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	memcpy(bad, buf, len);
	memset(bad + q0, 0, 4);
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* too many QPs for version 2, an unknown version */
	memcpy(bad, buf, len);
	bad[6] = KVB_RDMA_EP_QP_MAX + 1;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	memcpy(bad, buf, len);
	bad[4] = 3;
	assert_int_equal(kvb_rdma_conn_decode(&b, bad, len), -EPROTO);
	/* the encoder refuses what the decoder would */
	a.qp[0].lnic = 2;
	len = sizeof(buf);
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), -EINVAL);
	a = sample2();
	a.nnic = KVB_NIC_MAX + 1;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), -EINVAL);
	a = sample2();
	a.nqp = KVB_RDMA_EP_QP_MAX + 1;
	assert_int_equal(kvb_rdma_conn_encode(&a, buf, &len), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_encode_limits),
		cmocka_unit_test(test_decode_rejects),
		cmocka_unit_test(test_v1_bytes),
		cmocka_unit_test(test_v2_roundtrip),
		cmocka_unit_test(test_v2_rejects),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

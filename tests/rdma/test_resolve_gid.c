// SPDX-License-Identifier: MIT
/*
 * The GID-table half of address resolution (bridge/rdma/resolve.c) on fake
 * sysfs GID tables: IPv4-mapped and IPv6 GIDs, RoCE v1 / v2 entries,
 * unused entries; and the broker hook's cases that need no device.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bridge/rdma/resolve.h"
#include "tests/rdma/fake_sysfs.h"

/*
 * rxe0 port 1 as the kernel fills it for an interface with 192.0.2.1 and
 * 2001:db8::1: link-local pairs first, then each address as v1 and v2.
 * mlx5_1 port 1 holds 192.0.2.5 as RoCE v1 only, and 192.0.2.6 twice,
 * v1 then v2. mlx5_1 port 2 exists without GIDs.
 */
static const char tables[] =
	"virt rxe0 1:active:eth\n"
	"gid rxe0 1 0 fe80:0000:0000:0000:5054:00ff:fe12:3456 v1\n"
	"gid rxe0 1 1 fe80:0000:0000:0000:5054:00ff:fe12:3456 v2\n"
	"gid rxe0 1 2 0000:0000:0000:0000:0000:ffff:c000:0201 v1\n"
	"gid rxe0 1 3 0000:0000:0000:0000:0000:ffff:c000:0201 v2\n"
	"gid rxe0 1 4 2001:0db8:0000:0000:0000:0000:0000:0001 v1\n"
	"gid rxe0 1 5 2001:0db8:0000:0000:0000:0000:0000:0001 v2\n"
	"gid rxe0 1 6 0000:0000:0000:0000:0000:0000:0000:0000 -\n"
	"gid rxe0 1 7 0000:0000:0000:0000:0000:0000:0000:0000 -\n"
	"virt mlx5_1 1:active:eth 2:active:eth\n"
	"gid mlx5_1 1 0 fe80:0000:0000:0000:0000:0000:0000:0001 v1\n"
	"gid mlx5_1 1 1 0000:0000:0000:0000:0000:ffff:c000:0205 v1\n"
	"gid mlx5_1 1 2 0000:0000:0000:0000:0000:ffff:c000:0206 v1\n"
	"gid mlx5_1 1 3 0000:0000:0000:0000:0000:ffff:c000:0206 v2\n"
	"gid mlx5_1 1 4 0000:0000:0000:0000:0000:ffff:c000:0207 -\n";

static int setup(void **state)
{
	static char root[PATH_MAX];

	if (fake_sysfs_build(tables, root, sizeof(root)))
		return -1;
	*state = root;
	return 0;
}

static int teardown(void **state)
{
	fake_sysfs_remove(*state);
	return 0;
}

static int find(const char *root, const char *dev, int port, const char *ip,
		enum kvb_gid_type *type)
{
	uint8_t g[16];

	assert_int_equal(kvb_rdma_ip_gid(ip, g), 0);
	*type = (enum kvb_gid_type) - 1;
	return kvb_rdma_gid_find(root, dev, port, g, type);
}

static void test_ip_gid(void **state)
{
	static const uint8_t v4[16] = {0, 0, 0,	   0,	 0,   0, 0, 0,
				       0, 0, 0xff, 0xff, 192, 0, 2, 1};
	static const uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
				       0,    0,	   0,	 0,    0, 0, 0, 1};
	uint8_t g[16];

	(void) state;
	assert_int_equal(kvb_rdma_ip_gid("192.0.2.1", g), 0);
	assert_memory_equal(g, v4, 16);
	assert_int_equal(kvb_rdma_ip_gid("2001:db8::1", g), 0);
	assert_memory_equal(g, v6, 16);
	assert_int_equal(kvb_rdma_ip_gid("::ffff:192.0.2.1", g), 0);
	assert_memory_equal(g, v4, 16);
	assert_int_equal(kvb_rdma_ip_gid("192.0.2", g), -EINVAL);
	assert_int_equal(kvb_rdma_ip_gid("rxe0", g), -EINVAL);
	assert_int_equal(kvb_rdma_ip_gid("", g), -EINVAL);
	assert_int_equal(kvb_rdma_ip_gid(NULL, g), -EINVAL);
}

static void test_v2_preferred(void **state)
{
	enum kvb_gid_type t;

	/* v1 comes first in the table, v2 is chosen */
	assert_int_equal(find(*state, "rxe0", 1, "192.0.2.1", &t), 3);
	assert_int_equal(t, KVB_GID_TYPE_V2);
	assert_int_equal(find(*state, "rxe0", 1, "2001:db8::1", &t), 5);
	assert_int_equal(t, KVB_GID_TYPE_V2);
	assert_int_equal(find(*state, "mlx5_1", 1, "192.0.2.6", &t), 3);
	assert_int_equal(t, KVB_GID_TYPE_V2);
}

static void test_v1_only(void **state)
{
	enum kvb_gid_type t;

	assert_int_equal(find(*state, "mlx5_1", 1, "192.0.2.5", &t), 1);
	assert_int_equal(t, KVB_GID_TYPE_V1);
	/* an entry without a readable type still matches, type unknown */
	assert_int_equal(find(*state, "mlx5_1", 1, "192.0.2.7", &t), 4);
	assert_int_equal(t, KVB_GID_TYPE_UNKNOWN);
}

static void test_missing(void **state)
{
	enum kvb_gid_type t;

	assert_int_equal(find(*state, "rxe0", 1, "192.0.2.2", &t), -ENOENT);
	assert_int_equal(t, (enum kvb_gid_type) - 1); /* untouched */
	/* the address is not on the other device, nor on port 2 */
	assert_int_equal(find(*state, "mlx5_1", 1, "192.0.2.1", &t), -ENOENT);
	assert_int_equal(find(*state, "mlx5_1", 2, "192.0.2.6", &t), -ENODEV);
	assert_int_equal(find(*state, "rxe0", 3, "192.0.2.1", &t), -ENODEV);
	assert_int_equal(find(*state, "mlx5_9", 1, "192.0.2.1", &t), -ENODEV);
	assert_int_equal(find(*state, "../rxe0", 1, "192.0.2.1", &t), -ENODEV);
	assert_int_equal(find(*state, "rxe0", 0, "192.0.2.1", &t), -ENODEV);
	/* all-zero unused entries never match an address */
	assert_int_equal(find(*state, "rxe0", 1, "::", &t), -ENOENT);
}

/* The broker hook leaves what it must not touch alone. */
static void test_params(void **state)
{
	struct kvb_transport_params p = {.gid_index = 2, .ib_port = 1};
	struct kvb_rdma_where w;
	static const char *const skip[] = {"127.0.0.1", "127.1.2.3", "::1",
					   "0.0.0.0",	"::",	     "",
					   "not-an-ip"};
	size_t i;

	(void) state;
	/* --gid-index given: nothing resolved */
	assert_int_equal(kvb_rdma_params_resolve(&p, "192.0.2.1", &w), 1);
	assert_int_equal(p.gid_index, 2);
	p.gid_index = -1;
	for (i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
		assert_int_equal(kvb_rdma_params_resolve(&p, skip[i], &w), 1);
		assert_int_equal(p.gid_index, -1);
		assert_null(p.dev_name);
	}
	assert_int_equal(kvb_rdma_params_resolve(&p, NULL, &w), 1);
	/*
	 * 192.0.2.77 is nobody's address here (no packet is sent: a
	 * timeout of 0 only looks at local addresses): refused, said why,
	 * p unchanged
	 */
	assert_true(kvb_rdma_params_resolve(&p, "192.0.2.77", &w) < 0);
	printf("  192.0.2.77: %s\n", w.why);
	assert_non_null(strstr(w.why, "GID by the default rule"));
	assert_int_equal(p.gid_index, -1);
	assert_null(p.dev_name);
	assert_int_equal(kvb_rdma_resolve("192.0.2.777", 0, &w), -EINVAL);
	assert_non_null(strstr(w.why, "not a numeric address"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ip_gid),
		cmocka_unit_test(test_v2_preferred),
		cmocka_unit_test(test_v1_only),
		cmocka_unit_test(test_missing),
		cmocka_unit_test(test_params),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

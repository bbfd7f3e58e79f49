// SPDX-License-Identifier: MIT
/*
 * The NIC topology module (bridge/rdma/topo.c) on fake sysfs trees built
 * from tests/rdma/topo/<case>.txt: an 8-GPU/8-NIC node, GPUs without a NIC
 * under their switch, two NICs under one switch, nested switches, two-port
 * NICs, unknown NUMA nodes, a device without PCI parent, empty trees.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "bridge/rdma/topo.h"
#include "tests/rdma/fake_sysfs.h"

struct fx {
	char root[PATH_MAX];
	struct kvb_topo *t;
};

static int open_case(void **state, const char *name)
{
	static struct fx f;
	char file[PATH_MAX], why[256];
	int err;

	memset(&f, 0, sizeof(f));
	snprintf(file, sizeof(file), "%s/%s.txt", KVB_TOPO_CASES, name);
	err = fake_sysfs_build_file(file, f.root, sizeof(f.root));
	if (err) {
		fprintf(stderr, "%s: %s\n", file, strerror(-err));
		return -1;
	}
	err = kvb_topo_open(f.root, &f.t, why, sizeof(why));
	if (err) {
		fprintf(stderr, "%s: %s\n", name, why);
		fake_sysfs_remove(f.root);
		return -1;
	}
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	kvb_topo_close(f->t);
	fake_sysfs_remove(f->root);
	return 0;
}

static int setup_h100(void **s)
{
	return open_case(s, "h100");
}
static int setup_nonic(void **s)
{
	return open_case(s, "nonic");
}
static int setup_twonic(void **s)
{
	return open_case(s, "twonic");
}
static int setup_dualport(void **s)
{
	return open_case(s, "dualport");
}
static int setup_numa(void **s)
{
	return open_case(s, "numa_unknown");
}

static void pick_gpu(struct kvb_topo *t, const char *gpu, const char *dev,
		     int port, enum kvb_topo_near near, struct kvb_topo_pick *p)
{
	assert_int_equal(kvb_topo_pick_pci(t, gpu, p), 0);
	printf("  GPU %s -> %s\n", gpu, p->why);
	assert_string_equal(p->dev, dev);
	assert_int_equal(p->port, port);
	assert_int_equal(p->near, near);
}

/* Each GPU gets the NIC under its own switch, whatever the load. */
static void test_h100_gpus(void **state)
{
	static const char *gpu[8] = {
		"0000:19:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5c:00.0",
		"0000:9a:00.0", "0000:ab:00.0", "0000:bc:00.0", "0000:dd:00.0"};
	static const char *sw[8] = {
		"0000:16:00.0", "0000:27:00.0", "0000:38:00.0", "0000:59:00.0",
		"0000:97:00.0", "0000:a8:00.0", "0000:b9:00.0", "0000:da:00.0"};
	struct fx *f = *state;
	struct kvb_topo_pick p;
	char dev[24], want[160];
	int i, r, idx[4];

	assert_int_equal(kvb_topo_count(f->t), 8);
	assert_string_equal(kvb_topo_nic(f->t, 3)->pci, "0000:5b:00.0");
	assert_int_equal(kvb_topo_nic(f->t, 5)->numa, 1);
	assert_null(kvb_topo_nic(f->t, 8));
	for (r = 0; r < 3; r++) /* load never moves a GPU off its switch */
		for (i = 0; i < 8; i++) {
			snprintf(dev, sizeof(dev), "mlx5_%d", i);
			pick_gpu(f->t, gpu[i], dev, 1, KVB_TOPO_SWITCH, &p);
			assert_int_equal(p.ties, 1);
			snprintf(
				want, sizeof(want),
				"mlx5_%d port 1: same PCIe switch %s as GPU %s",
				i, sw[i], gpu[i]);
			assert_string_equal(p.why, want);
		}
	assert_int_equal(
		kvb_topo_nearest_pci(f->t, "0000:ab:00.0", idx, 4, NULL), 1);
	assert_int_equal(idx[0], 5);
	/* bus ids as runtimes print them */
	pick_gpu(f->t, "00000000:5C:00.0", "mlx5_3", 1, KVB_TOPO_SWITCH, &p);
}

/* kvb_topo_score_pci (the rdma transport's home NIC of a GPU region):
 * the NIC under the GPU's switch scores highest, the same socket's
 * others next (same NUMA node), the other socket's lowest; port states
 * play no part; bad ids and indices are errors. */
static void test_h100_score(void **state)
{
	struct fx *f = *state;
	enum kvb_topo_near near;
	int s[8], i;

	for (i = 0; i < 8; i++)
		s[i] = kvb_topo_score_pci(f->t, "0000:5c:00.0", i, NULL);
	assert_int_equal(kvb_topo_score_pci(f->t, "0000:5c:00.0", 3, &near),
			 s[3]);
	assert_int_equal(near, KVB_TOPO_SWITCH);
	for (i = 0; i < 8; i++)
		if (i != 3)
			assert_true(s[i] < s[3]);
	assert_true(s[0] > s[4]); /* socket 0 before socket 1 */
	kvb_topo_score_pci(f->t, "0000:5c:00.0", 0, &near);
	assert_int_equal(near, KVB_TOPO_NUMA_SAME);
	assert_string_equal(kvb_topo_near_text(near), "same NUMA node");
	kvb_topo_score_pci(f->t, "0000:5c:00.0", 7, &near);
	assert_int_equal(near, KVB_TOPO_NUMA_OTHER);
	assert_int_equal(kvb_topo_score_pci(f->t, "0000:5c:00.0", 8, NULL),
			 -ENOENT);
	assert_int_equal(kvb_topo_score_pci(f->t, "5c:00.0", 0, NULL), -EINVAL);
	assert_int_equal(kvb_topo_score_pci(f->t, "0000:77:00.0", 0, NULL),
			 -ENOENT);
}

/* Host memory: the NICs of its NUMA node, spread by load. */
static void test_h100_numa(void **state)
{
	struct fx *f = *state;
	struct kvb_topo_pick p[8];
	int i, seen = 0;

	for (i = 0; i < 8; i++) {
		int n = i < 4 ? 0 : 1, dev;

		assert_int_equal(kvb_topo_pick_numa(f->t, n, &p[i]), 0);
		printf("  memory on node %d -> %s\n", n, p[i].why);
		assert_int_equal(p[i].near, KVB_TOPO_NUMA_SAME);
		assert_int_equal(p[i].ties, 4);
		assert_int_equal(sscanf(p[i].dev, "mlx5_%d", &dev), 1);
		assert_true(n ? dev >= 4 : dev < 4);
		seen |= 1 << dev;
	}
	assert_int_equal(seen, 0xff); /* all eight used once */
	/* release mlx5_2: the next node-0 pick takes it again */
	kvb_topo_release(f->t, &p[2]);
	assert_int_equal(kvb_topo_pick_numa(f->t, 0, &p[2]), 0);
	assert_string_equal(p[2].dev, "mlx5_2");
	for (i = 0; i < 8; i++)
		kvb_topo_release(f->t, &p[i]);
	assert_int_equal(kvb_topo_pick_numa(f->t, 0, &p[0]), 0);
	assert_string_equal(p[0].dev, "mlx5_0");
	assert_int_equal(kvb_topo_pick_numa(f->t, -2, &p[0]), -EINVAL);
}

static void test_nonic(void **state)
{
	struct fx *f = *state;
	struct kvb_topo_pick p, q;

	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p);
	/* own switch, no NIC under it: the NIC of the same host bridge */
	pick_gpu(f->t, "0000:1e:00.0", "mlx5_0", 1, KVB_TOPO_HOST_BRIDGE, &q);
	assert_string_equal(q.why, "mlx5_0 port 1: same PCI host bridge "
				   "pci0000:15 as GPU 0000:1e:00.0");
	kvb_topo_release(f->t, &q);
	/* alone on its root complex: a NIC of its NUMA node, the less used */
	pick_gpu(f->t, "0000:3b:00.0", "mlx5_1", 1, KVB_TOPO_NUMA_SAME, &q);
	assert_int_equal(q.ties, 2);
	assert_non_null(strstr(q.why, "same NUMA node 0 as GPU 0000:3b:00.0; "
				      "no NIC on its root complex"));
	kvb_topo_release(f->t, &q);
	kvb_topo_release(f->t, &p);
	/* node 1's only NIC is down: another node's, said so */
	pick_gpu(f->t, "0000:9a:00.0", "mlx5_0", 1, KVB_TOPO_NUMA_OTHER, &p);
	assert_non_null(strstr(p.why, "other NUMA node (NIC node 0, "
				      "GPU 0000:9a:00.0 node 1)"));
	assert_int_equal(kvb_topo_pick_numa(f->t, 1, &q), 0);
	assert_string_equal(q.dev, "mlx5_1"); /* mlx5_0 has a use */
	assert_int_equal(q.near, KVB_TOPO_NUMA_OTHER);
	/* bad and unknown bus ids */
	assert_int_equal(kvb_topo_pick_pci(f->t, "19:00.0", &p), -EINVAL);
	assert_int_equal(kvb_topo_pick_pci(f->t, "0000:19:00.0x", &p), -EINVAL);
	assert_int_equal(kvb_topo_pick_pci(f->t, "0000:19:20.0", &p), -EINVAL);
	assert_int_equal(kvb_topo_pick_pci(f->t, "0000:77:00.0", &p), -ENOENT);
	assert_int_equal(kvb_topo_pick_pci(f->t, NULL, &p), -EINVAL);
	assert_int_equal(kvb_topo_pick_pci(f->t, "-000:19:00.0", &p), -EINVAL);
}

static void test_twonic(void **state)
{
	struct fx *f = *state;
	struct kvb_topo_pick p[4];
	enum kvb_topo_near near;
	int idx[4];

	assert_int_equal(
		kvb_topo_nearest_pci(f->t, "0000:19:00.0", idx, 4, &near), 2);
	assert_int_equal(near, KVB_TOPO_SWITCH);
	assert_int_equal(idx[0], 0);
	assert_int_equal(idx[1], 1);
	/* the two GPUs of the switch land on different NICs */
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p[0]);
	pick_gpu(f->t, "0000:1b:00.0", "mlx5_1", 1, KVB_TOPO_SWITCH, &p[1]);
	assert_int_equal(p[1].ties, 2);
	assert_non_null(strstr(p[1].why, "; 2 equally near, least used"));
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p[2]);
	pick_gpu(f->t, "0000:19:00.0", "mlx5_1", 1, KVB_TOPO_SWITCH, &p[3]);
	/* nested switches: the inner one wins over the outer one */
	assert_int_equal(
		kvb_topo_nearest_pci(f->t, "0000:5f:00.0", idx, 4, NULL), 1);
	pick_gpu(f->t, "0000:5f:00.0", "mlx5_3", 1, KVB_TOPO_SWITCH, &p[0]);
	assert_string_equal(p[0].why, "mlx5_3 port 1: same PCIe switch "
				      "0000:5b:00.0 as GPU 0000:5f:00.0");
	pick_gpu(f->t, "0000:5f:00.0", "mlx5_3", 1, KVB_TOPO_SWITCH, &p[0]);
}

static void test_dualport(void **state)
{
	struct fx *f = *state;
	const struct kvb_topo_nic *n = kvb_topo_nic(f->t, 1);
	struct kvb_topo_pick p[6];
	int i;

	assert_int_equal(n->nports, 2);
	assert_int_equal(n->port[1], 2);
	assert_int_equal(n->active[0], 1);
	assert_int_equal(n->active[1], 0);
	assert_int_equal(n->ethernet[1], 1);
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p[0]);
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 2, KVB_TOPO_SWITCH, &p[1]);
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p[2]);
	for (i = 0; i < 3; i++)
		kvb_topo_release(f->t, &p[i]);
	/* host memory: three active ports share; port 2 of mlx5_1 never */
	for (i = 0; i < 6; i++) {
		assert_int_equal(kvb_topo_pick_numa(f->t, 0, &p[i]), 0);
		assert_false(!strcmp(p[i].dev, "mlx5_1") && p[i].port == 2);
	}
	assert_int_equal(n->uses[0], 2);
	assert_int_equal(n->uses[1], 0);
	assert_int_equal(kvb_topo_nic(f->t, 0)->uses[0], 2);
	assert_int_equal(kvb_topo_nic(f->t, 0)->uses[1], 2);
}

static void test_numa_unknown(void **state)
{
	struct fx *f = *state;
	const struct kvb_topo_nic *rxe = kvb_topo_nic(f->t, 2);
	struct kvb_topo_pick p;

	assert_string_equal(rxe->name, "rxe0");
	assert_string_equal(rxe->pci, "");
	assert_int_equal(rxe->numa, -1);
	assert_int_equal(kvb_topo_nic(f->t, 0)->numa, -1);
	/* the PCI path decides even when numa_node says nothing */
	pick_gpu(f->t, "0000:19:00.0", "mlx5_0", 1, KVB_TOPO_SWITCH, &p);
	kvb_topo_release(f->t, &p);
	/* no NIC on node 0: an unknown node beats a known other node */
	pick_gpu(f->t, "0000:3b:00.0", "mlx5_0", 1, KVB_TOPO_NUMA_UNKNOWN, &p);
	assert_int_equal(p.ties, 2);
	pick_gpu(f->t, "0000:3b:00.0", "rxe0", 1, KVB_TOPO_NUMA_UNKNOWN, &p);
	assert_non_null(strstr(p.why, "NUMA node unknown (NIC node -1"));
	assert_int_equal(kvb_topo_pick_numa(f->t, 1, &p), 0);
	assert_string_equal(p.dev, "mlx5_1");
	assert_int_equal(kvb_topo_pick_numa(f->t, -1, &p), 0);
	assert_int_equal(p.near, KVB_TOPO_NUMA_UNKNOWN);
}

static void test_empty(void **state)
{
	char root[PATH_MAX], p[PATH_MAX + 32], why[256];
	struct kvb_topo *t = NULL;

	(void) state;
	assert_int_equal(fake_sysfs_build("# nothing\n", root, sizeof(root)),
			 0);
	assert_int_equal(kvb_topo_open(root, &t, why, sizeof(why)), -ENODEV);
	printf("  empty: %s\n", why);
	assert_non_null(strstr(why, "no RDMA device in "));
	assert_null(t);
	snprintf(p, sizeof(p), "%s/class/infiniband", root);
	assert_int_equal(rmdir(p), 0);
	assert_int_equal(kvb_topo_open(root, &t, why, sizeof(why)), -ENOENT);
	printf("  no class dir: %s\n", why);
	assert_non_null(strstr(why, "/class/infiniband: no RDMA driver"));
	fake_sysfs_remove(root);
	assert_int_equal(kvb_topo_open(root, &t, NULL, 0), -ENOENT);
	/* a bad description is refused, nothing left behind */
	assert_int_equal(fake_sysfs_build("nic x\n", root, sizeof(root)),
			 -EINVAL);
	assert_int_equal(access(root, F_OK), -1);
}

static void test_bus_id(void **state)
{
	char b[16];

	(void) state;
	assert_int_equal(kvb_topo_bus_id("0000:19:00.0", b, sizeof(b)), 0);
	assert_string_equal(b, "0000:19:00.0");
	assert_int_equal(kvb_topo_bus_id("00000001:AB:1f.7", b, sizeof(b)), 0);
	assert_string_equal(b, "0001:ab:1f.7");
	assert_int_equal(kvb_topo_bus_id("0000:19:00.0", b, 12), -ENOSPC);
	assert_int_equal(kvb_topo_bus_id("0000:19:00", b, sizeof(b)), -EINVAL);
	assert_int_equal(kvb_topo_bus_id("1:0000:19:00.0", b, sizeof(b)),
			 -EINVAL);
	assert_int_equal(kvb_topo_bus_id("", b, sizeof(b)), -EINVAL);
	assert_int_equal(kvb_topo_bus_id("0000:19:00.8", b, sizeof(b)),
			 -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_h100_gpus, setup_h100,
						teardown),
		cmocka_unit_test_setup_teardown(test_h100_numa, setup_h100,
						teardown),
		cmocka_unit_test_setup_teardown(test_h100_score, setup_h100,
						teardown),
		cmocka_unit_test_setup_teardown(test_nonic, setup_nonic,
						teardown),
		cmocka_unit_test_setup_teardown(test_twonic, setup_twonic,
						teardown),
		cmocka_unit_test_setup_teardown(test_dualport, setup_dualport,
						teardown),
		cmocka_unit_test_setup_teardown(test_numa_unknown, setup_numa,
						teardown),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_bus_id),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

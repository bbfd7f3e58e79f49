// SPDX-License-Identifier: MIT
/*
 * rdma_where: what bridge/rdma/resolve.c and topo.c find on this machine.
 *
 *   rdma_where IP [TIMEOUT_MS]
 *     the device, port and GID index that carry IP, as key=value pairs for
 *     scripts, then the explanation:
 *       dev=rxe0 port=1 gid_index=1 gid_type=v2 local=192.0.2.1
 *       192.0.2.1: rxe0 port 1 GID index 1 (RoCE v2)
 *     TIMEOUT_MS (default 0) > 0 also resolves peers' addresses.
 *   rdma_where --numa NODE | --gpu BUS_ID [SYSFS_ROOT]
 *     the RDMA devices (one line each), then the NIC port picked for host
 *     memory on NODE or for the GPU at BUS_ID, with the reason.
 *
 * Exit status 0, or 1 with the reason on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/rdma/resolve.h"
#include "bridge/rdma/topo.h"

static int resolve(const char *ip, int timeout_ms)
{
	struct kvb_rdma_where w;
	int err = kvb_rdma_resolve(ip, timeout_ms, &w);

	if (err) {
		fprintf(stderr, "rdma_where: %s (%s)\n", w.why, strerror(-err));
		return 1;
	}
	printf("dev=%s port=%d gid_index=%d gid_type=%s local=%s\n%s\n", w.dev,
	       w.port, w.gid_index,
	       w.gid_type == KVB_GID_TYPE_V2   ? "v2"
	       : w.gid_type == KVB_GID_TYPE_V1 ? "v1"
					       : "unknown",
	       w.local_ip, w.why);
	return 0;
}

static int topo(const char *mode, const char *arg, const char *root)
{
	struct kvb_topo_pick p;
	struct kvb_topo *t;
	char why[256];
	int i, j, err;

	err = kvb_topo_open(root, &t, why, sizeof(why));
	if (err) {
		fprintf(stderr, "rdma_where: %s (%s)\n", why, strerror(-err));
		return 1;
	}
	for (i = 0; i < kvb_topo_count(t); i++) {
		const struct kvb_topo_nic *n = kvb_topo_nic(t, i);

		printf("nic=%s pci=%s numa=%d ports=", n->name, n->pci,
		       n->numa);
		for (j = 0; j < n->nports; j++)
			printf("%s%d:%s:%s", j ? "," : "", n->port[j],
			       n->active[j] ? "active" : "down",
			       n->ethernet[j] ? "eth" : "ib");
		printf("\n");
	}
	if (!strcmp(mode, "--numa"))
		err = kvb_topo_pick_numa(t, atoi(arg), &p);
	else
		err = kvb_topo_pick_pci(t, arg, &p);
	if (err)
		fprintf(stderr, "rdma_where: %s %s: %s\n", mode, arg,
			strerror(-err));
	else
		printf("pick=%s port=%d\n%s\n", p.dev, p.port, p.why);
	kvb_topo_close(t);
	return err ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && argc <= 4 &&
	    (!strcmp(argv[1], "--numa") || !strcmp(argv[1], "--gpu")))
		return topo(argv[1], argv[2], argc > 3 ? argv[3] : NULL);
	if (argc < 2 || argc > 3 || argv[1][0] == '-') {
		fprintf(stderr,
			"usage: %s IP [TIMEOUT_MS]\n"
			"       %s --numa NODE | --gpu BUS_ID [SYSFS_ROOT]\n",
			argv[0], argv[0]);
		return 2;
	}
	return resolve(argv[1], argc > 2 ? atoi(argv[2]) : 0);
}

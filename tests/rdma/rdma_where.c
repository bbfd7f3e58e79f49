// SPDX-License-Identifier: MIT
/*
 * rdma_where IP [TIMEOUT_MS]: the RDMA device, port and GID index that
 * carry IP (bridge/rdma/resolve.c), as one line of key=value pairs for
 * scripts, then the explanation:
 *
 *   dev=rxe0 port=1 gid_index=1 gid_type=v2 local=192.0.2.1
 *   192.0.2.1: rxe0 port 1 GID index 1 (RoCE v2)
 *
 * TIMEOUT_MS (default 0) > 0 also resolves peers' addresses (the route's
 * device). Exit status 0, or 1 with the reason on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/rdma/resolve.h"

int main(int argc, char **argv)
{
	struct kvb_rdma_where w;
	int err;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s IP [TIMEOUT_MS]\n", argv[0]);
		return 2;
	}
	err = kvb_rdma_resolve(argv[1], argc > 2 ? atoi(argv[2]) : 0, &w);
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

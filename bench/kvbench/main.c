/* SPDX-License-Identifier: MIT */
/*
 * kvbench: is kvbroker worth running? One program, subcommands:
 *   workload (default)  direct vs broker on a vLLM-shaped P -> D workload
 *   rate                descriptors/s through the broker, tiny writes
 *   lat                 broker round trip with busy polling
 *   ring                the shm ring vs DPDK rte_ring (bench/ring)
 */
#include "kvbench.h"

#include <string.h>

#ifdef KVB_HAVE_RING_BENCH
#include "ring_bench.h"
#endif

static void usage(FILE *f)
{
	fputs("Usage: kvbench [SUBCOMMAND] [OPTIONS]\n"
	      "  workload   (default) vLLM-shaped P->D writes, direct vs "
	      "broker:\n"
	      "             doorbells, WRs/doorbell, CPU per WR, message rate, "
	      "bandwidth,\n"
	      "             per-transfer latency; table, --json, --plot\n"
	      "  rate       descriptors/s through the broker with tiny writes\n"
	      "  lat        broker round-trip latency with busy polling\n"
	      "  ring       kvbroker's shm ring vs DPDK rte_ring, 64-byte "
	      "entries\n"
	      "`kvbench SUBCOMMAND --help` lists each one's options and "
	      "defaults.\n"
	      "Transports: local; tcp, rdma and gpu in `workload` "
	      "(--transport tcp: two\n"
	      "network namespaces when root, else loopback; --transport rdma: "
	      "a verbs\n"
	      "device, e.g. the soft-RoCE guest of tests/rdma/rxe-runner.sh; "
	      "--transport gpu:\n"
	      "device memory, --gpu-backend auto|cuda|hip|host, exit 77 "
	      "without a GPU; host\n"
	      "measures the host copy path, not a GPU).\n",
	      f);
}

static int ring_main(int argc, char **argv)
{
#ifdef KVB_HAVE_RING_BENCH
	return kvb_ring_bench_main(argc, argv);
#else
	(void) argc;
	(void) argv;
	fprintf(stderr, "kvbench ring: this kvbench was built without the ring "
			"benchmark (bench/ring)\n");
	return 2;
#endif
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} sub[] = {
		{"workload", kvb_bench_workload_main},
		{"rate", kvb_bench_rate_main},
		{"lat", kvb_bench_lat_main},
		{"ring", ring_main},
	};

	if (argc > 1 && (!strcmp(argv[1], "help") || !strcmp(argv[1], "-h"))) {
		usage(stdout);
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--help")) {
		usage(stdout);
		printf("\n");
		return kvb_bench_workload_main(argc, argv);
	}
	if (argc > 1 && argv[1][0] != '-') {
		for (unsigned i = 0; i < sizeof(sub) / sizeof(sub[0]); i++)
			if (!strcmp(argv[1], sub[i].name))
				return sub[i].fn(argc - 1, argv + 1);
		fprintf(stderr, "kvbench: unknown subcommand '%s'\n\n",
			argv[1]);
		usage(stderr);
		return 2;
	}
	/* no subcommand: the workload, with every argument */
	return kvb_bench_workload_main(argc, argv);
}

/* SPDX-License-Identifier: MIT */
/*
 * kvb-ring-bench: throughput of the kvb SPSC shared-memory ring (64-byte
 * entries) between two processes and two threads, and of DPDK's rte_ring
 * with 64-byte elements between two threads when built with DPDK.
 *
 * Also the `kvbench ring` subcommand: kvbench passes its argv from the
 * subcommand on (argv[0] is the subcommand's name).
 */
#ifndef KVB_BENCH_RING_BENCH_H
#define KVB_BENCH_RING_BENCH_H

/*
 * Run the ring benchmark. Options:
 *   --burst LIST     comma-separated burst sizes (default 8,32,128)
 *   --seconds S      measured time per run (default 2)
 *   --repeat N       runs per case, report the median (default 1)
 *   --ring N         ring slots, power of two (default 4096)
 *   --cpus P,C       producer and consumer CPUs (default 0,1)
 *   --json FILE      also write the results as JSON
 *   --no-dpdk        skip the rte_ring comparison
 * Prints a table on stdout. Returns 0 on success, 1 on a failed run, 2 on a
 * usage error (a process exit status).
 */
int kvb_ring_bench_main(int argc, char **argv);

#endif /* KVB_BENCH_RING_BENCH_H */

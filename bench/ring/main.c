/* SPDX-License-Identifier: MIT */
#include "ring_bench.h"

int main(int argc, char **argv)
{
	return kvb_ring_bench_main(argc, argv);
}

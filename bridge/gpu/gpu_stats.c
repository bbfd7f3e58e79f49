/* SPDX-License-Identifier: MIT */
/* The gpu transport's counters for `kvbctl stats` (ops->stats_format). */
#include <stdio.h>

#include "gpu/gpu.h"

#define PUT(...) kvb_transport_put(buf, cap, &len, __VA_ARGS__)

size_t kvb_gpu_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			    int json, char *buf, size_t cap)
{
	struct kvb_gpu_stats g;
	size_t len = 0;

	if (ep || !cap || kvb_gpu_transport_stats(t, &g))
		return 0;
	if (json)
		PUT("\"gpu\":{\"backend\":\"%s\",\"copies\":%llu,"
		    "\"batches\":%llu,\"bytes\":%llu,\"streams\":%u,"
		    "\"streams_busy\":%u,\"failed_ops\":%llu},",
		    g.backend, (unsigned long long) g.copies,
		    (unsigned long long) g.batches,
		    (unsigned long long) g.bytes, g.streams, g.streams_busy,
		    (unsigned long long) g.failed_ops);
	else
		PUT("gpu                    backend %s, %llu copies in "
		    "%llu batches, %llu bytes, %u/%u streams busy, "
		    "%llu failed ops\n",
		    g.backend, (unsigned long long) g.copies,
		    (unsigned long long) g.batches,
		    (unsigned long long) g.bytes, g.streams_busy, g.streams,
		    (unsigned long long) g.failed_ops);
	return len;
}

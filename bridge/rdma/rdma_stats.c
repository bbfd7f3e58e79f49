/* SPDX-License-Identifier: MIT */
/* The rdma transport's counters for `kvbctl stats` (ops->stats_format). */
#include <stdio.h>

#include "rdma/rdma.h"

#define PUT(...) kvb_transport_put(buf, cap, &len, __VA_ARGS__)

/* Per-QP counters of an endpoint. */
static size_t qp_stats(struct kvb_transport *t, struct kvb_ep *ep, int json,
		       char *buf, size_t cap)
{
	struct kvb_rdma_qp_stats q;
	size_t len = 0;

	for (unsigned i = 0; !kvb_rdma_qp_stats(t, ep, i, &q); i++) {
		if (json)
			PUT("%s{\"qpn\":%u,\"credits\":%u,\"depth\":%u,"
			    "\"in_flight\":%u,\"doorbells\":%llu,\"wrs\":%llu,"
			    "\"ops\":%llu,\"bytes\":%llu,\"cqes\":%llu,"
			    "\"credit_stalls\":%llu,\"wc_errors\":%llu,"
			    "\"resets\":%llu,\"nic\":%u,\"peer_nic\":%u}",
			    i ? "," : "", q.qpn, q.credits, q.depth,
			    q.in_flight, (unsigned long long) q.chain.chains,
			    (unsigned long long) q.chain.wrs,
			    (unsigned long long) q.chain.ops,
			    (unsigned long long) q.chain.bytes,
			    (unsigned long long) q.chain.cqes,
			    (unsigned long long) q.chain.credit_stalls,
			    (unsigned long long) q.chain.wc_errors,
			    (unsigned long long) q.chain.resets, q.lnic,
			    q.rnic);
		else
			PUT("  qp %-6u            %llu WRs in %llu doorbells "
			    "(%.1f per doorbell), %llu CQEs, %llu credit "
			    "stalls, %llu WC errors, %u/%u in flight\n",
			    q.qpn, (unsigned long long) q.chain.wrs,
			    (unsigned long long) q.chain.chains,
			    q.chain.chains ? (double) q.chain.wrs /
						     (double) q.chain.chains
					   : 0.0,
			    (unsigned long long) q.chain.cqes,
			    (unsigned long long) q.chain.credit_stalls,
			    (unsigned long long) q.chain.wc_errors, q.in_flight,
			    q.depth);
	}
	return len;
}

/* The device's state and events ("rdma_device" object / a line). */
static size_t device_stats(struct kvb_transport *t, int json, char *buf,
			   size_t cap)
{
	struct kvb_rdma_async_stats s;
	const char *state;
	size_t len = 0;

	kvb_rdma_async_get_stats(t, &s);
	state = s.device_dead ? "dead" : s.port_down ? "down" : "active";
	if (json)
		PUT("\"rdma_device\":{\"port\":\"%s\",\"events\":%llu,"
		    "\"port_errors\":%llu,\"port_active\":%llu,"
		    "\"qp_errors\":%llu,\"cq_errors\":%llu,"
		    "\"device_fatal\":%llu},",
		    state, (unsigned long long) s.events,
		    (unsigned long long) s.port_errors,
		    (unsigned long long) s.port_active,
		    (unsigned long long) s.qp_errors,
		    (unsigned long long) s.cq_errors,
		    (unsigned long long) s.device_fatal);
	else
		PUT("rdma port              %s (%llu device events: %llu port "
		    "down, %llu up, %llu QP errors, %llu CQ errors)\n",
		    state, (unsigned long long) s.events,
		    (unsigned long long) s.port_errors,
		    (unsigned long long) s.port_active,
		    (unsigned long long) s.qp_errors,
		    (unsigned long long) s.cq_errors);
	return len;
}

size_t kvb_rdma_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			     int json, char *buf, size_t cap)
{
	if (!cap)
		return 0;
	if (ep)
		return qp_stats(t, ep, json, buf, cap);
	/* the NICs' rows: the broker's, from ops->nics() */
	return device_stats(t, json, buf, cap);
}

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

/* Each NIC's state and counters ("rdma_nics" list / a line each). */
static size_t nic_stats(struct kvb_transport *t, int json, char *buf,
			size_t cap)
{
	struct kvb_transport_nic n[KVB_NIC_MAX];
	int k = t->ops->nics(t, n, KVB_NIC_MAX);
	size_t len = 0;

	if (json)
		PUT("\"rdma_nics\":[");
	for (int i = 0; i < k && i < KVB_NIC_MAX; i++) {
		if (json)
			PUT("%s{\"name\":\"%s\",\"port\":%d,\"up\":%d,"
			    "\"numa\":%d,\"pci\":\"%s\",\"regions\":%llu,"
			    "\"qps\":%u,\"max_qps\":%u,\"qp_refused\":%llu,"
			    "\"bytes\":%llu,\"wrs\":%llu,\"doorbells\":%llu,"
			    "\"moved\":%llu}",
			    i ? "," : "", n[i].name, n[i].port, n[i].port_up,
			    n[i].numa, n[i].pci,
			    (unsigned long long) n[i].regions, n[i].qps,
			    n[i].max_qps, (unsigned long long) n[i].qp_refused,
			    (unsigned long long) n[i].bytes,
			    (unsigned long long) n[i].wrs,
			    (unsigned long long) n[i].doorbells,
			    (unsigned long long) n[i].moved);
		else
			PUT("rdma nic %-13s %s port %d, NUMA %d, PCI %s: %llu "
			    "regions, %u/%u QPs (%llu refused), %llu bytes in "
			    "%llu WRs, %llu doorbells, %llu moved here\n",
			    n[i].name, n[i].port_up ? "up" : "DOWN", n[i].port,
			    n[i].numa, n[i].pci[0] ? n[i].pci : "-",
			    (unsigned long long) n[i].regions, n[i].qps,
			    n[i].max_qps, (unsigned long long) n[i].qp_refused,
			    (unsigned long long) n[i].bytes,
			    (unsigned long long) n[i].wrs,
			    (unsigned long long) n[i].doorbells,
			    (unsigned long long) n[i].moved);
	}
	if (json)
		PUT("],");
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
	size_t len;

	if (ep)
		return qp_stats(t, ep, json, buf, cap);
	len = device_stats(t, json, buf, cap);
	if (len < cap)
		len += nic_stats(t, json, buf + len, cap - len);
	return len;
}

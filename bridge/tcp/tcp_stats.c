/* SPDX-License-Identifier: MIT */
/* The tcp transport's counters for `kvbctl stats` (ops->stats_format). */
#include <stdio.h>

#include "tcp/tcp.h"

#define PUT(...) kvb_transport_put(buf, cap, &len, __VA_ARGS__)

size_t kvb_tcp_stats_format(struct kvb_transport *t, struct kvb_ep *ep,
			    int json, char *buf, size_t cap)
{
	struct kvb_tcp_stats s;
	size_t len = 0;

	if (ep || !cap)
		return 0; /* nothing per endpoint */
	kvb_tcp_get_stats(t, &s);
	if (json)
		PUT("\"tcp\":{\"bytes_tx\":%llu,\"bytes_rx\":%llu,"
		    "\"frames_tx\":%llu,\"frames_rx\":%llu,\"rejected\":%llu,"
		    "\"refused_ops\":%llu,\"conn_failed\":%llu,"
		    "\"conns_open\":%llu,\"eps_open\":%llu,"
		    "\"gpu_tx_bytes\":%llu,\"gpu_rx_bytes\":%llu,"
		    "\"gpu_copy_errors\":%llu,\"ops_merged\":%llu,"
		    "\"conns_unauth\":%llu,\"auth_ok\":%llu,"
		    "\"accept_paused\":%llu,\"dial_auth_failed\":%llu,"
		    "\"refusals\":{\"untrusted_host\":%llu,"
		    "\"auth_failed\":%llu,\"auth_timeout\":%llu,"
		    "\"conn_limit\":%llu,\"region_refused\":%llu,"
		    "\"unauth_evicted\":%llu}},",
		    (unsigned long long) s.bytes_tx,
		    (unsigned long long) s.bytes_rx,
		    (unsigned long long) s.frames_tx,
		    (unsigned long long) s.frames_rx,
		    (unsigned long long) s.rejected,
		    (unsigned long long) s.refused_ops,
		    (unsigned long long) s.conn_failed,
		    (unsigned long long) s.conns_open,
		    (unsigned long long) s.eps_open,
		    (unsigned long long) s.gpu_tx_bytes,
		    (unsigned long long) s.gpu_rx_bytes,
		    (unsigned long long) s.gpu_copy_errors,
		    (unsigned long long) s.ops_merged,
		    (unsigned long long) s.conns_unauth,
		    (unsigned long long) s.auth_ok,
		    (unsigned long long) s.accept_paused,
		    (unsigned long long) s.dial_auth_failed,
		    (unsigned long long) s.refused_untrusted,
		    (unsigned long long) s.refused_auth_failed,
		    (unsigned long long) s.refused_auth_timeout,
		    (unsigned long long) s.refused_conn_limit,
		    (unsigned long long) s.refused_region,
		    (unsigned long long) s.unauth_evicted);
	else
		PUT("tcp                    %llu bytes sent, %llu received, "
		    "%llu refused ops, %llu malformed frames; GPU staged %llu "
		    "out, %llu in, %llu copy errors; refused: %llu "
		    "untrusted_host, %llu auth_failed, %llu auth_timeout, "
		    "%llu conn_limit, %llu region_refused, %llu "
		    "unauth_evicted\n",
		    (unsigned long long) s.bytes_tx,
		    (unsigned long long) s.bytes_rx,
		    (unsigned long long) s.refused_ops,
		    (unsigned long long) s.rejected,
		    (unsigned long long) s.gpu_tx_bytes,
		    (unsigned long long) s.gpu_rx_bytes,
		    (unsigned long long) s.gpu_copy_errors,
		    (unsigned long long) s.refused_untrusted,
		    (unsigned long long) s.refused_auth_failed,
		    (unsigned long long) s.refused_auth_timeout,
		    (unsigned long long) s.refused_conn_limit,
		    (unsigned long long) s.refused_region,
		    (unsigned long long) s.unauth_evicted);
	return len;
}

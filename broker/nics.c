/* SPDX-License-Identifier: MIT */
/*
 * The rdma transport's NICs (transport.h ops->nics, ops->mr_nic) as the
 * broker shows them: `kvbctl nics`, the "nics" part of `kvbctl stats`, and
 * `kvbctl regions` (each region and the NIC its traffic goes through).
 * A transport without nics() (tcp, an rdma transport of one NIC that tells
 * nothing) shows no NIC rows. Rows that do not fit in one reply
 * (KVB_MSG_MAX) are counted ("omitted"), never cut.
 */
#include "broker.h"
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvbroker/kvbroker.h"

/* a region's row and what follows it: its NIC's name and why, escaped */
#define ROW_ROOM 2048u

__attribute__((format(printf, 4, 5))) static void
put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvb_transport_vput(buf, cap, len, fmt, ap);
	va_end(ap);
}

/* A NIC name (from the device, or the user's --rdma-dev): JSON-escaped or
 * printable. */
static void put_name(char *buf, size_t cap, size_t *len, const char *s,
		     int json)
{
	if (json)
		put(buf, cap, len, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char) *s;

		if (json && (c == '"' || c == '\\'))
			put(buf, cap, len, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			put(buf, cap, len, json ? "\\u%04x" : "\\x%02x", c);
		else
			put(buf, cap, len, "%c", c);
	}
	if (json)
		put(buf, cap, len, "\"");
}

int kvb_nics_get(struct kvb_broker *b, struct kvb_transport_nic *out,
		 unsigned max)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	int n;

	if (!t || !t->ops->nics)
		return -ENOTSUP;
	n = t->ops->nics(t, out, max);
	if (n < 0)
		return n;
	return (unsigned) n > max ? (int) max : n;
}

static void nic_json(char *buf, size_t cap, size_t *len,
		     const struct kvb_transport_nic *c, unsigned i)
{
	put(buf, cap, len, "%s{\"index\":%u,\"name\":", i ? "," : "", i);
	put_name(buf, cap, len, c->name, 1);
	put(buf, cap, len,
	    ",\"port\":%d,\"up\":%s,\"numa\":%d,\"pci\":", c->port,
	    c->port_up ? "true" : "false", c->numa);
	put_name(buf, cap, len, c->pci, 1);
	put(buf, cap, len,
	    ",\"bytes\":%llu,\"wrs\":%llu,\"doorbells\":%llu,"
	    "\"qps\":%u,\"max_qps\":%u,\"qp_refused\":%llu,\"moved\":%llu,"
	    "\"qp_parked\":%llu,\"regions\":%llu}",
	    (unsigned long long) c->bytes, (unsigned long long) c->wrs,
	    (unsigned long long) c->doorbells, c->qps, c->max_qps,
	    (unsigned long long) c->qp_refused, (unsigned long long) c->moved,
	    (unsigned long long) c->qp_parked, (unsigned long long) c->regions);
}

static void nic_text(char *buf, size_t cap, size_t *len,
		     const struct kvb_transport_nic *c)
{
	char qps[24];

	if (c->max_qps)
		snprintf(qps, sizeof(qps), "%u/%u", c->qps, c->max_qps);
	else
		snprintf(qps, sizeof(qps), "%u/-", c->qps);
	put_name(buf, cap, len, c->name, 0);
	put(buf, cap, len,
	    "%*s %4d %-5s %4d %-13s %14llu %11llu %10llu %9s "
	    "%7llu %7llu %7llu\n",
	    (int) (strlen(c->name) < 12 ? 12 - strlen(c->name) : 0), "",
	    c->port, c->port_up ? "up" : "down", c->numa,
	    c->pci[0] ? c->pci : "-", (unsigned long long) c->bytes,
	    (unsigned long long) c->wrs, (unsigned long long) c->doorbells, qps,
	    (unsigned long long) c->qp_refused, (unsigned long long) c->moved,
	    (unsigned long long) c->regions);
}

void kvb_nics_put(struct kvb_broker *b, int json, char *buf, size_t cap,
		  size_t *len)
{
	struct kvb_transport_nic nic[KVB_NIC_MAX];
	int n = kvb_nics_get(b, nic, KVB_NIC_MAX);

	if (json) {
		put(buf, cap, len, "\"nics\":[");
		for (int i = 0; i < n; i++)
			nic_json(buf, cap, len, &nic[i], (unsigned) i);
		put(buf, cap, len, "]");
		return;
	}
	if (n <= 0)
		return;
	put(buf, cap, len,
	    "%-12s %4s %-5s %4s %-13s %14s %11s %10s %9s %7s %7s %7s\n", "nic",
	    "port", "state", "numa", "pci", "bytes", "wrs", "doorbells",
	    "qps/max", "refused", "moved", "regions");
	for (int i = 0; i < n; i++)
		nic_text(buf, cap, len, &nic[i]);
}

/* `kvbctl nics` */
static void nics_view(struct kvb_broker *b, int json, char *buf, size_t cap,
		      size_t *len)
{
	struct kvb_transport_nic nic[1];

	if (json) {
		put(buf, cap, len, "{\"transport\":%s,",
		    b->trs[KVB_TS_RDMA] ? "\"rdma\"" : "null");
		kvb_nics_put(b, 1, buf, cap, len);
		put(buf, cap, len, "}\n");
		return;
	}
	if (kvb_nics_get(b, nic, 1) < 0)
		put(buf, cap, len,
		    "(no NICs to show: the broker runs without the rdma "
		    "transport, or it tells none)\n");
	else
		kvb_nics_put(b, 0, buf, cap, len);
}

/* The NIC region r's traffic goes through: its name into name (or "-") and
 * why; -errno when there is none to tell. */
static int region_nic(struct kvb_broker *b, const struct kvb_region_ent *r,
		      const struct kvb_region_info *ri,
		      const struct kvb_transport_nic *nic, int n, char *why,
		      size_t why_len)
{
	struct kvb_transport *t = b->trs[KVB_TS_RDMA];
	int i;

	why[0] = '\0';
	if (!t || !t->ops->mr_nic || !ri->rdma || n <= 0)
		return -ENOTSUP;
	i = t->ops->mr_nic(t, &r->mr, why, why_len);
	if (i >= n)
		return -ERANGE;
	return i;
}

static void region_row(struct kvb_broker *b, const struct kvb_region_ent *r,
		       const struct kvb_transport_nic *nic, int n, int json,
		       char *buf, size_t cap, size_t *len, unsigned k)
{
	char why[256];
	struct kvb_region_info ri;
	int i;
	uint32_t worker = r->owner; /* its worker's id */
	const char *kind = r->mr.kind == KVB_MEM_GPU ? "gpu" : "host";
	char access[3] = {r->mr.flags & KVB_MEM_REMOTE_READ ? 'r' : '-',
			  r->mr.flags & KVB_MEM_REMOTE_WRITE ? 'w' : '-', 0};

	kvb_hook_region_info(b, r, &ri); /* the cross-node module's part */
	i = region_nic(b, r, &ri, nic, n, why, sizeof(why));

	if (json) {
		put(buf, cap, len,
		    "%s{\"id\":%u,\"worker\":%u,\"size\":%llu,\"kind\":\"%s\","
		    "\"kv\":%s,\"layer\":%u,\"remote_read\":%s,"
		    "\"remote_write\":%s,\"state\":\"%s\",\"rdma\":%s,\"nic\":",
		    k ? "," : "", r->mr.id, worker,
		    (unsigned long long) r->mr.len, kind,
		    ri.kv ? "true" : "false", ri.layer,
		    access[0] == 'r' ? "true" : "false",
		    access[1] == 'w' ? "true" : "false",
		    r->dead ? "freeing" : "live", ri.rdma ? "true" : "false");
		if (i >= 0) {
			put_name(buf, cap, len, nic[i].name, 1);
			put(buf, cap, len, ",\"nic_index\":%d,\"why\":", i);
			put_name(buf, cap, len, why, 1);
		} else if (i == -ENOTSUP) {
			put(buf, cap, len,
			    "null,\"nic_index\":null,\"why\":null");
		} else {
			/* the transport could not tell: say so */
			put(buf, cap, len,
			    "null,\"nic_index\":null,\"why\":\"%s\"",
			    i == -ERANGE ? "the transport named a NIC it does "
					   "not have"
					 : strerror(-i));
		}
		put(buf, cap, len, "}");
		return;
	}
	put(buf, cap, len, "%#-10x %-8u %14llu %-4s %-3s %5u %-6s %-7s ",
	    r->mr.id, worker, (unsigned long long) r->mr.len, kind,
	    ri.kv ? "yes" : "no", ri.layer, access,
	    r->dead ? "freeing" : "live");
	if (i >= 0)
		put_name(buf, cap, len, nic[i].name, 0);
	else
		put(buf, cap, len, "-");
	put(buf, cap, len, "\n");
}

/* `kvbctl regions` */
static void regions_view(struct kvb_broker *b, int json, char *buf, size_t cap,
			 size_t *len)
{
	struct kvb_transport_nic nic[KVB_NIC_MAX];
	int n = kvb_nics_get(b, nic, KVB_NIC_MAX);
	unsigned k = 0, omitted = 0;

	if (json)
		put(buf, cap, len, "{\"regions\":[");
	else
		put(buf, cap, len,
		    "%-10s %-8s %14s %-4s %-3s %5s %-6s %-7s %s\n", "region",
		    "worker", "size", "kind", "kv", "layer", "access", "state",
		    "nic");
	for (uint32_t s = 1; b->regions.v && s < KVB_MAX_REGIONS; s++) {
		const struct kvb_region_ent *r = &b->regions.v[s];

		if (!r->used)
			continue;
		if (cap - *len < ROW_ROOM) {
			omitted++;
			continue;
		}
		region_row(b, r, nic, n, json, buf, cap, len, k++);
	}
	if (json)
		put(buf, cap, len, "],\"live\":%u,\"omitted\":%u}\n",
		    b->regions.live, omitted);
	else if (omitted)
		put(buf, cap, len, "(%u more regions: the reply is full)\n",
		    omitted);
}

int kvb_view_nics(struct kvb_broker *b, uint32_t view, int json, char *buf,
		  size_t cap)
{
	size_t len = 0;

	if (!cap)
		return -EINVAL;
	buf[0] = '\0';
	if (view == KVB_VIEW_NICS)
		nics_view(b, json, buf, cap, &len);
	else if (view == KVB_VIEW_REGIONS)
		regions_view(b, json, buf, cap, &len);
	else
		return -EINVAL;
	return (int) len;
}

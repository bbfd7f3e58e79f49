/* SPDX-License-Identifier: MIT */
/*
 * The exposition behind GET /metrics (docs/metrics.md lists every name):
 * node totals, per-transport counters and WRs-per-doorbell histograms,
 * per-worker series labelled role, dp, tp, and the transfer latency
 * histogram this file collects (kvb_metrics_xfer_end). Prometheus text
 * format 0.0.4, or OpenMetrics 1.0.0: the same samples; OpenMetrics names a
 * counter's family without `_total`, types build info as info, and ends
 * with `# EOF`.
 */
#include "metrics_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"

/* upper bounds of the transfer latency buckets: 100 us .. 120 s */
const int64_t kvb_mx_lat_bounds_ns[KVB_MX_LAT_BUCKETS] = {
	100000,	    250000,	500000,	     1000000,	   2500000,
	5000000,    10000000,	25000000,    100000000,	   250000000,
	1000000000, 5000000000, 30000000000, 120000000000,
};

static const char *const reason_names[KVB_MX_R_MAX] = {
	[KVB_MX_R_TIMEOUT] = "timeout",	    [KVB_MX_R_ABORTED] = "aborted",
	[KVB_MX_R_NETWORK] = "network",	    [KVB_MX_R_IO] = "io",
	[KVB_MX_R_INVALID] = "invalid",	    [KVB_MX_R_REFUSED] = "refused",
	[KVB_MX_R_RESOURCES] = "resources", [KVB_MX_R_OTHER] = "other",
};

const char *kvb_mx_reason_name(enum kvb_mx_reason r)
{
	return r < KVB_MX_R_MAX ? reason_names[r] : "other";
}

enum kvb_mx_reason kvb_mx_reason_of(int status)
{
	switch (-status) {
	case ETIMEDOUT:
		return KVB_MX_R_TIMEOUT;
	case ECANCELED:
	case ESHUTDOWN:
		return KVB_MX_R_ABORTED;
	case ECONNRESET:
	case ECONNREFUSED:
	case ECONNABORTED:
	case ENETDOWN:
	case ENETUNREACH:
	case EHOSTUNREACH:
	case EPIPE:
	case ENOTCONN:
		return KVB_MX_R_NETWORK;
	case EIO:
	case EREMOTEIO:
		return KVB_MX_R_IO;
	case EINVAL:
	case EFAULT:
	case ERANGE:
	case EBADMSG:
	case EPROTO:
		return KVB_MX_R_INVALID;
	case EPERM:
	case EACCES:
	case ESTALE:
		return KVB_MX_R_REFUSED;
	case ENOSPC:
	case ENOMEM:
	case EAGAIN:
	case ENOBUFS:
		return KVB_MX_R_RESOURCES;
	default:
		return KVB_MX_R_OTHER;
	}
}

void kvb_metrics_xfer_end(struct kvb_broker *b, const struct kvb_xfer *x,
			  int status)
{
	struct kvb_metrics *mx = b->mx;
	int64_t ns = kvb_now_ns() - x->opened_ns;
	unsigned i = 0, o = status ? 1 : 0;
	enum kvb_mx_reason r = kvb_mx_reason_of(status);
	struct kvb_worker *w;

	if (!mx)
		return;
	if (ns < 0)
		ns = 0;
	while (i < KVB_MX_LAT_BUCKETS && ns > kvb_mx_lat_bounds_ns[i])
		i++;
	mx->lat[o][i]++;
	mx->lat_sum_ns[o] += (uint64_t) ns;
	if (status)
		mx->failed[r]++;
	w = kvb_worker_by_id(b, x->worker);
	if (!w || !w->attached)
		return;
	if (mx->wk[KVB_WSLOT(w->id)].id != w->id)
		memset(&mx->wk[KVB_WSLOT(w->id)], 0, sizeof(*mx->wk));
	mx->wk[KVB_WSLOT(w->id)].id = w->id;
	if (status)
		mx->wk[KVB_WSLOT(w->id)].failed[r]++;
	else
		mx->wk[KVB_WSLOT(w->id)].done++;
}

/* ------------------------------------------------------------------ */
/* the exposition */

struct mbuf {
	char *p;
	size_t len, cap;
	int err;
	int om; /* OpenMetrics */
};

__attribute__((format(printf, 2, 3))) static void out(struct mbuf *m,
						      const char *fmt, ...)
{
	va_list ap;
	int n;

	if (m->err)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(m->p + m->len, m->cap - m->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			m->err = -EINVAL;
			return;
		}
		if ((size_t) n < m->cap - m->len)
			break;
		{
			size_t nc = (m->cap + (size_t) n) * 2;
			char *np = realloc(m->p, nc);

			if (!np) {
				m->err = -ENOMEM;
				return;
			}
			m->p = np;
			m->cap = nc;
		}
	}
	m->len += (size_t) n;
}

enum mtype { COUNTER, GAUGE, HISTOGRAM };

/* HELP and TYPE of a family; a counter's samples are name_total */
static void family(struct mbuf *m, const char *name, enum mtype t,
		   const char *help)
{
	static const char *const tn[] = {"counter", "gauge", "histogram"};
	const char *suf = t == COUNTER && !m->om ? "_total" : "";

	out(m, "# HELP %s%s %s\n# TYPE %s%s %s\n", name, suf, help, name, suf,
	    tn[t]);
}

static void counter1(struct mbuf *m, const char *name, const char *help,
		     uint64_t v)
{
	family(m, name, COUNTER, help);
	out(m, "%s_total %llu\n", name, (unsigned long long) v);
}

static void gauge1(struct mbuf *m, const char *name, const char *help,
		   uint64_t v)
{
	family(m, name, GAUGE, help);
	out(m, "%s %llu\n", name, (unsigned long long) v);
}

/* cumulative buckets, then _sum and _count; lbl: labels before "le";
 * the sum in units of 10^-scale (ns: 9), printed exactly */
static void hist_samples(struct mbuf *m, const char *name, const char *lbl,
			 const char *const *le, const uint64_t *bk, unsigned n,
			 uint64_t sum, unsigned scale)
{
	char s[48];
	uint64_t div = 1;

	for (unsigned i = 0; i < scale; i++)
		div *= 10;
	if (scale)
		snprintf(s, sizeof(s), "%llu.%0*llu",
			 (unsigned long long) (sum / div), (int) scale,
			 (unsigned long long) (sum % div));
	else
		snprintf(s, sizeof(s), "%llu", (unsigned long long) sum);
	uint64_t acc = 0;

	for (unsigned i = 0; i < n; i++) {
		acc += bk[i];
		out(m, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, lbl,
		    lbl[0] ? "," : "", le[i], (unsigned long long) acc);
	}
	if (lbl[0]) {
		out(m, "%s_sum{%s} %s\n", name, lbl, s);
		out(m, "%s_count{%s} %llu\n", name, lbl,
		    (unsigned long long) acc);
	} else {
		out(m, "%s_sum %s\n%s_count %llu\n", name, s, name,
		    (unsigned long long) acc);
	}
}

static void render_descriptors(struct mbuf *m, struct kvb_broker *b)
{
	counter1(m, "kvbroker_descriptors_submitted",
		 "Descriptors workers submitted.", b->st.descriptors_submitted);
	counter1(m, "kvbroker_descriptors_completed",
		 "Descriptors completed (successfully or not).",
		 b->st.descriptors_completed);
	counter1(m, "kvbroker_descriptors_refused",
		 "Descriptors refused (bad region, range, quota, transfer).",
		 b->st.descriptors_refused);
	counter1(m, "kvbroker_bytes",
		 "Bytes moved by descriptors that completed successfully.",
		 b->st.bytes);
	counter1(m, "kvbroker_control_requests",
		 "Workers' requests on the control socket (stats not "
		 "counted).",
		 b->st.ctl_requests);
	counter1(m, "kvbroker_messages_rejected",
		 "Control, notify and handshake messages rejected as "
		 "malformed or not allowed.",
		 b->st.messages_rejected + kvb_hook_rejected(b));
}

static void render_transfers(struct mbuf *m, struct kvb_broker *b)
{
	static const char *le[KVB_MX_LAT_BUCKETS + 1];
	static char lebuf[KVB_MX_LAT_BUCKETS][24];
	struct kvb_metrics *mx = b->mx;

	counter1(m, "kvbroker_transfers_done", "Transfers that completed.",
		 b->st.transfers_done);
	family(m, "kvbroker_transfers_failed", COUNTER,
	       "Transfers that failed, by reason.");
	for (unsigned r = 0; r < KVB_MX_R_MAX; r++)
		out(m, "kvbroker_transfers_failed_total{reason=\"%s\"} %llu\n",
		    reason_names[r], (unsigned long long) mx->failed[r]);
	counter1(m, "kvbroker_transfers_fenced",
		 "Failed transfers whose completion waited for ops in flight.",
		 b->st.transfers_fenced);
	counter1(m, "kvbroker_late_writes_refused",
		 "Writes refused: their destination had ended the transfer.",
		 b->st.late_writes_refused);
	counter1(m, "kvbroker_unheld_reads_refused",
		 "Reads of a P worker's KV blocks no READ transfer held.",
		 b->st.unheld_reads_refused);
	counter1(
		m, "kvbroker_fences_expired",
		"Cross-node writers that did not confirm they stopped in time.",
		b->st.fences_expired);
	gauge1(m, "kvbroker_transfers_active", "Transfers in the table now.",
	       b->xfers.nactive);
	if (!le[0]) {
		for (unsigned i = 0; i < KVB_MX_LAT_BUCKETS; i++) {
			snprintf(lebuf[i], sizeof(lebuf[i]), "%g",
				 (double) kvb_mx_lat_bounds_ns[i] / 1e9);
			le[i] = lebuf[i];
		}
		le[KVB_MX_LAT_BUCKETS] = "+Inf";
	}
	family(m, "kvbroker_transfer_duration_seconds", HISTOGRAM,
	       "Transfer latency, open to completion, by outcome.");
	hist_samples(m, "kvbroker_transfer_duration_seconds",
		     "outcome=\"done\"", le, mx->lat[0], KVB_MX_LAT_BUCKETS + 1,
		     mx->lat_sum_ns[0], 9);
	hist_samples(m, "kvbroker_transfer_duration_seconds",
		     "outcome=\"failed\"", le, mx->lat[1],
		     KVB_MX_LAT_BUCKETS + 1, mx->lat_sum_ns[1], 9);
}

/* one labelled counter family over the transports that are open */
static void per_transport(struct mbuf *m, struct kvb_broker *b,
			  const char *name, const char *help, size_t off)
{
	family(m, name, COUNTER, help);
	for (unsigned i = 0; i < KVB_TS_MAX; i++)
		if (b->trs[i])
			out(m, "%s_total{transport=\"%s\"} %llu\n", name,
			    b->trs[i]->ops->name,
			    (unsigned long long) *(
				    const uint64_t *) ((const char *) &b->trs[i]
							       ->stats +
						       off));
}

static void render_transports(struct mbuf *m, struct kvb_broker *b)
{
	static const char *const le[KVB_WR_HIST_BUCKETS] = {
		"1",   "3",   "7",   "15",   "31",   "63",
		"127", "255", "511", "1023", "2047", "+Inf"};

	_Static_assert(KVB_WR_HIST_BUCKETS == 12, "le labels of wr_hist");
	per_transport(m, b, "kvbroker_doorbells", "Doorbells (chains posted).",
		      offsetof(struct kvb_transport_stats, doorbells));
	per_transport(m, b, "kvbroker_wrs", "Work requests (ops) posted.",
		      offsetof(struct kvb_transport_stats, wrs));
	per_transport(m, b, "kvbroker_transport_bytes",
		      "Bytes of the ops posted.",
		      offsetof(struct kvb_transport_stats, bytes));
	per_transport(m, b, "kvbroker_transport_completions",
		      "Op completions reaped.",
		      offsetof(struct kvb_transport_stats, cqes));
	per_transport(m, b, "kvbroker_credit_stalls",
		      "Posts that waited for send-queue or socket room.",
		      offsetof(struct kvb_transport_stats, credit_stalls));
	per_transport(m, b, "kvbroker_transport_errors", "Ops that failed.",
		      offsetof(struct kvb_transport_stats, errors));
	family(m, "kvbroker_wrs_per_doorbell", HISTOGRAM,
	       "Work requests per doorbell (chain length).");
	for (unsigned i = 0; i < KVB_TS_MAX; i++) {
		char lbl[48];

		if (!b->trs[i])
			continue;
		snprintf(lbl, sizeof(lbl), "transport=\"%s\"",
			 b->trs[i]->ops->name);
		hist_samples(m, "kvbroker_wrs_per_doorbell", lbl, le,
			     b->trs[i]->stats.wr_hist, KVB_WR_HIST_BUCKETS,
			     b->trs[i]->stats.wrs, 0);
	}
}

/* a NIC name as a label value: \, " and newlines escaped */
static void nic_label(char *dst, size_t cap, const char *s)
{
	size_t n = 0;

	for (; *s && n + 3 < cap; s++) {
		if (*s == '\\' || *s == '"') {
			dst[n++] = '\\';
			dst[n++] = *s;
		} else if (*s == '\n') {
			dst[n++] = '\\';
			dst[n++] = 'n';
		} else {
			dst[n++] = *s;
		}
	}
	dst[n] = '\0';
}

/* one family over the rdma transport's NICs */
static void per_nic(struct mbuf *m, const struct kvb_transport_nic *nic, int n,
		    const char (*lbl)[160], const char *name, enum mtype t,
		    const char *help, size_t off, int u32)
{
	family(m, name, t, help);
	for (int i = 0; i < n; i++) {
		const char *f = (const char *) &nic[i] + off;
		unsigned long long v =
			u32 ? *(const uint32_t *) f : *(const uint64_t *) f;

		out(m, "%s%s{nic=\"%s\"} %llu\n", name,
		    t == COUNTER ? "_total" : "", lbl[i], v);
	}
}

/* the rdma transport's NICs, when it tells them (ops->nics) */
static void render_nics(struct mbuf *m, struct kvb_broker *b)
{
	struct kvb_transport_nic nic[KVB_NIC_MAX];
	char lbl[KVB_NIC_MAX][160];
	int n = kvb_nics_get(b, nic, KVB_NIC_MAX);

	if (n <= 0)
		return;
	for (int i = 0; i < n; i++)
		nic_label(lbl[i], sizeof(lbl[i]), nic[i].name);
#define NIC_F(f) offsetof(struct kvb_transport_nic, f)
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_bytes", COUNTER,
		"Bytes of the chains posted through the NIC.", NIC_F(bytes), 0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_wrs", COUNTER,
		"Work requests posted through the NIC.", NIC_F(wrs), 0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_doorbells", COUNTER,
		"Doorbells (chains posted) through the NIC.", NIC_F(doorbells),
		0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_moved", COUNTER,
		"Chains sent through the NIC because their region's own NIC "
		"was down.",
		NIC_F(moved), 0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_qp_refused", COUNTER,
		"Connections refused by the NIC's QP budget (--max-qps).",
		NIC_F(qp_refused), 0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_qp_parked", COUNTER,
		"Its QPs that failed and were parked while their endpoint "
		"went on through other NICs.",
		NIC_F(qp_parked), 0);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_qps", GAUGE,
		"Queue pairs on the NIC now.", NIC_F(qps), 1);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_max_qps", GAUGE,
		"The NIC's QP budget (--max-qps, else the device's limit).",
		NIC_F(max_qps), 1);
	per_nic(m, nic, n, lbl, "kvbroker_rdma_nic_regions", GAUGE,
		"Regions whose nearest NIC it is.", NIC_F(regions), 0);
	family(m, "kvbroker_rdma_nic_up", GAUGE,
	       "1 while the NIC's port is active, 0 while it is down.");
	for (int i = 0; i < n; i++)
		out(m, "kvbroker_rdma_nic_up{nic=\"%s\"} %d\n", lbl[i],
		    nic[i].port_up ? 1 : 0);
#undef NIC_F
}

static void render_node(struct mbuf *m, struct kvb_broker *b)
{
	static const char *const ps[] = {"handshaking", "ready", "failed"};
	const struct {
		const char *reason;
		uint64_t v;
	} rf[] = {
		{"hello_timeout", b->st.hello_timeouts},
		{"pending_evicted", b->st.pending_evicted},
		{"hello_refused", b->st.hello_refused},
		{"duplicate_identity", b->st.duplicate_identity},
		{"ctl_empty", b->st.ctl_empty},
		{"mem_reg", b->st.mem_reg_refused},
		{"xfer_quota", b->st.xfer_quota_refused},
		{"xfer_table_full", b->st.xfer_table_full},
		{"undelivered", b->st.undelivered_refused},
		{"xfer_notify", b->st.xfer_notify_refused},
	};
	uint64_t np[3] = {0, 0, 0};
	struct kvb_peer_info pi;
	int rc;

	family(m, "kvbroker_refusals", COUNTER,
	       "Node-side protection: requests and connections refused, by "
	       "reason.");
	for (unsigned i = 0; i < sizeof(rf) / sizeof(rf[0]); i++)
		out(m, "kvbroker_refusals_total{reason=\"%s\"} %llu\n",
		    rf[i].reason, (unsigned long long) rf[i].v);
	counter1(m, "kvbroker_inflight_quota_stalls",
		 "Drains held back at a worker's in-flight share.",
		 b->st.inflight_quota_stalls);
	counter1(m, "kvbroker_workers_attached", "Workers that attached.",
		 b->st.workers_attached);
	counter1(m, "kvbroker_workers_lost",
		 "Workers that went away without detaching.",
		 b->st.workers_lost);
	counter1(m, "kvbroker_sleeps", "Times the broker loop slept.",
		 b->st.sleeps);
	counter1(m, "kvbroker_late_wakeups",
		 "Sleeps that ran through a waiting submission (lost wakeups).",
		 b->st.late_wakeups);
	gauge1(m, "kvbroker_workers", "Workers attached now.", b->nlive);
	gauge1(m, "kvbroker_connections_pending",
	       "Connections that have not said HELLO yet.", b->npending);
	gauge1(m, "kvbroker_inflight_ops",
	       "Descriptors between drain and completion.",
	       KVB_INFLIGHT_MAX - 1 - b->inf_nfree);
	gauge1(m, "kvbroker_regions", "Memory regions registered.",
	       b->regions.live);
	for (uint32_t i = 1; (rc = kvb_hook_peer_info(b, i, &pi)) != -ERANGE;
	     i++)
		for (unsigned k = 0; !rc && k < 3; k++)
			np[k] += !strcmp(pi.state, ps[k]);
	family(m, "kvbroker_peers", GAUGE, "Cross-node peers, by state.");
	for (unsigned k = 0; k < 3; k++)
		out(m, "kvbroker_peers{state=\"%s\"} %llu\n", ps[k],
		    (unsigned long long) np[k]);
}

/* per-worker families: one sample per attached worker */
#define WLBL	 "role=\"%s\",dp=\"%u\",tp=\"%u\""
#define WARGS(w) (w)->role == KVB_ROLE_P ? "P" : "D", (w)->dp_rank, (w)->tp_rank
#define EACH_W(b, w)          \
	for (uint32_t i_ = 0; \
	     i_ < (b)->nlive && ((w) = &(b)->workers[(b)->live[i_]], 1); i_++)

static const struct kvb_mx_worker *wk_of(struct kvb_broker *b,
					 const struct kvb_worker *w)
{
	static const struct kvb_mx_worker none;
	const struct kvb_mx_worker *k = &b->mx->wk[KVB_WSLOT(w->id)];

	return k->id == w->id ? k : &none;
}

static void render_workers(struct mbuf *m, struct kvb_broker *b)
{
	const struct {
		const char *name, *help;
		size_t off;
	} c[] = {
		{"kvbroker_worker_descriptors_submitted",
		 "Descriptors this worker submitted.",
		 offsetof(struct kvb_worker_stats, submitted)},
		{"kvbroker_worker_descriptors_completed",
		 "Descriptors of this worker completed.",
		 offsetof(struct kvb_worker_stats, completed)},
		{"kvbroker_worker_descriptors_refused",
		 "Descriptors of this worker refused.",
		 offsetof(struct kvb_worker_stats, refused)},
		{"kvbroker_worker_bytes",
		 "Bytes this worker's descriptors moved.",
		 offsetof(struct kvb_worker_stats, bytes)},
	};
	struct kvb_worker *w;

	for (unsigned k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
		family(m, c[k].name, COUNTER, c[k].help);
		EACH_W(b, w)
		out(m, "%s_total{" WLBL "} %llu\n", c[k].name, WARGS(w),
		    (unsigned long long) *(
			    const uint64_t *) ((const char *) &w->st +
					       c[k].off));
	}
	family(m, "kvbroker_worker_transfers_done", COUNTER,
	       "Transfers of this worker that completed.");
	EACH_W(b, w)
	out(m, "kvbroker_worker_transfers_done_total{" WLBL "} %llu\n",
	    WARGS(w), (unsigned long long) wk_of(b, w)->done);
	family(m, "kvbroker_worker_transfers_failed", COUNTER,
	       "Transfers of this worker that failed, by reason.");
	EACH_W(b, w)
	for (unsigned r = 0; r < KVB_MX_R_MAX; r++)
		out(m,
		    "kvbroker_worker_transfers_failed_total{" WLBL
		    ",reason=\"%s\"} %llu\n",
		    WARGS(w), reason_names[r],
		    (unsigned long long) wk_of(b, w)->failed[r]);
	family(m, "kvbroker_worker_transfers_active", GAUGE,
	       "Transfer table entries in this worker's share now.");
	EACH_W(b, w)
	out(m, "kvbroker_worker_transfers_active{" WLBL "} %u\n", WARGS(w),
	    kvb_xfers_charged(&b->xfers, w->id));
	family(m, "kvbroker_worker_inflight_ops", GAUGE,
	       "This worker's descriptors between drain and completion.");
	EACH_W(b, w)
	out(m, "kvbroker_worker_inflight_ops{" WLBL "} %u\n", WARGS(w),
	    w->inf_used);
	family(m, "kvbroker_worker_ring_fill", GAUGE,
	       "Descriptors waiting in this worker's submission ring.");
	EACH_W(b, w)
	out(m, "kvbroker_worker_ring_fill{" WLBL "} %u\n", WARGS(w),
	    kvb_ring_count(&w->seg.sq));
	family(m, "kvbroker_worker_undelivered", GAUGE,
	       "Completions waiting for room in this worker's ring.");
	EACH_W(b, w)
	out(m, "kvbroker_worker_undelivered{" WLBL "} %u\n", WARGS(w),
	    w->ovf_len);
}

static void render_self(struct mbuf *m, struct kvb_broker *b)
{
	struct kvb_metrics *mx = b->mx;

	if (m->om)
		out(m, "# HELP kvbroker_build This broker's version.\n"
		       "# TYPE kvbroker_build info\n");
	else
		out(m, "# HELP kvbroker_build_info This broker's version.\n"
		       "# TYPE kvbroker_build_info gauge\n");
	out(m, "kvbroker_build_info{version=\"%s\",protocol=\"%u\"} 1\n",
	    KVB_VERSION_STRING, KVB_PROTO_VERSION);
	family(m, "kvbroker_metrics_scrapes", COUNTER,
	       "Scrapes of this endpoint answered, by format.");
	out(m,
	    "kvbroker_metrics_scrapes_total{format=\"text\"} %llu\n"
	    "kvbroker_metrics_scrapes_total{format=\"openmetrics\"} %llu\n",
	    (unsigned long long) mx->scrapes[0],
	    (unsigned long long) mx->scrapes[1]);
	family(m, "kvbroker_metrics_render_seconds", COUNTER,
	       "Time the broker loop spent rendering scrapes (before this "
	       "one).");
	out(m, "kvbroker_metrics_render_seconds_total %llu.%09llu\n",
	    (unsigned long long) (mx->render_ns / 1000000000),
	    (unsigned long long) (mx->render_ns % 1000000000));
	family(m, "kvbroker_metrics_refused", COUNTER,
	       "Requests to this endpoint refused, by reason.");
	for (unsigned r = 0; r < KVB_MX_REF_MAX; r++)
		out(m, "kvbroker_metrics_refused_total{reason=\"%s\"} %llu\n",
		    kvb_mx_refusal_names[r],
		    (unsigned long long) mx->refused[r]);
	gauge1(m, "kvbroker_metrics_connections",
	       "Connections to this endpoint open now.", mx->nconns);
}

int kvb_metrics_render(struct kvb_broker *b, int openmetrics, char **outp,
		       size_t *len)
{
	struct mbuf m = {.cap = 16384 + (size_t) b->nlive * 4096,
			 .om = openmetrics};

	m.p = malloc(m.cap);
	if (!m.p)
		return -ENOMEM;
	render_descriptors(&m, b);
	render_transfers(&m, b);
	render_transports(&m, b);
	render_nics(&m, b);
	render_node(&m, b);
	render_workers(&m, b);
	render_self(&m, b);
	if (openmetrics)
		out(&m, "# EOF\n");
	if (m.err) {
		free(m.p);
		return m.err;
	}
	*outp = m.p;
	*len = m.len;
	return 0;
}

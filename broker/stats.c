/* SPDX-License-Identifier: MIT */
/* `kvbctl stats`: the broker's counters as a table or as JSON. */
#include "broker.h"
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/*
 * Room a per-worker row needs, with what follows it: rows that would not
 * fit in the reply (KVB_MSG_MAX) are counted (per_worker_omitted), not cut,
 * so the JSON stays whole however many workers there are.
 */
#define ROW_ROOM 512u

struct out {
	char *buf;
	size_t cap, len;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o,
						      const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvb_transport_vput(o->buf, o->cap, &o->len, fmt, ap);
	va_end(ap);
}

/* GPU copy counters (copies, batches, bytes, streams busy), if open: the
 * gpu transport's stats_format */
static void gpu_stats(struct kvb_broker *b, struct out *o, int json)
{
	struct kvb_transport *t = b->trs[KVB_TS_GPU];
	size_t n = 0;

	if (t && t->ops->stats_format && o->len < o->cap)
		n = t->ops->stats_format(t, NULL, json, o->buf + o->len,
					 o->cap - o->len);
	if (n) {
		o->len += n;
		return;
	}
	if (json)
		put(o, "\"gpu\":null,");
}

/* Node-side protection counters (docs/security.md, "On the node") */
static void guard_stats(struct kvb_broker *b, struct out *o, int json)
{
	const struct {
		const char *name;
		uint64_t v;
	} c[] = {
		{"connections_pending", b->npending},
		{"hello_timeouts", b->st.hello_timeouts},
		{"pending_evicted", b->st.pending_evicted},
		{"hello_refused", b->st.hello_refused},
		{"duplicate_identity", b->st.duplicate_identity},
		{"ctl_empty_messages", b->st.ctl_empty},
		{"mem_reg_refused", b->st.mem_reg_refused},
		{"xfer_quota_refused", b->st.xfer_quota_refused},
		{"xfer_table_full", b->st.xfer_table_full},
		{"inflight_quota_stalls", b->st.inflight_quota_stalls},
		{"undelivered_refused", b->st.undelivered_refused},
		{"xfer_notify_refused", b->st.xfer_notify_refused},
	};

	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		if (json)
			put(o, "\"%s\":%llu,", c[i].name,
			    (unsigned long long) c[i].v);
		else
			put(o, "%-22s %llu\n", c[i].name,
			    (unsigned long long) c[i].v);
}

static const char *hist_label(unsigned i, char *buf, size_t len)
{
	if (i == 0)
		snprintf(buf, len, "1");
	else if (i == KVB_WR_HIST_BUCKETS - 1)
		snprintf(buf, len, ">=%u", 1u << i);
	else
		snprintf(buf, len, "%u-%u", 1u << i, (2u << i) - 1);
	return buf;
}

static uint32_t late_wakes(const struct kvb_worker *w)
{
	return atomic_load_explicit(&w->seg.hdr->worker_late_wakes,
				    memory_order_relaxed);
}

/* What the rows of both formats sum up. */
struct totals {
	struct kvb_transport_stats t; /* all transports' */
	char names[64];		      /* "tcp+rdma" */
	uint32_t nw;		      /* attached workers */
	uint64_t wlate;		      /* workers' late wakeups */
	double wpd;		      /* WRs per doorbell */
};

static void totals(struct kvb_broker *b, struct totals *s)
{
	memset(s, 0, sizeof(*s));
	s->wlate = b->st.worker_late_wakes_gone;
	for (unsigned i = 0; i < b->opt.max_workers; i++)
		if (b->workers[i].attached) {
			s->nw++;
			s->wlate += late_wakes(&b->workers[i]);
		}
	for (unsigned i = 0; i < KVB_TS_MAX; i++) {
		const struct kvb_transport_stats *x;

		if (!b->trs[i])
			continue;
		x = &b->trs[i]->stats;
		snprintf(s->names + strlen(s->names),
			 sizeof(s->names) - strlen(s->names), "%s%s",
			 s->names[0] ? "+" : "", b->trs[i]->ops->name);
		s->t.doorbells += x->doorbells;
		s->t.wrs += x->wrs;
		s->t.bytes += x->bytes;
		s->t.cqes += x->cqes;
		s->t.credit_stalls += x->credit_stalls;
		s->t.errors += x->errors;
		for (unsigned k = 0; k < KVB_WR_HIST_BUCKETS; k++)
			s->t.wr_hist[k] += x->wr_hist[k];
	}
	s->wpd = s->t.doorbells ? (double) s->t.wrs / (double) s->t.doorbells
				: 0;
}

/* The per-worker rows as JSON objects; returns how many did not fit. */
static unsigned json_workers(struct kvb_broker *b, struct out *o)
{
	unsigned i, nw = 0, omitted = 0;

	for (i = 0, nw = 0; i < b->opt.max_workers; i++) {
		const struct kvb_worker *w = &b->workers[i];

		if (!w->attached)
			continue;
		if (o->cap - o->len < ROW_ROOM) {
			omitted++; /* the reply is full: keep it JSON */
			continue;
		}
		put(o,
		    "%s{\"id\":%u,\"pid\":%d,\"role\":\"%s\",\"dp_"
		    "rank\":%u,"
		    "\"tp_rank\":%u,\"tp_size\":%u,\"submitted\":%llu,"
		    "\"completed\":%llu,\"refused\":%llu,\"bytes\":%"
		    "llu,\"late_wakes\":%u,\"wait_sleeps\":%llu,"
		    "\"wait_spin_us\":%llu,\"transfers\":%u,"
		    "\"inflight\":%u,\"undelivered\":%u}",
		    nw++ ? "," : "", w->id, (int) w->pid,
		    w->role == 1 ? "P" : "D", w->dp_rank, w->tp_rank,
		    w->tp_size, (unsigned long long) w->st.submitted,
		    (unsigned long long) w->st.completed,
		    (unsigned long long) w->st.refused,
		    (unsigned long long) w->st.bytes, late_wakes(w),
		    (unsigned long long) atomic_load_explicit(
			    &w->seg.hdr->worker_sleeps, memory_order_relaxed),
		    (unsigned long long) atomic_load_explicit(
			    &w->seg.hdr->worker_spin_ns, memory_order_relaxed) /
			    1000,
		    kvb_xfers_charged(&b->xfers, w->id), w->inf_used,
		    w->ovf_len);
	}
	return omitted;
}

static void format_json(struct kvb_broker *b, struct out *o,
			const struct totals *s)
{
	char lbl[32];
	unsigned i, nw, omitted;

	put(o, "{\"transport\":\"%s\",\"workers\":%u,", s->names, s->nw);
	put(o,
	    "\"descriptors_submitted\":%llu,\"descriptors_completed\":%"
	    "llu,"
	    "\"descriptors_refused\":%llu,\"bytes\":%llu,",
	    (unsigned long long) b->st.descriptors_submitted,
	    (unsigned long long) b->st.descriptors_completed,
	    (unsigned long long) b->st.descriptors_refused,
	    (unsigned long long) b->st.bytes);
	put(o,
	    "\"doorbells\":%llu,\"wrs\":%llu,\"cqes\":%llu,"
	    "\"credit_stalls\":%llu,\"wr_per_doorbell\":{\"mean\":%.3f,"
	    "\"histogram\":{",
	    (unsigned long long) s->t.doorbells, (unsigned long long) s->t.wrs,
	    (unsigned long long) s->t.cqes,
	    (unsigned long long) s->t.credit_stalls, s->wpd);
	for (i = 0; i < KVB_WR_HIST_BUCKETS; i++)
		put(o, "%s\"%s\":%llu", i ? "," : "",
		    hist_label(i, lbl, sizeof(lbl)),
		    (unsigned long long) s->t.wr_hist[i]);
	put(o,
	    "}},\"transfers_done\":%llu,\"transfers_failed\":%llu,"
	    "\"transfers_active\":%u,\"transfers_fenced\":%llu,"
	    "\"late_writes_refused\":%llu,\"unheld_reads_refused\":%llu,"
	    "\"fences_expired\":%llu,"
	    "\"messages_rejected\":%llu,"
	    "\"control_requests\":%llu,"
	    "\"workers_lost\":%llu,\"late_wakeups\":%llu,"
	    "\"worker_late_wakeups\":%llu,\"regions\":%u,"
	    "\"per_transport\":[",
	    (unsigned long long) b->st.transfers_done,
	    (unsigned long long) b->st.transfers_failed, b->xfers.nactive,
	    (unsigned long long) b->st.transfers_fenced,
	    (unsigned long long) b->st.late_writes_refused,
	    (unsigned long long) b->st.unheld_reads_refused,
	    (unsigned long long) b->st.fences_expired,
	    (unsigned long long) (b->st.messages_rejected +
				  kvb_hook_rejected(b)),
	    (unsigned long long) b->st.ctl_requests,
	    (unsigned long long) b->st.workers_lost,
	    (unsigned long long) b->st.late_wakeups,
	    (unsigned long long) s->wlate, b->regions.live);
	for (i = 0, nw = 0; i < KVB_TS_MAX; i++) {
		const struct kvb_transport_stats *x;

		if (!b->trs[i])
			continue;
		x = &b->trs[i]->stats;
		put(o,
		    "%s{\"name\":\"%s\",\"doorbells\":%llu,\"wrs\":%"
		    "llu,"
		    "\"bytes\":%llu,\"cqes\":%llu,\"errors\":%llu,"
		    "\"post_ns\":%llu,\"post_cpu_ns\":%llu,"
		    "\"post_cpu_wrs\":%llu}",
		    nw++ ? "," : "", b->trs[i]->ops->name,
		    (unsigned long long) x->doorbells,
		    (unsigned long long) x->wrs, (unsigned long long) x->bytes,
		    (unsigned long long) x->cqes,
		    (unsigned long long) x->errors,
		    (unsigned long long) x->post_ns,
		    (unsigned long long) x->post_cpu_ns,
		    (unsigned long long) x->post_cpu_wrs);
	}
	put(o, "],");
	kvb_nics_put(b, 1, o->buf, o->cap, &o->len);
	put(o, ",");
	gpu_stats(b, o, 1);
	o->len += kvb_hook_stats(b, 1, o->buf + o->len, o->cap - o->len);
	guard_stats(b, o, 1);
	put(o, "\"per_worker\":[");
	omitted = json_workers(b, o);
	put(o, "],\"per_worker_omitted\":%u}\n", omitted);
}

/* The per-worker table. */
static void text_workers(struct kvb_broker *b, struct out *o)
{
	unsigned i, omitted = 0;

	put(o, "%-8s %-7s %-4s %-3s %-5s %12s %12s %9s %14s\n", "worker", "pid",
	    "role", "dp", "tp", "submitted", "completed", "refused", "bytes");
	for (i = 0; i < b->opt.max_workers; i++) {
		const struct kvb_worker *w = &b->workers[i];

		if (!w->attached)
			continue;
		if (o->cap - o->len < ROW_ROOM) {
			omitted++;
			continue;
		}
		put(o,
		    "%-8u %-7d %-4s %-3u %u/%-3u %12llu %12llu %9llu %14llu\n",
		    w->id, (int) w->pid, w->role == 1 ? "P" : "D", w->dp_rank,
		    w->tp_rank, w->tp_size,
		    (unsigned long long) w->st.submitted,
		    (unsigned long long) w->st.completed,
		    (unsigned long long) w->st.refused,
		    (unsigned long long) w->st.bytes);
	}
	if (omitted)
		put(o, "(%u more workers: the reply is full)\n", omitted);
}

static void format_text(struct kvb_broker *b, struct out *o,
			const struct totals *s)
{
	char lbl[32];
	unsigned i;

	put(o, "transport              %s\n", s->names);
	put(o, "workers                %u\n", s->nw);
	put(o, "descriptors_submitted  %llu\n",
	    (unsigned long long) b->st.descriptors_submitted);
	put(o, "descriptors_completed  %llu\n",
	    (unsigned long long) b->st.descriptors_completed);
	put(o, "descriptors_refused    %llu\n",
	    (unsigned long long) b->st.descriptors_refused);
	put(o, "bytes                  %llu\n",
	    (unsigned long long) b->st.bytes);
	put(o, "doorbells              %llu\n",
	    (unsigned long long) s->t.doorbells);
	put(o, "wrs                    %llu\n", (unsigned long long) s->t.wrs);
	put(o, "wr_per_doorbell        %.2f\n", s->wpd);
	put(o, "credit_stalls          %llu\n",
	    (unsigned long long) s->t.credit_stalls);
	put(o, "transfers_done         %llu\n",
	    (unsigned long long) b->st.transfers_done);
	put(o, "transfers_failed       %llu\n",
	    (unsigned long long) b->st.transfers_failed);
	put(o, "transfers_active       %u\n", b->xfers.nactive);
	put(o, "transfers_fenced       %llu\n",
	    (unsigned long long) b->st.transfers_fenced);
	put(o, "late_writes_refused    %llu\n",
	    (unsigned long long) b->st.late_writes_refused);
	put(o, "fences_expired         %llu\n",
	    (unsigned long long) b->st.fences_expired);
	put(o, "messages_rejected      %llu\n",
	    (unsigned long long) (b->st.messages_rejected +
				  kvb_hook_rejected(b)));
	put(o, "control_requests       %llu\n",
	    (unsigned long long) b->st.ctl_requests);
	put(o, "workers_lost           %llu\n",
	    (unsigned long long) b->st.workers_lost);
	put(o, "late_wakeups           %llu (broker), %llu (workers)\n",
	    (unsigned long long) b->st.late_wakeups,
	    (unsigned long long) s->wlate);
	guard_stats(b, o, 0);
	gpu_stats(b, o, 0);
	o->len += kvb_hook_stats(b, 0, o->buf + o->len, o->cap - o->len);
	put(o, "wr_per_doorbell histogram:\n");
	for (i = 0; i < KVB_WR_HIST_BUCKETS; i++)
		if (s->t.wr_hist[i])
			put(o, "  %-10s %llu\n",
			    hist_label(i, lbl, sizeof(lbl)),
			    (unsigned long long) s->t.wr_hist[i]);
	kvb_nics_put(b, 0, o->buf, o->cap, &o->len);
	text_workers(b, o);
}

size_t kvb_stats_format(struct kvb_broker *b, int json, char *buf, size_t cap)
{
	struct out o = {.buf = buf, .cap = cap};
	struct totals s;

	totals(b, &s);
	if (json)
		format_json(b, &o, &s);
	else
		format_text(b, &o, &s);
	return o.len;
}

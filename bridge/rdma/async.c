// SPDX-License-Identifier: MIT
/*
 * The device's asynchronous events (ibv_get_async_event): port down and up,
 * a QP or the CQ in error, the device lost. The context's async fd is made
 * non-blocking at open(); the caller polls it (kvb_rdma_async_fd) and calls
 * kvb_rdma_async_service() when it turns readable.
 *
 * What they change: while a NIC's port is down (PORT_ERR until
 * PORT_ACTIVE), and for good after DEVICE_FATAL, it takes no new chains:
 * those of its regions go through the next nearest NIC up (rdma.c), and
 * with none up post() refuses them with -ENETDOWN / -ENODEV at once
 * instead of leaving them to the retry timer. Ops already
 * posted end by their own work completions, as before. QP and CQ errors
 * are logged and counted; a QP's error reaches its ops as work completions
 * (flushes), which reset its endpoint, or over several NICs park that QP
 * alone (ep.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rdma/rdma_priv.h"

static void say(kvb_rdma_log_fn log, void *arg, int level, const char *fmt, ...)
{
	char line[256];
	va_list ap;

	if (!log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log(arg, level, line);
}

/* Our QP number of an event's QP, or 0 when it is not one of ours. */
static uint32_t our_qpn(const struct kvb_rdma *r, const struct ibv_qp *qp)
{
	for (unsigned i = 0; qp && i < KVB_RDMA_MAX_SLOTS; i++)
		if (r->slots[i] && r->slots[i]->qp == qp)
			return qp->qp_num;
	return 0;
}

static void handle(struct kvb_rdma *r, struct kvb_rdma_nic *n,
		   const struct ibv_async_event *ev, kvb_rdma_log_fn log,
		   void *arg)
{
	struct kvb_rdma_async_stats *s = &n->async;
	const char *name = ibv_event_type_str(ev->event_type);
	uint32_t qpn;

	s->events++;
	switch (ev->event_type) {
	case IBV_EVENT_PORT_ERR:
		if (ev->element.port_num != n->port_num)
			break;
		s->port_errors++;
		if (!s->port_down && r->nnic > 1)
			say(log, arg, KVB_RDMA_LOG_WARN,
			    "rdma: %s port %d down (%s): its regions' new "
			    "chains go through the next nearest NIC up",
			    n->name, n->port_num, name);
		else if (!s->port_down)
			say(log, arg, KVB_RDMA_LOG_WARN,
			    "rdma: port %d down (%s): new chains fail with "
			    "-ENETDOWN until it is active again",
			    n->port_num, name);
		s->port_down = 1;
		break;
	case IBV_EVENT_PORT_ACTIVE:
		if (ev->element.port_num != n->port_num)
			break;
		s->port_active++;
		if (s->port_down && r->nnic > 1)
			say(log, arg, KVB_RDMA_LOG_INFO,
			    "rdma: %s port %d active again", n->name,
			    n->port_num);
		else if (s->port_down)
			say(log, arg, KVB_RDMA_LOG_INFO,
			    "rdma: port %d active again", n->port_num);
		s->port_down = 0;
		r->reconnect_due = 1; /* its parked QPs, once idle */
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
		s->qp_errors++;
		qpn = our_qpn(r, ev->element.qp);
		say(log, arg, KVB_RDMA_LOG_WARN,
		    "rdma: QP %u: %s (its ops complete with errors; the "
		    "endpoint resets, or parks the QP if another NIC pair "
		    "works)",
		    qpn, name);
		break;
	case IBV_EVENT_CQ_ERR:
		s->cq_errors++;
		say(log, arg, KVB_RDMA_LOG_ERR,
		    "rdma: %s: completions may be lost; their transfers "
		    "end at their timeouts",
		    name);
		break;
	case IBV_EVENT_DEVICE_FATAL:
		s->device_fatal++;
		s->device_dead = 1;
		if (r->nnic > 1)
			say(log, arg, KVB_RDMA_LOG_ERR,
			    "rdma: %s: %s: it takes no new chains (with no "
			    "other NIC up they fail with -ENODEV); restart the "
			    "broker once the device is back",
			    n->name, name);
		else
			say(log, arg, KVB_RDMA_LOG_ERR,
			    "rdma: %s: new chains fail with -ENODEV; restart "
			    "the broker once the device is back",
			    name);
		break;
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
	case IBV_EVENT_PATH_MIG:
		break; /* about a QP's normal life: counted only */
	default:
		say(log, arg, KVB_RDMA_LOG_INFO, "rdma: device event: %s",
		    name);
		break;
	}
}

int kvb_rdma_async_fd(struct kvb_transport *t)
{
	struct kvb_rdma *r = to_rdma(t);

	if (r->nnic > 1)
		return r->async_epfd;
	return r->nics[0].async_nb ? r->nics[0].ctx->async_fd : -1;
}

int kvb_rdma_async_service(struct kvb_transport *t, kvb_rdma_log_fn log,
			   void *arg)
{
	struct kvb_rdma *r = to_rdma(t);
	struct ibv_async_event ev;
	int n = 0;

	if (log && !r->log)
		kvb_rdma_set_log(t, log, arg);
	/* bounded: a device flooding events does not hold the loop */
	for (unsigned i = 0; i < r->nnic; i++) {
		struct kvb_rdma_nic *nic = &r->nics[i];

		if (!nic->async_nb)
			continue; /* a blocking fd: never read it from the loop
				   */
		while (n < 64 && ibv_get_async_event(nic->ctx, &ev) == 0) {
			handle(r, nic, &ev, log, arg);
			ibv_ack_async_event(&ev);
			n++;
		}
	}
	return n;
}

void kvb_rdma_async_get_stats(struct kvb_transport *t,
			      struct kvb_rdma_async_stats *out)
{
	struct kvb_rdma *r = to_rdma(t);
	unsigned i, down = 0, dead = 0;

	memset(out, 0, sizeof(*out));
	for (i = 0; i < r->nnic; i++) {
		const struct kvb_rdma_async_stats *s = &r->nics[i].async;

		out->events += s->events;
		out->port_errors += s->port_errors;
		out->port_active += s->port_active;
		out->qp_errors += s->qp_errors;
		out->cq_errors += s->cq_errors;
		out->device_fatal += s->device_fatal;
		down += s->port_down || s->device_dead;
		dead += s->device_dead;
	}
	out->port_down = r->nnic && down == r->nnic;
	out->device_dead = r->nnic && dead == r->nnic;
}

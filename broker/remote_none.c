/* SPDX-License-Identifier: MIT */
/*
 * The broker without its cross-node layer, for builds where libzmq and
 * msgpack-c are missing (scripts/device-check.sh builds the broker with
 * plain gcc on a GPU machine that has neither). It links in place of
 * remote*.c and behaves as the full broker does when started without
 * --host-ip (b->rm == NULL there), with two differences: --host-ip itself
 * is refused at start-up, and so is a worker's KV-layout registration
 * (kvb_mem_set_kv), which only cross-node layer ops use. This broker
 * serves same-node transfers only.
 */
#include <errno.h>

#include "broker.h"
#include "log.h"
#include "metrics.h"

int kvb_remote_init(struct kvb_broker *b)
{
	if (!b->opt.cross_node)
		return 0;
	log_err("--host-ip: this kvbroker was built without the cross-node "
		"layer (no libzmq/msgpack-c at build time); same-node "
		"transfers only");
	return -ENOTSUP;
}

void kvb_remote_fini(struct kvb_broker *b)
{
}

void kvb_remote_service(struct kvb_broker *b)
{
}

void kvb_remote_rdma_events(struct kvb_broker *b)
{
}

void kvb_remote_retry_starved(struct kvb_broker *b)
{
}

void kvb_remote_timers(struct kvb_broker *b, int64_t now)
{
}

int kvb_remote_worker_attached(struct kvb_broker *b, struct kvb_worker *w)
{
	return 0;
}

void kvb_remote_worker_gone(struct kvb_broker *b, struct kvb_worker *w)
{
}

/* The control requests of cross-node transfers: refused (-ENOTCONN, as
 * peer and transfer requests are by a broker started without --host-ip). */
int kvb_remote_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_mem_kv *m)
{
	return -ENOTCONN;
}

int kvb_remote_peer_req(struct kvb_broker *b, struct kvb_worker *w,
			const struct kvb_msg_peer *m)
{
	return -ENOTCONN;
}

int kvb_remote_xopen(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_msg_xopen *m, uint32_t len,
		     uint32_t *handle)
{
	return -ENOTCONN;
}

/* No transfer here is cross-node: refused as the full broker refuses a
 * layer op on a same-node transfer. */
void kvb_remote_layer(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_sqe *e)
{
	kvb_layer_refuse(b, w, e, -EINVAL,
			 "layer op for an unknown or local transfer");
}

void kvb_remote_xfer_end(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
}

void kvb_remote_xfer_fence(struct kvb_broker *b, struct kvb_xfer *x, int status)
{
	(void) b;
	(void) x;
	(void) status;
}

uint32_t kvb_remote_xfer_writers(struct kvb_broker *b, const struct kvb_xfer *x)
{
	(void) b;
	(void) x;
	return 0;
}

int kvb_remote_xfer_deferred(const struct kvb_xfer *x)
{
	(void) x;
	return 0;
}

int kvb_remote_set_defer(struct kvb_xfer *x, uint32_t defer_ms)
{
	(void) x;
	(void) defer_ms;
	return -EINVAL;
}

int kvb_remote_xfer_complete(const struct kvb_xfer *x)
{
	return kvb_xfer_complete(x);
}

void kvb_remote_group_done(struct kvb_broker *b, uint32_t group, int status,
			   uint64_t bytes)
{
}

void kvb_remote_reg(struct kvb_broker *b, struct kvb_region_ent *r)
{
}

void kvb_remote_dereg(struct kvb_broker *b, struct kvb_region_ent *r)
{
}

uint64_t kvb_remote_rejected(struct kvb_broker *b)
{
	return 0;
}

size_t kvb_remote_stats(struct kvb_broker *b, int json, char *buf, size_t cap)
{
	return 0;
}

int kvb_remote_peer_info(struct kvb_broker *b, uint32_t i,
			 struct kvb_peer_info *pi)
{
	return -ERANGE;
}

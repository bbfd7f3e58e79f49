/* SPDX-License-Identifier: MIT */
/*
 * Cross-node: a region's keys on each of a multi-NIC rdma transport's NICs
 * (transport.h ops->mr_keys, kvb_remote.rkeys): into this node's engine
 * descriptor, from a peer's descriptor into the ops addressed to it, and the
 * region's NIC in the log; and which op errors leave a peer usable because
 * the transport parked a failed queue pair alone. A transport without
 * mr_keys (tcp, rdma on one NIC) leaves everything as the single rkey. One
 * broker thread owns all of it.
 */
#ifndef KVB_BRIDGE_XNODE_NIC_H
#define KVB_BRIDGE_XNODE_NIC_H

#include <stdint.h>

#include "transport.h"
#include "zmq/handshake.h"

struct kvb_broker;
struct kvb_region_ent;

/*
 * Fill hr's rkeys/nrkeys/nic (and rkey: the key on that NIC) from t's
 * mr_keys() for the registered region mr. Leaves hr as it is when t is
 * NULL, has no mr_keys, or has one key (a descriptor an old peer reads
 * the same way). Returns the number of keys written into hr (0: none).
 */
unsigned kvb_xn_region_keys(struct kvb_transport *t, const struct kvb_mr *mr,
			    struct kvb_hs_region *hr);

/* Point an op's remote side at the peer region hr's keys (none: rkey). */
void kvb_xn_remote_keys(struct kvb_remote *rem, const struct kvb_hs_region *hr);

/*
 * A peer's descriptor was replaced in place (same instance, regions grown):
 * the ops still queued to it point their rkeys into the old one. Re-point
 * them at the same region (id and address) in d, or at none (rkey alone)
 * when d lacks it. dslot: the peer's destination slot.
 */
void kvb_xn_rekey_queued(struct kvb_broker *b, uint32_t dslot,
			 const struct kvb_hs_desc *d);

/*
 * Did an op fail on a queue pair that transport t parked alone? Its retry
 * or flush error (-ETIMEDOUT, -ECANCELED), t with several NICs, and t's
 * endpoint ep to the peer still READY: the endpoint goes on through its
 * other NIC pairs, where the same peer instance answers, so the error does
 * not make the peer stale (nothing queued to it fails, no new handshake).
 * The status alone cannot tell a flush from an op the engine cancelled for
 * a failing transfer (-ECANCELED too): with several NICs and the endpoint
 * READY, that one leaves the peer as it is as well.
 * 1 yes, 0 no (also for a NULL t or ep, or a t without ep_state or nics).
 */
int kvb_xn_parked_error(struct kvb_transport *t, struct kvb_ep *ep, int status);

/* One info line (rate-limited) naming the NIC a region registered with the
 * multi-NIC transport t goes through, and why. */
void kvb_xn_log_region_nic(struct kvb_transport *t,
			   const struct kvb_region_ent *r);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * The cross-node module: it extends the broker's engine (broker/broker.h)
 * with transfers between brokers on different nodes (ZMQ handshake and
 * MoRIIO notify messages, data over the tcp or rdma transport). It owns its
 * state and sockets and reaches the engine through its API and hooks.
 */
#ifndef KVB_BRIDGE_XNODE_XNODE_H
#define KVB_BRIDGE_XNODE_XNODE_H

struct kvb_broker;

/*
 * Register the module's hooks with the engine and, with --host-ip, open its
 * transports, ZMQ context and handshake port. 0 or -errno (the daemon then
 * tears down: the fini hook undoes what was done).
 */
int kvb_xn_init(struct kvb_broker *b);

#endif

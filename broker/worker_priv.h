/* SPDX-License-Identifier: MIT */
/* The broker's worker control requests, shared by worker.c (accept, HELLO,
 * the dispatch table, teardown) and the handlers in other files
 * (ctl_mem.c). One broker thread: no locking. */
#ifndef KVB_BROKER_WORKER_PRIV_H
#define KVB_BROKER_WORKER_PRIV_H

#include "broker.h"

/* A control request, as received: the message (static: one broker thread;
 * XOPEN carries block lists), its length, the fds it carried (MEM_REG). */
union ctl_msg {
	struct kvb_msg_hdr h;
	struct kvb_msg_hello hello;
	struct kvb_msg_mem_reg reg;
	struct kvb_msg_mem_dereg dereg;
	struct kvb_msg_mem_lookup lookup;
	struct kvb_msg_open open;
	struct kvb_msg_stats stats;
	struct kvb_msg_mem_kv kv;
	struct kvb_msg_peer peer;
	struct kvb_msg_xopen xopen;
	struct kvb_msg_open_batch open_batch;
	struct kvb_msg_xtimeouts xt;
	struct kvb_msg_xopen_batch xopen_batch;
	struct kvb_msg_mem_alias alias;
	struct kvb_msg_xexpect xexpect;
	char raw[KVB_MSG_MAX];
};

struct ctl_req {
	union ctl_msg *m;
	size_t n;
	int *fds;
	unsigned nfds;
};

/* The answer to the request being handled (it echoes its seq). */
void kvb_ctl_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		   int status, const int *fds, unsigned nfds);
/* A malformed request: counted, and the worker dropped. */
void kvb_ctl_reject(struct kvb_broker *b, struct kvb_worker *w,
		    const char *why);

/* ctl_mem.c: MEM_REG, MEM_DEREG, MEM_LOOKUP, MEM_ALIAS */
void kvb_ctl_mem_reg(struct kvb_broker *b, struct kvb_worker *w,
		     struct ctl_req *q);
void kvb_ctl_mem_dereg(struct kvb_broker *b, struct kvb_worker *w,
		       struct ctl_req *q);
void kvb_ctl_mem_lookup(struct kvb_broker *b, struct kvb_worker *w,
			struct ctl_req *q);
void kvb_ctl_mem_alias(struct kvb_broker *b, struct kvb_worker *w,
		       struct ctl_req *q);

#endif

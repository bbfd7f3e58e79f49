/* SPDX-License-Identifier: MIT */
/*
 * A test-only transport with several NICs (transport.h ops nics, mr_nic,
 * mr_keys): what the multi-NIC rdma transport tells, without a device, for
 * the code around it (descriptor keys, kvbctl views, metrics, the log).
 * Region mr's NIC is mr->id % nnics; its key on NIC i is mr->id << 8 | i.
 */
#ifndef KVB_TESTS_FAKE_NIC_H
#define KVB_TESTS_FAKE_NIC_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transport.h"

struct fake_nic_tr {
	struct kvb_transport base;
	struct kvb_transport_nic nic[KVB_NIC_MAX];
	int nnics;
	int keys_n;   /* what mr_keys returns (0: nnics) */
	int home_bad; /* mr_keys reports a nearest NIC out of range */
	int nic_err;  /* mr_nic fails with this (0: it does not) */
};

static inline struct fake_nic_tr *fake_nic_of(struct kvb_transport *t)
{
	return container_of(t, struct fake_nic_tr, base);
}

static inline int fake_nic_nics(struct kvb_transport *t,
				struct kvb_transport_nic *out, unsigned max)
{
	struct fake_nic_tr *f = fake_nic_of(t);

	for (int i = 0; i < f->nnics && (unsigned) i < max; i++)
		out[i] = f->nic[i];
	return f->nnics;
}

static inline int fake_nic_mr_nic(struct kvb_transport *t,
				  const struct kvb_mr *mr, char *why,
				  size_t why_len)
{
	struct fake_nic_tr *f = fake_nic_of(t);
	int i;

	if (f->nic_err)
		return f->nic_err;
	i = (int) (mr->id % (uint32_t) f->nnics);
	if (why)
		snprintf(why, why_len, "nearest to NUMA node %d",
			 f->nic[i].numa);
	return i;
}

static inline int fake_nic_mr_keys(struct kvb_transport *t,
				   const struct kvb_mr *mr, uint32_t *rkeys,
				   unsigned max, unsigned *home)
{
	struct fake_nic_tr *f = fake_nic_of(t);
	int n = f->keys_n ? f->keys_n : f->nnics;

	for (int i = 0; i < n && (unsigned) i < max; i++)
		rkeys[i] = mr->id << 8 | (uint32_t) i;
	*home = mr->id % (uint32_t) f->nnics;
	if (f->home_bad)
		*home = (unsigned) n;
	else if (n > 0 && *home >= (unsigned) n)
		*home = 0;
	return n;
}

static inline void fake_nic_close(struct kvb_transport *t)
{
	(void) t;
}

/* ops for a fake of n NICs "fnic0".."fnic<n-1>", NIC 1 down; counters set
 * from the NIC's index so that each line is told apart */
static inline void fake_nic_init(struct fake_nic_tr *f,
				 struct kvb_transport_ops *ops,
				 const char *name, int n)
{
	memset(f, 0, sizeof(*f));
	memset(ops, 0, sizeof(*ops));
	ops->name = name;
	ops->close = fake_nic_close;
	ops->nics = fake_nic_nics;
	ops->mr_nic = fake_nic_mr_nic;
	ops->mr_keys = fake_nic_mr_keys;
	f->base.ops = ops;
	f->nnics = n;
	for (int i = 0; i < n; i++) {
		struct kvb_transport_nic *c = &f->nic[i];

		snprintf(c->name, sizeof(c->name), "fnic%d", i);
		c->port = 1;
		c->port_up = i != 1;
		c->numa = i / 2;
		snprintf(c->pci, sizeof(c->pci), "0000:%02x:00.0", 0x10 + i);
		c->bytes = 1000000u * (uint64_t) (i + 1);
		c->wrs = 1000u * (uint64_t) (i + 1);
		c->doorbells = 100u * (uint64_t) (i + 1);
		c->regions = (uint64_t) i + 2;
		c->qps = (uint32_t) (4 * (i + 1));
		c->max_qps = 64;
		c->qp_refused = (uint64_t) i * 3;
		c->moved = (uint64_t) i * 7;
		c->qp_parked = (uint64_t) i * 5;
	}
}

#endif

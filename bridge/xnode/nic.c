/* SPDX-License-Identifier: MIT */
/* Cross-node: regions' keys per NIC (nic.h). */
#include "nic.h"

#include <errno.h>
#include <string.h>

#include "broker.h"
#include "log.h"

unsigned kvb_xn_region_keys(struct kvb_transport *t, const struct kvb_mr *mr,
			    struct kvb_hs_region *hr)
{
	uint32_t keys[KVB_NIC_MAX];
	unsigned home = 0;
	int n;

	if (!t || !t->ops->mr_keys)
		return 0;
	n = t->ops->mr_keys(t, mr, keys, KVB_NIC_MAX, &home);
	if (n > KVB_NIC_MAX) /* it has more than it wrote */
		n = KVB_NIC_MAX;
	if (n < 2 || home >= (unsigned) n) {
		if (n < 0 || (n > 0 && home >= (unsigned) n))
			log_warn_rl("region %#x: no per-NIC keys for the "
				    "descriptor (%s): peers use its one key",
				    mr->id,
				    n < 0 ? strerror(-n)
					  : "nearest NIC out of range");
		return 0;
	}
	memcpy(hr->rkeys, keys, (size_t) n * sizeof(keys[0]));
	hr->nrkeys = (uint32_t) n;
	hr->nic = home;
	hr->rkey = keys[home];
	return (unsigned) n;
}

void kvb_xn_remote_keys(struct kvb_remote *rem, const struct kvb_hs_region *hr)
{
	rem->rkeys = hr->nrkeys ? hr->rkeys : NULL;
	rem->nrkeys = (uint8_t) hr->nrkeys;
	rem->nic = (uint8_t) hr->nic;
}

static const struct kvb_hs_region *find_region(const struct kvb_hs_desc *d,
					       uint32_t id, uint64_t addr)
{
	for (uint32_t i = 0; i < d->nworkers; i++)
		for (uint32_t j = 0; j < d->workers[i].nregions; j++) {
			const struct kvb_hs_region *hr =
				&d->workers[i].regions[j];

			if (hr->id == id && hr->addr == addr)
				return hr;
		}
	return NULL;
}

void kvb_xn_rekey_queued(struct kvb_broker *b, uint32_t dslot,
			 const struct kvb_hs_desc *d)
{
	static const struct kvb_hs_region none;

	for (unsigned ts = KVB_TS_TCP; ts < KVB_TS_MAX; ts++) {
		struct kvb_dest *dst =
			&b->dests[ts * b->opt.max_workers + dslot];

		for (uint32_t i = 0; i < dst->n; i++) {
			struct kvb_remote *rem = &dst->ops[i].remote;
			const struct kvb_hs_region *hr;

			if (!rem->rkeys)
				continue;
			hr = find_region(d, rem->region, rem->addr);
			kvb_xn_remote_keys(rem, hr ? hr : &none);
		}
	}
}

int kvb_xn_parked_error(struct kvb_transport *t, struct kvb_ep *ep, int status)
{
	struct kvb_transport_nic n[KVB_NIC_MAX];

	if (status != -ETIMEDOUT && status != -ECANCELED)
		return 0;
	if (!t || !ep || !t->ops->ep_state || !t->ops->nics)
		return 0;
	if (t->ops->ep_state(t, ep) != KVB_EP_STATE_READY)
		return 0;
	return t->ops->nics(t, n, KVB_NIC_MAX) > 1;
}

/* a line per region, a model's worth of layers registering at once
 * included; a storm beyond that is counted */
#define NIC_LOG_BURST 64

void kvb_xn_log_region_nic(struct kvb_transport *t,
			   const struct kvb_region_ent *r)
{
	static struct kvb_ratelimit rl;
	struct kvb_transport_nic nic[KVB_NIC_MAX];
	char why[160] = "";
	int n, i;

	if (!t || !t->ops->nics || !t->ops->mr_nic)
		return;
	if (!rl.burst)
		kvb_ratelimit_init(&rl, NIC_LOG_BURST, 1000000000ll);
	n = t->ops->nics(t, nic, KVB_NIC_MAX);
	if (n < 2) /* one NIC: nothing to choose */
		return;
	i = t->ops->mr_nic(t, &r->mr, why, sizeof(why));
	if (i < 0)
		kvb_log_rl(&rl, KVB_LOG_INFO, "region %#x: no NIC: %s",
			   r->mr.id, strerror(-i));
	else
		kvb_log_rl(&rl, KVB_LOG_INFO,
			   "region %#x (%llu bytes, worker %u): NIC %s%s%s",
			   r->mr.id, (unsigned long long) r->mr.len, r->owner,
			   i < n && i < KVB_NIC_MAX ? nic[i].name : "?",
			   why[0] ? ": " : "", why);
}

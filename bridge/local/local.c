/* SPDX-License-Identifier: MIT */
/*
 * `local` transport: same-node writes between host regions that the broker
 * has mapped, done as memcpy. A chain is one flush (counted as a doorbell),
 * each op one WR, so the figures compare one-to-one with the RDMA transport.
 * Copies finish inside post(); their completions are handed out by poll().
 */
#include "transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL_CQ_INIT 1024u

struct local_transport {
	struct kvb_transport base;
	struct kvb_xcqe *cq; /* FIFO of finished ops */
	unsigned cq_cap, cq_head, cq_len;
};

static int local_open(const struct kvb_transport_params *p,
		      struct kvb_transport **out, char *why, size_t why_len)
{
	struct local_transport *lt = calloc(1, sizeof(*lt));

	if (!lt)
		return -ENOMEM;
	lt->cq = calloc(LOCAL_CQ_INIT, sizeof(*lt->cq));
	if (!lt->cq) {
		free(lt);
		return -ENOMEM;
	}
	lt->cq_cap = LOCAL_CQ_INIT;
	lt->base.ops = &kvb_local_ops;
	*out = &lt->base;
	return 0;
}

static void local_close(struct kvb_transport *t)
{
	struct local_transport *lt = container_of(t, struct local_transport, base);

	free(lt->cq);
	free(lt);
}

static int local_reg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	/* host memory only: a GPU region needs the gpu transport */
	return mr->kind == KVB_MEM_HOST ? 0 : -EOPNOTSUPP;
}

static void local_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
}

static int local_local_info(struct kvb_transport *t, void *blob, size_t *len)
{
	*len = 0;
	return 0;
}

static int local_connect(struct kvb_transport *t, const void *blob, size_t len,
			 struct kvb_ep **ep)
{
	*ep = NULL; /* one node: no endpoint state */
	return 0;
}

static void local_disconnect(struct kvb_transport *t, struct kvb_ep *ep)
{
}

static int cq_reserve(struct local_transport *lt, unsigned n)
{
	struct kvb_xcqe *ncq;
	unsigned cap = lt->cq_cap, i;

	if (lt->cq_len + n <= cap)
		return 0;
	while (cap < lt->cq_len + n)
		cap *= 2;
	ncq = malloc((size_t)cap * sizeof(*ncq));
	if (!ncq)
		return -ENOMEM;
	for (i = 0; i < lt->cq_len; i++)
		ncq[i] = lt->cq[(lt->cq_head + i) % lt->cq_cap];
	free(lt->cq);
	lt->cq = ncq;
	lt->cq_cap = cap;
	lt->cq_head = 0;
	return 0;
}

static int local_post(struct kvb_transport *t, struct kvb_ep *ep,
		      const struct kvb_xop *ops, unsigned n)
{
	struct local_transport *lt = container_of(t, struct local_transport, base);
	uint64_t bytes = 0;
	unsigned i;
	int rc;

	if (n == 0)
		return 0;
	rc = cq_reserve(lt, n);
	if (rc)
		return rc;
	for (i = 0; i < n; i++) {
		const struct kvb_xop *op = &ops[i];
		char *l = (char *)op->local->addr + op->local_off;
		char *r = (char *)op->remote.mr->addr + op->remote_off;
		struct kvb_xcqe *c;

		if (op->opcode == KVB_XOP_WRITE)
			memcpy(r, l, op->len);
		else
			memcpy(l, r, op->len);
		bytes += op->len;
		c = &lt->cq[(lt->cq_head + lt->cq_len++) % lt->cq_cap];
		c->cookie = op->cookie;
		c->status = 0;
	}
	kvb_stats_doorbell(&t->stats, n, bytes);
	return (int)n;
}

static int local_poll(struct kvb_transport *t, struct kvb_xcqe *out,
		      unsigned max)
{
	struct local_transport *lt = container_of(t, struct local_transport, base);
	unsigned n = 0;

	while (n < max && lt->cq_len) {
		out[n++] = lt->cq[lt->cq_head];
		lt->cq_head = (lt->cq_head + 1) % lt->cq_cap;
		lt->cq_len--;
	}
	t->stats.cqes += n;
	return (int)n;
}

const struct kvb_transport_ops kvb_local_ops = {
	.name = "local",
	.open = local_open,
	.close = local_close,
	.reg_mr = local_reg_mr,
	.dereg_mr = local_dereg_mr,
	.local_info = local_local_info,
	.connect = local_connect,
	.disconnect = local_disconnect,
	.post = local_post,
	.poll = local_poll,
};

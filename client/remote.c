/* SPDX-License-Identifier: MIT */
/* libkvbroker: cross-node calls (kvb_peer_connect, kvb_transfer_open_remote,
 * kvb_transfer_open_remote_batch, kvb_transfer_expect): each one control
 * round trip (kvb_client_call) to the broker's cross-node module. */
#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "ctl.h"

int kvb_peer_connect(struct kvb_ctx *ctx, const char *host, uint16_t port,
		     uint32_t *peer)
{
	struct kvb_msg_peer req;
	struct kvb_msg_peer_reply rep;
	size_t n;
	int rc;

	if (!ctx || !host || !peer || port == 0)
		return -EINVAL;
	n = strlen(host);
	if (n == 0 || n >= sizeof(req.host))
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_PEER, sizeof(req));
	memcpy(req.host, host, n);
	req.port = port;
	rc = kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	if (rc)
		return rc;
	*peer = rep.peer;
	return 0;
}

int kvb_transfer_open_remote(struct kvb_ctx *ctx, const char *id,
			     const struct kvb_remote_xfer *x, uint32_t *handle)
{
	struct kvb_msg_xopen *req;
	struct kvb_msg_open_reply rep;
	size_t n, len;
	uint32_t nb, nr;
	int rc;

	if (!ctx || !id || !x || !handle || x->mode > KVB_XFER_READ ||
	    (x->flags & ~(KVB_XFER_F_NO_ANNOUNCE | KVB_XFER_F_PLAIN_RELEASE)))
		return -EINVAL;
	n = strlen(id);
	nb = x->nblocks;
	nr = x->nremote;
	if (n == 0 || n > KVB_XFER_ID_MAX || (nb && !x->blocks) ||
	    (nr && !x->remote_blocks))
		return -EINVAL;
	len = sizeof(*req) + ((size_t) nb + nr) * sizeof(uint32_t);
	if (len > KVB_MSG_MAX)
		return -E2BIG;
	if (x->notify_host &&
	    strlen(x->notify_host) >= sizeof(req->notify_host))
		return -EINVAL;
	req = calloc(1, len);
	if (!req)
		return -ENOMEM;
	kvb_msg_init(&req->h, KVB_MSG_XOPEN, (uint32_t) len);
	req->id_len = (uint32_t) n;
	memcpy(req->id, id, n);
	req->peer = x->peer;
	req->mode = x->mode;
	req->flags = x->flags;
	req->remote_dp_rank = x->remote_dp_rank;
	req->nblocks = nb;
	req->nremote = nr;
	if (x->notify_host)
		strcpy(req->notify_host, x->notify_host);
	req->notify_port = x->notify_port;
	if (nb)
		memcpy(req + 1, x->blocks, nb * sizeof(uint32_t));
	if (nr)
		memcpy((uint32_t *) (req + 1) + nb, x->remote_blocks,
		       nr * sizeof(uint32_t));
	rc = kvb_client_call(ctx, &req->h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	free(req);
	if (rc)
		return rc;
	*handle = rep.handle;
	return 0;
}

/* Is entry e well formed (0 or -EINVAL)? Its bytes in a message: *len. */
static int remote_open_check(const struct kvb_remote_open *e, size_t *len)
{
	size_t k, h;

	if (!e->transfer_id || !e->host || e->port == 0 ||
	    e->mode > KVB_XFER_READ ||
	    (e->flags & ~(KVB_XFER_F_NO_ANNOUNCE | KVB_XFER_F_PLAIN_RELEASE |
			  KVB_XFER_F_RELEASE_ONLY)) ||
	    (e->nblocks && !e->blocks) || (e->nremote && !e->remote_blocks))
		return -EINVAL;
	k = strlen(e->transfer_id);
	h = strlen(e->host);
	if (k == 0 || k > KVB_XFER_ID_MAX || h == 0 || h >= 64)
		return -EINVAL;
	*len = sizeof(struct kvb_xopen_ent) + ((k + h + 3) & ~(size_t) 3) +
	       ((size_t) e->nblocks + e->nremote) * sizeof(uint32_t);
	return 0;
}

/* Write entry e (checked) at p; returns the bytes written. */
static size_t remote_open_put(char *p, const struct kvb_remote_open *e)
{
	struct kvb_xopen_ent h = {
		.id_len = (uint8_t) strlen(e->transfer_id),
		.host_len = (uint8_t) strlen(e->host),
		.port = e->port,
		.mode = e->mode,
		.flags = e->flags,
		.remote_dp_rank = e->remote_dp_rank,
		.nblocks = e->nblocks,
		.nremote = e->nremote,
	};
	size_t off = sizeof(h), pad;

	memcpy(p, &h, sizeof(h));
	memcpy(p + off, e->transfer_id, h.id_len);
	off += h.id_len;
	memcpy(p + off, e->host, h.host_len);
	off += h.host_len;
	pad = (4 - (h.id_len + h.host_len) % 4) % 4;
	memset(p + off, 0, pad);
	off += pad;
	if (e->nblocks)
		memcpy(p + off, e->blocks, e->nblocks * sizeof(uint32_t));
	off += e->nblocks * sizeof(uint32_t);
	if (e->nremote)
		memcpy(p + off, e->remote_blocks,
		       e->nremote * sizeof(uint32_t));
	return off + e->nremote * sizeof(uint32_t);
}

/* One XOPEN_BATCH message of the entries idx[0..k) of o; their results. */
static int remote_open_part(struct kvb_ctx *ctx,
			    const struct kvb_remote_open *o,
			    const unsigned *idx, unsigned k, uint32_t *handles,
			    int32_t *status, char *req, void *rep, size_t cap)
{
	struct kvb_msg_xopen_batch *m = (struct kvb_msg_xopen_batch *) req;
	struct kvb_msg_open_batch_reply *r = rep;
	size_t len = sizeof(*m);
	int rc;

	for (unsigned j = 0; j < k; j++)
		len += remote_open_put(req + len, &o[idx[j]]);
	kvb_msg_init(&m->h, KVB_MSG_XOPEN_BATCH, sizeof(*m));
	m->h.len = (uint32_t) len;
	m->n = k;
	rc = kvb_client_call(ctx, &m->h, NULL, 0, rep, cap,
			     sizeof(*r) + k * sizeof(r->res[0]));
	if (!rc &&
	    (r->n != k || r->h.len != sizeof(*r) + k * sizeof(r->res[0])))
		rc = -EPROTO;
	for (unsigned j = 0; j < k; j++) {
		int s = rc ? rc : r->res[j].status;

		if (s > 0)
			s = -EPROTO;
		status[idx[j]] = s;
		handles[idx[j]] = s ? 0 : r->res[j].handle;
	}
	return rc;
}

int kvb_transfer_open_remote_batch(struct kvb_ctx *ctx,
				   const struct kvb_remote_open *o, unsigned n,
				   uint32_t *handles, int32_t *status)
{
	size_t cap = sizeof(struct kvb_msg_open_batch_reply) +
		     KVB_XOPEN_BATCH_MAX * sizeof(struct kvb_open_result);
	unsigned *idx = NULL, k = 0;
	char *req = NULL;
	void *rep = NULL;
	size_t used = sizeof(struct kvb_msg_xopen_batch), len;
	int rc = 0;

	if (!ctx || !o || !handles || !status || n == 0)
		return -EINVAL;
	/* an entry that fits no message fails the call before anything goes;
	 * a bad entry is not sent (its status says why) */
	for (unsigned i = 0; i < n; i++) {
		handles[i] = 0;
		status[i] = remote_open_check(&o[i], &len);
		if (!status[i] &&
		    len > KVB_MSG_MAX - sizeof(struct kvb_msg_xopen_batch))
			return -E2BIG;
	}
	req = malloc(KVB_MSG_MAX);
	rep = malloc(cap);
	idx = malloc(KVB_XOPEN_BATCH_MAX * sizeof(*idx));
	if (!req || !rep || !idx) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		if (status[i])
			continue;
		remote_open_check(&o[i], &len);
		if (k == KVB_XOPEN_BATCH_MAX || used + len > KVB_MSG_MAX) {
			rc = remote_open_part(ctx, o, idx, k, handles, status,
					      req, rep, cap);
			if (rc)
				break;
			k = 0;
			used = sizeof(struct kvb_msg_xopen_batch);
		}
		idx[k++] = i;
		used += len;
	}
	if (!rc && k)
		rc = remote_open_part(ctx, o, idx, k, handles, status, req, rep,
				      cap);
out:
	if (rc) /* the entries not answered get the call's error */
		for (unsigned i = 0; i < n; i++)
			if (!status[i] && !handles[i])
				status[i] = rc;
	free(req);
	free(rep);
	free(idx);
	return rc;
}

int kvb_transfer_expect(struct kvb_ctx *ctx, const char *const *ids, unsigned n,
			unsigned flags, int32_t *status)
{
	struct kvb_msg_open_batch_reply *r;
	struct kvb_msg_xexpect *m;
	size_t len = sizeof(*m), rlen;
	char *req, *rep;
	int rc;

	if (!ctx || !ids || !status || n == 0 || n > KVB_EXPECT_MAX ||
	    (flags & ~KVB_EXPECT_WITHDRAW))
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		size_t k = ids[i] ? strlen(ids[i]) : 0;

		status[i] = k == 0 || k > KVB_XFER_ID_MAX ? -EINVAL : 0;
		if (!status[i])
			len += 1 + k;
	}
	if (len > KVB_MSG_MAX)
		return -E2BIG;
	rlen = sizeof(*r) + n * sizeof(r->res[0]);
	req = malloc(len);
	rep = malloc(rlen);
	if (!req || !rep) {
		free(req);
		free(rep);
		return -ENOMEM;
	}
	m = (struct kvb_msg_xexpect *) req;
	kvb_msg_init(&m->h, KVB_MSG_XEXPECT, sizeof(*m));
	m->h.len = (uint32_t) len;
	m->flags = flags;
	m->n = 0;
	len = sizeof(*m);
	for (unsigned i = 0; i < n; i++) {
		size_t k;

		if (status[i])
			continue;
		k = strlen(ids[i]);
		req[len] = (char) k;
		memcpy(req + len + 1, ids[i], k);
		len += 1 + k;
		m->n++;
	}
	rc = 0;
	if (m->n) {
		r = (struct kvb_msg_open_batch_reply *) rep;
		rc = kvb_client_call(ctx, &m->h, NULL, 0, rep, rlen,
				     sizeof(*r) + m->n * sizeof(r->res[0]));
		if (!rc && (r->n != m->n ||
			    r->h.len != sizeof(*r) + m->n * sizeof(r->res[0])))
			rc = -EPROTO;
		for (unsigned i = 0, j = 0; !rc && i < n; i++) {
			int32_t st;

			if (status[i])
				continue;
			st = r->res[j++].status;
			status[i] = st > 0 ? -EPROTO : st;
		}
		for (unsigned i = 0; rc && i < n; i++)
			if (!status[i])
				status[i] = rc;
	}
	free(req);
	free(rep);
	return rc;
}

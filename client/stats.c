/* SPDX-License-Identifier: MIT */
/* libkvbroker: the broker's counters over the context's control socket. */
#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "ctl.h"

int kvb_stats(struct kvb_ctx *ctx, int json, char *buf, unsigned long len)
{
	struct kvb_msg_stats req;
	char *rep;
	size_t n;
	int rc;

	if (!ctx || !buf || !len)
		return -EINVAL;
	buf[0] = '\0';
	rep = malloc(KVB_MSG_MAX + 1);
	if (!rep)
		return -ENOMEM;
	kvb_msg_init(&req.h, KVB_MSG_STATS, sizeof(req));
	req.json = json ? 1 : 0;
	rc = kvb_client_call(ctx, &req.h, NULL, 0, rep, KVB_MSG_MAX,
			     sizeof(struct kvb_msg_hdr) + 1);
	if (rc)
		goto out;
	/* the reply is h->len bytes (checked); its text NUL-terminated */
	rep[((struct kvb_msg_hdr *) rep)->len] = '\0';
	n = strlen(rep + sizeof(struct kvb_msg_hdr));
	if (n + 1 > len) {
		rc = -ENOSPC;
		goto out;
	}
	memcpy(buf, rep + sizeof(struct kvb_msg_hdr), n + 1);
	rc = (int) n;
out:
	free(rep);
	return rc;
}

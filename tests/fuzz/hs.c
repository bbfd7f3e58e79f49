// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the broker-to-broker engine descriptor (bridge/zmq/
 * handshake.c, mp.c), what a peer broker answers on the handshake port.
 *
 * Only 0, -EBADMSG or -EPROTONOSUPPORT; a refusal names a reason and leaves
 * nothing to free. An accepted descriptor respects the bounds of
 * handshake.h, every region's geometry fits its size, it encodes (the
 * encoder checks with the decoder's rules), decodes back to the same
 * descriptor and re-encodes to the same bytes.
 */
#include <errno.h>

#include "fuzz.h"
#include "zmq/handshake.h"

static int same_region(const struct kvb_hs_region *a,
		       const struct kvb_hs_region *b)
{
	return a->id == b->id && a->size == b->size && a->addr == b->addr &&
	       a->rkey == b->rkey && a->layer == b->layer &&
	       !memcmp(&a->geom, &b->geom, sizeof(a->geom));
}

static int same(const struct kvb_hs_desc *a, const struct kvb_hs_desc *b)
{
	uint32_t i, j;

	if (a->version != b->version || strcmp(a->node_id, b->node_id) ||
	    strcmp(a->host, b->host) || a->notify_port != b->notify_port ||
	    a->hs_port != b->hs_port || a->instance != b->instance ||
	    a->ntransports != b->ntransports || a->nworkers != b->nworkers)
		return 0;
	for (i = 0; i < a->ntransports; i++) {
		const struct kvb_hs_transport *x = &a->transports[i];
		const struct kvb_hs_transport *y = &b->transports[i];

		if (strcmp(x->name, y->name) || x->conn_len != y->conn_len ||
		    (x->conn_len && memcmp(x->conn, y->conn, x->conn_len)))
			return 0;
	}
	for (i = 0; i < a->nworkers; i++) {
		const struct kvb_hs_worker *x = &a->workers[i];
		const struct kvb_hs_worker *y = &b->workers[i];

		if (x->role != y->role || x->dp_rank != y->dp_rank ||
		    x->tp_rank != y->tp_rank || x->tp_size != y->tp_size ||
		    x->nregions != y->nregions)
			return 0;
		for (j = 0; j < x->nregions; j++)
			if (!same_region(&x->regions[j], &y->regions[j]))
				return 0;
	}
	return 1;
}

static void check_bounds(const struct kvb_hs_desc *d)
{
	uint32_t i, j;

	FUZZ_CHECK(d->version == KVB_HS_VERSION);
	FUZZ_CHECK(d->node_id[0] && strnlen(d->node_id, sizeof(d->node_id)) <=
					    KVB_HS_NODE_ID_MAX);
	FUZZ_CHECK(d->notify_port <= 65535 && d->hs_port <= 65535);
	FUZZ_CHECK(d->ntransports <= KVB_HS_TRANSPORT_MAX);
	for (i = 0; i < d->ntransports; i++)
		FUZZ_CHECK(d->transports[i].name[0] &&
			   d->transports[i].conn_len <= KVB_HS_CONN_MAX);
	FUZZ_CHECK(d->nworkers <= KVB_HS_WORKERS_MAX);
	for (i = 0; i < d->nworkers; i++) {
		const struct kvb_hs_worker *w = &d->workers[i];

		FUZZ_CHECK(w->role == KVB_HS_ROLE_P ||
			   w->role == KVB_HS_ROLE_D);
		FUZZ_CHECK(w->tp_rank < w->tp_size);
		FUZZ_CHECK(w->nregions <= KVB_HS_REGIONS_MAX);
		for (j = 0; j < w->nregions; j++) {
			const struct kvb_hs_region *r = &w->regions[j];

			FUZZ_CHECK(!kvb_kv_geom_check(&r->geom));
			FUZZ_CHECK(kvb_kv_region_len(&r->geom) <= r->size);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvb_hs_desc d, back;
	const char *why = NULL;
	char *out, *out2;
	size_t len, len2;
	int rc;

	rc = kvb_hs_decode(&d, data, size, &why);
	FUZZ_CHECK(rc == 0 || rc == -EBADMSG || rc == -EPROTONOSUPPORT);
	if (rc) {
		FUZZ_CHECK(why && *why);
		FUZZ_CHECK(!d.workers && !d.nworkers && !d.ntransports);
		return 0;
	}
	check_bounds(&d);
	FUZZ_CHECK(kvb_hs_encode(&d, &out, &len) == 0);
	rc = kvb_hs_decode(&back, out, len, &why);
	if (rc)
		fprintf(stderr, "encoded descriptor refused: %s\n", why);
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(same(&d, &back));
	FUZZ_CHECK(kvb_hs_encode(&back, &out2, &len2) == 0);
	FUZZ_CHECK(len == len2 && !memcmp(out, out2, len));
	free(out);
	free(out2);
	kvb_hs_fini(&back);
	kvb_hs_fini(&d);
	return 0;
}

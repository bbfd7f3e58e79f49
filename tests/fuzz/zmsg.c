// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the MoRIIO notify codec (bridge/zmq/codec.c, mp.c), what a
 * peer's notify socket delivers to the broker byte for byte.
 *
 * Decode direction, on the input as a payload: only 0, -EBADMSG or -EPROTO;
 * a refusal names a reason and leaves nothing to free; an accepted message
 * passes kvb_zmsg_check(), encodes, decodes back to the same message, and
 * re-encodes to the same bytes.
 *
 * Encode direction, on the input as a recipe for a struct kvb_zmsg: what
 * kvb_zmsg_check() accepts encodes, and the bytes decode to the same message
 * (codec.h: "the broker never sends what it would refuse").
 */
#include <errno.h>

#include "fuzz.h"
#include "zmq/codec.h"

static int same(const struct kvb_zmsg *a, const struct kvb_zmsg *b)
{
	if (a->type != b->type || a->flags != b->flags ||
	    strcmp(a->transfer_id, b->transfer_id))
		return 0;
	switch (a->type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		return !strcmp(a->req_id, b->req_id) &&
		       a->decode_rank == b->decode_rank &&
		       a->nblocks == b->nblocks &&
		       !memcmp(a->blocks, b->blocks,
			       a->nblocks * sizeof(a->blocks[0]));
	case KVB_ZMSG_RELEASE:
		return !(a->flags & KVB_ZMSG_F_CONSUMER_TP) ||
		       a->consumer_tp_size == b->consumer_tp_size;
	case KVB_ZMSG_PLAIN:
		return !(a->flags & KVB_ZMSG_F_TP_RANK) ||
		       a->tp_rank == b->tp_rank;
	case KVB_ZMSG_WRITE_FAILED:
		return a->status == b->status;
	default:
		return 1;
	}
}

/* m was accepted (decoded, or passed the check): encode, decode, compare. */
static void round_trip(const struct kvb_zmsg *m)
{
	struct kvb_zmsg back;
	const char *why = NULL;
	char *out, *out2;
	size_t len, len2;
	int rc;

	FUZZ_CHECK(kvb_zmsg_check(m) == 0);
	FUZZ_CHECK(kvb_zmsg_encode(m, &out, &len) == 0);
	rc = kvb_zmsg_decode(&back, out, len, &why);
	if (rc)
		fprintf(stderr, "encoded message refused: %s\n", why);
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(same(m, &back));
	FUZZ_CHECK(kvb_zmsg_encode(&back, &out2, &len2) == 0);
	FUZZ_CHECK(len == len2 && !memcmp(out, out2, len));
	kvb_zmsg_fini(&back);
	free(out);
	free(out2);
}

static void decode_side(const uint8_t *data, size_t size)
{
	struct kvb_zmsg m;
	const char *why = NULL;
	size_t n;
	int rc;

	rc = kvb_zmsg_decode(&m, data, size, &why);
	FUZZ_CHECK(rc == 0 || rc == -EBADMSG || rc == -EPROTO);
	if (rc) {
		FUZZ_CHECK(why && *why);
		FUZZ_CHECK(!m.blocks && !m.nblocks);
		return;
	}
	n = strnlen(m.transfer_id, sizeof(m.transfer_id));
	FUZZ_CHECK(n >= 1 && n <= KVB_ZMSG_ID_MAX);
	if (m.type == KVB_ZMSG_REMOTE_BLOCKS)
		FUZZ_CHECK(m.blocks && m.nblocks >= 1 &&
			   m.nblocks <= KVB_ZMSG_BLOCKS_MAX);
	else
		FUZZ_CHECK(!m.blocks && !m.nblocks);
	round_trip(&m);
	kvb_zmsg_fini(&m);
}

/* An id of 0..n bytes drawn from the input (may be invalid on purpose). */
static void take_id(struct fuzz_in *in, char *out, size_t max)
{
	size_t n = (size_t) fuzz_take(in, 1), i;

	if (n > max)
		n = max;
	for (i = 0; i < n; i++)
		out[i] = (char) fuzz_take(in, 1);
	out[n] = '\0';
}

static void encode_side(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	struct kvb_zmsg m;
	uint32_t ids[64];
	unsigned sel, n, i;

	memset(&m, 0, sizeof(m));
	sel = (unsigned) fuzz_take(&in, 1);
	m.type = (enum kvb_zmsg_type)(1 + sel % 5);
	take_id(&in, m.transfer_id, KVB_ZMSG_ID_MAX);
	switch (m.type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		if (sel & 0x10)
			m.flags |= KVB_ZMSG_F_UNTYPED;
		take_id(&in, m.req_id, KVB_ZMSG_ID_MAX);
		m.decode_rank = (uint32_t) fuzz_take(&in, 3);
		n = 1 + (unsigned) fuzz_take(&in, 1) % 64;
		for (i = 0; i < n; i++)
			ids[i] = (uint32_t) fuzz_take(&in, 4);
		if (kvb_zmsg_set_blocks(&m, ids, n))
			return;
		break;
	case KVB_ZMSG_RELEASE:
		if (sel & 0x10) {
			m.flags |= KVB_ZMSG_F_CONSUMER_TP;
			m.consumer_tp_size = (uint32_t) fuzz_take(&in, 3);
		}
		break;
	case KVB_ZMSG_PLAIN:
		if (sel & 0x10) {
			m.flags |= KVB_ZMSG_F_TP_RANK;
			m.tp_rank = (uint32_t) fuzz_take(&in, 3);
		}
		break;
	case KVB_ZMSG_WRITE_FAILED: /* -4999..0: some out of range */
		m.status = -(int32_t) (fuzz_take(&in, 2) % 5000);
		break;
	default:
		break;
	}
	if (!kvb_zmsg_check(&m))
		round_trip(&m);
	kvb_zmsg_fini(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	decode_side(data, size);
	encode_side(data, size);
	return 0;
}

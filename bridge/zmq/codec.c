/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp.h"
#include "zmq/codec.h"

/*
 * A notify map is flat: map -> array of ints is depth 2. Unknown keys may
 * carry a little structure of their own, so allow a few levels more; the
 * object budget covers a full block list plus the other fields.
 */
#define ZMSG_MAX_DEPTH	 4
#define ZMSG_MAX_OBJECTS (KVB_ZMSG_BLOCKS_MAX + 256)
#define ZMSG_MAX_FIELDS	 32

/* ":tp" + up to 5 digits */
#define ZMSG_TP_SUFFIX_MAX 8

static int bad(const char **reason, const char *why)
{
	if (reason)
		*reason = why;
	return -EBADMSG;
}

static bool is_map_marker(uint8_t b)
{
	return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
}

/* Split "<id>:tp<rank>" when the suffix is all digits and in range. */
static void plain_split(const uint8_t *s, size_t len, size_t *idlen,
			uint32_t *rank, bool *has_rank)
{
	size_t i, d;
	uint32_t v = 0;

	*idlen = len;
	*has_rank = false;
	for (i = len; i-- > 0;) {
		if (s[i] >= '0' && s[i] <= '9')
			continue;
		break;
	}
	/* s[i] is the last non-digit; digits are s[i+1..len) */
	if (i == (size_t) -1 || i < 3 || s[i] != 'p' || s[i - 1] != 't' ||
	    s[i - 2] != ':')
		return;
	d = len - i - 1;
	if (d == 0 || d > 5 || i - 2 == 0)
		return;
	for (size_t k = i + 1; k < len; k++)
		v = v * 10 + (uint32_t) (s[k] - '0');
	if (v > KVB_ZMSG_RANK_MAX)
		return;
	*idlen = i - 2;
	*rank = v;
	*has_rank = true;
}

static int decode_plain(struct kvb_zmsg *m, const uint8_t *p, size_t len,
			const char **reason)
{
	size_t idlen;
	uint32_t rank = 0;
	bool has_rank;

	if (!_kvb_mp_utf8_valid(p, len))
		return bad(reason, "neither a msgpack map nor UTF-8");
	if (len > KVB_ZMSG_ID_MAX + ZMSG_TP_SUFFIX_MAX)
		return bad(reason, "plain-string transfer_id too long");
	if (_kvb_mp_ident_check(p, len, len))
		return bad(reason, "plain string holds control characters");
	plain_split(p, len, &idlen, &rank, &has_rank);
	if (idlen > KVB_ZMSG_ID_MAX)
		return bad(reason, "plain-string transfer_id too long");
	m->type = KVB_ZMSG_PLAIN;
	memcpy(m->transfer_id, p, idlen);
	m->transfer_id[idlen] = '\0';
	if (has_rank) {
		m->flags |= KVB_ZMSG_F_TP_RANK;
		m->tp_rank = rank;
	}
	return 0;
}

static int get_blocks(struct kvb_zmsg *m, const msgpack_object *o,
		      const char **reason)
{
	const msgpack_object *e;
	uint32_t i, n;
	int64_t v;
	int ret;

	if (o->type != MSGPACK_OBJECT_ARRAY)
		return bad(reason, "block_notify_list is not an array");
	n = o->via.array.size;
	if (n == 0)
		return bad(reason, "empty block_notify_list");
	if (n > KVB_ZMSG_BLOCKS_MAX)
		return bad(reason, "block_notify_list too long");
	m->blocks = malloc(sizeof(*m->blocks) * n);
	if (!m->blocks) {
		if (reason)
			*reason = "out of memory";
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		e = &o->via.array.ptr[i];
		ret = _kvb_mp_get_int(e, 0, KVB_ZMSG_BLOCK_MAX, &v);
		if (ret == -EBADMSG)
			return bad(reason, "block id is not an integer");
		if (ret && e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
			return bad(reason, "negative block id");
		if (ret)
			return bad(reason, "block id out of range");
		m->blocks[i] = (uint32_t) v;
	}
	m->nblocks = n;
	return 0;
}

static int decode_fields(struct kvb_zmsg *m, const msgpack_object *map,
			 const char **reason)
{
	const msgpack_object *type, *tid, *req, *list, *rank, *ctp, *st;
	int64_t v;
	int ret;

	ret = _kvb_mp_map_check(map, ZMSG_MAX_FIELDS, reason);
	if (ret)
		return ret;
	type = _kvb_mp_map_get(map, "type");
	tid = _kvb_mp_map_get(map, "transfer_id");
	req = _kvb_mp_map_get(map, "req_id");

	if (type) {
		if (type->type != MSGPACK_OBJECT_STR)
			return bad(reason, "type is not a string");
		if (_kvb_mp_str_eq(type, "remote_blocks")) {
			m->type = KVB_ZMSG_REMOTE_BLOCKS;
		} else if (_kvb_mp_str_eq(type, "write_done")) {
			m->type = KVB_ZMSG_WRITE_DONE;
		} else if (_kvb_mp_str_eq(type, "release")) {
			m->type = KVB_ZMSG_RELEASE;
		} else if (_kvb_mp_str_eq(type, "kvb_write_failed")) {
			m->type = KVB_ZMSG_WRITE_FAILED;
		} else {
			if (reason)
				*reason = "unknown message type";
			return -EPROTO;
		}
	} else if (req) {
		m->type = KVB_ZMSG_REMOTE_BLOCKS;
		m->flags |= KVB_ZMSG_F_UNTYPED;
	} else {
		return bad(reason, "map has neither type nor req_id");
	}

	if (!tid)
		return bad(reason, "missing transfer_id");
	if (_kvb_mp_get_ident(tid, m->transfer_id, KVB_ZMSG_ID_MAX))
		return bad(reason, "transfer_id is not a valid id string");

	switch (m->type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		if (!req)
			return bad(reason, "remote_blocks without req_id");
		if (_kvb_mp_get_ident(req, m->req_id, KVB_ZMSG_ID_MAX))
			return bad(reason, "req_id is not a valid id string");
		rank = _kvb_mp_map_get(map, "decode_rank");
		if (!rank)
			return bad(reason, "remote_blocks without decode_rank");
		ret = _kvb_mp_get_int(rank, 0, KVB_ZMSG_RANK_MAX, &v);
		if (ret == -EBADMSG)
			return bad(reason, "decode_rank is not an integer");
		if (ret)
			return bad(reason, "decode_rank out of range");
		m->decode_rank = (uint32_t) v;
		list = _kvb_mp_map_get(map, "block_notify_list");
		if (!list)
			return bad(reason, "remote_blocks without "
					   "block_notify_list");
		return get_blocks(m, list, reason);
	case KVB_ZMSG_RELEASE:
		ctp = _kvb_mp_map_get(map, "consumer_tp_size");
		/* Python senders may spell "absent" as None. */
		if (!ctp || ctp->type == MSGPACK_OBJECT_NIL)
			return 0;
		ret = _kvb_mp_get_int(ctp, INT64_MIN, INT64_MAX, &v);
		if (ret == -EBADMSG)
			return bad(reason,
				   "consumer_tp_size is not an integer");
		if (ret || v <= 0)
			return bad(reason, "consumer_tp_size must be > 0");
		if (v > KVB_ZMSG_TP_MAX)
			return bad(reason, "consumer_tp_size out of range");
		m->flags |= KVB_ZMSG_F_CONSUMER_TP;
		m->consumer_tp_size = (uint32_t) v;
		return 0;
	case KVB_ZMSG_WRITE_FAILED:
		st = _kvb_mp_map_get(map, "status");
		if (!st)
			return bad(reason, "kvb_write_failed without status");
		ret = _kvb_mp_get_int(st, -4095, -1, &v);
		if (ret == -EBADMSG)
			return bad(reason, "status is not an integer");
		if (ret)
			return bad(reason,
				   "status is not a -errno (-4095..-1)");
		m->status = (int32_t) v;
		return 0;
	default:
		return 0;
	}
}

int kvb_zmsg_decode(struct kvb_zmsg *m, const void *buf, size_t len,
		    const char **reason)
{
	const uint8_t *p = buf;
	msgpack_unpacked up;
	int ret;

	memset(m, 0, sizeof(*m));
	if (len == 0)
		return bad(reason, "empty message");
	if (len > KVB_ZMSG_BYTES_MAX)
		return bad(reason, "message too large");
	/*
	 * A map marker decides: fixmap and 0xde/0xdf. fixmap bytes are UTF-8
	 * continuation bytes, but 0xde/0xdf lead U+0780..U+07FF: a plain id
	 * starting there is read (and refused) as a map, so the encoder never
	 * writes one (validate()).
	 */
	if (!is_map_marker(p[0]))
		return decode_plain(m, p, len, reason);

	ret = _kvb_mp_unpack(&up, buf, len, ZMSG_MAX_DEPTH, ZMSG_MAX_OBJECTS,
			     reason);
	if (ret)
		return ret;
	ret = decode_fields(m, &up.data, reason);
	msgpack_unpacked_destroy(&up);
	if (ret)
		kvb_zmsg_fini(m);
	return ret;
}

void kvb_zmsg_fini(struct kvb_zmsg *m)
{
	free(m->blocks);
	memset(m, 0, sizeof(*m));
}

int kvb_zmsg_init(struct kvb_zmsg *m, enum kvb_zmsg_type type,
		  const char *transfer_id)
{
	size_t len = strlen(transfer_id);

	memset(m, 0, sizeof(*m));
	if (_kvb_mp_ident_check((const uint8_t *) transfer_id, len,
				KVB_ZMSG_ID_MAX))
		return -EINVAL;
	m->type = type;
	memcpy(m->transfer_id, transfer_id, len + 1);
	return 0;
}

int kvb_zmsg_set_blocks(struct kvb_zmsg *m, const uint32_t *ids, uint32_t n)
{
	uint32_t *b;

	if (n == 0 || n > KVB_ZMSG_BLOCKS_MAX)
		return -EINVAL;
	b = malloc(sizeof(*b) * n);
	if (!b)
		return -ENOMEM;
	memcpy(b, ids, sizeof(*b) * n);
	free(m->blocks);
	m->blocks = b;
	m->nblocks = n;
	return 0;
}

const char *kvb_zmsg_type_name(enum kvb_zmsg_type type)
{
	switch (type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		return "remote_blocks";
	case KVB_ZMSG_WRITE_DONE:
		return "write_done";
	case KVB_ZMSG_RELEASE:
		return "release";
	case KVB_ZMSG_PLAIN:
		return "plain";
	case KVB_ZMSG_WRITE_FAILED:
		return "kvb_write_failed";
	}
	return "?";
}

static bool ident_ok(const char *s)
{
	size_t len = strnlen(s, KVB_ZMSG_ID_MAX + 1);

	return !_kvb_mp_ident_check((const uint8_t *) s, len, KVB_ZMSG_ID_MAX);
}

static int validate(const struct kvb_zmsg *m)
{
	uint32_t i;

	if (!ident_ok(m->transfer_id))
		return -EINVAL;
	switch (m->type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		if (!ident_ok(m->req_id) || !m->blocks || m->nblocks == 0 ||
		    m->nblocks > KVB_ZMSG_BLOCKS_MAX ||
		    m->decode_rank > KVB_ZMSG_RANK_MAX)
			return -EINVAL;
		for (i = 0; i < m->nblocks; i++)
			if (m->blocks[i] > KVB_ZMSG_BLOCK_MAX)
				return -EINVAL;
		return 0;
	case KVB_ZMSG_RELEASE:
		if ((m->flags & KVB_ZMSG_F_CONSUMER_TP) &&
		    (m->consumer_tp_size == 0 ||
		     m->consumer_tp_size > KVB_ZMSG_TP_MAX))
			return -EINVAL;
		return 0;
	case KVB_ZMSG_WRITE_DONE:
		return 0;
	case KVB_ZMSG_WRITE_FAILED:
		return m->status >= -4095 && m->status <= -1 ? 0 : -EINVAL;
	case KVB_ZMSG_PLAIN:
		/* the decoder would take the bytes for a map and refuse them */
		if (is_map_marker((uint8_t) m->transfer_id[0]))
			return -EINVAL;
		/*
		 * An id ending in ":tp<digits>" sent bare would be read as the
		 * READ variant of a shorter id (a release of another transfer):
		 * it can only go with its own ":tp<rank>" suffix.
		 */
		if (!(m->flags & KVB_ZMSG_F_TP_RANK)) {
			size_t idlen;
			uint32_t rank;
			bool has_rank;

			plain_split((const uint8_t *) m->transfer_id,
				    strlen(m->transfer_id), &idlen, &rank,
				    &has_rank);
			if (has_rank)
				return -EINVAL;
		}
		if ((m->flags & KVB_ZMSG_F_TP_RANK) &&
		    m->tp_rank > KVB_ZMSG_RANK_MAX)
			return -EINVAL;
		return 0;
	}
	return -EINVAL;
}

int kvb_zmsg_check(const struct kvb_zmsg *m)
{
	return validate(m);
}

static int encode_plain(const struct kvb_zmsg *m, char **out, size_t *len)
{
	size_t n = strlen(m->transfer_id);
	char *b;

	b = malloc(n + ZMSG_TP_SUFFIX_MAX + 1);
	if (!b)
		return -ENOMEM;
	memcpy(b, m->transfer_id, n);
	if (m->flags & KVB_ZMSG_F_TP_RANK)
		n += (size_t) snprintf(b + n, ZMSG_TP_SUFFIX_MAX + 1, ":tp%u",
				       m->tp_rank);
	*out = b;
	*len = n;
	return 0;
}

static int pack_map(msgpack_packer *pk, const struct kvb_zmsg *m)
{
	bool typed = !(m->type == KVB_ZMSG_REMOTE_BLOCKS &&
		       (m->flags & KVB_ZMSG_F_UNTYPED));
	size_t nfields = 1 + typed;
	uint32_t i;
	int r = 0;

	if (m->type == KVB_ZMSG_REMOTE_BLOCKS)
		nfields += 3;
	else if ((m->type == KVB_ZMSG_RELEASE &&
		  (m->flags & KVB_ZMSG_F_CONSUMER_TP)) ||
		 m->type == KVB_ZMSG_WRITE_FAILED)
		nfields += 1;

	r |= msgpack_pack_map(pk, nfields);
	if (typed) {
		r |= _kvb_mp_pack_cstr(pk, "type");
		r |= _kvb_mp_pack_cstr(pk, kvb_zmsg_type_name(m->type));
	}
	r |= _kvb_mp_pack_cstr(pk, "transfer_id");
	r |= _kvb_mp_pack_cstr(pk, m->transfer_id);
	if (m->type == KVB_ZMSG_REMOTE_BLOCKS) {
		r |= _kvb_mp_pack_cstr(pk, "req_id");
		r |= _kvb_mp_pack_cstr(pk, m->req_id);
		r |= _kvb_mp_pack_cstr(pk, "block_notify_list");
		r |= msgpack_pack_array(pk, m->nblocks);
		for (i = 0; i < m->nblocks; i++)
			r |= msgpack_pack_uint32(pk, m->blocks[i]);
		r |= _kvb_mp_pack_cstr(pk, "decode_rank");
		r |= msgpack_pack_uint32(pk, m->decode_rank);
	} else if (m->type == KVB_ZMSG_RELEASE &&
		   (m->flags & KVB_ZMSG_F_CONSUMER_TP)) {
		r |= _kvb_mp_pack_cstr(pk, "consumer_tp_size");
		r |= msgpack_pack_uint32(pk, m->consumer_tp_size);
	} else if (m->type == KVB_ZMSG_WRITE_FAILED) {
		r |= _kvb_mp_pack_cstr(pk, "status");
		r |= msgpack_pack_int32(pk, m->status);
	}
	return r ? -ENOMEM : 0;
}

int kvb_zmsg_encode(const struct kvb_zmsg *m, char **out, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int ret;

	ret = validate(m);
	if (ret)
		return ret;
	if (m->type == KVB_ZMSG_PLAIN)
		return encode_plain(m, out, len);

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	ret = pack_map(&pk, m);
	if (ret) {
		msgpack_sbuffer_destroy(&sb);
		return ret;
	}
	*len = sb.size;
	*out = msgpack_sbuffer_release(&sb);
	return 0;
}

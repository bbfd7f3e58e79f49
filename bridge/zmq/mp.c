/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "mp.h"

struct mp_scan {
	const uint8_t *p;
	size_t len;
	size_t pos;
	size_t objects;
	size_t max_objects;
	unsigned int max_depth;
	const char *reason;
};

static int scan_fail(struct mp_scan *s, const char *why)
{
	s->reason = why;
	return -EBADMSG;
}

/* Read a big-endian length of n bytes (1, 2 or 4) at the cursor. */
static int scan_be(struct mp_scan *s, unsigned int n, uint32_t *out)
{
	uint32_t v = 0;
	unsigned int i;

	if (s->len - s->pos < n)
		return scan_fail(s, "truncated msgpack header");
	for (i = 0; i < n; i++)
		v = (v << 8) | s->p[s->pos + i];
	s->pos += n;
	*out = v;
	return 0;
}

static int scan_skip(struct mp_scan *s, uint64_t n)
{
	if (n > s->len - s->pos)
		return scan_fail(s, "msgpack length past end of message");
	s->pos += n;
	return 0;
}

static int scan_one(struct mp_scan *s, unsigned int depth);

static int scan_children(struct mp_scan *s, uint64_t n, unsigned int depth)
{
	uint64_t i;
	int ret;

	if (depth >= s->max_depth)
		return scan_fail(s, "msgpack nested too deep");
	/* Each child takes at least one byte: a count beyond that is a lie. */
	if (n > s->len - s->pos)
		return scan_fail(s, "msgpack count past end of message");
	for (i = 0; i < n; i++) {
		ret = scan_one(s, depth + 1);
		if (ret)
			return ret;
	}
	return 0;
}

static int scan_one(struct mp_scan *s, unsigned int depth)
{
	uint32_t n;
	uint8_t b;
	int ret;

	if (s->pos >= s->len)
		return scan_fail(s, "truncated msgpack");
	if (++s->objects > s->max_objects)
		return scan_fail(s, "too many msgpack objects");
	b = s->p[s->pos++];

	if (b <= 0x7f || b >= 0xe0) /* fixints */
		return 0;
	if (b <= 0x8f)
		return scan_children(s, 2ull * (b & 0x0f), depth);
	if (b <= 0x9f)
		return scan_children(s, b & 0x0f, depth);
	if (b <= 0xbf)
		return scan_skip(s, b & 0x1f);

	switch (b) {
	case 0xc0: /* nil */
	case 0xc2: /* false */
	case 0xc3: /* true */
		return 0;
	case 0xc4: /* bin 8/16/32 */
	case 0xd9: /* str 8/16/32 */
		ret = scan_be(s, 1, &n);
		return ret ? ret : scan_skip(s, n);
	case 0xc5:
	case 0xda:
		ret = scan_be(s, 2, &n);
		return ret ? ret : scan_skip(s, n);
	case 0xc6:
	case 0xdb:
		ret = scan_be(s, 4, &n);
		return ret ? ret : scan_skip(s, n);
	case 0xc7: /* ext 8/16/32: length, type byte, data */
		ret = scan_be(s, 1, &n);
		return ret ? ret : scan_skip(s, 1ull + n);
	case 0xc8:
		ret = scan_be(s, 2, &n);
		return ret ? ret : scan_skip(s, 1ull + n);
	case 0xc9:
		ret = scan_be(s, 4, &n);
		return ret ? ret : scan_skip(s, 1ull + n);
	case 0xca: /* float32 */
		return scan_skip(s, 4);
	case 0xcb: /* float64 */
		return scan_skip(s, 8);
	case 0xcc: /* uint 8..64 */
	case 0xd0: /* int 8..64 */
		return scan_skip(s, 1);
	case 0xcd:
	case 0xd1:
		return scan_skip(s, 2);
	case 0xce:
	case 0xd2:
		return scan_skip(s, 4);
	case 0xcf:
	case 0xd3:
		return scan_skip(s, 8);
	case 0xd4: /* fixext 1, 2, 4, 8, 16 (+ type byte) */
		return scan_skip(s, 2);
	case 0xd5:
		return scan_skip(s, 3);
	case 0xd6:
		return scan_skip(s, 5);
	case 0xd7:
		return scan_skip(s, 9);
	case 0xd8:
		return scan_skip(s, 17);
	case 0xdc: /* array 16/32 */
		ret = scan_be(s, 2, &n);
		return ret ? ret : scan_children(s, n, depth);
	case 0xdd:
		ret = scan_be(s, 4, &n);
		return ret ? ret : scan_children(s, n, depth);
	case 0xde: /* map 16/32 */
		ret = scan_be(s, 2, &n);
		return ret ? ret : scan_children(s, 2ull * n, depth);
	case 0xdf:
		ret = scan_be(s, 4, &n);
		return ret ? ret : scan_children(s, 2ull * n, depth);
	default: /* 0xc1: never used */
		return scan_fail(s, "invalid msgpack byte 0xc1");
	}
}

int _kvb_mp_scan(const void *buf, size_t len, unsigned int max_depth,
		 size_t max_objects, const char **reason)
{
	struct mp_scan s = {
		.p = buf,
		.len = len,
		.max_objects = max_objects,
		.max_depth = max_depth,
	};
	int ret;

	ret = scan_one(&s, 0);
	if (!ret && s.pos != len)
		ret = scan_fail(&s, "trailing bytes after msgpack object");
	if (ret && reason)
		*reason = s.reason;
	return ret;
}

int _kvb_mp_unpack(msgpack_unpacked *up, const void *buf, size_t len,
		   unsigned int max_depth, size_t max_objects,
		   const char **reason)
{
	msgpack_unpack_return r;
	size_t off = 0;
	int ret;

	ret = _kvb_mp_scan(buf, len, max_depth, max_objects, reason);
	if (ret)
		return ret;
	msgpack_unpacked_init(up);
	r = msgpack_unpack_next(up, buf, len, &off);
	if (r == MSGPACK_UNPACK_SUCCESS && off == len)
		return 0;
	msgpack_unpacked_destroy(up);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
		if (reason)
			*reason = "out of memory unpacking msgpack";
		return -ENOMEM;
	}
	/* The scan accepted it, so msgpack-c disagreeing is a bug; refuse. */
	if (reason)
		*reason = "msgpack unpack failed";
	return -EBADMSG;
}

bool _kvb_mp_utf8_valid(const uint8_t *s, size_t len)
{
	size_t i = 0;

	while (i < len) {
		uint8_t c = s[i];
		uint8_t lo = 0x80, hi = 0xbf;
		size_t n, k;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			n = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 2;
			if (c == 0xe0)
				lo = 0xa0; /* overlong */
			else if (c == 0xed)
				hi = 0x9f; /* surrogates */
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 3;
			if (c == 0xf0)
				lo = 0x90; /* overlong */
			else if (c == 0xf4)
				hi = 0x8f; /* > U+10FFFF */
		} else {
			return false;
		}
		if (len - i - 1 < n)
			return false;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return false;
		for (k = 2; k <= n; k++)
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
		i += n + 1;
	}
	return true;
}

static bool str_eq(const msgpack_object *o, const char *s, size_t len)
{
	/* msgpack-c gives an empty str a NULL ptr, and memcmp(NULL, s, 0) is
	 * undefined (two "" keys reach here as ptr NULL, s NULL) */
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == len &&
	       (len == 0 || memcmp(o->via.str.ptr, s, len) == 0);
}

bool _kvb_mp_str_eq(const msgpack_object *o, const char *s)
{
	return str_eq(o, s, strlen(s));
}

int _kvb_mp_map_check(const msgpack_object *map, uint32_t max_entries,
		      const char **reason)
{
	const msgpack_object_kv *kv;
	uint32_t i, j;

	if (map->type != MSGPACK_OBJECT_MAP) {
		*reason = "not a msgpack map";
		return -EBADMSG;
	}
	if (map->via.map.size > max_entries) {
		*reason = "too many fields in map";
		return -EBADMSG;
	}
	kv = map->via.map.ptr;
	for (i = 0; i < map->via.map.size; i++) {
		if (kv[i].key.type != MSGPACK_OBJECT_STR) {
			*reason = "map key is not a string";
			return -EBADMSG;
		}
		for (j = 0; j < i; j++) {
			if (str_eq(&kv[j].key, kv[i].key.via.str.ptr,
				   kv[i].key.via.str.size)) {
				*reason = "duplicate key in map";
				return -EBADMSG;
			}
		}
	}
	return 0;
}

const msgpack_object *_kvb_mp_map_get(const msgpack_object *map,
				      const char *key)
{
	size_t klen = strlen(key);
	uint32_t i;

	for (i = 0; i < map->via.map.size; i++)
		if (str_eq(&map->via.map.ptr[i].key, key, klen))
			return &map->via.map.ptr[i].val;
	return NULL;
}

int _kvb_mp_ident_check(const uint8_t *s, size_t len, size_t max)
{
	size_t i;

	if (len == 0 || len > max)
		return -EBADMSG;
	for (i = 0; i < len; i++)
		if (s[i] < 0x20 || s[i] == 0x7f)
			return -EBADMSG;
	return _kvb_mp_utf8_valid(s, len) ? 0 : -EBADMSG;
}

int _kvb_mp_get_ident(const msgpack_object *o, char *out, size_t max)
{
	int ret;

	if (o->type != MSGPACK_OBJECT_STR)
		return -EBADMSG;
	ret = _kvb_mp_ident_check((const uint8_t *) o->via.str.ptr,
				  o->via.str.size, max);
	if (ret)
		return ret;
	memcpy(out, o->via.str.ptr, o->via.str.size);
	out[o->via.str.size] = '\0';
	return 0;
}

int _kvb_mp_get_int(const msgpack_object *o, int64_t min, int64_t max,
		    int64_t *out)
{
	int64_t v;

	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (o->via.u64 > (uint64_t) INT64_MAX)
			return -ERANGE;
		v = (int64_t) o->via.u64;
	} else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		v = o->via.i64;
	} else {
		return -EBADMSG;
	}
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int _kvb_mp_pack_cstr(msgpack_packer *pk, const char *s)
{
	size_t len = strlen(s);

	if (msgpack_pack_str_with_body(pk, s, len))
		return -ENOMEM;
	return 0;
}

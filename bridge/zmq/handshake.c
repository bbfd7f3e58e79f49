/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mp.h"
#include "zmq/handshake.h"

#define HS_MAGIC	 "engine"
#define HS_REGIONS_TOTAL 65536
/* Depth is checked by the typed walk; the scan only keeps msgpack-c sane. */
#define HS_SCAN_DEPTH 16
/* a region: 14 keys and values, its map, "rkeys"' array and entries */
#define HS_REGION_OBJECTS (14u * 2 + 2 + KVB_NIC_MAX)
#define HS_MAX_OBJECTS \
	(HS_REGIONS_TOTAL * HS_REGION_OBJECTS + KVB_HS_WORKERS_MAX * 16u + 256u)
#define HS_MAX_FIELDS 32

static int bad(const char **reason, const char *why)
{
	if (reason)
		*reason = why;
	return -EBADMSG;
}

void kvb_hs_fini(struct kvb_hs_desc *d)
{
	uint32_t i;

	for (i = 0; i < d->ntransports && i < KVB_HS_TRANSPORT_MAX; i++)
		free(d->transports[i].conn);
	if (d->workers)
		for (i = 0; i < d->nworkers; i++)
			free(d->workers[i].regions);
	free(d->workers);
	memset(d, 0, sizeof(*d));
}

static const char *layout_name(uint32_t layout)
{
	if (layout == KVB_KV_LAYOUT_PACKED)
		return "packed";
	return layout == KVB_KV_LAYOUT_BLOCK_FIRST ? "block_first" : "kv_first";
}

/* Required unsigned field of a checked map. */
static int get_u(const msgpack_object *map, const char *key, uint64_t max,
		 uint64_t *out, const char **reason, const char *why)
{
	const msgpack_object *o = _kvb_mp_map_get(map, key);

	if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    o->via.u64 > max)
		return bad(reason, why);
	*out = o->via.u64;
	return 0;
}

static int region_check(const struct kvb_hs_region *r)
{
	if (kvb_kv_geom_check(&r->geom))
		return -EINVAL;
	if (r->size < kvb_kv_region_len(&r->geom))
		return -EINVAL;
	if (r->addr && r->addr + r->size < r->addr)
		return -EINVAL;
	if (r->nrkeys > KVB_NIC_MAX || (r->nrkeys && r->nic >= r->nrkeys) ||
	    (!r->nrkeys && r->nic))
		return -EINVAL;
	return 0;
}

/* Optional "rkeys" (1..KVB_NIC_MAX u32) and "nic" (< their count). */
static int decode_rkeys(struct kvb_hs_region *r, const msgpack_object *map,
			const char **reason)
{
	const msgpack_object *a = _kvb_mp_map_get(map, "rkeys");
	const msgpack_object *nic = _kvb_mp_map_get(map, "nic");
	uint32_t i;

	if (a) {
		if (a->type != MSGPACK_OBJECT_ARRAY || !a->via.array.size ||
		    a->via.array.size > KVB_NIC_MAX)
			return bad(reason, "region rkeys is not an array of "
					   "1 to 8 keys");
		for (i = 0; i < a->via.array.size; i++) {
			const msgpack_object *k = &a->via.array.ptr[i];

			if (k->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    k->via.u64 > UINT32_MAX)
				return bad(reason, "region rkeys entry is not "
						   "a u32");
			r->rkeys[i] = (uint32_t) k->via.u64;
		}
		r->nrkeys = a->via.array.size;
	}
	if (nic) {
		if (nic->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    nic->via.u64 >= r->nrkeys)
			return bad(reason, "region nic is not an index into "
					   "its rkeys");
		r->nic = (uint32_t) nic->via.u64;
	}
	return 0;
}

static int decode_region(struct kvb_hs_region *r, const msgpack_object *map,
			 const char **reason)
{
	const msgpack_object *lay;
	uint64_t v[9];
	int ret;

	ret = _kvb_mp_map_check(map, HS_MAX_FIELDS, reason);
	if (ret)
		return ret;
	if (get_u(map, "id", UINT32_MAX, &v[0], reason, "region id") ||
	    get_u(map, "size", INT64_MAX, &v[1], reason, "region size") ||
	    get_u(map, "num_blocks", UINT32_MAX, &v[2], reason,
		  "region num_blocks") ||
	    get_u(map, "block_size", UINT32_MAX, &v[3], reason,
		  "region block_size") ||
	    get_u(map, "num_heads", UINT32_MAX, &v[4], reason,
		  "region num_heads") ||
	    get_u(map, "head_dim", UINT32_MAX, &v[5], reason,
		  "region head_dim") ||
	    get_u(map, "elem_size", UINT32_MAX, &v[6], reason,
		  "region elem_size") ||
	    get_u(map, "addr", UINT64_MAX, &v[7], reason, "region addr") ||
	    get_u(map, "rkey", UINT32_MAX, &v[8], reason, "region rkey"))
		return -EBADMSG;
	lay = _kvb_mp_map_get(map, "layout");
	if (!lay)
		return bad(reason, "region layout");
	if (_kvb_mp_str_eq(lay, "kv_first"))
		r->geom.layout = KVB_KV_LAYOUT_KV_FIRST;
	else if (_kvb_mp_str_eq(lay, "block_first"))
		r->geom.layout = KVB_KV_LAYOUT_BLOCK_FIRST;
	else if (_kvb_mp_str_eq(lay, "packed"))
		r->geom.layout = KVB_KV_LAYOUT_PACKED;
	else
		return bad(reason, "region layout");
	r->id = (uint32_t) v[0];
	r->size = v[1];
	r->geom.num_blocks = (uint32_t) v[2];
	r->geom.block_size = (uint32_t) v[3];
	r->geom.num_heads = (uint32_t) v[4];
	r->geom.head_dim = (uint32_t) v[5];
	r->geom.elem_size = (uint32_t) v[6];
	r->addr = v[7];
	r->rkey = (uint32_t) v[8];
	{
		const msgpack_object *o = _kvb_mp_map_get(map, "layer");

		if (o && (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			  o->via.u64 > UINT32_MAX))
			return bad(reason, "region layer");
		r->layer = o ? (uint32_t) o->via.u64 : 0;
	}
	ret = decode_rkeys(r, map, reason);
	if (ret)
		return ret;
	if (region_check(r))
		return bad(reason, "region geometry does not fit its size");
	return 0;
}

static int decode_worker(struct kvb_hs_worker *w, const msgpack_object *map,
			 uint64_t *regions_left, const char **reason)
{
	const msgpack_object *role, *regs;
	uint64_t dp, tp, tps;
	uint32_t i, j, n;
	int ret;

	ret = _kvb_mp_map_check(map, HS_MAX_FIELDS, reason);
	if (ret)
		return ret;
	role = _kvb_mp_map_get(map, "role");
	if (role && _kvb_mp_str_eq(role, "P"))
		w->role = KVB_HS_ROLE_P;
	else if (role && _kvb_mp_str_eq(role, "D"))
		w->role = KVB_HS_ROLE_D;
	else
		return bad(reason, "worker role is not \"P\" or \"D\"");
	if (get_u(map, "dp_rank", 65535, &dp, reason, "worker dp_rank") ||
	    get_u(map, "tp_rank", 65535, &tp, reason, "worker tp_rank") ||
	    get_u(map, "tp_size", 65536, &tps, reason, "worker tp_size"))
		return -EBADMSG;
	if (tps == 0 || tp >= tps)
		return bad(reason, "worker tp_rank >= tp_size");
	w->dp_rank = (uint32_t) dp;
	w->tp_rank = (uint32_t) tp;
	w->tp_size = (uint32_t) tps;

	regs = _kvb_mp_map_get(map, "regions");
	if (!regs || regs->type != MSGPACK_OBJECT_ARRAY)
		return bad(reason, "worker regions is not an array");
	n = regs->via.array.size;
	if (n > KVB_HS_REGIONS_MAX || n > *regions_left)
		return bad(reason, "too many regions");
	*regions_left -= n;
	if (n == 0)
		return 0;
	w->regions = calloc(n, sizeof(*w->regions));
	if (!w->regions) {
		if (reason)
			*reason = "out of memory";
		return -ENOMEM;
	}
	w->nregions = n;
	for (i = 0; i < n; i++) {
		ret = decode_region(&w->regions[i], &regs->via.array.ptr[i],
				    reason);
		if (ret)
			return ret;
		/* Few regions per worker: quadratic is fine, n is bounded. */
		for (j = 0; j < i; j++)
			if (w->regions[j].id == w->regions[i].id)
				return bad(reason, "duplicate region id");
	}
	return 0;
}

static int decode_transports(struct kvb_hs_desc *d, const msgpack_object *arr,
			     const char **reason)
{
	const msgpack_object *name, *conn;
	struct kvb_hs_transport *t;
	uint32_t i;
	int ret;

	if (!arr || arr->type != MSGPACK_OBJECT_ARRAY)
		return bad(reason, "transports is not an array");
	if (arr->via.array.size > KVB_HS_TRANSPORT_MAX)
		return bad(reason, "too many transports");
	for (i = 0; i < arr->via.array.size; i++) {
		const msgpack_object *m = &arr->via.array.ptr[i];

		ret = _kvb_mp_map_check(m, HS_MAX_FIELDS, reason);
		if (ret)
			return ret;
		t = &d->transports[i];
		name = _kvb_mp_map_get(m, "name");
		conn = _kvb_mp_map_get(m, "conn");
		if (!name || _kvb_mp_get_ident(name, t->name, KVB_HS_TNAME_MAX))
			return bad(reason, "transport name");
		if (!conn || conn->type != MSGPACK_OBJECT_BIN ||
		    conn->via.bin.size > KVB_HS_CONN_MAX)
			return bad(reason, "transport conn is not a bin "
					   "of at most 4096 bytes");
		d->ntransports = i + 1;
		t->conn_len = conn->via.bin.size;
		if (!t->conn_len)
			continue;
		t->conn = malloc(t->conn_len);
		if (!t->conn) {
			if (reason)
				*reason = "out of memory";
			return -ENOMEM;
		}
		memcpy(t->conn, conn->via.bin.ptr, t->conn_len);
	}
	return 0;
}

static int decode_desc(struct kvb_hs_desc *d, const msgpack_object *top,
		       const char **reason)
{
	const msgpack_object *magic, *ver, *node, *workers;
	uint64_t regions_left = HS_REGIONS_TOTAL;
	uint32_t i, n;
	int ret;

	if (top->type != MSGPACK_OBJECT_MAP)
		return bad(reason, "descriptor is not a msgpack map");
	ret = _kvb_mp_map_check(top, HS_MAX_FIELDS, reason);
	if (ret)
		return ret;
	magic = _kvb_mp_map_get(top, "kvb");
	if (!magic || !_kvb_mp_str_eq(magic, HS_MAGIC))
		return bad(reason, "not a kvbroker engine descriptor");
	ver = _kvb_mp_map_get(top, "version");
	if (!ver || ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    ver->via.u64 > UINT32_MAX)
		return bad(reason, "descriptor version is not an integer");
	d->version = (uint32_t) ver->via.u64;
	if (d->version != KVB_HS_VERSION) {
		if (reason)
			*reason = "peer speaks another handshake version";
		return -EPROTONOSUPPORT;
	}

	node = _kvb_mp_map_get(top, "node_id");
	if (!node || _kvb_mp_get_ident(node, d->node_id, KVB_HS_NODE_ID_MAX))
		return bad(reason, "node_id is not a valid id string");
	{
		const msgpack_object *o = _kvb_mp_map_get(top, "host");
		uint64_t v;

		if (o && _kvb_mp_get_ident(o, d->host, sizeof(d->host) - 1))
			return bad(reason,
				   "host is not a valid address string");
		if (_kvb_mp_map_get(top, "notify_port")) {
			if (get_u(top, "notify_port", 65535, &v, reason,
				  "notify_port"))
				return -EBADMSG;
			d->notify_port = (uint32_t) v;
		}
		if (_kvb_mp_map_get(top, "hs_port")) {
			if (get_u(top, "hs_port", 65535, &v, reason, "hs_port"))
				return -EBADMSG;
			d->hs_port = (uint32_t) v;
		}
		o = _kvb_mp_map_get(top, "kx");
		if (o) {
			if (o->type != MSGPACK_OBJECT_BIN ||
			    o->via.bin.size != KVB_HS_KX_LEN)
				return bad(reason,
					   "kx is not a bin of 32 bytes");
			memcpy(d->kx, o->via.bin.ptr, KVB_HS_KX_LEN);
			d->has_kx = 1;
		}
		if (_kvb_mp_map_get(top, "instance")) {
			if (get_u(top, "instance", UINT64_MAX, &v, reason,
				  "instance"))
				return -EBADMSG;
			d->instance = v;
		}
	}
	ret = decode_transports(d, _kvb_mp_map_get(top, "transports"), reason);
	if (ret)
		return ret;

	workers = _kvb_mp_map_get(top, "workers");
	if (!workers || workers->type != MSGPACK_OBJECT_ARRAY)
		return bad(reason, "workers is not an array");
	n = workers->via.array.size;
	if (n > KVB_HS_WORKERS_MAX)
		return bad(reason, "too many workers");
	if (n == 0)
		return 0;
	d->workers = calloc(n, sizeof(*d->workers));
	if (!d->workers) {
		if (reason)
			*reason = "out of memory";
		return -ENOMEM;
	}
	d->nworkers = n;
	for (i = 0; i < n; i++) {
		ret = decode_worker(&d->workers[i], &workers->via.array.ptr[i],
				    &regions_left, reason);
		if (ret)
			return ret;
	}
	return 0;
}

int kvb_hs_decode(struct kvb_hs_desc *d, const void *buf, size_t len,
		  const char **reason)
{
	msgpack_unpacked up;
	uint32_t version;
	int ret;

	memset(d, 0, sizeof(*d));
	if (len == 0 || len > KVB_HS_BYTES_MAX)
		return bad(reason, "descriptor size out of range");
	ret = _kvb_mp_unpack(&up, buf, len, HS_SCAN_DEPTH, HS_MAX_OBJECTS,
			     reason);
	if (ret)
		return ret;
	ret = decode_desc(d, &up.data, reason);
	msgpack_unpacked_destroy(&up);
	if (ret) {
		version = d->version;
		kvb_hs_fini(d);
		/* Keep the peer's version for the caller's error message. */
		d->version = version;
	}
	return ret;
}

static int validate(const struct kvb_hs_desc *d)
{
	uint64_t total = 0;
	uint32_t i, j, k;

	if (_kvb_mp_ident_check((const uint8_t *) d->node_id,
				strnlen(d->node_id, sizeof(d->node_id)),
				KVB_HS_NODE_ID_MAX))
		return -EINVAL;
	if (d->ntransports > KVB_HS_TRANSPORT_MAX ||
	    d->nworkers > KVB_HS_WORKERS_MAX || (d->nworkers && !d->workers))
		return -EINVAL;
	if (d->host[0] && _kvb_mp_ident_check((const uint8_t *) d->host,
					      strnlen(d->host, sizeof(d->host)),
					      sizeof(d->host) - 1))
		return -EINVAL;
	if (d->notify_port > 65535 || d->hs_port > 65535)
		return -EINVAL;
	for (i = 0; i < d->ntransports; i++) {
		const struct kvb_hs_transport *t = &d->transports[i];

		if (_kvb_mp_ident_check((const uint8_t *) t->name,
					strnlen(t->name, sizeof(t->name)),
					KVB_HS_TNAME_MAX) ||
		    t->conn_len > KVB_HS_CONN_MAX || (t->conn_len && !t->conn))
			return -EINVAL;
	}
	for (i = 0; i < d->nworkers; i++) {
		const struct kvb_hs_worker *w = &d->workers[i];

		if ((w->role != KVB_HS_ROLE_P && w->role != KVB_HS_ROLE_D) ||
		    w->dp_rank > 65535 || w->tp_size == 0 ||
		    w->tp_size > 65536 || w->tp_rank >= w->tp_size ||
		    w->nregions > KVB_HS_REGIONS_MAX ||
		    (w->nregions && !w->regions))
			return -EINVAL;
		total += w->nregions;
		for (j = 0; j < w->nregions; j++) {
			if (region_check(&w->regions[j]))
				return -EINVAL;
			for (k = 0; k < j; k++)
				if (w->regions[k].id == w->regions[j].id)
					return -EINVAL;
		}
	}
	return total > HS_REGIONS_TOTAL ? -EINVAL : 0;
}

static int pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t v)
{
	return _kvb_mp_pack_cstr(pk, key) | msgpack_pack_uint64(pk, v);
}

static int pack_region(msgpack_packer *pk, const struct kvb_hs_region *r)
{
	int e = 0;

	e |= msgpack_pack_map(pk, r->nrkeys ? 13 : 11);
	e |= pack_kv_u64(pk, "id", r->id);
	e |= pack_kv_u64(pk, "layer", r->layer);
	e |= pack_kv_u64(pk, "size", r->size);
	e |= _kvb_mp_pack_cstr(pk, "layout");
	e |= _kvb_mp_pack_cstr(pk, layout_name(r->geom.layout));
	e |= pack_kv_u64(pk, "num_blocks", r->geom.num_blocks);
	e |= pack_kv_u64(pk, "block_size", r->geom.block_size);
	e |= pack_kv_u64(pk, "num_heads", r->geom.num_heads);
	e |= pack_kv_u64(pk, "head_dim", r->geom.head_dim);
	e |= pack_kv_u64(pk, "elem_size", r->geom.elem_size);
	e |= pack_kv_u64(pk, "addr", r->addr);
	e |= pack_kv_u64(pk, "rkey", r->rkey);
	if (r->nrkeys) {
		e |= _kvb_mp_pack_cstr(pk, "rkeys");
		e |= msgpack_pack_array(pk, r->nrkeys);
		for (uint32_t i = 0; i < r->nrkeys; i++)
			e |= msgpack_pack_uint32(pk, r->rkeys[i]);
		e |= pack_kv_u64(pk, "nic", r->nic);
	}
	return e;
}

static int pack_desc(msgpack_packer *pk, const struct kvb_hs_desc *d)
{
	uint32_t i, j;
	int e = 0;

	e |= msgpack_pack_map(pk, 8 + !!d->host[0] + !!d->has_kx);
	e |= _kvb_mp_pack_cstr(pk, "kvb");
	e |= _kvb_mp_pack_cstr(pk, HS_MAGIC);
	e |= pack_kv_u64(pk, "version", KVB_HS_VERSION);
	e |= _kvb_mp_pack_cstr(pk, "node_id");
	e |= _kvb_mp_pack_cstr(pk, d->node_id);
	if (d->host[0]) {
		e |= _kvb_mp_pack_cstr(pk, "host");
		e |= _kvb_mp_pack_cstr(pk, d->host);
	}
	e |= pack_kv_u64(pk, "notify_port", d->notify_port);
	e |= pack_kv_u64(pk, "hs_port", d->hs_port);
	e |= pack_kv_u64(pk, "instance", d->instance);
	if (d->has_kx) {
		e |= _kvb_mp_pack_cstr(pk, "kx");
		e |= msgpack_pack_bin_with_body(pk, d->kx, KVB_HS_KX_LEN);
	}
	e |= _kvb_mp_pack_cstr(pk, "transports");
	e |= msgpack_pack_array(pk, d->ntransports);
	for (i = 0; i < d->ntransports; i++) {
		const struct kvb_hs_transport *t = &d->transports[i];

		e |= msgpack_pack_map(pk, 2);
		e |= _kvb_mp_pack_cstr(pk, "name");
		e |= _kvb_mp_pack_cstr(pk, t->name);
		e |= _kvb_mp_pack_cstr(pk, "conn");
		if (t->conn_len)
			e |= msgpack_pack_bin_with_body(pk, t->conn,
							t->conn_len);
		else
			e |= msgpack_pack_bin(pk, 0);
	}
	e |= _kvb_mp_pack_cstr(pk, "workers");
	e |= msgpack_pack_array(pk, d->nworkers);
	for (i = 0; i < d->nworkers; i++) {
		const struct kvb_hs_worker *w = &d->workers[i];

		e |= msgpack_pack_map(pk, 5);
		e |= _kvb_mp_pack_cstr(pk, "role");
		e |= _kvb_mp_pack_cstr(pk,
				       w->role == KVB_HS_ROLE_P ? "P" : "D");
		e |= pack_kv_u64(pk, "dp_rank", w->dp_rank);
		e |= pack_kv_u64(pk, "tp_rank", w->tp_rank);
		e |= pack_kv_u64(pk, "tp_size", w->tp_size);
		e |= _kvb_mp_pack_cstr(pk, "regions");
		e |= msgpack_pack_array(pk, w->nregions);
		for (j = 0; j < w->nregions; j++)
			e |= pack_region(pk, &w->regions[j]);
	}
	return e ? -ENOMEM : 0;
}

int kvb_hs_encode(const struct kvb_hs_desc *d, char **out, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int ret;

	ret = validate(d);
	if (ret)
		return ret;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	ret = pack_desc(&pk, d);
	if (!ret && sb.size > KVB_HS_BYTES_MAX)
		ret = -EINVAL;
	if (ret) {
		msgpack_sbuffer_destroy(&sb);
		return ret;
	}
	*len = sb.size;
	*out = msgpack_sbuffer_release(&sb);
	return 0;
}

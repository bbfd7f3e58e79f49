/* SPDX-License-Identifier: MIT */
/* Unit tests of bridge/zmq/handshake: the engine descriptor codec. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "zmq/handshake.h"

static struct kvb_hs_region regions[2][3];
static struct kvb_hs_worker workers[2];
static uint8_t qp_blob[64];

static void make_desc(struct kvb_hs_desc *d)
{
	int w, r;

	memset(d, 0, sizeof(*d));
	strcpy(d->node_id, "node-a/10.0.0.1");
	d->ntransports = 2;
	strcpy(d->transports[0].name, "tcp");
	d->transports[0].conn = (uint8_t *) "10.0.0.1:7000";
	d->transports[0].conn_len = 13;
	strcpy(d->transports[1].name, "rdma");
	memset(qp_blob, 0xab, sizeof(qp_blob));
	d->transports[1].conn = qp_blob;
	d->transports[1].conn_len = sizeof(qp_blob);
	d->nworkers = 2;
	d->workers = workers;
	for (w = 0; w < 2; w++) {
		workers[w] = (struct kvb_hs_worker){
			.role = KVB_HS_ROLE_D,
			.dp_rank = 1,
			.tp_rank = (uint32_t) w,
			.tp_size = 2,
			.nregions = 3,
			.regions = regions[w],
		};
		for (r = 0; r < 3; r++) {
			struct kvb_hs_region *g = &regions[w][r];

			memset(g, 0, sizeof(*g));
			g->id = (uint32_t) (r + 1);
			g->geom = (struct kvb_kv_geom){
				.layout = (uint32_t) (r == 2),
				.num_blocks = 1000,
				.block_size = 16,
				.num_heads = 4,
				.head_dim = 128,
				.elem_size = 2,
			};
			g->size = kvb_kv_region_len(&g->geom) + (uint64_t) r;
			g->addr = 0x7f0000000000ull + (uint64_t) r * g->size;
			g->rkey = 0x1000u + (uint32_t) r;
		}
	}
}

static void test_roundtrip(void **state)
{
	struct kvb_hs_desc d, e;
	const char *why = NULL;
	size_t len;
	char *buf;
	int w, r;

	make_desc(&d);
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), 0);
	assert_int_equal(kvb_hs_decode(&e, buf, len, &why), 0);
	assert_int_equal(e.version, KVB_HS_VERSION);
	assert_string_equal(e.node_id, d.node_id);
	assert_int_equal(e.ntransports, 2);
	assert_string_equal(e.transports[1].name, "rdma");
	assert_int_equal(e.transports[1].conn_len, sizeof(qp_blob));
	assert_memory_equal(e.transports[1].conn, qp_blob, sizeof(qp_blob));
	assert_int_equal(e.nworkers, 2);
	for (w = 0; w < 2; w++) {
		assert_int_equal(e.workers[w].role, KVB_HS_ROLE_D);
		assert_int_equal(e.workers[w].dp_rank, 1);
		assert_int_equal(e.workers[w].tp_rank, w);
		assert_int_equal(e.workers[w].tp_size, 2);
		assert_int_equal(e.workers[w].nregions, 3);
		for (r = 0; r < 3; r++)
			assert_memory_equal(&e.workers[w].regions[r],
					    &regions[w][r],
					    sizeof(struct kvb_hs_region));
	}
	kvb_hs_fini(&e);
	free(buf);

	/* empty blob, no workers */
	make_desc(&d);
	d.transports[0].conn = NULL;
	d.transports[0].conn_len = 0;
	d.nworkers = 0;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), 0);
	assert_int_equal(kvb_hs_decode(&e, buf, len, &why), 0);
	assert_int_equal(e.transports[0].conn_len, 0);
	assert_int_equal(e.nworkers, 0);
	kvb_hs_fini(&e);
	free(buf);
}

/* Several NICs: regions carry a key per NIC and the nearest one. */
static void test_rkeys_roundtrip(void **state)
{
	struct kvb_hs_desc d, e;
	const char *why = NULL;
	struct kvb_hs_region *g;
	size_t len;
	char *buf;

	make_desc(&d);
	g = &regions[0][1];
	g->nrkeys = KVB_NIC_MAX;
	for (uint32_t i = 0; i < KVB_NIC_MAX; i++)
		g->rkeys[i] = 0xfffffff0u + i;
	g->nic = KVB_NIC_MAX - 1;
	g->rkey = g->rkeys[g->nic];
	g = &regions[1][2];
	g->nrkeys = 2;
	g->rkeys[0] = 7;
	g->rkeys[1] = 9;
	g->nic = 0;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), 0);
	assert_int_equal(kvb_hs_decode(&e, buf, len, &why), 0);
	for (int w = 0; w < 2; w++)
		for (int r = 0; r < 3; r++)
			assert_memory_equal(&e.workers[w].regions[r],
					    &regions[w][r],
					    sizeof(struct kvb_hs_region));
	/* absent: one NIC, the plain rkey */
	assert_int_equal(e.workers[0].regions[0].nrkeys, 0);
	assert_int_equal(e.workers[0].regions[0].nic, 0);
	assert_int_equal(e.workers[0].regions[0].rkey, 0x1000u);
	assert_int_equal(e.workers[0].regions[1].nrkeys, KVB_NIC_MAX);
	assert_int_equal(e.workers[0].regions[1].nic, KVB_NIC_MAX - 1);
	assert_int_equal(e.workers[0].regions[1].rkeys[KVB_NIC_MAX - 1],
			 0xfffffff7u);
	kvb_hs_fini(&e);
	free(buf);
}

static void test_rkeys_encode_refuses(void **state)
{
	struct kvb_hs_desc d;
	size_t len;
	char *buf = NULL;

	make_desc(&d);
	regions[0][0].nrkeys = KVB_NIC_MAX + 1;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	regions[0][0].nrkeys = 2;
	regions[0][0].nic = 2;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	regions[0][0].nic = 1; /* no rkeys, a nic */
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	assert_null(buf);
}

/* What follows "rkey" in the one region of a hand-made descriptor. */
enum extra {
	X_NONE,
	X_UNKNOWN,     /* a key no decoder knows */
	X_RKEYS_9,     /* KVB_NIC_MAX + 1 keys */
	X_RKEYS_EMPTY, /* [] */
	X_RKEYS_MAP,   /* not an array */
	X_RKEYS_STR,   /* an entry is a str */
	X_RKEYS_NEG,   /* an entry is negative */
	X_RKEYS_BIG,   /* an entry > UINT32_MAX */
	X_NIC_OUT,     /* rkeys [1, 2], nic 2 */
	X_NIC_ALONE,   /* nic 0 without rkeys */
	X_NIC_STR,     /* rkeys [1], nic "0" */
	X_OK,	       /* rkeys [5, 6, 7], nic 1 */
};

static void pack_s(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pack_su(msgpack_packer *pk, const char *k, uint64_t v)
{
	pack_s(pk, k);
	msgpack_pack_uint64(pk, v);
}

static void pack_extra(msgpack_packer *pk, enum extra x)
{
	switch (x) {
	case X_NONE:
		break;
	case X_UNKNOWN:
		pack_s(pk, "future");
		msgpack_pack_array(pk, 1);
		msgpack_pack_true(pk);
		break;
	case X_RKEYS_9:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, KVB_NIC_MAX + 1);
		for (int i = 0; i <= KVB_NIC_MAX; i++)
			msgpack_pack_uint32(pk, (uint32_t) i);
		break;
	case X_RKEYS_EMPTY:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 0);
		break;
	case X_RKEYS_MAP:
		pack_s(pk, "rkeys");
		msgpack_pack_map(pk, 0);
		break;
	case X_RKEYS_STR:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint32(pk, 1);
		pack_s(pk, "2");
		break;
	case X_RKEYS_NEG:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 1);
		msgpack_pack_int(pk, -1);
		break;
	case X_RKEYS_BIG:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 1);
		msgpack_pack_uint64(pk, 1ull << 32);
		break;
	case X_NIC_OUT:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint32(pk, 1);
		msgpack_pack_uint32(pk, 2);
		pack_su(pk, "nic", 2);
		break;
	case X_NIC_ALONE:
		pack_su(pk, "nic", 0);
		break;
	case X_NIC_STR:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 1);
		msgpack_pack_uint32(pk, 1);
		pack_s(pk, "nic");
		pack_s(pk, "0");
		break;
	case X_OK:
		pack_s(pk, "rkeys");
		msgpack_pack_array(pk, 3);
		msgpack_pack_uint32(pk, 5);
		msgpack_pack_uint32(pk, 6);
		msgpack_pack_uint32(pk, 7);
		pack_su(pk, "nic", 1);
		break;
	}
}

static const int extra_keys[] = {
	[X_NONE] = 0,	     [X_UNKNOWN] = 1,	[X_RKEYS_9] = 1,
	[X_RKEYS_EMPTY] = 1, [X_RKEYS_MAP] = 1, [X_RKEYS_STR] = 1,
	[X_RKEYS_NEG] = 1,   [X_RKEYS_BIG] = 1, [X_NIC_OUT] = 2,
	[X_NIC_ALONE] = 1,   [X_NIC_STR] = 2,	[X_OK] = 2,
};

/* A version-1 descriptor, one D worker with one region, by hand. */
static void region_msg(msgpack_sbuffer *sb, enum extra x)
{
	msgpack_packer pk;

	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 5);
	pack_s(&pk, "kvb");
	pack_s(&pk, "engine");
	pack_su(&pk, "version", 1);
	pack_s(&pk, "node_id");
	pack_s(&pk, "n1");
	pack_s(&pk, "transports");
	msgpack_pack_array(&pk, 0);
	pack_s(&pk, "workers");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_map(&pk, 5);
	pack_s(&pk, "role");
	pack_s(&pk, "D");
	pack_su(&pk, "dp_rank", 0);
	pack_su(&pk, "tp_rank", 0);
	pack_su(&pk, "tp_size", 1);
	pack_s(&pk, "regions");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_map(&pk, (size_t) (10 + extra_keys[x]));
	pack_su(&pk, "id", 3);
	pack_su(&pk, "size", 4096);
	pack_s(&pk, "layout");
	pack_s(&pk, "kv_first");
	pack_su(&pk, "num_blocks", 1);
	pack_su(&pk, "block_size", 1);
	pack_su(&pk, "num_heads", 1);
	pack_su(&pk, "head_dim", 1);
	pack_su(&pk, "elem_size", 2);
	pack_su(&pk, "addr", 0x10000);
	pack_su(&pk, "rkey", 0x42);
	pack_extra(&pk, x);
}

static void test_rkeys_decode(void **state)
{
	static const struct {
		enum extra x;
		const char *why; /* NULL: accepted */
	} cases[] = {
		{X_NONE, NULL},
		{X_UNKNOWN, NULL},
		{X_OK, NULL},
		{X_RKEYS_9, "rkeys"},
		{X_RKEYS_EMPTY, "rkeys"},
		{X_RKEYS_MAP, "rkeys"},
		{X_RKEYS_STR, "rkeys entry"},
		{X_RKEYS_NEG, "rkeys entry"},
		{X_RKEYS_BIG, "rkeys entry"},
		{X_NIC_OUT, "nic"},
		{X_NIC_ALONE, "nic"},
		{X_NIC_STR, "nic"},
	};
	struct kvb_hs_desc e;
	msgpack_sbuffer sb;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *why = NULL;
		int ret;

		region_msg(&sb, cases[i].x);
		ret = kvb_hs_decode(&e, sb.data, sb.size, &why);
		msgpack_sbuffer_destroy(&sb);
		if (!cases[i].why) {
			const struct kvb_hs_region *r;

			assert_int_equal(ret, 0);
			r = &e.workers[0].regions[0];
			assert_int_equal(r->rkey, 0x42);
			if (cases[i].x == X_OK) {
				assert_int_equal(r->nrkeys, 3);
				assert_int_equal(r->rkeys[0], 5);
				assert_int_equal(r->rkeys[2], 7);
				assert_int_equal(r->nic, 1);
			} else {
				assert_int_equal(r->nrkeys, 0);
				assert_int_equal(r->nic, 0);
			}
			kvb_hs_fini(&e);
			continue;
		}
		assert_int_equal(ret, -EBADMSG);
		assert_non_null(why);
		assert_non_null(strstr(why, cases[i].why));
		assert_int_equal(e.nworkers, 0);
	}
}

/* A descriptor map with the given magic and version, nothing else. */
static void version_msg(msgpack_sbuffer *sb, const char *magic, int ver)
{
	msgpack_packer pk;

	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	msgpack_pack_str_with_body(&pk, "kvb", 3);
	msgpack_pack_str_with_body(&pk, magic, strlen(magic));
	msgpack_pack_str_with_body(&pk, "version", 7);
	msgpack_pack_int(&pk, ver);
	/* v2 may carry anything */
	msgpack_pack_str_with_body(&pk, "future", 6);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_true(&pk);
}

static void test_version(void **state)
{
	struct kvb_hs_desc e;
	msgpack_sbuffer sb;
	const char *why = NULL;

	version_msg(&sb, "engine", 2);
	assert_int_equal(kvb_hs_decode(&e, sb.data, sb.size, &why),
			 -EPROTONOSUPPORT);
	assert_int_equal(e.version, 2);
	assert_non_null(strstr(why, "version"));
	msgpack_sbuffer_destroy(&sb);

	version_msg(&sb, "engine", 0);
	assert_int_equal(kvb_hs_decode(&e, sb.data, sb.size, &why),
			 -EPROTONOSUPPORT);
	msgpack_sbuffer_destroy(&sb);

	version_msg(&sb, "engine", -1);
	assert_int_equal(kvb_hs_decode(&e, sb.data, sb.size, &why), -EBADMSG);
	msgpack_sbuffer_destroy(&sb);

	version_msg(&sb, "other", 1);
	assert_int_equal(kvb_hs_decode(&e, sb.data, sb.size, &why), -EBADMSG);
	msgpack_sbuffer_destroy(&sb);

	/* right version, missing everything else */
	version_msg(&sb, "engine", 1);
	assert_int_equal(kvb_hs_decode(&e, sb.data, sb.size, &why), -EBADMSG);
	msgpack_sbuffer_destroy(&sb);
}

static void test_encode_refuses(void **state)
{
	struct kvb_hs_desc d;
	size_t len;
	char *buf;

	make_desc(&d);
	regions[0][1].size = 10; /* geometry does not fit */
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	regions[1][2].id = regions[1][0].id;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	workers[0].tp_rank = 2;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	workers[1].role = 0;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	d.node_id[0] = '\0';
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	d.transports[0].conn_len = KVB_HS_CONN_MAX + 1;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
	make_desc(&d);
	regions[0][0].geom.elem_size = 0;
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), -EINVAL);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static void test_fuzz(void **state)
{
	struct kvb_hs_desc d, e;
	const char *why;
	uint8_t *mut;
	size_t len, n;
	int i, ok = 0, ret;
	char *buf, *re;

	make_desc(&d);
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), 0);
	mut = malloc(len + 8);
	assert_non_null(mut);
	for (i = 0; i < 50000; i++) {
		n = len;
		memcpy(mut, buf, len);
		switch (rnd() % 3) {
		case 0:
			mut[rnd() % n] = (uint8_t) rnd();
			break;
		case 1:
			mut[rnd() % n] ^= (uint8_t) (1u << (rnd() % 8));
			break;
		default:
			n = rnd() % len;
			break;
		}
		why = NULL;
		ret = kvb_hs_decode(&e, mut, n, &why);
		if (ret) {
			assert_true(ret == -EBADMSG || ret == -EPROTONOSUPPORT);
			assert_non_null(why);
			continue;
		}
		/* accepted: it re-encodes */
		ok++;
		assert_int_equal(kvb_hs_encode(&e, &re, &n), 0);
		free(re);
		kvb_hs_fini(&e);
	}
	assert_true(ok > 100);
	free(mut);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_encode_refuses),
		cmocka_unit_test(test_fuzz),
		cmocka_unit_test(test_rkeys_roundtrip),
		cmocka_unit_test(test_rkeys_encode_refuses),
		cmocka_unit_test(test_rkeys_decode),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/* Unit tests of bridge/zmq/codec: MoRIIO notify messages. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "zmq/codec.h"

/* A msgpack builder for hand-made (often broken) messages. */
struct mb {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void mb_init(struct mb *b)
{
	msgpack_sbuffer_init(&b->sb);
	msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void mb_fini(struct mb *b)
{
	msgpack_sbuffer_destroy(&b->sb);
}

static void mb_str(struct mb *b, const char *s)
{
	msgpack_pack_str_with_body(&b->pk, s, strlen(s));
}

static void mb_kv_str(struct mb *b, const char *k, const char *v)
{
	mb_str(b, k);
	mb_str(b, v);
}

static void mb_raw(struct mb *b, const void *p, size_t n)
{
	msgpack_sbuffer_write(&b->sb, p, n);
}

static int dec(const void *p, size_t n, struct kvb_zmsg *m, const char **why)
{
	*why = NULL;
	return kvb_zmsg_decode(m, p, n, why);
}

/* Decode b and expect ret; the reason must be set on failure. */
static void expect(struct mb *b, int want)
{
	struct kvb_zmsg m;
	const char *why;
	int ret;

	ret = dec(b->sb.data, b->sb.size, &m, &why);
	if (ret != want)
		print_error("got %d (%s), want %d\n", ret, why ? why : "-",
			    want);
	assert_int_equal(ret, want);
	if (ret)
		assert_non_null(why);
	kvb_zmsg_fini(&m);
	mb_fini(b);
}

static void expect_raw(const void *p, size_t n, int want)
{
	struct mb b;

	mb_init(&b);
	mb_raw(&b, p, n);
	expect(&b, want);
}

/* {type, transfer_id, req_id, block_notify_list, decode_rank} by hand. */
static void mb_remote_blocks(struct mb *b, bool typed, const int64_t *ids,
			     size_t n, int64_t rank)
{
	size_t i;

	mb_init(b);
	msgpack_pack_map(&b->pk, typed ? 5 : 4);
	if (typed)
		mb_kv_str(b, "type", "remote_blocks");
	mb_kv_str(b, "transfer_id", "tx-1");
	mb_kv_str(b, "req_id", "cmpl-7");
	mb_str(b, "block_notify_list");
	msgpack_pack_array(&b->pk, n);
	for (i = 0; i < n; i++)
		msgpack_pack_int64(&b->pk, ids[i]);
	mb_str(b, "decode_rank");
	msgpack_pack_int64(&b->pk, rank);
}

static void test_remote_blocks_typed(void **state)
{
	const int64_t ids[] = {3, 4, 5, 100000};
	struct kvb_zmsg m;
	const char *why;
	struct mb b;

	mb_remote_blocks(&b, true, ids, 4, 1);
	assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why), 0);
	assert_int_equal(m.type, KVB_ZMSG_REMOTE_BLOCKS);
	assert_false(m.flags & KVB_ZMSG_F_UNTYPED);
	assert_string_equal(m.transfer_id, "tx-1");
	assert_string_equal(m.req_id, "cmpl-7");
	assert_int_equal(m.nblocks, 4);
	assert_int_equal(m.blocks[0], 3);
	assert_int_equal(m.blocks[3], 100000);
	assert_int_equal(m.decode_rank, 1);
	kvb_zmsg_fini(&m);
	mb_fini(&b);
}

static void test_remote_blocks_untyped(void **state)
{
	const int64_t ids[] = {7};
	struct kvb_zmsg m;
	const char *why;
	struct mb b;

	mb_remote_blocks(&b, false, ids, 1, 0);
	assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why), 0);
	assert_int_equal(m.type, KVB_ZMSG_REMOTE_BLOCKS);
	assert_true(m.flags & KVB_ZMSG_F_UNTYPED);
	assert_int_equal(m.nblocks, 1);
	assert_int_equal(m.blocks[0], 7);
	kvb_zmsg_fini(&m);
	mb_fini(&b);
}

/* Bytes of msgpack.packb({"type": "write_done", "transfer_id": "tx-1"}). */
static const uint8_t py_write_done[] = {
	0x82, 0xa4, 't', 'y', 'p', 'e',	 0xaa, 'w', 'r', 'i', 't', 'e',
	'_',  'd',  'o', 'n', 'e', 0xab, 't',  'r', 'a', 'n', 's', 'f',
	'e',  'r',  '_', 'i', 'd', 0xa4, 't',  'x', '-', '1',
};

static void test_write_done_bytes(void **state)
{
	struct kvb_zmsg m;
	const char *why;
	size_t len;
	char *out;

	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-1"), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(len, sizeof(py_write_done));
	assert_memory_equal(out, py_write_done, len);
	free(out);

	assert_int_equal(dec(py_write_done, sizeof(py_write_done), &m, &why),
			 0);
	assert_int_equal(m.type, KVB_ZMSG_WRITE_DONE);
	assert_string_equal(m.transfer_id, "tx-1");
	kvb_zmsg_fini(&m);
}

/* kvbroker's kvb_write_failed: round trip, and a status that is missing,
 * not an integer, zero, positive or below -4095 is refused both ways. */
static void test_write_failed(void **state)
{
	static const int64_t bad_status[] = {0, 1, 5, -4096, INT32_MIN};
	struct kvb_zmsg m;
	const char *why;
	struct mb b;
	size_t len;
	char *out;

	(void) state;
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_FAILED, "tx-9"), 0);
	m.status = -EOPNOTSUPP;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(dec(out, len, &m, &why), 0);
	free(out);
	assert_int_equal(m.type, KVB_ZMSG_WRITE_FAILED);
	assert_string_equal(m.transfer_id, "tx-9");
	assert_int_equal(m.status, -EOPNOTSUPP);
	assert_string_equal(kvb_zmsg_type_name(m.type), "kvb_write_failed");
	kvb_zmsg_fini(&m);

	/* what a peer broker sends, built by hand */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "kvb_write_failed");
	mb_kv_str(&b, "transfer_id", "tx-9");
	mb_str(&b, "status");
	msgpack_pack_int64(&b.pk, -4095);
	expect(&b, 0);

	mb_init(&b); /* no status */
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "kvb_write_failed");
	mb_kv_str(&b, "transfer_id", "tx-9");
	expect(&b, -EBADMSG);

	mb_init(&b); /* status of the wrong type */
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "kvb_write_failed");
	mb_kv_str(&b, "transfer_id", "tx-9");
	mb_kv_str(&b, "status", "-5");
	expect(&b, -EBADMSG);

	for (size_t i = 0; i < sizeof(bad_status) / sizeof(bad_status[0]);
	     i++) {
		mb_init(&b);
		msgpack_pack_map(&b.pk, 3);
		mb_kv_str(&b, "type", "kvb_write_failed");
		mb_kv_str(&b, "transfer_id", "tx-9");
		mb_str(&b, "status");
		msgpack_pack_int64(&b.pk, bad_status[i]);
		expect(&b, -EBADMSG);

		assert_int_equal(
			kvb_zmsg_init(&m, KVB_ZMSG_WRITE_FAILED, "tx-9"), 0);
		m.status = (int32_t) bad_status[i];
		assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	}
}

/* Encode, decode, compare: every type and flag. */
static void roundtrip(const struct kvb_zmsg *in)
{
	struct kvb_zmsg out;
	const char *why;
	size_t len;
	char *buf;

	assert_int_equal(kvb_zmsg_encode(in, &buf, &len), 0);
	assert_int_equal(dec(buf, len, &out, &why), 0);
	assert_int_equal(out.type, in->type);
	assert_int_equal(out.flags, in->flags);
	assert_string_equal(out.transfer_id, in->transfer_id);
	assert_string_equal(out.req_id, in->req_id);
	assert_int_equal(out.nblocks, in->nblocks);
	if (in->nblocks)
		assert_memory_equal(out.blocks, in->blocks,
				    sizeof(uint32_t) * in->nblocks);
	assert_int_equal(out.decode_rank, in->decode_rank);
	assert_int_equal(out.consumer_tp_size, in->consumer_tp_size);
	assert_int_equal(out.tp_rank, in->tp_rank);
	kvb_zmsg_fini(&out);
	free(buf);
}

static void test_roundtrip(void **state)
{
	const uint32_t ids[] = {0, 1, 2, 255, 256, 65535, 65536, INT32_MAX};
	struct kvb_zmsg m;

	assert_int_equal(
		kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-0b7c2e6a-uuid"),
		0);
	strcpy(m.req_id, "req-1");
	assert_int_equal(kvb_zmsg_set_blocks(&m, ids, 8), 0);
	m.decode_rank = 3;
	roundtrip(&m);
	m.flags |= KVB_ZMSG_F_UNTYPED;
	roundtrip(&m);
	kvb_zmsg_fini(&m);

	kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-\xc3\xa9t\xc3\xa9");
	roundtrip(&m);
	m.flags = KVB_ZMSG_F_CONSUMER_TP;
	m.consumer_tp_size = 4;
	roundtrip(&m);

	kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-9");
	roundtrip(&m);
	m.flags = KVB_ZMSG_F_TP_RANK;
	m.tp_rank = 12;
	roundtrip(&m);
}

static void test_release(void **state)
{
	struct kvb_zmsg m;
	const char *why;
	struct mb b;

	/* consumer_tp_size: absent, nil, 2 */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "release");
	mb_kv_str(&b, "transfer_id", "tx-2");
	assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why), 0);
	assert_int_equal(m.type, KVB_ZMSG_RELEASE);
	assert_false(m.flags & KVB_ZMSG_F_CONSUMER_TP);
	mb_fini(&b);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "release");
	mb_kv_str(&b, "transfer_id", "tx-2");
	mb_str(&b, "consumer_tp_size");
	msgpack_pack_nil(&b.pk);
	assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why), 0);
	assert_false(m.flags & KVB_ZMSG_F_CONSUMER_TP);
	mb_fini(&b);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_str(&b, "consumer_tp_size");
	msgpack_pack_int(&b.pk, 2);
	mb_kv_str(&b, "transfer_id", "tx-2");
	mb_kv_str(&b, "type", "release");
	assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why), 0);
	assert_true(m.flags & KVB_ZMSG_F_CONSUMER_TP);
	assert_int_equal(m.consumer_tp_size, 2);
	mb_fini(&b);
}

static void release_ctp(int64_t v, int want)
{
	struct mb b;

	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "release");
	mb_kv_str(&b, "transfer_id", "tx-2");
	mb_str(&b, "consumer_tp_size");
	msgpack_pack_int64(&b.pk, v);
	expect(&b, want);
}

static void test_release_bad_ctp(void **state)
{
	struct mb b;

	release_ctp(0, -EBADMSG);
	release_ctp(-1, -EBADMSG);
	release_ctp(INT64_MIN, -EBADMSG);
	release_ctp(KVB_ZMSG_TP_MAX + 1, -EBADMSG);
	release_ctp(KVB_ZMSG_TP_MAX, 0);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "release");
	mb_kv_str(&b, "transfer_id", "tx-2");
	mb_kv_str(&b, "consumer_tp_size", "2");
	expect(&b, -EBADMSG);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "release");
	mb_kv_str(&b, "transfer_id", "tx-2");
	mb_str(&b, "consumer_tp_size");
	msgpack_pack_double(&b.pk, 2.0);
	expect(&b, -EBADMSG);
}

static void plain(const char *s, int want, const char *tid, int rank)
{
	struct kvb_zmsg m;
	const char *why;

	assert_int_equal(dec(s, strlen(s), &m, &why), want);
	if (want)
		return;
	assert_int_equal(m.type, KVB_ZMSG_PLAIN);
	assert_string_equal(m.transfer_id, tid);
	if (rank < 0) {
		assert_false(m.flags & KVB_ZMSG_F_TP_RANK);
	} else {
		assert_true(m.flags & KVB_ZMSG_F_TP_RANK);
		assert_int_equal(m.tp_rank, rank);
	}
	kvb_zmsg_fini(&m);
}

static void test_plain(void **state)
{
	char big[400];

	plain("tx-5a1f", 0, "tx-5a1f", -1);
	plain("tx-5a1f:tp3", 0, "tx-5a1f", 3);
	plain("tx-5a1f:tp0", 0, "tx-5a1f", 0);
	plain("tx-5a1f:tp65535", 0, "tx-5a1f", 65535);
	plain("tx-5a1f:tp65536", 0, "tx-5a1f:tp65536", -1);
	plain("tx-5a1f:tp", 0, "tx-5a1f:tp", -1);
	plain(":tp3", 0, ":tp3", -1);
	plain("tp3", 0, "tp3", -1);
	plain("7", 0, "7", -1); /* also a msgpack fixint: still a string */
	plain("caf\xc3\xa9", 0, "caf\xc3\xa9", -1);
	/* Not UTF-8: lone continuation, overlong, surrogate, > U+10FFFF. */
	plain("tx-\xc3\x28", -EBADMSG, NULL, 0);
	plain("\xc0\xaf", -EBADMSG, NULL, 0);
	plain("\xed\xa0\x80", -EBADMSG, NULL, 0);
	plain("\xf4\x90\x80\x80", -EBADMSG, NULL, 0);
	plain("\xff\xfe", -EBADMSG, NULL, 0);
	plain("tx-\xe2\x82", -EBADMSG, NULL, 0); /* truncated sequence */
	plain("tx\n1", -EBADMSG, NULL, 0);
	plain("tx\x7f", -EBADMSG, NULL, 0);
	/* A msgpack str (vLLM would not take it either): 0xa4 is not UTF-8 */
	plain("\xa4tx-1", -EBADMSG, NULL, 0);

	memset(big, 'a', sizeof(big));
	big[255] = '\0';
	plain(big, 0, big, -1);
	big[255] = 'a';
	big[256] = '\0';
	plain(big, -EBADMSG, NULL, 0);
}

static void test_plain_tid_limit(void **state)
{
	struct kvb_zmsg m;
	const char *why;
	char big[400];

	memset(big, 'a', 255);
	memcpy(big + 255, ":tp1", 5);
	assert_int_equal(dec(big, strlen(big), &m, &why), 0);
	assert_int_equal(strlen(m.transfer_id), 255);
	assert_int_equal(m.tp_rank, 1);
	memset(big, 'a', 256);
	memcpy(big + 256, ":tp1", 5);
	assert_int_equal(dec(big, strlen(big), &m, &why), -EBADMSG);
	/* NUL inside the bytes */
	assert_int_equal(dec("tx\0a", 4, &m, &why), -EBADMSG);
}

static void test_empty_and_garbage(void **state)
{
	static const uint8_t c1[] = {0xc1};
	static const uint8_t junk[] = {0x80, 0x01, 0x02};
	static const uint8_t trunc[] = {0x82, 0xa4, 't', 'y'};
	struct kvb_zmsg m;
	const char *why;

	assert_int_equal(dec("", 0, &m, &why), -EBADMSG);
	expect_raw(c1, sizeof(c1), -EBADMSG);
	expect_raw(junk, sizeof(junk), -EBADMSG);
	expect_raw(trunc, sizeof(trunc), -EBADMSG);
	expect_raw("\x80", 1, -EBADMSG); /* {}: neither type nor req_id */
}

static void test_unknown_type(void **state)
{
	struct mb b;

	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "remote_blockz");
	mb_kv_str(&b, "transfer_id", "tx-1");
	expect(&b, -EPROTO);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_str(&b, "type");
	msgpack_pack_int(&b.pk, 1);
	mb_kv_str(&b, "transfer_id", "tx-1");
	expect(&b, -EBADMSG);
}

static void test_block_list(void **state)
{
	const int64_t neg[] = {1, -1};
	const int64_t big[] = {(int64_t) INT32_MAX + 1};
	const int64_t ok[] = {INT32_MAX};
	struct mb b;

	mb_remote_blocks(&b, true, NULL, 0, 0);
	expect(&b, -EBADMSG);
	mb_remote_blocks(&b, false, NULL, 0, 0);
	expect(&b, -EBADMSG);
	mb_remote_blocks(&b, true, neg, 2, 0);
	expect(&b, -EBADMSG);
	mb_remote_blocks(&b, true, big, 1, 0);
	expect(&b, -EBADMSG);
	mb_remote_blocks(&b, true, ok, 1, 0);
	expect(&b, 0);
	mb_remote_blocks(&b, true, ok, 1, -1);
	expect(&b, -EBADMSG);
	mb_remote_blocks(&b, true, ok, 1, KVB_ZMSG_RANK_MAX + 1);
	expect(&b, -EBADMSG);

	/* not an array; an element not an int */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 5);
	mb_kv_str(&b, "type", "remote_blocks");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_kv_str(&b, "req_id", "r");
	mb_kv_str(&b, "block_notify_list", "1,2,3");
	mb_str(&b, "decode_rank");
	msgpack_pack_int(&b.pk, 0);
	expect(&b, -EBADMSG);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 5);
	mb_kv_str(&b, "type", "remote_blocks");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_kv_str(&b, "req_id", "r");
	mb_str(&b, "block_notify_list");
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int(&b.pk, 1);
	msgpack_pack_double(&b.pk, 2.0);
	mb_str(&b, "decode_rank");
	msgpack_pack_int(&b.pk, 0);
	expect(&b, -EBADMSG);
}

static void test_block_list_too_long(void **state)
{
	uint32_t n = KVB_ZMSG_BLOCKS_MAX;
	struct kvb_zmsg m;
	const char *why;
	struct mb b;
	uint32_t i;

	for (int extra = 0; extra < 2; extra++) {
		mb_init(&b);
		msgpack_pack_map(&b.pk, 4);
		mb_kv_str(&b, "transfer_id", "tx-1");
		mb_kv_str(&b, "req_id", "r");
		mb_str(&b, "decode_rank");
		msgpack_pack_int(&b.pk, 0);
		mb_str(&b, "block_notify_list");
		msgpack_pack_array(&b.pk, n + extra);
		for (i = 0; i < n + extra; i++)
			msgpack_pack_uint32(&b.pk, i & 0x7f);
		assert_int_equal(dec(b.sb.data, b.sb.size, &m, &why),
				 extra ? -EBADMSG : 0);
		if (!extra)
			assert_int_equal(m.nblocks, n);
		kvb_zmsg_fini(&m);
		mb_fini(&b);
	}
}

static void test_missing_fields(void **state)
{
	struct mb b;

	/* remote_blocks without decode_rank */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 4);
	mb_kv_str(&b, "type", "remote_blocks");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_kv_str(&b, "req_id", "r");
	mb_str(&b, "block_notify_list");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int(&b.pk, 1);
	expect(&b, -EBADMSG);

	/* typed remote_blocks without req_id */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 4);
	mb_kv_str(&b, "type", "remote_blocks");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_str(&b, "block_notify_list");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int(&b.pk, 1);
	mb_str(&b, "decode_rank");
	msgpack_pack_int(&b.pk, 0);
	expect(&b, -EBADMSG);

	/* write_done without transfer_id */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 1);
	mb_kv_str(&b, "type", "write_done");
	expect(&b, -EBADMSG);

	/* transfer_id: int, empty, bin, too long, control character */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_str(&b, "transfer_id");
	msgpack_pack_int(&b.pk, 5);
	expect(&b, -EBADMSG);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "");
	expect(&b, -EBADMSG);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_str(&b, "transfer_id");
	msgpack_pack_bin_with_body(&b.pk, "tx-1", 4);
	expect(&b, -EBADMSG);

	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx\t1");
	expect(&b, -EBADMSG);

	{
		char big[300];

		memset(big, 'x', 256);
		big[256] = '\0';
		mb_init(&b);
		msgpack_pack_map(&b.pk, 2);
		mb_kv_str(&b, "type", "write_done");
		mb_kv_str(&b, "transfer_id", big);
		expect(&b, -EBADMSG);
		big[255] = '\0';
		mb_init(&b);
		msgpack_pack_map(&b.pk, 2);
		mb_kv_str(&b, "type", "write_done");
		mb_kv_str(&b, "transfer_id", big);
		expect(&b, 0);
	}

	/* non-UTF-8 inside a msgpack str */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-\xff");
	expect(&b, -EBADMSG);
}

static void test_map_shape(void **state)
{
	struct mb b;
	int i;

	/* trailing bytes after a good map */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_raw(&b, "x", 1);
	expect(&b, -EBADMSG);

	/* two maps back to back */
	mb_init(&b);
	for (i = 0; i < 2; i++) {
		msgpack_pack_map(&b.pk, 2);
		mb_kv_str(&b, "type", "write_done");
		mb_kv_str(&b, "transfer_id", "tx-1");
	}
	expect(&b, -EBADMSG);

	/* duplicate key */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_kv_str(&b, "transfer_id", "tx-2");
	expect(&b, -EBADMSG);

	/* non-string key */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	msgpack_pack_int(&b.pk, 1);
	msgpack_pack_int(&b.pk, 1);
	expect(&b, -EBADMSG);

	/* unknown keys are ignored, shallow ones */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_str(&b, "extra");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_map(&b.pk, 0);
	expect(&b, 0);

	/* nested junk: deep nesting in an unknown key */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 3);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	mb_str(&b, "extra");
	for (i = 0; i < 40; i++)
		msgpack_pack_array(&b.pk, 1);
	msgpack_pack_nil(&b.pk);
	expect(&b, -EBADMSG);

	/* a map where the transfer_id should be */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 2);
	mb_kv_str(&b, "type", "write_done");
	mb_str(&b, "transfer_id");
	msgpack_pack_map(&b.pk, 1);
	mb_kv_str(&b, "a", "b");
	expect(&b, -EBADMSG);

	/* too many fields */
	mb_init(&b);
	msgpack_pack_map(&b.pk, 40);
	mb_kv_str(&b, "type", "write_done");
	mb_kv_str(&b, "transfer_id", "tx-1");
	for (i = 0; i < 38; i++) {
		char k[16];

		snprintf(k, sizeof(k), "k%d", i);
		mb_kv_str(&b, k, "v");
	}
	expect(&b, -EBADMSG);
}

static void test_huge_lengths(void **state)
{
	/* map16 of one entry whose value claims 4G elements / bytes */
	static const uint8_t arr32[] = {0x81, 0xa1, 'a',  0xdd,
					0xff, 0xff, 0xff, 0xff};
	static const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
	static const uint8_t str32[] = {0x81, 0xa1, 'a',  0xdb, 0xff,
					0xff, 0xff, 0xff, 'x'};
	static const uint8_t bin32[] = {0x81, 0xa1, 'a',  0xc6,
					0x7f, 0xff, 0xff, 0xff};
	static const uint8_t ext32[] = {0x81, 0xa1, 'a',  0xc9, 0xff,
					0xff, 0xff, 0xff, 0x01};
	static const uint8_t map16[] = {0xde, 0xff, 0xff};
	struct kvb_zmsg m;
	const char *why;
	char *big;

	expect_raw(arr32, sizeof(arr32), -EBADMSG);
	expect_raw(map32, sizeof(map32), -EBADMSG);
	expect_raw(str32, sizeof(str32), -EBADMSG);
	expect_raw(bin32, sizeof(bin32), -EBADMSG);
	expect_raw(ext32, sizeof(ext32), -EBADMSG);
	expect_raw(map16, sizeof(map16), -EBADMSG);

	/* over the payload bound, whatever it holds */
	big = calloc(1, KVB_ZMSG_BYTES_MAX + 1);
	assert_non_null(big);
	big[0] = (char) 0x81;
	assert_int_equal(dec(big, KVB_ZMSG_BYTES_MAX + 1, &m, &why), -EBADMSG);
	free(big);
}

static void test_encode_refuses(void **state)
{
	const uint32_t ids[] = {1};
	const uint32_t bad_ids[] = {(uint32_t) INT32_MAX + 1};
	struct kvb_zmsg m;
	size_t len;
	char *out;

	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, ""), -EINVAL);
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "a\nb"),
			 -EINVAL);
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "\xff"),
			 -EINVAL);

	/* remote_blocks without blocks or req_id */
	kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-1");
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	assert_int_equal(kvb_zmsg_set_blocks(&m, ids, 0), -EINVAL);
	assert_int_equal(kvb_zmsg_set_blocks(&m, ids, 1), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	strcpy(m.req_id, "r");
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	free(out);
	m.decode_rank = KVB_ZMSG_RANK_MAX + 1;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	m.decode_rank = 0;
	assert_int_equal(kvb_zmsg_check(&m), 0);
	assert_int_equal(kvb_zmsg_set_blocks(&m, bad_ids, 1), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	/* what the broker asks before announcing a D open's blocks */
	assert_int_equal(kvb_zmsg_check(&m), -EINVAL);
	kvb_zmsg_fini(&m);

	kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-1");
	m.flags = KVB_ZMSG_F_CONSUMER_TP;
	m.consumer_tp_size = 0;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);

	kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-1");
	m.type = (enum kvb_zmsg_type) 99;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	m.type = KVB_ZMSG_WRITE_DONE;
	m.transfer_id[0] = '\0';
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
}

/*
 * A plain id that starts with U+0780..U+07FF (first byte 0xde or 0xdf, the
 * map16/map32 markers) is valid in a map but would be read back as a broken
 * map: found by tests/fuzz (corpus/zmsg/repro-plain-map-marker).
 */
static void test_encode_plain_map_marker(void **state)
{
	struct kvb_zmsg m;
	const char *why = NULL;
	size_t len;
	char *out;

	/* U+07CB, U+0780 */
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "\xdf\x8b"), 0);
	assert_int_equal(kvb_zmsg_check(&m), -EINVAL);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	assert_int_equal(kvb_zmsg_decode(&m, "\xdf\x8b", 2, &why), -EBADMSG);
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "\xde\x80-1"), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);

	/* the same id is fine inside a map, and elsewhere in a plain id */
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "\xdf\x8b"), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(kvb_zmsg_decode(&m, out, len, &why), 0);
	assert_string_equal(m.transfer_id, "\xdf\x8b");
	free(out);
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "x\xdf\x8b"), 0);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(kvb_zmsg_decode(&m, out, len, &why), 0);
	assert_int_equal(m.type, KVB_ZMSG_PLAIN);
	assert_string_equal(m.transfer_id, "x\xdf\x8b");
	free(out);
}

/*
 * Two empty keys: a duplicate, compared with a NULL str pointer from
 * msgpack-c (memcmp(NULL, .., 0) was undefined; UBSan, test-asan). Found by
 * tests/fuzz (corpus/zmsg/repro-empty-keys-memcmp-null).
 */
static void test_empty_keys(void **state)
{
	static const uint8_t two[] = {0x82, 0xa0, 0x90, 0xa0, 0xc0};
	static const uint8_t one[] = {0x82, 0xa0, 0xc0, 0xa6, 'r',  'e',
				      'q',  '_',  'i',	'd',  0xa1, 'r'};
	struct kvb_zmsg m;
	const char *why = NULL;

	assert_int_equal(kvb_zmsg_decode(&m, two, sizeof(two), &why), -EBADMSG);
	assert_string_equal(why, "duplicate key in map");
	/* one empty key is an unknown key like any other */
	assert_int_equal(kvb_zmsg_decode(&m, one, sizeof(one), &why), -EBADMSG);
	assert_string_equal(why, "missing transfer_id");
}

/*
 * A bare plain id ending in ":tp<digits>" reads back as the READ variant of
 * a shorter id: refused, sent only with its own suffix. Found by tests/fuzz
 * (corpus/zmsg/repro-plain-tp-suffix).
 */
static void test_encode_plain_tp_suffix(void **state)
{
	struct kvb_zmsg m;
	const char *why = NULL;
	size_t len;
	char *out;

	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-1:tp3"), 0);
	assert_int_equal(kvb_zmsg_check(&m), -EINVAL);
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), -EINVAL);
	/* with its own suffix it goes, and reads back whole */
	m.flags = KVB_ZMSG_F_TP_RANK;
	m.tp_rank = 0;
	assert_int_equal(kvb_zmsg_encode(&m, &out, &len), 0);
	assert_int_equal(len, strlen("tx-1:tp3:tp0"));
	assert_int_equal(kvb_zmsg_decode(&m, out, len, &why), 0);
	assert_string_equal(m.transfer_id, "tx-1:tp3");
	assert_true(m.flags & KVB_ZMSG_F_TP_RANK);
	assert_int_equal(m.tp_rank, 0);
	free(out);
	/* not a suffix the decoder splits: fine bare */
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-1:tp65536"), 0);
	assert_int_equal(kvb_zmsg_check(&m), 0);
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, ":tp3"), 0);
	assert_int_equal(kvb_zmsg_check(&m), 0);
	/* in a map the id is a string of its own */
	assert_int_equal(kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-1:tp3"), 0);
	assert_int_equal(kvb_zmsg_check(&m), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_remote_blocks_typed),
		cmocka_unit_test(test_remote_blocks_untyped),
		cmocka_unit_test(test_write_done_bytes),
		cmocka_unit_test(test_write_failed),
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_release),
		cmocka_unit_test(test_release_bad_ctp),
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_plain_tid_limit),
		cmocka_unit_test(test_empty_and_garbage),
		cmocka_unit_test(test_unknown_type),
		cmocka_unit_test(test_block_list),
		cmocka_unit_test(test_block_list_too_long),
		cmocka_unit_test(test_missing_fields),
		cmocka_unit_test(test_map_shape),
		cmocka_unit_test(test_huge_lengths),
		cmocka_unit_test(test_encode_refuses),
		cmocka_unit_test(test_encode_plain_map_marker),
		cmocka_unit_test(test_encode_plain_tp_suffix),
		cmocka_unit_test(test_empty_keys),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

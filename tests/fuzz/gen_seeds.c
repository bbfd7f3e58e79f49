// SPDX-License-Identifier: MIT
/*
 * Writes the seed inputs of the fuzz targets, small valid messages made with
 * the project's own encoders, as corpus/<target>/seed-<name>:
 *
 *   build/tests/fuzz/fuzz_gen_seeds tests/fuzz/corpus
 *
 * The seeds are checked in; rerun this after a format change.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bridge/le.h"
#include "bridge/tcp/wire.h"
#include "shm/segment.h"
#include "bridge/zmq/codec.h"
#include "bridge/zmq/handshake.h"

static const char *root;

static void put(const char *target, const char *name, const void *buf,
		size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/seed-%s", root, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void put_zmsg(const char *name, struct kvb_zmsg *m)
{
	char *out;
	size_t len;

	if (kvb_zmsg_encode(m, &out, &len)) {
		fprintf(stderr, "zmsg %s: refused\n", name);
		exit(1);
	}
	put("zmsg", name, out, len);
	free(out);
	kvb_zmsg_fini(m);
}

static void zmsg_seeds(void)
{
	static const uint32_t ids[] = {4, 5, 6, 9, 300, 70000};
	struct kvb_zmsg m;

	kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-5a1f");
	strcpy(m.req_id, "req-1");
	m.decode_rank = 1;
	kvb_zmsg_set_blocks(&m, ids, 6);
	put_zmsg("remote_blocks", &m);
	kvb_zmsg_init(&m, KVB_ZMSG_REMOTE_BLOCKS, "tx-5a1f");
	strcpy(m.req_id, "req-1");
	m.flags = KVB_ZMSG_F_UNTYPED;
	kvb_zmsg_set_blocks(&m, ids, 2);
	put_zmsg("remote_blocks_untyped", &m);
	kvb_zmsg_init(&m, KVB_ZMSG_WRITE_DONE, "tx-5a1f");
	put_zmsg("write_done", &m);
	kvb_zmsg_init(&m, KVB_ZMSG_RELEASE, "tx-5a1f");
	m.flags = KVB_ZMSG_F_CONSUMER_TP;
	m.consumer_tp_size = 4;
	put_zmsg("release", &m);
	kvb_zmsg_init(&m, KVB_ZMSG_PLAIN, "tx-5a1f");
	m.flags = KVB_ZMSG_F_TP_RANK;
	m.tp_rank = 3;
	put_zmsg("plain_tp", &m);
}

static void hs_seeds(void)
{
	static uint8_t conn[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	struct kvb_hs_region regs[2] = {
		{.id = 1,
		 .size = 4096,
		 .geom = {KVB_KV_LAYOUT_KV_FIRST, 4, 16, 2, 4, 2},
		 .addr = 0x10000,
		 .rkey = 7},
		{.id = 2,
		 .size = 8192,
		 .geom = {KVB_KV_LAYOUT_BLOCK_FIRST, 8, 16, 2, 4, 2},
		 .layer = 1},
	};
	struct kvb_hs_worker w[2] = {
		{.role = KVB_HS_ROLE_P,
		 .tp_size = 1,
		 .nregions = 2,
		 .regions = regs},
		{.role = KVB_HS_ROLE_D,
		 .dp_rank = 1,
		 .tp_rank = 1,
		 .tp_size = 2},
	};
	struct kvb_hs_desc d = {
		.node_id = "node-a",
		.host = "10.0.0.1",
		.notify_port = 5600,
		.hs_port = 5500,
		.instance = 42,
		.ntransports = 1,
		.transports = {{.name = "tcp", .conn_len = 8, .conn = conn}},
		.nworkers = 2,
		.workers = w,
	};
	char *out;
	size_t len;

	if (kvb_hs_encode(&d, &out, &len)) {
		fprintf(stderr, "hs: refused\n");
		exit(1);
	}
	put("hs", "desc", out, len);
	free(out);
	/* with the X25519 public key of the data port's key exchange */
	memset(d.kx, 0x42, sizeof(d.kx));
	d.has_kx = 1;
	if (kvb_hs_encode(&d, &out, &len)) {
		fprintf(stderr, "hs: refused\n");
		exit(1);
	}
	put("hs", "desc-kx", out, len);
	free(out);
}

/* A frame: header, records, then pay bytes of payload (0x5a). */
static size_t frame(uint8_t *buf, uint8_t type, const struct kvb_tcp_rec *r,
		    unsigned n)
{
	struct kvb_tcp_hdr h = {.type = type, .count = (uint16_t) n};
	size_t len = KVB_TCP_HDR_LEN;
	unsigned i;

	for (i = 0; i < n; i++) {
		kvb_tcp_rec_encode(&r[i], buf + len);
		len += KVB_TCP_REC_LEN;
		if (type == KVB_TCP_F_WRITE)
			h.payload += r[i].len;
	}
	kvb_tcp_hdr_encode(&h, buf);
	if (type == KVB_TCP_F_WRITE) {
		memset(buf + len, 0x5a, h.payload);
		len += h.payload;
	}
	return len;
}

static void tcp_seeds(void)
{
	/* regions of tcp_serve.c: 1 W 64 B, 2 R 100 B, 3 RW 4 KiB, 7 none */
	const struct kvb_tcp_rec wr[] = {
		{.seq = 1, .region = 1, .off = 8, .len = 16},
		{.seq = 2, .region = 3, .off = 100, .len = 32},
		{.seq = 3, .region = 7, .off = 0, .len = 4},
	};
	const struct kvb_tcp_rec rd[] = {
		{.seq = 4, .region = 2, .off = 10, .len = 20},
		{.seq = 5, .region = 3, .off = 0, .len = 8},
		{.seq = 6, .region = 1, .off = 0, .len = 8},
	};
	uint8_t buf[1024];
	size_t n;

	n = frame(buf, KVB_TCP_F_WRITE, wr, 3);
	put("tcp_serve", "write", buf, n);
	n = frame(buf, KVB_TCP_F_READ_REQ, rd, 3);
	put("tcp_serve", "read", buf, n);
	n = frame(buf, KVB_TCP_F_WRITE, wr, 2);
	n += frame(buf + n, KVB_TCP_F_READ_REQ, rd, 2);
	n += frame(buf + n, KVB_TCP_F_WRITE, wr + 2, 1);
	put("tcp_serve", "mixed", buf, n);

	/* inputs that start with the auth magic go unauthenticated: the
	 * server's HELLO / PROOF parser (tcp_serve.c raw_auth_input) */
	memset(buf, 0, sizeof(buf));
	kvb_tcp_auth_head(buf, KVB_TCP_A_HELLO);
	kvb_put64(buf + 8, 0x1234);
	kvb_put64(buf + 16, 0); /* any server: the shared-key entry */
	memset(buf + 24, 0x11, KVB_TCP_NONCE_LEN);
	/* a HELLO alone: CHALLENGE back, then the deadline */
	put("tcp_serve", "auth-hello", buf, KVB_TCP_HELLO_LEN);
	/* a PROOF that cannot be right, then a WRITE frame it must not let
	 * through */
	kvb_tcp_auth_head(buf + KVB_TCP_HELLO_LEN, KVB_TCP_A_PROOF);
	memset(buf + KVB_TCP_HELLO_LEN + 8, 0x22, KVB_TCP_MAC_LEN);
	n = KVB_TCP_HELLO_LEN + KVB_TCP_PROOF_LEN;
	n += frame(buf + n, KVB_TCP_F_WRITE, wr, 2);
	put("tcp_serve", "auth-bad-proof", buf, n);
	/* a HELLO for another server id: refused at once */
	kvb_put64(buf + 16, 99);
	put("tcp_serve", "auth-other-server", buf, KVB_TCP_HELLO_LEN);
	/* a HELLO of another version, frames behind it */
	kvb_put64(buf + 16, 0);
	buf[4] = 2;
	put("tcp_serve", "auth-version", buf, n);
}

/* One record of validate.c: worker selector, then the descriptor. */
static size_t sqe(uint8_t *buf, uint8_t w, uint8_t op, uint32_t region,
		  uint64_t off, uint32_t peer_region, uint64_t roff,
		  uint64_t len)
{
	struct kvb_sqe e = {.opcode = op,
			    .region = region,
			    .peer_region = peer_region,
			    .offset = off,
			    .peer_offset = roff,
			    .len = len,
			    .tag = 42};

	buf[0] = w;
	memcpy(buf + 1, &e, sizeof(e));
	return 1 + sizeof(e);
}

static void validate_seeds(void)
{
	/* region ids as validate.c's setup() makes them: 0x10002 W1 64 KiB,
	 * 0x10003 W1 empty, 0x10004 W2 write 4 KiB, 0x10005 W2 read 64 B,
	 * 0x10006 W3 rw 2^62 B, 0x10007 W3 rw dead; 0x10001 freed */
	uint8_t buf[512];
	size_t n = 0;

	n += sqe(buf + n, 0, KVB_OP_WRITE, 0x10002, 0, 0x10004, 0, 4096);
	n += sqe(buf + n, 0, KVB_OP_READ, 0x10002, 100, 0x10005, 8, 56);
	n += sqe(buf + n, 2, KVB_OP_WRITE, 0x10006, 1ull << 40, 0x10004, 0, 1);
	put("validate", "ok", buf, n);
	n = 0;
	n += sqe(buf + n, 0, KVB_OP_WRITE, 0x10002, 0, 0x10007, 0, 8);
	n += sqe(buf + n, 1, KVB_OP_READ, 0x10005, 60, 0x10006, 0, 8);
	n += sqe(buf + n, 0, KVB_OP_WRITE, 0x10002, 0, 0x10001, 0, 8);
	put("validate", "refused", buf, n);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
		return 2;
	}
	root = argv[1];
	mkdir(root, 0755);
	zmsg_seeds();
	hs_seeds();
	tcp_seeds();
	validate_seeds();
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Control messages on the broker's Unix socket (SOCK_SEQPACKET: one message
 * per packet, file descriptors with SCM_RIGHTS). Slow path only: attach,
 * memory registration, transfer-id interning, stats. Every request starts
 * with struct kvb_msg_hdr and gets exactly one reply of the same type with
 * `status` set (0 or -errno) and the request's `seq` echoed.
 *
 * Replies can come late: a client that gave up waiting (its timeout) keeps
 * its connection, and the broker answers a PEER request only when the
 * handshake ends (seconds later). `seq` tells a late reply from the answer
 * the client waits for: the library numbers its requests (never 0) and
 * discards a reply of another number. The broker answers a worker's PEER
 * requests, deferred, with the number of the last one the worker sent: the
 * library sends no PEER while one of its PEERs is unanswered.
 */
#ifndef KVB_SHM_PROTO_H
#define KVB_SHM_PROTO_H

#include <stdint.h>

#define KVB_MSG_MAGIC	  0x4b56424du /* "KVBM" */
#define KVB_PROTO_VERSION 2u	      /* 2: seq in the header */
#define KVB_MSG_MAX	  65536u
#define KVB_XFER_ID_MAX	  255u
/* the broker's transfer table: live transfers at most (a worker that keeps
 * a completion ring slot for each sizes it from this) */
#define KVB_MAX_XFERS 16384u

enum kvb_msg_type {
	KVB_MSG_HELLO = 1,   /* worker attach; reply carries 3 fds */
	KVB_MSG_MEM_REG = 2, /* register a memfd region; request carries fd */
	KVB_MSG_MEM_DEREG = 3,
	KVB_MSG_MEM_LOOKUP = 4,
	KVB_MSG_OPEN = 5,  /* intern a transfer id */
	KVB_MSG_STATS = 6, /* kvbctl: no HELLO needed */
	KVB_MSG_BYE = 7,
	KVB_MSG_MEM_KV = 8, /* KV geometry and layer of a region */
	KVB_MSG_PEER = 9,   /* handshake with a peer broker (deferred reply) */
	KVB_MSG_XOPEN = 10, /* open a cross-node transfer; blocks follow */
	KVB_MSG_OPEN_BATCH = 11,  /* intern up to 64 transfer ids at once */
	KVB_MSG_XTIMEOUTS = 12,	  /* a transfer's clocks */
	KVB_MSG_XOPEN_BATCH = 13, /* cross-node opens by peer address */
	KVB_MSG_MEM_ALIAS = 14,	  /* a region over part of another */
	KVB_MSG_XEXPECT = 15,	  /* transfer ids this P worker will open */
};

struct kvb_msg_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t len;	/* whole message, header included */
	int32_t status; /* replies: 0 or -errno */
	uint32_t seq;	/* requests: the sender's number; replies: echoed */
	uint32_t pad;
};

struct kvb_msg_hello {
	struct kvb_msg_hdr h;
	uint32_t role; /* 1 = P, 2 = D */
	uint32_t dp_rank, tp_rank, tp_size;
	uint32_t pid;
	uint32_t sq_entries, cq_entries; /* 0 = broker default */
	uint32_t pad;
};

struct kvb_msg_hello_reply {
	struct kvb_msg_hdr h;
	uint32_t worker_id;
	uint32_t pad;
	uint64_t seg_size;
	/* fds, in order: segment memfd, broker eventfd, worker eventfd */
};

struct kvb_msg_mem_reg {
	struct kvb_msg_hdr h;
	uint64_t size;
	uint64_t fd_offset;
	uint64_t key;
	uint32_t flags; /* KVB_MEM_REMOTE_* */
	uint32_t kind;	/* 0 = host memfd; 1 = gpu handle (in payload) */
	int32_t gpu_device;
	uint32_t payload_len;
	/* kind-specific payload follows (gpu IPC handle) */
};

struct kvb_msg_mem_reply {
	struct kvb_msg_hdr h;
	uint32_t region;
	uint32_t flags;
	uint64_t size;
};

struct kvb_msg_mem_dereg {
	struct kvb_msg_hdr h;
	uint32_t region;
	uint32_t pad;
};

struct kvb_msg_mem_lookup {
	struct kvb_msg_hdr h;
	uint32_t role, dp_rank, tp_rank, pad;
	uint64_t key;
};

struct kvb_msg_open {
	struct kvb_msg_hdr h;
	uint32_t id_len;
	char id[KVB_XFER_ID_MAX + 1];
};

struct kvb_msg_open_reply {
	struct kvb_msg_hdr h;
	uint32_t handle;
	uint32_t pad;
};

struct kvb_msg_stats {
	struct kvb_msg_hdr h;
	uint32_t json;
	uint32_t view; /* 0 = counters, 1 = workers, 2 = transfers, 3 = peers */
};
/* stats reply: header + NUL-terminated text */

struct kvb_msg_mem_kv {
	struct kvb_msg_hdr h;
	uint32_t region;
	uint32_t layer;
	uint32_t layout, num_blocks, block_size, num_heads, head_dim, elem_size;
};

struct kvb_msg_peer {
	struct kvb_msg_hdr h;
	char host[64]; /* NUL-terminated */
	uint32_t port; /* the peer broker's handshake port */
	uint32_t pad;
};

struct kvb_msg_peer_reply {
	struct kvb_msg_hdr h;
	uint32_t peer;
	uint32_t pad;
};

/* XOPEN: this header, then nblocks + nremote uint32 block ids. */
struct kvb_msg_xopen {
	struct kvb_msg_hdr h;
	uint32_t id_len;
	char id[KVB_XFER_ID_MAX + 1];
	uint32_t peer;
	uint32_t mode;	/* 0 = WRITE, 1 = READ */
	uint32_t flags; /* KVB_XFER_F_* of the public header */
	uint32_t remote_dp_rank;
	uint32_t nblocks;
	uint32_t nremote;
	char notify_host[64]; /* "" = the peer's */
	uint32_t notify_port; /* 0 = the peer's */
	uint32_t pad;
};
/* reply: struct kvb_msg_open_reply */

/*
 * OPEN_BATCH: this header, then n ids (1..KVB_OPEN_BATCH_MAX), each a
 * uint8_t length and that many bytes, packed, filling the message exactly
 * (else the message is malformed and the worker dropped). n out of range:
 * a header-only reply with status -EINVAL. Else status 0 and one result per
 * id, in order: each id opened as by OPEN, on its own.
 */
#define KVB_OPEN_BATCH_MAX 64u

struct kvb_msg_open_batch {
	struct kvb_msg_hdr h;
	uint32_t n;
	uint32_t pad;
};

struct kvb_open_result {
	uint32_t handle; /* valid when status == 0 */
	int32_t status;	 /* 0 or -errno, as OPEN's */
};

struct kvb_msg_open_batch_reply {
	struct kvb_msg_hdr h;
	uint32_t n;
	uint32_t pad;
	struct kvb_open_result res[];
};

/*
 * XTIMEOUTS: set the clocks of one of the sender's transfers, in ms;
 * 0 leaves that clock as it is; the deadline counts from the request.
 * Reply: a header, status 0, -ESTALE (unknown, ended or failing handle) or
 * -EINVAL (over 86400 s; a defer clock for a same-node transfer).
 */
struct kvb_msg_xtimeouts {
	struct kvb_msg_hdr h;
	uint32_t handle;
	uint32_t deadline_ms;
	uint32_t stall_ms;
	uint32_t defer_ms;
};

/*
 * XOPEN_BATCH: this header, then n entries (1..KVB_XOPEN_BATCH_MAX), each
 * a struct kvb_xopen_ent, its id (id_len bytes) and host (host_len bytes)
 * padded with zeros to a multiple of 4, then nblocks + nremote uint32 block
 * ids; packed, filling the message exactly (else it is malformed and the
 * worker dropped). n out of range: a header-only reply with status
 * -EINVAL. Else status 0 and one struct kvb_open_result per entry, in
 * order (struct kvb_msg_open_batch_reply), each entry opened on its own.
 */
#define KVB_XOPEN_BATCH_MAX 1024u

struct kvb_msg_xopen_batch {
	struct kvb_msg_hdr h;
	uint32_t n;
	uint32_t pad;
};

struct kvb_xopen_ent {
	uint8_t id_len;	  /* 1..255 */
	uint8_t host_len; /* 1..63 */
	uint16_t port;	  /* the peer broker's handshake port */
	uint32_t mode;	  /* 0 = WRITE, 1 = READ */
	uint32_t flags;	  /* KVB_XFER_F_* */
	uint32_t remote_dp_rank;
	uint32_t nblocks;
	uint32_t nremote;
};

/* Bytes an entry takes in the message. */
static inline uint64_t kvb_xopen_ent_len(const struct kvb_xopen_ent *e)
{
	return sizeof(*e) + (((uint64_t) e->id_len + e->host_len + 3) & ~3ull) +
	       ((uint64_t) e->nblocks + e->nremote) * 4;
}

/* MEM_ALIAS: a region over [offset, offset + size) of region `parent`;
 * reply: struct kvb_msg_mem_reply. */
struct kvb_msg_mem_alias {
	struct kvb_msg_hdr h;
	uint32_t parent;
	uint32_t flags; /* KVB_MEM_REMOTE_* */
	uint64_t offset, size, key;
};

/*
 * XEXPECT: this header, then n entries (1..KVB_XEXPECT_MAX), each one
 * byte id_len (1..255) and the id's bytes, packed, filling the message
 * exactly (else it is malformed and the worker dropped). flags: 0 or
 * KVB_XEXPECT_F_WITHDRAW. n or flags out of range: a header-only reply
 * with status -EINVAL. Else status 0 and one struct kvb_open_result per
 * entry (struct kvb_msg_open_batch_reply; handle 0, the entry's status).
 */
#define KVB_XEXPECT_MAX	       1024u
#define KVB_XEXPECT_F_WITHDRAW 0x1u

struct kvb_msg_xexpect {
	struct kvb_msg_hdr h;
	uint32_t n;
	uint32_t flags;
};

#endif /* KVB_SHM_PROTO_H */

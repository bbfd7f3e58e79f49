/* SPDX-License-Identifier: MIT */
/*
 * Codec of the MoRIIO notify-port messages (docs/protocol.md "Messages on the
 * notify port"): remote_blocks, write_done, release and the plain-string form.
 *
 * What is accepted and refused, and why, is in docs/protocol.md. In short:
 * a payload whose first byte is a msgpack map marker is decoded as a map,
 * strictly; anything else is the plain-string form and must be a clean UTF-8
 * identifier. Unknown map keys are ignored (forward compatibility), unknown
 * "type" values are refused.
 *
 * Thread safety: all functions are reentrant; a struct kvb_zmsg belongs to
 * one thread at a time.
 */
#ifndef KVB_BRIDGE_ZMQ_CODEC_H
#define KVB_BRIDGE_ZMQ_CODEC_H

#include <stddef.h>
#include <stdint.h>

#define KVB_ZMSG_ID_MAX	    255	       /* transfer_id / req_id bytes */
#define KVB_ZMSG_BLOCKS_MAX (1u << 20) /* block_notify_list entries */
#define KVB_ZMSG_BLOCK_MAX  INT32_MAX  /* largest block id */
#define KVB_ZMSG_RANK_MAX   65535      /* decode_rank, tp rank */
#define KVB_ZMSG_TP_MAX	    65536      /* consumer_tp_size */
#define KVB_ZMSG_BYTES_MAX  (8u << 20) /* whole payload */

enum kvb_zmsg_type {
	KVB_ZMSG_REMOTE_BLOCKS = 1,
	KVB_ZMSG_WRITE_DONE = 2,
	KVB_ZMSG_RELEASE = 3,
	/* Raw UTF-8 transfer_id: on P a release ACK, on D a write_done. */
	KVB_ZMSG_PLAIN = 4,
	/*
	 * kvbroker's own (not MoRIIO's): P's writes of a transfer failed,
	 * `status` says why; D's transfer fails at once instead of at its
	 * timeout. Sent only to a peer broker's own notify ports.
	 */
	KVB_ZMSG_WRITE_FAILED = 5,
};

enum kvb_zmsg_flags {
	/* remote_blocks came (or is to be sent) without the "type" key. */
	KVB_ZMSG_F_UNTYPED = 1u << 0,
	/* release: consumer_tp_size is present. */
	KVB_ZMSG_F_CONSUMER_TP = 1u << 1,
	/* plain: the "<transfer_id>:tp<rank>" READ variant; tp_rank is set. */
	KVB_ZMSG_F_TP_RANK = 1u << 2,
};

struct kvb_zmsg {
	enum kvb_zmsg_type type;
	uint32_t flags;			       /* enum kvb_zmsg_flags */
	char transfer_id[KVB_ZMSG_ID_MAX + 1]; /* NUL-terminated, verbatim */
	char req_id[KVB_ZMSG_ID_MAX + 1];      /* remote_blocks only */
	uint32_t *blocks; /* remote_blocks: D's block ids (heap, see fini) */
	uint32_t nblocks; /* 1..KVB_ZMSG_BLOCKS_MAX */
	uint32_t decode_rank;	   /* remote_blocks: D's DP rank */
	uint32_t consumer_tp_size; /* release, if KVB_ZMSG_F_CONSUMER_TP */
	uint32_t tp_rank;	   /* plain, if KVB_ZMSG_F_TP_RANK */
	int32_t status;		   /* kvb_write_failed: -errno, -4095..-1 */
};

/*
 * Decode one notify payload into *m (fully overwritten). On success m->blocks
 * may own heap memory: call kvb_zmsg_fini(). On failure *m holds nothing to
 * free and *reason (if reason is not NULL) points to a static string naming
 * the first problem found, for logging.
 *
 * Returns 0; -EBADMSG for a malformed message (bad msgpack, trailing bytes,
 * wrong types, missing fields, values out of range, bytes that are neither a
 * msgpack map nor UTF-8); -EPROTO for a well-formed map with an unknown
 * "type"; -ENOMEM.
 */
int kvb_zmsg_decode(struct kvb_zmsg *m, const void *buf, size_t len,
		    const char **reason);

/*
 * Encode *m as the bytes a vLLM MoRIIO peer sends: a msgpack map with str keys
 * (remote_blocks, write_done, release), or the raw transfer_id bytes (plain,
 * with ":tp<rank>" appended under KVB_ZMSG_F_TP_RANK). *m is validated with
 * the decoder's rules first: the broker never sends what it would refuse.
 *
 * Returns 0 with *out (malloc'd, caller frees) and *len set; -EINVAL for an
 * invalid message; -ENOMEM.
 */
int kvb_zmsg_encode(const struct kvb_zmsg *m, char **out, size_t *len);

/* The check kvb_zmsg_encode() does first: 0 or -EINVAL (e.g. a block id over
 * KVB_ZMSG_BLOCK_MAX, an id string that is not a valid identifier). */
int kvb_zmsg_check(const struct kvb_zmsg *m);

/*
 * Start a message: zero *m (without freeing: kvb_zmsg_fini() a message that
 * owns blocks first), set type and a copy of transfer_id. Returns 0, or
 * -EINVAL when transfer_id is not a valid id (empty, over KVB_ZMSG_ID_MAX
 * bytes, not UTF-8, control characters).
 */
int kvb_zmsg_init(struct kvb_zmsg *m, enum kvb_zmsg_type type,
		  const char *transfer_id);

/*
 * Give m->blocks a copy of ids[0..n) (remote_blocks). Returns 0, -EINVAL
 * (n == 0 or over KVB_ZMSG_BLOCKS_MAX) or -ENOMEM.
 */
int kvb_zmsg_set_blocks(struct kvb_zmsg *m, const uint32_t *ids, uint32_t n);

/* Free what *m owns and zero it. Safe on a zeroed or failed-decode message. */
void kvb_zmsg_fini(struct kvb_zmsg *m);

/* "remote_blocks", "write_done", "release", "plain", "kvb_write_failed"
 * or "?". */
const char *kvb_zmsg_type_name(enum kvb_zmsg_type type);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * libkvbroker — the worker side of kvbroker.
 *
 * A worker process attaches to the node's broker, registers the memory that
 * holds its KV cache, and hands transfer descriptors to the broker through a
 * lock-free ring in shared memory (no system call on the fast path). The
 * broker moves the bytes (memcpy, TCP, RDMA or GPU copies) and returns
 * completions through a second ring.
 *
 * Conventions: every function returns 0, a count, or -errno. A context is
 * used by one submitting thread and one completing thread at a time (they may
 * be different threads); control calls (memory, transfers) are serialised
 * internally and may be called from any thread.
 *
 * Control calls end within the context's timeout_ms, all of it (waiting for
 * another thread's control call, sending, the reply), however often signals
 * interrupt them. One that returns -ETIMEDOUT may still be carried out by
 * the broker: its late reply is dropped when it comes (never taken for a
 * later call's), and a region it registered is then freed again; a transfer
 * it opened stays open unknown to the caller (until --transfer-timeout
 * ends it), a peer it connected stays known to the broker.
 *
 * After the broker goes away: control calls and kvb_wait return -EPIPE at
 * once (kvb_wait sees the hang-up when it sleeps, within ~20 us); kvb_poll
 * returns -EPIPE within 256 calls that find nothing; submissions (which
 * make no system call) return -EPIPE once one of those has seen it, or when
 * the ring is full; before that they queue descriptors that never complete.
 * Completions already delivered can still be polled.
 */
#ifndef KVBROKER_H
#define KVBROKER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVB_VERSION_STRING "0.1.0"

struct kvb_ctx;

enum kvb_role { KVB_ROLE_P = 1, KVB_ROLE_D = 2 };

struct kvb_attach_opts {
	const char *socket_path; /* NULL: $KVB_SOCKET or the default path */
	enum kvb_role role;
	uint32_t dp_rank;
	uint32_t tp_rank;
	uint32_t tp_size;
	uint32_t sq_entries; /* 0 = broker default (power of two) */
	uint32_t cq_entries; /* 0 = broker default */
	int timeout_ms;	     /* for attach and control calls; 0 = 5000 */
};

/*
 * Default socket path: $KVB_SOCKET, else $XDG_RUNTIME_DIR/kvbroker/
 * kvbroker.sock, else /run/kvbroker/kvbroker.sock for root, else
 * /tmp/kvbroker-<uid>/kvbroker.sock. The directory of a path not given by
 * $KVB_SOCKET must be private: kvb_attach() (and the broker, which creates
 * it 0700) refuses one that is a symlink, not owned by this uid, or open to
 * group or others. Writes at most `len` bytes; returns the length or
 * -ENAMETOOLONG. Thread-safe.
 */
int kvb_default_socket(char *buf, unsigned long len);

/*
 * Attach to the broker. On success *out is a new context.
 * Before sending anything the library checks whom it talks to: the default
 * path's directory must be private to this uid (see kvb_default_socket),
 * and the process listening (SO_PEERCRED) must run as this uid, as root,
 * or as a uid listed in $KVB_BROKER_UIDS (comma-separated, for a broker
 * run by a dedicated account); else -EACCES and no memory is handed over.
 * Returns 0, -EINVAL (bad role or ranks, ring sizes not a power of two in
 * [2, 2^20]), -E2BIG (a ring larger than the broker's --max-ring-entries),
 * -EADDRINUSE (a worker with the same role, dp rank and tp rank is
 * attached), -EACCES (broker not trusted), -ENAMETOOLONG (socket path),
 * -ENOENT/-ECONNREFUSED (no broker; or one that refused the connection:
 * --max-workers reached, or another uid), -EPROTO (version mismatch),
 * -ETIMEDOUT, -ENOMEM. Thread-safe.
 */
int kvb_attach(const struct kvb_attach_opts *opts, struct kvb_ctx **out);

/*
 * Detach: tells the broker, which fails this worker's unfinished transfers
 * and frees its regions; unmaps everything. Always frees ctx. Returns 0.
 * Not thread-safe with other calls on the same ctx.
 */
int kvb_detach(struct kvb_ctx *ctx);

/* Worker id the broker gave this context (for logs). Thread-safe. */
uint32_t kvb_worker_id(const struct kvb_ctx *ctx);

/* Region access flags */
#define KVB_MEM_REMOTE_WRITE 0x1u /* peers may WRITE into this region */
#define KVB_MEM_REMOTE_READ  0x2u /* peers may READ from this region */

struct kvb_region {
	uint32_t id;
	uint32_t flags;
	void *addr; /* this process's mapping (device pointer for GPU) */
	uint64_t size;
	uint32_t gpu;	/* 1 = GPU memory (kvb_mem_register_gpu) */
	uint32_t alias; /* 1 = a view of another region (kvb_mem_alias) */
};

/*
 * Allocate a region of `size` bytes shared with the broker (memfd). `key` is
 * a user label (e.g. the layer index) that peers use in kvb_mem_lookup().
 * The mapping asks for transparent huge pages (MADV_HUGEPAGE): the kernel
 * backs it with 2 MiB pages where /sys/kernel/mm/transparent_hugepage/
 * shmem_enabled is `advise` or `always` (not under Debian's default
 * `never`). Returns 0, -EINVAL, -ENOMEM, -ETIMEDOUT, -EPIPE. Thread-safe.
 */
int kvb_mem_alloc(struct kvb_ctx *ctx, uint64_t size, uint32_t flags,
		  uint64_t key, struct kvb_region *out);

/*
 * Register memory the worker already holds as a memfd: `size` bytes at
 * `fd_offset` (a multiple of 4096), all inside the file. The fd is
 * duplicated to the broker; the caller keeps its own. The broker maps the
 * file and must not find it shorter later, so it takes only files sealed
 * against shrinking: the library adds F_SEAL_SHRINK to the file where it
 * can (a memfd created with MFD_ALLOW_SEALING; the seal is permanent: the
 * file can grow, never shrink). out->addr is NULL (map it yourself).
 * Returns 0, -EINVAL (bad arguments, not a regular file, region past the
 * end of the file), -EPERM (the file cannot be sealed: a memfd without
 * MFD_ALLOW_SEALING, a shm_open() file), -EPIPE, or -errno. Thread-safe.
 */
int kvb_mem_register_fd(struct kvb_ctx *ctx, int fd, uint64_t fd_offset,
			uint64_t size, uint32_t flags, uint64_t key,
			struct kvb_region *out);

/*
 * Register GPU memory: a device pointer of `size` bytes on `device`. The
 * library exports it (HIP/CUDA IPC handle) for the broker. Returns 0,
 * -ENODEV (no GPU runtime here), or -errno. Thread-safe.
 */
int kvb_mem_register_gpu(struct kvb_ctx *ctx, void *dev_ptr, uint64_t size,
			 int device, uint32_t flags, uint64_t key,
			 struct kvb_region *out);

/*
 * Free a region (allocated, registered or an alias). Descriptors already
 * submitted against it still complete: those this context submitted before the
 * call (the broker takes its ring's entries before freeing, also when this
 * context has not reaped its completions; only when the broker's in-flight
 * table stays full are some left, and then those naming the region fail
 * with -EINVAL, logged) and those of other workers the broker already
 * took.
 * Returns 0, -ENOENT, -EBUSY (aliases of it live: kvb_mem_alias; nothing
 * changed), -EPIPE. Thread-safe.
 */
int kvb_mem_free(struct kvb_ctx *ctx, struct kvb_region *r);

/*
 * A new region of this worker over bytes [offset, offset + size) of its
 * region `parent` (any byte offset; offset + size <= parent->size): for
 * one backing buffer holding every layer, as vLLM allocates it, with a
 * region per layer view that kvb_mem_set_kv() and descriptors (source or
 * destination, same node or across nodes) take like any region. No memory
 * is mapped: the broker's mapping of the parent serves the alias, and
 * out->addr = parent->addr + offset (NULL where the parent's addr is NULL:
 * kvb_mem_register_fd), out->alias = 1. `flags` (KVB_MEM_REMOTE_*) and
 * `key` are the alias's own, as kvb_mem_alloc's. An alias takes a slot of
 * the broker's region table (65,536 for the node) as any region does.
 *
 * The parent must be a live host region of this worker (kvb_mem_alloc or
 * kvb_mem_register_fd), not an alias itself. GPU regions: -EOPNOTSUPP.
 * kvb_mem_free(parent) while aliases of it live returns -EBUSY and changes
 * nothing (the worker's mapping stays): free the aliases first. Freeing an
 * alias unmaps nothing in the worker. Ops in flight on an alias keep the
 * parent's memory mapped in the broker until they ended; kvb_detach()
 * frees everything in any order.
 *
 * Returns 0, -EINVAL (bad arguments, range outside the parent, size 0,
 * unknown flags), -ENOENT (no such live region of this worker),
 * -EOPNOTSUPP (GPU parent, or the parent is an alias), -ENOSPC (region
 * table full), -ETIMEDOUT, -EPIPE. Thread-safe.
 */
int kvb_mem_alias(struct kvb_ctx *ctx, const struct kvb_region *parent,
		  uint64_t offset, uint64_t size, uint32_t flags, uint64_t key,
		  struct kvb_region *out);

struct kvb_remote_region {
	uint32_t id;
	uint32_t flags;
	uint64_t size;
};

/*
 * Find a region another worker on this node registered with remote access:
 * by its owner's identity and the key it registered with. Returns 0,
 * -ENOENT, -EPIPE. Thread-safe.
 */
int kvb_mem_lookup(struct kvb_ctx *ctx, enum kvb_role role, uint32_t dp_rank,
		   uint32_t tp_rank, uint64_t key,
		   struct kvb_remote_region *out);

/*
 * Open a transfer by its id string (e.g. "tx-<uuid>", at most 255 bytes).
 * The broker interns it; *handle names it in descriptors. Opening the same id
 * twice returns the same handle. Returns 0, -EINVAL, -ESTALE (the id is
 * terminal), -ENOSPC, -EPIPE. Thread-safe.
 */
int kvb_transfer_open(struct kvb_ctx *ctx, const char *transfer_id,
		      uint32_t *handle);

/*
 * Open n transfers (1..KVB_TRANSFER_OPEN_BATCH_MAX) in one round trip to the
 * broker: ids[i] as kvb_transfer_open would, handles[i] its handle. Each id
 * succeeds or fails on its own: status[i] (when status is not NULL) is 0 or
 * that id's -errno, and handles[i] is 0 where it failed. Returns 0 when all
 * were opened, else the first failing id's status; -EINVAL before asking
 * the broker when n is out of range or an id is NULL, empty or longer than
 * 255 bytes; -EPIPE. One control round trip wakes the caller once, where n
 * kvb_transfer_open calls wake it n times: open the requests of a step
 * together. Thread-safe.
 */
#define KVB_TRANSFER_OPEN_BATCH_MAX 64u
int kvb_transfer_open_batch(struct kvb_ctx *ctx, const char *const *ids,
			    unsigned n, uint32_t *handles, int *status);

/*
 * A transfer's clocks (docs/deadlines.md), each in ms, 0 = leave as it is
 * (the broker's defaults until set):
 * - deadline_ms: the whole transfer, counted from this call (from the open
 *   until set; default --transfer-deadline, 600 s). Waiting its turn (opened,
 *   nothing submitted, no peer activity) counts only against this one.
 * - stall_ms: once anything happened (an op submitted or completed, a
 *   peer's write_done), no progress for this long fails it (default
 *   --stall-timeout, alias --transfer-timeout, 30 s).
 * - defer_ms: cross-node only: how long its layer ops wait for the peer's
 *   remote_blocks (default --defer-timeout, 60 s); -EINVAL for a same-node
 *   transfer.
 * A clock that runs out fails the transfer with -ETIMEDOUT; the failure
 * completion comes once no byte of it can still land (its ops in flight
 * ended; a cross-node D transfer in WRITE mode waits for its P writers to
 * say they stopped, for its stall timeout at most). Returns 0, -EINVAL (a value
 * over 86400 s, a NULL ctx or handle 0), -ESTALE (unknown, ended or failing
 * handle), -EPIPE, -ETIMEDOUT. One control round trip; thread-safe. Needs a
 * broker of this release (an older one drops the connection on the unknown
 * request).
 */
int kvb_transfer_set_timeouts(struct kvb_ctx *ctx, uint32_t handle,
			      uint32_t deadline_ms, uint32_t stall_ms,
			      uint32_t defer_ms);

/* A descriptor. Flags: KVB_DESC_UNSIGNALED (no completion on success); every
 * other bit is reserved and refused (-EINVAL). */
#define KVB_DESC_UNSIGNALED 0x1u

struct kvb_desc {
	uint32_t transfer; /* handle from kvb_transfer_open */
	uint16_t layer;
	uint16_t flags;
	uint32_t region;      /* local region id */
	uint32_t peer_region; /* remote region id */
	uint64_t offset;      /* in the local region */
	uint64_t peer_offset; /* in the remote region */
	uint64_t len;
	uint64_t tag;  /* echoed in the completion */
	uint32_t peer; /* peer node; 0 = this node */
};

/*
 * Submit up to n WRITE descriptors (local region -> peer region). Never
 * blocks: returns how many were queued (0..n, a burst), -EAGAIN when none fit
 * (ring full: poll completions and retry), -EPIPE, -EINVAL (a descriptor with
 * a flag bit other than KVB_DESC_UNSIGNALED: nothing of the call is queued).
 * Single submitting thread. The broker refuses a descriptor (its completion:
 * -EINVAL, -EFAULT when out of bounds) whose regions are unknown, not the
 * caller's / not granted, whose source and destination overlap in one
 * region, or (written into the ring past this library) whose ring entry has
 * undefined flag bits.
 */
int kvb_submit_write(struct kvb_ctx *ctx, const struct kvb_desc *d, unsigned n);

/* Same for READ descriptors (peer region -> local region). */
int kvb_submit_read(struct kvb_ctx *ctx, const struct kvb_desc *d, unsigned n);

/*
 * Seal a transfer: it is done once `expected` descriptors (writes or reads)
 * of it have completed; then a KVB_COMP_TRANSFER completion with `tag`
 * arrives (status 0, or the first error). On a D worker (the receiving side)
 * `expected` is the number of peer workers whose writes it waits for (their
 * write_done). Returns 0, -EAGAIN, -EPIPE. Single submitting thread.
 */
/*
 * kvb_transfer_seal for n transfers at once: handles[i] sealed with
 * expected[i], its KVB_COMP_TRANSFER tagged tags[i]; one wake-up of the
 * broker (a step's seals, as a vLLM connector makes them). A burst: returns
 * how many went in (the first ones, 1..n; 0 when n is 0), -EAGAIN when
 * none fit (ring full), -EINVAL (an array NULL with n), -EPIPE. Single
 * submitting thread.
 */
int kvb_transfer_seal_many(struct kvb_ctx *ctx, const uint32_t *handles,
			   const uint32_t *expected, const uint64_t *tags,
			   unsigned n);

int kvb_transfer_seal(struct kvb_ctx *ctx, uint32_t handle, uint32_t expected,
		      uint64_t tag);

/*
 * Abort a transfer: it completes with -ECANCELED, once its ops in flight
 * ended (queued ones are dropped, each completing with -ECANCELED): after
 * that completion no byte of it moves, from or into this worker's memory;
 * a later write of another worker into this one's memory under the same id
 * is refused (-ECANCELED, counted as late_writes_refused). Single
 * submitting thread.
 */
int kvb_transfer_abort(struct kvb_ctx *ctx, uint32_t handle, uint64_t tag);

/*
 * ---- Cross-node transfers (MoRIIO's WRITE and READ modes) ----
 *
 * The broker must run with --host-ip (it then binds every worker's notify
 * ports and its handshake port, and opens the tcp transport).
 *
 * KV layout of a layer: a region holds one layer's KV tensor, dense, shaped
 * [2, num_blocks, block_size, heads, head_dim] (KVB_KV_KV_FIRST) or
 * [num_blocks, 2, block_size, heads, head_dim] (KVB_KV_BLOCK_FIRST), or
 * [num_blocks, block_size, heads, head_dim] with a head's K and V side by
 * side in head_dim (KVB_KV_PACKED: vLLM 0.29 and later, whose per-layer
 * views are [blocks, heads, tokens, K+V] over memory in this order under
 * its default layout), with elements of elem_size bytes. Peers address it
 * by layer and block id. A PACKED layer moves only to and from PACKED
 * layers (the same bytes mean other things in the split layouts).
 */
#define KVB_KV_KV_FIRST	   0u
#define KVB_KV_BLOCK_FIRST 1u
#define KVB_KV_PACKED	   2u

struct kvb_kv_geometry {
	uint32_t
		layout; /* KVB_KV_KV_FIRST, KVB_KV_BLOCK_FIRST, KVB_KV_PACKED */
	uint32_t num_blocks;
	uint32_t block_size; /* tokens per block */
	uint32_t num_heads;  /* KV heads held by this worker */
	uint32_t head_dim;
	uint32_t elem_size; /* bytes per element (2 for bf16) */
};

/*
 * Declare that region `region` (of this worker) holds layer `layer` with
 * this layout; it is then offered to peer brokers in the handshake. One
 * region per layer per worker. Returns 0, -EINVAL (bad layout, the tensor
 * does not fit the region), -ENOENT, -EEXIST (layer already declared),
 * -EPIPE. Thread-safe.
 */
int kvb_mem_set_kv(struct kvb_ctx *ctx, uint32_t region, uint32_t layer,
		   const struct kvb_kv_geometry *layout);

/*
 * Handshake with the broker of another node, reached at host:port (its
 * --handshake-port). The broker caches peers: every worker gets the same
 * peer number for the same address. A later call refreshes what the broker
 * knows of the peer (its workers and regions). Returns 0 with *peer set,
 * -EHOSTUNREACH / -ETIMEDOUT (no answer), -EPROTONOSUPPORT (other version),
 * -EACCES (not in --trusted-hosts, either side), -ENOTCONN (the broker has
 * no --host-ip), -EPIPE. Thread-safe.
 *
 * The broker answers when the handshake ends: up to 3 s for a peer that does
 * not answer. A call whose timeout_ms ran out before that (-ETIMEDOUT) leaves
 * the handshake going; the next kvb_peer_connect on this context first waits
 * for it to end (within its own timeout_ms) and only then asks.
 */
int kvb_peer_connect(struct kvb_ctx *ctx, const char *host, uint16_t port,
		     uint32_t *peer);

enum kvb_xfer_mode {
	KVB_XFER_WRITE = 0, /* P pushes into D (MoRIIO's default) */
	KVB_XFER_READ = 1,  /* D pulls from P (MoRIIO read_mode) */
};

/* Flags of struct kvb_remote_xfer */
#define KVB_XFER_F_NO_ANNOUNCE	 0x1u /* D/WRITE: do not send remote_blocks */
#define KVB_XFER_F_PLAIN_RELEASE 0x2u /* D/READ: plain-string release */
/* D/WRITE, kvb_transfer_open_remote_batch: no blocks, only a release */
#define KVB_XFER_F_RELEASE_ONLY 0x4u

struct kvb_remote_xfer {
	uint32_t peer;		 /* from kvb_peer_connect */
	uint32_t mode;		 /* enum kvb_xfer_mode */
	uint32_t flags;		 /* KVB_XFER_F_* */
	uint32_t remote_dp_rank; /* D: the P instance's DP rank */
	const uint32_t *blocks;	 /* this worker's block ids */
	uint32_t nblocks;
	const uint32_t *remote_blocks; /* D/READ: P's block ids */
	uint32_t nremote;
	const char *notify_host; /* NULL: the peer's host */
	uint16_t notify_port;	 /* 0: the peer's notify port base */
};

/*
 * Open a cross-node transfer named transfer_id (echoed verbatim on the wire).
 * What follows depends on this worker's role and the mode:
 *
 * - P, WRITE: `blocks` are P's block ids. Submit one kvb_submit_layer() per
 *   layer as its KV is ready; writes wait for D's remote_blocks (at most
 *   --defer-timeout). Seal with the number of layers: after every layer
 *   landed the broker sends write_done to each D rank written and the seal's
 *   KVB_COMP_TRANSFER follows. A typed release (D's abort) ends it with
 *   -ECANCELED.
 * - D, WRITE: `blocks` are D's block ids; the broker sends remote_blocks to
 *   every P TP rank of remote_dp_rank (once per node and transfer id). Seal
 *   with the number of write_done messages to wait for (1: each D rank is
 *   written by one P rank).
 * - D, READ: `blocks` are D's, `remote_blocks` P's (as many). Submit one
 *   kvb_submit_layer() per layer, seal with the number of layers; when all
 *   reads are done (or failed) the broker sends release to the P rank read
 *   from, then completes the transfer.
 * - P, READ: `blocks` are P's; seal with 0: the transfer completes when D's
 *   release ACKs arrived (consumer_tp / producer_tp of them when D has the
 *   larger TP, else one). It holds those blocks: the broker serves peers'
 *   tcp reads of this worker's KV blocks only while a READ transfer of it
 *   holds them (-EACCES to the reader otherwise), so open it before D
 *   reads.
 *
 * A transfer that cannot finish fails by one of its clocks (deadline, stall
 * or defer timeout: kvb_transfer_set_timeouts) with a status; none stays
 * pending. Returns 0 with *handle,
 * -EINVAL (also: blocks or remote_blocks NULL with a count; a flag this
 * call does not take: KVB_XFER_F_RELEASE_ONLY is the batch call's), -ENOENT
 * (unknown peer), -EEXIST (this worker opened that id already and the
 * transfer is live: refused, counted in remote.duplicate_opens, logged;
 * the live transfer goes on), -EBUSY (the id is a same-node transfer of
 * this worker), -ESTALE (the id ended already), -ENOSPC, -E2BIG (the
 * block lists, 4 bytes a block, do not fit in one control message: about
 * 16000 blocks in all), -EPIPE. A transfer the peer's messages created
 * before this open (an early remote_blocks, a write_done) is not a
 * duplicate: the open takes it. Thread-safe.
 */
int kvb_transfer_open_remote(struct kvb_ctx *ctx, const char *transfer_id,
			     const struct kvb_remote_xfer *x, uint32_t *handle);

/* One entry of kvb_transfer_open_remote_batch: a cross-node transfer to the
 * peer broker at host:port, no kvb_peer_connect() needed. */
struct kvb_remote_open {
	const char *transfer_id; /* 1..255 bytes, NUL-terminated */
	const char *host;	 /* the peer broker's --host-ip (< 64 bytes) */
	uint16_t port;		 /* its --handshake-port */
	uint16_t pad;		 /* 0 */
	uint32_t mode;		 /* enum kvb_xfer_mode */
	uint32_t flags;		 /* KVB_XFER_F_* */
	uint32_t remote_dp_rank; /* D: the P instance's DP rank */
	const uint32_t *blocks;	 /* this worker's block ids */
	uint32_t nblocks;
	const uint32_t *remote_blocks; /* D/READ: P's block ids */
	uint32_t nremote;
};

/* Entries one control message carries at most (more: several messages) */
#define KVB_REMOTE_OPEN_BATCH_MAX 1024u

/*
 * Open n cross-node transfers by their peer's address, in one control round
 * trip (several only where the entries do not fit one control message of
 * 64 KiB, or pass KVB_REMOTE_OPEN_BATCH_MAX: one per such part, in order).
 * Each entry is what kvb_transfer_open_remote() opens with the peer that
 * kvb_peer_connect(host, port) would give, and succeeds or fails on its
 * own. The call never waits for a handshake:
 *
 * - peer known (handshaken before, by anyone on this node): opened as
 *   kvb_transfer_open_remote() opens (D/WRITE announces its blocks now).
 * - peer not known, or its handshake running: the broker starts (or
 *   joins) the handshake and opens the transfer waiting for the peer.
 *   Layer ops, seal and abort are taken as usual: layer ops wait (deferred)
 *   and nothing is sent to the peer. When the handshake succeeds the
 *   transfer goes on as one opened after kvb_peer_connect() (D/WRITE:
 *   remote_blocks goes out then; P/READ: the ACK count from the peer's
 *   descriptor). When it fails (-ETIMEDOUT: no answer within 3 s;
 *   -EACCES, -EPROTONOSUPPORT, ... as kvb_peer_connect would return), each
 *   transfer waiting for it fails with that status: its deferred layer ops
 *   complete with it at once, later ones are refused with it, and its one
 *   KVB_COMP_TRANSFER carries it: at once when it was sealed already,
 *   else at its seal or abort (with that call's tag), or at its deadline
 *   if neither comes. Counted: remote.opens_waiting (opened waiting),
 *   remote.handshake_wait_failed (transfers failed so).
 * - a peer whose handshake failed less than 1 s ago (and that has no
 *   descriptor from before): the entry fails at once with that failure's
 *   status (counted in remote.handshake_wait_failed), no transfer opened.
 *
 * KVB_XFER_F_RELEASE_ONLY (D, WRITE only; blocks may be none and are not
 * used): D dropped the request before anything was written. The broker
 * sends a typed release for transfer_id to every P TP rank of
 * remote_dp_rank at the peer (after its handshake where it runs), once per
 * node and id: where another D worker here released the id already, or is
 * waiting to, nothing more is sent. P's broker ends its transfer with
 * -ECANCELED at once (or refuses the id later, -ESTALE, if P had not
 * opened it). The D transfer is done then: seal it with 0 (the count is
 * not used); its KVB_COMP_TRANSFER has status 0 when the release went out
 * (or was another D worker's to send), else the reason (-EHOSTUNREACH: no
 * P worker of that DP rank at the peer; the handshake's failure).
 * Counted: remote.release_only_sent / remote.release_only_failed.
 *
 * Returns 0 when the broker answered every part: then status[i] is 0 with
 * handles[i] set, or that entry's -errno with handles[i] 0: -EINVAL (bad
 * entry: id empty or too long, host empty or >= 64 bytes, port 0, mode,
 * unknown flags, blocks NULL with a count, block lists that the role and
 * mode do not take), -EACCES (host not in --trusted-hosts), -EEXIST (id
 * opened and live already: see kvb_transfer_open_remote), -EBUSY,
 * -ESTALE, -ENOSPC (this worker's share of the transfer table, or the
 * peer table full), -EAGAIN (completions not reaped: --max-undelivered),
 * -ENOTCONN (the broker has no --host-ip), -ENOMEM, or a handshake
 * failure (above). Returns -errno for the whole call: -EINVAL (ctx, o,
 * handles or status NULL, n 0), -E2BIG (an entry alone does not fit a
 * control message: nothing sent), -EPIPE, -ETIMEDOUT, -EPROTO; where a
 * later part failed so, the entries of the parts answered before keep
 * their status and the rest get the call's error. Thread-safe.
 */
int kvb_transfer_open_remote_batch(struct kvb_ctx *ctx,
				   const struct kvb_remote_open *o, unsigned n,
				   uint32_t *handles, int32_t *status);

/* kvb_transfer_expect flags */
#define KVB_EXPECT_WITHDRAW 0x1u /* no longer expected: tell D at once */

/* Ids one call takes at most */
#define KVB_EXPECT_MAX 1024u

/*
 * P, WRITE mode: the transfer ids this worker will open (as soon as its
 * engine has the request, long before it opens the transfer), in one
 * control round trip. A D announcement (remote_blocks) reaches P's
 * broker as soon as D opens, often before P opens; the broker holds it
 * until P opens, up to --unopened-timeout (60 s). Once a worker has
 * declared an expectation, an announcement for an id it neither opened
 * nor expects is held --unknown-timeout only (5 s): then D is told
 * kvb_write_failed (-ENOENT) and its transfer fails, instead of waiting
 * the whole --unopened-timeout for a transfer no one will open. An
 * expectation lasts --unopened-timeout (or until the id is opened,
 * withdrawn, or the worker detaches); an expected id that was announced
 * already gets the full --unopened-timeout from the call.
 *
 * KVB_EXPECT_WITHDRAW: the request went away before P opened its
 * transfer. An announcement held for the id (or arriving later, within
 * --unopened-timeout) is answered at once with kvb_write_failed
 * (-ECANCELED), so D's transfer fails now. An id the worker opened
 * already is left alone (abort it).
 *
 * Workers that never call this keep the --unopened-timeout for every
 * announcement. Returns 0 with status[i] per id: 0, -EINVAL (empty or
 * longer than KVB_XFER_ID_MAX), -ESTALE (the id ended already), -ENOSPC
 * (the worker holds 4096 expectations), -ENOTCONN (no --host-ip); or
 * -errno for the whole call: -EINVAL (ctx, ids or status NULL, n 0 or over
 * KVB_EXPECT_MAX, unknown flags), -E2BIG (the ids do not fit one control
 * message), -EPIPE, -ETIMEDOUT, -EPROTO. Thread-safe.
 */
int kvb_transfer_expect(struct kvb_ctx *ctx, const char *const *ids, unsigned n,
			unsigned flags, int32_t *status);

/*
 * Queue the cross-node write (P/WRITE) or read (D/READ) of one layer of a
 * transfer opened with kvb_transfer_open_remote(). Completes as one
 * descriptor (KVB_COMP_DESC with `tag`, status 0 or -errno; KVB_DESC_UNSIGNALED
 * in flags: only on failure). A second submission of the same layer is
 * queued all the same (the call returns 1) and refused by the broker: its
 * completion has status -EEXIST. Returns 1, -EAGAIN (ring full), -EPIPE.
 * Single submitting thread.
 */
int kvb_submit_layer(struct kvb_ctx *ctx, uint32_t handle, uint16_t layer,
		     uint64_t tag, uint32_t flags);

/*
 * kvb_submit_layer for n transfers at once, the same layer: handles[i]'s
 * layer op completes with tags[i] (flags as kvb_submit_layer's, for all).
 * One call per layer for a step's requests, as a vLLM connector's
 * save_kv_layer makes them; one wake-up of the broker. A burst: returns how
 * many went in (the first ones, 1..n; 0 when n is 0), -EAGAIN when none
 * fit (ring full), -EINVAL (handles or tags NULL with n, unknown flags),
 * -EPIPE. Each op is checked by the broker as kvb_submit_layer's is.
 * Single submitting thread.
 */
int kvb_submit_layers(struct kvb_ctx *ctx, const uint32_t *handles,
		      const uint64_t *tags, unsigned n, uint16_t layer,
		      uint32_t flags);

enum kvb_comp_kind {
	KVB_COMP_DESC = 1,     /* one descriptor */
	KVB_COMP_TRANSFER = 2, /* a whole transfer ended */
	KVB_COMP_SHUTDOWN = 3, /* the broker is going away */
};

struct kvb_completion {
	uint64_t tag;
	uint64_t bytes;
	int32_t status; /* 0 or -errno: -EFAULT/-EINVAL refused, -ETIMEDOUT ...
			 */
	uint32_t transfer;
	uint32_t kind; /* enum kvb_comp_kind */
};

/*
 * Reap up to max completions without blocking. Returns the count (0 if none),
 * or -EPIPE when the broker is gone and nothing is left. Single completing
 * thread.
 */
int kvb_poll(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max);

/*
 * Wait up to timeout_ms (-1 = no limit, but never past the broker's death)
 * for at least one completion: busy-polls briefly, then sleeps on an eventfd.
 * The busy-poll adapts, between 1 and 20 us: it shrinks while waits end up
 * asleep anyway and grows back when completions come during it.
 * Returns the count, -ETIMEDOUT, or -EPIPE. Single completing thread.
 */
int kvb_wait(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max,
	     int timeout_ms);

/*
 * kvb_wait for at least `min` completions (min is taken as 1 when 0, and at
 * most max and the completion ring's size): it sleeps until that many are
 * there, so a worker that needs a batch (a step's transfers) is woken once,
 * not once per completion. Returns early with what it has when the timeout
 * runs out (-ETIMEDOUT: nothing), when the broker goes away (-EPIPE:
 * nothing), or with a KVB_COMP_SHUTDOWN. Completions that never come (fewer
 * transfers in flight than min) are only ended by the timeout. Single
 * completing thread.
 */
int kvb_wait_min(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max,
		 unsigned min, int timeout_ms);

/*
 * The broker's counters, as kvbctl stats prints them: one JSON object
 * (json != 0) or a table, NUL-terminated in buf (at most len bytes; the
 * text is under 64 KiB). Asked over this context's control socket (a
 * control call: within timeout_ms; no second connection, so it works with
 * --max-workers reached). Returns the text's length (without the NUL),
 * -EINVAL, -ENOSPC (does not fit: buf holds ""), -ENOMEM, -ETIMEDOUT,
 * -EPIPE. Thread-safe.
 */
int kvb_stats(struct kvb_ctx *ctx, int json, char *buf, unsigned long len);

/* Human-readable text for a status. Thread-safe. */
const char *kvb_strerror(int status);

#ifdef __cplusplus
}
#endif
#endif /* KVBROKER_H */

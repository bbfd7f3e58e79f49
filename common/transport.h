/* SPDX-License-Identifier: MIT */
/*
 * The transport ops table. The broker hands a transport chains of transfer
 * operations per destination endpoint and polls completions back; a transport
 * never sees a worker, a transfer id or a ring.
 *
 * Contract every backend keeps:
 * - post() accepts a prefix of the chain (its credit) and returns how many it
 *   took (0..n) or -errno; the broker keeps the rest pending. One post() call
 *   that accepts >= 1 op is one doorbell.
 * - every accepted op completes exactly once through poll(), with status 0 or
 *   -errno, and the cookie it was posted with.
 * - close() completes nothing; the broker fails what it still tracks.
 *
 * Counting: `doorbells` = chains handed to the hardware (ibv_post_send calls,
 * writev calls, copy batches, or memcpy flushes); `wrs` = work requests in
 * those chains after merging.
 */
#ifndef KVB_BRIDGE_TRANSPORT_H
#define KVB_BRIDGE_TRANSPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *) ((char *) (ptr) -offsetof(type, member)))
#endif

enum kvb_mem_kind { KVB_MEM_HOST = 0, KVB_MEM_GPU = 1 };

/* Slots of kvb_mr.tpriv[] */
#define KVB_TPRIV_MAX 4

/* A memory region as the broker sees it (mapped in the broker). */
struct kvb_mr {
	uint32_t id;
	uint32_t flags; /* KVB_MEM_* access flags of the public header */
	enum kvb_mem_kind kind;
	int gpu_device; /* for KVB_MEM_GPU */
	void *addr;	/* broker-side address (host or device pointer) */
	/* KVB_MEM_GPU: the GPU's PCI bus id ("0000:19:00.0", "" unknown), so
	 * that a transport with several NICs registers it on the nearest */
	char pci[24];
	uint64_t len;
	void *tpriv[KVB_TPRIV_MAX]; /* per-transport registration:
				       kvb_transport_tpriv() */
	uint32_t lkey, rkey;	    /* filled by a transport that has keys */
};

/* NICs one transport drives at most (rdma: verbs devices) */
#define KVB_NIC_MAX 8

/* Remote side of an op: a region on this node, or an address + key. */
struct kvb_remote {
	struct kvb_mr *mr; /* same-node transports */
	uint64_t addr;	   /* cross-node: remote virtual address of offset 0 */
	uint32_t rkey;	   /* the region's key on the peer's NIC `nic` */
	uint32_t region;   /* remote region id (tcp validates it remotely) */
	/*
	 * A peer with several NICs registers each region on every one of
	 * them: rkeys[i] is its key on the peer's NIC i (the order of the
	 * peer's connection blob), nrkeys of them (0: rkey alone). nic: the
	 * peer's NIC nearest the region (where its traffic should land).
	 * rkeys points into the peer's descriptor (owned by the caller; valid
	 * for the post() call).
	 */
	const uint32_t *rkeys;
	uint8_t nrkeys;
	uint8_t nic;
};

enum kvb_xop_code { KVB_XOP_WRITE = 1, KVB_XOP_READ = 2 };

struct kvb_xop {
	uint32_t opcode; /* enum kvb_xop_code */
	uint32_t pad;
	struct kvb_mr *local;
	uint64_t local_off;
	struct kvb_remote remote;
	uint64_t remote_off;
	uint64_t len;
	uint64_t cookie;
};

struct kvb_xcqe {
	uint64_t cookie;
	int32_t status;
	uint32_t pad;
};

#define KVB_WR_HIST_BUCKETS 12 /* 1, 2-3, 4-7, ... , >= 1024 */

struct kvb_transport_stats {
	uint64_t doorbells;
	uint64_t wrs;
	uint64_t bytes;
	uint64_t cqes;
	uint64_t credit_stalls;
	uint64_t errors;
	uint64_t post_ns; /* rdma: wall time in ibv_post_send (when timed) */
	/* rdma, when timed: the thread's CPU time inside ibv_post_send on a
	 * random 1 in 16 doorbells (net of the clock's cost), and the WRs
	 * of those doorbells */
	uint64_t post_cpu_ns;
	uint64_t post_cpu_wrs;
	uint64_t wr_hist[KVB_WR_HIST_BUCKETS];
};

/* Histogram bucket of a chain of n WRs. */
static inline unsigned kvb_wr_hist_bucket(uint64_t n)
{
	unsigned b = 0;

	while (n > 1 && b < KVB_WR_HIST_BUCKETS - 1) {
		n >>= 1;
		b++;
	}
	return b;
}

/* Account one doorbell of n WRs carrying `bytes`. */
static inline void kvb_stats_doorbell(struct kvb_transport_stats *s, uint64_t n,
				      uint64_t bytes)
{
	s->doorbells++;
	s->wrs += n;
	s->bytes += bytes;
	s->wr_hist[kvb_wr_hist_bucket(n)]++;
}

struct kvb_transport_params {
	/* rdma: --rdma-dev, one device or a comma-separated list (NULL = the
	 * first usable one; "all" = every usable device) */
	const char *dev_name;
	int ib_port;	     /* rdma: --ib-port */
	int gid_index;	     /* rdma: --gid-index */
	int post_batch_size; /* max WRs per chain, -1 = all pending */
	int qp_per_peer;     /* rdma: QPs (--qp-per-transfer), tcp: connections
			      * (--tcp-conns) per connect(); 0 = 1 */
	int gpu_streams;     /* gpu: --gpu-streams */
	int signal_every;    /* signal at least every N WRs (0 = default) */
	uint32_t sq_depth;   /* send queue depth / credit per endpoint */
	const char *host_ip; /* tcp: listen address (NULL = 0.0.0.0) */
	uint32_t tcp_port;   /* tcp: listen port, 0 = ephemeral */
	int timeout_ms;	     /* tcp: connect / stalled-peer limit, 0 = 10000 */
	int copy_threads;    /* local: copy pool size, 0 = copy in post() */
	uint64_t copy_piece; /* local: bytes per pooled copy, 0 = 256 KiB */
	int copy_plain; /* local: 1 = memcpy only (no non-temporal stores) */
	int max_qps;	/* rdma: QPs per device at most (--max-qps), 0 = the
			 * device's own limit */
};

/* One NIC of a transport (ops->nics): for kvbctl, the log and metrics */
struct kvb_transport_nic {
	char name[64]; /* "mlx5_0", "rxe1" */
	int port;      /* port number used */
	int port_up;   /* 1: active; 0: down (takes no new chains) */
	int numa;      /* NUMA node (-1: unknown) */
	char pci[32];  /* PCI address ("" unknown) */
	uint64_t bytes, wrs, doorbells; /* chains posted through it */
	uint64_t regions;		/* regions whose nearest NIC it is */
	uint32_t qps, max_qps;		/* QPs now, and the budget */
	uint64_t qp_refused;		/* connects refused by the budget */
	uint64_t moved;			/* chains sent through it because
					   the region's own NIC was down */
	uint64_t qp_parked; /* its QPs that failed and were parked while
			       their endpoint went on through other NICs */
};

struct kvb_transport;
struct kvb_ep; /* a destination: a QP set, a socket, a device pair, a worker */

/* Lines a transport hands its caller's log function, by level. */
enum { KVB_TLOG_INFO, KVB_TLOG_WARN, KVB_TLOG_ERR };
/* What a transport's resolve() found (ops below) */
struct kvb_transport_where {
	char dev[64];
	char why[256];
};

typedef int (*kvb_write_gate_fn)(void *arg, uint32_t region, uint64_t off,
				 uint64_t len);
typedef void (*kvb_transport_log_fn)(void *arg, int level, const char *line);

/* An endpoint's state (ops->ep_state, where connect() alone does not make
 * it ready: a two-message handshake, see ep_info) */
enum kvb_ep_state {
	KVB_EP_STATE_HALF = 1,	/* waiting for the peer's blob */
	KVB_EP_STATE_READY = 2, /* posts go through */
	KVB_EP_STATE_RESET = 3, /* reset after an error: handshake again */
};

/* A per-peer key of a transport that authenticates its peers */
#define KVB_TRANSPORT_KEY_LEN 32

/*
 * Optional table of a transport that serves peers' connections itself and
 * authenticates them (tcp's data port, docs/tcp.md "Authentication"); the
 * cross-node module derives the keys and says who may connect.
 */
struct kvb_transport_auth_ops {
	/* this transport's id (what its blob carries) */
	uint64_t (*id)(struct kvb_transport *t);
	/* the id a peer's blob carries: 0 or -EPROTO */
	int (*blob_id)(const void *blob, size_t len, uint64_t *id);
	/* serving side: the dialer `id` may connect proving key and address
	 * regions[0..n) (n < 0: every one); 0 or -errno */
	int (*peer_allow)(struct kvb_transport *t, uint64_t id,
			  const uint8_t key[KVB_TRANSPORT_KEY_LEN],
			  const uint32_t *regions, int n);
	/* ... no longer: its connections close */
	void (*peer_forget)(struct kvb_transport *t, uint64_t id);
	/* dialing side: the key an endpoint proves; 0 or -EINVAL */
	int (*ep_set_key)(struct kvb_transport *t, struct kvb_ep *ep,
			  const uint8_t key[KVB_TRANSPORT_KEY_LEN]);
	/* only these numeric source addresses may connect (n = 0: any) */
	int (*set_trusted)(struct kvb_transport *t, const char *const *hosts,
			   unsigned n);
	/* caps: connections, per source address, ms to authenticate */
	void (*set_limits)(struct kvb_transport *t, unsigned max_conns,
			   unsigned max_per_host, unsigned auth_ms);
	/* refusals are logged (rate-limited) through fn */
	void (*set_log)(struct kvb_transport *t,
			void (*fn)(void *arg, const char *line), void *arg);
};

struct kvb_transport_ops {
	const char *name;
	/* Returns 0 or -errno; on -ENODEV `why` (if not NULL) says why. */
	int (*open)(const struct kvb_transport_params *p,
		    struct kvb_transport **out, char *why, size_t why_len);
	void (*close)(struct kvb_transport *t);
	int (*reg_mr)(struct kvb_transport *t, struct kvb_mr *mr);
	void (*dereg_mr)(struct kvb_transport *t, struct kvb_mr *mr);
	/* Connection data this side offers in the handshake; 0 or -errno. */
	int (*local_info)(struct kvb_transport *t, void *blob, size_t *len);
	int (*connect)(struct kvb_transport *t, const void *blob, size_t len,
		       struct kvb_ep **ep);
	void (*disconnect)(struct kvb_transport *t, struct kvb_ep *ep);
	/* Post a chain to one endpoint; returns ops accepted or -errno. */
	int (*post)(struct kvb_transport *t, struct kvb_ep *ep,
		    const struct kvb_xop *ops, unsigned n);
	/* Reap up to max completions; returns count or -errno. */
	int (*poll)(struct kvb_transport *t, struct kvb_xcqe *out,
		    unsigned max);
	/*
	 * Optional (NULL = none). An fd that turns readable when poll() has
	 * work to do (incoming bytes, a connection, an ack; rdma: once
	 * arm()ed, below); the broker adds it to its epoll set before
	 * sleeping. Returns the fd or -1.
	 */
	int (*wait_fd)(struct kvb_transport *t);
	/*
	 * Optional (NULL when connect(peer local_info) alone makes an endpoint
	 * ready, as for tcp). The blob of one endpoint, sent back to the peer
	 * in a two-message handshake (rdma: offer / answer, see rdma.h).
	 * *len: capacity in, size out. Returns 0, -ENOSPC or -EINVAL.
	 */
	int (*ep_info)(struct kvb_transport *t, struct kvb_ep *ep, void *blob,
		       size_t *len);
	/*
	 * Optional (NULL = none). Do one bounded slice of posted work in the
	 * caller's thread (local: copy up to 2 MiB of a pooled chain), so the
	 * broker thread adds its core to a copy pool between rounds without
	 * long rounds. Returns slices done (0: nothing waiting).
	 */
	int (*progress)(struct kvb_transport *t);
	/*
	 * Optional (NULL when wait_fd() turns readable by itself). Where it
	 * is set, wait_fd() turns readable only after it: a caller about to
	 * sleep on wait_fd() calls it first, to have the fd turn readable at
	 * the next completion (rdma: a CQ event). Returns 1 when completions
	 * are already waiting for poll() (do not sleep), else 0.
	 */
	int (*arm)(struct kvb_transport *t);
	/*
	 * Optional, for the cross-node module (NULL = not offered):
	 * ep_state(): enum kvb_ep_state of an endpoint (NULL: connect()
	 * makes it ready). connect_host(): connect() to a peer whose blob may
	 * name no address: dial `host` (numeric, the address its control
	 * channel was reached at) at the blob's port. reg_dmabuf(): register
	 * GPU memory given as a dmabuf fd (fd < 0: by address); 0 (dmabuf),
	 * 1 (by address) or -errno. events_fd() / events(): the device's
	 * asynchronous events: an fd readable when some are pending, and the
	 * call that reads them (lines to log, returns how many). time_posts():
	 * time the doorbells (stats post_ns). port(): the port it listens on.
	 * stats_format(): its counters for `kvbctl stats` (text or JSON) into
	 * buf, the transport's (ep NULL) or one endpoint's; returns the length
	 * (truncated to cap - 1).
	 */
	int (*ep_state)(struct kvb_transport *t, struct kvb_ep *ep);
	int (*connect_host)(struct kvb_transport *t, const void *blob,
			    size_t len, const char *host, struct kvb_ep **ep);
	int (*reg_dmabuf)(struct kvb_transport *t, struct kvb_mr *mr, int fd,
			  uint64_t offset);
	int (*events_fd)(struct kvb_transport *t);
	int (*events)(struct kvb_transport *t, kvb_transport_log_fn log,
		      void *arg);
	void (*time_posts)(struct kvb_transport *t, int on);
	int (*port)(struct kvb_transport *t);
	size_t (*stats_format)(struct kvb_transport *t, struct kvb_ep *ep,
			       int json, char *buf, size_t cap);
	/* Optional: peer authentication (above) */
	const struct kvb_transport_auth_ops *auth;
	/*
	 * Optional, serving side: a gate asked about every WRITE a peer sends,
	 * after the region checks and before a byte of it lands: fn(arg,
	 * region, off, len) returns 0 (it lands) or the negative status the
	 * op is answered with (counted as refused). NULL fn: none. The broker
	 * refuses writes into KV blocks no live transfer holds.
	 * gate_recheck(): ask again about writes whose payload is still
	 * arriving (the gate changed its mind). Same thread as poll().
	 */
	void (*set_write_gate)(struct kvb_transport *t, kvb_write_gate_fn fn,
			       void *arg);
	void (*gate_recheck)(struct kvb_transport *t);
	/*
	 * Optional, serving side: the same for every READ a peer sends
	 * (after the region checks, before a byte is sent): 0, or the
	 * negative status the op is answered with. The broker serves reads
	 * of a P worker's KV blocks only while a READ transfer of that
	 * worker holds them.
	 */
	void (*set_read_gate)(struct kvb_transport *t, kvb_write_gate_fn fn,
			      void *arg);
	/*
	 * Optional (NULL: one NIC, nothing to tell). nics(): the NICs this
	 * transport drives, up to max into out; returns how many it has.
	 * mr_nic(): the NIC index (into nics()) a registered region's
	 * traffic goes through (its nearest, or the next one while that is
	 * down); `why` (may be NULL) gets one line saying why it was chosen;
	 * -errno when mr is not registered. mr_keys(): the region's key on
	 * each NIC (what a peer puts in kvb_remote.rkeys), up to max; returns
	 * how many, *home = its nearest NIC's index.
	 */
	int (*nics)(struct kvb_transport *t, struct kvb_transport_nic *out,
		    unsigned max);
	int (*mr_nic)(struct kvb_transport *t, const struct kvb_mr *mr,
		      char *why, size_t why_len);
	int (*mr_keys)(struct kvb_transport *t, const struct kvb_mr *mr,
		       uint32_t *rkeys, unsigned max, unsigned *home);
	/*
	 * Optional, before open(): where host_ip lives (device, port, address
	 * index) when the user named none; may set p->dev_name (into
	 * w->dev), p->ib_port, p->gid_index. 0: p changed; 1: nothing to do;
	 * -errno: p unchanged, open() keeps its default rule. w->why: one line
	 * for the log either way. (rdma: librdmacm and the GID table.)
	 */
	int (*resolve)(struct kvb_transport_params *p, const char *host_ip,
		       struct kvb_transport_where *w);
};

struct kvb_transport {
	const struct kvb_transport_ops *ops;
	struct kvb_transport_stats stats;
};

/*
 * The slot of kvb_mr.tpriv[] a transport keeps its registration in: given
 * out on first use, one per ops table, the same one every time after
 * (thread-safe); -ENOSPC when all KVB_TPRIV_MAX are taken.
 */
int kvb_transport_tpriv(const struct kvb_transport_ops *ops);
/* The same, remembered in *slot (-1 at first): what a transport's hot
 * paths use; its open() calls it first and fails on -ENOSPC. */
static inline int kvb_transport_tpriv_at(int *slot,
					 const struct kvb_transport_ops *ops)
{
	int s = __atomic_load_n(slot, __ATOMIC_RELAXED);

	if (s < 0) {
		s = kvb_transport_tpriv(ops);
		__atomic_store_n(slot, s, __ATOMIC_RELAXED);
	}
	return s;
}

/*
 * The transports built in, by name ("local", "gpu", "tcp", "rdma"); NULL
 * when this build has none of that name (bridge/transports.c).
 */
const struct kvb_transport_ops *kvb_transport_find(const char *name);

/* printf into buf at *len (capacity cap), truncated: for stats_format() */
__attribute__((format(printf, 4, 5))) void
kvb_transport_put(char *buf, size_t cap, size_t *len, const char *fmt, ...);
/* ... with a va_list */
__attribute__((format(printf, 4, 0))) void
kvb_transport_vput(char *buf, size_t cap, size_t *len, const char *fmt,
		   va_list ap);

extern const struct kvb_transport_ops kvb_local_ops;
/* 1 if this local transport copies >= 32 KiB with non-temporal stores */
int kvb_local_streams(const struct kvb_transport *t);

#endif /* KVB_BRIDGE_TRANSPORT_H */

/* SPDX-License-Identifier: MIT */
/*
 * kvbench internals: shared by the subcommands (workload, rate, lat, ring).
 * Nothing here is exported: kvbench is one program.
 */
#ifndef KVB_BENCH_KVBENCH_H
#define KVB_BENCH_KVBENCH_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "transport.h"

#define KVB_BENCH_MAX_WORKERS 64u
#define KVB_BENCH_MAX_SWEEP   16u
#define KVB_BENCH_MAX_REPEAT  15u

enum { MODE_DIRECT = 1, MODE_BROKER = 2, MODE_UCX = 4 };
/* the modes' slots in the result arrays: direct, broker, ucx */
#define WL_NMODES 3u
enum {
	KVB_BENCH_TR_LOCAL = 0,
	KVB_BENCH_TR_TCP = 1,
	KVB_BENCH_TR_RDMA = 2,
	KVB_BENCH_TR_GPU = 3,
};
/* --net: where the two sides of a tcp run live */
enum { NET_AUTO = 0, NET_NETNS = 1, NET_LOOPBACK = 2 };

/*
 * Placement of a tcp run: side 0 = P (prefill node), side 1 = D (decode
 * node). With netns, two network namespaces joined by a veth pair; else both
 * on 127.0.0.1 with distinct ports.
 */
struct bench_net {
	int netns;	    /* 1: namespaces, 0: loopback */
	char ns[2][40];	    /* namespace names (netns) */
	char veth[2][16];   /* veth ends (netns) */
	char ip[2][16];	    /* P's and D's addresses */
	int hs_port[2];	    /* the brokers' --handshake-port */
	int notify_port[2]; /* the brokers' --notify-port */
	char why[160];	    /* loopback: why not namespaces */
	int rdma;	    /* rdma: one device, both brokers on ip[0] */
	char rdma_dev[64];  /* rdma: the device in use */
};

/* The workload subcommand's knobs (see workload_usage()). */
struct wl_cfg {
	unsigned workers, layers, requests, blocks, iters;
	uint64_t block_bytes;
	double rate;		    /* requests/s, 0 = back to back */
	int modes;		    /* MODE_* bits */
	int transport;		    /* KVB_BENCH_TR_* */
	int net;		    /* NET_*: where a tcp run's sides live */
	const char *rdma_ip;	    /* rdma: the brokers' --host-ip */
	const struct bench_net *nw; /* tcp: the placement in use */
	const char *gpu_backend; /* gpu: --gpu-backend (auto|cuda|hip|host) */
	char gpu_name[16];	 /* gpu: the backend in use ("host", ...) */
	int gpu_devices;	 /* gpu: devices it sees */
	int verify, progress;
	const char *json, *plot, *broker, *broker_opts;
	unsigned sweep[KVB_BENCH_MAX_SWEEP], nsweep;
	unsigned repeat;      /* trials per mode per worker count (medians) */
	unsigned iters_total; /* --iters-total: steps split among workers */
	/* ucx mode: the UCX_TLS and UCX_NET_DEVICES (per side: P, D) its
	 * workers put into their UCP configuration (NULL / "": UCX's own,
	 * from the environment or its defaults) */
	const char *ucx_tls;
	char ucx_dev[2][80];
	const char *ucx_tls_opt; /* --ucx-tls as given (NULL: not given) */
};

/* Steps per worker at w workers: --iters, or --iters-total / w rounded up. */
static inline unsigned wl_iters_for(const struct wl_cfg *c, unsigned w)
{
	if (!c->iters_total || !w)
		return c->iters;
	return (c->iters_total + w - 1) / w;
}

/*
 * What one P worker reports (in shared memory, written by the child, read
 * by the parent after it exited). lat_us[] follows the struct.
 */
struct wl_pres {
	uint64_t descs, bytes, doorbells, wrs, failed;
	/* thread CPU inside the timed post()/kvb_submit_write() calls (a
	 * sample of them: struct wl_post_timer), the clock's own cost
	 * already taken off (so a run of calls cheaper than the clock's
	 * jitter may sum below 0); post_timed: the descriptors they took */
	int64_t post_cpu_ns;
	uint64_t post_timed;
	uint64_t ctl_ns; /* wall time in kvb_transfer_open() round trips */
	uint64_t cpu_ns; /* the worker process's CPU during the run */
	int64_t end_ns;	 /* CLOCK_MONOTONIC when its last request ended */
	uint64_t nlat;
	volatile uint64_t done;	  /* requests done so far (progress line) */
	uint64_t dbad;		  /* D side: bad bytes (D workers use this) */
	uint64_t dchecked;	  /* D side: bytes verified */
	uint64_t verify_ns;	  /* D side: thread CPU spent verifying */
	volatile uint64_t opened; /* tcp broker D: requests opened so far */
	uint64_t verbs_post_ns;	  /* rdma direct: wall time in ibv_post_send */
	/* rdma direct: thread CPU in ibv_post_send on the transport's sampled
	 * doorbells (stats post_cpu_ns), and their WRs (post_cpu_wrs) */
	uint64_t verbs_post_cpu_ns, verbs_post_cpu_wrs;
	volatile int port; /* tcp direct D: the receiver's listening port */
	char ucx_info[320]; /* ucx P0: the lanes its endpoint used */
	int ok;		   /* 1 = finished cleanly */
};

/* One mode's figures, as printed and written to JSON. */
struct wl_figs {
	int valid;
	double wrs, descs, doorbells, wr_per_doorbell, post_cpu_us_per_wr;
	double worker_post_cpu_us_per_wr, msg_rate_mps, bw_gbps;
	double lat_p50_us, lat_p99_us, lat_p999_us, cpu_s;
	double cpu_workers_s, cpu_broker_s, elapsed_s, bytes, open_wait_s;
	double cpu_d_s;	  /* tcp: the D side's processes (not verifying) */
	double layer_ops; /* tcp broker: the P broker's remote layer ops */
	/* rdma: wall time inside ibv_post_send per WR (every doorbell), and
	 * the WRs of the doorbells whose CPU time was sampled */
	double post_wall_us_per_wr, post_cpu_wrs;
	uint64_t verified_bytes, bad_bytes, failed;
};

/* A broker process kvbench started. */
struct bench_broker {
	pid_t pid;
	char sock[108];
	const char *transport; /* set before start: NULL = local */
	const char *netns;     /* set before start: run it in there */
};

/* common.c */
int64_t kvb_bench_now_ns(void);
uint64_t kvb_bench_thread_cpu_ns(void);
uint64_t kvb_bench_proc_cpu_ns(void);
/* utime + stime of pid from /proc, in seconds; -1 on error */
double kvb_bench_pid_cpu_s(pid_t pid);

/*
 * Timing the posting calls on a sample of them. Reading a thread's CPU
 * clock is a system call (1.3 us each on this project's 2-core VMs, where
 * a 16-descriptor kvb_submit_write() takes ~0.1 us): timing every call
 * made the two clock reads most of a worker's CPU with small blocks, taken
 * from the cores that post and copy, in both modes. So one call in
 * WL_POST_SAMPLE (chosen at random, not by position in a step) is timed,
 * and the cost of two back-to-back reads (measured at start, the median of
 * 31) is taken off each timed call. The figure is the sampled calls' CPU
 * over the descriptors they took.
 */
#define WL_POST_SAMPLE 16
struct wl_post_timer {
	uint64_t rng;	 /* xorshift64 state */
	uint64_t ovh_ns; /* two back-to-back thread-CPU reads */
	uint64_t t0;	 /* 0: this call is not timed */
};
void wl_post_timer_init(struct wl_post_timer *pt, uint64_t seed);
/* Before a posting call: times it with probability 1/WL_POST_SAMPLE. */
void wl_post_begin(struct wl_post_timer *pt);
/* After it: n = descriptors it took (counted, with the call's CPU, in
 * res only when timed). */
void wl_post_end(struct wl_post_timer *pt, struct wl_pres *res, unsigned n);
/*
 * The figure: the timed calls' CPU (summed, net of the clock's cost) over
 * the descriptors they took, in us; 0 when the net sum is not above 0 (the
 * calls were cheaper than the clock's jitter), NAN when no call was timed
 * (a short run may have none: not measured, never a 0).
 */
double wl_post_cpu_us_per_wr(int64_t post_cpu_ns, uint64_t post_timed);
/*
 * rdma: the transports' sampled CPU time inside ibv_post_send (stats
 * post_cpu_ns, summed or a delta) over the WRs of those doorbells
 * (post_cpu_wrs), in us per WR; a negative sum counts as 0; NAN when no
 * doorbell was sampled.
 */
double wl_sampled_us_per_wr(double post_cpu_ns, double post_cpu_wrs);
/* What the rdma post_cpu column measures (the footer line). */
extern const char wl_rdma_post_note[];
/*
 * Parse an unsigned number with an optional K/M/G (binary) suffix into
 * [min, max]; on error print "kvbench: OPT: ..." and return -1.
 */
int kvb_bench_parse_u64(const char *opt, const char *arg, uint64_t min,
			uint64_t max, uint64_t *out);
/*
 * After getopt_long() returned '?' (opterr = 0, every long option's val
 * >= 256): name what was wrong (an unknown short option, one in a
 * cluster, an unknown or ambiguous long option, a value given to an option
 * that takes none), pointing to `kvbench SUB --help`.
 */
struct option;
void kvb_bench_unknown_option(char *const *argv, const struct option *lo,
			      const char *sub);
int kvb_bench_parse_double(const char *opt, const char *arg, double min,
			   double max, double *out);
/*
 * KVB_BENCH_TR_* of --transport; refuses what is not measurable here (tcp
 * only where tcp_ok and the tcp transport is built) with a clear message:
 * -1.
 */
int kvb_bench_check_transport(const char *arg, int tcp_ok);
/*
 * quantile.c: sort samples; the q-quantile (0..1) of sorted samples by
 * nearest rank: the ceil(q * n)-th smallest (p50 of 4 samples: the 2nd,
 * p99 of 100: the 99th; q = 0: the smallest). NAN when n = 0.
 */
void kvb_bench_sort(double *v, size_t n);
double kvb_bench_quantile(const double *sorted, size_t n, double q);
/* Anonymous shared memory that survives fork; NULL on failure. */
void *kvb_bench_shared(size_t len);

/*
 * Start a broker on a private socket: path from --broker, $KVBROKER, or
 * the build tree next to kvbench. `extra` is a space-separated list of more
 * broker options (may be NULL). Waits until it answers. 0 or -1 (printed).
 */
int kvb_bench_broker_start(struct bench_broker *b, const char *path,
			   const char *extra, const char *more);
void kvb_bench_broker_stop(struct bench_broker *b);
/* The broker's JSON stats into buf; 0 or -errno. */
int kvb_bench_broker_stats(const struct bench_broker *b, char *buf, size_t cap);
/* "key":number in a JSON text; -1 if absent. */
double kvb_bench_json_num(const char *js, const char *key);
/* Is the progress line wanted (--progress, or stderr is a tty)? */
int kvb_bench_progress_wanted(int forced);

/*
 * net.c: cleanup on every exit path (atexit, SIGINT/SIGTERM/SIGHUP/SIGQUIT:
 * registered socket paths unlinked, namespaces deleted) and the placement
 * of tcp runs. kvb_bench_cleanup_init() once in the parent, first.
 */
void kvb_bench_cleanup_init(void);
/* Register (add = 1) or forget (0) a path to unlink on exit. */
void kvb_bench_cleanup_path(const char *path, int add);
/* In a child: join the network namespace `name`; 0 or -1 (printed). */
int kvb_bench_enter_netns(const char *name);
/*
 * After kvb_bench_enter_netns(), for a library that lists network devices
 * in /sys/class/net (UCX): a private mount namespace with /sys mounted
 * afresh, showing the namespace's devices. 0 or -1 (printed).
 */
int kvb_bench_netns_sysfs(void);
/*
 * want = NET_*: namespaces when asked for or (auto) when root and `ip netns`
 * works, else loopback (NET_AUTO: n->why says why). 0, or -1 when
 * NET_NETNS was asked for and cannot be had (printed).
 */
int kvb_bench_net_setup(struct bench_net *n, int want);
/* Delete what setup made (also done at exit and on a signal). */
void kvb_bench_net_teardown(struct bench_net *n);
/* One line saying where the two sides run. */
void kvb_bench_net_describe(const struct bench_net *n, char *buf, size_t cap);

/*
 * workload.c / wl_workers.c. Workers pass two barriers with the parent:
 * write a byte to ready_fd, read one from go[0] (setup done), then the same
 * with go[1] (warm-up done); the measured run starts after the second.
 * Every worker function returns its exit status: 0, 1 (error, printed) or
 * 3 (failed transfers or bad bytes).
 */
int kvb_bench_workload_main(int argc, char **argv);
/*
 * wl_options.c: parse `kvbench workload` arguments into c (which holds the
 * defaults). 0, 1 after --help (printed), -1 on a bad argument (printed).
 */
int wl_parse(struct wl_cfg *c, int argc, char **argv);
size_t wl_pres_size(const struct wl_cfg *c);
int wl_direct_p(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go,
		struct wl_pres *res);
int wl_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		int notify_fd, int ready_fd, const int *go,
		struct wl_pres *res);
/* broker mode on one node: local, or gpu (regions in device memory) */
int wl_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res);
int wl_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		int ready_fd, const int *go, struct wl_pres *res);

/*
 * A worker's layer regions: host memory, or device memory of the process's
 * gpu backend (wl_gpu.c) read back through a host mirror for --verify.
 */
struct wl_mem {
	int gpu; /* device memory (wl_gpu_mem_alloc) */
	unsigned layers;
	uint64_t len;	  /* bytes per layer */
	void **at;	  /* layer l: host address or device pointer */
	void **host;	  /* layer l as --verify reads it (host memory: = at) */
	void *map;	  /* wl_src_mem: the mapping, all layers side by side */
	uint64_t map_len; /* its length */
	/* device memory: copy request q's blocks into host[] (NULL: none) */
	int (*fetch)(struct wl_mem *m, const struct wl_cfg *c, uint64_t q);
	/* device memory: P's source pattern (NULL: written in place) */
	int (*fill)(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		    uint64_t salt);
};
/*
 * The warm-up writes P's source pattern salted with WL_SALT_WARM; P
 * rewrites it unsalted (wl_mem_fill) before the measured run, so that the
 * bytes --verify finds at D can only come from the measured writes.
 */
#define WL_SALT_WARM 0x5741524d55502121ull
/* P's source pattern (salted) into every layer of m. 0 or -1 (printed). */
int wl_mem_fill(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		uint64_t salt);
/* Check request q's bytes (fetching them first); counts into res. 0/-1. */
int wl_mem_verify(const struct wl_cfg *c, unsigned rank, struct wl_mem *m,
		  uint64_t q, struct wl_pres *res);
/* Free what m holds (arrays, mapping, device memory; not broker regions). */
void wl_mem_free(struct wl_mem *m);

/*
 * wl_direct.c: direct mode over any transport ops table. Layer l's chains
 * read from `local` at local_off + source block offsets and write to
 * `remote` (an mr on this node, a region id, or an address and key) at
 * remote_off + D block offsets.
 */
struct wl_layer_io {
	struct kvb_mr *local;
	uint64_t local_off;
	struct kvb_remote remote;
	uint64_t remote_off;
};
struct wl_direct {
	const struct wl_cfg *c;
	unsigned rank;
	struct kvb_transport *t;      /* opened, regions registered */
	struct kvb_ep *ep;	      /* to the D peer, ready */
	const struct wl_layer_io *io; /* c->layers entries */
	struct wl_mem *src;	      /* P's source, refilled after warm-up */
	/* where a finished request is announced: one uint32_t request
	 * number per write (a pipe or a SOCK_SEQPACKET socket to D) */
	int notify_fd;
	int64_t stall_ns; /* no completion this long: give up (0 = 60 s) */
	/* optional: ns spent inside the hardware's post call so far
	 * (reported as verbs_post_ns) */
	uint64_t (*post_ns)(struct kvb_transport *t);
};
/*
 * After the first barrier: warm-up, the source rewritten unsalted, second
 * barrier (go_fd), the measured steps; fills res (ok = 1 when it
 * finished). 0, or -1 (printed).
 */
int wl_direct_p_run(const struct wl_direct *d, int ready_fd, int go_fd,
		    struct wl_pres *res);
/*
 * D, after both barriers: read P's announcements from notify_fd, verify
 * each request (--verify); serve (optional) runs the D side's transport
 * until notify_fd is readable. 0 or -1 (printed).
 */
int wl_direct_d_run(const struct wl_cfg *c, unsigned rank, int notify_fd,
		    struct wl_mem *m, int (*serve)(void *arg, int fd),
		    void *arg, struct wl_pres *res);

/*
 * wl_tcp.c: the same four workers on the tcp transport. The D workers run
 * first; `shm` is the parent's results area (wl_pres of P rank i at 2i, of
 * D rank i at 2i+1), through which D publishes its port / opened count.
 */
int wl_tcp_direct_p(const struct wl_cfg *c, unsigned rank, void *shm,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res);
int wl_tcp_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		    int notify_fd, int ready_fd, const int *go,
		    struct wl_pres *res);
int wl_tcp_broker_p(const struct wl_cfg *c, unsigned rank, const char *sock,
		    int ready_fd, const int *go, struct wl_pres *res);
int wl_tcp_broker_d(const struct wl_cfg *c, unsigned rank, const char *sock,
		    void *shm, int ready_fd, const int *go,
		    struct wl_pres *res);
struct wl_pres *wl_pres_at(void *shm, const struct wl_cfg *c, unsigned i);
/*
 * wl_rdma.c: direct mode on the rdma transport (broker mode runs the tcp
 * broker workers above against two `--transport rdma` brokers). `hs` is a
 * SOCK_SEQPACKET socket to the peer worker: the QP handshake, then P's
 * request notifications.
 */
int wl_rdma_direct_p(const struct wl_cfg *c, unsigned rank, int hs,
		     int ready_fd, const int *go, struct wl_pres *res);
int wl_rdma_direct_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps,
		     int hs, int ready_fd, const int *go, struct wl_pres *res);
/*
 * Can an rdma transport open here? 0, or -1 with the reason printed (no
 * device: run it in the soft-RoCE guest). Fills n for an rdma run.
 */
int wl_rdma_probe(struct bench_net *n, const char *ip);

/*
 * wl_ucx.c: the same writes through UCX (UCP: ucp_put_nbx per block, a
 * flush per step); `hs` is a SOCK_SEQPACKET socket to the peer worker: D's
 * worker address and rkeys, then P's request notifications. Built only
 * with KVB_HAVE_UCX; wl_ucx_version() is NULL without.
 */
int wl_ucx_p(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
	     const int *go, struct wl_pres *res);
int wl_ucx_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps, int hs,
	     int ready_fd, const int *go, struct wl_pres *res);
const char *wl_ucx_version(void);

/*
 * wl_gpu.c: direct mode on the gpu transport. `hs` is a SOCK_SEQPACKET
 * socket to the peer worker: D's exported layer regions, then P's request
 * notifications, then P's "imports closed". Every gpu worker opens the
 * backend c->gpu_name itself (no runtime is touched before fork()).
 */
int wl_gpu_direct_p(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
		    const int *go, struct wl_pres *res);
int wl_gpu_direct_d(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
		    const int *go, struct wl_pres *res);
/*
 * Can the backend `want` (auto|cuda|hip|host) open here and does it see a
 * device? Asked in a child process, so that kvbench itself never touches a
 * GPU runtime. Fills c->gpu_name and c->gpu_devices. 0; 77 (no GPU here:
 * printed); 2 (another error, printed).
 */
int wl_gpu_probe(struct wl_cfg *c, const char *want);
/*
 * Device memory for a worker's layer regions (len bytes each, on device
 * 0): P's filled with its warm-up pattern, D's zeroed (with a host mirror
 * when verifying). 0 or -1 (printed).
 */
int wl_gpu_mem_alloc(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		     int is_d, uint64_t len);
void wl_gpu_mem_free(struct wl_mem *m);

/* wl_workers.c helpers the other workers share */
double *wl_pres_lat(struct wl_pres *r);
void wl_fill_src(const struct wl_cfg *c, unsigned rank, unsigned l,
		 uint64_t *base, uint64_t salt);
uint64_t wl_src_block(const struct wl_cfg *c, uint64_t q, unsigned j);
uint64_t wl_dst_block(const struct wl_cfg *c, uint64_t q, unsigned j);
uint64_t wl_verify_req(const struct wl_cfg *c, unsigned rank,
		       void *const *layer_base, uint64_t q);
void *wl_memfd_map(const char *name, uint64_t len);
/* P's source in host memory: all layers side by side in one memfd
 * mapping (m->map), holding the warm-up pattern. 0 or -1 (printed). */
int wl_src_mem(struct wl_mem *m, const struct wl_cfg *c, unsigned rank);
int wl_sync_start(int ready_fd, int go_fd);
int64_t wl_req_start_ns(const struct wl_cfg *c, uint64_t q, int64_t go_ns);
unsigned wl_next_step(const struct wl_cfg *c, uint64_t next, uint64_t total,
		      int64_t go_ns);
/* kvb_attach as P or D rank `rank` of `size` (timeout_ms 0: default) */
struct kvb_ctx;
int wl_attach(const char *sock, int is_d, unsigned rank, unsigned size,
	      int timeout_ms, struct kvb_ctx **ctx);
/*
 * A broker-mode worker's layer regions (len bytes each, key = layer),
 * registered with its broker: host memory (kvb_mem_alloc) or, on the gpu
 * transport, device memory (kvb_mem_register_gpu). P's hold the warm-up
 * pattern, D's are zeroed. 0 or -1 (printed).
 */
struct kvb_region;
int wl_broker_regions(struct kvb_ctx *ctx, const struct wl_cfg *c,
		      unsigned rank, int is_d, uint64_t len, uint32_t flags,
		      struct kvb_region *reg, struct wl_mem *m);
void wl_broker_regions_free(struct kvb_ctx *ctx, struct kvb_region *reg,
			    struct wl_mem *m);
/*
 * P, broker mode: wait for the write_done of requests first..first+n-1
 * (their tags); t0 != NULL: measured (latency, done), else warm-up.
 * `prefix` names the requests in messages. 0 or -1 (printed).
 */
int wl_p_wait_step(struct kvb_ctx *ctx, unsigned rank, uint64_t first,
		   unsigned n, const int64_t *t0, char prefix,
		   struct wl_pres *res);
/*
 * D, broker mode: one completion. A transfer's end counts (failed or,
 * with `verify`, checked); other kinds are ignored. Returns 1 when it
 * ended a transfer, 0 when not, -1 on a --verify read-back error.
 */
struct kvb_completion;
int wl_d_completion(const struct wl_cfg *c, unsigned rank,
		    const struct kvb_completion *comp, char prefix, int verify,
		    struct wl_mem *m, struct wl_pres *res);

/* D-side slots per layer region: every request its own (verify) or R */
uint64_t wl_dslots(const struct wl_cfg *c);
uint64_t wl_region_bytes_p(const struct wl_cfg *c);
uint64_t wl_region_bytes_d(const struct wl_cfg *c);

/*
 * wl_output.c: res[k][m] at ws[k] workers, m = 0 direct, 1 broker, 2 ucx
 * (WL_NMODES slots; a mode not run is not valid)
 */
extern const char *const wl_mode_name[WL_NMODES];
void wl_table_header(void);
void wl_table_row(const char *mode, unsigned w, const struct wl_cfg *c,
		  const struct wl_figs *f);
/* label: "ratio" (broker / direct), "b/ucx", "ucx/d"; num / den */
void wl_ratio_row(const char *label, unsigned w, const struct wl_figs *den,
		  const struct wl_figs *num);
/* out = the median of n trials, figure by figure (NAN if any is n/a);
 * the counts of failures and bad bytes are summed; valid if any trial was */
void wl_figs_median(const struct wl_figs *t, unsigned n, struct wl_figs *out);
/* with --repeat: the bandwidth and message-rate ratio (num / den) of each
 * trial pair; what: NULL = broker / direct ("ratio"), else its name */
void wl_trials_row(const struct wl_cfg *c, const char *what,
		   const struct wl_figs *den, const struct wl_figs *num);
/* The ratio rows: {numerator, denominator} mode slots, label, JSON key. */
struct wl_ratio_def {
	unsigned num, den;
	const char *label, *key, *what;
};
extern const struct wl_ratio_def wl_ratios[3];
/* trials: [point][mode][trial], c->repeat of them (NULL: none kept);
 * ucx_info: what P0's UCX endpoint used (NULL: no ucx run) */
int wl_write_json(const struct wl_cfg *c, const unsigned *ws, unsigned n,
		  const struct wl_figs (*res)[WL_NMODES],
		  const struct wl_figs (*trials)[WL_NMODES]
					       [KVB_BENCH_MAX_REPEAT],
		  const char *ucx_info);
int wl_plot(const struct wl_cfg *c, const unsigned *ws, unsigned n,
	    const struct wl_figs (*res)[WL_NMODES]);

/* micro.c */
int kvb_bench_rate_main(int argc, char **argv);
int kvb_bench_lat_main(int argc, char **argv);

#endif /* KVB_BENCH_KVBENCH_H */

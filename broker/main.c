/* SPDX-License-Identifier: MIT */
/*
 * kvbroker: the node's KV-cache transfer broker. Event loop: busy-poll the
 * workers' rings while there is work; after --busy-poll-us idle, set every
 * segment's broker_sleeping word, look once more, and sleep in epoll on the
 * shared eventfd, the control sockets and the signal fd.
 */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "ctl.h"
#include "kvbroker/kvbroker.h"
#include "log.h"
#include "metrics.h"
#include "sdnotify.h"
#ifdef KVB_HAVE_XNODE
#include "xnode/xnode.h"
#endif

#define EP_LISTEN	  1ull
#define EP_EFD		  2ull
#define EP_SIG		  3ull
#define EP_XPORT	  5ull /* a same-node transport's wait_fd */
#define EP_WORKER_TAG	  0x100000000ull
#define TIMER_NS	  10000000ll /* deadline scan period */
#define EPOLL_EVERY	  64u /* busy rounds between control-socket checks */
#define EVENTS_NS	  200000ll /* ... or this long, whichever comes first */
#define KVB_LATE_SLEEP_MS 50 /* shorter sleeps: not counted as late wakeups */

/*
 * Set when start-up failed for a reason in the configuration itself, which
 * the same configuration meets again on every start: exit status 2, which
 * the systemd unit does not restart (RestartPreventExitStatus=2). Other
 * start-up failures (a port or the socket taken, a device or GPU missing)
 * may pass: exit status 1.
 */
static int config_err;

static int open_transport(struct kvb_broker *b)
{
	struct kvb_transport_params p = {
		.post_batch_size = b->opt.post_batch_size,
		.copy_threads = b->opt.copy_threads,
		.copy_plain = b->opt.copy_plain,
	};
	enum kvb_transport_kind k = b->opt.transport;
	char why[256] = "";
	int rc;

	if ((k == KVB_TR_TCP || k == KVB_TR_RDMA) && !b->opt.xnode) {
		log_err("transport %s needs --host-ip (the address peers "
			"reach this node on)",
			kvb_transport_name(k));
		config_err = 1;
		return -EINVAL;
	}
	if (p.copy_threads < 0) {
		/* auto: the broker thread helps, so CPUs - 1 more, up to 4
		 * (memcpy saturates memory bandwidth with a few threads) */
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

		p.copy_threads = ncpu > 5 ? 4 : ncpu > 1 ? (int) ncpu - 1 : 0;
	}
	/* same-node host memory always goes through local */
	rc = kvb_local_ops.open(&p, &b->trs[KVB_TS_HOST], why, sizeof(why));
	if (rc) {
		log_err("transport local: unavailable: %s",
			why[0] ? why : strerror(-rc));
		return rc;
	}
	/* rdma and tcp too: GPU regions are imported by the gpu runtime,
	 * then registered with the NIC (rdma) or copied through host staging
	 * buffers (tcp) for cross-node transfers */
	if (k == KVB_TR_GPU || k == KVB_TR_AUTO || k == KVB_TR_RDMA ||
	    k == KVB_TR_TCP) {
		why[0] = '\0';
		rc = kvb_broker_gpu_open(b, why, sizeof(why));
		if (rc && k == KVB_TR_GPU) {
			log_err("transport gpu: unavailable: %s",
				why[0] ? why : strerror(-rc));
			return rc;
		}
		if (rc)
			log_info("transport %s: gpu unavailable (%s); GPU "
				 "regions will be refused",
				 kvb_transport_name(k),
				 why[0] ? why : strerror(-rc));
		else
			log_info("transport gpu ready: GPU-to-GPU regions use "
				 "GPU copies");
	}
	if (k == KVB_TR_AUTO && !b->opt.xnode)
		log_info("transport auto: same-node only (no --host-ip: no "
			 "cross-node bridge)");
	log_info("transport local ready (%d copy thread%s besides the broker "
		 "thread for chains of >= 512 KiB; %s)",
		 p.copy_threads, p.copy_threads == 1 ? "" : "s",
		 kvb_local_streams(b->trs[KVB_TS_HOST])
			 ? "copies of >= 32 KiB with non-temporal stores"
			 : "memcpy");
	return 0;
}

/*
 * The default socket lives in a directory private to the broker's uid:
 * created 0700 when missing, refused (the broker does not start) when it is
 * a symlink, another uid's, or open to group or others: whoever can write
 * there could stand in for the broker.
 */
static int check_socket_dir(struct kvb_broker *b)
{
	char why[256];
	int rc;

	if (!b->opt.socket_private)
		return 0;
	if (mkdir(b->opt.socket_dir, 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		log_err("cannot create the socket directory %s: %s",
			b->opt.socket_dir, strerror(errno));
		return rc;
	}
	rc = kvb_sock_dir_check(b->opt.socket_dir, b->uid, why, sizeof(why));
	if (rc) {
		config_err = 1;
		log_err("refusing the socket directory: %s (remove it, or "
			"give --socket)",
			why);
	}
	return rc;
}

/* Bind the Unix socket; refuse to steal the path from a live broker. */
static int open_listener(struct kvb_broker *b)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, probe;

	probe = check_socket_dir(b);
	if (probe)
		return probe;
	strcpy(sa.sun_path, b->opt.socket_path);
	probe = kvb_ctl_connect(b->opt.socket_path, 500);
	if (probe >= 0) {
		close(probe);
		log_err("another broker is already serving %s",
			b->opt.socket_path);
		return -EADDRINUSE;
	}
	unlink(b->opt.socket_path); /* stale socket of a dead broker */
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
	    chmod(b->opt.socket_path, 0600) < 0 || listen(fd, 128) < 0) {
		int rc = -errno;

		log_err("cannot listen on %s: %s", b->opt.socket_path,
			strerror(errno));
		close(fd);
		return rc;
	}
	b->listen_fd = fd;
	return 0;
}

static int ep_add(int epfd, int fd, uint64_t tag)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/*
 * The cross-node module (bridge/xnode) extends the engine through its
 * hooks; a broker built without it (no libzmq or msgpack-c at build time)
 * registers none and serves same-node transfers only: --host-ip is
 * refused, and so is a worker's KV layout (kvb_mem_set_kv), which only
 * cross-node layer ops use.
 */
static int open_xnode(struct kvb_broker *b)
{
#ifdef KVB_HAVE_XNODE
	return kvb_xn_init(b);
#else
	if (!b->opt.xnode)
		return 0;
	log_err("--host-ip: this kvbroker was built without the cross-node "
		"layer (no libzmq/msgpack-c at build time); same-node "
		"transfers only");
	config_err = 1;
	return -ENOTSUP;
#endif
}

static int setup(struct kvb_broker *b)
{
	sigset_t set;
	int rc;

	b->uid = getuid();
	kvb_ratelimit_init(&b->conn_rl, 1, 1000000000);
	b->listen_fd = b->efd = b->sigfd = b->epfd = -1;
	b->workers = calloc(b->opt.max_workers, sizeof(*b->workers));
	b->pend = calloc(b->opt.max_pending, sizeof(*b->pend));
	b->live = calloc(b->opt.max_workers, sizeof(*b->live));
	if (!b->workers || !b->live || !b->pend)
		return -ENOMEM;
	rc = kvb_regions_init(&b->regions);
	if (rc)
		return rc;
	rc = kvb_xfers_init(&b->xfers);
	if (rc)
		return rc;
	rc = kvb_engine_init(b);
	if (rc)
		return rc;
	/*
	 * Block the stop signals before a transport starts threads (the CUDA
	 * and HIP runtimes do): threads inherit the mask, so SIGTERM can only
	 * arrive through the signalfd, never kill a runtime thread's process.
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	rc = open_transport(b);
	if (rc)
		return rc;
	b->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	b->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (b->sigfd < 0 || b->efd < 0 || b->epfd < 0)
		return -errno;
	rc = open_listener(b);
	if (rc)
		return rc;
	rc = open_xnode(b);
	if (rc)
		return rc;
	rc = kvb_metrics_init(b);
	if (rc)
		return rc;
	if ((rc = ep_add(b->epfd, b->listen_fd, EP_LISTEN)) ||
	    (rc = ep_add(b->epfd, b->efd, EP_EFD)) ||
	    (rc = ep_add(b->epfd, b->sigfd, EP_SIG)))
		return rc;
	/* completions of pooled copies wake a sleeping broker */
	if (b->trs[KVB_TS_HOST]->ops->wait_fd) {
		int fd = b->trs[KVB_TS_HOST]->ops->wait_fd(b->trs[KVB_TS_HOST]);

		if (fd >= 0 && (rc = ep_add(b->epfd, fd, EP_XPORT)))
			return rc;
	}
	return 0;
}

/* Returns epoll_wait's count: 0 when the sleep ran to its timeout. */
static int service_events(struct kvb_broker *b, int timeout_ms)
{
	struct epoll_event ev[64];
	int n = epoll_wait(b->epfd, ev, 64, timeout_ms);

	for (int i = 0; i < n; i++) {
		uint64_t tag = ev[i].data.u64;

		if (tag == EP_LISTEN) {
			while (kvb_worker_accept(b) == 0)
				;
		} else if (tag == EP_EFD) {
			uint64_t v;

			if (read(b->efd, &v, sizeof(v)) > 0)
				b->st.wakeups++;
		} else if (tag == EP_SIG) {
			struct signalfd_siginfo si;

			if (read(b->sigfd, &si, sizeof(si)) == sizeof(si)) {
				log_info("signal %u: shutting down",
					 si.ssi_signo);
				b->stop = 1;
			}
		} else if (tag == KVB_EP_RDMA_EVENTS) {
			kvb_hook_event(b, tag);
		} else if (tag == KVB_EP_REMOTE || tag == EP_XPORT) {
			/* drained below, or by the next round's reap */
		} else if (tag & KVB_EP_METRICS_TAG) {
			kvb_metrics_event(b, tag, ev[i].events);
		} else if (tag & EP_WORKER_TAG) {
			struct kvb_worker *w =
				&b->workers[(uint32_t) (tag & 0xffffffffu)];

			if (w->id)
				kvb_worker_ctl(b, w);
		} else if (tag & KVB_EP_PENDING_TAG) {
			struct kvb_worker *w =
				&b->pend[(uint32_t) (tag & 0xffffffffu)];

			if (w->id)
				kvb_worker_ctl(b, w);
		}
	}
	kvb_hook_service(b);
	return n;
}

static void set_sleeping(struct kvb_broker *b, uint32_t v)
{
	for (uint32_t i = 0; i < b->nlive; i++)
		atomic_store_explicit(
			&b->workers[b->live[i]].seg.hdr->broker_sleeping, v,
			memory_order_relaxed);
}

/* Does any live worker's submission ring hold an entry? */
static int rings_busy(struct kvb_broker *b)
{
	for (uint32_t i = 0; i < b->nlive; i++)
		if (kvb_ring_count(&b->workers[b->live[i]].seg.sq))
			return 1;
	return 0;
}

/*
 * Arm the transports whose wait_fd() needs it (rdma: a CQ event at the
 * next completion). Returns 1 when one has completions waiting already
 * (do not sleep).
 */
static int arm_transports(struct kvb_broker *b)
{
	for (unsigned i = 0; i < KVB_TS_MAX; i++) {
		struct kvb_transport *t = b->trs[i];

		if (t && t->ops->arm && t->ops->arm(t) > 0)
			return 1;
	}
	return 0;
}

/* Announce sleep to every worker, then re-check their rings (Dekker). */
static int try_sleep(struct kvb_broker *b)
{
	int busy;

	set_sleeping(b, 1);
	atomic_thread_fence(memory_order_seq_cst);
	/* completions owed to a worker that made room in its ring: moved
	 * now, not on the next timer (a worker that reaps after the fence
	 * sees broker_sleeping and its cq_backlog and wakes us) */
	busy = kvb_engine_flush_owed(b) || rings_busy(b) || arm_transports(b);
	if (!busy) {
		int64_t left = b->next_timer_ns - kvb_now_ns();
		/* deadlines to keep: transfers, connections without HELLO,
		 * the extension's */
		int ms = b->xfers.nactive || b->npending || b->timers_soon
				 ? (int) (left / 1000000) + 1
				 : 1000;

		if (ms < 1)
			ms = 1;
		ms = kvb_sd_sleep_ms(ms, kvb_now_ns()); /* systemd watchdog */
		/* async copies or transfers in flight, ops waiting for
		 * credit: keep polling (completions that signal a wait fd
		 * end the sleep sooner) */
		if (b->inf_nfree < KVB_INFLIGHT_MAX - 1 || b->ndirty)
			ms = 1;
		b->st.sleeps++;
		/*
		 * Slept the whole timeout with a submission waiting: a worker
		 * that published meanwhile saw broker_sleeping and should
		 * have woken us. Short sleeps are left out: there a worker
		 * between publishing and ringing is a likelier cause.
		 */
		if (!service_events(b, ms) && ms >= KVB_LATE_SLEEP_MS &&
		    rings_busy(b)) {
			b->st.late_wakeups++;
			log_warn_rl("slept %d ms through a submission (lost "
				    "wakeup)",
				    ms);
		}
	}
	set_sleeping(b, 0);
	return busy;
}

static void run(struct kvb_broker *b)
{
	int64_t last_events = 0, idle_since = 0,
		spin_ns = (int64_t) b->opt.busy_poll_us * 1000;
	uint32_t iter = 0;

	b->next_timer_ns = kvb_now_ns() + TIMER_NS;
	while (!b->stop) {
		unsigned work = kvb_engine_round(b);
		int64_t now = kvb_now_ns();

		if (now >= b->next_timer_ns) {
			kvb_engine_timers(b, now);
			kvb_worker_timers(b, now);
			kvb_metrics_timers(b, now);
			kvb_sd_tick(now);
			b->next_timer_ns = now + TIMER_NS;
		}
		/* control sockets while busy: every EPOLL_EVERY rounds, or
		 * sooner when rounds are long (big copies) */
		if (++iter % EPOLL_EVERY == 0 ||
		    now - last_events >= EVENTS_NS) {
			service_events(b, 0);
			last_events = now;
		}
		if (work) {
			idle_since = 0;
			continue;
		}
		if (!idle_since)
			idle_since = now;
		/*
		 * Idle past the spin window: sleep. Ops still queued here
		 * (b->ndirty) are waiting for credit (a full send queue or
		 * socket): only completions free it, so sleep the short way
		 * (try_sleep caps it at 1 ms) instead of spinning on it, which
		 * took a core from soft-RoCE's kernel threads.
		 */
		if (now - idle_since >= spin_ns) {
			try_sleep(b);
			idle_since = 0;
		}
	}
}

static void shutdown_all(struct kvb_broker *b)
{
	uint32_t i;

	/* every open transfer ends, each worker hears it, then goes */
	for (i = 0; i < b->opt.max_workers; i++) {
		struct kvb_worker *w = &b->workers[i];
		struct kvb_cqe c = {.opcode = KVB_CQ_SHUTDOWN,
				    .status = -ESHUTDOWN};

		if (!w->attached)
			continue;
		atomic_store_explicit(&w->seg.hdr->broker_state,
				      KVB_BROKER_STOPPING,
				      memory_order_release);
		kvb_complete(b, w, &c);
	}
	/* a kvb_wait_min sleeper waiting for more than the SHUTDOWN entry
	 * is woken by its socket's hang-up, just below */
	kvb_wake_workers(b);
	for (i = 0; i < b->opt.max_workers; i++)
		if (b->workers[i].id)
			kvb_worker_drop(b, &b->workers[i],
					"broker shutting down");
	for (i = 0; i < b->opt.max_pending; i++)
		if (b->pend[i].id)
			kvb_worker_drop(b, &b->pend[i], "broker shutting down");
}

static void teardown(struct kvb_broker *b)
{
	if (b->listen_fd >= 0) {
		close(b->listen_fd);
		unlink(b->opt.socket_path);
	}
	kvb_engine_hooks_fini(b);
	kvb_metrics_fini(b);
	for (int i = 0; i < KVB_TS_MAX; i++)
		if (b->trs[i])
			b->trs[i]->ops->close(b->trs[i]);
	if (b->epfd >= 0)
		close(b->epfd);
	if (b->efd >= 0)
		close(b->efd);
	if (b->sigfd >= 0)
		close(b->sigfd);
	kvb_engine_fini(b);
	kvb_xfers_fini(&b->xfers);
	kvb_regions_fini(&b->regions);
	free(b->workers);
	free(b->live);
	free(b->pend);
}

/*
 * Descriptors: every worker, region, notify socket and connection takes
 * some; start with as many as the hard limit allows (the tcp data port
 * keeps its own caps below it, docs/security.md).
 */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	if (rl.rlim_cur == rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		log_warn("cannot raise the open files limit: %s",
			 strerror(errno));
}

/*
 * The files and addresses the options name, checked before anything starts:
 * 0, or -errno with the reason in err (a configuration error, exit 2).
 * --cluster-key: a regular file the broker can open, of 16 to 4096 bytes
 * (bridge/xnode reads it at start; a FIFO there would block the start).
 * --metrics-listen: numeric ADDR:PORT with a port up to 65535.
 */
static int preflight(const struct kvb_options *o, char *err, size_t len)
{
	if (o->cluster_key[0]) {
		int fd = open(o->cluster_key,
			      O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
		struct stat st;
		int rc = 0;

		if (fd < 0 || fstat(fd, &st) < 0) {
			rc = -errno;
			snprintf(err, len, "--cluster-key %s: %s",
				 o->cluster_key, strerror(errno));
		} else if (!S_ISREG(st.st_mode)) {
			rc = -EINVAL;
			snprintf(err, len,
				 "--cluster-key %s: not a regular file",
				 o->cluster_key);
		} else if (st.st_size < 16 || st.st_size > 4096) {
			rc = -EINVAL;
			snprintf(err, len,
				 "--cluster-key %s: %lld bytes: between 16 and "
				 "4096 needed (e.g. head -c 32 /dev/urandom)",
				 o->cluster_key, (long long) st.st_size);
		}
		if (fd >= 0)
			close(fd);
		if (rc)
			return rc;
	}
	if (o->metrics_listen[0] &&
	    kvb_metrics_check_listen(o->metrics_listen)) {
		snprintf(err, len,
			 "--metrics-listen %s: not ADDR:PORT with a numeric "
			 "address and a port up to 65535 (127.0.0.1:19476, "
			 "[::1]:19476)",
			 o->metrics_listen);
		return -EINVAL;
	}
	return 0;
}

/* A configuration error at start-up: on standard error, bytes escaped (a
 * config file's binary bytes do not reach the terminal raw). */
static int config_error(const char *err)
{
	char esc[1024];

	kvb_config_escape(esc, sizeof(esc), err);
	fprintf(stderr, "kvbroker: %s\n", esc);
	return 2;
}

int main(int argc, char **argv)
{
	static struct kvb_broker b;
	char err[512];
	int rc;

	if (kvb_options_load(&b.opt, argc, argv, err, sizeof(err)))
		return config_error(err);
	if (b.opt.help) {
		kvb_options_usage(stdout);
		return 0;
	}
	if (b.opt.version) {
		printf("kvbroker %s (protocol %u)\n", KVB_VERSION_STRING,
		       KVB_PROTO_VERSION);
		return 0;
	}
	if (preflight(&b.opt, err, sizeof(err)))
		return config_error(err);
	kvb_log_level = b.opt.log_level;
	kvb_log_set_format(b.opt.log_format);
	raise_nofile();
	rc = setup(&b);
	if (rc) {
		/* an address not on this node (--host-ip, --metrics-listen)
		 * is the configuration's too */
		if (rc == -EADDRNOTAVAIL)
			config_err = 1;
		log_err("startup failed: %s%s", strerror(-rc),
			config_err ? " (a configuration error: exit status 2)"
				   : "");
		teardown(&b);
		return config_err ? 2 : 1;
	}
	log_info("listening on %s (pid %d)", b.opt.socket_path, (int) getpid());
	kvb_sd_ready(b.opt.socket_path);
	run(&b);
	kvb_sd_stopping();
	shutdown_all(&b);
	teardown(&b);
	log_info("stopped");
	return 0;
}

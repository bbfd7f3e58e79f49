/* SPDX-License-Identifier: MIT */
/*
 * `kvbench workload`: the vLLM-shaped P -> D workload in `direct` mode
 * (every worker posts to its own transport instance) and `broker` mode (the
 * same writes through kvbroker), side by side: a perftest-style table, JSON
 * and a gnuplot PNG over a sweep of worker counts.
 */
#include "kvbench.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

struct run_pids {
	pid_t pid[2 * KVB_BENCH_MAX_WORKERS];
	int status[2 * KVB_BENCH_MAX_WORKERS];
	int exited[2 * KVB_BENCH_MAX_WORKERS];
	unsigned n;
};

static void kill_all(struct run_pids *rp)
{
	for (unsigned i = 0; i < rp->n; i++)
		if (!rp->exited[i] && rp->pid[i] > 0) {
			kill(rp->pid[i], SIGKILL);
			waitpid(rp->pid[i], &rp->status[i], 0);
			rp->exited[i] = 1;
		}
}

/* Reap the workers that exited (not the broker); -1 if one failed. */
static int reap(struct run_pids *rp, const char *what)
{
	int st, rc = 0;

	for (unsigned i = 0; i < rp->n; i++) {
		if (rp->exited[i] ||
		    waitpid(rp->pid[i], &st, WNOHANG) != rp->pid[i])
			continue;
		rp->exited[i] = 1;
		rp->status[i] = st;
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr,
				"kvbench: %s worker %c%u failed (%s %d)\n",
				what, i % 2 ? 'D' : 'P', i / 2,
				WIFEXITED(st) ? "exit" : "signal",
				WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			rc = -1;
		}
	}
	return rc;
}

/* Read n ready bytes while watching the children. */
static int wait_ready(int fd, unsigned n, struct run_pids *rp, const char *what)
{
	char buf[64];

	while (n) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int k = poll(&p, 1, 200);

		if (reap(rp, what))
			return -1;
		if (k <= 0)
			continue;
		k = (int) read(fd, buf, n < sizeof(buf) ? n : sizeof(buf));
		if (k <= 0)
			return -1;
		n -= (unsigned) k;
	}
	return 0;
}

static struct wl_pres *pres_at(void *shm, const struct wl_cfg *c, unsigned i)
{
	return wl_pres_at(shm, c, i);
}

/* The D regions of direct mode: one memfd per D rank, all layers. */
static int direct_maps(const struct wl_cfg *c, void **maps)
{
	uint64_t len = wl_region_bytes_d(c) * c->layers;

	for (unsigned i = 0; i < c->workers; i++) {
		/* the same pages as broker mode's regions (kvb_mem_alloc) */
		maps[i] = wl_memfd_map("kvbench-d", len);
		if (maps[i] == MAP_FAILED) {
			maps[i] = NULL;
			perror("kvbench: memfd for a D region");
			return -1;
		}
		/* allocate the pages now, as the broker-mode D worker does:
		 * the writers then only take minor faults, in both modes */
		memset(maps[i], 0, len);
	}
	return 0;
}

static void progress(const struct wl_cfg *c, void *shm, const char *what,
		     int64_t go_ns)
{
	uint64_t done = 0,
		 total = (uint64_t) c->iters * c->requests * c->workers;

	for (unsigned i = 0; i < c->workers; i++)
		done += pres_at(shm, c, 2 * i)->done;
	fprintf(stderr, "\r\033[Kkvbench: %s W=%u  %llu/%llu requests  %.1f s",
		what, c->workers, (unsigned long long) done,
		(unsigned long long) total,
		(double) (kvb_bench_now_ns() - go_ns) / 1e9);
}

/* tcp and rdma runs have two nodes (two brokers); local and gpu one. */
static int two_nodes(const struct wl_cfg *c)
{
	return c->transport == KVB_BENCH_TR_TCP ||
	       c->transport == KVB_BENCH_TR_RDMA;
}

/* The worker of (transport, mode, side); its exit status. */
static int run_worker(int mode, int is_d, const struct wl_cfg *c, unsigned rank,
		      void *const *maps, const int *nfd, const char *sock,
		      int ready_w, const int *go_r, void *shm,
		      struct wl_pres *res)
{
	int direct = mode == MODE_DIRECT;

	if (mode == MODE_UCX) /* any transport: UCX picks its own */
		return is_d ? wl_ucx_d(c, rank, maps, nfd[0], ready_w, go_r,
				       res)
			    : wl_ucx_p(c, rank, nfd[1], ready_w, go_r, res);
	switch (c->transport) {
	case KVB_BENCH_TR_LOCAL:
		if (direct)
			return is_d ? wl_direct_d(c, rank, maps, nfd[0],
						  ready_w, go_r, res)
				    : wl_direct_p(c, rank, maps, nfd[1],
						  ready_w, go_r, res);
		break;
#ifdef KVB_HAVE_GPU
	case KVB_BENCH_TR_GPU:
		/* broker mode: the local broker workers, device memory */
		if (direct)
			return is_d ? wl_gpu_direct_d(c, rank, nfd[0], ready_w,
						      go_r, res)
				    : wl_gpu_direct_p(c, rank, nfd[1], ready_w,
						      go_r, res);
		break;
#endif
#if defined(KVB_HAVE_RDMA) && defined(KVB_HAVE_TCP)
	case KVB_BENCH_TR_RDMA:
		if (direct)
			return is_d ? wl_rdma_direct_d(c, rank, maps, nfd[0],
						       ready_w, go_r, res)
				    : wl_rdma_direct_p(c, rank, nfd[1], ready_w,
						       go_r, res);
		/* broker mode: the tcp broker workers */
		__attribute__((fallthrough));
#endif
#ifdef KVB_HAVE_TCP
	case KVB_BENCH_TR_TCP:
		if (direct)
			return is_d ? wl_tcp_direct_d(c, rank, maps, nfd[0],
						      ready_w, go_r, res)
				    : wl_tcp_direct_p(c, rank, shm, nfd[1],
						      ready_w, go_r, res);
		return is_d ? wl_tcp_broker_d(c, rank, sock, shm, ready_w, go_r,
					      res)
			    : wl_tcp_broker_p(c, rank, sock, ready_w, go_r,
					      res);
#endif
	default:
		return 1;
	}
	return is_d ? wl_broker_d(c, rank, sock, ready_w, go_r, res)
		    : wl_broker_p(c, rank, sock, ready_w, go_r, res);
}

static int fork_worker(struct run_pids *rp, unsigned slot, int mode, int is_d,
		       const struct wl_cfg *c, unsigned rank, void *const *maps,
		       const int *nfd, const char *sock, int ready_w,
		       const int *go_r, void *shm)
{
	struct wl_pres *res = pres_at(shm, c, slot);
	pid_t pid = fork();
	int rc;

	if (pid < 0) {
		perror("kvbench: fork");
		return -1;
	}
	if (pid) {
		rp->pid[slot] = pid;
		rp->exited[slot] = 0;
		return 0;
	}
	/* dies with kvbench, whatever kills it */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (two_nodes(c) && c->nw->netns &&
	    kvb_bench_enter_netns(c->nw->ns[is_d ? 1 : 0]))
		_exit(1);
	rc = run_worker(mode, is_d, c, rank, maps, nfd, sock, ready_w, go_r,
			shm, res);
#ifdef __SANITIZE_ADDRESS__
	/* _exit() skips LeakSanitizer's check at exit (exit() would run the
	 * parent's cleanup): a worker that finished checks here */
	if (!rc && __lsan_do_recoverable_leak_check())
		rc = 1;
#endif
	_exit(rc);
}

/* "key":number inside the broker's per_transport entry of `name`. */
static double tr_num(const char *js, const char *name, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "{\"name\":\"%s\"", name);
	p = strstr(js, pat);
	return p ? kvb_bench_json_num(p, key) : -1;
}

/* "key":number inside the broker's "gpu" object; -1 if absent. */
static double gpu_num(const char *js, const char *key)
{
	const char *p = strstr(js, "\"gpu\":{");

	return p ? kvb_bench_json_num(p, key) : -1;
}

/* The transport's name, as the broker's stats name it. */
static const char *tr_str(const struct wl_cfg *c)
{
	return c->transport == KVB_BENCH_TR_RDMA  ? "rdma"
	       : c->transport == KVB_BENCH_TR_TCP ? "tcp"
	       : c->transport == KVB_BENCH_TR_GPU ? "gpu"
						  : "local";
}

/*
 * Start the two brokers of a tcp or rdma broker run (P node, D node; rdma:
 * one device, one address, distinct ports, as tests/rdma/broker-pair.sh).
 */
static int start_tcp_brokers(const struct wl_cfg *c, struct bench_broker *b)
{
	const struct bench_net *nw = c->nw;
	/* soft-RoCE under TCG is ~1000x slower than a NIC */
	int tto = c->transport == KVB_BENCH_TR_RDMA ? 120 : 30;

	for (int s = 0; s < 2; s++) {
		char more[256];

		snprintf(more, sizeof(more),
			 "--host-ip %s --handshake-port %d --notify-port %d "
			 "--transfer-timeout %d --defer-timeout %d",
			 nw->ip[s], nw->hs_port[s], nw->notify_port[s], tto,
			 tto);
		if (nw->rdma) /* the device the direct workers use too */
			snprintf(more + strlen(more),
				 sizeof(more) - strlen(more), " --rdma-dev %s",
				 nw->rdma_dev);
		b[s].transport = tr_str(c);
		b[s].netns = nw->netns ? nw->ns[s] : NULL;
		if (kvb_bench_broker_start(&b[s], c->broker, c->broker_opts,
					   more))
			return -1;
	}
	return 0;
}

/* what P0's UCX endpoint used in the last ucx run ("": none yet) */
static char ucx_info[sizeof(((struct wl_pres *) 0)->ucx_info)];

/* Run one mode at c->workers; fills f. 0 or -1. */
static int run_mode(const struct wl_cfg *c, int mode, struct wl_figs *f)
{
	const char *what = mode == MODE_DIRECT	 ? "direct"
			   : mode == MODE_BROKER ? "broker"
						 : "ucx";
	int ucx = mode == MODE_UCX;
	size_t shm_len = 2 * c->workers * wl_pres_size(c);
	struct bench_broker br[2] = {{0}}; /* local: [0]; tcp: P, D node */
	/* tcp or rdma: two nodes, two brokers */
	int tcp = two_nodes(c);
	int rdma = c->transport == KVB_BENCH_TR_RDMA;
	/* rdma, gpu and ucx: a socketpair per worker pair (handshake
	 * first) */
	int hs = rdma || c->transport == KVB_BENCH_TR_GPU || ucx;
	uint64_t verbs_ns = 0, verbs_cpu_ns = 0, verbs_cpu_wrs = 0;
	double bpost_ns = -1; /* tcp/rdma broker: P broker's post_ns */
	double bcpu_ns = 0, bcpu_wrs = 0; /* its post_cpu_ns, post_cpu_wrs */
	struct run_pids rp = {.n = 0};
	void *maps[KVB_BENCH_MAX_WORKERS] = {NULL};
	int ready[2] = {-1, -1}, go[2] = {-1, -1}, go2[2] = {-1, -1};
	int go_r[2];
	int nfd[KVB_BENCH_MAX_WORKERS][2];
	double bcpu0 = 0, bcpu1 = 0, *lat = NULL;
	static char js0[1 << 16], js1[1 << 16];
	int want_progress = kvb_bench_progress_wanted(c->progress);
	int64_t go_ns, last_prog, end_ns = 0;
	uint64_t total_lat = 0, post_timed = 0, cpu_ns = 0, dcpu_ns = 0;
	int64_t post_ns = 0; /* net of the clock's cost: clipped at 0 below */
	unsigned i, p_left;
	int rc = -1;
	void *shm;

	memset(f, 0, sizeof(*f));
	memset(nfd, -1, sizeof(nfd));
	/* a slot counts as exited until its worker is forked */
	rp.n = 2 * c->workers;
	for (i = 0; i < rp.n; i++)
		rp.exited[i] = 1;
	shm = kvb_bench_shared(shm_len);
	if (!shm) {
		perror("kvbench: shared results");
		return -1;
	}
	if (pipe(ready) || pipe(go) || pipe(go2)) {
		perror("kvbench: pipe");
		goto out;
	}
	go_r[0] = go[0];
	go_r[1] = go2[0];
	if (mode == MODE_BROKER && tcp && start_tcp_brokers(c, br))
		goto out;
	if (mode == MODE_BROKER && !tcp) {
		/* gpu: the backend is in $KVB_GPU_BACKEND (workload main) */
		br[0].transport = tr_str(c);
		if (kvb_bench_broker_start(&br[0], c->broker, c->broker_opts,
					   NULL))
			goto out;
	}
	if (mode != MODE_BROKER) {
		/* gpu: D allocates device memory itself */
		if (c->transport != KVB_BENCH_TR_GPU && direct_maps(c, maps))
			goto out;
		/* rdma, gpu: [0] D's end, [1] P's: the handshake (QP, D's
		 * exported regions), then the notifications */
		for (i = 0; i < c->workers; i++)
			if (hs ? socketpair(AF_UNIX, SOCK_SEQPACKET, 0, nfd[i])
			       : pipe(nfd[i])) {
				perror("kvbench: pipe");
				goto out;
			}
	}
	/* D first: in broker mode P looks their regions up */
	for (i = 0; i < c->workers; i++)
		if (fork_worker(&rp, 2 * i + 1, mode, 1, c, i, maps, nfd[i],
				br[tcp].sock, ready[1], go_r, shm))
			goto out_kill;
	if (wait_ready(ready[0], c->workers, &rp, what))
		goto out_kill;
	for (i = 0; i < c->workers; i++)
		if (fork_worker(&rp, 2 * i, mode, 0, c, i, maps, nfd[i],
				br[0].sock, ready[1], go_r, shm))
			goto out_kill;
	if (wait_ready(ready[0], c->workers, &rp, what))
		goto out_kill;
	/* everyone is set up: warm up together, then measure */
	for (i = 0; i < 2 * c->workers; i++)
		if (write(go[1], "w", 1) != 1)
			goto out_kill;
	if (wait_ready(ready[0], 2 * c->workers, &rp, what))
		goto out_kill;
	if (br[0].pid) {
		if (kvb_bench_broker_stats(&br[0], js0, sizeof(js0))) {
			fprintf(stderr, "kvbench: broker stats failed\n");
			goto out_kill;
		}
		bcpu0 = kvb_bench_pid_cpu_s(br[0].pid);
		if (br[1].pid)
			bcpu0 += kvb_bench_pid_cpu_s(br[1].pid);
	}
	go_ns = last_prog = kvb_bench_now_ns();
	for (i = 0; i < 2 * c->workers; i++)
		if (write(go2[1], "g", 1) != 1)
			goto out_kill;
	/* watch: P workers end first; then the broker's counters are final */
	for (;;) {
		unsigned left = 0;

		if (reap(&rp, what))
			goto out_kill;
		for (i = 0, p_left = 0; i < rp.n; i++) {
			left += !rp.exited[i];
			p_left += i % 2 == 0 && !rp.exited[i];
		}
		if (!p_left && br[0].pid && !end_ns) {
			end_ns = kvb_bench_now_ns();
			bcpu1 = kvb_bench_pid_cpu_s(br[0].pid);
			if (br[1].pid)
				bcpu1 += kvb_bench_pid_cpu_s(br[1].pid);
			if (kvb_bench_broker_stats(&br[0], js1, sizeof(js1))) {
				fprintf(stderr,
					"kvbench: broker stats failed\n");
				goto out_kill;
			}
		}
		if (!left)
			break;
		if (want_progress &&
		    kvb_bench_now_ns() - last_prog > 500000000) {
			progress(c, shm, what, go_ns);
			last_prog = kvb_bench_now_ns();
		}
		usleep(2000);
	}
	if (want_progress)
		fprintf(stderr, "\r\033[K");
	for (i = 0; i < c->workers; i++) {
		struct wl_pres *p = pres_at(shm, c, 2 * i);
		struct wl_pres *d = pres_at(shm, c, 2 * i + 1);

		if (!p->ok || !d->ok) {
			fprintf(stderr,
				"kvbench: %s: worker pair %u did not finish\n",
				what, i);
			goto out;
		}
		f->descs += (double) p->descs;
		f->bytes += (double) p->bytes;
		f->doorbells += (double) p->doorbells;
		f->wrs += (double) p->wrs;
		f->failed += p->failed + d->failed;
		f->verified_bytes += d->dchecked;
		f->bad_bytes += d->dbad * 8;
		post_ns += p->post_cpu_ns;
		post_timed += p->post_timed;
		verbs_ns += p->verbs_post_ns;
		verbs_cpu_ns += p->verbs_post_cpu_ns;
		verbs_cpu_wrs += p->verbs_post_cpu_wrs;
		f->open_wait_s += (double) p->ctl_ns / 1e9;
		cpu_ns += p->cpu_ns;
		dcpu_ns += d->cpu_ns;
		total_lat += p->nlat;
		if (p->end_ns - go_ns > f->elapsed_s * 1e9)
			f->elapsed_s = (double) (p->end_ns - go_ns) / 1e9;
	}
	lat = malloc((total_lat + 1) * sizeof(*lat));
	if (!lat)
		goto out;
	total_lat = 0;
	for (i = 0; i < c->workers; i++) {
		struct wl_pres *p = pres_at(shm, c, 2 * i);

		memcpy(lat + total_lat, p + 1, p->nlat * sizeof(*lat));
		total_lat += p->nlat;
	}
	kvb_bench_sort(lat, total_lat);
	f->lat_p50_us = kvb_bench_quantile(lat, total_lat, 0.50);
	f->lat_p99_us = kvb_bench_quantile(lat, total_lat, 0.99);
	f->lat_p999_us = kvb_bench_quantile(lat, total_lat, 0.999);
	f->cpu_workers_s = (double) cpu_ns / 1e9;
	/* over the descriptors of the timed (sampled) calls */
	f->worker_post_cpu_us_per_wr =
		wl_post_cpu_us_per_wr(post_ns, post_timed);
	if (mode == MODE_BROKER && tcp) {
		/* the P broker's tcp / rdma transport: what it sent */
		f->doorbells = tr_num(js1, tr_str(c), "doorbells") -
			       tr_num(js0, tr_str(c), "doorbells");
		f->wrs = tr_num(js1, tr_str(c), "wrs") -
			 tr_num(js0, tr_str(c), "wrs");
		f->layer_ops = kvb_bench_json_num(js1, "layer_ops") -
			       kvb_bench_json_num(js0, "layer_ops");
		f->cpu_broker_s = bcpu1 - bcpu0;
		bpost_ns = tr_num(js1, tr_str(c), "post_ns") -
			   tr_num(js0, tr_str(c), "post_ns");
		bcpu_ns = tr_num(js1, tr_str(c), "post_cpu_ns") -
			  tr_num(js0, tr_str(c), "post_cpu_ns");
		bcpu_wrs = tr_num(js1, tr_str(c), "post_cpu_wrs") -
			   tr_num(js0, tr_str(c), "post_cpu_wrs");
	} else if (mode == MODE_BROKER) {
		f->doorbells = kvb_bench_json_num(js1, "doorbells") -
			       kvb_bench_json_num(js0, "doorbells");
		f->wrs = kvb_bench_json_num(js1, "wrs") -
			 kvb_bench_json_num(js0, "wrs");
		f->cpu_broker_s = bcpu1 - bcpu0;
		f->post_cpu_us_per_wr =
			f->wrs > 0 ? f->cpu_broker_s * 1e6 / f->wrs : NAN;
		/* gpu: every WR must have been a copy of its gpu transport */
		if (c->transport == KVB_BENCH_TR_GPU &&
		    gpu_num(js1, "copies") - gpu_num(js0, "copies") != f->wrs) {
			fprintf(stderr,
				"kvbench: broker: %.0f of its %.0f WRs were "
				"gpu copies: it did not route the device "
				"regions to its gpu transport\n",
				gpu_num(js1, "copies") - gpu_num(js0, "copies"),
				f->wrs);
			goto out;
		}
	} else {
		/* a direct worker's post() takes one WR per descriptor; ucx:
		 * the sampled ucp_put_nbx calls (one put per descriptor) */
		f->post_cpu_us_per_wr = f->worker_post_cpu_us_per_wr;
	}
	if (ucx) {
		/* UCX counts no doorbells (sendmsg calls, ibv_post_send) */
		f->doorbells = NAN;
		snprintf(ucx_info, sizeof(ucx_info), "%s",
			 pres_at(shm, c, 0)->ucx_info);
	}
	if (tcp) {
		/* tcp: not measurable, a WR's sending goes on in poll() after
		 * post() (the rest of a sendmsg, the acks); rdma: thread CPU
		 * inside ibv_post_send on the transports' sampled doorbells
		 * per WR of those (direct: the P workers' transports; broker:
		 * the P broker's, stats post_cpu_ns / post_cpu_wrs), and the
		 * wall time of every call per WR (stats post_ns) */
		f->post_cpu_us_per_wr = NAN;
		f->post_wall_us_per_wr = NAN;
		if (rdma && mode == MODE_DIRECT) {
			f->post_cpu_us_per_wr = wl_sampled_us_per_wr(
				(double) verbs_cpu_ns, (double) verbs_cpu_wrs);
			f->post_cpu_wrs = (double) verbs_cpu_wrs;
			if (f->wrs > 0)
				f->post_wall_us_per_wr =
					(double) verbs_ns / 1e3 / f->wrs;
		} else if (rdma && bpost_ns >= 0) {
			f->post_cpu_us_per_wr =
				wl_sampled_us_per_wr(bcpu_ns, bcpu_wrs);
			f->post_cpu_wrs = bcpu_wrs;
			if (f->wrs > 0)
				f->post_wall_us_per_wr =
					bpost_ns / 1e3 / f->wrs;
		}
		f->cpu_d_s = (double) dcpu_ns / 1e9;
	}
	f->cpu_s = f->cpu_workers_s + f->cpu_broker_s + f->cpu_d_s;
	f->wr_per_doorbell = isnan(f->doorbells) ? NAN
			     : f->doorbells > 0	 ? f->wrs / f->doorbells
						 : 0;
	if (f->elapsed_s > 0) {
		f->msg_rate_mps = f->descs / f->elapsed_s / 1e6;
		f->bw_gbps = f->bytes / f->elapsed_s / 1e9;
	}
	f->valid = 1;
	if (f->failed || f->bad_bytes) {
		fprintf(stderr,
			"kvbench: %s: %llu failed transfers, %llu bad bytes\n",
			what, (unsigned long long) f->failed,
			(unsigned long long) f->bad_bytes);
		rc = -1;
	} else {
		rc = 0;
	}
	goto out;
out_kill:
	kill_all(&rp);
out:
	kvb_bench_broker_stop(&br[0]);
	kvb_bench_broker_stop(&br[1]);
	for (i = 0; i < c->workers; i++) {
		if (maps[i])
			munmap(maps[i], wl_region_bytes_d(c) * c->layers);
		if (nfd[i][0] >= 0) {
			close(nfd[i][0]);
			close(nfd[i][1]);
		}
	}
	for (i = 0; i < 2; i++) {
		if (ready[i] >= 0)
			close(ready[i]);
		if (go[i] >= 0)
			close(go[i]);
		if (go2[i] >= 0)
			close(go2[i]);
	}
	free(lat);
	munmap(shm, shm_len);
	return rc;
}

/*
 * ucx mode: the UCX_TLS and UCX_NET_DEVICES its workers set. --ucx-tls
 * default: none (UCX's own choice, or the environment's). Else --ucx-tls
 * LIST, or without it (and without UCX_TLS in the environment) what the
 * transport means: tcp on --transport tcp, rc_v on rdma, UCX's own on
 * local; then UCX_NET_DEVICES (unless the environment has it) is the
 * side's veth end (namespaces), lo (loopback) or the verbs device.
 */
static void ucx_setup(struct wl_cfg *c, const struct bench_net *nw)
{
	const char *o = c->ucx_tls_opt;

	c->ucx_tls = NULL;
	c->ucx_dev[0][0] = c->ucx_dev[1][0] = 0;
	if (o && !strcmp(o, "default"))
		return;
	if (o)
		c->ucx_tls = o;
	else if (getenv("UCX_TLS"))
		return;
	else if (c->transport == KVB_BENCH_TR_TCP)
		c->ucx_tls = "tcp";
	else if (c->transport == KVB_BENCH_TR_RDMA)
		/* UCX's alias for rc_verbs with ud_verbs as the auxiliary
		 * transport only: rc_verbs alone cannot connect to a worker
		 * address (UCX 1.13: "no auxiliary transport to <...>:
		 * Unsupported operation"); the puts still go on rc_verbs */
		c->ucx_tls = "rc_v";
	if (!c->ucx_tls || getenv("UCX_NET_DEVICES") || !nw)
		return;
	for (int s = 0; s < 2; s++) {
		if (nw->rdma)
			snprintf(c->ucx_dev[s], sizeof(c->ucx_dev[s]), "%s:1",
				 nw->rdma_dev);
		else if (nw->netns)
			snprintf(c->ucx_dev[s], sizeof(c->ucx_dev[s]), "%s",
				 nw->veth[s]);
		else
			snprintf(c->ucx_dev[s], sizeof(c->ucx_dev[s]), "lo");
	}
}

int kvb_bench_workload_main(int argc, char **argv)
{
	struct wl_cfg c = {.workers = 8,
			   .layers = 80,
			   .blocks = 16,
			   .block_bytes = 8192,
			   .requests = 4,
			   .iters = 4,
			   .modes = MODE_DIRECT | MODE_BROKER,
			   .verify = 1,
			   .repeat = 1};
	static struct wl_figs res[KVB_BENCH_MAX_SWEEP][WL_NMODES];
	static struct wl_figs tr[KVB_BENCH_MAX_SWEEP][WL_NMODES]
				[KVB_BENCH_MAX_REPEAT];
	static struct bench_net net;
	unsigned ws[KVB_BENCH_MAX_SWEEP], n, k;
	int rc = wl_parse(&c, argc, argv), fails = 0;
	double mem;

	if (rc)
		return rc < 0 ? 2 : 0;
	n = c.nsweep ? c.nsweep : 1;
	for (k = 0; k < n; k++)
		ws[k] = c.nsweep ? c.sweep[k] : c.workers;
	/* in double: W x layers x bytes can pass 2^64 (a region's bytes
	 * cannot: the options' limits keep them under 2^59) */
	for (k = 0, mem = 0; k < n; k++) {
		double need;

		c.iters = wl_iters_for(&c, ws[k]); /* verify: regions grow */
		need = (double) ws[k] * c.layers *
		       ((double) wl_region_bytes_p(&c) +
			(double) wl_region_bytes_d(&c));
		mem = need > mem ? need : mem;
	}
	if (mem > (double) sysconf(_SC_PHYS_PAGES) *
			  (double) sysconf(_SC_PAGESIZE) / 2) {
		fprintf(stderr,
			"kvbench: the regions need %.1f GiB, more than half of "
			"this machine's memory; use fewer "
			"--workers/--layers/--iters/--requests/--blocks, "
			"smaller --block-bytes or --no-verify\n",
			mem / (1 << 30));
		return 2;
	}
	kvb_bench_cleanup_init(); /* broker sockets, namespaces */
	if (c.transport == KVB_BENCH_TR_TCP) {
		char where[320];

		if (kvb_bench_net_setup(&net, c.net))
			return 2;
		c.nw = &net;
		kvb_bench_net_describe(&net, where, sizeof(where));
		printf("kvbench workload: transport tcp, %s\n"
		       "direct: a tcp transport and socket per P worker, a "
		       "receiver process per D worker; broker: kvbroker "
		       "--transport tcp on each side\n",
		       where);
	} else if (c.transport == KVB_BENCH_TR_RDMA) {
		if (wl_rdma_probe(&net, c.rdma_ip ? c.rdma_ip : "192.0.2.1"))
			return 2;
		c.nw = &net;
		printf("kvbench workload: transport rdma, device %s, both "
		       "brokers on %s (distinct ports)\n"
		       "direct: an rdma transport and QP per P worker, a "
		       "receiver per D worker; broker: kvbroker --transport "
		       "rdma on each side\n",
		       net.rdma_dev, net.ip[0]);
	} else if (c.transport == KVB_BENCH_TR_GPU) {
		rc = wl_gpu_probe(&c, c.gpu_backend ? c.gpu_backend : "auto");
		if (rc)
			return rc; /* 77: no GPU here */
		/* the broker (and every worker) opens the same backend */
		setenv("KVB_GPU_BACKEND", c.gpu_name, 1);
		if (!strcmp(c.gpu_name, "host"))
			printf("kvbench workload: transport gpu, backend host: "
			       "measures the host copy path (memfd \"device "
			       "memory\", copies by host threads), NOT a "
			       "GPU\n");
		else
			printf("kvbench workload: transport gpu, backend %s, "
			       "%d device(s), regions on device 0\n",
			       c.gpu_name, c.gpu_devices);
		printf("direct: a gpu transport per P worker, D's regions "
		       "imported (IPC); broker: one kvbroker --transport "
		       "gpu, regions registered with "
		       "kvb_mem_register_gpu\n");
	} else {
		printf("kvbench workload: transport local (one node; "
		       "--transport "
		       "tcp for two)\n");
	}
	if (c.modes & MODE_UCX)
		ucx_setup(&c, c.nw);
	printf("%u layers x %u blocks x %llu B per request per rank, %u "
	       "requests/step, ",
	       c.layers, c.blocks, (unsigned long long) c.block_bytes,
	       c.requests);
	if (c.iters_total)
		printf("%u steps in all (W workers: %u/W each, rounded up), ",
		       c.iters_total, c.iters_total);
	else
		printf("%u steps, ", c.iters);
	printf("rate %s, verify %s\n", c.rate > 0 ? "limited" : "unlimited",
	       c.verify ? "on" : "off");
	if (c.rate > 0)
		printf("rate: %g requests/s\n", c.rate);
	if (c.modes & MODE_UCX)
		printf("ucx: UCX %s, a UCP context and worker per worker "
		       "process, one ucp_put_nbx per block, a flush per step; "
		       "UCX_TLS %s, UCX_NET_DEVICES %s%s%s\n",
		       wl_ucx_version(),
		       c.ucx_tls	   ? c.ucx_tls
		       : getenv("UCX_TLS") ? getenv("UCX_TLS")
					   : "UCX's own",
		       c.ucx_dev[0][0]		   ? c.ucx_dev[0]
		       : getenv("UCX_NET_DEVICES") ? getenv("UCX_NET_DEVICES")
						   : "UCX's own",
		       c.ucx_dev[0][0] ? " (P) / " : "",
		       c.ucx_dev[0][0] ? c.ucx_dev[1] : "");
	if (c.repeat > 1)
		printf("%u trials per mode and worker count, the modes "
		       "alternating (ABBA: d#k, b#k, u#k: trial k of direct, "
		       "broker, ucx); the mode and ratio rows are the "
		       "medians\n",
		       c.repeat);
	wl_table_header();
	for (k = 0; k < n; k++) {
		c.workers = ws[k];
		c.iters = wl_iters_for(&c, ws[k]);
		for (unsigned t = 0; t < c.repeat; t++) {
			/* ABBA (ABC CBA with three modes): a drift in the
			 * machine's load hits every mode alike */
			for (unsigned j = 0; j < WL_NMODES; j++) {
				unsigned m = t % 2 ? WL_NMODES - 1 - j : j;
				int mode = 1 << m;
				char label[16];

				if (!(c.modes & mode))
					continue;
				if (run_mode(&c, mode, &tr[k][m][t])) {
					fails++;
					if (!tr[k][m][t].valid)
						continue;
				}
				if (c.repeat > 1)
					snprintf(label, sizeof(label), "%c#%u",
						 "dbu"[m], t + 1);
				else
					snprintf(label, sizeof(label), "%s",
						 wl_mode_name[m]);
				wl_table_row(label, ws[k], &c, &tr[k][m][t]);
				fflush(stdout);
			}
		}
		for (unsigned m = 0; m < WL_NMODES; m++) {
			wl_figs_median(tr[k][m], c.repeat, &res[k][m]);
			if (!(c.modes & (1 << m)))
				res[k][m].valid = 0;
			if (c.repeat > 1 && res[k][m].valid)
				wl_table_row(wl_mode_name[m], ws[k], &c,
					     &res[k][m]);
		}
		for (unsigned r = 0; r < 3; r++) {
			const struct wl_ratio_def *rd = &wl_ratios[r];

			if (!res[k][rd->den].valid || !res[k][rd->num].valid)
				continue;
			wl_ratio_row(rd->label, ws[k], &res[k][rd->den],
				     &res[k][rd->num]);
			if (c.repeat > 1)
				wl_trials_row(&c, r ? rd->what : NULL,
					      tr[k][rd->den], tr[k][rd->num]);
		}
	}
	if (c.modes & MODE_UCX) {
		printf("ucx: P0's endpoint used %s\n",
		       ucx_info[0] ? ucx_info : "(not reported)");
		printf("ratio = broker / direct, b/ucx = broker / ucx, ucx/d = "
		       "ucx / direct; ucx doorbells n/a (UCX counts no "
		       "sendmsg or ibv_post_send)\n");
	}
	if (c.transport == KVB_BENCH_TR_RDMA)
		printf("%s\n", wl_rdma_post_note);
	else if (c.transport == KVB_BENCH_TR_TCP)
		printf("post_cpu n/a on tcp (sending continues in poll()); cpu "
		       "= "
		       "P workers + D side (not verifying) + brokers\n");
	else if (c.modes & MODE_BROKER)
		printf("broker post_cpu = broker process CPU / WRs: an upper "
		       "bound (drain, validation, completions, idle spin)\n");
	if (c.transport == KVB_BENCH_TR_GPU && !strcmp(c.gpu_name, "host"))
		printf("gpu backend host: these figures are the host copy "
		       "path's, not a GPU's\n");
	if (c.json &&
	    wl_write_json(
		    &c, ws, n, (const struct wl_figs(*)[WL_NMODES]) res,
		    c.repeat > 1
			    ? (const struct wl_figs(*)[WL_NMODES]
						      [KVB_BENCH_MAX_REPEAT]) tr
			    : NULL,
		    (c.modes & MODE_UCX) ? ucx_info : NULL))
		fails++;
	if (c.plot &&
	    wl_plot(&c, ws, n, (const struct wl_figs(*)[WL_NMODES]) res))
		fails++;
	if (c.nw && !net.rdma)
		kvb_bench_net_teardown(&net);
	return fails ? 1 : 0;
}

// SPDX-License-Identifier: MIT
/*
 * rdma_post_bench: what doorbell coalescing buys, on a real verbs device
 * (rxe0 in the soft-RoCE guest: compare ratios, never absolute figures).
 *
 *   per-worker  W transports (each worker its own context, QP and CQ, as
 *               MoRIIO's per-worker engines), one chain of 1 WR per
 *               (request, layer, worker): one ibv_post_send per WR.
 *   brokered    one transport, one QP, the same WRs gathered and posted in
 *               chains of up to -b WRs within the send-queue credit.
 *   bw          large RDMA WRITEs (-S bytes, -N of them) on one QP, to
 *               compare with `ib_write_bw -s S -n N` in the same boot.
 *
 * Same total WRs in both posting modes (ops never merge: gaps between
 * them). Reported per mode: WRs per doorbell, time inside ibv_post_send per
 * WR, thread CPU time per WR (posting + polling), completion rate. Median of
 * -n runs. A fixed table on stdout, then one "JSON {...}" line.
 *
 *   rdma_post_bench [-w 8] [-l 32] [-r 32] [-s 4096] [-b 64] [-d 256]
 *                   [-S 65536] [-N 1000] [-n 3]
 * Exit 77 without a verbs device. Env: KVB_RDMA_DEV.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bridge/rdma/conn.h"
#include "bridge/rdma/rdma.h"
#include "kvbroker/kvbroker.h"

#define MAX_W	 64
#define MAX_RUNS 9

struct opts {
	unsigned workers, layers, requests, size, batch, depth;
	unsigned bw_size, bw_iters, runs;
	unsigned bdepth; /* brokered QP depth; 0 = workers x depth */
	unsigned bw_depth, bw_sig;
	unsigned bqp; /* brokered QPs per peer */
};

struct msg {
	uint32_t type; /* 1 blob, 2 quit */
	uint32_t len;
	uint64_t addr;
	uint32_t rkey;
	uint8_t blob[KVB_RDMA_CONN_MAX];
};

struct result {
	double wrs, doorbells, post_ns_wr, call_ns_wr, cpu_ns_wr, mops, mbps;
};

/* -y: sched_yield() after a poll that found nothing. */
static int yield_idle;

/* Wall time spent inside the transport's post(), summed by timed_post(). */
static double call_ns;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}

static int open_t(struct kvb_transport **t, int batch, unsigned depth, int sig,
		  int nqp)
{
	struct kvb_transport_params p = {
		.dev_name = getenv("KVB_RDMA_DEV"),
		.ib_port = 1,
		.gid_index = -1,
		.post_batch_size = batch,
		.qp_per_peer = nqp,
		.sq_depth = depth,
		.signal_every = sig,
	};
	char why[128] = "";
	int err = kvb_rdma_ops.open(&p, t, why, sizeof(why));

	if (err)
		fprintf(stderr, "open: %s (%d)\n", why, err);
	return err;
}

/* The target: one region, answers every offer, until told to quit. */
static int target(int fd, size_t region)
{
	/* written by the sides: it needs remote write access */
	struct kvb_mr mr = {.id = 1, .flags = KVB_MEM_REMOTE_WRITE};
	struct kvb_transport *t;
	struct kvb_ep *ep;
	struct msg m;
	size_t len;

	if (open_t(&t, -1, 64, 0, 1))
		return 77;
	mr.addr = aligned_alloc(4096, region);
	mr.len = region;
	if (!mr.addr || kvb_rdma_ops.reg_mr(t, &mr))
		return 1;
	while (recv(fd, &m, sizeof(m), 0) == sizeof(m) && m.type == 1) {
		if (kvb_rdma_ops.connect(t, m.blob, m.len, &ep))
			return 1;
		len = sizeof(m.blob);
		if (kvb_rdma_ep_info(t, ep, m.blob, &len))
			return 1;
		m.len = (uint32_t) len;
		m.addr = (uintptr_t) mr.addr;
		m.rkey = mr.rkey;
		if (send(fd, &m, sizeof(m), 0) != sizeof(m))
			return 1;
	}
	kvb_rdma_ops.close(t); /* eps go with it */
	return 0;
}

struct side {
	struct kvb_transport *t;
	struct kvb_ep *ep;
	struct kvb_mr mr;
	uint64_t raddr;
	uint32_t rkey;
};

static int side_open(struct side *s, int fd, void *buf, size_t region,
		     int batch, unsigned depth, int sig, int nqp)
{
	struct msg m = {.type = 1};
	size_t len = sizeof(m.blob);

	memset(&s->mr, 0, sizeof(s->mr));
	if (open_t(&s->t, batch, depth, sig, nqp))
		return -1;
	s->mr.addr = buf;
	s->mr.len = region;
	if (kvb_rdma_ops.reg_mr(s->t, &s->mr) ||
	    kvb_rdma_ops.connect(s->t, NULL, 0, &s->ep) ||
	    kvb_rdma_ep_info(s->t, s->ep, m.blob, &len))
		return -1;
	m.len = (uint32_t) len;
	if (send(fd, &m, sizeof(m), 0) != sizeof(m) ||
	    recv(fd, &m, sizeof(m), 0) != sizeof(m) ||
	    kvb_rdma_ops.connect(s->t, m.blob, m.len, &s->ep))
		return -1;
	s->raddr = m.addr;
	s->rkey = m.rkey;
	kvb_rdma_time_posts(s->t, 1);
	return 0;
}

static void side_close(struct side *s)
{
	kvb_rdma_ops.disconnect(s->t, s->ep);
	kvb_rdma_ops.dereg_mr(s->t, &s->mr);
	kvb_rdma_ops.close(s->t);
}

static struct kvb_xop mkop(struct side *s, uint64_t off, uint64_t len,
			   uint64_t cookie)
{
	struct kvb_xop o = {
		.opcode = KVB_XOP_WRITE,
		.local = &s->mr,
		.local_off = off,
		.remote = {.addr = s->raddr, .rkey = s->rkey},
		.remote_off = off,
		.len = len,
		.cookie = cookie,
	};
	return o;
}

static int timed_post(struct side *s, const struct kvb_xop *ops, unsigned n)
{
	double t0 = now();
	int k = kvb_rdma_ops.post(s->t, s->ep, ops, n);

	if (k > 0)
		call_ns += (now() - t0) * 1e9;
	return k;
}

/* Reap what is there; -1 on a failed op. */
static int reap(struct side *s, unsigned *got)
{
	struct kvb_xcqe cq[256];
	int n, i;

	n = kvb_rdma_ops.poll(s->t, cq, 256);
	if (n < 0)
		return -1;
	for (i = 0; i < n; i++)
		if (cq[i].status) {
			fprintf(stderr, "op failed: %d\n", cq[i].status);
			return -1;
		}
	*got += (unsigned) n;
	/* -y: an idle poll gives the CPU away (soft-RoCE runs in kthreads) */
	if (!n && yield_idle)
		sched_yield();
	return 0;
}

static void account(struct result *res, struct side *s, unsigned nside,
		    double t0, double t1, double c0, double c1, unsigned nwr,
		    uint64_t bytes)
{
	uint64_t db = 0, wrs = 0, pns = 0;
	unsigned i;

	for (i = 0; i < nside; i++) {
		db += s[i].t->stats.doorbells;
		wrs += s[i].t->stats.wrs;
		pns += kvb_rdma_post_ns(s[i].t);
	}
	res->wrs = (double) wrs;
	res->doorbells = (double) db;
	res->post_ns_wr = (double) pns / nwr;
	res->call_ns_wr = call_ns / nwr;
	call_ns = 0;
	res->cpu_ns_wr = (c1 - c0) / nwr;
	res->mops = nwr / (t1 - t0) / 1e6;
	res->mbps = (double) bytes / (t1 - t0) / 1e6;
}

/* Slot of WR i: distinct, never adjacent (no merging). */
static uint64_t slot_off(const struct opts *o, unsigned i, size_t region)
{
	uint64_t stride = 2ull * o->size;

	return (i * stride) % (region - stride + 1) / stride * stride;
}

static int run_per_worker(const struct opts *o, int fd, void *buf,
			  size_t region, struct result *res)
{
	struct side s[MAX_W];
	unsigned nwr = o->workers * o->layers * o->requests, got = 0, i = 0;
	unsigned r, l, w;
	double t0, t1, c0, c1;

	for (w = 0; w < o->workers; w++)
		if (side_open(&s[w], fd, buf, region, 1, o->depth, 0, 1))
			return -1;
	t0 = now();
	c0 = thread_cpu_ns();
	for (r = 0; r < o->requests; r++)
		for (l = 0; l < o->layers; l++)
			for (w = 0; w < o->workers; w++, i++) {
				struct kvb_xop op =
					mkop(&s[w], slot_off(o, i, region),
					     o->size, i);
				int k;

				while ((k = timed_post(&s[w], &op, 1)) == 0)
					if (reap(&s[w], &got))
						return -1;
				if (k < 0)
					return -1;
				/* a worker polls its own CQ now and then */
				if ((l & 7) == 7 && reap(&s[w], &got))
					return -1;
			}
	while (got < nwr)
		for (w = 0; w < o->workers; w++)
			if (reap(&s[w], &got))
				return -1;
	c1 = thread_cpu_ns();
	t1 = now();
	account(res, s, o->workers, t0, t1, c0, c1, nwr,
		(uint64_t) nwr * o->size);
	for (w = 0; w < o->workers; w++)
		side_close(&s[w]);
	return 0;
}

static int run_brokered(const struct opts *o, int fd, void *buf, size_t region,
			struct result *res)
{
	unsigned nwr = o->workers * o->layers * o->requests, got = 0, done = 0;
	struct kvb_xop *ops = calloc(nwr, sizeof(*ops));
	double t0, t1, c0, c1;
	struct side s;
	unsigned i;
	int k;

	if (!ops ||
	    side_open(&s, fd, buf, region, (int) o->batch,
		      o->bdepth ? o->bdepth : o->workers * o->depth / o->bqp, 0,
		      (int) o->bqp))
		return -1;
	/* what the broker's rings hold: (request, layer, worker) order */
	for (i = 0; i < nwr; i++)
		ops[i] = mkop(&s, slot_off(o, i, region), o->size, i);
	t0 = now();
	c0 = thread_cpu_ns();
	while (done < nwr) {
		k = timed_post(&s, ops + done, nwr - done);
		if (k < 0)
			return -1;
		done += (unsigned) k;
		if (reap(&s, &got))
			return -1;
	}
	while (got < nwr)
		if (reap(&s, &got))
			return -1;
	c1 = thread_cpu_ns();
	t1 = now();
	account(res, &s, 1, t0, t1, c0, c1, nwr, (uint64_t) nwr * o->size);
	side_close(&s);
	free(ops);
	return 0;
}

static int run_bw(const struct opts *o, int fd, void *buf, size_t region,
		  struct result *res)
{
	struct kvb_xop *ops = calloc(o->bw_iters, sizeof(*ops));
	unsigned got = 0, done = 0, i;
	double t0, t1, c0, c1;
	struct side s;
	int k;

	/* ib_write_bw's defaults: tx depth 128, every WR to the same buffer */
	if (!ops ||
	    side_open(&s, fd, buf, region, -1, o->bw_depth, (int) o->bw_sig, 1))
		return -1;
	for (i = 0; i < o->bw_iters; i++)
		ops[i] = mkop(&s, 0, o->bw_size, i);
	t0 = now();
	c0 = thread_cpu_ns();
	while (done < o->bw_iters) {
		k = timed_post(&s, ops + done, o->bw_iters - done);
		if (k < 0)
			return -1;
		done += (unsigned) k;
		if (reap(&s, &got))
			return -1;
	}
	while (got < o->bw_iters)
		if (reap(&s, &got))
			return -1;
	c1 = thread_cpu_ns();
	t1 = now();
	account(res, &s, 1, t0, t1, c0, c1, o->bw_iters,
		(uint64_t) o->bw_iters * o->bw_size);
	side_close(&s);
	free(ops);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

/* Field-wise median of n results. */
static struct result median(struct result *r, unsigned n)
{
	struct result m;
	double v[MAX_RUNS];
	size_t f, nf = sizeof(m) / sizeof(double);
	unsigned i;

	for (f = 0; f < nf; f++) {
		for (i = 0; i < n; i++)
			v[i] = ((double *) &r[i])[f];
		qsort(v, n, sizeof(double), cmp_double);
		((double *) &m)[f] = v[n / 2];
	}
	return m;
}

static void usage(void)
{
	fprintf(stderr, "usage: rdma_post_bench [-w workers] [-l layers] "
			"[-r requests] [-s bytes] [-b batch] [-d depth] "
			"[-D brokered_depth] [-q brokered_qps] [-S bw_bytes] "
			"[-N bw_iters] "
			"[-Q bw_depth] [-E bw_signal_every] [-n runs] [-y]\n");
}

int main(int argc, char **argv)
{
	struct opts o = {8,    32, 32, 4096, 64, 256, 65536,
			 1000, 3,  0,  128,  0,	 1};
	struct result pw[MAX_RUNS], br[MAX_RUNS], bw[MAX_RUNS], a, b, c;
	size_t region;
	int sv[2], c_, status, rc = 0;
	unsigned i;
	void *buf;
	pid_t pid;

	while ((c_ = getopt(argc, argv, "w:l:r:s:b:d:D:q:S:N:Q:E:n:yh")) !=
	       -1) {
		unsigned v = (unsigned) strtoul(optarg ? optarg : "0", NULL, 0);

		switch (c_) {
		case 'w':
			o.workers = v;
			break;
		case 'l':
			o.layers = v;
			break;
		case 'r':
			o.requests = v;
			break;
		case 's':
			o.size = v;
			break;
		case 'b':
			o.batch = v;
			break;
		case 'd':
			o.depth = v;
			break;
		case 'D':
			o.bdepth = v;
			break;
		case 'Q':
			o.bw_depth = v;
			break;
		case 'E':
			o.bw_sig = v;
			break;
		case 'y':
			yield_idle = 1;
			break;
		case 'q':
			o.bqp = v;
			break;
		case 'S':
			o.bw_size = v;
			break;
		case 'N':
			o.bw_iters = v;
			break;
		case 'n':
			o.runs = v;
			break;
		default:
			usage();
			return 2;
		}
	}
	if (!o.workers || o.workers > MAX_W || !o.layers || !o.requests ||
	    !o.size || !o.runs || !o.bqp || o.bqp > KVB_RDMA_MAX_QP ||
	    o.runs > MAX_RUNS || !o.bw_size || !o.bw_iters) {
		usage();
		return 2;
	}
	region = 32u << 20;
	if (region < 4ull * o.size)
		region = 4ull * o.size;
	if (region < o.bw_size)
		region = o.bw_size;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
		return 1;
	pid = fork();
	if (pid < 0)
		return 1;
	if (!pid) {
		close(sv[0]);
		_exit(target(sv[1], region));
	}
	close(sv[1]);
	buf = aligned_alloc(4096, region);
	if (!buf)
		return 1;
	memset(buf, 0x5a, region);
	for (i = 0; i < o.runs && !rc; i++) {
		rc = run_per_worker(&o, sv[0], buf, region, &pw[i]);
		if (!rc)
			rc = run_brokered(&o, sv[0], buf, region, &br[i]);
		if (!rc)
			rc = run_bw(&o, sv[0], buf, region, &bw[i]);
	}
	{
		struct msg m = {.type = 2};

		send(sv[0], &m, sizeof(m), 0);
	}
	close(sv[0]);
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
		return 1;
	if (WEXITSTATUS(status) == 77) {
		fprintf(stderr, "SKIP: no verbs device\n");
		return 77;
	}
	if (rc || WEXITSTATUS(status)) {
		fprintf(stderr, "FAIL\n");
		return 1;
	}
	a = median(pw, o.runs);
	b = median(br, o.runs);
	c = median(bw, o.runs);
	printf("# %u workers x %u layers x %u requests, %u B writes, "
	       "per-worker %u QPs x depth %u, brokered %u QP(s) x depth %u, "
	       "chains <= %u, median of %u\n",
	       o.workers, o.layers, o.requests, o.size, o.workers, o.depth,
	       o.bqp, o.bdepth ? o.bdepth : o.workers * o.depth / o.bqp,
	       o.batch, o.runs);
	printf("# post_ns: inside ibv_post_send; call_ns: inside post() "
	       "(chain build + ibv_post_send); loop_cpu: thread CPU of the "
	       "whole post+poll loop (includes busy polling)\n");
	printf("%-11s %6s %9s %11s %10s %10s %14s %12s\n", "mode", "#WRs",
	       "doorbells", "WR/doorbell", "post_ns/WR", "call_ns/WR",
	       "loop_cpu_ns/WR", "compl[Mops]");
	printf("%-11s %6.0f %9.0f %11.2f %10.1f %10.1f %14.1f %12.5f\n",
	       "per-worker", a.wrs, a.doorbells, a.wrs / a.doorbells,
	       a.post_ns_wr, a.call_ns_wr, a.cpu_ns_wr, a.mops);
	printf("%-11s %6.0f %9.0f %11.2f %10.1f %10.1f %14.1f %12.5f\n",
	       "brokered", b.wrs, b.doorbells, b.wrs / b.doorbells,
	       b.post_ns_wr, b.call_ns_wr, b.cpu_ns_wr, b.mops);
	printf("%-11s %6s %9s %11.2f %10.2f %10.2f %14.2f %12.2f\n", "ratio",
	       "", "", (b.wrs / b.doorbells) / (a.wrs / a.doorbells),
	       a.post_ns_wr / b.post_ns_wr, a.call_ns_wr / b.call_ns_wr,
	       a.cpu_ns_wr / b.cpu_ns_wr, b.mops / a.mops);
	printf("%-9s %-9s %-10s %-13s\n", "#bytes", "#iters", "BW[MB/s]",
	       "MsgRate[Mpps]");
	printf("%-9u %-9u %-10.2f %-13.6f\n", o.bw_size, o.bw_iters, c.mbps,
	       c.mops);
	printf("JSON {\"workers\":%u,\"layers\":%u,\"requests\":%u,"
	       "\"size\":%u,\"batch\":%u,\"depth\":%u,"
	       "\"per_worker\":{\"wrs\":%.0f,\"doorbells\":%.0f,"
	       "\"post_ns_per_wr\":%.1f,\"call_ns_per_wr\":%.1f,\"loop_cpu_ns_"
	       "per_wr\":%.1f,"
	       "\"mops\":%.5f},"
	       "\"brokered\":{\"wrs\":%.0f,\"doorbells\":%.0f,"
	       "\"post_ns_per_wr\":%.1f,\"call_ns_per_wr\":%.1f,\"loop_cpu_ns_"
	       "per_wr\":%.1f,"
	       "\"mops\":%.5f},"
	       "\"bw\":{\"bytes\":%u,\"iters\":%u,\"mbps\":%.2f}}\n",
	       o.workers, o.layers, o.requests, o.size, o.batch, o.depth, a.wrs,
	       a.doorbells, a.post_ns_wr, a.call_ns_wr, a.cpu_ns_wr, a.mops,
	       b.wrs, b.doorbells, b.post_ns_wr, b.call_ns_wr, b.cpu_ns_wr,
	       b.mops, o.bw_size, o.bw_iters, c.mbps);
	free(buf);
	return 0;
}

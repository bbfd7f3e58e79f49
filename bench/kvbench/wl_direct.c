/* SPDX-License-Identifier: MIT */
/*
 * Direct mode of `kvbench workload`, whatever the transport: the P worker's
 * loop over a transport ops table (bridge/transport.h) and the D worker's
 * loop over the announcements P sends it.
 *
 * P: the caller opens its transport, registers its regions, makes the
 * endpoint to its D peer and passes the first barrier; wl_direct_p_run()
 * then writes every D slot once (warm-up, not measured, from the salted
 * source pattern), rewrites the source unsalted, passes the second
 * barrier and runs the measured steps: per layer, per request of the step,
 * one chain of --blocks WRITEs (one post(), one doorbell unless credit runs
 * out), as vLLM's MoRIIO connector does per worker. A request is done when
 * the last of its WRs completed; P then announces it to D (its number, a
 * uint32_t, on notify_fd). The only transport-specific parts are the
 * per-layer places of the chains (struct wl_layer_io) and how a worker
 * waits for completions (the transport's wait_fd, if it has one).
 *
 * D: wl_direct_d_run() reads those announcements and checks each request's
 * bytes (--verify), optionally serving its own transport in between (a tcp
 * receiver does the receiving in its own poll()).
 */
#include "kvbench.h"

#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport.h"

#define COMP_BATCH 64u
#define SPIN_NS	   20000ll /* spin this long before sleeping (as kvb_wait) */
#define STALL_NS   (60ll * 1000000000) /* default: no progress at all */
#define WARM	   UINT64_MAX	       /* cookie of warm-up WRs */

/* One run of the P loop: what is in flight. */
struct prun {
	const struct wl_direct *d;
	struct wl_pres *res;
	uint32_t *left;	    /* WRs left per request of the step */
	int64_t *t0;	    /* first post of each request of the step */
	uint64_t first;	    /* the step's first request */
	unsigned pending;   /* requests of the step not done */
	uint64_t warm_left; /* warm-up WRs not completed */
	struct wl_post_timer pt;
	int measuring;
};

static const char *tname(const struct wl_direct *d)
{
	return d->t->ops->name;
}

/* One completion: count it; a request's last WR announces it to D. */
static int complete(struct prun *s, const struct kvb_xcqe *e)
{
	const struct wl_direct *d = s->d;
	struct wl_pres *res = s->res;
	uint64_t r = e->cookie;
	uint32_t q;

	if (e->status)
		res->failed++;
	if (r == WARM) {
		s->warm_left--;
		return 0;
	}
	if (r >= d->c->requests || !s->left[r] || --s->left[r])
		return 0;
	q = (uint32_t) (s->first + r);
	wl_pres_lat(res)[res->nlat++] =
		(double) (kvb_bench_now_ns() - s->t0[r]) / 1e3;
	if (write(d->notify_fd, &q, sizeof(q)) != sizeof(q)) {
		fprintf(stderr,
			"kvbench: P%u: telling D%u about request %u: "
			"D went away\n",
			d->rank, d->rank, q);
		return -1;
	}
	s->pending--;
	res->done++;
	return 0;
}

/*
 * Reap completions. block = 0: what is there. block = 1: until at least one
 * came: spin SPIN_NS, then sleep on the transport's wait_fd when it has one,
 * else yield between empty polls (soft-RoCE's kernel threads and the gpu
 * backend's copy threads need the CPU a spinning worker would take).
 */
static int reap(struct prun *s, int block)
{
	const struct wl_direct *d = s->d;
	struct kvb_transport *t = d->t;
	int64_t stall = d->stall_ns ? d->stall_ns : STALL_NS;
	int64_t start = 0; /* read on the first empty blocking poll */
	int wfd = t->ops->wait_fd ? t->ops->wait_fd(t) : -1;
	struct kvb_xcqe cqe[COMP_BATCH];

	for (int got = 0;;) {
		int n = t->ops->poll(t, cqe, COMP_BATCH);

		if (n < 0) {
			fprintf(stderr, "kvbench: P%u: %s poll: %s\n", d->rank,
				tname(d), strerror(-n));
			return -1;
		}
		for (int k = 0; k < n; k++)
			if (complete(s, &cqe[k]))
				return -1;
		got += n;
		if (n == (int) COMP_BATCH)
			continue;
		if (got || !block)
			return 0;
		if (!start)
			start = kvb_bench_now_ns();
		if (wfd < 0) {
			sched_yield();
		} else if (kvb_bench_now_ns() - start >= SPIN_NS) {
			struct pollfd p = {.fd = wfd, .events = POLLIN};

			/* rdma: ask for a completion event first (1: one
			 * came before the request, poll again) */
			if (!t->ops->arm || t->ops->arm(t) == 0)
				poll(&p, 1, 100);
		}
		if (kvb_bench_now_ns() - start > stall) {
			fprintf(stderr,
				"kvbench: P%u: no %s completion in %lld s\n",
				d->rank, tname(d),
				(long long) (stall / 1000000000));
			return -1;
		}
	}
}

/* Post a whole chain: several post() calls only when credit runs out. */
static int post_chain(struct prun *s, const struct kvb_xop *ops, unsigned n)
{
	const struct wl_direct *d = s->d;
	unsigned sent = 0;

	while (sent < n) {
		int rc;

		if (s->measuring)
			wl_post_begin(&s->pt);
		rc = d->t->ops->post(d->t, d->ep, ops + sent, n - sent);
		if (s->measuring)
			wl_post_end(&s->pt, s->res, rc > 0 ? (unsigned) rc : 0);
		if (rc < 0) {
			fprintf(stderr, "kvbench: P%u: %s post: %s\n", d->rank,
				tname(d), strerror(-rc));
			return -1;
		}
		sent += (unsigned) rc;
		/* out of credit: wait for completions */
		if (sent < n && reap(s, rc == 0))
			return -1;
	}
	return 0;
}

/* Request q's blocks of layer l, as one chain. */
static void make_chain(const struct wl_direct *d, struct kvb_xop *ops,
		       unsigned l, uint64_t q, uint64_t cookie)
{
	const struct wl_cfg *c = d->c;
	const struct wl_layer_io *io = &d->io[l];

	for (unsigned j = 0; j < c->blocks; j++)
		ops[j] = (struct kvb_xop){
			.opcode = KVB_XOP_WRITE,
			.local = io->local,
			.local_off = io->local_off +
				     wl_src_block(c, q, j) * c->block_bytes,
			.remote = io->remote,
			.remote_off = io->remote_off +
				      wl_dst_block(c, q, j) * c->block_bytes,
			.len = c->block_bytes,
			.cookie = cookie};
}

/* Warm-up, not measured: every D slot once (faults pages in, connects). */
static int warm_up(struct prun *s, struct kvb_xop *ops)
{
	const struct wl_cfg *c = s->d->c;

	for (unsigned l = 0; l < c->layers; l++)
		for (uint64_t q = 0; q < wl_dslots(c); q++) {
			make_chain(s->d, ops, l, q, WARM);
			s->warm_left += c->blocks;
			if (post_chain(s, ops, c->blocks) || reap(s, 0))
				return -1;
		}
	while (s->warm_left)
		if (reap(s, 1))
			return -1;
	if (s->res->failed) {
		fprintf(stderr,
			"kvbench: P%u: %llu warm-up writes to D%u failed\n",
			s->d->rank, (unsigned long long) s->res->failed,
			s->d->rank);
		return -1;
	}
	return 0;
}

static int measured(struct prun *s, struct kvb_xop *ops, int64_t go_ns)
{
	const struct wl_cfg *c = s->d->c;
	uint64_t total = (uint64_t) c->iters * c->requests, next = 0;
	struct wl_pres *res = s->res;

	while (next < total) {
		unsigned n = wl_next_step(c, next, total, go_ns);

		s->first = next;
		s->pending = n;
		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				if (l == 0) {
					s->t0[i] = wl_req_start_ns(c, next + i,
								   go_ns);
					s->left[i] = c->layers * c->blocks;
				}
				make_chain(s->d, ops, l, next + i, i);
				if (post_chain(s, ops, c->blocks))
					return -1;
				res->descs += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
				if (reap(s, 0))
					return -1;
			}
		while (s->pending)
			if (reap(s, 1))
				return -1;
		next += n;
	}
	return 0;
}

int wl_direct_p_run(const struct wl_direct *d, int ready_fd, int go_fd,
		    struct wl_pres *res)
{
	const struct wl_cfg *c = d->c;
	struct kvb_transport *t = d->t;
	struct prun s = {.d = d, .res = res};
	struct kvb_xop *ops = calloc(c->blocks, sizeof(*ops));
	uint64_t cpu0, db0, wrs0, pns0 = 0, pc0, pcw0;
	int64_t go_ns;
	int rc = -1;

	s.left = calloc(c->requests, sizeof(*s.left));
	s.t0 = calloc(c->requests, sizeof(*s.t0));
	if (!ops || !s.left || !s.t0) {
		fprintf(stderr, "kvbench: P%u (direct): out of memory\n",
			d->rank);
		goto out;
	}
	if (warm_up(&s, ops) || wl_mem_fill(d->src, c, d->rank, 0))
		goto out;
	db0 = t->stats.doorbells;
	wrs0 = t->stats.wrs;
	if (d->post_ns)
		pns0 = d->post_ns(t);
	pc0 = t->stats.post_cpu_ns;
	pcw0 = t->stats.post_cpu_wrs;
	wl_post_timer_init(&s.pt, d->rank + 1);
	if (wl_sync_start(ready_fd, go_fd))
		goto out;
	s.measuring = 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	if (measured(&s, ops, go_ns))
		goto out;
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->doorbells = t->stats.doorbells - db0;
	res->wrs = t->stats.wrs - wrs0;
	if (d->post_ns)
		res->verbs_post_ns = d->post_ns(t) - pns0;
	res->verbs_post_cpu_ns = t->stats.post_cpu_ns - pc0;
	res->verbs_post_cpu_wrs = t->stats.post_cpu_wrs - pcw0;
	res->ok = 1;
	rc = 0;
out:
	free(ops);
	free(s.left);
	free(s.t0);
	return rc;
}

int wl_direct_d_run(const struct wl_cfg *c, unsigned rank, int notify_fd,
		    struct wl_mem *m, int (*serve)(void *arg, int fd),
		    void *arg, struct wl_pres *res)
{
	uint64_t total = (uint64_t) c->iters * c->requests;
	uint64_t cpu0 = kvb_bench_proc_cpu_ns();
	uint32_t q;

	while (res->done < total) {
		if (serve && serve(arg, notify_fd) < 0)
			return -1;
		if (read(notify_fd, &q, sizeof(q)) != sizeof(q)) {
			fprintf(stderr,
				"kvbench: D%u (direct): P%u went away after "
				"%llu requests\n",
				rank, rank, (unsigned long long) res->done);
			return -1;
		}
		if (q >= total) {
			fprintf(stderr,
				"kvbench: D%u (direct): P%u announced request "
				"%u of %llu\n",
				rank, rank, q, (unsigned long long) total);
			return -1;
		}
		if (c->verify && wl_mem_verify(c, rank, m, q, res))
			return -1;
		res->done++;
	}
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	return 0;
}

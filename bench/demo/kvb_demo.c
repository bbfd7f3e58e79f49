/* SPDX-License-Identifier: MIT */
/*
 * kvb-demo: a vLLM-shaped workload through a running broker. D workers
 * register one region per layer; P workers write each request's KV blocks
 * for every layer into them through the broker, seal, and time each transfer
 * from first submission to its completion; each D worker waits for the
 * write_done of every request and checks every byte. Prints a summary table
 * (and --json). Used by `make run` and by the integration tests.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"
#include "proto.h" /* KVB_MAX_XFERS */

struct cfg {
	const char *socket;
	unsigned p, d, layers, blocks, requests, inflight;
	unsigned window; /* requests a D worker keeps open (d_window()) */
	unsigned psrc;	 /* requests' worth of source blocks a P keeps */
	/* shared: D rank d's block slot of request r at [d * requests + r],
	 * published before d_publish() counts r as opened */
	uint32_t *slot_of;
	uint64_t block_bytes;
	const char *json;
	int quiet;
};

/* One per P worker, in memory shared with the parent (MAP_SHARED). */
struct p_result {
	uint64_t writes, bytes, failed;
	double elapsed_s;
	unsigned nlat;
	int done; /* set last: the rest is valid */
	double lat_us[4096];
};

/*
 * One per D worker, shared: how many requests it has opened and sealed. A P
 * worker starts request r only once its D worker's count is past r, so
 * every write_done finds D's entry and the transfers open at once stay
 * within the broker's table however many requests there are.
 */
struct d_progress {
	_Atomic uint32_t opened;
	char pad[60]; /* one cache line each */
};

/* Release: pairs with d_opened()'s acquire in the P workers (the
 * transfers it counts are open in the broker before P writes for them). */
static void d_publish(struct d_progress *d, uint32_t opened)
{
	atomic_store_explicit(&d->opened, opened, memory_order_release);
}

/* Acquire: pairs with d_publish()'s release in the D worker. */
static uint32_t d_opened(struct d_progress *d)
{
	return atomic_load_explicit(&d->opened, memory_order_acquire);
}

/* No progress for this long (kvb_wait, a full ring) fails the worker. */
#define STALL_MS 60000
/* The D workers' regions together take at most this much memory: a D
 * worker keeps no more requests open than its share holds (each open
 * request has its own blocks, reused once it ended, as vLLM's are). */
#define D_MEM_ALL (4ull << 30)

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * The byte P rank `p` writes at `off` of (layer, block index), through
 * splitmix64's finalizer: with `x ^= x >> 31` alone P ranks 0 and 2 wrote
 * the same bytes everywhere (their terms differ by 0x...082a, which the
 * shift cancels in the low byte), so D could not tell them apart.
 */
static inline uint8_t pattern(unsigned p, unsigned layer, uint64_t blk,
			      uint64_t off)
{
	uint64_t x = (p + 1) * 0x9e3779b97f4a7c15ull ^
		     (layer + 1) * 0xbf58476d1ce4e5b9ull ^
		     (blk + 1) * 0x94d049bb133111ebull ^ (off >> 3);

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (uint8_t) (x ^ off);
}

/* D's block index for P's block index: runs of 4 contiguous on both
 * sides, the runs themselves in reverse order (as a real allocator scatters
 * blocks), so the broker merges 4 descriptors per WR. */
static uint64_t dst_block(uint64_t idx, uint64_t nblocks)
{
	uint64_t nchunks = (nblocks + 3) / 4, c = idx / 4;

	if ((c + 1) * 4 > nblocks) /* last partial run stays in place */
		return idx;
	return (nchunks - 1 - c - (nblocks % 4 ? 1 : 0)) * 4 + idx % 4;
}

static int attach(const struct cfg *c, enum kvb_role role, unsigned rank,
		  unsigned size, struct kvb_ctx **ctx)
{
	/* a completion ring larger than the broker's transfer table: a
	 * worker that opens many transfers before it reaps (P between kvb_wait
	 * calls, D opening its window) never backs it up, which would stop
	 * the broker taking its submissions while it retries them */
	struct kvb_attach_opts o = {.socket_path = c->socket,
				    .role = role,
				    .tp_rank = rank,
				    .tp_size = size,
				    .cq_entries = 2 * KVB_MAX_XFERS};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "kvb-demo: attach %s%u: %s\n",
			role == KVB_ROLE_P ? "P" : "D", rank, kvb_strerror(rc));
	return rc;
}

/* D: open and seal request r, expecting one write_done per writer. */
static int d_open(struct kvb_ctx *ctx, unsigned rank, unsigned r,
		  unsigned writers)
{
	int64_t t = now_ns();
	char id[64];
	uint32_t h;
	int rc;

	snprintf(id, sizeof(id), "tx-%u", r);
	rc = kvb_transfer_open(ctx, id, &h);
	while (!rc && (rc = kvb_transfer_seal(ctx, h, writers, r)) == -EAGAIN &&
	       now_ns() - t < (int64_t) STALL_MS * 1000000)
		;
	if (rc)
		fprintf(stderr, "kvb-demo: D%u open/seal: %s\n", rank,
			kvb_strerror(rc));
	return rc;
}

static int run_d(const struct cfg *c, unsigned rank, struct d_progress *prog,
		 int ready_fd, int go_fd)
{
	uint64_t nblocks = (uint64_t) c->window * c->blocks;
	uint64_t rsize = nblocks * c->block_bytes, bad = 0, checked = 0;
	uint64_t failed = 0; /* requests that ended with an error */
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	uint32_t *free_slots = calloc(c->window, sizeof(*free_slots));
	uint32_t *slot_of = c->slot_of + (size_t) rank * c->requests;
	unsigned writers = 0, l, opened = 0, done = 0, nfree = c->window;
	struct kvb_ctx *ctx;
	char byte = 1;
	int rc;

	if (!reg || !free_slots || attach(c, KVB_ROLE_D, rank, c->d, &ctx))
		return 1;
	for (unsigned k = 0; k < c->window; k++)
		free_slots[k] = c->window - 1 - k;
	/* P ranks that write into this D rank (rank mapping p % d), each
	 * into its own part of the layer's region: P rank p into part p / d */
	for (unsigned p = 0; p < c->p; p++)
		writers += p % c->d == rank;
	for (l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, rsize * (writers ? writers : 1),
				   KVB_MEM_REMOTE_WRITE, l, &reg[l]);
		if (rc) {
			fprintf(stderr, "kvb-demo: D%u alloc: %s\n", rank,
				kvb_strerror(rc));
			return 1;
		}
	}
	/* the first window of requests; one more as each one ends */
	for (; opened < c->requests && opened < c->window; opened++) {
		slot_of[opened] = free_slots[--nfree];
		if (d_open(ctx, rank, opened, writers))
			return 1;
	}
	d_publish(prog, opened);
	/* close it: the parent sees EOF once every D is ready or gone */
	rc = write(ready_fd, &byte, 1) != 1;
	close(ready_fd);
	if (rc || read(go_fd, &byte, 1) != 1)
		return 1; /* the parent gave up */
	while (done < c->requests && writers) {
		struct kvb_completion comp[64];
		int n = kvb_wait(ctx, comp, 64, STALL_MS);

		if (n < 0) {
			fprintf(stderr, "kvb-demo: D%u wait: %s\n", rank,
				kvb_strerror(n));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			uint64_t req = comp[i].tag;
			uint64_t slot;

			if (comp[i].kind != KVB_COMP_TRANSFER ||
			    req >= c->requests)
				continue;
			done++;
			slot = slot_of[req];
			/* its blocks are free again at once (as in vLLM): a
			 * byte of it landing later would show in the
			 * request that gets them next */
			free_slots[nfree++] = (uint32_t) slot;
			if (comp[i].status) {
				fprintf(stderr,
					"kvb-demo: D%u request %" PRIu64
					" failed: %s\n",
					rank, req,
					kvb_strerror(comp[i].status));
				failed++; /* its blocks are not checked */
				continue;
			}
			for (unsigned p = 0; p < c->p; p++) {
				if (p % c->d != rank)
					continue;
				for (l = 0; l < c->layers; l++)
					for (unsigned j = 0; j < c->blocks;
					     j++) {
						uint64_t src =
							(req % c->psrc) *
								c->blocks +
							j;
						const uint8_t *dst =
							(const uint8_t *) reg[l]
								.addr +
							((p / c->d) * nblocks +
							 dst_block(
								 slot * c->blocks +
									 j,
								 nblocks)) *
								c->block_bytes;

						for (uint64_t o = 0;
						     o < c->block_bytes; o++)
							bad += dst[o] !=
							       pattern(p, l,
								       src, o);
						checked += c->block_bytes;
					}
			}
		}
		for (; opened < c->requests && opened - done < c->window;
		     opened++) {
			slot_of[opened] = free_slots[--nfree];
			if (d_open(ctx, rank, opened, writers))
				return 1;
		}
		d_publish(prog, opened);
	}
	if (!c->quiet)
		printf("D%u: %u requests, %" PRIu64 " failed; %" PRIu64
		       " bytes of the completed ones verified, %" PRIu64
		       " wrong\n",
		       rank, done, failed, checked, bad);
	for (l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	free(reg);
	free(free_slots);
	fflush(stdout);
	/* wrong bytes in a completed request are corruption (3); a request
	 * that failed is reported as such (4): the demo asks for none */
	return bad ? 3 : failed ? 4 : 0;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static void p_fail(unsigned rank, const char *what, int rc)
{
	fprintf(stderr, "kvb-demo: P%u %s: %s\n", rank, what,
		rc == -EAGAIN ? "the broker took nothing for 60 s"
			      : kvb_strerror(rc));
}

static int stalled(int64_t since)
{
	return now_ns() - since > (int64_t) STALL_MS * 1000000;
}

static int run_p(const struct cfg *c, unsigned rank, struct d_progress *prog,
		 int go_fd, struct p_result *res)
{
	uint64_t nblocks = (uint64_t) c->window * c->blocks; /* D's */
	uint64_t pblocks = (uint64_t) c->psrc * c->blocks;   /* ours */
	uint64_t rsize = pblocks * c->block_bytes;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_remote_region *dst = calloc(c->layers, sizeof(*dst));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	unsigned drank = rank % c->d, l, next = 0, done = 0, open_now = 0;
	/* no more than D's window: D opens more as the broker ends ours,
	 * before we reap them, so this bounds what waits in our ring */
	unsigned inflight = c->inflight < c->window ? c->inflight : c->window;
	struct kvb_desc *descs = calloc(c->blocks, sizeof(*descs));
	struct kvb_ctx *ctx;
	int64_t start, t_full, idle;
	char byte;
	int rc;

	if (!reg || !dst || !t0 || !descs ||
	    attach(c, KVB_ROLE_P, rank, c->p, &ctx))
		return 1;
	for (l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, rsize, 0, l, &reg[l]);
		if (rc) {
			p_fail(rank, "alloc", rc);
			return 1;
		}
		for (uint64_t b = 0; b < pblocks; b++)
			for (uint64_t o = 0; o < c->block_bytes; o++)
				((uint8_t *) reg[l]
					 .addr)[b * c->block_bytes + o] =
					pattern(rank, l, b, o);
	}
	if (read(go_fd, &byte, 1) != 1)
		return 1;
	for (l = 0; l < c->layers; l++) {
		rc = kvb_mem_lookup(ctx, KVB_ROLE_D, 0, drank, l, &dst[l]);
		if (rc) {
			fprintf(stderr,
				"kvb-demo: P%u lookup D%u layer %u: %s\n", rank,
				drank, l, kvb_strerror(rc));
			return 1;
		}
	}
	start = idle = now_ns();
	while (done < c->requests) {
		/* keep up to `inflight` requests going, each one D has open */
		while (next < c->requests && open_now < inflight &&
		       next < d_opened(&prog[drank])) {
			uint32_t h;
			char id[64];
			unsigned r = next++;
			/* after d_opened()'s acquire: D's slot of r */
			uint64_t slot =
				c->slot_of[(size_t) drank * c->requests + r];

			snprintf(id, sizeof(id), "tx-%u", r);
			rc = kvb_transfer_open(ctx, id, &h);
			if (rc) {
				p_fail(rank, "open", rc);
				return 1;
			}
			t0[r] = now_ns();
			for (l = 0; l < c->layers; l++) {
				unsigned sent = 0;

				for (unsigned j = 0; j < c->blocks; j++) {
					uint64_t b = (uint64_t) (r % c->psrc) *
							     c->blocks +
						     j;

					descs[j] = (struct kvb_desc){
						.transfer = h,
						.layer = (uint16_t) l,
						.flags = KVB_DESC_UNSIGNALED,
						.region = reg[l].id,
						.peer_region = dst[l].id,
						.offset = b * c->block_bytes,
						/* its own part of D's
						 * region: P ranks > D ranks
						 * share a D rank */
						.peer_offset =
							(rank / c->d * nblocks +
							 dst_block(
								 slot * c->blocks +
									 j,
								 nblocks)) *
							c->block_bytes,
						.len = c->block_bytes,
						.tag = r};
				}
				t_full = now_ns();
				while (sent < c->blocks) {
					rc = kvb_submit_write(ctx, descs + sent,
							      c->blocks - sent);
					if (rc == -EAGAIN && !stalled(t_full))
						continue; /* the broker drains:
							     retry */
					if (rc < 0) {
						p_fail(rank, "submit", rc);
						return 1;
					}
					sent += (unsigned) rc;
					t_full = now_ns();
				}
				res->writes += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
			}
			t_full = now_ns();
			while ((rc = kvb_transfer_seal(ctx, h,
						       c->layers * c->blocks,
						       r)) == -EAGAIN &&
			       !stalled(t_full))
				;
			if (rc) {
				p_fail(rank, "seal", rc);
				return 1;
			}
			open_now++;
		}
		if (!open_now) {
			/* D's window is full of requests other P workers
			 * still write: wait for it to open the next one */
			if (now_ns() - idle > (int64_t) STALL_MS * 1000000) {
				fprintf(stderr,
					"kvb-demo: P%u: D%u opened no request "
					"for 60 s\n",
					rank, drank);
				return 1;
			}
			usleep(50);
			continue;
		}
		idle = now_ns();
		{
			struct kvb_completion comp[64];
			int n = kvb_wait(ctx, comp, 64, STALL_MS);

			if (n < 0) {
				p_fail(rank, "wait", n);
				return 1;
			}
			for (int i = 0; i < n; i++) {
				if (comp[i].kind == KVB_COMP_DESC) {
					res->failed++; /* unsignaled: only
							  errors */
					continue;
				}
				if (comp[i].kind != KVB_COMP_TRANSFER)
					continue;
				if (comp[i].status)
					res->failed++;
				if (res->nlat < 4096)
					res->lat_us[res->nlat++] =
						(double) (now_ns() -
							  t0[comp[i].tag]) /
						1e3;
				done++;
				open_now--;
			}
		}
	}
	res->elapsed_s = (double) (now_ns() - start) / 1e9;
	res->done = 1;
	for (l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	free(reg);
	free(dst);
	free(t0);
	free(descs);
	return res->failed ? 3 : 0;
}

/* Pull "key":number out of the broker's JSON stats. */
static double json_num(const char *js, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(js, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

static int broker_stats(const char *sock, char *buf, size_t cap)
{
	char path[108];

	if (sock)
		snprintf(path, sizeof(path), "%s", sock);
	else if (kvb_default_socket(path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	return kvb_ctl_stats(path, 1, buf, cap, 3000);
}

static void usage(FILE *f)
{
	fputs("Usage: kvb-demo [--socket PATH] [--p N] [--d N] [--layers N] "
	      "[--blocks N]\n"
	      "                [--block-bytes N] [--requests N] [--inflight N] "
	      "[--json FILE] [--quiet]\n"
	      "P workers write --requests transfers of --layers x --blocks "
	      "blocks of\n"
	      "--block-bytes each into D workers through the running broker; D "
	      "checks every byte.\n"
	      "Each P keeps up to --inflight requests going; each D keeps as "
	      "many open as the\n"
	      "broker's transfer table and 4 GiB of D memory in all have room "
	      "for (each open\n"
	      "request has its own blocks, reused once it ended), the rest "
	      "wait their turn.\n"
	      "Defaults: --p 2 --d 2 --layers 32 --blocks 16 --block-bytes "
	      "4096 --requests 64 --inflight 8\n",
	      f);
}

/* The numeric options (getopt ids) and their upper bounds. */
struct num_opt {
	int id;
	uint64_t max;
};

static const struct num_opt num_opts[] = {
	{'p', 64},	   {'d', 64},	 {'l', 65535}, {'b', 1u << 20},
	{'B', 1ull << 30}, {'r', 65536}, {'i', 65536},
};

/*
 * A decimal (or 0x hex) number from 1 to max; strtoull alone would take
 * "-1", " 5" and "+5". Returns 0, or 2 after a message.
 */
static int parse_num(const char *name, const char *s, uint64_t max, uint64_t *v)
{
	char *end;

	errno = 0;
	if (!isdigit((unsigned char) *s))
		goto bad;
	*v = strtoull(s, &end, 0);
	if (errno || *end || !*v || *v > max)
		goto bad;
	return 0;
bad:
	fprintf(stderr,
		"kvb-demo: --%s wants a number from 1 to %" PRIu64
		", not '%s'\n",
		name, max, s);
	return 2;
}

/*
 * Requests each D worker keeps open: its fair share of `room` transfers,
 * room / (D + P). The broker guarantees every attached worker that share
 * and lends a worker more only while every other one's share stays free
 * (docs/security.md, "On the node"), so a larger window could be refused with
 * -ENOSPC. A P worker only writes requests its D worker has open.
 */
static unsigned d_window(const struct cfg *c, uint64_t room)
{
	uint64_t w = room / (c->d + c->p);

	if (w > c->requests)
		w = c->requests;
	return w ? (unsigned) w : 1;
}

/* A worker process and what it is, for messages. */
struct kid {
	pid_t pid;
	char role;
	unsigned rank;
	int reaped;
};

static struct kid kids[128];
static unsigned nkids;

static pid_t spawn(char role, unsigned rank)
{
	pid_t parent = getpid(), pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) {
		/* gone with the parent, however it ends */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
			_exit(1);
		return 0;
	}
	if (pid > 0)
		kids[nkids++] =
			(struct kid){.pid = pid, .role = role, .rank = rank};
	else
		perror("kvb-demo: fork");
	return pid;
}

/* Set when a D worker found wrong bytes in a completed request. */
static int corrupt;

/* Record a reaped child; 1 when it failed (message printed), else 0. */
static int reaped(pid_t pid, int status)
{
	for (unsigned k = 0; k < nkids; k++) {
		if (kids[k].pid != pid)
			continue;
		kids[k].reaped = 1;
		if (WIFEXITED(status) && !WEXITSTATUS(status))
			return 0;
		if (WIFSIGNALED(status))
			fprintf(stderr, "kvb-demo: %c%u killed by signal %d\n",
				kids[k].role, kids[k].rank, WTERMSIG(status));
		else if (kids[k].role == 'D' && WEXITSTATUS(status) == 3) {
			fprintf(stderr,
				"kvb-demo: D%u found wrong bytes in completed "
				"requests\n",
				kids[k].rank);
			corrupt = 1;
		} else if (kids[k].role == 'D' && WEXITSTATUS(status) == 4)
			fprintf(stderr,
				"kvb-demo: D%u: requests failed (reasons "
				"above); every completed one was verified\n",
				kids[k].rank);
		else
			fprintf(stderr, "kvb-demo: %c%u exited with %d\n",
				kids[k].role, kids[k].rank,
				WEXITSTATUS(status));
		return 1;
	}
	return 0;
}

/* Reap what has exited, without blocking; returns how many failed. */
static int reap_some(void)
{
	int status, fails = 0;
	pid_t pid;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		fails += reaped(pid, status);
	return fails;
}

/* SIGKILL the workers still running and reap them all. */
static void stop_all(void)
{
	int status;

	for (unsigned k = 0; k < nkids; k++)
		if (!kids[k].reaped)
			kill(kids[k].pid, SIGKILL);
	while (wait(&status) > 0)
		;
}

/*
 * Wait for every worker; the first one that fails takes the others down
 * (a P waiting for a dead D would otherwise sit out its 60 s timeout).
 * Returns how many failed.
 */
static int reap_all(void)
{
	int status, fails = 0;
	pid_t pid;

	while ((pid = wait(&status)) > 0 || (pid < 0 && errno == EINTR))
		if (pid > 0 && reaped(pid, status) && !fails++) {
			fprintf(stderr,
				"kvb-demo: stopping the other workers\n");
			stop_all();
		}
	return fails;
}

/* Wait for one byte per D worker on fd: 0 when all are ready, else -1. */
static int wait_ready(int fd, unsigned d)
{
	unsigned got = 0;
	char byte;

	while (got < d) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int n = poll(&pf, 1, 100);

		if (n < 0 && errno != EINTR)
			return -1;
		if (n > 0) {
			/* EOF: every D has written or died */
			if (read(fd, &byte, 1) != 1)
				return -1;
			got++;
		}
		if (reap_some())
			return -1; /* do not wait for the slower ones */
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"socket", 1, NULL, 's'},   {"p", 1, NULL, 'p'},
		{"d", 1, NULL, 'd'},	    {"layers", 1, NULL, 'l'},
		{"blocks", 1, NULL, 'b'},   {"block-bytes", 1, NULL, 'B'},
		{"requests", 1, NULL, 'r'}, {"inflight", 1, NULL, 'i'},
		{"json", 1, NULL, 'j'},	    {"quiet", 0, NULL, 'q'},
		{"help", 0, NULL, 'h'},	    {NULL, 0, NULL, 0}};
	struct cfg c = {.p = 2,
			.d = 2,
			.layers = 32,
			.blocks = 16,
			.block_bytes = 4096,
			.requests = 64,
			.inflight = 8};
	int ready[2], go[2], opt, idx, fails = 0;
	struct p_result *pr;
	struct d_progress *prog;
	static double lat[1 << 16];
	uint64_t writes = 0, bytes = 0, failed = 0, v = 0, total;
	double elapsed = 0;
	unsigned nlat = 0, i;
	static char js[65536];
	FILE *jf = NULL;
	char byte = 1;

	while ((opt = getopt_long(argc, argv, "", lo, &idx)) != -1) {
		for (i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++)
			if (num_opts[i].id == opt &&
			    parse_num(lo[idx].name, optarg, num_opts[i].max,
				      &v))
				return 2;
		switch (opt) {
		case 's':
			c.socket = optarg;
			break;
		case 'p':
			c.p = (unsigned) v;
			break;
		case 'd':
			c.d = (unsigned) v;
			break;
		case 'l':
			c.layers = (unsigned) v;
			break;
		case 'b':
			c.blocks = (unsigned) v;
			break;
		case 'B':
			c.block_bytes = v;
			break;
		case 'r':
			c.requests = (unsigned) v;
			break;
		case 'i':
			c.inflight = (unsigned) v;
			break;
		case 'j':
			c.json = optarg;
			break;
		case 'q':
			c.quiet = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvb-demo: unexpected argument '%s'\n",
			argv[optind]);
		usage(stderr);
		return 2;
	}
	if (c.socket &&
	    (!*c.socket ||
	     strlen(c.socket) >=
		     sizeof(((struct sockaddr_un *) 0)->sun_path))) {
		fprintf(stderr, "kvb-demo: --socket: %s\n",
			*c.socket ? "socket path too long" : "empty path");
		return 2;
	}
	/* a request's blocks, all layers, for one P rank */
	if (__builtin_mul_overflow((uint64_t) c.blocks, c.block_bytes,
				   &total) ||
	    __builtin_mul_overflow(total, c.layers, &total) ||
	    total > (uint64_t) SIZE_MAX / 65536) {
		fprintf(stderr,
			"kvb-demo: --layers x --blocks x "
			"--block-bytes is more memory than a process can "
			"map\n");
		return 2;
	}
	if (c.json && !(jf = fopen(c.json, "w"))) {
		fprintf(stderr, "kvb-demo: --json %s: %s\n", c.json,
			strerror(errno));
		return 1;
	}
	/* the broker's transfer table (slot 0 unused), shared with any other
	 * workers it serves: not asked for here, as a stats connection would
	 * take a --max-workers slot the workers may need */
	c.window = d_window(&c, KVB_MAX_XFERS - 1);
	{
		/* P ranks writing into one D rank, at most */
		uint64_t wr = (c.p + c.d - 1) / c.d;
		uint64_t fit = D_MEM_ALL / c.d / (total * wr);

		if (fit < 1)
			fit = 1;
		if (c.window > fit)
			c.window = (unsigned) fit;
		c.psrc = c.requests < 16 ? c.requests : 16;
	}
	c.slot_of =
		mmap(NULL, (size_t) c.d * c.requests * sizeof(uint32_t),
		     PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (c.slot_of == MAP_FAILED) {
		perror("kvb-demo: setup");
		return 1;
	}
	pr = mmap(NULL, c.p * sizeof(*pr), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	prog = mmap(NULL, c.d * sizeof(*prog), PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (pr == MAP_FAILED || prog == MAP_FAILED || pipe(ready) || pipe(go)) {
		perror("kvb-demo: setup");
		return 1;
	}
	/* a worker that is gone must not kill us through a write on go */
	signal(SIGPIPE, SIG_IGN);
	for (i = 0; i < c.d; i++) {
		pid_t pid = spawn('D', i);

		if (pid == 0) {
			close(ready[0]);
			close(go[1]);
			_exit(run_d(&c, i, &prog[i], ready[1], go[0]));
		}
		if (pid < 0)
			goto fail;
	}
	close(ready[1]);
	if (wait_ready(ready[0], c.d)) {
		fprintf(stderr, "kvb-demo: a D worker failed to start\n");
		goto fail;
	}
	close(ready[0]);
	for (i = 0; i < c.p; i++) {
		pid_t pid = spawn('P', i);

		if (pid == 0) {
			close(go[1]);
			_exit(run_p(&c, i, prog, go[0], &pr[i]));
		}
		if (pid < 0)
			goto fail;
	}
	/* a worker that died since takes its byte with it: reap_all tells */
	for (i = 0; i < c.p + c.d; i++)
		if (write(go[1], &byte, 1) != 1)
			break;
	close(go[1]);
	fails = reap_all();
	for (i = 0; i < c.p; i++) {
		if (!pr[i].done)
			continue;
		writes += pr[i].writes;
		bytes += pr[i].bytes;
		failed += pr[i].failed;
		if (pr[i].elapsed_s > elapsed)
			elapsed = pr[i].elapsed_s;
		for (unsigned k = 0; k < pr[i].nlat && nlat < (1 << 16); k++)
			lat[nlat++] = pr[i].lat_us[k];
	}
	qsort(lat, nlat, sizeof(*lat), cmp_dbl);
	if (broker_stats(c.socket, js, sizeof(js)) < 0)
		js[0] = '\0';
	{
		double db = json_num(js, "doorbells"),
		       wrs = json_num(js, "wrs");
		double p50 = nlat ? lat[nlat / 2] : 0;
		double p99 = nlat ? lat[(size_t) (nlat * 0.99)] : 0;

		unsigned infl = c.inflight < c.window ? c.inflight : c.window;
		char who[32];

		/* the words of kvbctl stats: doorbells, wrs, wr_per_doorbell */
		snprintf(who, sizeof(who), "%uP+%uD", c.p, c.d);
		printf("\n%-8s %-10s %-12s %-10s %-10s %-16s %-8s %-10s %s\n",
		       "workers", "writes", "bytes", "doorbells", "wrs",
		       "wr_per_doorbell", "GB/s", "p50[us]", "p99[us]");
		printf("%-8s %-10" PRIu64 " %-12" PRIu64
		       " %-10.0f %-10.0f %-16.2f %-8.3f %-10.1f %.1f\n",
		       who, writes, bytes, db, wrs, db > 0 ? wrs / db : 0,
		       elapsed > 0 ? (double) bytes / elapsed / 1e9 : 0, p50,
		       p99);
		printf("(%u P + %u D workers, %u layers x %u blocks x %" PRIu64
		       " B, %u requests, up to %u open per D;\n doorbells and "
		       "wrs are the broker's totals since it started)\n",
		       c.p, c.d, c.layers, c.blocks, c.block_bytes, c.requests,
		       c.window);
		printf("(latency: a request's first write to its completion. "
		       "Each P keeps up to %u\n requests going, so a request "
		       "also waits behind the up to %u ahead of it in the\n "
		       "broker's queue (%u writes each): latency under "
		       "queueing; --inflight 1 for one\n request alone)\n",
		       infl, infl - 1, c.layers * c.blocks);
		if (jf) {
			fprintf(jf,
				"{\"writes\":%" PRIu64 ",\"bytes\":%" PRIu64
				",\"failed\":%" PRIu64 ",\"elapsed_s\":%.6f,"
				"\"lat_p50_us\":%.2f,\"lat_p99_us\":%."
				"2f,\"broker\":%s}\n",
				writes, bytes, failed, elapsed, p50, p99,
				js[0] ? js : "null");
			if (ferror(jf) | fclose(jf)) {
				fprintf(stderr, "kvb-demo: --json %s: %s\n",
					c.json, strerror(errno));
				return 1;
			}
		}
	}
	if (fails || failed) {
		fprintf(stderr,
			"kvb-demo: %d worker(s) failed, %" PRIu64 " errors%s\n",
			fails, failed,
			corrupt ? "; DATA CORRUPTION: wrong bytes in completed "
				  "requests"
				: "");
		return corrupt ? 3 : 1;
	}
	printf("all bytes verified\n");
	return 0;
fail:
	stop_all();
	if (jf)
		fclose(jf);
	return 1;
}

/* SPDX-License-Identifier: MIT */
/*
 * kvb-demo: a vLLM-shaped workload through a running broker. D workers
 * register one region per layer; P workers write each request's KV blocks
 * for every layer into them through the broker, seal, and time each transfer
 * from first submission to its completion; each D worker waits for the
 * write_done of every request and checks every byte. Prints a summary table
 * (and --json). Used by `make run` and by the integration tests.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"

struct cfg {
	const char *socket;
	unsigned p, d, layers, blocks, requests, inflight;
	uint64_t block_bytes;
	const char *json;
	int quiet;
};

struct p_result {
	uint64_t writes, bytes, failed;
	double elapsed_s;
	unsigned nlat;
	double lat_us[4096];
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The byte P rank `p` writes at `off` of (layer, block index). */
static inline uint8_t pattern(unsigned p, unsigned layer, uint64_t blk,
			      uint64_t off)
{
	uint64_t x = (p + 1) * 0x9e3779b97f4a7c15ull ^
		     (layer + 1) * 0xbf58476d1ce4e5b9ull ^
		     (blk + 1) * 0x94d049bb133111ebull ^ (off >> 3);

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
	struct kvb_attach_opts o = {.socket_path = c->socket,
				    .role = role,
				    .tp_rank = rank,
				    .tp_size = size};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "kvb-demo: attach %s%u: %s\n",
			role == KVB_ROLE_P ? "P" : "D", rank, kvb_strerror(rc));
	return rc;
}

static int run_d(const struct cfg *c, unsigned rank, int ready_fd, int go_fd)
{
	uint64_t nblocks = (uint64_t) c->requests * c->blocks;
	uint64_t rsize = nblocks * c->block_bytes, bad = 0, checked = 0;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	uint32_t *h = calloc(c->requests, sizeof(*h));
	unsigned writers = 0, l, r, done = 0;
	struct kvb_ctx *ctx;
	char id[64], byte = 1;
	int rc;

	if (!reg || !h || attach(c, KVB_ROLE_D, rank, c->d, &ctx))
		return 1;
	for (l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, rsize, KVB_MEM_REMOTE_WRITE, l,
				   &reg[l]);
		if (rc) {
			fprintf(stderr, "kvb-demo: D%u alloc: %s\n", rank,
				kvb_strerror(rc));
			return 1;
		}
	}
	/* P ranks that write into this D rank (rank mapping p % d) */
	for (unsigned p = 0; p < c->p; p++)
		writers += p % c->d == rank;
	for (r = 0; r < c->requests; r++) {
		snprintf(id, sizeof(id), "tx-%u", r);
		if ((rc = kvb_transfer_open(ctx, id, &h[r])) ||
		    (rc = kvb_transfer_seal(ctx, h[r], writers, r))) {
			fprintf(stderr, "kvb-demo: D%u open/seal: %s\n", rank,
				kvb_strerror(rc));
			return 1;
		}
	}
	if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1)
		return 1;
	while (done < c->requests && writers) {
		struct kvb_completion comp[64];
		int n = kvb_wait(ctx, comp, 64, 60000);

		if (n < 0) {
			fprintf(stderr, "kvb-demo: D%u wait: %s\n", rank,
				kvb_strerror(n));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			uint64_t req = comp[i].tag;

			if (comp[i].kind != KVB_COMP_TRANSFER)
				continue;
			done++;
			if (comp[i].status) {
				fprintf(stderr,
					"kvb-demo: D%u request %" PRIu64
					" failed: %s\n",
					rank, req,
					kvb_strerror(comp[i].status));
				bad++;
				continue;
			}
			for (unsigned p = 0; p < c->p; p++) {
				if (p % c->d != rank)
					continue;
				for (l = 0; l < c->layers; l++)
					for (unsigned j = 0; j < c->blocks;
					     j++) {
						uint64_t src =
							req * c->blocks + j;
						const uint8_t *dst =
							(const uint8_t *) reg[l]
								.addr +
							dst_block(src,
								  nblocks) *
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
	}
	if (!c->quiet)
		printf("D%u: %u requests, %" PRIu64 " bytes verified, %" PRIu64
		       " bad\n",
		       rank, done, checked, bad);
	for (l = 0; l < c->layers; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	free(reg);
	free(h);
	fflush(stdout);
	return bad ? 3 : 0;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static int run_p(const struct cfg *c, unsigned rank, int go_fd, int res_fd)
{
	uint64_t nblocks = (uint64_t) c->requests * c->blocks;
	uint64_t rsize = nblocks * c->block_bytes;
	struct kvb_region *reg = calloc(c->layers, sizeof(*reg));
	struct kvb_remote_region *dst = calloc(c->layers, sizeof(*dst));
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	struct p_result *res = calloc(1, sizeof(*res));
	unsigned drank = rank % c->d, l, next = 0, done = 0, open_now = 0;
	struct kvb_desc *descs = calloc(c->blocks, sizeof(*descs));
	struct kvb_ctx *ctx;
	int64_t start;
	char byte;
	int rc;

	if (!reg || !dst || !t0 || !res || !descs ||
	    attach(c, KVB_ROLE_P, rank, c->p, &ctx))
		return 1;
	for (l = 0; l < c->layers; l++) {
		rc = kvb_mem_alloc(ctx, rsize, 0, l, &reg[l]);
		if (rc)
			return 1;
		for (uint64_t b = 0; b < nblocks; b++)
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
	start = now_ns();
	while (done < c->requests) {
		/* keep up to `inflight` requests going */
		while (next < c->requests && open_now < c->inflight) {
			uint32_t h;
			char id[64];
			unsigned r = next++;

			snprintf(id, sizeof(id), "tx-%u", r);
			rc = kvb_transfer_open(ctx, id, &h);
			if (rc)
				return 1;
			t0[r] = now_ns();
			for (l = 0; l < c->layers; l++) {
				unsigned sent = 0;

				for (unsigned j = 0; j < c->blocks; j++) {
					uint64_t b =
						(uint64_t) r * c->blocks + j;

					descs[j] = (struct kvb_desc){
						.transfer = h,
						.layer = (uint16_t) l,
						.flags = KVB_DESC_UNSIGNALED,
						.region = reg[l].id,
						.peer_region = dst[l].id,
						.offset = b * c->block_bytes,
						.peer_offset =
							dst_block(b, nblocks) *
							c->block_bytes,
						.len = c->block_bytes,
						.tag = r};
				}
				while (sent < c->blocks) {
					rc = kvb_submit_write(ctx, descs + sent,
							      c->blocks - sent);
					if (rc == -EAGAIN)
						continue; /* the broker drains:
							     retry */
					if (rc < 0)
						return 1;
					sent += (unsigned) rc;
				}
				res->writes += c->blocks;
				res->bytes += c->blocks * c->block_bytes;
			}
			while ((rc = kvb_transfer_seal(ctx, h,
						       c->layers * c->blocks,
						       r)) == -EAGAIN)
				;
			if (rc)
				return 1;
			open_now++;
		}
		{
			struct kvb_completion comp[64];
			int n = kvb_wait(ctx, comp, 64, 60000);

			if (n < 0) {
				fprintf(stderr, "kvb-demo: P%u wait: %s\n",
					rank, kvb_strerror(n));
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
	if (write(res_fd, res, sizeof(*res)) != sizeof(*res))
		return 1;
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
	      "Defaults: --p 2 --d 2 --layers 32 --blocks 16 --block-bytes "
	      "4096 --requests 64 --inflight 8\n",
	      f);
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
	int ready[2], go[2], res[2], opt, fails = 0, status;
	static struct p_result pr;
	static double lat[1 << 16];
	uint64_t writes = 0, bytes = 0, failed = 0;
	double elapsed = 0;
	unsigned nlat = 0, i;
	static char js[65536];
	char byte = 1;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		char *end = NULL;
		unsigned long v = optarg ? strtoul(optarg, &end, 0) : 0;

		if (optarg && (opt != 's' && opt != 'j') && (*end || !v)) {
			fprintf(stderr, "kvb-demo: bad value '%s'\n", optarg);
			return 2;
		}
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
	if (c.layers > 65535 || c.p > 64 || c.d > 64 || c.requests > 65536) {
		fprintf(stderr, "kvb-demo: sizes out of range\n");
		return 2;
	}
	if (pipe(ready) || pipe(go) || pipe(res))
		return 1;
	for (i = 0; i < c.d; i++)
		if (fork() == 0) {
			close(go[1]);
			fflush(stdout);
			_exit(run_d(&c, i, ready[1], go[0]));
		}
	close(ready[1]);
	for (i = 0; i < c.d; i++)
		if (read(ready[0], &byte, 1) != 1) {
			fprintf(stderr,
				"kvb-demo: a D worker failed to start\n");
			return 1;
		}
	for (i = 0; i < c.p; i++)
		if (fork() == 0) {
			close(go[1]);
			_exit(run_p(&c, i, go[0], res[1]));
		}
	close(res[1]);
	for (i = 0; i < c.p + c.d; i++)
		if (write(go[1], &byte, 1) != 1)
			return 1;
	while (read(res[0], &pr, sizeof(pr)) == sizeof(pr)) {
		writes += pr.writes;
		bytes += pr.bytes;
		failed += pr.failed;
		if (pr.elapsed_s > elapsed)
			elapsed = pr.elapsed_s;
		for (unsigned k = 0; k < pr.nlat && nlat < (1 << 16); k++)
			lat[nlat++] = pr.lat_us[k];
	}
	while (wait(&status) > 0)
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			fails++;
	qsort(lat, nlat, sizeof(*lat), cmp_dbl);
	if (broker_stats(c.socket, js, sizeof(js)) < 0)
		js[0] = '\0';
	{
		double db = json_num(js, "doorbells"),
		       wrs = json_num(js, "wrs");
		double p50 = nlat ? lat[nlat / 2] : 0;
		double p99 = nlat ? lat[(size_t) (nlat * 0.99)] : 0;

		printf("\n%-10s %-12s %-12s %-10s %-10s %-11s %-12s %-11s "
		       "%-11s\n",
		       "workers", "writes", "bytes", "flushes", "wrs",
		       "wr/flush", "GB/s", "p50[us]", "p99[us]");
		printf("%-10s %-12" PRIu64 " %-12" PRIu64
		       " %-10.0f %-10.0f %-11.2f %-12.3f %-11.1f %-11.1f\n",
		       "", writes, bytes, db, wrs, db > 0 ? wrs / db : 0,
		       elapsed > 0 ? (double) bytes / elapsed / 1e9 : 0, p50,
		       p99);
		printf("(%u P + %u D workers, %u layers x %u blocks x %" PRIu64
		       " B, %u requests; flushes/wrs are the broker's totals "
		       "since it started)\n",
		       c.p, c.d, c.layers, c.blocks, c.block_bytes, c.requests);
		if (c.json) {
			FILE *f = fopen(c.json, "w");

			if (f) {
				fprintf(f,
					"{\"writes\":%" PRIu64
					",\"bytes\":%" PRIu64
					",\"failed\":%" PRIu64
					",\"elapsed_s\":%.6f,"
					"\"lat_p50_us\":%.2f,\"lat_p99_us\":%."
					"2f,\"broker\":%s}\n",
					writes, bytes, failed, elapsed, p50,
					p99, js[0] ? js : "null");
				fclose(f);
			}
		}
	}
	if (fails || failed) {
		fprintf(stderr,
			"kvb-demo: %d worker(s) failed, %" PRIu64 " errors\n",
			fails, failed);
		return 1;
	}
	printf("all bytes verified\n");
	return 0;
}

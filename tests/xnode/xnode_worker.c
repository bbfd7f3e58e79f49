/* SPDX-License-Identifier: MIT */
/*
 * One P or D worker of the cross-node tests (tests/xnode/netns-test.sh).
 *
 * Every worker allocates `layers` KV regions ([2, blocks, 16, heads, 64],
 * bf16-sized elements), declares them with kvb_mem_set_kv(), waits at a
 * file barrier until every worker of the run is attached, connects to the
 * other node's broker, and runs `xfers` transfers (`conc` at a time) named
 * "<prefix>-<i>". Block lists are a function of i, so both sides agree on
 * them without talking. P fills its blocks with a pattern of (its TP rank,
 * layer, block, K/V, byte); D checks every byte of every block it received
 * against the P rank that feeds it, and that blocks outside the list stayed
 * zero. Exit 0 = all transfers ended as expected and the bytes are right.
 * D block lists of distant transfers overlap (they wrap); D opens a
 * transfer only once every D rank of its DP group has ended (and checked)
 * each older one it overlaps, the way a scheduler frees blocks.
 * With --gpu BACKEND the KV regions are device memory of that gpu backend
 * (host: memfd "device memory", everywhere), registered with
 * kvb_mem_register_gpu(); P fills them and D reads them back for the check
 * through the backend's copies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/gpu_api.h"
#include "kvbroker/kvbroker.h"
#include "xnode.h"

static uint64_t block_len(void)
{
	return (uint64_t) BLOCK_SIZE * o.heads * HEAD_DIM * ELEM;
}

static uint8_t pattern(unsigned src_tp, unsigned layer, uint32_t block,
		       unsigned kv, uint64_t off)
{
	uint64_t h = (uint64_t) src_tp * 1000003u + layer * 7919u +
		     (uint64_t) block * 104729u + kv * 31u + off * 13u;

	return (uint8_t) (h ^ (h >> 11) ^ 0x5a);
}

/* P's and D's block ids of transfer i: distinct, shuffled, runs of 2-3. */
static void blocks_of(unsigned i, int side_d, uint32_t *out)
{
	unsigned n = o.per_xfer, base = (i * n * (side_d ? 3 : 5)) % o.nblocks;

	if (o.contig) { /* one run per transfer on both sides (bandwidth) */
		base = (i * n) % (o.nblocks - n + 1);
		for (unsigned j = 0; j < n; j++)
			out[j] = base + j;
		return;
	}
	for (unsigned j = 0; j < n; j++) {
		unsigned k = side_d ? (j % 3 == 2 ? j + 7 : j) : j;

		out[j] = (base + k) % o.nblocks;
	}
	/* make the list unique when the +7 jump collides */
	for (unsigned j = 0; j < n; j++)
		for (unsigned k = 0; k < j; k++)
			if (out[k] == out[j]) {
				out[j] = (out[j] + 1) % o.nblocks;
				k = (unsigned) -1;
			}
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Stay (registered, ports open) for s seconds, or until file exists. */
static void stay(int s, const char *file)
{
	int64_t end = now_ms() + (int64_t) s * 1000;

	while (now_ms() < end && !(file && access(file, F_OK) == 0))
		usleep(50000);
}

/* Is transfer index i in the comma-separated list (NULL: no)? */
static int in_list(const char *list, unsigned i)
{
	while (list && *list) {
		char *end;
		unsigned long v = strtoul(list, &end, 10);

		if (end == list)
			return 0;
		if (v == i)
			return 1;
		list = *end == ',' ? end + 1 : end;
	}
	return 0;
}

/*
 * READ mode: in vLLM, P has its transfer before D learns P's block ids, so
 * D never reads (and releases) a transfer P has not opened. Here P opens
 * all its transfers first, then marks "open-P-<dp>-<tp>"; D waits for every
 * P rank's mark before reading.
 */
static int read_sync(int is_p)
{
	char path[512];
	int64_t end = now_ms() + 30000;

	if (!o.barrier || o.mode != KVB_XFER_READ)
		return 0;
	if (is_p) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/open-P-%d-%d", o.barrier, o.dp,
			 o.tp);
		f = fopen(path, "w");
		if (!f)
			return -errno;
		fclose(f);
		return 0;
	}
	while (now_ms() < end) {
		int n = 0;

		for (int t = 0; t < o.peer_tp_size; t++) {
			snprintf(path, sizeof(path), "%s/open-P-%d-%d",
				 o.barrier, o.peer_dp, t);
			n += access(path, F_OK) == 0;
		}
		if (n == o.peer_tp_size)
			return 0;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

static int barrier(void)
{
	char path[512];
	FILE *f;
	int64_t end = now_ms() + 30000;
	unsigned want;

	if (!o.barrier)
		return 0;
	snprintf(path, sizeof(path), "%s/%c-%d-%d", o.barrier,
		 o.role == KVB_ROLE_P ? 'P' : 'D', o.dp, o.tp);
	f = fopen(path, "w");
	if (!f)
		return -errno;
	fclose(f);
	want = (unsigned) (o.tp_size + o.peer_tp_size);
	while (now_ms() < end) {
		unsigned n = 0;
		char p2[512];

		for (int r = 0; r < 2; r++)
			for (int t = 0; t < (r ? o.peer_tp_size : o.tp_size);
			     t++) {
				int me_p = o.role == KVB_ROLE_P;
				char c = (r == 0) == me_p ? 'P' : 'D';
				int dp = r == 0 ? o.dp : o.peer_dp;

				snprintf(p2, sizeof(p2), "%s/%c-%d-%d",
					 o.barrier, c, dp, t);
				n += access(p2, F_OK) == 0;
			}
		if (n >= want)
			return 0;
		usleep(20000);
	}
	fprintf(stderr, "xnode_worker: barrier timed out\n");
	return -ETIMEDOUT;
}

/* The P rank whose data D rank `d` receives. */
static unsigned source_of(unsigned d)
{
	unsigned L = (unsigned) o.tp_size, R = (unsigned) o.peer_tp_size;

	if (L == R)
		return d;
	return R > L ? d * (R / L) : d / (L / R);
}

/* --gpu: the backend, each layer's device memory, a host staging buffer
 * of one region (globals: still reachable on the early exits) */
static const struct kvb_gpu_api *gapi;
static void **dev;
static uint8_t *stage;

static uint64_t region_len(void)
{
	return 2 * (uint64_t) o.nblocks * block_len();
}

/* Layer l's KV region: host memory shared with the broker, or with --gpu
 * device memory (zeroed) registered with it. */
static int alloc_layer(struct kvb_ctx *ctx, unsigned l, struct kvb_region *r)
{
	const uint32_t flags = KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ;
	int rc;

	if (!o.gpu)
		return kvb_mem_alloc(ctx, region_len(), flags, l, r);
	memset(stage, 0, region_len());
	rc = gapi->alloc(gapi, 0, region_len(), &dev[l]);
	if (!rc)
		rc = gapi->memcpy(gapi, dev[l], stage, region_len(),
				  KVB_GPU_H2D);
	if (rc) {
		fprintf(stderr, "xnode_worker: gpu memory: %s\n",
			gapi->errstr(gapi));
		return rc;
	}
	return kvb_mem_register_gpu(ctx, dev[l], region_len(), 0, flags, l, r);
}

/* P: every block of layer l carries its pattern. */
static int fill_layer(struct kvb_region *r, unsigned l)
{
	uint8_t *p = o.gpu ? stage : r->addr;

	for (uint32_t blk = 0; blk < o.nblocks; blk++)
		for (unsigned kv = 0; kv < 2; kv++)
			for (uint64_t b = 0; b < block_len(); b++)
				p[(kv * (uint64_t) o.nblocks + blk) *
					  block_len() +
				  b] = pattern((unsigned) o.tp, l, blk, kv, b);
	return o.gpu ? gapi->memcpy(gapi, dev[l], stage, region_len(),
				    KVB_GPU_H2D)
		     : 0;
}

/* D: do our heads differ from a P rank's (--peer-heads)? */
static int heads_split(void)
{
	return o.peer_heads && o.peer_heads != o.heads;
}

/*
 * D: which P rank wrote byte b of a received block, and where it sits in
 * that rank's block (*poff). Without a split: source_of(), the same
 * offset. With one where a P rank holds m times our heads (m = D TP / P
 * TP), this rank holds slice tp % m of each token's heads of P rank tp / m;
 * where we hold m times a P rank's heads (m = P TP / D TP), head h of a
 * token came from P rank tp * m + h / peer_heads.
 */
static unsigned p_source(uint64_t b, uint64_t *poff)
{
	uint64_t unit = (uint64_t) HEAD_DIM * ELEM, row = o.heads * unit;
	uint64_t prow = o.peer_heads * unit, tok = b / row, rem = b % row;
	unsigned m;

	if (!heads_split()) {
		*poff = b;
		return source_of((unsigned) o.tp);
	}
	if (o.tp_size > o.peer_tp_size) {
		m = (unsigned) (o.tp_size / o.peer_tp_size);
		*poff = tok * prow + (uint64_t) ((unsigned) o.tp % m) * row +
			rem;
		return (unsigned) o.tp / m;
	}
	m = (unsigned) (o.peer_tp_size / o.tp_size);
	*poff = tok * prow + (rem / unit) % o.peer_heads * unit + rem % unit;
	return (unsigned) o.tp * m + (unsigned) (rem / unit / o.peer_heads);
}

static int check_layer(struct kvb_region *r, unsigned layer, unsigned i,
		       const uint32_t *db, const uint32_t *pb)
{
	uint64_t bl = block_len();
	const uint8_t *base = o.gpu ? stage : r->addr;

	if (o.gpu &&
	    gapi->memcpy(gapi, stage, dev[layer], region_len(), KVB_GPU_D2H)) {
		fprintf(stderr, "xnode_worker: gpu copy back: %s\n",
			gapi->errstr(gapi));
		return -1;
	}

	for (unsigned j = 0; j < o.per_xfer; j++)
		for (unsigned kv = 0; kv < 2; kv++) {
			const uint8_t *p =
				base + (kv * (uint64_t) o.nblocks + db[j]) * bl;

			for (uint64_t b = 0; b < bl; b++) {
				uint64_t po;
				unsigned src = p_source(b, &po);

				if (p[b] == pattern(src, layer, pb[j], kv, po))
					continue;
				fprintf(stderr,
					"xnode_worker D tp %d: transfer %u "
					"layer %u block %u (P %u rank %u) %c "
					"byte %llu: %#x, expected %#x\n",
					o.tp, i, layer, db[j], pb[j], src,
					kv ? 'V' : 'K', (unsigned long long) b,
					p[b],
					pattern(src, layer, pb[j], kv, po));
				return -1;
			}
		}
	return 0;
}

/* globals: still reachable (not leaks) on the early exits */
static struct kvb_region *reg;
static uint32_t *handles;
static uint8_t *live;	   /* transfer i started and not ended */
static uint8_t *blk_taken; /* scratch: D blocks of the live transfers */

/* D: this rank is done with transfer i (ended, bytes checked) */
static void d_mark_ended(unsigned i)
{
	char path[512];
	FILE *f;

	if (!o.barrier || o.role == KVB_ROLE_P)
		return;
	snprintf(path, sizeof(path), "%s/end-%s-%d-%d-%u", o.barrier, o.prefix,
		 o.dp, o.tp, i);
	f = fopen(path, "w");
	if (f)
		fclose(f);
}

/* D: has every TP rank of this DP group marked transfer j ended? */
static int d_all_ended(unsigned j)
{
	char path[512];

	if (!o.barrier)
		return 1;
	for (int t = 0; t < o.tp_size; t++) {
		snprintf(path, sizeof(path), "%s/end-%s-%d-%d-%u", o.barrier,
			 o.prefix, o.dp, t, j);
		if (access(path, F_OK) != 0)
			return 0;
	}
	return 1;
}

/*
 * D: may transfer i start? Not while an older transfer that shares one of
 * its D blocks is still running on any TP rank of this DP group: the block
 * lists wrap around the regions, transfers end in any order, and (as with
 * vLLM's scheduler, whose block ids hold for all TP ranks) one D rank's
 * open of transfer i sends remote_blocks to every P rank, which then write
 * those blocks on each D rank, possibly before a slower rank has checked
 * the older transfer's bytes there.
 */
static int d_blocks_free(unsigned i, uint32_t *tmp)
{
	memset(blk_taken, 0, o.nblocks);
	blocks_of(i, 1, tmp);
	for (unsigned k = 0; k < o.per_xfer; k++)
		blk_taken[tmp[k]] = 1;
	for (unsigned j = 0; j < i; j++) {
		int overlap = 0;

		blocks_of(j, 1, tmp);
		for (unsigned k = 0; k < o.per_xfer && !overlap; k++)
			overlap = blk_taken[tmp[k]];
		if (overlap && (live[j] || !d_all_ended(j)))
			return 0;
	}
	return 1;
}

/*
 * D, host memory: transfer i failed; its completion says that nothing of it
 * lands any more. Its regions must stay exactly as they are now for ms
 * (while a P side that was still writing drains). 0, or 1 after a message.
 */
static int quiet_check(unsigned i, int ms)
{
	uint8_t **snap = calloc(o.layers, sizeof(*snap));
	int changed = 0;

	if (!snap || o.gpu) {
		free(snap);
		return 0;
	}
	for (unsigned l = 0; l < o.layers; l++) {
		snap[l] = malloc(region_len());
		if (!snap[l])
			goto out;
		memcpy(snap[l], reg[l].addr, region_len());
	}
	usleep((useconds_t) ms * 1000);
	for (unsigned l = 0; l < o.layers; l++)
		if (memcmp(snap[l], reg[l].addr, region_len())) {
			fprintf(stderr,
				"xnode_worker D tp %d: transfer %u: layer %u "
				"changed within %d ms after its failure\n",
				o.tp, i, l, ms);
			changed = 1;
		}
	printf("xnode_worker D tp %d: transfer %u failed; its regions %s for "
	       "%d ms after\n",
	       o.tp, i, changed ? "CHANGED" : "stayed the same", ms);
out:
	for (unsigned l = 0; l < o.layers; l++)
		free(snap[l]);
	free(snap);
	return changed;
}

/* Everything between attach and detach: the exit status. Every path out of
 * it, error or not, comes back to main(), which detaches and frees. */
static int run(struct kvb_ctx *ctx)
{
	struct kvb_kv_geometry g;
	uint32_t peer = 0;
	uint32_t pb[4096], db[4096];
	unsigned started = 0, ended = 0, bad = 0, ok = 0, cancelled = 0;
	int64_t deadline, t_start;
	int rc, is_p;

	is_p = o.role == KVB_ROLE_P;
	g = (struct kvb_kv_geometry){KVB_KV_KV_FIRST, o.nblocks, BLOCK_SIZE,
				     o.heads,	      HEAD_DIM,	 ELEM};
	reg = calloc(o.layers, sizeof(*reg));
	handles = calloc(o.xfers, sizeof(*handles));
	live = calloc(o.xfers, 1);
	blk_taken = calloc(o.nblocks, 1);
	if (!reg || !handles || !live || !blk_taken) {
		fprintf(stderr, "xnode_worker: out of memory\n");
		return 1;
	}
	for (unsigned l = 0; l < o.layers; l++) {
		rc = alloc_layer(ctx, l, &reg[l]);
		if (!rc)
			rc = kvb_mem_set_kv(ctx, reg[l].id, l, &g);
		if (!rc && is_p)
			rc = fill_layer(&reg[l], l);
		if (rc) {
			fprintf(stderr, "xnode_worker: region %u: %s\n", l,
				kvb_strerror(rc));
			return 1;
		}
	}
	if (barrier())
		return 1;
	/* the peer may still be registering: retry for a few seconds, but
	 * not after a refusal that a retry cannot change */
	deadline = now_ms() + 15000;
	do {
		rc = kvb_peer_connect(ctx, o.peer_host, (uint16_t) o.peer_port,
				      &peer);
		if (rc && rc != -EACCES && rc != -EPROTONOSUPPORT)
			usleep(200000);
	} while (rc && rc != -EACCES && rc != -EPROTONOSUPPORT &&
		 now_ms() < deadline);
	if (o.expect_peer_error) {
		printf("xnode_worker %c tp %d: peer %s:%d: %s (expected %s)\n",
		       is_p ? 'P' : 'D', o.tp, o.peer_host, o.peer_port,
		       rc ? kvb_strerror(rc) : "connected",
		       kvb_strerror(-EACCES));
		fflush(stdout);
		if (o.hold_s) /* keep the notify port open meanwhile */
			stay(o.hold_s, o.hold_until);
		return rc == -EACCES ? 0 : 1;
	}
	if (rc) {
		fprintf(stderr, "xnode_worker: peer %s:%d: %s\n", o.peer_host,
			o.peer_port, kvb_strerror(rc));
		return 1;
	}
	if (o.start_delay_ms) /* a slow rank: open after the others */
		usleep((useconds_t) o.start_delay_ms * 1000);
	if (o.hold_s) /* just be there (registered) for a while */
		stay(o.hold_s, o.hold_until);
	if (o.check_zero && !o.gpu) { /* nobody wrote here (attackers) */
		uint64_t nz = 0;

		for (unsigned l = 0; l < o.layers; l++)
			for (uint64_t k = 0; k < reg[l].size; k++)
				nz += ((const uint8_t *) reg[l].addr)[k] != 0;
		printf("xnode_worker %c tp %d: %u regions (ids %u..%u), %llu "
		       "non-zero bytes\n",
		       is_p ? 'P' : 'D', o.tp, o.layers, reg[0].id,
		       reg[o.layers - 1].id, (unsigned long long) nz);
		fflush(stdout);
		if (nz)
			return 1;
	}
	if (o.check && !is_p) { /* transfers another process drove here */
		unsigned nbad = 0, nchk = 0;

		for (unsigned i = 0; i < 4096; i++) {
			int good = 1;

			if (!in_list(o.check, i))
				continue;
			nchk++;
			blocks_of(i, 0, pb);
			blocks_of(i, 1, db);
			for (unsigned l = 0; l < o.layers && good; l++)
				good = !check_layer(&reg[l], l, i, db, pb);
			nbad += !good;
		}
		printf("xnode_worker D dp %d tp %d/%d: bytes of %u transfer(s) "
		       "checked, %u bad\n",
		       o.dp, o.tp, o.tp_size, nchk, nbad);
		if (nbad)
			return 1;
	}
	t_start = now_ms();
	deadline = now_ms() + (int64_t) o.timeout_s * 1000;
	while (ended < o.xfers && now_ms() < deadline) {
		/* D: replace one layer's region mid-run (the P side's writes to
		 * the old one fail with a remote access error) */
		if (o.swap_after && !o.swapped &&
		    ended >= (unsigned) o.swap_after &&
		    (unsigned) o.swap_layer < o.layers) {
			struct kvb_region nr;
			unsigned l = (unsigned) o.swap_layer;

			o.swapped = 1;
			rc = kvb_mem_free(ctx, &reg[l]);
			if (!rc)
				rc = alloc_layer(ctx, l, &nr);
			if (!rc)
				rc = kvb_mem_set_kv(ctx, nr.id, l, &g);
			if (rc) {
				fprintf(stderr, "xnode_worker: swap: %s\n",
					kvb_strerror(rc));
				return 1;
			}
			reg[l] = nr;
			printf("xnode_worker %c tp %d: layer %u region "
			       "replaced after %u transfers ended\n",
			       is_p ? 'P' : 'D', o.tp, l, ended);
		}
		struct kvb_completion c[64];
		int n;

		if (started == 0 && !is_p && read_sync(0)) {
			fprintf(stderr, "xnode_worker: P never opened\n");
			return 1;
		}
		while (started < o.xfers &&
		       (started - ended < o.conc ||
			(is_p && o.mode == KVB_XFER_READ))) {
			unsigned i = started;
			char id[128];
			struct kvb_remote_xfer rx = {
				.peer = peer,
				.mode = (uint32_t) o.mode,
				.remote_dp_rank = (uint32_t) o.peer_dp};
			uint32_t expect;
			int64_t retry_end = now_ms() + 10000;

			if (!is_p && !d_blocks_free(i, db))
				break; /* after an older one ends */
			blocks_of(i, 0, pb);
			blocks_of(i, 1, db);
			snprintf(id, sizeof(id), "%s-%u", o.prefix, i);
			rx.blocks = is_p ? pb : db;
			rx.nblocks = o.per_xfer;
			if (o.notify_port) {
				rx.notify_host = o.notify_host;
				rx.notify_port = (uint16_t) o.notify_port;
			}
			if (!is_p && o.mode == KVB_XFER_READ) {
				rx.remote_blocks = pb;
				rx.nremote = o.per_xfer;
				if (o.plain_release)
					rx.flags |= KVB_XFER_F_PLAIN_RELEASE;
			}
			do { /* D: the P side may not be known yet */
				rc = kvb_transfer_open_remote(ctx, id, &rx,
							      &handles[i]);
				if (rc == -EHOSTUNREACH) {
					usleep(100000);
					kvb_peer_connect(ctx, o.peer_host,
							 (uint16_t) o.peer_port,
							 &peer);
				}
			} while (rc == -EHOSTUNREACH && now_ms() < retry_end);
			if (rc && is_p && o.expect_fail &&
			    (rc == -ESTALE || rc == -EHOSTDOWN)) {
				/* its D broker died before we opened it: the
				 * announcement ended with the peer (the peer
				 * clock, docs/deadlines.md): failed at open */
				fprintf(stderr,
					"xnode_worker: open %s: %s (its peer "
					"was lost)\n",
					id, kvb_strerror(rc));
				started++;
				ended++;
				bad++;
				continue;
			}
			if (rc) {
				fprintf(stderr, "xnode_worker: open %s: %s\n",
					id, kvb_strerror(rc));
				return 1;
			}
			if (o.deadline_ms &&
			    (rc = kvb_transfer_set_timeouts(
				     ctx, handles[i], (uint32_t) o.deadline_ms,
				     0, 0))) {
				fprintf(stderr,
					"xnode_worker: set_timeouts %s: %s\n",
					id, kvb_strerror(rc));
				return 1;
			}
			if ((is_p && o.mode == KVB_XFER_WRITE) ||
			    (!is_p && o.mode == KVB_XFER_READ)) {
				for (unsigned l = 0; l < o.layers; l++) {
					if (o.layer_delay_ms)
						usleep((useconds_t) o
							       .layer_delay_ms *
						       1000);
					while ((rc = kvb_submit_layer(
							ctx, handles[i],
							(uint16_t) l, l,
							KVB_DESC_UNSIGNALED)) ==
					       -EAGAIN)
						usleep(100);
				}
				expect = o.layers;
			} else if (is_p) {
				expect = 0; /* READ: D's release ends it */
			} else {
				/* one write_done; with the heads split over
				 * more P ranks, one from each */
				expect = heads_split() && o.peer_tp_size >
								  o.tp_size
						 ? (uint32_t) (o.peer_tp_size /
							       o.tp_size)
						 : 1;
			}
			rc = kvb_transfer_seal(ctx, handles[i], expect,
					       1000000 + i);
			if (rc) {
				fprintf(stderr, "xnode_worker: seal: %s\n",
					kvb_strerror(rc));
				return 1;
			}
			live[i] = 1;
			started++;
			if (is_p && started == o.xfers && read_sync(1))
				return 1;
		}
		n = kvb_wait(ctx, c, 64, 200);
		if (n == -ETIMEDOUT)
			continue;
		if (n < 0) {
			fprintf(stderr, "xnode_worker: wait: %s\n",
				kvb_strerror(n));
			return 1;
		}
		for (int k = 0; k < n; k++) {
			unsigned i;

			if (c[k].kind == KVB_COMP_DESC) {
				if (c[k].status && !o.expect_fail &&
				    !(o.expect_cancel &&
				      c[k].status == -ECANCELED))
					fprintf(stderr,
						"xnode_worker: layer %llu "
						"failed: %s\n",
						(unsigned long long) c[k].tag,
						kvb_strerror(c[k].status));
				continue;
			}
			if (c[k].kind != KVB_COMP_TRANSFER)
				continue;
			i = (unsigned) (c[k].tag - 1000000);
			if (c[k].tag == 0 && o.expect_fail) {
				/* failed before its seal (its peer lost while
				 * it was being submitted): the seal's own
				 * completion, refused, ends it here */
				continue;
			}
			if (i >= o.xfers || !live[i]) {
				fprintf(stderr,
					"xnode_worker: completion for "
					"transfer tag %llu, not running\n",
					(unsigned long long) c[k].tag);
				bad++;
				continue;
			}
			live[i] = 0;
			ended++;
			if (o.expect_cancel && in_list(o.expect_cancel, i)) {
				if (c[k].status == -ECANCELED) {
					cancelled++;
				} else {
					bad++;
					fprintf(stderr,
						"xnode_worker %c tp %d: "
						"transfer %u: %s, expected "
						"%s\n",
						is_p ? 'P' : 'D', o.tp, i,
						c[k].status
							? kvb_strerror(
								  c[k].status)
							: "success",
						kvb_strerror(-ECANCELED));
				}
				d_mark_ended(i);
				continue;
			}
			if (c[k].status) {
				bad++;
				if (!is_p && o.quiet_check_ms &&
				    quiet_check(i, o.quiet_check_ms))
					o.wrong_err++;
				if (o.fail_errno &&
				    c[k].status != -o.fail_errno) {
					o.wrong_err++;
					fprintf(stderr,
						"xnode_worker %c tp %d: "
						"transfer %u: %s, expected "
						"%s\n",
						is_p ? 'P' : 'D', o.tp, i,
						kvb_strerror(c[k].status),
						kvb_strerror(-o.fail_errno));
				} else if (!o.expect_fail)
					fprintf(stderr,
						"xnode_worker %c tp %d: "
						"transfer %u: %s\n",
						is_p ? 'P' : 'D', o.tp, i,
						kvb_strerror(c[k].status));
				d_mark_ended(i);
				continue;
			}
			if (!is_p && !o.no_verify) {
				int good = 1;

				blocks_of(i, 0, pb);
				blocks_of(i, 1, db);
				for (unsigned l = 0; l < o.layers && good; l++)
					good = !check_layer(&reg[l], l, i, db,
							    pb);
				d_mark_ended(i);
				if (!good) {
					bad++;
					continue;
				}
			}
			if (o.no_verify)
				d_mark_ended(i);
			ok++;
			if (i + 1 > o.last_ok)
				o.last_ok = i + 1;
		}
	}
	printf("xnode_worker %c dp %d tp %d/%d: %u transfers, %u ok, %u "
	       "failed, %u unfinished",
	       is_p ? 'P' : 'D', o.dp, o.tp, o.tp_size, o.xfers, ok, bad,
	       o.xfers - ended);
	if (o.expect_cancel)
		printf(", %u cancelled as expected", cancelled);
	printf("\n");
	if (ok && now_ms() > t_start) {
		double secs = (double) (now_ms() - t_start) / 1000.0;
		double bytes = (double) ok * o.layers * o.per_xfer * 2.0 *
			       (double) block_len();

		printf("xnode_worker %c tp %d: %.0f bytes in %.3f s: %.3f GB/s "
		       "(%.2f Gbit/s) of KV payload\n",
		       is_p ? 'P' : 'D', o.tp, bytes, secs, bytes / secs / 1e9,
		       bytes * 8 / secs / 1e9);
	}
	fflush(stdout);
	if (o.linger_until) /* messages still to come to our ports */
		stay(o.timeout_s, o.linger_until);
	if (ended < o.xfers)
		return 1;
	if (o.expect_fail)
		return bad == o.xfers && !o.wrong_err ? 0 : 1;
	if (o.expect_some_fail == 2) /* --allow-fail: the last succeeded */
		return o.last_ok == o.xfers ? 0 : 1;
	if (o.expect_some_fail) /* some failed, and the last one succeeded */
		return bad && o.last_ok == o.xfers ? 0 : 1;
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct kvb_attach_opts ao = {0};
	struct kvb_ctx *ctx;
	int rc;

	if (xnode_parse(argc, argv)) {
		xnode_usage();
		return 2;
	}
	if (o.gpu) { /* before kvb_mem_register_gpu() picks a backend */
		char why[256] = "";
		int n = 0;

		if (kvb_gpu_backend_init(o.gpu, why, sizeof(why)) == 0)
			gapi = kvb_gpu_backend();
		if (!gapi || gapi->device_count(gapi, &n) || n < 1) {
			fprintf(stderr, "xnode_worker: gpu backend %s: %s\n",
				o.gpu, why[0] ? why : "no device");
			return 77;
		}
		dev = calloc(o.layers, sizeof(*dev));
		stage = malloc(region_len());
		if (!dev || !stage) {
			fprintf(stderr, "xnode_worker: out of memory\n");
			return 1;
		}
	}
	ao.socket_path = o.socket;
	ao.role = (enum kvb_role) o.role;
	ao.dp_rank = (uint32_t) o.dp;
	ao.tp_rank = (uint32_t) o.tp;
	ao.tp_size = (uint32_t) o.tp_size;
	ao.timeout_ms = 10000;
	rc = kvb_attach(&ao, &ctx);
	if (rc) {
		fprintf(stderr, "xnode_worker: attach: %s\n", kvb_strerror(rc));
		return 1;
	}
	rc = run(ctx);
	/* the regions go with the attach: freed by the broker */
	kvb_detach(ctx);
	for (unsigned l = 0; dev && l < o.layers; l++)
		if (dev[l])
			gapi->free(gapi, dev[l]);
	free(dev);
	free(stage);
	free(reg);
	free(handles);
	free(live);
	free(blk_taken);
	return rc;
}

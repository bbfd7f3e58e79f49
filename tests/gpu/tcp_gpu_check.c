/* SPDX-License-Identifier: MIT */
/*
 * The tcp transport with GPU memory on a real runtime: two transports in
 * this process over 127.0.0.1, device regions on both sides (the second
 * device for the target where there is one). WRITE every block from the
 * source to the target in a shuffled order, READ them back into a third
 * region, check every byte on the host, and time both (staging buffers:
 * docs/tcp.md, "GPU memory"). Plain C (no cmocka), so that
 * scripts/device-check.sh builds it with gcc on a lent GPU machine.
 *
 *   tcp_gpu_check [--backend host|cuda|hip|auto] [--mib N] [--block-kib K]
 *
 * Exit 0 when every byte matched, 1 on a failure, 77 when the backend has
 * no device. Every wait is bounded (30 s).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu_api.h"
#include "kvbroker/kvbroker.h"
#include "tcp/tcp.h"

#define WAIT_S 30.0

static const struct kvb_gpu_api *G;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static struct kvb_transport *topen(void)
{
	struct kvb_transport_params p;
	struct kvb_transport *t = NULL;
	char why[128] = "";
	int rc;

	memset(&p, 0, sizeof(p));
	p.host_ip = "127.0.0.1";
	p.timeout_ms = 10000;
	rc = kvb_tcp_ops.open(&p, &t, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "tcp_gpu_check: tcp open: %s %s\n",
			strerror(-rc), why);
		return NULL;
	}
	return t;
}

/* Post n ops (a prefix at a time) and poll both sides until all complete;
 * returns the number that completed with an error, or -1 on a timeout. */
static long run(struct kvb_transport *a, struct kvb_transport *b,
		struct kvb_ep *ep, const struct kvb_xop *ops, unsigned n)
{
	double end = now_s() + WAIT_S;
	unsigned posted = 0, done = 0;
	long bad = 0;

	while (done < n) {
		struct kvb_xcqe c[256];
		int k, i;

		if (posted < n) {
			k = kvb_tcp_ops.post(a, ep, ops + posted, n - posted);
			if (k < 0) {
				fprintf(stderr, "tcp_gpu_check: post: %s\n",
					strerror(-k));
				return -1;
			}
			posted += (unsigned) k;
		}
		if (kvb_tcp_ops.poll(b, c, 256) < 0)
			return -1;
		k = kvb_tcp_ops.poll(a, c, 256);
		if (k < 0)
			return -1;
		for (i = 0; i < k; i++)
			if (c[i].status) {
				if (!bad)
					fprintf(stderr,
						"tcp_gpu_check: op %llu: %s\n",
						(unsigned long long) c[i]
							.cookie,
						strerror(-c[i].status));
				bad++;
			}
		done += (unsigned) k;
		if (now_s() > end) {
			fprintf(stderr,
				"tcp_gpu_check: %u of %u ops done after %.0f "
				"s\n",
				done, n, WAIT_S);
			return -1;
		}
	}
	return bad;
}

static int check(const char *what, const uint8_t *src, const void *dev,
		 uint8_t *tmp, uint64_t len)
{
	uint64_t i;

	if (G->memcpy(G, tmp, dev, len, KVB_GPU_D2H)) {
		fprintf(stderr, "tcp_gpu_check: copy back: %s\n", G->errstr(G));
		return 1;
	}
	for (i = 0; i < len; i++)
		if (tmp[i] != src[i]) {
			fprintf(stderr,
				"tcp_gpu_check: %s: byte %llu is %#x, not "
				"%#x\n",
				what, (unsigned long long) i, tmp[i], src[i]);
			return 1;
		}
	return 0;
}

int main(int argc, char **argv)
{
	const char *backend = "auto";
	uint64_t mib = 256, bkib = 256, len, bs, i;
	struct kvb_mr src = {0}, dst = {0}, back = {0};
	struct kvb_transport *a = NULL, *b = NULL;
	struct kvb_tcp_stats sa, sb;
	struct kvb_xop *ops = NULL;
	struct kvb_ep *ep = NULL;
	uint8_t *h = NULL, *tmp = NULL, blob[64];
	size_t blen = sizeof(blob);
	int ndev = 0, rc = 1, ddev;
	unsigned n, *perm = NULL;
	char why[256] = "";
	double t0, tw, tr;
	long bad;

	for (int k = 1; k < argc; k++) {
		if (!strcmp(argv[k], "--backend") && k + 1 < argc)
			backend = argv[++k];
		else if (!strcmp(argv[k], "--mib") && k + 1 < argc)
			mib = strtoull(argv[++k], NULL, 10);
		else if (!strcmp(argv[k], "--block-kib") && k + 1 < argc)
			bkib = strtoull(argv[++k], NULL, 10);
		else {
			fprintf(stderr,
				"usage: tcp_gpu_check [--backend NAME] [--mib "
				"N] [--block-kib K]\n");
			return 2;
		}
	}
	len = mib << 20;
	bs = bkib << 10;
	if (!len || !bs || len % bs || len / bs > 1000000) {
		fprintf(stderr, "tcp_gpu_check: --mib must be a multiple of "
				"--block-kib, both > 0\n");
		return 2;
	}
	n = (unsigned) (len / bs);
	if (kvb_gpu_backend_init(backend, why, sizeof(why)) ||
	    !(G = kvb_gpu_backend()) || G->device_count(G, &ndev) || !ndev) {
		printf("SKIP: gpu backend %s: %s\n", backend,
		       why[0] ? why : "no device");
		return 77;
	}
	ddev = ndev > 1 ? 1 : 0;
	printf("tcp_gpu_check: backend %s, %d device%s, %llu MiB in %u blocks "
	       "of %llu KiB, device 0 -> device %d over 127.0.0.1\n",
	       G->name, ndev, ndev == 1 ? "" : "s", (unsigned long long) mib, n,
	       (unsigned long long) bkib, ddev);
	h = malloc(len);
	tmp = malloc(len);
	ops = calloc(n, sizeof(*ops));
	perm = calloc(n, sizeof(*perm));
	if (!h || !tmp || !ops || !perm)
		goto out;
	for (i = 0; i < len; i++)
		h[i] = (uint8_t) (i * 131 + (i >> 12) * 7 + 1);
	if (G->alloc(G, 0, len, &src.addr) ||
	    G->alloc(G, ddev, len, &dst.addr) ||
	    G->alloc(G, 0, len, &back.addr)) {
		fprintf(stderr, "tcp_gpu_check: alloc: %s\n", G->errstr(G));
		goto out;
	}
	if (G->memcpy(G, src.addr, h, len, KVB_GPU_H2D)) {
		fprintf(stderr, "tcp_gpu_check: fill: %s\n", G->errstr(G));
		goto out;
	}
	src.id = 1, back.id = 2, dst.id = 7;
	src.len = dst.len = back.len = len;
	src.kind = dst.kind = back.kind = KVB_MEM_GPU;
	src.gpu_device = back.gpu_device = 0;
	dst.gpu_device = ddev;
	dst.flags = KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ;
	a = topen();
	b = topen();
	if (!a || !b)
		goto out;
	if (kvb_tcp_ops.reg_mr(a, &src) || kvb_tcp_ops.reg_mr(a, &back) ||
	    kvb_tcp_ops.reg_mr(b, &dst)) {
		fprintf(stderr, "tcp_gpu_check: reg_mr refused GPU memory\n");
		goto out;
	}
	if (kvb_tcp_ops.local_info(b, blob, &blen) ||
	    kvb_tcp_peer_allow(b, 0, kvb_tcp_tool_key, NULL, -1) ||
	    kvb_tcp_ops.connect(a, blob, blen, &ep) ||
	    kvb_tcp_ep_set_key(a, ep, kvb_tcp_tool_key))
		goto out;
	/* target blocks shuffled: every op lands apart from its neighbours */
	for (i = 0; i < n; i++)
		perm[i] = (unsigned) i;
	srand(1);
	for (i = n - 1; i > 0; i--) {
		unsigned j = (unsigned) rand() % (unsigned) (i + 1),
			 t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (i = 0; i < n; i++)
		ops[i] = (struct kvb_xop){.opcode = KVB_XOP_WRITE,
					  .local = &src,
					  .local_off = i * bs,
					  .remote.region = 7,
					  .remote_off = perm[i] * bs,
					  .len = bs,
					  .cookie = i};
	t0 = now_s();
	bad = run(a, b, ep, ops, n);
	tw = now_s() - t0;
	if (bad) {
		fprintf(stderr, "tcp_gpu_check: WRITE: %ld ops failed\n", bad);
		goto out;
	}
	/* dst block perm[i] holds source block i: READ it back to block i */
	for (i = 0; i < n; i++) {
		ops[i].opcode = KVB_XOP_READ;
		ops[i].local = &back;
	}
	t0 = now_s();
	bad = run(a, b, ep, ops, n);
	tr = now_s() - t0;
	if (bad) {
		fprintf(stderr, "tcp_gpu_check: READ: %ld ops failed\n", bad);
		goto out;
	}
	if (check("READ back", h, back.addr, tmp, len))
		goto out;
	for (i = 0; i < n; i++) /* the target, in the source's order */
		if (G->memcpy(G, tmp + i * bs, (char *) dst.addr + perm[i] * bs,
			      bs, KVB_GPU_D2H))
			goto out;
	if (memcmp(tmp, h, len)) {
		fprintf(stderr, "tcp_gpu_check: WRITE target differs\n");
		goto out;
	}
	kvb_tcp_get_stats(a, &sa);
	kvb_tcp_get_stats(b, &sb);
	if (sa.gpu_tx_bytes != len || sb.gpu_rx_bytes != len ||
	    sb.gpu_tx_bytes != len || sa.gpu_rx_bytes != len ||
	    sa.gpu_copy_errors || sb.gpu_copy_errors) {
		fprintf(stderr,
			"tcp_gpu_check: staged bytes A out %llu in %llu, B out "
			"%llu in %llu (want %llu each), copy errors %llu\n",
			(unsigned long long) sa.gpu_tx_bytes,
			(unsigned long long) sa.gpu_rx_bytes,
			(unsigned long long) sb.gpu_tx_bytes,
			(unsigned long long) sb.gpu_rx_bytes,
			(unsigned long long) len,
			(unsigned long long) (sa.gpu_copy_errors +
					      sb.gpu_copy_errors));
		goto out;
	}
	printf("tcp_gpu_check: WRITE %.3f GB/s, READ %.3f GB/s (GPU memory "
	       "on both sides, staged through host buffers, one thread); "
	       "every byte checked\n",
	       (double) len / tw / 1e9, (double) len / tr / 1e9);
	rc = 0;
out:
	if (a)
		kvb_tcp_ops.close(a);
	if (b)
		kvb_tcp_ops.close(b);
	if (G) {
		if (src.addr)
			G->free(G, src.addr);
		if (dst.addr)
			G->free(G, dst.addr);
		if (back.addr)
			G->free(G, back.addr);
	}
	free(h);
	free(tmp);
	free(ops);
	free(perm);
	if (rc)
		printf("tcp_gpu_check: FAILED\n");
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * GPU regions through the whole broker: a broker started with --transport
 * gpu, a D worker and a P worker in their own processes, each holding
 * "device memory" of the chosen gpu backend, registered with
 * kvb_mem_register_gpu() (IPC export in the worker, import in the broker).
 * P writes scattered blocks of every layer into D through the broker, which
 * routes them to the gpu transport; D copies its memory back and checks
 * every byte. Also: a host region writing into a GPU region is refused.
 *
 *   gpu_broker_test BROKER_BIN BACKEND     (BACKEND: host | cuda | hip | auto)
 *
 * With `host` it runs everywhere (memfd "device memory"); with a real
 * backend it exits 77 where no GPU is present. No runtime is touched before
 * fork() (CUDA and HIP do not survive it).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "gpu/gpu_api.h"
#include "kvbroker/kvbroker.h"

#define LAYERS	    4
#define BLOCKS	    64
#define BLOCK_BYTES 8192
#define REGION	    (BLOCKS * BLOCK_BYTES)

static char sock[128];

static uint8_t pattern(unsigned layer, unsigned blk, unsigned off)
{
	return (uint8_t) (layer * 131 + blk * 7 + off * 13 + (off >> 8));
}

/* D's block for P's block: runs of 4, in reverse run order */
static unsigned dst_block(unsigned b)
{
	return (BLOCKS / 4 - 1 - b / 4) * 4 + b % 4;
}

static int backend_up(const char *backend, const struct kvb_gpu_api **g)
{
	char why[256] = "";
	int n = 0;

	if (kvb_gpu_backend_init(backend, why, sizeof(why))) {
		fprintf(stderr, "gpu backend %s unavailable: %s\n", backend,
			why);
		return 77;
	}
	*g = kvb_gpu_backend();
	if ((*g)->device_count(*g, &n) || n < 1) {
		fprintf(stderr, "no GPU device\n");
		return 77;
	}
	return 0;
}

static int attach(enum kvb_role role, struct kvb_ctx **ctx)
{
	struct kvb_attach_opts o = {
		.socket_path = sock, .role = role, .tp_size = 1};
	int rc = kvb_attach(&o, ctx);

	if (rc)
		fprintf(stderr, "attach: %s\n", kvb_strerror(rc));
	return rc;
}

static int wait_transfer(struct kvb_ctx *ctx, int *status)
{
	struct kvb_completion c[16];

	for (;;) {
		int n = kvb_wait(ctx, c, 16, 20000);

		if (n < 0)
			return n;
		for (int i = 0; i < n; i++) {
			if (c[i].kind == KVB_COMP_TRANSFER) {
				*status = c[i].status;
				return 0;
			}
			if (c[i].status) {
				fprintf(stderr, "descriptor %llu failed: %s\n",
					(unsigned long long) c[i].tag,
					kvb_strerror(c[i].status));
			}
		}
	}
}

static int run_d(const char *backend, int ready_fd)
{
	const struct kvb_gpu_api *g;
	struct kvb_region reg[LAYERS];
	static uint8_t host[REGION];
	struct kvb_ctx *ctx;
	void *dev[LAYERS];
	uint32_t h;
	int rc, st = -1;
	long bad = 0;

	rc = backend_up(backend, &g);
	if (rc)
		return rc;
	if (attach(KVB_ROLE_D, &ctx))
		return 1;
	memset(host, 0, sizeof(host));
	for (int l = 0; l < LAYERS; l++) {
		if (g->alloc(g, 0, REGION, &dev[l]) ||
		    g->memcpy(g, dev[l], host, REGION, KVB_GPU_H2D))
			return 1;
		rc = kvb_mem_register_gpu(ctx, dev[l], REGION, 0,
					  KVB_MEM_REMOTE_WRITE, (uint64_t) l,
					  &reg[l]);
		if (rc) {
			fprintf(stderr, "D: register gpu: %s\n",
				kvb_strerror(rc));
			return 1;
		}
	}
	if (kvb_transfer_open(ctx, "tx-gpu", &h) ||
	    kvb_transfer_seal(ctx, h, 1, 0))
		return 1;
	if (write(ready_fd, "r", 1) != 1)
		return 1;
	rc = wait_transfer(ctx, &st);
	if (rc || st) {
		fprintf(stderr, "D: transfer: %s\n",
			kvb_strerror(rc ? rc : st));
		return 1;
	}
	for (int l = 0; l < LAYERS; l++) {
		if (g->memcpy(g, host, dev[l], REGION, KVB_GPU_D2H))
			return 1;
		for (unsigned b = 0; b < BLOCKS; b++)
			for (unsigned o = 0; o < BLOCK_BYTES; o++)
				bad += host[dst_block(b) * BLOCK_BYTES + o] !=
				       pattern((unsigned) l, b, o);
	}
	printf("D: %d layers x %d blocks checked in GPU memory, %ld bad "
	       "bytes\n",
	       LAYERS, BLOCKS, bad);
	fflush(stdout);
	for (int l = 0; l < LAYERS; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_detach(ctx);
	for (int l = 0; l < LAYERS; l++)
		g->free(g, dev[l]);
	return bad ? 1 : 0;
}

static int run_p(const char *backend, int go_fd)
{
	const struct kvb_gpu_api *g;
	struct kvb_region reg[LAYERS], hostreg;
	struct kvb_remote_region dst[LAYERS];
	struct kvb_desc d[BLOCKS];
	static uint8_t host[REGION];
	struct kvb_completion c;
	struct kvb_ctx *ctx;
	void *dev[LAYERS];
	char byte;
	uint32_t h;
	int rc, st = -1, n;

	rc = backend_up(backend, &g);
	if (rc)
		return rc;
	if (attach(KVB_ROLE_P, &ctx) || read(go_fd, &byte, 1) != 1)
		return 1;
	for (int l = 0; l < LAYERS; l++) {
		for (unsigned b = 0; b < BLOCKS; b++)
			for (unsigned o = 0; o < BLOCK_BYTES; o++)
				host[b * BLOCK_BYTES + o] =
					pattern((unsigned) l, b, o);
		if (g->alloc(g, 0, REGION, &dev[l]) ||
		    g->memcpy(g, dev[l], host, REGION, KVB_GPU_H2D))
			return 1;
		rc = kvb_mem_register_gpu(ctx, dev[l], REGION, 0, 0,
					  (uint64_t) l, &reg[l]);
		if (rc) {
			fprintf(stderr, "P: register gpu: %s\n",
				kvb_strerror(rc));
			return 1;
		}
		rc = kvb_mem_lookup(ctx, KVB_ROLE_D, 0, 0, (uint64_t) l,
				    &dst[l]);
		if (rc)
			return 1;
	}
	/* a host region may not write into GPU memory: refused, counted */
	if (kvb_mem_alloc(ctx, 4096, 0, 99, &hostreg))
		return 1;
	d[0] = (struct kvb_desc){.region = hostreg.id,
				 .peer_region = dst[0].id,
				 .len = 64,
				 .tag = 777};
	if (kvb_submit_write(ctx, d, 1) != 1)
		return 1;
	n = kvb_wait(ctx, &c, 1, 5000);
	if (n != 1 || c.tag != 777 || c.status != -EOPNOTSUPP) {
		fprintf(stderr,
			"P: host->GPU write not refused as expected (%d, %d)\n",
			n, n == 1 ? c.status : 0);
		return 1;
	}
	if (kvb_transfer_open(ctx, "tx-gpu", &h))
		return 1;
	for (int l = 0; l < LAYERS; l++) {
		for (unsigned b = 0; b < BLOCKS; b++)
			d[b] = (struct kvb_desc){
				.transfer = h,
				.layer = (uint16_t) l,
				.flags = KVB_DESC_UNSIGNALED,
				.region = reg[l].id,
				.peer_region = dst[l].id,
				.offset = (uint64_t) b * BLOCK_BYTES,
				.peer_offset =
					(uint64_t) dst_block(b) * BLOCK_BYTES,
				.len = BLOCK_BYTES,
				.tag = b};
		for (int sent = 0; sent < BLOCKS;) {
			n = kvb_submit_write(ctx, d + sent,
					     (unsigned) (BLOCKS - sent));
			if (n < 0 && n != -EAGAIN)
				return 1;
			if (n > 0)
				sent += n;
		}
	}
	if (kvb_transfer_seal(ctx, h, LAYERS * BLOCKS, 1))
		return 1;
	rc = wait_transfer(ctx, &st);
	if (rc || st) {
		fprintf(stderr, "P: transfer: %s\n",
			kvb_strerror(rc ? rc : st));
		return 1;
	}
	for (int l = 0; l < LAYERS; l++)
		kvb_mem_free(ctx, &reg[l]);
	kvb_mem_free(ctx, &hostreg);
	kvb_detach(ctx);
	for (int l = 0; l < LAYERS; l++)
		g->free(g, dev[l]);
	return 0;
}

/* kvbctl's view: the gpu transport counted the copies */
static int check_gpu_stats(void)
{
	static char buf[KVB_MSG_MAX];
	struct kvb_msg_stats req;
	const char *p;
	int fd, n;

	fd = kvb_ctl_connect(sock, 3000);
	if (fd < 0)
		return 1;
	kvb_msg_init(&req.h, KVB_MSG_STATS, sizeof(req));
	req.json = 1;
	n = kvb_ctl_send(fd, &req, sizeof(req), NULL, 0);
	if (!n)
		n = kvb_ctl_recv(fd, buf, sizeof(buf) - 1, NULL, NULL);
	close(fd);
	if (n <= (int) sizeof(struct kvb_msg_hdr))
		return 1;
	buf[n] = '\0';
	p = strstr(buf + sizeof(struct kvb_msg_hdr), "\"gpu\":{");
	if (!p || !strstr(p, "\"copies\":") ||
	    strtoull(strstr(p, "\"copies\":") + 9, NULL, 10) == 0) {
		fprintf(stderr, "stats show no gpu copies: %s\n",
			buf + sizeof(struct kvb_msg_hdr));
		return 1;
	}
	printf("broker stats: %.*s\n", (int) (strchr(p, '}') - p + 1), p);
	return 0;
}

static int code(int status)
{
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/kvb-gpu-XXXXXX";
	int ready[2], go[2], st, rc_d, rc_p, rc_b;
	pid_t broker, pd, pp;
	struct stat sb;

	if (argc != 3) {
		fprintf(stderr, "usage: %s BROKER_BIN host|cuda|hip|auto\n",
			argv[0]);
		return 2;
	}
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof(sock), "%s/s", dir);
	setenv("KVB_GPU_BACKEND", argv[2], 1);
	broker = fork();
	if (broker == 0) {
		execl(argv[1], argv[1], "--socket", sock, "--transport", "gpu",
		      "--log-level", "warn", (char *) NULL);
		_exit(127);
	}
	for (int i = 0; i < 1200 && stat(sock, &sb); i++) { /* 30 s */
		if (waitpid(broker, &st, WNOHANG) == broker) {
			broker = 0; /* it refused to start: reaped */
			break;
		}
		usleep(25000);
	}
	if (stat(sock, &sb)) {
		if (broker) {
			/* alive and no socket: a hang, not a missing device */
			kill(broker, SIGTERM);
			waitpid(broker, &st, 0);
			fprintf(stderr, "broker running but no socket after "
					"30 s\n");
			rmdir(dir);
			return 1;
		}
		/* --transport gpu refuses to start without a device */
		fprintf(stderr,
			"broker did not start with --transport gpu "
			"(no usable gpu backend '%s'): skipped\n",
			argv[2]);
		rmdir(dir);
		return 77;
	}
	if (pipe(ready) || pipe(go))
		return 1;
	pd = fork();
	if (pd == 0)
		_exit(run_d(argv[2], ready[1]));
	pp = fork();
	if (pp == 0)
		_exit(run_p(argv[2], go[0]));
	close(ready[1]);
	{
		char b;

		if (read(ready[0], &b, 1) == 1 && write(go[1], "g", 1) != 1)
			return 1;
	}
	close(go[1]);
	waitpid(pd, &st, 0);
	rc_d = code(st);
	waitpid(pp, &st, 0);
	rc_p = code(st);
	if (!rc_d && !rc_p && check_gpu_stats())
		rc_p = 1;
	kill(broker, SIGTERM);
	waitpid(broker, &st, 0);
	rc_b = code(st);
	rmdir(dir);
	printf("D %d, P %d, broker %d\n", rc_d, rc_p, rc_b);
	if (rc_d == 77 || rc_p == 77)
		return 77;
	return rc_d || rc_p || rc_b ? 1 : 0;
}

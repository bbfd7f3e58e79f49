/* SPDX-License-Identifier: MIT */
/*
 * `kvbench workload --transport gpu`: the same writes as on `local`, between
 * regions in device memory (bridge/gpu), on one node.
 *
 *  - direct: every P worker opens its own `gpu` transport (its own streams
 *    and events), imports the layer regions its D peer exported (IPC
 *    handles over a socketpair made by the parent) and posts one chain per
 *    (request, layer) with wl_direct.c's loop: one copy batch per chain.
 *    Each D worker allocates one device region per layer, exports it, and
 *    with --verify copies each announced request back to the host and
 *    checks its bytes. P tells D "imports closed" last: D frees its memory
 *    only after that.
 *  - broker: one `kvbroker --transport gpu`; the local broker workers of
 *    wl_workers.c with their layers in device memory (kvb_mem_register_gpu).
 *
 * The backend is --gpu-backend (auto, cuda, hip or host), resolved once by
 * a child process (wl_gpu_probe) and then named explicitly in every worker
 * and, through $KVB_GPU_BACKEND, in the broker. No GPU runtime is touched
 * in kvbench's own process: CUDA and HIP do not survive fork(). `host` is
 * the host backend of bridge/gpu (memfd "device memory", copies by host
 * threads): it measures the host copy path, not a GPU.
 */
#include "kvbench.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KVB_HAVE_GPU

#include "gpu/gpu.h"
#include "gpu/gpu_api.h"
#include "gpu/gpu_export.h"
#include "kvbroker/kvbroker.h"

#define RELEASED UINT32_MAX /* P -> D: P's imports are closed */

struct probe_msg {
	int rc;
	int devices;
	char name[16];
	char why[240];
};

int wl_gpu_probe(struct wl_cfg *c, const char *want)
{
	struct probe_msg m = {0};
	int fd[2], st;
	pid_t pid;

	if (pipe(fd)) {
		perror("kvbench: pipe");
		return 2;
	}
	pid = fork();
	if (pid < 0) {
		perror("kvbench: fork");
		return 2;
	}
	if (pid == 0) {
		const struct kvb_gpu_api *g;

		close(fd[0]);
		m.rc = kvb_gpu_backend_init(want, m.why, sizeof(m.why));
		g = kvb_gpu_backend();
		if (!m.rc && g) {
			snprintf(m.name, sizeof(m.name), "%s", g->name);
			if (g->device_count(g, &m.devices) || m.devices < 1) {
				m.rc = -ENODEV;
				snprintf(m.why, sizeof(m.why),
					 "%s runtime loaded, no device (%s)",
					 g->name, g->errstr(g));
			}
		}
		_exit(write(fd[1], &m, sizeof(m)) == sizeof(m) ? 0 : 1);
	}
	close(fd[1]);
	if (read(fd[0], &m, sizeof(m)) != sizeof(m)) {
		m.rc = -EIO;
		snprintf(m.why, sizeof(m.why),
			 "the probe process died (a broken GPU runtime?)");
	}
	close(fd[0]);
	waitpid(pid, &st, 0);
	m.why[sizeof(m.why) - 1] = '\0';
	if (m.rc == -ENODEV) {
		/* auto's reason names each backend it tried */
		fprintf(stderr,
			"kvbench: --transport gpu: no GPU here: %s%s%s\n",
			strcmp(want, "auto") ? want : "",
			strcmp(want, "auto") ? ": " : "", m.why);
		return 77;
	}
	if (m.rc) {
		fprintf(stderr,
			"kvbench: --transport gpu: --gpu-backend %s: %s\n",
			want, m.why[0] ? m.why : strerror(-m.rc));
		return 2;
	}
	snprintf(c->gpu_name, sizeof(c->gpu_name), "%s", m.name);
	c->gpu_devices = m.devices;
	return 0;
}

/* This worker's backend: the one the probe found, by name. */
static const struct kvb_gpu_api *backend_up(const struct wl_cfg *c, int is_d,
					    unsigned rank)
{
	char why[240] = "";

	if (kvb_gpu_backend_init(c->gpu_name, why, sizeof(why))) {
		fprintf(stderr, "kvbench: %c%u: gpu backend %s: %s\n",
			is_d ? 'D' : 'P', rank, c->gpu_name, why);
		return NULL;
	}
	return kvb_gpu_backend();
}

/*
 * Request q's blocks of a layer are one run of D blocks (their ids
 * descend with j): copy that run of every layer back to the mirror.
 */
static int fetch(struct wl_mem *m, const struct wl_cfg *c, uint64_t q)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	uint64_t off = wl_dst_block(c, q, c->blocks - 1) * c->block_bytes;
	uint64_t n = (uint64_t) c->blocks * c->block_bytes;

	for (unsigned l = 0; l < m->layers; l++)
		if (g->memcpy(g, (char *) m->host[l] + off,
			      (const char *) m->at[l] + off, n, KVB_GPU_D2H)) {
			fprintf(stderr, "kvbench: gpu read-back: %s\n",
				g->errstr(g));
			return -1;
		}
	return 0;
}

/* P: its source pattern, salted, into every layer (through the host). */
static int fill(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		uint64_t salt)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	void *buf = malloc(m->len);
	int rc = 0;

	if (!buf) {
		fprintf(stderr, "kvbench: P%u: out of memory\n", rank);
		return -1;
	}
	for (unsigned l = 0; l < m->layers && !rc; l++) {
		wl_fill_src(c, rank, l, buf, salt);
		rc = g->memcpy(g, m->at[l], buf, m->len, KVB_GPU_H2D);
		if (rc)
			fprintf(stderr, "kvbench: P%u: filling layer %u: %s\n",
				rank, l, g->errstr(g));
	}
	free(buf);
	return rc ? -1 : 0;
}

/* D: zeroed device memory (pages in before the run), a host mirror. */
static int d_setup(struct wl_mem *m, const struct wl_cfg *c, unsigned rank)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	void *zero = calloc(1, m->len);

	m->fetch = fetch;
	if (!zero)
		goto oom;
	for (unsigned l = 0; l < m->layers; l++) {
		if (g->memcpy(g, m->at[l], zero, m->len, KVB_GPU_H2D)) {
			fprintf(stderr, "kvbench: D%u: zeroing layer %u: %s\n",
				rank, l, g->errstr(g));
			free(zero);
			return -1;
		}
		if (c->verify && !(m->host[l] = calloc(1, m->len)))
			goto oom;
	}
	free(zero);
	return 0;
oom:
	fprintf(stderr, "kvbench: D%u: out of memory\n", rank);
	free(zero);
	return -1;
}

int wl_gpu_mem_alloc(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		     int is_d, uint64_t len)
{
	const struct kvb_gpu_api *g = backend_up(c, is_d, rank);
	char side = is_d ? 'D' : 'P';

	memset(m, 0, sizeof(*m));
	m->gpu = 1;
	m->layers = c->layers;
	m->len = len;
	if (!g)
		return -1;
	m->at = calloc(c->layers, sizeof(*m->at));
	m->host = calloc(c->layers, sizeof(*m->host));
	if (!m->at || !m->host) {
		fprintf(stderr, "kvbench: %c%u: out of memory\n", side, rank);
		return -1;
	}
	for (unsigned l = 0; l < c->layers; l++)
		if (g->alloc(g, 0, len, &m->at[l])) {
			m->at[l] = NULL;
			fprintf(stderr,
				"kvbench: %c%u: %llu bytes of device memory "
				"for layer %u: %s\n",
				side, rank, (unsigned long long) len, l,
				g->errstr(g));
			return -1;
		}
	if (is_d)
		return d_setup(m, c, rank);
	m->fill = fill;
	return fill(m, c, rank, WL_SALT_WARM);
}

void wl_gpu_mem_free(struct wl_mem *m)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();

	for (unsigned l = 0; l < m->layers; l++) {
		if (g && m->at && m->at[l])
			g->free(g, m->at[l]);
		if (m->host)
			free(m->host[l]);
	}
	free(m->at);
	free(m->host);
	memset(m, 0, sizeof(*m));
}

static struct kvb_mr gpu_mr(uint32_t id, uint32_t flags, int dev, void *addr,
			    uint64_t len)
{
	return (struct kvb_mr){.id = id,
			       .flags = flags,
			       .kind = KVB_MEM_GPU,
			       .gpu_device = dev,
			       .addr = addr,
			       .len = len};
}

/* D's exported layer l: import it, register it. 0 or -1 (printed). */
static int import_layer(const struct wl_cfg *c, unsigned rank, int hs,
			struct kvb_transport *t, struct kvb_mr *mr,
			void **imported, unsigned l)
{
	uint64_t db = wl_region_bytes_d(c);
	struct kvb_gpu_handle h;
	int dev, rc;

	if (recv(hs, &h, sizeof(h), 0) != sizeof(h)) {
		fprintf(stderr, "kvbench: P%u: no layer %u region from D%u\n",
			rank, l, rank);
		return -1;
	}
	if (h.size != db) {
		fprintf(stderr,
			"kvbench: P%u: D%u's layer %u region has %llu bytes, "
			"not %llu\n",
			rank, rank, l, (unsigned long long) h.size,
			(unsigned long long) db);
		return -1;
	}
	rc = kvb_gpu_import_device(&h, &dev);
	if (!rc)
		rc = kvb_gpu_import(&h, imported);
	if (rc) {
		fprintf(stderr,
			"kvbench: P%u: importing D%u's layer %u region: %s\n",
			rank, rank, l, kvb_gpu_export_strerror());
		return -1;
	}
	*mr = gpu_mr(c->layers + l + 1, KVB_MEM_REMOTE_WRITE, dev, *imported,
		     db);
	rc = t->ops->reg_mr(t, mr);
	if (rc) {
		fprintf(stderr,
			"kvbench: P%u: gpu reg_mr of D%u's layer %u: "
			"%s\n",
			rank, rank, l, strerror(-rc));
		return -1;
	}
	return 0;
}

int wl_gpu_direct_p(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
		    const int *go, struct wl_pres *res)
{
	uint64_t pb = wl_region_bytes_p(c);
	struct kvb_transport_params tp = {.post_batch_size = -1};
	struct kvb_mr *mr = calloc(2 * (size_t) c->layers, sizeof(*mr));
	struct wl_layer_io *io = calloc(c->layers, sizeof(*io));
	void **imp = calloc(c->layers, sizeof(*imp));
	struct wl_mem src;
	struct wl_direct d = {
		.c = c, .rank = rank, .io = io, .src = &src, .notify_fd = hs};
	uint32_t released = RELEASED;
	char why[240] = "";
	int rc = -1;

	if (!mr || !io || !imp) {
		fprintf(stderr, "kvbench: P%u (direct): out of memory\n", rank);
		return 1;
	}
	if (wl_gpu_mem_alloc(&src, c, rank, 0, pb))
		return 1;
	if ((rc = kvb_gpu_transport_open(&tp, c->gpu_name, &d.t, why,
					 sizeof(why))) ||
	    (rc = d.t->ops->connect(d.t, NULL, 0, &d.ep))) {
		fprintf(stderr, "kvbench: P%u: gpu transport (%s): %s %s\n",
			rank, c->gpu_name, strerror(-rc), why);
		return 1;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		mr[l] = gpu_mr(l + 1, 0, 0, src.at[l], pb);
		if ((rc = d.t->ops->reg_mr(d.t, &mr[l]))) {
			fprintf(stderr, "kvbench: P%u: gpu reg_mr: %s\n", rank,
				strerror(-rc));
			return 1;
		}
		io[l] = (struct wl_layer_io){.local = &mr[l],
					     .remote.mr = &mr[c->layers + l]};
	}
	/* D exports its regions after the first barrier */
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		if (import_layer(c, rank, hs, d.t, &mr[c->layers + l], &imp[l],
				 l))
			return 1;
	rc = wl_direct_p_run(&d, ready_fd, go[1], res);
	/* close() waits for copies still in flight; then the imports go */
	for (unsigned l = 0; l < 2 * c->layers; l++)
		d.t->ops->dereg_mr(d.t, &mr[l]);
	d.t->ops->close(d.t);
	for (unsigned l = 0; l < c->layers; l++)
		kvb_gpu_unimport(imp[l]);
	if (write(hs, &released, sizeof(released)) != sizeof(released))
		rc = -1;
	wl_gpu_mem_free(&src);
	free(mr);
	free(io);
	free(imp);
	return rc ? 1 : res->failed ? 3 : 0;
}

/* D: wait until P closed its imports of our memory (60 s at most). */
static int wait_released(int hs, unsigned rank)
{
	struct pollfd p = {.fd = hs, .events = POLLIN};
	uint32_t q = 0;

	if (poll(&p, 1, 60000) != 1 ||
	    recv(hs, &q, sizeof(q), 0) != sizeof(q) || q != RELEASED) {
		fprintf(stderr,
			"kvbench: D%u: P%u did not release our device "
			"memory\n",
			rank, rank);
		return -1;
	}
	return 0;
}

int wl_gpu_direct_d(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
		    const int *go, struct wl_pres *res)
{
	uint64_t db = wl_region_bytes_d(c);
	struct kvb_gpu_handle h;
	struct wl_mem m;
	char byte = 1;
	int rc;

	if (wl_gpu_mem_alloc(&m, c, rank, 1, db))
		return 1;
	/* no P exists before the first barrier */
	if (wl_sync_start(ready_fd, go[0]))
		return 1;
	for (unsigned l = 0; l < c->layers; l++) {
		rc = kvb_gpu_export(m.at[l], db, 0, &h);
		if (rc) {
			fprintf(stderr,
				"kvbench: D%u: exporting layer %u: %s\n", rank,
				l, kvb_gpu_export_strerror());
			return 1;
		}
		if (send(hs, &h, sizeof(h), 0) != sizeof(h)) {
			fprintf(stderr,
				"kvbench: D%u: sending layer %u to P%u: %s\n",
				rank, l, rank, strerror(errno));
			return 1;
		}
	}
	/* the warm-up is P's: the copies need nothing from us */
	if (write(ready_fd, &byte, 1) != 1 || read(go[1], &byte, 1) != 1)
		return 1;
	rc = wl_direct_d_run(c, rank, hs, &m, NULL, NULL, res);
	if (!rc)
		rc = wait_released(hs, rank);
	wl_gpu_mem_free(&m);
	return rc ? 1 : res->dbad ? 3 : 0;
}

#else /* !KVB_HAVE_GPU: kvb_bench_check_transport() refuses gpu */

int wl_gpu_probe(struct wl_cfg *c, const char *want)
{
	(void) c;
	fprintf(stderr,
		"kvbench: --gpu-backend %s: this kvbench was built "
		"without the gpu transport (bridge/gpu)\n",
		want);
	return 2;
}

int wl_gpu_mem_alloc(struct wl_mem *m, const struct wl_cfg *c, unsigned rank,
		     int is_d, uint64_t len)
{
	(void) c;
	(void) len;
	memset(m, 0, sizeof(*m));
	fprintf(stderr, "kvbench: %c%u: built without the gpu transport\n",
		is_d ? 'D' : 'P', rank);
	return -1;
}

void wl_gpu_mem_free(struct wl_mem *m)
{
	memset(m, 0, sizeof(*m));
}

#endif /* KVB_HAVE_GPU */

/* SPDX-License-Identifier: MIT */
/*
 * `kvbench workload --mode ucx`: the same vLLM-shaped writes through
 * UCX's UCP API, the way a NIXL-style transfer layer on its default (UCX)
 * backend moves them: what a user choosing a KV transfer layer compares
 * kvbroker with.
 *
 *  - P: every P worker process has its own UCP context and worker (one
 *    per process, single-threaded), maps its source region with
 *    ucp_mem_map, and makes one endpoint to its D peer's worker from the
 *    worker address D sent out of band (the socketpair the parent made,
 *    as the rdma and gpu direct modes do). Per step, for every layer,
 *    for every request of the step, one ucp_put_nbx per block (vLLM's
 *    per-block descriptors: one put each), the worker progressed once
 *    per (request, layer); then one ucp_ep_flush_nbx for the step (remote
 *    completion of every put) and each of the step's requests is
 *    announced to D (its number, a uint32_t, on the socketpair). P's
 *    latency of a request: from its first put to its step's flush, as
 *    the broker mode's is taken when P reaps its step.
 *  - D: its own UCP context and worker, one ucp_mem_map per layer region
 *    (the same memfd pages as direct mode), each region's rkey packed
 *    and sent to P with the worker address. D progresses its worker
 *    while it waits for P's announcements (UCX over tcp, and its
 *    emulated RMA, need the target's progress to land the bytes), then
 *    checks each request's bytes (--verify).
 *
 * Transports: the parent says which UCX_TLS and UCX_NET_DEVICES a worker
 * sets (struct wl_cfg ucx_tls, ucx_dev: put into the UCP configuration
 * with ucp_config_modify, not the environment); every other UCX_*
 * variable of kvbench's environment applies as usual (UCX_TCP_TX_SEG_SIZE
 * ...). P rank 0 reports the lanes its endpoint uses after the warm-up
 * (ucp_ep_print_info, summed up in res->ucx_info).
 */
#include "kvbench.h"

#ifdef KVB_HAVE_UCX

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define SPIN_NS	 20000ll			/* as the direct workers */
#define STALL_NS (60ll * 1000000000)		/* no progress at all */
#define HS_MAX	 65536u				/* one handshake message */
#define BYE	 UINT32_MAX			/* P: endpoint closed */

/* One process's UCP state. */
struct ux {
	ucp_context_h ctx;
	ucp_worker_h w;
	int efd;
};

static int ux_open(struct ux *u, const struct wl_cfg *c, int is_d,
		   unsigned rank)
{
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			  .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
	ucp_worker_params_t wp = {
		.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
		.thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_config_t *cfg;
	ucs_status_t st;
	char side = is_d ? 'D' : 'P';

	memset(u, 0, sizeof(*u));
	u->efd = -1;
	/* UCX finds network devices in /sys/class/net: the namespace's */
	if (c->nw && c->nw->netns && !c->nw->rdma && kvb_bench_netns_sysfs())
		return -1;
	st = ucp_config_read(NULL, NULL, &cfg);
	if (st == UCS_OK && c->ucx_tls)
		st = ucp_config_modify(cfg, "TLS", c->ucx_tls);
	if (st == UCS_OK && c->ucx_dev[is_d][0])
		st = ucp_config_modify(cfg, "NET_DEVICES", c->ucx_dev[is_d]);
	if (st != UCS_OK) {
		fprintf(stderr, "kvbench: %c%u: UCX configuration: %s\n", side,
			rank, ucs_status_string(st));
		return -1;
	}
	st = ucp_init(&p, cfg, &u->ctx);
	ucp_config_release(cfg);
	if (st == UCS_OK)
		st = ucp_worker_create(u->ctx, &wp, &u->w);
	if (st == UCS_OK)
		st = ucp_worker_get_efd(u->w, &u->efd);
	if (st != UCS_OK) {
		fprintf(stderr,
			"kvbench: %c%u: UCX context/worker (UCX_TLS %s, "
			"UCX_NET_DEVICES %s): %s\n",
			side, rank, c->ucx_tls ? c->ucx_tls : "(default)",
			c->ucx_dev[is_d][0] ? c->ucx_dev[is_d] : "(default)",
			ucs_status_string(st));
		return -1;
	}
	return 0;
}

static void ux_close(struct ux *u)
{
	if (u->w)
		ucp_worker_destroy(u->w);
	if (u->ctx)
		ucp_cleanup(u->ctx);
	memset(u, 0, sizeof(*u));
}

static int ux_map(struct ux *u, void *addr, uint64_t len, ucp_mem_h *mh)
{
	ucp_mem_map_params_t mp = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
			      UCP_MEM_MAP_PARAM_FIELD_LENGTH,
		.address = addr,
		.length = len};

	return ucp_mem_map(u->ctx, &mp, mh) == UCS_OK ? 0 : -1;
}

/*
 * Progress the worker until `fd` is readable (fd >= 0) or *req completes
 * (req != NULL; freed, NULL'd, its status in *st). Spins SPIN_NS after
 * the last activity, then sleeps on the worker's event fd (and fd). 0, or
 * -1 on a stall (printed).
 */
static int ux_wait(struct ux *u, int fd, void **req, ucs_status_t *st,
		   char side, unsigned rank)
{
	int64_t last = kvb_bench_now_ns(), spin = last;

	for (;;) {
		struct pollfd p[2] = {{.fd = u->efd, .events = POLLIN},
				      {.fd = fd, .events = POLLIN}};
		unsigned n = ucp_worker_progress(u->w);

		if (req && *req) {
			ucs_status_t s = ucp_request_check_status(*req);

			if (s != UCS_INPROGRESS) {
				ucp_request_free(*req);
				*req = NULL;
				*st = s;
				return 0;
			}
		} else if (req) {
			return 0;
		}
		if (fd >= 0 && poll(&p[1], 1, 0) > 0)
			return 0;
		if (n) {
			last = spin = kvb_bench_now_ns();
			continue;
		}
		if (kvb_bench_now_ns() - spin < SPIN_NS)
			continue;
		/* UCS_ERR_BUSY: events are pending, progress again */
		if (u->efd >= 0 && ucp_worker_arm(u->w) == UCS_OK &&
		    poll(p, fd >= 0 ? 2 : 1, 100) > 0)
			last = kvb_bench_now_ns();
		spin = kvb_bench_now_ns();
		if (kvb_bench_now_ns() - last > STALL_NS) {
			fprintf(stderr,
				"kvbench: %c%u (ucx): no progress in %lld s\n",
				side, rank, STALL_NS / 1000000000);
			return -1;
		}
	}
}

/* ---- handshake: D -> P, over the socketpair --------------------------- */

/* the first message: D's worker address follows */
struct hs_head {
	uint32_t layers;
	uint32_t addr_len;
};
/* then one per layer: its packed rkey follows */
struct hs_layer {
	uint64_t base;
	uint64_t len;
	uint32_t rkey_len;
	uint32_t pad;
};

/* ---- P ---------------------------------------------------------------- */

struct up {
	const struct wl_cfg *c;
	unsigned rank;
	struct ux u;
	ucp_ep_h ep;
	ucp_mem_h src_mh;
	ucp_rkey_h *rkey;  /* per layer */
	uint64_t *dbase;   /* D's layer l at dbase[l] */
	struct wl_mem src; /* layer l at src.at[l] */
	struct wl_pres *res;
	struct wl_post_timer pt;
	int measuring;
};

/* D's address and rkeys; the endpoint. 0 or -1 (printed). */
static int p_connect(struct up *s, int hs)
{
	const struct wl_cfg *c = s->c;
	char *buf = malloc(HS_MAX);
	struct hs_head h;
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS};
	ssize_t n;
	int rc = -1;

	if (!buf)
		return -1;
	n = recv(hs, buf, HS_MAX, 0);
	if (n < (ssize_t) sizeof(h))
		goto gone;
	memcpy(&h, buf, sizeof(h));
	if (h.layers != c->layers || sizeof(h) + h.addr_len != (size_t) n) {
		fprintf(stderr, "kvbench: P%u (ucx): bad handshake from D%u\n",
			s->rank, s->rank);
		goto out;
	}
	ep.address = (const ucp_address_t *) (buf + sizeof(h));
	if (ucp_ep_create(s->u.w, &ep, &s->ep) != UCS_OK) {
		fprintf(stderr,
			"kvbench: P%u (ucx): no endpoint to D%u's worker\n",
			s->rank, s->rank);
		goto out;
	}
	for (unsigned l = 0; l < c->layers; l++) {
		struct hs_layer hl;

		n = recv(hs, buf, HS_MAX, 0);
		if (n < (ssize_t) sizeof(hl))
			goto gone;
		memcpy(&hl, buf, sizeof(hl));
		if (sizeof(hl) + hl.rkey_len != (size_t) n ||
		    ucp_ep_rkey_unpack(s->ep, buf + sizeof(hl), &s->rkey[l]) !=
			    UCS_OK) {
			fprintf(stderr,
				"kvbench: P%u (ucx): D%u's rkey of layer %u "
				"unusable\n",
				s->rank, s->rank, l);
			goto out;
		}
		s->dbase[l] = hl.base;
	}
	rc = 0;
	goto out;
gone:
	fprintf(stderr, "kvbench: P%u (ucx): handshake with D%u: %s\n", s->rank,
		s->rank, n < 0 ? strerror(errno) : "D went away");
out:
	free(buf);
	return rc;
}

/* Request q's blocks of layer l: one put each. 0 or -1 (printed). */
static int put_chain(struct up *s, unsigned l, uint64_t q)
{
	const struct wl_cfg *c = s->c;
	ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH,
				  .memh = s->src_mh};

	if (s->measuring)
		wl_post_begin(&s->pt);
	for (unsigned j = 0; j < c->blocks; j++) {
		const char *from = (const char *) s->src.at[l] +
				   wl_src_block(c, q, j) * c->block_bytes;
		uint64_t to = s->dbase[l] +
			      wl_dst_block(c, q, j) * c->block_bytes;
		ucs_status_ptr_t r = ucp_put_nbx(s->ep, from, c->block_bytes,
						 to, s->rkey[l], &rp);

		if (UCS_PTR_IS_ERR(r)) {
			fprintf(stderr, "kvbench: P%u (ucx): ucp_put_nbx: %s\n",
				s->rank,
				ucs_status_string(UCS_PTR_STATUS(r)));
			s->res->failed++;
			return -1;
		}
		/* in flight: UCX releases it when done; the step's flush
		 * says when every put of the step landed */
		if (r)
			ucp_request_free(r);
	}
	if (s->measuring)
		wl_post_end(&s->pt, s->res, c->blocks);
	/* one progress call per (request, layer), as direct mode reaps
	 * once per chain: moves what the puts queued */
	ucp_worker_progress(s->u.w);
	return 0;
}

/* Every put so far landed at D (remote completion). 0 or -1 (printed). */
static int flush_all(struct up *s)
{
	ucp_request_param_t rp = {0};
	ucs_status_t st = UCS_OK;
	void *r = ucp_ep_flush_nbx(s->ep, &rp);

	if (UCS_PTR_IS_ERR(r)) {
		st = UCS_PTR_STATUS(r);
	} else if (r && ux_wait(&s->u, -1, &r, &st, 'P', s->rank)) {
		return -1;
	}
	if (st != UCS_OK) {
		fprintf(stderr, "kvbench: P%u (ucx): flush: %s\n", s->rank,
			ucs_status_string(st));
		s->res->failed++;
		return -1;
	}
	return 0;
}

/* The lanes P's endpoint uses, in a line (from ucp_ep_print_info). */
static void lanes(struct up *s, char *out, size_t cap)
{
	char *text = NULL, *line, *save = NULL;
	size_t len = 0, used = 0;
	unsigned puts = 0;
	FILE *f = open_memstream(&text, &len);

	out[0] = 0;
	if (!f)
		return;
	ucp_ep_print_info(s->ep, f);
	fclose(f);
	for (line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *p = strstr(line, "lane["), *tl, *roles;

		if (strstr(line, " put[") || strstr(line, "#put["))
			puts++;
		if (!p || !(p = strchr(p, ':')))
			continue;
		/* "lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/... am am_bw#0" */
		p++;
		while (*p == ' ')
			p++;
		tl = strchr(p, ':');
		if (!tl)
			continue;
		tl++;
		roles = strstr(tl, "-> ");
		if (roles)
			roles = strchr(roles + 3, ' ');
		used += (size_t) snprintf(
			out + used, used < cap ? cap - used : 0, "%s%.*s%s%s%s",
			used ? ", " : "", (int) strcspn(tl, " "), tl,
			roles && roles[strspn(roles, " ")] ? " (" : "",
			roles && roles[strspn(roles, " ")]
				? roles + strspn(roles, " ")
				: "",
			roles && roles[strspn(roles, " ")] ? ")" : "");
		if (used >= cap)
			break;
	}
	if (used < cap)
		snprintf(out + used, cap - used, "; %s",
			 puts ? "RMA: put lanes" :
				"RMA: no put lane, puts emulated over active "
				"messages (the target's progress writes them)");
	free(text);
}

static int p_steps(struct up *s, int measure, int64_t go_ns, int hs)
{
	const struct wl_cfg *c = s->c;
	uint64_t total = measure ? (uint64_t) c->iters * c->requests
				 : wl_dslots(c);
	int64_t *t0 = calloc(c->requests, sizeof(*t0));
	uint64_t next = 0;
	int rc = -1;

	if (!t0)
		return -1;
	while (next < total) {
		unsigned n = measure ? wl_next_step(c, next, total, go_ns)
				     : (unsigned) (total - next < c->requests
							   ? total - next
							   : c->requests);

		for (unsigned l = 0; l < c->layers; l++)
			for (unsigned i = 0; i < n; i++) {
				if (measure && l == 0)
					t0[i] = wl_req_start_ns(c, next + i,
								go_ns);
				if (put_chain(s, l, next + i))
					goto out;
				if (measure) {
					s->res->descs += c->blocks;
					s->res->bytes +=
						c->blocks * c->block_bytes;
				}
			}
		if (flush_all(s))
			goto out;
		for (unsigned i = 0; measure && i < n; i++) {
			uint32_t q = (uint32_t) (next + i);

			wl_pres_lat(s->res)[s->res->nlat++] =
				(double) (kvb_bench_now_ns() - t0[i]) / 1e3;
			if (write(hs, &q, sizeof(q)) != sizeof(q)) {
				fprintf(stderr,
					"kvbench: P%u (ucx): telling D%u "
					"about request %u: D went away\n",
					s->rank, s->rank, q);
				goto out;
			}
			s->res->done++;
		}
		next += n;
	}
	rc = 0;
out:
	free(t0);
	return rc;
}

int wl_ucx_p(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
	     const int *go, struct wl_pres *res)
{
	struct up s = {.c = c, .rank = rank, .res = res};
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				  .flags = UCP_EP_CLOSE_FLAG_FORCE};
	uint32_t bye = BYE;
	uint64_t cpu0;
	int64_t go_ns;
	void *r;
	int rc = 1;

	s.rkey = calloc(c->layers, sizeof(*s.rkey));
	s.dbase = calloc(c->layers, sizeof(*s.dbase));
	if (!s.rkey || !s.dbase || wl_src_mem(&s.src, c, rank) ||
	    ux_open(&s.u, c, 0, rank))
		return 1;
	if (ux_map(&s.u, s.src.map, s.src.map_len, &s.src_mh)) {
		fprintf(stderr, "kvbench: P%u (ucx): ucp_mem_map failed\n",
			rank);
		return 1;
	}
	if (p_connect(&s, hs) || wl_sync_start(ready_fd, go[0]))
		return 1;
	/* warm-up, not measured: every D slot once (connects, faults in) */
	if (p_steps(&s, 0, 0, hs)) {
		fprintf(stderr, "kvbench: P%u (ucx): warm-up failed\n", rank);
		return 1;
	}
	if (rank == 0)
		lanes(&s, res->ucx_info, sizeof(res->ucx_info));
	if (wl_mem_fill(&s.src, c, rank, 0))
		return 1;
	wl_post_timer_init(&s.pt, rank + 1);
	if (wl_sync_start(ready_fd, go[1]))
		return 1;
	s.measuring = 1;
	go_ns = kvb_bench_now_ns();
	cpu0 = kvb_bench_proc_cpu_ns();
	if (p_steps(&s, 1, go_ns, hs))
		return res->failed ? 3 : 1;
	res->end_ns = kvb_bench_now_ns();
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0;
	res->wrs = res->descs; /* one put per block */
	res->ok = 1;
	for (unsigned l = 0; l < c->layers; l++)
		ucp_rkey_destroy(s.rkey[l]);
	/* everything was flushed: closing needs nothing from D */
	r = ucp_ep_close_nbx(s.ep, &cp);
	if (r && !UCS_PTR_IS_ERR(r)) {
		ucs_status_t st;

		if (ux_wait(&s.u, -1, &r, &st, 'P', rank) == 0)
			rc = 0;
	} else {
		rc = 0;
	}
	if (write(hs, &bye, sizeof(bye)) != sizeof(bye))
		rc = 1;
	ucp_mem_unmap(s.u.ctx, s.src_mh);
	ux_close(&s.u);
	wl_mem_free(&s.src);
	free(s.rkey);
	free(s.dbase);
	return rc;
}

/* ---- D ---------------------------------------------------------------- */

/* The worker address and every layer's rkey, to P. 0 or -1 (printed). */
static int d_offer(struct ux *u, const struct wl_cfg *c, unsigned rank,
		   int hs, void *const *base, uint64_t len, ucp_mem_h *mh)
{
	char *buf = malloc(HS_MAX);
	ucp_address_t *addr = NULL;
	size_t alen = 0;
	struct hs_head h = {.layers = c->layers};
	int rc = -1;

	if (!buf)
		return -1;
	if (ucp_worker_get_address(u->w, &addr, &alen) != UCS_OK ||
	    sizeof(h) + alen > HS_MAX) {
		fprintf(stderr, "kvbench: D%u (ucx): worker address\n", rank);
		goto out;
	}
	h.addr_len = (uint32_t) alen;
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), addr, alen);
	if (send(hs, buf, sizeof(h) + alen, 0) != (ssize_t) (sizeof(h) + alen))
		goto gone;
	for (unsigned l = 0; l < c->layers; l++) {
		struct hs_layer hl = {.base = (uintptr_t) base[l], .len = len};
		void *rk = NULL;
		size_t rlen = 0;

		if (ux_map(u, base[l], len, &mh[l]) ||
		    ucp_rkey_pack(u->ctx, mh[l], &rk, &rlen) != UCS_OK ||
		    sizeof(hl) + rlen > HS_MAX) {
			fprintf(stderr,
				"kvbench: D%u (ucx): ucp_mem_map / rkey of "
				"layer %u failed\n",
				rank, l);
			goto out;
		}
		hl.rkey_len = (uint32_t) rlen;
		memcpy(buf, &hl, sizeof(hl));
		memcpy(buf + sizeof(hl), rk, rlen);
		ucp_rkey_buffer_release(rk);
		if (send(hs, buf, sizeof(hl) + rlen, 0) !=
		    (ssize_t) (sizeof(hl) + rlen))
			goto gone;
	}
	rc = 0;
	goto out;
gone:
	fprintf(stderr, "kvbench: D%u (ucx): handshake with P%u: %s\n", rank,
		rank, strerror(errno));
out:
	if (addr)
		ucp_worker_release_address(u->w, addr);
	free(buf);
	return rc;
}

int wl_ucx_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps, int hs,
	     int ready_fd, const int *go, struct wl_pres *res)
{
	uint64_t db = wl_region_bytes_d(c);
	uint64_t total = (uint64_t) c->iters * c->requests, cpu0;
	void **base = calloc(c->layers, sizeof(*base));
	ucp_mem_h *mh = calloc(c->layers, sizeof(*mh));
	struct wl_mem m = {
		.layers = c->layers, .len = db, .at = base, .host = base};
	struct ux u;
	char byte = 1;
	uint32_t q;
	int rc = 1;

	if (!base || !mh || ux_open(&u, c, 1, rank))
		return 1;
	for (unsigned l = 0; l < c->layers; l++)
		base[l] = (char *) dmaps[rank] + l * db;
	if (d_offer(&u, c, rank, hs, base, db, mh) ||
	    wl_sync_start(ready_fd, go[0]))
		return 1;
	/* the warm-up is P's: ready at once, progressing until the run */
	if (write(ready_fd, &byte, 1) != 1 ||
	    ux_wait(&u, go[1], NULL, NULL, 'D', rank) ||
	    read(go[1], &byte, 1) != 1)
		return 1;
	cpu0 = kvb_bench_proc_cpu_ns();
	while (res->done < total) {
		if (ux_wait(&u, hs, NULL, NULL, 'D', rank))
			return 1;
		if (read(hs, &q, sizeof(q)) != sizeof(q) || q >= total) {
			fprintf(stderr,
				"kvbench: D%u (ucx): P%u went away after %llu "
				"requests\n",
				rank, rank, (unsigned long long) res->done);
			return 1;
		}
		if (c->verify && wl_mem_verify(c, rank, &m, q, res))
			return 1;
		res->done++;
	}
	res->cpu_ns = kvb_bench_proc_cpu_ns() - cpu0 - res->verify_ns;
	res->ok = 1;
	/* serve P's endpoint close until it says it is done */
	for (;;) {
		if (ux_wait(&u, hs, NULL, NULL, 'D', rank))
			break;
		if (read(hs, &q, sizeof(q)) != sizeof(q) || q == BYE) {
			rc = 0;
			break;
		}
	}
	for (unsigned l = 0; l < c->layers; l++)
		if (mh[l])
			ucp_mem_unmap(u.ctx, mh[l]);
	ux_close(&u);
	free(mh);
	wl_mem_free(&m);
	return rc ? 1 : res->dbad ? 3 : 0;
}

const char *wl_ucx_version(void)
{
	return ucp_get_version_string();
}

#else /* no UCX: wl_parse() refuses --mode ucx, these are never called */

int wl_ucx_p(const struct wl_cfg *c, unsigned rank, int hs, int ready_fd,
	     const int *go, struct wl_pres *res)
{
	(void) c, (void) rank, (void) hs, (void) ready_fd, (void) go;
	(void) res;
	return 1;
}

int wl_ucx_d(const struct wl_cfg *c, unsigned rank, void *const *dmaps, int hs,
	     int ready_fd, const int *go, struct wl_pres *res)
{
	(void) c, (void) rank, (void) dmaps, (void) hs, (void) ready_fd;
	(void) go, (void) res;
	return 1;
}

const char *wl_ucx_version(void)
{
	return NULL;
}

#endif /* KVB_HAVE_UCX */

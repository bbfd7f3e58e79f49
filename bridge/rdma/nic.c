// SPDX-License-Identifier: MIT
/*
 * The rdma transport's NICs: the verbs devices --rdma-dev names (none: the
 * first; a comma-separated list; "all"), each with its own PD, CQ,
 * completion channel and async events; one fd for the broker over their
 * channels (wait_fd) and one over their async fds (events_fd).
 *
 * Memory is registered on every NIC, so that any of them can carry a
 * region's chains; its home is the NIC nearest to it (topo.c: a GPU's
 * PCIe switch, host memory's NUMA node), mr->lkey / rkey are the home's
 * keys, and the rest of the NICs follow nearest first: where its chains go
 * while the home's port is down.
 *
 * Not thread-safe: the broker's loop owns a transport.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "rdma/rdma_priv.h"

void _kvb_rdma_say(struct kvb_rdma *r, int level, const char *fmt, ...)
{
	char line[256];
	va_list ap;

	if (!r->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	r->log(r->log_arg, level, line);
}

void kvb_rdma_set_log(struct kvb_transport *t, kvb_rdma_log_fn log, void *arg)
{
	struct kvb_rdma *r = to_rdma(t);

	r->log = log;
	r->log_arg = arg;
}

static int fd_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* "<what><dev>" into the caller's buffer, if any. */
static void set_why(char *why, size_t len, const char *what, const char *dev)
{
	if (why && len)
		snprintf(why, len, "%s%s", what, dev ? dev : "");
}

/*
 * The GID index: `forced` when >= 0 (--gid-index, or what address
 * resolution found: NIC 0's), else the first RoCE v2 GID holding an
 * IPv4-mapped address (routable, what rxe and most RoCE fabrics use), else
 * index 0.
 */
static int pick_gid(struct kvb_rdma_nic *n, int forced)
{
	static const uint8_t v4map[12] = {0, 0, 0, 0, 0,    0,
					  0, 0, 0, 0, 0xff, 0xff};
	int i;

	if (forced >= 0)
		return forced;
	if (n->port.link_layer != IBV_LINK_LAYER_ETHERNET)
		return 0;
	for (i = 0; i < n->port.gid_tbl_len && i < 256; i++) {
		struct ibv_gid_entry e;

		if (ibv_query_gid_ex(n->ctx, (uint32_t) n->port_num,
				     (uint32_t) i, &e, 0))
			continue;
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		if (!memcmp(e.gid.raw, v4map, sizeof(v4map)))
			return i;
	}
	return 0;
}

/* NUMA node and PCI address of n from sysfs (unknown without). */
static void nic_topo(struct kvb_rdma *r, struct kvb_rdma_nic *n)
{
	int i;

	n->numa = -1;
	n->pci[0] = '\0';
	for (i = 0; r->topo && i < kvb_topo_count(r->topo); i++) {
		const struct kvb_topo_nic *tn = kvb_topo_nic(r->topo, i);

		if (strcmp(tn->name, n->name))
			continue;
		n->numa = tn->numa;
		snprintf(n->pci, sizeof(n->pci), "%.31s", tn->pci);
	}
}

/* PD, completion channel (when the device gives one) and CQ of n. */
static int nic_queues(struct kvb_rdma_nic *n)
{
	n->pd = ibv_alloc_pd(n->ctx);
	if (!n->pd)
		return errno ? -errno : -ENOMEM;
	n->cq_size = n->dev.max_cqe < KVB_RDMA_CQ_MAX ? n->dev.max_cqe
						      : KVB_RDMA_CQ_MAX;
	/* no channel (or no non-blocking fd): poll without wait_fd() */
	n->chan = ibv_create_comp_channel(n->ctx);
	if (n->chan && fd_nonblock(n->chan->fd)) {
		ibv_destroy_comp_channel(n->chan);
		n->chan = NULL;
	}
	n->cq = ibv_create_cq(n->ctx, n->cq_size, NULL, n->chan, 0);
	if (!n->cq) {
		int err = errno ? -errno : -ENOMEM;

		if (n->chan)
			ibv_destroy_comp_channel(n->chan);
		n->chan = NULL;
		ibv_dealloc_pd(n->pd);
		n->pd = NULL;
		return err;
	}
	/* device events (port down, QP errors) for kvb_rdma_async_service */
	n->async_nb = fd_nonblock(n->ctx->async_fd) == 0;
	return 0;
}

/* Open dev as n: port `port` active, GID, queues, the QP budget. */
static int nic_open(struct kvb_rdma *r, struct kvb_rdma_nic *n,
		    struct ibv_device *dev, int port, int gid_index, char *why,
		    size_t why_len)
{
	const char *name = ibv_get_device_name(dev);
	int err;

	snprintf(n->name, sizeof(n->name), "%s", name);
	n->ctx = ibv_open_device(dev);
	if (!n->ctx) {
		set_why(why, why_len, "cannot open ", name);
		return errno ? -errno : -ENODEV;
	}
	err = -ibv_query_device(n->ctx, &n->dev);
	if (!err && ibv_query_port(n->ctx, (uint8_t) port, &n->port)) {
		set_why(why, why_len, "cannot query the port of ", name);
		err = -EINVAL;
	}
	if (!err && n->port.state != IBV_PORT_ACTIVE) {
		set_why(why, why_len, "port not active on ", name);
		err = -ENODEV;
	}
	if (err)
		goto err_ctx;
	n->port_num = port;
	n->gid_index = pick_gid(n, gid_index);
	if (ibv_query_gid(n->ctx, (uint8_t) port, n->gid_index, &n->gid)) {
		err = -EINVAL;
		goto err_ctx;
	}
	err = nic_queues(n);
	if (err)
		goto err_ctx;
	n->max_qps = (uint32_t) (n->dev.max_qp > 0 ? n->dev.max_qp : 1);
	if (r->p.max_qps > 0 && (uint32_t) r->p.max_qps < n->max_qps)
		n->max_qps = (uint32_t) r->p.max_qps;
	nic_topo(r, n);
	return 0;

err_ctx:
	ibv_close_device(n->ctx);
	n->ctx = NULL;
	return err;
}

static void nic_close(struct kvb_rdma_nic *n)
{
	if (!n->ctx)
		return;
	/* ibv_destroy_cq waits until every event read has been acked */
	if (n->unacked)
		ibv_ack_cq_events(n->cq, n->unacked);
	ibv_destroy_cq(n->cq);
	if (n->chan)
		ibv_destroy_comp_channel(n->chan);
	/* Fails (EBUSY) if the broker left regions registered; nothing to
	 * do. */
	ibv_dealloc_pd(n->pd);
	ibv_close_device(n->ctx);
	n->ctx = NULL;
}

/* Device `name` (len bytes) of the list, or NULL. */
static struct ibv_device *dev_named(struct ibv_device **list, int n,
				    const char *name, size_t len)
{
	for (int i = 0; i < n; i++) {
		const char *d = ibv_get_device_name(list[i]);

		if (strlen(d) == len && !memcmp(d, name, len))
			return list[i];
	}
	return NULL;
}

/*
 * The devices dev_name selects into sel[]: NULL the first, "all" every
 * one (up to KVB_NIC_MAX), else each of a comma-separated list. Returns
 * how many, or -ENODEV (a name not found), -EINVAL (a name twice, or an
 * empty one), -E2BIG (more than KVB_NIC_MAX).
 */
static int devs_select(struct ibv_device **list, int n, const char *dev_name,
		       struct ibv_device **sel, char *why, size_t why_len)
{
	const char *s = dev_name;
	int k = 0, i;

	if (!dev_name || !strcmp(dev_name, "all")) {
		for (i = 0; i < n && i < KVB_NIC_MAX; i++)
			sel[k++] = list[i];
		return dev_name ? k : 1;
	}
	for (;;) {
		size_t len = strcspn(s, ",");
		char name[64];

		snprintf(name, sizeof(name), "%.*s", (int) len, s);
		if (k == KVB_NIC_MAX) {
			set_why(why, why_len, "too many RDMA devices listed",
				NULL);
			return -E2BIG;
		}
		sel[k] = len ? dev_named(list, n, s, len) : NULL;
		if (!sel[k]) {
			set_why(why, why_len, "no RDMA device named ", name);
			return len ? -ENODEV : -EINVAL;
		}
		for (i = 0; i < k; i++)
			if (sel[i] == sel[k]) {
				set_why(why, why_len,
					"RDMA device listed twice: ", name);
				return -EINVAL;
			}
		k++;
		if (!s[len])
			return k;
		s += len + 1;
	}
}

/* An epoll fd over every NIC's completion channel (which = 0) or async
 * fd (1); -1 when one of them has none (then the caller has no fd). */
static int epoll_over(struct kvb_rdma *r, int which)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	unsigned i;

	for (i = 0; ep >= 0 && i < r->nnic; i++) {
		struct kvb_rdma_nic *n = &r->nics[i];
		struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
		int fd = which ? (n->async_nb ? n->ctx->async_fd : -1)
			       : (n->chan ? n->chan->fd : -1);

		if (fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
			close(ep);
			ep = -1;
		}
	}
	return ep;
}

/* Open the selected devices as NICs 0..k-1; "all" skips devices that do
 * not open (a port down) as long as one does. */
static int nics_open_sel(struct kvb_rdma *r, struct ibv_device **sel, int k,
			 int skip_bad, char *why, size_t why_len)
{
	int port = r->p.ib_port > 0 ? r->p.ib_port : 1, i, err = -ENODEV;

	for (i = 0; i < k; i++) {
		struct kvb_rdma_nic *n = &r->nics[r->nnic];

		/* --gid-index (or the resolved address) is the first NIC's */
		err = nic_open(r, n, sel[i], port,
			       r->nnic ? -1 : r->p.gid_index, why, why_len);
		if (err && !skip_bad)
			return err;
		if (err) {
			memset(n, 0, sizeof(*n));
			continue;
		}
		r->nnic++;
	}
	return r->nnic ? 0 : err;
}

int _kvb_rdma_nics_open(struct kvb_rdma *r, const char *dev_name, char *why,
			size_t why_len)
{
	struct ibv_device *sel[KVB_NIC_MAX];
	struct ibv_device **list;
	int n = 0, k, err;
	unsigned i;

	r->wait_epfd = r->async_epfd = -1;
	list = ibv_get_device_list(&n);
	if (!list || !n) {
		set_why(why, why_len, "no RDMA device", NULL);
		if (list)
			ibv_free_device_list(list);
		return -ENODEV;
	}
	if (kvb_topo_open(NULL, &r->topo, NULL, 0))
		r->topo = NULL; /* NUMA nodes and PCI addresses unknown */
	k = devs_select(list, n, dev_name, sel, why, why_len);
	err = k < 0 ? k
		    : nics_open_sel(r, sel, k,
				    dev_name && !strcmp(dev_name, "all"), why,
				    why_len);
	ibv_free_device_list(list);
	if (err) {
		_kvb_rdma_nics_close(r);
		return err;
	}
	for (i = 0; i < r->nnic; i++)
		if (r->p.sq_depth > (uint32_t) r->nics[i].dev.max_qp_wr)
			r->p.sq_depth = (uint32_t) r->nics[i].dev.max_qp_wr;
	if (r->nnic > 1) {
		r->wait_epfd = epoll_over(r, 0);
		r->async_epfd = epoll_over(r, 1);
	}
	r->p.ib_port = r->nics[0].port_num;
	r->p.gid_index = r->nics[0].gid_index;
	return 0;
}

void _kvb_rdma_nics_close(struct kvb_rdma *r)
{
	unsigned i;

	for (i = 0; i < r->nnic; i++)
		nic_close(&r->nics[i]);
	r->nnic = 0;
	if (r->wait_epfd >= 0)
		close(r->wait_epfd);
	if (r->async_epfd >= 0)
		close(r->async_epfd);
	r->wait_epfd = r->async_epfd = -1;
	if (r->topo)
		kvb_topo_close(r->topo);
	r->topo = NULL;
}

/*
 * The access a region is registered with: LOCAL_WRITE always (the sink of
 * our own READs, and REMOTE_WRITE needs it), REMOTE_WRITE / REMOTE_READ only
 * where its KVB_MEM_REMOTE_* flags grant them. A region offered to nobody
 * then has no remote access at all: a peer that guesses its rkey gets a
 * remote access error, not the bytes.
 */
static int mr_access(const struct kvb_mr *mr)
{
	int access = IBV_ACCESS_LOCAL_WRITE;

	if (mr->flags & KVB_MEM_REMOTE_WRITE)
		access |= IBV_ACCESS_REMOTE_WRITE;
	if (mr->flags & KVB_MEM_REMOTE_READ)
		access |= IBV_ACCESS_REMOTE_READ;
	return access;
}

int _kvb_rdma_mem_numa(const void *addr)
{
	/* get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR): the page's node */
	int node = -1;

	if (!addr || syscall(SYS_get_mempolicy, &node, NULL, 0UL, addr, 3UL))
		return -1;
	return node;
}

/* Topology index of NIC n, or -1. */
static int topo_index(const struct kvb_rdma *r, const struct kvb_rdma_nic *n)
{
	for (int i = 0; r->topo && i < kvb_topo_count(r->topo); i++)
		if (!strcmp(kvb_topo_nic(r->topo, i)->name, n->name))
			return i;
	return -1;
}

/* How near NIC i is to a region: GPU `bus` (by PCI path) or host memory
 * on NUMA node `numa`; larger is nearer. */
static int nic_score(const struct kvb_rdma *r, unsigned i, const char *bus,
		     int numa)
{
	const struct kvb_rdma_nic *n = &r->nics[i];

	if (bus) {
		int s = kvb_topo_score_pci(r->topo, bus, topo_index(r, n),
					   NULL);

		return s < 0 ? 0 : s;
	}
	if (numa >= 0 && n->numa == numa)
		return 2;
	return numa < 0 || n->numa < 0 ? 1 : 0;
}

/* g->order: nearest first; ties to the NIC with fewer regions homed, then
 * the lower index (as topo.c picks among equally near NICs). */
static unsigned home_order(const struct kvb_rdma *r, struct kvb_rdma_reg *g,
			   const int *score)
{
	unsigned i, j, ties = 0;

	for (i = 0; i < r->nnic; i++)
		g->order[i] = (uint8_t) i;
	for (i = 0; i < r->nnic; i++)
		for (j = i + 1; j < r->nnic; j++) {
			unsigned a = g->order[i], b = g->order[j];
			int better = score[b] > score[a] ||
				     (score[b] == score[a] &&
				      r->nics[b].regions < r->nics[a].regions);

			if (better) {
				g->order[i] = (uint8_t) b;
				g->order[j] = (uint8_t) a;
			}
		}
	for (i = 0; i < r->nnic; i++)
		ties += score[i] == score[g->order[0]];
	g->home = g->order[0];
	return ties;
}

/* The home NIC of mr (and the order after it), with why in g->why. */
static void home_pick(struct kvb_rdma *r, const struct kvb_mr *mr,
		      struct kvb_rdma_reg *g)
{
	const char *bus = NULL;
	char bdf[16];
	int score[KVB_NIC_MAX], numa = -1, n;
	unsigned i, ties;
	enum kvb_topo_near near = KVB_TOPO_NUMA_UNKNOWN;

	if (mr->kind == KVB_MEM_GPU && mr->pci[0] && r->topo &&
	    !kvb_topo_bus_id(mr->pci, bdf, sizeof(bdf)))
		bus = bdf;
	else if (mr->kind != KVB_MEM_GPU)
		numa = _kvb_rdma_mem_numa(mr->addr);
	for (i = 0; i < r->nnic; i++)
		score[i] = nic_score(r, i, bus, numa);
	ties = home_order(r, g, score);
	if (bus) {
		kvb_topo_score_pci(r->topo, bus,
				   topo_index(r, &r->nics[g->home]), &near);
		n = snprintf(g->why, sizeof(g->why), "%s: %s as GPU %d (%s)",
			     r->nics[g->home].name, kvb_topo_near_text(near),
			     mr->gpu_device, bus);
	} else if (mr->kind == KVB_MEM_GPU) {
		n = snprintf(g->why, sizeof(g->why),
			     "%s: GPU %d's PCI address unknown",
			     r->nics[g->home].name, mr->gpu_device);
	} else if (numa >= 0 && score[g->home] == 2) {
		n = snprintf(g->why, sizeof(g->why),
			     "%s: on the memory's NUMA node %d",
			     r->nics[g->home].name, numa);
	} else {
		n = snprintf(g->why, sizeof(g->why),
			     "%s: memory on NUMA node %d, NIC on %d",
			     r->nics[g->home].name, numa,
			     r->nics[g->home].numa);
	}
	if (ties > 1 && n > 0 && (size_t) n < sizeof(g->why))
		snprintf(g->why + n, sizeof(g->why) - (size_t) n,
			 "; %u NICs equally near, the one with fewest regions",
			 ties);
}

/* Register mr on NIC i: as a dmabuf while *fd >= 0 works (a device that
 * cannot sets *fd = -1: by address from then on). NULL with errno. */
static struct ibv_mr *reg_one(struct kvb_rdma_nic *n, struct kvb_mr *mr,
			      int *fd, uint64_t offset)
{
	struct ibv_mr *imr;

	if (*fd >= 0) {
		imr = ibv_reg_dmabuf_mr(n->pd, offset, mr->len,
					(uint64_t) (uintptr_t) mr->addr, *fd,
					mr_access(mr));
		if (imr)
			return imr;
		if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL &&
		    errno != EPROTONOSUPPORT)
			return NULL;
		*fd = -1;
	}
	if (!mr->addr) {
		errno = EINVAL;
		return NULL;
	}
	return ibv_reg_mr(n->pd, mr->addr, mr->len, mr_access(mr));
}

/* mr on every NIC, its home chosen and logged. Returns 0 (every NIC took
 * the dmabuf), 1 (some by address) or -errno. */
static int reg_all(struct kvb_rdma *r, struct kvb_mr *mr, int fd,
		   uint64_t offset)
{
	struct kvb_rdma_reg *g;
	int dmabuf = fd >= 0, err;
	unsigned i;

	if (mr->tpriv[KVB_RDMA_TPRIV])
		return -EBUSY;
	if (!mr->len || (fd < 0 && !mr->addr))
		return -EINVAL;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	for (i = 0; i < r->nnic; i++) {
		g->mr[i] = reg_one(&r->nics[i], mr, &fd, offset);
		if (!g->mr[i]) {
			err = errno ? -errno : -ENOMEM;
			while (i--)
				ibv_dereg_mr(g->mr[i]);
			free(g);
			return err;
		}
	}
	home_pick(r, mr, g);
	r->nics[g->home].regions++;
	mr->tpriv[KVB_RDMA_TPRIV] = g;
	mr->lkey = g->mr[g->home]->lkey;
	mr->rkey = g->mr[g->home]->rkey;
	for (i = 0; i < r->nnic; i++) {
		g->on[i] = *mr;
		g->on[i].lkey = g->mr[i]->lkey;
		g->on[i].rkey = g->mr[i]->rkey;
	}
	/* the choice is not logged here: mr_nic() tells it, and the broker
	 * logs it once per region, rate-limited */
	return dmabuf && fd >= 0 ? 0 : 1;
}

int _kvb_rdma_reg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	int rc = reg_all(to_rdma(t), mr, -1, 0);

	return rc < 0 ? rc : 0;
}

int kvb_rdma_reg_dmabuf(struct kvb_transport *t, struct kvb_mr *mr, int fd,
			uint64_t offset)
{
	return reg_all(to_rdma(t), mr, fd, offset);
}

void _kvb_rdma_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct kvb_rdma *r = to_rdma(t);
	struct kvb_rdma_reg *g = mr->tpriv[KVB_RDMA_TPRIV];
	unsigned i;

	if (!g)
		return;
	for (i = 0; i < r->nnic; i++)
		if (g->mr[i])
			ibv_dereg_mr(g->mr[i]);
	if (r->nics[g->home].regions)
		r->nics[g->home].regions--;
	free(g);
	mr->tpriv[KVB_RDMA_TPRIV] = NULL;
	mr->lkey = 0;
	mr->rkey = 0;
}

int _kvb_rdma_mr_nic_use(const struct kvb_rdma *r, const struct kvb_mr *mr,
			 int *moved)
{
	const struct kvb_rdma_reg *g = mr ? mr->tpriv[KVB_RDMA_TPRIV] : NULL;
	unsigned k;

	*moved = 0;
	for (k = 0; k < r->nnic; k++) {
		/* a region registered elsewhere (tests): NIC order */
		unsigned i = g ? g->order[k] : k;

		if (nic_up(&r->nics[i])) {
			*moved = k > 0;
			return (int) i;
		}
	}
	return -1;
}

int _kvb_rdma_nics(struct kvb_transport *t, struct kvb_transport_nic *out,
		   unsigned max)
{
	struct kvb_rdma *r = to_rdma(t);
	unsigned i;

	for (i = 0; i < r->nnic && i < max; i++) {
		const struct kvb_rdma_nic *n = &r->nics[i];
		struct kvb_transport_nic *o = &out[i];

		memset(o, 0, sizeof(*o));
		snprintf(o->name, sizeof(o->name), "%s", n->name);
		snprintf(o->pci, sizeof(o->pci), "%s", n->pci);
		o->port = n->port_num;
		o->port_up = nic_up(n);
		o->numa = n->numa;
		o->bytes = n->bytes;
		o->wrs = n->wrs;
		o->doorbells = n->doorbells;
		o->regions = n->regions;
		o->qps = n->qps;
		o->max_qps = n->max_qps;
		o->qp_refused = n->qp_refused;
		o->qp_parked = n->qp_parked;
		o->moved = n->moved;
	}
	return (int) r->nnic;
}

int _kvb_rdma_mr_nic(struct kvb_transport *t, const struct kvb_mr *mr,
		     char *why, size_t why_len)
{
	struct kvb_rdma *r = to_rdma(t);
	const struct kvb_rdma_reg *g = mr ? mr->tpriv[KVB_RDMA_TPRIV] : NULL;
	int moved, use;

	if (!g)
		return -ENOENT;
	use = _kvb_rdma_mr_nic_use(r, mr, &moved);
	if (why && why_len) {
		if (use < 0)
			snprintf(why, why_len, "%s; every NIC is down", g->why);
		else if (moved)
			snprintf(why, why_len, "%s; it is down: through %s",
				 g->why, r->nics[use].name);
		else
			snprintf(why, why_len, "%s", g->why);
	}
	return use < 0 ? g->home : use;
}

int _kvb_rdma_mr_keys(struct kvb_transport *t, const struct kvb_mr *mr,
		      uint32_t *rkeys, unsigned max, unsigned *home)
{
	struct kvb_rdma *r = to_rdma(t);
	const struct kvb_rdma_reg *g = mr ? mr->tpriv[KVB_RDMA_TPRIV] : NULL;
	unsigned i;

	if (!g)
		return -ENOENT;
	for (i = 0; i < r->nnic && i < max; i++)
		rkeys[i] = g->mr[i]->rkey;
	if (home)
		*home = g->home;
	return (int) r->nnic;
}

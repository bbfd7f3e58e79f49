// SPDX-License-Identifier: MIT
/*
 * RDMA NIC topology from sysfs (topo.h): enumerate the devices, compare
 * their PCI paths with a GPU's, pick the nearest by load.
 *
 * A PCI path is what realpath() gives for the device below <root>/devices/,
 * e.g. "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0":
 * host bridge, root port, switch upstream port, switch downstream port,
 * endpoint. Two devices' nearness is the number of leading components they
 * share.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strverscmp */
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma/topo.h"

struct topo_dev {
	struct kvb_topo_nic pub;
	char *path; /* under <root>/devices/, NULL when not a PCI device */
};

struct kvb_topo {
	char *root; /* realpath of the sysfs root */
	int n;
	struct topo_dev *devs;
};

__attribute__((format(printf, 3, 4))) static void set_why(char *why, size_t len,
							  const char *fmt, ...)
{
	va_list ap;

	if (!why || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

/* A path into buf; -ENAMETOOLONG when it does not fit. */
__attribute__((format(printf, 3, 4))) static int pathf(char *buf, size_t len,
						       const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n < 0 || (size_t) n >= len ? -ENAMETOOLONG : 0;
}

/* First line of a small file, newline stripped. 0 or -errno. */
static int read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return -errno;
	if (!fgets(buf, (int) len, f)) {
		fclose(f);
		return -EIO;
	}
	fclose(f);
	n = strcspn(buf, "\n");
	buf[n] = '\0';
	return 0;
}

static int read_int(const char *path, int def)
{
	char buf[32], *end;
	long v;

	if (read_line(path, buf, sizeof(buf)))
		return def;
	errno = 0;
	v = strtol(buf, &end, 10);
	if (errno || end == buf || v < INT_MIN || v > INT_MAX)
		return def;
	return (int) v;
}

/*
 * The PCI path of `<root>/<rel>` (a link into <root>/devices/pci*), as a
 * new string; NULL (errno ENOENT) when it is not a PCI device there.
 */
static char *pci_path(const struct kvb_topo *t, const char *rel)
{
	char p[PATH_MAX], real[PATH_MAX];
	size_t rl = strlen(t->root);

	if (pathf(p, sizeof(p), "%s/%s", t->root, rel)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	if (!realpath(p, real))
		return NULL;
	if (strncmp(real, t->root, rl) ||
	    strncmp(real + rl, "/devices/pci", strlen("/devices/pci"))) {
		errno = ENOENT;
		return NULL;
	}
	return strdup(real + rl + strlen("/devices/"));
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *) a - *(const int *) b;
}

static void load_ports(const struct kvb_topo *t, struct kvb_topo_nic *nic)
{
	char p[PATH_MAX], buf[64];
	struct dirent *de;
	DIR *d;
	int i;

	if (pathf(p, sizeof(p), "%s/class/infiniband/%s/ports", t->root,
		  nic->name))
		return;
	d = opendir(p);
	if (!d)
		return;
	while ((de = readdir(d)) && nic->nports < KVB_TOPO_MAX_PORTS) {
		char *end;
		long v = strtol(de->d_name, &end, 10);

		if (end == de->d_name || *end || v < 1 || v > 255)
			continue;
		nic->port[nic->nports++] = (int) v;
	}
	closedir(d);
	qsort(nic->port, (size_t) nic->nports, sizeof(int), cmp_int);
	for (i = 0; i < nic->nports; i++) {
		/* "4: ACTIVE" */
		nic->active[i] = !pathf(p, sizeof(p),
					"%s/class/infiniband/%s/ports/%d/state",
					t->root, nic->name, nic->port[i]) &&
				 read_int(p, 0) == 4;
		nic->ethernet[i] =
			!pathf(p, sizeof(p),
			       "%s/class/infiniband/%s/ports/%d/link_layer",
			       t->root, nic->name, nic->port[i]) &&
			!read_line(p, buf, sizeof(buf)) &&
			!strcmp(buf, "Ethernet");
	}
}

static int load_dev(struct kvb_topo *t, struct topo_dev *d, const char *name)
{
	char rel[PATH_MAX], p[PATH_MAX];
	size_t nl = strlen(name);
	const char *slash;

	if (nl >= sizeof(d->pub.name))
		return -ENAMETOOLONG;
	memcpy(d->pub.name, name, nl + 1);
	if (pathf(rel, sizeof(rel), "class/infiniband/%s/device", name))
		return -ENAMETOOLONG;
	d->path = pci_path(t, rel);
	if (!d->path && errno == ENOMEM)
		return -ENOMEM;
	d->pub.numa = -1;
	if (d->path) {
		slash = strrchr(d->path, '/');
		snprintf(d->pub.pci, sizeof(d->pub.pci), "%s",
			 slash ? slash + 1 : d->path);
		if (!pathf(p, sizeof(p), "%s/%s/numa_node", t->root, rel))
			d->pub.numa = read_int(p, -1);
		if (d->pub.numa < -1)
			d->pub.numa = -1;
	}
	load_ports(t, &d->pub);
	return 0;
}

static int cmp_dev(const void *a, const void *b)
{
	return strverscmp(((const struct topo_dev *) a)->pub.name,
			  ((const struct topo_dev *) b)->pub.name);
}

static int scan(struct kvb_topo *t, DIR *d)
{
	struct dirent *de;
	int cap = 0, err;

	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' ||
		    strlen(de->d_name) >= KVB_TOPO_NAME_LEN)
			continue;
		if (t->n == cap) {
			int nc = cap ? 2 * cap : 8;
			void *nd = realloc(t->devs,
					   (size_t) nc * sizeof(*t->devs));

			if (!nd)
				return -ENOMEM;
			t->devs = nd;
			cap = nc;
		}
		memset(&t->devs[t->n], 0, sizeof(t->devs[0]));
		err = load_dev(t, &t->devs[t->n], de->d_name);
		t->n++;
		if (err)
			return err;
	}
	if (t->n > 1)
		qsort(t->devs, (size_t) t->n, sizeof(*t->devs), cmp_dev);
	return 0;
}

int kvb_topo_open(const char *sysfs_root, struct kvb_topo **out, char *why,
		  size_t why_len)
{
	char p[PATH_MAX];
	struct kvb_topo *t;
	DIR *d;
	int err;

	if (!sysfs_root)
		sysfs_root = "/sys";
	if (why && why_len)
		why[0] = '\0';
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->root = realpath(sysfs_root, NULL);
	if (!t->root) {
		err = -errno;
		set_why(why, why_len, "cannot read %s", sysfs_root);
		goto err_free;
	}
	err = pathf(p, sizeof(p), "%s/class/infiniband", t->root);
	if (err)
		goto err_free;
	d = opendir(p);
	if (!d) {
		err = -errno;
		set_why(why, why_len, "no %s: no RDMA driver loaded", p);
		goto err_free;
	}
	err = scan(t, d);
	closedir(d);
	if (err)
		goto err_free;
	if (!t->n) {
		err = -ENODEV;
		set_why(why, why_len, "no RDMA device in %s", p);
		goto err_free;
	}
	*out = t;
	return 0;

err_free:
	kvb_topo_close(t);
	return err;
}

void kvb_topo_close(struct kvb_topo *t)
{
	int i;

	if (!t)
		return;
	for (i = 0; i < t->n; i++)
		free(t->devs[i].path);
	free(t->devs);
	free(t->root);
	free(t);
}

int kvb_topo_count(const struct kvb_topo *t)
{
	return t->n;
}

const struct kvb_topo_nic *kvb_topo_nic(const struct kvb_topo *t, int i)
{
	return i >= 0 && i < t->n ? &t->devs[i].pub : NULL;
}

int kvb_topo_bus_id(const char *bus_id, char *out, size_t len)
{
	unsigned dom, bus, dev, fn;
	int n = 0;

	if (!bus_id || !isxdigit((unsigned char) bus_id[0]) ||
	    sscanf(bus_id, "%8x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &n) !=
		    4 ||
	    bus_id[n] || dom > 0xffff || dev > 0x1f || fn > 7)
		return -EINVAL;
	if (len < 13)
		return -ENOSPC;
	snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
	return 0;
}

/* Leading components a and b share; *last: where the last shared starts. */
static int common(const char *a, const char *b, const char **last,
		  size_t *last_len)
{
	int c = 0;

	for (;;) {
		size_t la = strcspn(a, "/"), lb = strcspn(b, "/");

		if (!la || la != lb || memcmp(a, b, la))
			return c;
		c++;
		*last = a;
		*last_len = la;
		if (!a[la] || !b[lb])
			return c;
		a += la + 1;
		b += lb + 1;
	}
}

struct target {
	const char *path; /* PCI path of the GPU, NULL for host memory */
	int numa;
	const char *what; /* "GPU 0000:19:00.0" / "host memory" */
};

static enum kvb_topo_near numa_near(int a, int b)
{
	if (a < 0 || b < 0)
		return KVB_TOPO_NUMA_UNKNOWN;
	return a == b ? KVB_TOPO_NUMA_SAME : KVB_TOPO_NUMA_OTHER;
}

/*
 * Score of device d for target g (larger is nearer) and its class; `anc`
 * gets the deepest common ancestor's name when they share a PCI path.
 */
static int score(const struct topo_dev *d, const struct target *g,
		 enum kvb_topo_near *near, char *anc, size_t anc_len)
{
	const char *last = NULL;
	size_t ll = 0;
	int c = 0;

	anc[0] = '\0';
	if (d->path && g->path)
		c = common(d->path, g->path, &last, &ll);
	if (c >= 3)
		*near = KVB_TOPO_SWITCH;
	else if (c == 2)
		*near = KVB_TOPO_ROOT_PORT;
	else if (c == 1)
		*near = KVB_TOPO_HOST_BRIDGE;
	else
		*near = numa_near(d->pub.numa, g->numa);
	if (c)
		snprintf(anc, anc_len, "%.*s", (int) ll, last);
	/* nested switches: the deeper common ancestor wins */
	return (int) *near * 256 + (c >= 3 ? c : 0);
}

static int has_active(const struct kvb_topo_nic *n)
{
	int i;

	for (i = 0; i < n->nports; i++)
		if (n->active[i])
			return 1;
	return 0;
}

/* Nearest devices to g into idx[] (up to max); how many tie, or -ENETDOWN. */
static int nearest(const struct kvb_topo *t, const struct target *g, int *idx,
		   int max, enum kvb_topo_near *near_out)
{
	enum kvb_topo_near near, best_near = KVB_TOPO_NUMA_OTHER;
	int i, s, best = -1, k = 0;
	char anc[KVB_TOPO_NAME_LEN];

	for (i = 0; i < t->n; i++) {
		if (!has_active(&t->devs[i].pub))
			continue;
		s = score(&t->devs[i], g, &near, anc, sizeof(anc));
		if (s > best) {
			best = s;
			best_near = near;
			k = 0;
		}
		if (s == best) {
			if (k < max)
				idx[k] = i;
			k++;
		}
	}
	if (!k)
		return -ENETDOWN;
	if (near_out)
		*near_out = best_near;
	return k;
}

/* g->path and g->numa of a PCI bus id; *path to free. */
static int target_pci(const struct kvb_topo *t, const char *bus_id, char *bdf,
		      size_t bdf_len, char **path, int *numa)
{
	char rel[PATH_MAX], p[PATH_MAX];
	int err = kvb_topo_bus_id(bus_id, bdf, bdf_len);

	if (err)
		return err;
	pathf(rel, sizeof(rel), "bus/pci/devices/%s", bdf); /* fits */
	*path = pci_path(t, rel);
	if (!*path)
		return errno == ENOMEM ? -ENOMEM : -ENOENT;
	*numa = -1;
	if (!pathf(p, sizeof(p), "%s/%s/numa_node", t->root, rel))
		*numa = read_int(p, -1);
	if (*numa < -1)
		*numa = -1;
	return 0;
}

int kvb_topo_nearest_pci(const struct kvb_topo *t, const char *bus_id, int *idx,
			 int max, enum kvb_topo_near *near)
{
	struct target g = {.what = "GPU"};
	char bdf[16], *path = NULL;
	int err;

	err = target_pci(t, bus_id, bdf, sizeof(bdf), &path, &g.numa);
	if (err)
		return err;
	g.path = path;
	err = nearest(t, &g, idx, max, near);
	free(path);
	return err;
}

int kvb_topo_score_pci(const struct kvb_topo *t, const char *bus_id, int i,
		       enum kvb_topo_near *near)
{
	struct target g = {.what = "GPU"};
	char bdf[16], anc[KVB_TOPO_NAME_LEN], *path = NULL;
	enum kvb_topo_near nr;
	int err;

	if (i < 0 || i >= t->n)
		return -ENOENT;
	err = target_pci(t, bus_id, bdf, sizeof(bdf), &path, &g.numa);
	if (err)
		return err;
	g.path = path;
	err = score(&t->devs[i], &g, &nr, anc, sizeof(anc));
	free(path);
	if (near)
		*near = nr;
	return err;
}

const char *kvb_topo_near_text(enum kvb_topo_near n)
{
	switch (n) {
	case KVB_TOPO_SWITCH:
		return "same PCIe switch";
	case KVB_TOPO_ROOT_PORT:
		return "same PCIe root port";
	case KVB_TOPO_HOST_BRIDGE:
		return "same PCI host bridge";
	case KVB_TOPO_NUMA_SAME:
		return "same NUMA node";
	case KVB_TOPO_NUMA_UNKNOWN:
		return "NUMA node unknown";
	case KVB_TOPO_NUMA_OTHER:
		break;
	}
	return "other NUMA node";
}

/* One line: "mlx5_3 port 1: same PCIe switch 0000:16:00.0 as GPU ..." */
static void explain(const struct kvb_topo *t, const struct target *g,
		    struct kvb_topo_pick *p)
{
	const struct topo_dev *d = &t->devs[p->nic];
	char anc[KVB_TOPO_NAME_LEN], where[176];
	enum kvb_topo_near near;
	int n;

	score(d, g, &near, anc, sizeof(anc));
	if (anc[0])
		snprintf(where, sizeof(where), "%s %s as %s",
			 kvb_topo_near_text(near), anc, g->what);
	else if (near == KVB_TOPO_NUMA_SAME)
		snprintf(where, sizeof(where), "same NUMA node %d as %s%s",
			 g->numa, g->what,
			 g->path ? "; no NIC on its root complex" : "");
	else
		snprintf(where, sizeof(where), "%s (NIC node %d, %s node %d)%s",
			 kvb_topo_near_text(near), d->pub.numa, g->what,
			 g->numa,
			 g->path ? "; no NIC on its root complex" : "");
	n = snprintf(p->why, sizeof(p->why), "%s port %d: %s", p->dev, p->port,
		     where);
	if (p->ties > 1 && n > 0 && (size_t) n < sizeof(p->why))
		snprintf(p->why + n, sizeof(p->why) - (size_t) n,
			 "; %d equally near, least used", p->ties);
}

/* Among the nearest devices the active port with the fewest uses. */
static int pick(struct kvb_topo *t, const struct target *g,
		struct kvb_topo_pick *out)
{
	int idx[64], k, i, j, bn = -1, bp = -1; /* 64 tied NICs looked at */
	enum kvb_topo_near near;

	k = nearest(t, g, idx, 64, &near);
	if (k < 0)
		return k;
	for (i = 0; i < k && i < 64; i++) {
		const struct kvb_topo_nic *n = &t->devs[idx[i]].pub;

		for (j = 0; j < n->nports; j++)
			if (n->active[j] &&
			    (bn < 0 || n->uses[j] < t->devs[bn].pub.uses[bp])) {
				bn = idx[i];
				bp = j;
			}
	}
	t->devs[bn].pub.uses[bp]++;
	memset(out, 0, sizeof(*out));
	out->nic = bn;
	snprintf(out->dev, sizeof(out->dev), "%s", t->devs[bn].pub.name);
	out->port = t->devs[bn].pub.port[bp];
	out->near = near;
	out->ties = k;
	explain(t, g, out);
	return 0;
}

int kvb_topo_pick_pci(struct kvb_topo *t, const char *bus_id,
		      struct kvb_topo_pick *out)
{
	char bdf[16], what[32], *path = NULL;
	struct target g;
	int err;

	err = target_pci(t, bus_id, bdf, sizeof(bdf), &path, &g.numa);
	if (err)
		return err;
	snprintf(what, sizeof(what), "GPU %s", bdf);
	g.path = path;
	g.what = what;
	err = pick(t, &g, out);
	free(path);
	return err;
}

int kvb_topo_pick_numa(struct kvb_topo *t, int numa, struct kvb_topo_pick *out)
{
	struct target g = {.path = NULL, .numa = numa, .what = "host memory"};

	if (numa < -1)
		return -EINVAL;
	return pick(t, &g, out);
}

void kvb_topo_release(struct kvb_topo *t, const struct kvb_topo_pick *p)
{
	struct kvb_topo_nic *n;
	int j;

	if (!p || p->nic < 0 || p->nic >= t->n)
		return;
	n = &t->devs[p->nic].pub;
	for (j = 0; j < n->nports; j++)
		if (n->port[j] == p->port && n->uses[j])
			n->uses[j]--;
}

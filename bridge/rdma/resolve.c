// SPDX-License-Identifier: MIT
/*
 * IP address -> (RDMA device, port, GID index): librdmacm for the device
 * and port, the sysfs GID table for the index (resolve.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#ifdef KVB_HAVE_RDMACM
#include <rdma/rdma_cma.h>
#endif

#include "rdma/resolve.h"

#define GID_MAX 4096 /* entries looked at per port (mlx5 has 255) */

int kvb_rdma_ip_gid(const char *ip, uint8_t gid[16])
{
	struct in_addr a4;

	if (!ip)
		return -EINVAL;
	if (inet_pton(AF_INET, ip, &a4) == 1) {
		memset(gid, 0, 10);
		gid[10] = 0xff;
		gid[11] = 0xff;
		memcpy(gid + 12, &a4, 4);
		return 0;
	}
	return inet_pton(AF_INET6, ip, gid) == 1 ? 0 : -EINVAL;
}

static int read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return -errno;
	ok = fgets(buf, (int) len, f) != NULL;
	fclose(f);
	if (!ok)
		return -EIO;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

static enum kvb_gid_type gid_type(const char *ports, int i)
{
	char p[PATH_MAX], buf[32];
	int n = snprintf(p, sizeof(p), "%s/gid_attrs/types/%d", ports, i);

	/* unused entries read EINVAL */
	if (n < 0 || (size_t) n >= sizeof(p) || read_line(p, buf, sizeof(buf)))
		return KVB_GID_TYPE_UNKNOWN;
	if (!strcmp(buf, "RoCE v2"))
		return KVB_GID_TYPE_V2;
	if (!strcmp(buf, "IB/RoCE v1"))
		return KVB_GID_TYPE_V1;
	return KVB_GID_TYPE_UNKNOWN;
}

int kvb_rdma_gid_find(const char *sysfs_root, const char *dev, int port,
		      const uint8_t gid[16], enum kvb_gid_type *type)
{
	static const uint8_t zero[16];
	char dir[PATH_MAX], p[PATH_MAX], buf[64];
	int i, n, found = -ENOENT;
	enum kvb_gid_type ft = KVB_GID_TYPE_UNKNOWN;

	if (!dev || !dev[0] || strchr(dev, '/') || port < 1)
		return -ENODEV;
	n = snprintf(dir, sizeof(dir), "%s/class/infiniband/%s/ports/%d",
		     sysfs_root ? sysfs_root : "/sys", dev, port);
	if (n < 0 || (size_t) n >= sizeof(dir) - 32)
		return -ENAMETOOLONG;
	for (i = 0; i < GID_MAX; i++) {
		uint8_t g[16];
		int err;

		if (snprintf(p, sizeof(p), "%s/gids/%d", dir, i) >=
		    (int) sizeof(p))
			return -ENAMETOOLONG;
		err = read_line(p, buf, sizeof(buf));
		if (err == -ENOENT)
			break;
		/* unused entries read all zeros: never a match */
		if (err || inet_pton(AF_INET6, buf, g) != 1 ||
		    !memcmp(g, zero, 16) || memcmp(g, gid, 16))
			continue;
		if (gid_type(dir, i) == KVB_GID_TYPE_V2) {
			found = i;
			ft = KVB_GID_TYPE_V2;
			break;
		}
		if (found < 0) {
			found = i;
			ft = gid_type(dir, i);
		}
	}
	if (i == 0)
		return -ENODEV; /* no gids/0: no such device or port */
	if (found >= 0 && type)
		*type = ft;
	return found;
}

static const char *type_text(enum kvb_gid_type t)
{
	return t == KVB_GID_TYPE_V2   ? "RoCE v2"
	       : t == KVB_GID_TYPE_V1 ? "RoCE v1"
				      : "type unknown";
}

/* The GID index of w->local_ip on w->dev / w->port, into w. */
static int where_gid(struct kvb_rdma_where *w, const char *asked)
{
	uint8_t g[16];
	int idx;

	if (kvb_rdma_ip_gid(w->local_ip, g))
		return -EINVAL;
	idx = kvb_rdma_gid_find(NULL, w->dev, w->port, g, &w->gid_type);
	if (idx < 0) {
		snprintf(w->why, sizeof(w->why),
			 "%s is on %s port %d, but no GID there holds %s: %s",
			 asked, w->dev, w->port, w->local_ip, strerror(-idx));
		return idx == -ENODEV ? -ENOENT : idx;
	}
	w->gid_index = idx;
	if (!strcmp(asked, w->local_ip))
		snprintf(w->why, sizeof(w->why),
			 "%s: %s port %d GID index %d (%s)", asked, w->dev,
			 w->port, idx, type_text(w->gid_type));
	else
		snprintf(w->why, sizeof(w->why),
			 "%s: reached from %s on %s port %d GID index %d (%s)",
			 asked, w->local_ip, w->dev, w->port, idx,
			 type_text(w->gid_type));
	return 0;
}

#ifdef KVB_HAVE_RDMACM
static int sock_ip(const struct sockaddr *sa, char *buf, size_t len)
{
	const void *a;

	if (sa->sa_family == AF_INET)
		a = &((const struct sockaddr_in *) sa)->sin_addr;
	else if (sa->sa_family == AF_INET6)
		a = &((const struct sockaddr_in6 *) sa)->sin6_addr;
	else
		return -EAFNOSUPPORT;
	return inet_ntop(sa->sa_family, a, buf, (socklen_t) len) ? 0 : -errno;
}

/* Bind to ip if it is ours, else (timeout_ms > 0) resolve a route to it. */
static int cm_locate(struct rdma_cm_id *id, const struct rdma_addrinfo *ai,
		     const char *ip, int timeout_ms, struct kvb_rdma_where *w)
{
	int err;

	if (!rdma_bind_addr(id, ai->ai_src_addr)) {
		snprintf(w->local_ip, sizeof(w->local_ip), "%s", ip);
		return 0;
	}
	err = -errno;
	if (err == -ENODEV) {
		snprintf(w->why, sizeof(w->why),
			 "%s is on no RDMA device (no RoCE device on its "
			 "interface)",
			 ip);
		return err;
	}
	if (err != -EADDRNOTAVAIL || timeout_ms <= 0) {
		snprintf(w->why, sizeof(w->why), "%s: %s", ip,
			 err == -EADDRNOTAVAIL ? "not an address of this host"
					       : strerror(-err));
		return err;
	}
	if (rdma_resolve_addr(id, NULL, ai->ai_src_addr, timeout_ms)) {
		err = -errno;
		snprintf(w->why, sizeof(w->why), "%s: no RDMA route: %s", ip,
			 strerror(-err));
		return err;
	}
	return sock_ip(rdma_get_local_addr(id), w->local_ip,
		       sizeof(w->local_ip));
}

int kvb_rdma_resolve(const char *ip, int timeout_ms, struct kvb_rdma_where *w)
{
	struct rdma_addrinfo hints, *ai = NULL;
	struct rdma_cm_id *id = NULL;
	uint8_t g[16];
	int err;

	memset(w, 0, sizeof(*w));
	w->gid_index = -1;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST | RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	if (kvb_rdma_ip_gid(ip, g)) {
		snprintf(w->why, sizeof(w->why), "%s: not a numeric address",
			 ip ? ip : "(none)");
		return -EINVAL;
	}
	if (rdma_getaddrinfo(ip, NULL, &hints, &ai) || !ai ||
	    !ai->ai_src_addr) {
		err = errno ? -errno : -EINVAL;
		snprintf(w->why, sizeof(w->why), "%s: rdma_getaddrinfo: %s", ip,
			 strerror(-err));
		goto out;
	}
	/* a synchronous id (no event channel): calls block until done */
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
		err = errno ? -errno : -ENODEV;
		snprintf(w->why, sizeof(w->why), "%s: rdma_create_id: %s", ip,
			 strerror(-err));
		goto out;
	}
	err = cm_locate(id, ai, ip, timeout_ms, w);
	if (err)
		goto out;
	if (!id->verbs) { /* a wildcard binds without a device */
		snprintf(w->why, sizeof(w->why), "%s names no device", ip);
		err = -EINVAL;
		goto out;
	}
	snprintf(w->dev, sizeof(w->dev), "%s",
		 ibv_get_device_name(id->verbs->device));
	w->port = id->port_num;
	err = where_gid(w, ip);
out:
	if (id)
		rdma_destroy_id(id);
	if (ai)
		rdma_freeaddrinfo(ai);
	return err;
}
#else
int kvb_rdma_resolve(const char *ip, int timeout_ms, struct kvb_rdma_where *w)
{
	(void) timeout_ms;
	memset(w, 0, sizeof(*w));
	w->gid_index = -1;
	snprintf(w->why, sizeof(w->why),
		 "%s: built without librdmacm, no address resolution",
		 ip ? ip : "(none)");
	return -EOPNOTSUPP;
}
#endif

/* Loopback, wildcard or empty: no device to look for. */
static int no_device_address(const char *ip)
{
	uint8_t g[16];
	static const uint8_t any6[16];

	if (!ip || !ip[0] || kvb_rdma_ip_gid(ip, g))
		return 1;
	if (g[10] == 0xff && g[11] == 0xff && !memcmp(g, any6, 10))
		return g[12] == 127 || !memcmp(g + 12, any6, 4);
	/* :: and ::1 */
	return !memcmp(g, any6, 15) && g[15] <= 1;
}

/* dev is the first device of a --rdma-dev list ("rxe0" of "rxe0,rxe1") */
static int first_is(const char *list, const char *dev)
{
	size_t n = strcspn(list, ",");

	return strlen(dev) == n && !memcmp(list, dev, n);
}

int kvb_rdma_params_resolve(struct kvb_transport_params *p, const char *host_ip,
			    struct kvb_rdma_where *w)
{
	int err;

	memset(w, 0, sizeof(*w));
	w->gid_index = -1;
	if (p->gid_index >= 0 || no_device_address(host_ip))
		return 1;
	err = kvb_rdma_resolve(host_ip, 0, w);
	if (err) {
		size_t n = strlen(w->why);

		snprintf(w->why + n, sizeof(w->why) - n,
			 "; GID by the default rule");
		return err;
	}
	/* a list: the address and GID index are its first device's (the
	 * others pick theirs by the default rule) */
	if (p->dev_name && !first_is(p->dev_name, w->dev)) {
		snprintf(w->why, sizeof(w->why),
			 "--host-ip %s is on %s, not on the first device of "
			 "--rdma-dev %s: GID by the default rule",
			 host_ip, w->dev, p->dev_name);
		return -EXDEV;
	}
	if (!p->dev_name)
		p->dev_name = w->dev;
	p->ib_port = w->port;
	p->gid_index = w->gid_index;
	return 0;
}

int kvb_rdma_resolve_op(struct kvb_transport_params *p, const char *host_ip,
			struct kvb_transport_where *tw)
{
	struct kvb_rdma_where w;
	int rc = kvb_rdma_params_resolve(p, host_ip, &w);

	snprintf(tw->why, sizeof(tw->why), "%s", w.why);
	if (p->dev_name == w.dev) {
		snprintf(tw->dev, sizeof(tw->dev), "%s", w.dev);
		p->dev_name = tw->dev;
	}
	return rc;
}

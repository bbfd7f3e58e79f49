/* SPDX-License-Identifier: MIT */
/*
 * Which RDMA device, port and GID index carry an IP address.
 *
 * librdmacm answers the device and port: an rdma_cm_id (no QP) is bound to
 * the address when it is one of ours, or resolved towards it (the route's
 * outgoing device) when it is a peer's. The GID index is then the entry of
 * <sysfs>/class/infiniband/<dev>/ports/<port>/gids/ that holds the address
 * (IPv4 as ::ffff:a.b.c.d), RoCE v2 preferred over RoCE v1 by
 * gid_attrs/types/<i>.
 *
 * All functions return 0, an index or -errno; none keeps state, all are
 * thread-safe. The resolution blocks: at most timeout_ms for a peer.
 */
#ifndef KVB_BRIDGE_RDMA_RESOLVE_H
#define KVB_BRIDGE_RDMA_RESOLVE_H

#include <stdint.h>

#include "transport.h"

enum kvb_gid_type {
	KVB_GID_TYPE_UNKNOWN = 0, /* no readable gid_attrs/types entry */
	KVB_GID_TYPE_V1 = 1,	  /* "IB/RoCE v1" */
	KVB_GID_TYPE_V2 = 2,	  /* "RoCE v2" */
};

struct kvb_rdma_where {
	char dev[64];  /* verbs device name */
	int port;      /* port number */
	int gid_index; /* -1 when no GID holds the address */
	enum kvb_gid_type gid_type;
	char local_ip[48]; /* our address on that port */
	char why[256];	   /* one line for the log, success or not */
};

/*
 * The GID an IP address appears as in a RoCE GID table: IPv4 as the
 * IPv4-mapped ::ffff:a.b.c.d, IPv6 as itself. Returns 0 or -EINVAL.
 */
int kvb_rdma_ip_gid(const char *ip, uint8_t gid[16]);

/*
 * Index of `gid` in <sysfs_root>/class/infiniband/<dev>/ports/<port>/gids
 * (sysfs_root NULL = "/sys"): the first RoCE v2 entry holding it, else the
 * first entry of another type. *type (if not NULL) gets the entry's type.
 * Returns the index, -ENODEV (no such device or port) or -ENOENT (no entry
 * holds it).
 */
int kvb_rdma_gid_find(const char *sysfs_root, const char *dev, int port,
		      const uint8_t gid[16], enum kvb_gid_type *type);

/*
 * Device, port and GID index of IP address `ip`: an address of this host
 * is looked up directly (rdma_bind_addr); with timeout_ms > 0 any other
 * address is resolved as a peer's (rdma_resolve_addr, the device the route
 * to it leaves by, and our address on it), with timeout_ms == 0 it is
 * refused (-EADDRNOTAVAIL). w->why says what was found or why not.
 * Returns 0 (w filled, gid_index >= 0), -EINVAL (not a numeric address, or
 * a wildcard), -EADDRNOTAVAIL, -ENODEV (the address is on no RDMA device),
 * -ENOENT (device found, no GID holds the address), -ETIMEDOUT,
 * -EOPNOTSUPP (built without librdmacm), or librdmacm's errno.
 */
int kvb_rdma_resolve(const char *ip, int timeout_ms, struct kvb_rdma_where *w);

/*
 * The rdma transport's start: with p->gid_index < 0 and `host_ip` one of
 * this host's addresses (not loopback, not a wildcard), set p->gid_index,
 * p->ib_port and, when p->dev_name is NULL, p->dev_name (pointing into w,
 * which must outlive the use of p) from kvb_rdma_resolve(host_ip, 0, w).
 * Returns 0 (p changed; w->why says to what), 1 (nothing to do:
 * --gid-index given, or a loopback/wildcard/empty address), or -errno (p
 * unchanged, the transport's default rule applies; w->why says why; a
 * p->dev_name other than the address's device gives -EXDEV). With a
 * device list in p->dev_name ("rxe0,rxe1") the address must be on its
 * first device: the GID index found is that NIC's (the others pick theirs
 * by the default rule), the port every listed device's.
 */
int kvb_rdma_params_resolve(struct kvb_transport_params *p, const char *host_ip,
			    struct kvb_rdma_where *w);

/* kvb_rdma_params_resolve as the transport's resolve op (transport.h) */
int kvb_rdma_resolve_op(struct kvb_transport_params *p, const char *host_ip,
			struct kvb_transport_where *tw);

#endif /* KVB_BRIDGE_RDMA_RESOLVE_H */

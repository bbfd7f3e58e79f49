/* SPDX-License-Identifier: MIT */
/*
 * RDMA NIC topology from sysfs: which NIC sits nearest to a GPU (by PCI
 * path) or to host memory (by NUMA node).
 *
 * A GPU registered on a NIC under the same PCIe switch keeps GPUDirect
 * peer-to-peer; across the root complex it does not. kvb_topo_open() reads
 * <root>/class/infiniband/<dev> (its `device` link gives the PCI path under
 * <root>/devices/, `device/numa_node` the NUMA node, `ports/<n>/state` and
 * `link_layer` each port); the root is a parameter so that tests hand it a
 * fake tree.
 *
 * Nearness of a NIC to a GPU, best first:
 *   same PCIe switch   (deepest common ancestor below the root port)
 *   same root port
 *   same host bridge   (same pciDDDD:BB, different root ports)
 *   same NUMA node     (different root complex)
 *   NUMA node unknown  (either side reports -1)
 *   other NUMA node
 * Deeper common ancestors beat shallower ones within "same PCIe switch"
 * (nested switches). Among NICs equally near, a pick takes the active port
 * used by the fewest picks not yet released, then the first in device
 * name order (mlx5_2 before mlx5_10), then the lowest port number.
 *
 * Not thread-safe: one owner, or the caller serialises.
 */
#ifndef KVB_BRIDGE_RDMA_TOPO_H
#define KVB_BRIDGE_RDMA_TOPO_H

#include <stddef.h>

#define KVB_TOPO_NAME_LEN  64
#define KVB_TOPO_MAX_PORTS 8 /* ports past the 8th of a device are ignored */
#define KVB_TOPO_WHY_LEN   256

struct kvb_topo;

/* Nearness classes, larger is nearer (see the list above). */
enum kvb_topo_near {
	KVB_TOPO_NUMA_OTHER = 0,
	KVB_TOPO_NUMA_UNKNOWN = 1,
	KVB_TOPO_NUMA_SAME = 2,
	KVB_TOPO_HOST_BRIDGE = 3,
	KVB_TOPO_ROOT_PORT = 4,
	KVB_TOPO_SWITCH = 5,
};

struct kvb_topo_nic {
	char name[KVB_TOPO_NAME_LEN]; /* "mlx5_3" */
	char pci[KVB_TOPO_NAME_LEN];  /* "0000:18:00.0", "" without PCI */
	int numa;		      /* NUMA node, -1 unknown */
	int nports;
	int port[KVB_TOPO_MAX_PORTS];	   /* port numbers, ascending */
	int active[KVB_TOPO_MAX_PORTS];	   /* state ACTIVE */
	int ethernet[KVB_TOPO_MAX_PORTS];  /* link_layer Ethernet (RoCE) */
	unsigned uses[KVB_TOPO_MAX_PORTS]; /* picks not released */
};

struct kvb_topo_pick {
	int nic;		     /* index for kvb_topo_nic() */
	char dev[KVB_TOPO_NAME_LEN]; /* device name */
	int port;		     /* port number */
	enum kvb_topo_near near;     /* how near */
	int ties;		     /* NICs equally near (>= 1) */
	char why[KVB_TOPO_WHY_LEN];  /* one line for the log */
};

/*
 * Read the RDMA devices under `sysfs_root` (NULL = "/sys"). Returns 0 with
 * *out set, -ENOENT (no <root>/class/infiniband), -ENODEV (the directory
 * holds no device), -ENOMEM, -ENAMETOOLONG; on error `why` (if not NULL)
 * says what was missing. Free with kvb_topo_close().
 */
int kvb_topo_open(const char *sysfs_root, struct kvb_topo **out, char *why,
		  size_t why_len);
void kvb_topo_close(struct kvb_topo *t);

/* Number of devices; the i-th (name order) or NULL when out of range. */
int kvb_topo_count(const struct kvb_topo *t);
const struct kvb_topo_nic *kvb_topo_nic(const struct kvb_topo *t, int i);

/*
 * Canonical PCI address "dddd:bb:dd.f" (lowercase) of a bus id as GPU
 * runtimes print it ("0000:19:00.0", "00000000:19:00.0", "0000:5C:00.0").
 * Returns 0, -EINVAL (not a bus id) or -ENOSPC (len < 13).
 */
int kvb_topo_bus_id(const char *bus_id, char *out, size_t len);

/*
 * The NICs nearest to the PCI device `bus_id` (a GPU): up to `max` device
 * indices into idx[], in name order. Returns how many are equally nearest
 * (may exceed max), -EINVAL (bad bus id), -ENOENT (no such PCI device
 * under <root>/bus/pci/devices), -ENETDOWN (no device with an active
 * port). *near (if not NULL) gets the class.
 */
int kvb_topo_nearest_pci(const struct kvb_topo *t, const char *bus_id, int *idx,
			 int max, enum kvb_topo_near *near);

/*
 * How near device i is to the PCI device `bus_id`: a score (larger is
 * nearer; comparable between devices for one bus id) with its class in
 * *near (if not NULL), or -errno as kvb_topo_nearest_pci (-ENOENT also
 * for i out of range). Port states play no part.
 */
int kvb_topo_score_pci(const struct kvb_topo *t, const char *bus_id, int i,
		       enum kvb_topo_near *near);

/* "same PCIe switch", "same NUMA node", ... */
const char *kvb_topo_near_text(enum kvb_topo_near n);

/*
 * Pick a NIC port for memory of the GPU at `bus_id` (kvb_topo_pick_pci)
 * or for host memory on NUMA node `numa` (kvb_topo_pick_numa; -1 =
 * unknown: any NIC, by load). The pick counts as a use of that port until
 * kvb_topo_release(). Only active ports are picked. Returns 0 with *out
 * filled, or as kvb_topo_nearest_pci() (-EINVAL for numa < -1).
 */
int kvb_topo_pick_pci(struct kvb_topo *t, const char *bus_id,
		      struct kvb_topo_pick *out);
int kvb_topo_pick_numa(struct kvb_topo *t, int numa, struct kvb_topo_pick *out);
void kvb_topo_release(struct kvb_topo *t, const struct kvb_topo_pick *p);

#endif /* KVB_BRIDGE_RDMA_TOPO_H */

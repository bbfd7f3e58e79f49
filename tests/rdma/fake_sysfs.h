/* SPDX-License-Identifier: MIT */
/*
 * Fake sysfs trees for the topology and GID tests, built at test time
 * from a compact description (git keeps no symlinks we would trust).
 * One item per line, blank lines and '#' comments ignored:
 *
 *   pci  PATH NUMA                  a PCI device (a GPU) at
 *                                   <root>/devices/PATH, reachable as
 *                                   <root>/bus/pci/devices/<last component>
 *   nic  NAME PATH NUMA PORT...     an RDMA device on the PCI device PATH
 *   virt NAME PORT...               an RDMA device without a PCI parent
 *   gid  NAME PORT INDEX GID TYPE   ports/PORT/gids/INDEX holds GID,
 *                                   gid_attrs/types/INDEX holds TYPE:
 *                                   v1 ("IB/RoCE v1"), v2 ("RoCE v2"),
 *                                   "-" (no types file, as an unused entry)
 *
 * PORT is N:STATE:LINK with STATE active|down and LINK eth|ib. NUMA -1
 * writes "-1", "none" writes no numa_node file.
 */
#ifndef KVB_TESTS_RDMA_FAKE_SYSFS_H
#define KVB_TESTS_RDMA_FAKE_SYSFS_H

#include <stddef.h>

/*
 * Build a tree from `desc` in a new directory under $TMPDIR (or /tmp);
 * its path goes to root (len >= 64). Returns 0 or -errno (-EINVAL with
 * the bad line on stderr; nothing is left behind then).
 */
int fake_sysfs_build(const char *desc, char *root, size_t len);
/* The same from a description file. */
int fake_sysfs_build_file(const char *file, char *root, size_t len);
/* Remove the tree. */
void fake_sysfs_remove(const char *root);

#endif

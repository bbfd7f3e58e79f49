/* SPDX-License-Identifier: MIT */
/*
 * GPU memory across processes: a worker exports a device region as a
 * handle of plain bytes (it travels over the broker's Unix socket), the
 * broker imports it to a device pointer of its own and registers that with
 * the gpu transport (kind KVB_MEM_GPU) and, for cross-node writes, with the
 * rdma transport (kvb_gpu_dmabuf_fd first).
 *
 * Both sides use the process's gpu backend (kvb_gpu_backend_init(); the
 * first call of any function here initialises it with NULL = auto or
 * $KVB_GPU_BACKEND). All functions are thread-safe.
 */
#ifndef KVB_GPU_EXPORT_H
#define KVB_GPU_EXPORT_H

#include <stdint.h>

#define KVB_GPU_HANDLE_MAGIC   0x4b564748u /* "KVGH" */
#define KVB_GPU_HANDLE_VERSION 1
#define KVB_GPU_BUS_ID_LEN     24

/* Wire format: fixed-width fields, no pointers, 128 bytes. */
struct kvb_gpu_handle {
	uint32_t magic;
	uint16_t version;
	uint16_t backend;		 /* enum kvb_gpu_kind of the exporter */
	int32_t device;			 /* exporter's device ordinal */
	uint32_t pid;			 /* exporter (diagnostics) */
	uint64_t size;			 /* region bytes */
	uint64_t offset;		 /* region start - allocation base */
	uint64_t alloc_size;		 /* bytes of the whole allocation */
	char bus_id[KVB_GPU_BUS_ID_LEN]; /* PCI bus id, "" if unknown */
	uint8_t ipc[64]; /* runtime IPC handle of the allocation */
};
_Static_assert(sizeof(struct kvb_gpu_handle) == 128, "kvb_gpu_handle size");

/*
 * Worker side: describe [dev_ptr, dev_ptr + size) on `device` (this
 * process's ordinal) as a handle. The region may start anywhere inside its
 * allocation. Returns 0, -EINVAL (not device memory / out of the
 * allocation), -ENODEV (no gpu backend), or another -errno.
 */
int kvb_gpu_export(void *dev_ptr, uint64_t size, int device,
		   struct kvb_gpu_handle *out);

/*
 * Broker side: check a handle and map its region; *broker_ptr is the
 * region's start in this process. Importing regions of one allocation again
 * maps it once (reference counted). Returns 0, -EINVAL (malformed), -EPROTO
 * (other backend or version), -ENODEV, or another -errno.
 */
int kvb_gpu_import(const struct kvb_gpu_handle *h, void **broker_ptr);

/*
 * The device (this process's ordinal) holding a handle's memory: found by
 * PCI bus id (workers often see one GPU as device 0), else h->device.
 * Fill kvb_mr.gpu_device with it. Returns 0 or -ENODEV.
 */
int kvb_gpu_import_device(const struct kvb_gpu_handle *h, int *device);

/*
 * Drop an import by any pointer inside it (the broker_ptr it returned);
 * the mapping goes away with the last reference. Returns 0 or -ENOENT.
 */
int kvb_gpu_unimport(void *broker_ptr);

/*
 * dmabuf fd for the NIC: covers [dev_ptr, dev_ptr + size) rounded out to
 * pages; *offset is dev_ptr's offset in it. The rdma transport registers
 * ibv_reg_dmabuf_mr(pd, *offset, size, iova, *fd, access) on success and
 * ibv_reg_mr(pd, dev_ptr, ...) (peer memory, nvidia-peermem/amdgpu) on
 * -ENOTSUP, logging which path it took. The caller closes *fd after
 * registration. Returns 0, -ENOTSUP (runtime, driver or kernel lacks it),
 * or another -errno; kvb_gpu_export_strerror() says why.
 */
int kvb_gpu_dmabuf_fd(void *dev_ptr, uint64_t size, int *fd, uint64_t *offset);

/* Reason of the last failure on this thread of the functions above. */
const char *kvb_gpu_export_strerror(void);

#endif /* KVB_GPU_EXPORT_H */

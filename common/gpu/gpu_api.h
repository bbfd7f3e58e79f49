/* SPDX-License-Identifier: MIT */
/*
 * The "gpu ops" table: the few runtime calls the gpu transport and the
 * export/import helpers need, behind one table with three backends:
 *
 *   host  memcpy on a small pool of worker threads; "device memory" is memfd
 *         shared memory, "IPC handles" name the memfd; used by unit tests
 *   hip   libamdhip64 (dlopen'd), AMD GPUs
 *   cuda  libcudart (dlopen'd) plus libcuda for the driver-only calls, NVIDIA
 *
 * One backend per process (the runtimes are process-wide too). It is chosen
 * once by kvb_gpu_backend_init(): by name, or "auto" (hip, then cuda). The
 * host backend is only ever chosen by name.
 *
 * Every op returns 0, a count or -errno; after a runtime error g->errstr()
 * names it (thread-local). Ops may be called from any thread unless noted.
 */
#ifndef KVB_GPU_API_H
#define KVB_GPU_API_H

#include <stddef.h>
#include <stdint.h>

#define KVB_GPU_IPC_SIZE 64

/* A runtime IPC handle, opaque bytes (no pointers valid across processes). */
struct kvb_gpu_ipc {
	unsigned char b[KVB_GPU_IPC_SIZE];
};

enum kvb_gpu_kind {
	KVB_GPU_NONE = 0,
	KVB_GPU_HOST = 1,
	KVB_GPU_HIP = 2,
	KVB_GPU_CUDA = 3,
};

/* Direction of a synchronous copy (test and setup helper). */
enum kvb_gpu_dir { KVB_GPU_H2D = 1, KVB_GPU_D2H = 2, KVB_GPU_D2D = 3 };

struct kvb_gpu_api {
	const char *name;
	enum kvb_gpu_kind kind;

	int (*device_count)(const struct kvb_gpu_api *g, int *n);
	int (*set_device)(const struct kvb_gpu_api *g, int dev);
	/* A stable name of the device (PCI bus id) and the way back. */
	int (*device_id)(const struct kvb_gpu_api *g, int dev, char *buf,
			 size_t len);
	int (*device_by_id)(const struct kvb_gpu_api *g, const char *id,
			    int *dev);

	/* Device memory (tests and benchmarks; workers own theirs). */
	int (*alloc)(const struct kvb_gpu_api *g, int dev, uint64_t size,
		     void **ptr);
	int (*free)(const struct kvb_gpu_api *g, void *ptr);
	/* Synchronous copy; waits for the device. */
	int (*memcpy)(const struct kvb_gpu_api *g, void *dst, const void *src,
		      uint64_t n, enum kvb_gpu_dir dir);

	/*
	 * IPC handle of the allocation holding `ptr`, with `ptr`'s offset from
	 * the allocation base and the allocation's size (pointer-range query).
	 */
	int (*ipc_get)(const struct kvb_gpu_api *g, void *ptr,
		       struct kvb_gpu_ipc *h, uint64_t *offset,
		       uint64_t *alloc_size);
	/* Map another process's allocation; *base is its base in this one. */
	int (*ipc_open)(const struct kvb_gpu_api *g, int dev,
			const struct kvb_gpu_ipc *h, uint64_t alloc_size,
			void **base);
	int (*ipc_close)(const struct kvb_gpu_api *g, void *base);

	/* Streams: in-order queues of copies and event records. */
	int (*stream_create)(const struct kvb_gpu_api *g, int dev, void **s);
	int (*stream_destroy)(const struct kvb_gpu_api *g, void *s);
	int (*stream_sync)(const struct kvb_gpu_api *g, void *s);
	/* Device-to-device copy (peer copy when the devices differ). */
	int (*copy_async)(const struct kvb_gpu_api *g, void *dst, int dst_dev,
			  const void *src, int src_dev, uint64_t n, void *s);

	/* Events: completion markers recorded on a stream. */
	int (*event_create)(const struct kvb_gpu_api *g, int dev, void **e);
	int (*event_destroy)(const struct kvb_gpu_api *g, void *e);
	int (*event_record)(const struct kvb_gpu_api *g, void *e, void *s);
	/* 0 = reached, -EAGAIN = not yet, other -errno = the work failed. */
	int (*event_query)(const struct kvb_gpu_api *g, void *e);
	int (*event_sync)(const struct kvb_gpu_api *g, void *e);

	int (*can_access_peer)(const struct kvb_gpu_api *g, int dev, int peer,
			       int *ok);
	/* Let `dev` map `peer`'s memory; already enabled is success. */
	int (*enable_peer)(const struct kvb_gpu_api *g, int dev, int peer);

	/*
	 * dmabuf fd covering [ptr, ptr + size) rounded out to pages, and
	 * ptr's offset inside it. -ENOTSUP where the platform lacks it.
	 */
	int (*dmabuf_export)(const struct kvb_gpu_api *g, void *ptr,
			     uint64_t size, int *fd, uint64_t *offset);

	/* Name of the last runtime error on this thread ("" if none). */
	const char *(*errstr)(const struct kvb_gpu_api *g);
};

/*
 * Choose the process's backend: "host", "hip", "cuda", "auto" (hip, then
 * cuda) or NULL ($KVB_GPU_BACKEND, else "auto"). Idempotent for the same
 * choice; a different name after a successful choice returns -EBUSY.
 * Returns 0, or -ENODEV with `why` (if not NULL) saying why each candidate
 * was unavailable, -EINVAL for an unknown name. Thread-safe.
 */
int kvb_gpu_backend_init(const char *name, char *why, size_t why_len);

/* The chosen backend, or NULL before a successful init. Thread-safe. */
const struct kvb_gpu_api *kvb_gpu_backend(void);

/* Backend loaders (one table each, loaded once). -ENODEV + why if absent. */
int _kvb_gpu_host_load(const struct kvb_gpu_api **out, char *why,
		       size_t why_len);
int _kvb_gpu_hip_load(const struct kvb_gpu_api **out, char *why,
		      size_t why_len);
int _kvb_gpu_cuda_load(const struct kvb_gpu_api **out, char *why,
		       size_t why_len);

#endif /* KVB_GPU_API_H */

/* SPDX-License-Identifier: MIT */
/*
 * HIP and CUDA backends of the gpu ops table. Both runtimes export the same
 * calls under two prefixes with the same signatures and (for what we use)
 * the same constants, so one implementation serves both: a table of symbol
 * names resolved by dlopen/dlsym with the prefix of the runtime. No header of
 * either runtime is needed to build (gpu_hip_check.c checks our constants
 * against HIP's headers where they are installed).
 *
 * What differs is the pointer-range query and the dmabuf export: HIP has
 * both in its runtime (hipMemGetAddressRange, hipMemGetHandleForAddressRange
 * since ROCm 6), CUDA only in its driver API (libcuda.so.1:
 * cuMemGetAddressRange_v2, cuMemGetHandleForAddressRange since 11.7).
 */
#include "gpu_api.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *) ((char *) (ptr) -offsetof(type, member)))
#endif

typedef int rt_err; /* hipError_t / cudaError_t / CUresult: C enums */

/* Values shared by HIP and CUDA (checked against HIP in gpu_hip_check.c). */
#define RT_SUCCESS		    0
#define RT_ERR_INVALID_VALUE	    1
#define RT_ERR_OUT_OF_MEMORY	    2
#define RT_ERR_NO_DEVICE	    100
#define RT_ERR_NOT_READY	    600
#define RT_ERR_PEER_ALREADY_ENABLED 704
#define RT_ERR_NOT_SUPPORTED	    801
#define RT_MEMCPY_D2D		    3
#define RT_STREAM_NON_BLOCKING	    0x1u
#define RT_EVENT_DISABLE_TIMING	    0x2u
#define RT_DMABUF_FD                                            \
	0x1 /* hipMemRangeHandleTypeDmaBufFd, CU_..._DMA_BUF_FD \
	     */

struct rt_ipc {
	char reserved[KVB_GPU_IPC_SIZE];
};

struct gpu_rt {
	struct kvb_gpu_api api;
	const char *prefix;
	const char *const *libs;
	const char *libenv;    /* env var naming the library path */
	unsigned ipc_flags[2]; /* tried in order */
	pthread_mutex_t lock;
	int tried, rc;
	char why[192];
	void *lib, *drv;

	rt_err (*GetDeviceCount)(int *);
	rt_err (*SetDevice)(int);
	rt_err (*DeviceGetPCIBusId)(char *, int, int);
	rt_err (*DeviceGetByPCIBusId)(int *, const char *);
	rt_err (*Malloc)(void **, size_t);
	rt_err (*Free)(void *);
	rt_err (*Memcpy)(void *, const void *, size_t, int);
	rt_err (*IpcGetMemHandle)(struct rt_ipc *, void *);
	rt_err (*IpcOpenMemHandle)(void **, struct rt_ipc, unsigned);
	rt_err (*IpcCloseMemHandle)(void *);
	rt_err (*StreamCreateWithFlags)(void **, unsigned);
	rt_err (*StreamDestroy)(void *);
	rt_err (*StreamSynchronize)(void *);
	rt_err (*MemcpyAsync)(void *, const void *, size_t, int, void *);
	rt_err (*MemcpyPeerAsync)(void *, int, const void *, int, size_t,
				  void *);
	rt_err (*EventCreateWithFlags)(void **, unsigned);
	rt_err (*EventDestroy)(void *);
	rt_err (*EventRecord)(void *, void *);
	rt_err (*EventQuery)(void *);
	rt_err (*EventSynchronize)(void *);
	rt_err (*DeviceCanAccessPeer)(int *, int, int);
	rt_err (*DeviceEnablePeerAccess)(int, unsigned);
	const char *(*GetErrorName)(rt_err);
	rt_err (*GetLastError)(void);

	/* HIP runtime only (optional) */
	rt_err (*hipMemGetAddressRange)(void **, size_t *, void *);
	rt_err (*hipMemGetHandleForAddressRange)(void *, void *, size_t, int,
						 unsigned long long);
	/* CUDA driver (libcuda.so.1, optional) */
	rt_err (*cuMemGetAddressRange)(unsigned long long *, size_t *,
				       unsigned long long);
	rt_err (*cuMemGetHandleForAddressRange)(void *, unsigned long long,
						size_t, int,
						unsigned long long);
	rt_err (*cuGetErrorName)(rt_err, const char **);
};

struct rt_sym {
	size_t off;
	const char *name; /* without the prefix */
};

#define RT_SYM(f)                              \
	{                                      \
		offsetof(struct gpu_rt, f), #f \
	}
static const struct rt_sym rt_syms[] = {
	RT_SYM(GetDeviceCount),
	RT_SYM(SetDevice),
	RT_SYM(DeviceGetPCIBusId),
	RT_SYM(DeviceGetByPCIBusId),
	RT_SYM(Malloc),
	RT_SYM(Free),
	RT_SYM(Memcpy),
	RT_SYM(IpcGetMemHandle),
	RT_SYM(IpcOpenMemHandle),
	RT_SYM(IpcCloseMemHandle),
	RT_SYM(StreamCreateWithFlags),
	RT_SYM(StreamDestroy),
	RT_SYM(StreamSynchronize),
	RT_SYM(MemcpyAsync),
	RT_SYM(MemcpyPeerAsync),
	RT_SYM(EventCreateWithFlags),
	RT_SYM(EventDestroy),
	RT_SYM(EventRecord),
	RT_SYM(EventQuery),
	RT_SYM(EventSynchronize),
	RT_SYM(DeviceCanAccessPeer),
	RT_SYM(DeviceEnablePeerAccess),
	RT_SYM(GetErrorName),
	RT_SYM(GetLastError),
};

static __thread char rt_errbuf[160];

static struct gpu_rt *to_rt(const struct kvb_gpu_api *g)
{
	return container_of(g, struct gpu_rt, api);
}

static int rt_errno(rt_err e)
{
	switch (e) {
	case RT_SUCCESS:
		return 0;
	case RT_ERR_INVALID_VALUE:
		return -EINVAL;
	case RT_ERR_OUT_OF_MEMORY:
		return -ENOMEM;
	case RT_ERR_NO_DEVICE:
		return -ENODEV;
	case RT_ERR_NOT_READY:
		return -EAGAIN;
	case RT_ERR_NOT_SUPPORTED:
		return -ENOTSUP;
	default:
		return -EIO;
	}
}

/* Turn a runtime status into 0/-errno, remembering its name on failure. */
static int rt_check(struct gpu_rt *rt, rt_err e, const char *call)
{
	const char *name;

	if (e == RT_SUCCESS)
		return 0;
	name = rt->GetErrorName ? rt->GetErrorName(e) : NULL;
	snprintf(rt_errbuf, sizeof(rt_errbuf), "%s%s: %s (%d)", rt->prefix,
		 call, name ? name : "?", e);
	return rt_errno(e);
}

static int drv_check(struct gpu_rt *rt, rt_err e, const char *call)
{
	const char *name = NULL;

	if (e == RT_SUCCESS)
		return 0;
	if (rt->cuGetErrorName)
		rt->cuGetErrorName(e, &name);
	snprintf(rt_errbuf, sizeof(rt_errbuf), "%s: %s (%d)", call,
		 name ? name : "?", e);
	return rt_errno(e);
}

#define RT_CALL(rt, f, ...) rt_check(rt, (rt)->f(__VA_ARGS__), #f)

static void *rt_dlsym(void *lib, const char *prefix, const char *name)
{
	char full[96];

	snprintf(full, sizeof(full), "%s%s", prefix, name);
	return dlsym(lib, full);
}

static void *open_first(const char *const *libs, const char *env, char *tried,
			size_t len)
{
	const char *path = env ? getenv(env) : NULL;
	size_t used = 0;
	void *h;

	if (path && *path) {
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
		used += (size_t) snprintf(tried, len, "%s ", path);
	}
	for (; *libs; libs++) {
		h = dlopen(*libs, RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
		if (used < len)
			used += (size_t) snprintf(tried + used, len - used,
						  "%s ", *libs);
	}
	if (used && used <= len)
		tried[used - 1] = '\0';
	return NULL;
}

static int rt_do_load(struct gpu_rt *rt)
{
	char tried[160] = "";
	unsigned i;
	int n = 0, rc;
	rt_err e;

	rt->lib = open_first(rt->libs, rt->libenv, tried, sizeof(tried));
	if (!rt->lib) {
		snprintf(rt->why, sizeof(rt->why), "runtime not found (%s)",
			 tried);
		return -ENODEV;
	}
	for (i = 0; i < sizeof(rt_syms) / sizeof(rt_syms[0]); i++) {
		void *sym = rt_dlsym(rt->lib, rt->prefix, rt_syms[i].name);

		if (!sym) {
			snprintf(rt->why, sizeof(rt->why), "runtime lacks %s%s",
				 rt->prefix, rt_syms[i].name);
			rc = -ENODEV;
			goto err_close;
		}
		memcpy((char *) rt + rt_syms[i].off, &sym, sizeof(sym));
	}
	if (rt->api.kind == KVB_GPU_HIP) {
		*(void **) &rt->hipMemGetAddressRange =
			dlsym(rt->lib, "hipMemGetAddressRange");
		*(void **) &rt->hipMemGetHandleForAddressRange =
			dlsym(rt->lib, "hipMemGetHandleForAddressRange");
	} else {
		rt->drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
		if (rt->drv) {
			*(void **) &rt->cuMemGetAddressRange =
				dlsym(rt->drv, "cuMemGetAddressRange_v2");
			*(void **) &rt->cuMemGetHandleForAddressRange =
				dlsym(rt->drv, "cuMemGetHandleForAddressRange");
			*(void **) &rt->cuGetErrorName =
				dlsym(rt->drv, "cuGetErrorName");
		}
	}
	e = rt->GetDeviceCount(&n);
	if (e != RT_SUCCESS || n <= 0) {
		rt_check(rt, e, "GetDeviceCount");
		snprintf(rt->why, sizeof(rt->why), "no device (%s)",
			 e ? rt_errbuf : "0 devices");
		rc = -ENODEV;
		goto err_drv;
	}
	return 0;

err_drv:
	if (rt->drv)
		dlclose(rt->drv);
	rt->drv = NULL;
err_close:
	dlclose(rt->lib);
	rt->lib = NULL;
	return rc;
}

static int rt_load(struct gpu_rt *rt, const struct kvb_gpu_api **out, char *why,
		   size_t why_len)
{
	int rc;

	pthread_mutex_lock(&rt->lock);
	if (!rt->tried) {
		rt->rc = rt_do_load(rt);
		rt->tried = 1;
	}
	rc = rt->rc;
	if (rc && why && why_len)
		snprintf(why, why_len, "%s", rt->why);
	pthread_mutex_unlock(&rt->lock);
	if (rc == 0)
		*out = &rt->api;
	return rc;
}

static int rt_device_count(const struct kvb_gpu_api *g, int *n)
{
	return RT_CALL(to_rt(g), GetDeviceCount, n);
}

static int rt_set_device(const struct kvb_gpu_api *g, int dev)
{
	return RT_CALL(to_rt(g), SetDevice, dev);
}

static int rt_device_id(const struct kvb_gpu_api *g, int dev, char *buf,
			size_t len)
{
	return RT_CALL(to_rt(g), DeviceGetPCIBusId, buf, (int) len, dev);
}

static int rt_device_by_id(const struct kvb_gpu_api *g, const char *id,
			   int *dev)
{
	return RT_CALL(to_rt(g), DeviceGetByPCIBusId, dev, id);
}

static int rt_alloc(const struct kvb_gpu_api *g, int dev, uint64_t size,
		    void **ptr)
{
	struct gpu_rt *rt = to_rt(g);
	int rc = RT_CALL(rt, SetDevice, dev);

	return rc ? rc : RT_CALL(rt, Malloc, ptr, (size_t) size);
}

static int rt_free(const struct kvb_gpu_api *g, void *ptr)
{
	return RT_CALL(to_rt(g), Free, ptr);
}

static int rt_memcpy(const struct kvb_gpu_api *g, void *dst, const void *src,
		     uint64_t n, enum kvb_gpu_dir dir)
{
	return RT_CALL(to_rt(g), Memcpy, dst, src, (size_t) n, (int) dir);
}

static int rt_range(struct gpu_rt *rt, void *ptr, char **base, uint64_t *size)
{
	unsigned long long b = 0;
	size_t sz = 0;
	void *vb = NULL;
	int rc;

	if (rt->hipMemGetAddressRange) {
		rc = rt_check(rt, rt->hipMemGetAddressRange(&vb, &sz, ptr),
			      "MemGetAddressRange");
		b = (unsigned long long) (uintptr_t) vb;
	} else if (rt->cuMemGetAddressRange) {
		/* make sure the primary context exists and is current */
		rc = RT_CALL(rt, Free, NULL);
		if (!rc)
			rc = drv_check(
				rt,
				rt->cuMemGetAddressRange(
					&b, &sz,
					(unsigned long long) (uintptr_t) ptr),
				"cuMemGetAddressRange");
	} else {
		snprintf(rt_errbuf, sizeof(rt_errbuf),
			 "no pointer-range query (%s)",
			 rt->api.kind == KVB_GPU_CUDA ? "libcuda.so.1 missing"
						      : "runtime lacks it");
		return -ENOTSUP;
	}
	if (rc)
		return rc;
	*base = (char *) (uintptr_t) b;
	*size = sz;
	return 0;
}

static int rt_ipc_get(const struct kvb_gpu_api *g, void *ptr,
		      struct kvb_gpu_ipc *h, uint64_t *offset,
		      uint64_t *alloc_size)
{
	struct gpu_rt *rt = to_rt(g);
	struct rt_ipc ih;
	uint64_t size;
	char *base;
	int rc;

	rc = rt_range(rt, ptr, &base, &size);
	if (rc)
		return rc;
	/* handles are taken on the allocation base; the offset travels */
	rc = RT_CALL(rt, IpcGetMemHandle, &ih, base);
	if (rc)
		return rc;
	memcpy(h->b, ih.reserved, sizeof(h->b));
	*offset = (uint64_t) ((char *) ptr - base);
	*alloc_size = size;
	return 0;
}

static int rt_ipc_open(const struct kvb_gpu_api *g, int dev,
		       const struct kvb_gpu_ipc *h, uint64_t alloc_size,
		       void **base)
{
	struct gpu_rt *rt = to_rt(g);
	struct rt_ipc ih;
	rt_err e = RT_ERR_INVALID_VALUE;
	unsigned i;
	int rc;

	rc = RT_CALL(rt, SetDevice, dev);
	if (rc)
		return rc;
	memcpy(ih.reserved, h->b, sizeof(ih.reserved));
	/* HIP 5 wants flags 0 and HIP 6 its lazy-peer flag (1): try both */
	for (i = 0; i < 2 && e == RT_ERR_INVALID_VALUE; i++) {
		e = rt->IpcOpenMemHandle(base, ih, rt->ipc_flags[i]);
		if (rt->ipc_flags[1] == rt->ipc_flags[0])
			break;
	}
	rc = rt_check(rt, e, "IpcOpenMemHandle");
	if (rc)
		return rc;
	/*
	 * alloc_size comes from the worker, which could claim more than the
	 * handle's allocation: what the broker then touches at base + offset
	 * must be inside what the runtime mapped.
	 */
	{
		char *rb;
		uint64_t rs;

		rc = rt_range(rt, *base, &rb, &rs);
		if (!rc && (rb != (char *) *base || rs < alloc_size)) {
			snprintf(rt_errbuf, sizeof(rt_errbuf),
				 "ipc handle maps %llu bytes, the worker "
				 "declared %llu",
				 (unsigned long long) rs,
				 (unsigned long long) alloc_size);
			rc = -EINVAL;
		}
		if (rc) {
			(void) RT_CALL(rt, IpcCloseMemHandle, *base);
			*base = NULL;
		}
	}
	return rc;
}

static int rt_ipc_close(const struct kvb_gpu_api *g, void *base)
{
	return RT_CALL(to_rt(g), IpcCloseMemHandle, base);
}

static int rt_stream_create(const struct kvb_gpu_api *g, int dev, void **s)
{
	struct gpu_rt *rt = to_rt(g);
	int rc = RT_CALL(rt, SetDevice, dev);

	return rc ? rc
		  : RT_CALL(rt, StreamCreateWithFlags, s,
			    RT_STREAM_NON_BLOCKING);
}

static int rt_stream_destroy(const struct kvb_gpu_api *g, void *s)
{
	return RT_CALL(to_rt(g), StreamDestroy, s);
}

static int rt_stream_sync(const struct kvb_gpu_api *g, void *s)
{
	return RT_CALL(to_rt(g), StreamSynchronize, s);
}

static int rt_copy_async(const struct kvb_gpu_api *g, void *dst, int dst_dev,
			 const void *src, int src_dev, uint64_t n, void *s)
{
	struct gpu_rt *rt = to_rt(g);

	if (dst_dev == src_dev)
		return RT_CALL(rt, MemcpyAsync, dst, src, (size_t) n,
			       RT_MEMCPY_D2D, s);
	return RT_CALL(rt, MemcpyPeerAsync, dst, dst_dev, src, src_dev,
		       (size_t) n, s);
}

static int rt_event_create(const struct kvb_gpu_api *g, int dev, void **e)
{
	struct gpu_rt *rt = to_rt(g);
	int rc = RT_CALL(rt, SetDevice, dev);

	return rc ? rc
		  : RT_CALL(rt, EventCreateWithFlags, e,
			    RT_EVENT_DISABLE_TIMING);
}

static int rt_event_destroy(const struct kvb_gpu_api *g, void *e)
{
	return RT_CALL(to_rt(g), EventDestroy, e);
}

static int rt_event_record(const struct kvb_gpu_api *g, void *e, void *s)
{
	return RT_CALL(to_rt(g), EventRecord, e, s);
}

static int rt_event_query(const struct kvb_gpu_api *g, void *e)
{
	struct gpu_rt *rt = to_rt(g);
	rt_err r = rt->EventQuery(e);

	if (r == RT_ERR_NOT_READY)
		return -EAGAIN;
	/* any failure of the work before the event: the batch failed */
	return rt_check(rt, r, "EventQuery") ? -EIO : 0;
}

static int rt_event_sync(const struct kvb_gpu_api *g, void *e)
{
	return RT_CALL(to_rt(g), EventSynchronize, e) ? -EIO : 0;
}

static int rt_can_access_peer(const struct kvb_gpu_api *g, int dev, int peer,
			      int *ok)
{
	return RT_CALL(to_rt(g), DeviceCanAccessPeer, ok, dev, peer);
}

static int rt_enable_peer(const struct kvb_gpu_api *g, int dev, int peer)
{
	struct gpu_rt *rt = to_rt(g);
	rt_err e;
	int rc;

	rc = RT_CALL(rt, SetDevice, dev);
	if (rc)
		return rc;
	e = rt->DeviceEnablePeerAccess(peer, 0);
	if (e == RT_ERR_PEER_ALREADY_ENABLED) {
		rt->GetLastError(); /* clear the sticky-until-read status */
		return 0;
	}
	return rt_check(rt, e, "DeviceEnablePeerAccess");
}

static int rt_dmabuf_export(const struct kvb_gpu_api *g, void *ptr,
			    uint64_t size, int *fd, uint64_t *offset)
{
	struct gpu_rt *rt = to_rt(g);
	uintptr_t pg = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t) ptr & ~(pg - 1);
	uintptr_t end = ((uintptr_t) ptr + size + pg - 1) & ~(pg - 1);
	int rc, dfd = -1;

	if (rt->hipMemGetHandleForAddressRange) {
		rc = rt_check(rt,
			      rt->hipMemGetHandleForAddressRange(
				      &dfd, (void *) start, end - start,
				      RT_DMABUF_FD, 0),
			      "MemGetHandleForAddressRange");
	} else if (rt->cuMemGetHandleForAddressRange) {
		rc = RT_CALL(rt, Free, NULL);
		if (!rc)
			rc = drv_check(rt,
				       rt->cuMemGetHandleForAddressRange(
					       &dfd, start, end - start,
					       RT_DMABUF_FD, 0),
				       "cuMemGetHandleForAddressRange");
	} else {
		snprintf(rt_errbuf, sizeof(rt_errbuf),
			 "%s: no dmabuf export in this runtime/driver",
			 rt->prefix);
		return -ENOTSUP;
	}
	if (rc)
		return rc;
	*fd = dfd;
	*offset = (uint64_t) ((uintptr_t) ptr - start);
	return 0;
}

static const char *rt_errstr(const struct kvb_gpu_api *g)
{
	return rt_errbuf;
}

#define RT_API(n, k)                                                         \
	{                                                                    \
		.name = n, .kind = k, .device_count = rt_device_count,       \
		.set_device = rt_set_device, .device_id = rt_device_id,      \
		.device_by_id = rt_device_by_id, .alloc = rt_alloc,          \
		.free = rt_free, .memcpy = rt_memcpy, .ipc_get = rt_ipc_get, \
		.ipc_open = rt_ipc_open, .ipc_close = rt_ipc_close,          \
		.stream_create = rt_stream_create,                           \
		.stream_destroy = rt_stream_destroy,                         \
		.stream_sync = rt_stream_sync, .copy_async = rt_copy_async,  \
		.event_create = rt_event_create,                             \
		.event_destroy = rt_event_destroy,                           \
		.event_record = rt_event_record,                             \
		.event_query = rt_event_query, .event_sync = rt_event_sync,  \
		.can_access_peer = rt_can_access_peer,                       \
		.enable_peer = rt_enable_peer,                               \
		.dmabuf_export = rt_dmabuf_export, .errstr = rt_errstr,      \
	}

static const char *const hip_libs[] = {"libamdhip64.so", "libamdhip64.so.6",
				       "libamdhip64.so.5",
				       "/opt/rocm/lib/libamdhip64.so", NULL};
static const char *const cuda_libs[] = {
	"libcudart.so",
	"libcudart.so.13",
	"libcudart.so.12",
	"libcudart.so.11.0",
	"libcudart.so.11",
	"/usr/local/cuda/lib64/libcudart.so",
	NULL,
};

static struct gpu_rt hip_rt = {
	.api = RT_API("hip", KVB_GPU_HIP),
	.prefix = "hip",
	.libs = hip_libs,
	.libenv = "KVB_HIP_LIB",
	.ipc_flags = {0, 1},
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

static struct gpu_rt cuda_rt = {
	.api = RT_API("cuda", KVB_GPU_CUDA),
	.prefix = "cuda",
	.libs = cuda_libs,
	.libenv = "KVB_CUDART_LIB",
	.ipc_flags = {1, 1}, /* cudaIpcMemLazyEnablePeerAccess */
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

int _kvb_gpu_hip_load(const struct kvb_gpu_api **out, char *why, size_t why_len)
{
	return rt_load(&hip_rt, out, why, why_len);
}

int _kvb_gpu_cuda_load(const struct kvb_gpu_api **out, char *why,
		       size_t why_len)
{
	return rt_load(&cuda_rt, out, why, why_len);
}

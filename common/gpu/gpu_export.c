/* SPDX-License-Identifier: MIT */
/*
 * Export/import of GPU regions between processes (see gpu_export.h).
 *
 * The broker maps each exported allocation once: runtimes refuse or
 * misbehave when one process opens the same IPC handle twice, and workers
 * typically register many regions (layers) of one allocation. Imports are
 * kept in a small list keyed by the handle bytes and reference counted.
 */
#include "gpu_api.h"
#include "gpu_export.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gpu_import {
	struct gpu_import *next;
	struct kvb_gpu_ipc ipc;
	int dev;
	char *base;
	uint64_t alloc_size;
	unsigned refs;
};

static pthread_mutex_t imp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_import *imports;
static __thread char exp_err[192];

static int fail(int rc, const char *what, const struct kvb_gpu_api *g)
{
	snprintf(exp_err, sizeof(exp_err), "%s: %s%s%s", what, strerror(-rc),
		 g ? "; " : "", g ? g->errstr(g) : "");
	return rc;
}

const char *kvb_gpu_export_strerror(void)
{
	return exp_err;
}

static int backend(const struct kvb_gpu_api **g)
{
	char why[160];
	int rc;

	*g = kvb_gpu_backend();
	if (*g)
		return 0;
	rc = kvb_gpu_backend_init(NULL, why, sizeof(why));
	if (rc) {
		snprintf(exp_err, sizeof(exp_err), "gpu backend: %s", why);
		return rc;
	}
	*g = kvb_gpu_backend();
	return 0;
}

int kvb_gpu_export(void *dev_ptr, uint64_t size, int device,
		   struct kvb_gpu_handle *out)
{
	const struct kvb_gpu_api *g;
	struct kvb_gpu_ipc ipc;
	uint64_t off, asz;
	int rc;

	if (!dev_ptr || !size || !out)
		return fail(-EINVAL, "export", NULL);
	rc = backend(&g);
	if (rc)
		return rc;
	rc = g->set_device(g, device);
	if (rc)
		return fail(rc, "export: set device", g);
	rc = g->ipc_get(g, dev_ptr, &ipc, &off, &asz);
	if (rc)
		return fail(rc == -ENOTSUP ? rc : -EINVAL, "export: ipc handle",
			    g);
	if (off > asz || size > asz - off)
		return fail(-EINVAL, "export: region beyond its allocation",
			    NULL);
	memset(out, 0, sizeof(*out));
	out->magic = KVB_GPU_HANDLE_MAGIC;
	out->version = KVB_GPU_HANDLE_VERSION;
	out->backend = (uint16_t) g->kind;
	out->device = device;
	out->pid = (uint32_t) getpid();
	out->size = size;
	out->offset = off;
	out->alloc_size = asz;
	if (g->device_id(g, device, out->bus_id, sizeof(out->bus_id)))
		out->bus_id[0] = '\0';
	out->bus_id[sizeof(out->bus_id) - 1] = '\0';
	memcpy(out->ipc, ipc.b, sizeof(out->ipc));
	return 0;
}

static int handle_check(const struct kvb_gpu_handle *h,
			const struct kvb_gpu_api *g)
{
	if (!h || h->magic != KVB_GPU_HANDLE_MAGIC)
		return fail(-EINVAL, "import: not a gpu handle", NULL);
	if (h->version != KVB_GPU_HANDLE_VERSION || h->backend != g->kind)
		return fail(-EPROTO, "import: other version or gpu backend",
			    NULL);
	if (!h->size || h->offset > h->alloc_size ||
	    h->size > h->alloc_size - h->offset)
		return fail(-EINVAL, "import: region beyond its allocation",
			    NULL);
	return 0;
}

int kvb_gpu_import_device(const struct kvb_gpu_handle *h, int *device)
{
	const struct kvb_gpu_api *g;
	char id[KVB_GPU_BUS_ID_LEN + 1];
	int rc, n = 0;

	rc = backend(&g);
	if (rc)
		return rc;
	rc = handle_check(h, g);
	if (rc)
		return rc;
	memcpy(id, h->bus_id, KVB_GPU_BUS_ID_LEN);
	id[KVB_GPU_BUS_ID_LEN] = '\0';
	if (id[0] && g->device_by_id(g, id, device) == 0)
		return 0;
	if (g->device_count(g, &n) == 0 && h->device >= 0 && h->device < n) {
		*device = h->device;
		return 0;
	}
	return fail(-ENODEV, "import: no such device here", g);
}

int kvb_gpu_import(const struct kvb_gpu_handle *h, void **broker_ptr)
{
	const struct kvb_gpu_api *g;
	struct gpu_import *im;
	void *base;
	int rc, dev;

	rc = kvb_gpu_import_device(h, &dev);
	if (rc)
		return rc;
	g = kvb_gpu_backend();
	pthread_mutex_lock(&imp_lock);
	for (im = imports; im; im = im->next)
		if (im->dev == dev &&
		    !memcmp(im->ipc.b, h->ipc, sizeof(h->ipc)))
			break;
	if (im) {
		/* the same IPC handle is the same allocation: a handle that
		 * says otherwise would point past the mapping */
		if (h->alloc_size != im->alloc_size) {
			rc = fail(-EINVAL,
				  "import: allocation size differs from the "
				  "same handle's earlier import",
				  NULL);
			goto out;
		}
		im->refs++;
		*broker_ptr = im->base + h->offset;
		rc = 0;
		goto out;
	}
	im = calloc(1, sizeof(*im));
	if (!im) {
		rc = fail(-ENOMEM, "import", NULL);
		goto out;
	}
	memcpy(im->ipc.b, h->ipc, sizeof(im->ipc.b));
	rc = g->ipc_open(g, dev, &im->ipc, h->alloc_size, &base);
	if (rc) {
		free(im);
		rc = fail(rc, "import: open ipc handle", g);
		goto out;
	}
	im->dev = dev;
	im->base = base;
	im->alloc_size = h->alloc_size;
	im->refs = 1;
	im->next = imports;
	imports = im;
	*broker_ptr = im->base + h->offset;
out:
	pthread_mutex_unlock(&imp_lock);
	return rc;
}

int kvb_gpu_unimport(void *broker_ptr)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	struct gpu_import **pp, *im;
	char *p = broker_ptr;
	int rc = 0;

	pthread_mutex_lock(&imp_lock);
	for (pp = &imports; (im = *pp); pp = &im->next)
		if (p >= im->base && p < im->base + im->alloc_size)
			break;
	if (!im) {
		pthread_mutex_unlock(&imp_lock);
		return fail(-ENOENT, "unimport: not an import", NULL);
	}
	if (--im->refs == 0) {
		*pp = im->next;
		rc = g->ipc_close(g, im->base);
		if (rc)
			fail(rc, "unimport: close ipc handle", g);
		free(im);
	}
	pthread_mutex_unlock(&imp_lock);
	return rc;
}

int kvb_gpu_dmabuf_fd(void *dev_ptr, uint64_t size, int *fd, uint64_t *offset)
{
	const struct kvb_gpu_api *g;
	int rc;

	if (!dev_ptr || !size)
		return fail(-EINVAL, "dmabuf", NULL);
	rc = backend(&g);
	if (rc)
		return rc;
	rc = g->dmabuf_export(g, dev_ptr, size, fd, offset);
	if (rc)
		return fail(rc, "dmabuf export", g);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The broker's side of GPU regions: open the gpu transport next to local,
 * import a worker's exported handle (IPC) into a device pointer of ours,
 * drop it when the region goes; a dmabuf fd of it for the NIC. Built
 * without bridge/gpu, every call says so (-ENODEV) and GPU registrations
 * are refused.
 */
#include "broker.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

#ifdef KVB_HAVE_GPU
#include "gpu/gpu_export.h"

int kvb_broker_gpu_open(struct kvb_broker *b, char *why, size_t why_len)
{
	struct kvb_transport_params p = {
		.gpu_streams = b->opt.gpu_streams,
		.post_batch_size = b->opt.post_batch_size,
	};

	const struct kvb_transport_ops *ops = kvb_transport_find("gpu");

	if (!ops) {
		snprintf(why, why_len, "built without the gpu transport");
		return -ENODEV;
	}
	return ops->open(&p, &b->trs[KVB_TS_GPU], why, why_len);
}

int kvb_broker_gpu_import(struct kvb_region_ent *r, const void *payload,
			  size_t len)
{
	const struct kvb_gpu_handle *h = payload;
	void *ptr;
	int dev, rc;

	if (len != sizeof(*h) || h->magic != KVB_GPU_HANDLE_MAGIC)
		return -EINVAL;
	if (h->size != r->mr.len)
		return -EINVAL;
	rc = kvb_gpu_import(h, &ptr);
	if (rc) {
		log_warn_rl("gpu region import failed: %s",
			    kvb_gpu_export_strerror());
		return rc;
	}
	if (kvb_gpu_import_device(h, &dev))
		dev = h->device;
	r->mr.addr = ptr;
	r->mr.gpu_device = dev;
	r->mr.kind = KVB_MEM_GPU;
	/* the exporter's PCI bus id names the same GPU node-wide */
	memcpy(r->mr.pci, h->bus_id, sizeof(r->mr.pci) - 1);
	r->mr.pci[sizeof(r->mr.pci) - 1] = '\0';
	return 0;
}

void kvb_broker_gpu_unimport(struct kvb_region_ent *r)
{
	if (r->mr.addr)
		kvb_gpu_unimport(r->mr.addr);
}

int kvb_broker_gpu_dmabuf(const struct kvb_region_ent *r, int *fd,
			  uint64_t *offset, char *why, size_t why_len)
{
	int rc = kvb_gpu_dmabuf_fd(r->mr.addr, r->mr.len, fd, offset);

	if (rc)
		snprintf(why, why_len, "%s", kvb_gpu_export_strerror());
	return rc;
}
#else
int kvb_broker_gpu_open(struct kvb_broker *b, char *why, size_t why_len)
{
	snprintf(why, why_len, "built without bridge/gpu");
	return -ENODEV;
}

int kvb_broker_gpu_import(struct kvb_region_ent *r, const void *payload,
			  size_t len)
{
	return -ENODEV;
}

void kvb_broker_gpu_unimport(struct kvb_region_ent *r)
{
}

int kvb_broker_gpu_dmabuf(const struct kvb_region_ent *r, int *fd,
			  uint64_t *offset, char *why, size_t why_len)
{
	snprintf(why, why_len, "built without bridge/gpu");
	return -ENODEV;
}
#endif

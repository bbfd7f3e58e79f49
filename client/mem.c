/* SPDX-License-Identifier: MIT */
/*
 * libkvbroker: memory the broker maps (kvb_mem_*): allocation, memfds and
 * GPU memory registered, lookup of peers' regions, KV geometry. See
 * include/kvbroker/kvbroker.h.
 */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctl.h"
#ifdef KVB_HAVE_GPU
#include "gpu/gpu_export.h"
#endif

static int mem_register(struct kvb_ctx *ctx, struct kvb_msg_mem_reg *req,
			int fd, struct kvb_region *out)
{
	struct kvb_msg_mem_reply rep;
	int rc;

	rc = kvb_client_call(ctx, &req->h, fd >= 0 ? &fd : NULL,
			     fd >= 0 ? 1 : 0, &rep, sizeof(rep), sizeof(rep));
	if (rc)
		return rc;
	out->id = rep.region;
	out->flags = rep.flags;
	out->size = rep.size;
	return 0;
}

int kvb_mem_alloc(struct kvb_ctx *ctx, uint64_t size, uint32_t flags,
		  uint64_t key, struct kvb_region *out)
{
	struct kvb_msg_mem_reg req;
	void *addr;
	int fd, rc;

	if (!ctx || !out || size == 0 ||
	    (flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	fd = memfd_create("kvb-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* sealed against shrinking, which the broker requires: a truncated
	 * file under its mapping would be a SIGBUS in the broker */
	if (ftruncate(fd, (off_t) size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		rc = -errno;
		goto err_fd;
	}
	addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED) {
		rc = -errno;
		goto err_fd;
	}
	/* huge pages where shmem THP is `advise`: fewer TLB misses for the
	 * copies; EINVAL on a kernel without THP is no error */
	(void) madvise(addr, size, MADV_HUGEPAGE);
	kvb_msg_init(&req.h, KVB_MSG_MEM_REG, sizeof(req));
	req.size = size;
	req.key = key;
	req.flags = flags;
	rc = mem_register(ctx, &req, fd, out);
	if (rc)
		goto err_map;
	close(fd);
	out->addr = addr;
	out->gpu = 0;
	out->alias = 0;
	return 0;

err_map:
	munmap(addr, size);
err_fd:
	close(fd);
	return rc;
}

int kvb_mem_register_fd(struct kvb_ctx *ctx, int fd, uint64_t fd_offset,
			uint64_t size, uint32_t flags, uint64_t key,
			struct kvb_region *out)
{
	struct kvb_msg_mem_reg req;
	int rc;

	if (!ctx || !out || fd < 0 || size == 0 ||
	    (flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	/* the broker takes only files that cannot shrink under its mapping:
	 * seal it where the file allows (a memfd with MFD_ALLOW_SEALING);
	 * where not, the broker's refusal (-EPERM) says so */
	(void) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	kvb_msg_init(&req.h, KVB_MSG_MEM_REG, sizeof(req));
	req.size = size;
	req.fd_offset = fd_offset;
	req.key = key;
	req.flags = flags;
	rc = mem_register(ctx, &req, fd, out);
	if (!rc) {
		out->addr = NULL;
		out->gpu = 0;
		out->alias = 0;
	}
	return rc;
}

int kvb_mem_register_gpu(struct kvb_ctx *ctx, void *dev_ptr, uint64_t size,
			 int device, uint32_t flags, uint64_t key,
			 struct kvb_region *out)
{
#ifdef KVB_HAVE_GPU
	struct {
		struct kvb_msg_mem_reg req;
		struct kvb_gpu_handle h;
	} m;
	int rc;

	if (!ctx || !out || !dev_ptr || size == 0 ||
	    (flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	kvb_msg_init(&m.req.h, KVB_MSG_MEM_REG, sizeof(m));
	rc = kvb_gpu_export(dev_ptr, size, device, &m.h);
	if (rc)
		return rc;
	m.req.size = size;
	m.req.key = key;
	m.req.flags = flags;
	m.req.kind = 1; /* gpu handle in the payload */
	m.req.gpu_device = device;
	m.req.payload_len = sizeof(m.h);
	rc = mem_register(ctx, &m.req, -1, out);
	if (!rc) {
		out->addr = dev_ptr;
		out->gpu = 1;
		out->alias = 0;
	}
	return rc;
#else
	return -ENODEV; /* this build has no gpu support */
#endif
}

int kvb_mem_free(struct kvb_ctx *ctx, struct kvb_region *r)
{
	struct kvb_msg_mem_dereg req;
	struct kvb_msg_hdr rep;
	int rc;

	if (!ctx || !r)
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_MEM_DEREG, sizeof(req));
	req.region = r->id;
	rc = kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	/* our mapping goes whatever the broker said: it is ours. Not when
	 * the broker kept the region (-EBUSY: aliases of it live), and an
	 * alias has no mapping of its own (its parent's holds it) */
	if (rc == -ENOENT || rc == -EBUSY)
		return rc;
	if (r->addr && !r->gpu && !r->alias)
		munmap(r->addr, r->size);
	r->addr = NULL;
	return rc;
}

int kvb_mem_alias(struct kvb_ctx *ctx, const struct kvb_region *parent,
		  uint64_t offset, uint64_t size, uint32_t flags, uint64_t key,
		  struct kvb_region *out)
{
	struct kvb_msg_mem_alias req;
	struct kvb_msg_mem_reply rep;
	int rc;

	if (!ctx || !parent || !out || size == 0 || offset > parent->size ||
	    size > parent->size - offset ||
	    (flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	if (parent->gpu || parent->alias)
		return -EOPNOTSUPP;
	kvb_msg_init(&req.h, KVB_MSG_MEM_ALIAS, sizeof(req));
	req.parent = parent->id;
	req.flags = flags;
	req.offset = offset;
	req.size = size;
	req.key = key;
	rc = kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	if (rc)
		return rc;
	out->id = rep.region;
	out->flags = rep.flags;
	out->size = rep.size;
	out->addr = parent->addr ? (char *) parent->addr + offset : NULL;
	out->gpu = 0;
	out->alias = 1;
	return 0;
}

int kvb_mem_lookup(struct kvb_ctx *ctx, enum kvb_role role, uint32_t dp_rank,
		   uint32_t tp_rank, uint64_t key,
		   struct kvb_remote_region *out)
{
	struct kvb_msg_mem_lookup req;
	struct kvb_msg_mem_reply rep;
	int rc;

	if (!ctx || !out)
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_MEM_LOOKUP, sizeof(req));
	req.role = role;
	req.dp_rank = dp_rank;
	req.tp_rank = tp_rank;
	req.key = key;
	rc = kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	if (rc)
		return rc;
	out->id = rep.region;
	out->flags = rep.flags;
	out->size = rep.size;
	return 0;
}

int kvb_mem_set_kv(struct kvb_ctx *ctx, uint32_t region, uint32_t layer,
		   const struct kvb_kv_geometry *g)
{
	struct kvb_msg_mem_kv req;
	struct kvb_msg_hdr rep;

	if (!ctx || !g)
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_MEM_KV, sizeof(req));
	req.region = region;
	req.layer = layer;
	req.layout = g->layout;
	req.num_blocks = g->num_blocks;
	req.block_size = g->block_size;
	req.num_heads = g->num_heads;
	req.head_dim = g->head_dim;
	req.elem_size = g->elem_size;
	return kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			       sizeof(rep));
}

/* SPDX-License-Identifier: MIT */
/* Worker control requests about memory: registering a region (a memfd or
 * GPU memory), an alias over part of one, freeing, looking one up
 * (MEM_REG, MEM_ALIAS, MEM_DEREG, MEM_LOOKUP; shm/proto.h). */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"
#include "log.h"
#include "worker_priv.h"

/*
 * A host region's file must hold the whole region now and be unable to
 * shrink later (F_SEAL_SHRINK): the broker copies in and out of its mapping,
 * and a mapped page past the end of the file is a SIGBUS that would take
 * the whole broker down. 0, -EINVAL (not a regular file, or too short) or
 * -EPERM (not sealed); refusals are logged and counted as rejected.
 */
static int host_fd_check(struct kvb_broker *b, struct kvb_worker *w, int fd,
			 uint64_t off, uint64_t size)
{
	const char *why = NULL;
	struct stat st;
	int seals, rc = -EINVAL;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		why = "not a regular file (memfd)";
	else if ((uint64_t) st.st_size < off ||
		 (uint64_t) st.st_size - off < size)
		why = "region runs past the end of its file";
	else if ((seals = fcntl(fd, F_GET_SEALS)) < 0 ||
		 !(seals & F_SEAL_SHRINK)) {
		why = "file not sealed against shrinking (memfd with "
		      "MFD_ALLOW_SEALING and F_SEAL_SHRINK)";
		rc = -EPERM;
	}
	if (!why)
		return 0;
	kvb_log_rl_keyed(why, KVB_LOG_WARN,
			 "worker %u: region of %llu bytes at offset %llu "
			 "refused: %s",
			 w->id, (unsigned long long) size,
			 (unsigned long long) off, why);
	b->st.messages_rejected++;
	return rc;
}

static int mem_reg(struct kvb_broker *b, struct kvb_worker *w,
		   const struct kvb_msg_mem_reg *m, int fd,
		   struct kvb_msg_mem_reply *rep)
{
	struct kvb_transport *t;
	struct kvb_region_ent *r;
	void *addr = NULL;
	int rc;

	if (m->size == 0 || m->size > (1ull << 40) ||
	    (m->flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	if (m->kind == KVB_MEM_HOST) {
		if (fd < 0 || (m->fd_offset & 4095))
			return -EINVAL;
		rc = host_fd_check(b, w, fd, m->fd_offset, m->size);
		if (rc)
			return rc;
		addr = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_SHARED,
			    fd, (off_t) m->fd_offset);
		if (addr == MAP_FAILED)
			return -errno;
		/* map the region's huge pages as such (shmem THP `advise`),
		 * as kvb_mem_alloc() asks on the worker's side */
		(void) madvise(addr, m->size, MADV_HUGEPAGE);
	} else if (m->kind != KVB_MEM_GPU || fd >= 0) {
		return -EINVAL;
	} else if (!b->trs[KVB_TS_GPU]) {
		log_warn_rl("worker %u: GPU region refused: no gpu transport "
			    "(start with --transport gpu or auto on a GPU "
			    "node)",
			    w->id);
		return -ENODEV;
	}
	r = kvb_region_alloc(&b->regions);
	if (!r) {
		rc = -ENOSPC;
		goto err_map;
	}
	r->mr.kind = KVB_MEM_HOST;
	r->mr.addr = addr;
	r->mr.len = m->size;
	r->mr.flags = m->flags;
	r->map_base = addr;
	r->map_len = addr ? m->size : 0;
	r->owner = w->id;
	r->owner_role = w->role;
	r->owner_dp = w->dp_rank;
	r->owner_tp = w->tp_rank;
	r->key = m->key;
	if (m->kind == KVB_MEM_GPU) {
		rc = kvb_broker_gpu_import(r, m + 1, m->payload_len);
		if (rc)
			goto err_region;
	}
	t = kvb_tr_for(b, r->mr.kind);
	rc = t->ops->reg_mr(t, &r->mr);
	if (rc)
		goto err_import;
	kvb_hook_region_added(b, r);
	rep->region = r->mr.id;
	rep->flags = r->mr.flags;
	rep->size = r->mr.len;
	log_dbg("worker %u: %s region %#x %llu bytes key %llu flags %#x", w->id,
		r->mr.kind == KVB_MEM_GPU ? "gpu" : "host", r->mr.id,
		(unsigned long long) m->size, (unsigned long long) m->key,
		m->flags);
	return 0;

err_import:
	if (r->mr.kind == KVB_MEM_GPU)
		kvb_broker_gpu_unimport(r);
err_region:
	kvb_region_release(&b->regions, r);
err_map:
	if (addr)
		munmap(addr, m->size);
	return rc;
}

/* MEM_ALIAS: a region of w over part of its host region m->parent, on the
 * parent's mapping (which the alias holds a reference of). */
static int mem_alias(struct kvb_broker *b, struct kvb_worker *w,
		     const struct kvb_msg_mem_alias *m,
		     struct kvb_msg_mem_reply *rep)
{
	struct kvb_region_ent *p = kvb_region_get(&b->regions, m->parent);
	struct kvb_region_ent *r;
	struct kvb_transport *t;
	int rc;

	if (m->size == 0 ||
	    (m->flags & ~(KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
		return -EINVAL;
	if (!p || p->dead || p->owner != w->id)
		return -ENOENT;
	if (p->mr.kind != KVB_MEM_HOST || p->parent)
		return -EOPNOTSUPP;
	if (m->offset > p->mr.len || m->size > p->mr.len - m->offset)
		return -EINVAL;
	r = kvb_region_alloc(&b->regions);
	if (!r)
		return -ENOSPC;
	r->mr.kind = KVB_MEM_HOST;
	r->mr.addr = (char *) p->mr.addr + m->offset;
	r->mr.len = m->size;
	r->mr.flags = m->flags;
	r->owner = w->id;
	r->owner_role = w->role;
	r->owner_dp = w->dp_rank;
	r->owner_tp = w->tp_rank;
	r->key = m->key;
	t = kvb_tr_for(b, r->mr.kind);
	rc = t->ops->reg_mr(t, &r->mr);
	if (rc) {
		kvb_region_release(&b->regions, r);
		return rc;
	}
	r->parent = p->mr.id;
	kvb_region_hold(p); /* put when the alias is unmapped */
	p->naliases++;
	kvb_hook_region_added(b, r);
	rep->region = r->mr.id;
	rep->flags = r->mr.flags;
	rep->size = r->mr.len;
	log_dbg("worker %u: region %#x: %llu bytes at %llu of region %#x",
		w->id, r->mr.id, (unsigned long long) m->size,
		(unsigned long long) m->offset, p->mr.id);
	return 0;
}

static int mem_lookup(struct kvb_broker *b, const struct kvb_msg_mem_lookup *m,
		      struct kvb_msg_mem_reply *rep)
{
	for (uint32_t s = 1; s < KVB_MAX_REGIONS; s++) {
		struct kvb_region_ent *r = &b->regions.v[s];

		if (!r->used || r->dead || r->owner_role != m->role ||
		    r->owner_dp != m->dp_rank || r->owner_tp != m->tp_rank ||
		    r->key != m->key ||
		    !(r->mr.flags &
		      (KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)))
			continue;
		rep->region = r->mr.id;
		rep->flags = r->mr.flags;
		rep->size = r->mr.len;
		return 0;
	}
	return -ENOENT;
}

void kvb_ctl_mem_reg(struct kvb_broker *b, struct kvb_worker *w,
		     struct ctl_req *q)
{
	struct kvb_msg_mem_reply rep = {.h.type = KVB_MSG_MEM_REG};
	const struct kvb_msg_mem_reg *reg = &q->m->reg;
	int fd = q->nfds ? q->fds[0] : -1;
	int rc;

	for (unsigned i = 1; i < q->nfds; i++)
		close(q->fds[i]);
	if (q->n < sizeof(*reg) || q->n != sizeof(*reg) + reg->payload_len) {
		if (fd >= 0)
			close(fd);
		b->st.mem_reg_refused++;
		kvb_ctl_reject(b, w, "control message of the wrong size");
		return;
	}
	rc = mem_reg(b, w, reg, fd, &rep);
	if (fd >= 0)
		close(fd);
	if (rc) {
		b->st.mem_reg_refused++;
		log_warn_rl(
			"worker %u: region of %llu bytes (kind %u) refused: "
			"%s",
			w->id, (unsigned long long) reg->size, reg->kind,
			strerror(-rc));
	}
	kvb_ctl_reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

void kvb_ctl_mem_dereg(struct kvb_broker *b, struct kvb_worker *w,
		       struct ctl_req *q)
{
	struct kvb_region_ent *r =
		kvb_region_get(&b->regions, q->m->dereg.region);
	int rc = -ENOENT;

	if (r && !r->dead && r->owner == w->id && r->naliases) {
		log_warn_rl("worker %u: region %#x not freed (-EBUSY): %u "
			    "alias(es) of it live (free them first)",
			    w->id, r->mr.id, r->naliases);
		rc = -EBUSY;
	} else if (r && !r->dead && r->owner == w->id) {
		/* descriptors the worker published before asking still
		 * complete: take them while the region lives */
		uint32_t left = kvb_engine_drain_worker(b, w);

		if (left)
			log_warn_rl("worker %u: region %#x freed with %u "
				    "descriptor(s) still in its ring (the "
				    "broker is saturated): those naming it are "
				    "refused",
				    w->id, r->mr.id, left);
		kvb_region_kill(b, r);
		rc = 0;
	}
	kvb_ctl_reply(w, &q->m->h, sizeof(q->m->h), rc, NULL, 0);
}

void kvb_ctl_mem_lookup(struct kvb_broker *b, struct kvb_worker *w,
			struct ctl_req *q)
{
	struct kvb_msg_mem_reply rep = {.h.type = KVB_MSG_MEM_LOOKUP};
	int rc = mem_lookup(b, &q->m->lookup, &rep);

	kvb_ctl_reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

void kvb_ctl_mem_alias(struct kvb_broker *b, struct kvb_worker *w,
		       struct ctl_req *q)
{
	struct kvb_msg_mem_reply rep = {.h.type = KVB_MSG_MEM_ALIAS};
	int rc = mem_alias(b, w, &q->m->alias, &rep);

	if (rc) {
		b->st.mem_reg_refused++;
		log_warn_rl("worker %u: alias of %llu bytes at %llu of region "
			    "%#x refused: %s",
			    w->id, (unsigned long long) q->m->alias.size,
			    (unsigned long long) q->m->alias.offset,
			    q->m->alias.parent, strerror(-rc));
	}
	kvb_ctl_reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

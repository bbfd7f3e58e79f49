/* SPDX-License-Identifier: MIT */
/*
 * The broker's region table and descriptor validation. A region id is
 * (generation << 16) | slot, so a stale id (freed region) never matches a
 * reused slot. Slot 0 is never used: id 0 is invalid.
 */
#ifndef KVB_BROKER_REGIONS_H
#define KVB_BROKER_REGIONS_H

#include <stdint.h>

#include "segment.h"
#include "transport.h"

#define KVB_MAX_REGIONS 65536u

struct kvb_region_ent {
	struct kvb_mr mr; /* mr.id = the region id */
	uint32_t owner;	  /* worker slot */
	uint32_t owner_role, owner_dp, owner_tp;
	uint64_t key;
	uint32_t refs; /* ops in flight that touch it */
	uint16_t gen;
	uint8_t used;
	uint8_t dead;	/* freed or owner gone: unmapped when refs == 0 */
	void *map_base; /* what to munmap (host) */
	uint64_t map_len;
	/* kvb_mem_alias: the region whose mapping this one lies in (it holds
	 * one of the parent's refs until it is unmapped itself), and, on a
	 * parent, how many live (not dead) aliases it has: freeing it is
	 * refused until they are gone */
	uint32_t parent;
	uint32_t naliases;
};

struct kvb_regions {
	struct kvb_region_ent *v; /* KVB_MAX_REGIONS slots */
	uint32_t next_free;	  /* search hint */
	uint32_t live;
};

int kvb_regions_init(struct kvb_regions *t);
void kvb_regions_fini(struct kvb_regions *t);

/* Take a free slot; returns it with mr.id set, or NULL (table full). */
struct kvb_region_ent *kvb_region_alloc(struct kvb_regions *t);
/* Release a slot (its mapping already gone). */
void kvb_region_release(struct kvb_regions *t, struct kvb_region_ent *r);
/* Look up by id: live or dead but still referenced; NULL if unknown. */
struct kvb_region_ent *kvb_region_get(struct kvb_regions *t, uint32_t id);

/*
 * Validate a WRITE/READ descriptor from worker slot `worker`. On success
 * *loc / *rem are the local and remote regions. On failure returns -EINVAL
 * (bad opcode, unknown region, another worker's region, no access right),
 * -EFAULT (offset + length outside the region, or overflow), -ENXIO (remote
 * region's owner is gone), -EHOSTUNREACH (unknown peer node) and sets *why.
 */
int kvb_validate_desc(struct kvb_regions *t, uint32_t worker,
		      const struct kvb_sqe *e, struct kvb_region_ent **loc,
		      struct kvb_region_ent **rem, const char **why);

#endif

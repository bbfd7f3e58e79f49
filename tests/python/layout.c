/* SPDX-License-Identifier: MIT */
/*
 * Prints the size and field offsets of kvbroker.h's public structures as
 * one JSON object, for test_layout.py to compare with the ctypes mirrors
 * of the Python binding.
 */
#include <stddef.h>
#include <stdio.h>

#include "kvbroker/kvbroker.h"

static int first_struct = 1, first_field;

static void begin(const char *name, size_t size)
{
	printf("%s\"%s\":{\"size\":%zu,\"fields\":{", first_struct ? "" : ",",
	       name, size);
	first_struct = 0;
	first_field = 1;
}

static void field(const char *name, size_t off, size_t size)
{
	printf("%s\"%s\":[%zu,%zu]", first_field ? "" : ",", name, off, size);
	first_field = 0;
}

static void end(void)
{
	printf("}}");
}

#define S(T)	begin(#T, sizeof(struct T))
#define F(T, f) field(#f, offsetof(struct T, f), sizeof(((struct T *) 0)->f))

int main(void)
{
	printf("{");
	S(kvb_attach_opts);
	F(kvb_attach_opts, socket_path);
	F(kvb_attach_opts, role);
	F(kvb_attach_opts, dp_rank);
	F(kvb_attach_opts, tp_rank);
	F(kvb_attach_opts, tp_size);
	F(kvb_attach_opts, sq_entries);
	F(kvb_attach_opts, cq_entries);
	F(kvb_attach_opts, timeout_ms);
	end();
	S(kvb_region);
	F(kvb_region, id);
	F(kvb_region, flags);
	F(kvb_region, addr);
	F(kvb_region, size);
	F(kvb_region, gpu);
	F(kvb_region, alias);
	end();
	S(kvb_remote_region);
	F(kvb_remote_region, id);
	F(kvb_remote_region, flags);
	F(kvb_remote_region, size);
	end();
	S(kvb_desc);
	F(kvb_desc, transfer);
	F(kvb_desc, layer);
	F(kvb_desc, flags);
	F(kvb_desc, region);
	F(kvb_desc, peer_region);
	F(kvb_desc, offset);
	F(kvb_desc, peer_offset);
	F(kvb_desc, len);
	F(kvb_desc, tag);
	F(kvb_desc, peer);
	end();
	S(kvb_kv_geometry);
	F(kvb_kv_geometry, layout);
	F(kvb_kv_geometry, num_blocks);
	F(kvb_kv_geometry, block_size);
	F(kvb_kv_geometry, num_heads);
	F(kvb_kv_geometry, head_dim);
	F(kvb_kv_geometry, elem_size);
	end();
	S(kvb_remote_xfer);
	F(kvb_remote_xfer, peer);
	F(kvb_remote_xfer, mode);
	F(kvb_remote_xfer, flags);
	F(kvb_remote_xfer, remote_dp_rank);
	F(kvb_remote_xfer, blocks);
	F(kvb_remote_xfer, nblocks);
	F(kvb_remote_xfer, remote_blocks);
	F(kvb_remote_xfer, nremote);
	F(kvb_remote_xfer, notify_host);
	F(kvb_remote_xfer, notify_port);
	end();
	S(kvb_remote_open);
	F(kvb_remote_open, transfer_id);
	F(kvb_remote_open, host);
	F(kvb_remote_open, port);
	F(kvb_remote_open, pad);
	F(kvb_remote_open, mode);
	F(kvb_remote_open, flags);
	F(kvb_remote_open, remote_dp_rank);
	F(kvb_remote_open, blocks);
	F(kvb_remote_open, nblocks);
	F(kvb_remote_open, remote_blocks);
	F(kvb_remote_open, nremote);
	end();
	S(kvb_completion);
	F(kvb_completion, tag);
	F(kvb_completion, bytes);
	F(kvb_completion, status);
	F(kvb_completion, transfer);
	F(kvb_completion, kind);
	end();
	/* the constants the binding copies */
	printf(",\"constants\":{\"MEM_REMOTE_WRITE\":%u,\"MEM_REMOTE_READ\":%u,"
	       "\"DESC_UNSIGNALED\":%u,\"XFER_F_NO_ANNOUNCE\":%u,"
	       "\"XFER_F_PLAIN_RELEASE\":%u,\"XFER_F_RELEASE_ONLY\":%u,"
	       "\"REMOTE_OPEN_BATCH_MAX\":%u,\"KV_KV_FIRST\":%u,"
	       "\"KV_BLOCK_FIRST\":%u,\"TRANSFER_OPEN_BATCH_MAX\":%u,"
	       "\"ROLE_P\":%d,\"ROLE_D\":%d,\"XFER_WRITE\":%d,\"XFER_READ\":%d,"
	       "\"COMP_DESC\":%d,\"COMP_TRANSFER\":%d,\"COMP_SHUTDOWN\":%d}",
	       KVB_MEM_REMOTE_WRITE, KVB_MEM_REMOTE_READ, KVB_DESC_UNSIGNALED,
	       KVB_XFER_F_NO_ANNOUNCE, KVB_XFER_F_PLAIN_RELEASE,
	       KVB_XFER_F_RELEASE_ONLY, KVB_REMOTE_OPEN_BATCH_MAX,
	       KVB_KV_KV_FIRST, KVB_KV_BLOCK_FIRST, KVB_TRANSFER_OPEN_BATCH_MAX,
	       KVB_ROLE_P, KVB_ROLE_D, KVB_XFER_WRITE, KVB_XFER_READ,
	       KVB_COMP_DESC, KVB_COMP_TRANSFER, KVB_COMP_SHUTDOWN);
	printf("}\n");
	return 0;
}

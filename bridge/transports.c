/* SPDX-License-Identifier: MIT */
/* The transports this build has, by name (transport.h). */
#include <string.h>

#include "transport.h"
#ifdef KVB_HAVE_GPU_TRANSPORT
#include "gpu/gpu.h"
#endif
#ifdef KVB_HAVE_TCP
#include "tcp/tcp.h"
#endif
#ifdef KVB_HAVE_RDMA
#include "rdma/rdma.h"
#endif

const struct kvb_transport_ops *kvb_transport_find(const char *name)
{
	static const struct kvb_transport_ops *const all[] = {
		&kvb_local_ops,
#ifdef KVB_HAVE_GPU_TRANSPORT
		&kvb_gpu_ops,
#endif
#ifdef KVB_HAVE_TCP
		&kvb_tcp_ops,
#endif
#ifdef KVB_HAVE_RDMA
		&kvb_rdma_ops,
#endif
	};

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (!strcmp(all[i]->name, name))
			return all[i];
	return NULL;
}

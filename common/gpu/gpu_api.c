/* SPDX-License-Identifier: MIT */
/*
 * Backend selection for the gpu ops table. The choice is process-wide: the
 * GPU runtimes themselves are, and the export/import helpers must speak the
 * same handle format as the transport.
 */
#include "gpu_api.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t sel_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct kvb_gpu_api *sel_api;

static int load_named(const char *name, const struct kvb_gpu_api **out,
		      char *why, size_t why_len)
{
	if (!strcmp(name, "host"))
		return _kvb_gpu_host_load(out, why, why_len);
	if (!strcmp(name, "hip"))
		return _kvb_gpu_hip_load(out, why, why_len);
	if (!strcmp(name, "cuda"))
		return _kvb_gpu_cuda_load(out, why, why_len);
	if (why && why_len)
		snprintf(why, why_len, "unknown gpu backend '%s'", name);
	return -EINVAL;
}

static int load_auto(const struct kvb_gpu_api **out, char *why, size_t why_len)
{
	char whip[160] = "", wcuda[160] = "";
	int rc;

	rc = _kvb_gpu_hip_load(out, whip, sizeof(whip));
	if (rc == 0)
		return 0;
	rc = _kvb_gpu_cuda_load(out, wcuda, sizeof(wcuda));
	if (rc == 0)
		return 0;
	if (why && why_len)
		snprintf(why, why_len, "hip: %s; cuda: %s", whip, wcuda);
	return -ENODEV;
}

int kvb_gpu_backend_init(const char *name, char *why, size_t why_len)
{
	const struct kvb_gpu_api *api = NULL;
	int rc;

	if (!name || !*name)
		name = getenv("KVB_GPU_BACKEND");
	if (!name || !*name)
		name = "auto";
	pthread_mutex_lock(&sel_lock);
	if (sel_api) {
		rc = (!strcmp(name, "auto") || !strcmp(name, sel_api->name))
			     ? 0
			     : -EBUSY;
		if (rc && why && why_len)
			snprintf(why, why_len, "gpu backend already '%s'",
				 sel_api->name);
		goto out;
	}
	if (!strcmp(name, "auto"))
		rc = load_auto(&api, why, why_len);
	else
		rc = load_named(name, &api, why, why_len);
	if (rc == 0)
		sel_api = api;
out:
	pthread_mutex_unlock(&sel_lock);
	return rc;
}

const struct kvb_gpu_api *kvb_gpu_backend(void)
{
	const struct kvb_gpu_api *api;

	pthread_mutex_lock(&sel_lock);
	api = sel_api;
	pthread_mutex_unlock(&sel_lock);
	return api;
}

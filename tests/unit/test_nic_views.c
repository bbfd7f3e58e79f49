/* SPDX-License-Identifier: MIT */
/*
 * The rdma transport's NICs as the broker shows them, with a fake multi-NIC
 * transport in the rdma slot (no device): `kvbctl nics` and `kvbctl
 * regions` (broker/nics.c), the "nics" part of `kvbctl stats`
 * (broker/stats.c), the kvbroker_rdma_nic_* metrics (broker/metrics.c); and
 * what each shows without a transport that tells its NICs.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"
#include "kvbroker/kvbroker.h"
#include "metrics.h"
#include "metrics_priv.h"
#include "tests/unit/fake_nic.h"

static char buf[65536];

struct fix {
	struct kvb_broker b;
	struct kvb_transport_ops ops;
	struct fake_nic_tr f;
	struct kvb_region_ent *r[4];
	struct kvb_region_info ri[4]; /* what the extension keeps of each */
};

/* The extension's part of a region (its KV layer, its rdma registration):
 * the engine asks its region_info hook; this one answers from x->ri. */
static void region_info(struct kvb_broker *b, const struct kvb_region_ent *r,
			struct kvb_region_info *ri)
{
	struct fix *x = kvb_engine_ctx(b);

	for (int i = 0; i < 4; i++)
		if (x->r[i] == r)
			*ri = x->ri[i];
}

static const struct kvb_engine_hooks hooks = {.region_info = region_info};

static int setup(void **state)
{
	struct fix *x = calloc(1, sizeof(*x));

	if (!x)
		return -1;
	fake_nic_init(&x->f, &x->ops, "rdma", 3);
	x->b.trs[KVB_TS_RDMA] = &x->f.base;
	x->b.mx = calloc(1, sizeof(*x->b.mx));
	if (!x->b.mx || kvb_regions_init(&x->b.regions))
		return -1;
	for (int i = 0; i < 4; i++) {
		struct kvb_region_ent *r = kvb_region_alloc(&x->b.regions);

		if (!r)
			return -1;
		r->owner = 7 + (uint32_t) i;
		r->mr.len = 4096u << i;
		x->ri[i].rdma = i != 3; /* the last one: not with rdma */
		r->mr.kind = i == 2 ? KVB_MEM_GPU : KVB_MEM_HOST;
		r->mr.flags = i == 0 ? KVB_MEM_REMOTE_WRITE : 0;
		x->ri[i].kv = i == 0;
		x->ri[i].layer = i == 0 ? 5 : 0;
		x->r[i] = r;
	}
	kvb_engine_set_hooks(&x->b, &hooks, x);
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fix *x = *state;

	kvb_regions_fini(&x->b.regions);
	free(x->b.mx);
	free(x);
	return 0;
}

static const char *view(struct fix *x, uint32_t v, int json)
{
	int n = kvb_view_format(&x->b, v, json, buf, sizeof(buf));

	assert_true(n >= 0);
	assert_int_equal(strlen(buf), n);
	if (getenv("NIC_VIEWS_DUMP"))
		fputs(buf, stderr);
	return buf;
}

static void test_nics_view(void **state)
{
	struct fix *x = *state;
	const char *s;

	s = view(x, KVB_VIEW_NICS, 0);
	assert_non_null(strstr(s, "nic          port state numa pci"));
	assert_non_null(strstr(s, "qps/max refused   moved regions\n"));
	assert_non_null(strstr(s, "fnic0           1 up       0 0000:10:00.0 "
				  "        1000000        1000        100      "
				  "4/64       0       0       2\n"));
	assert_non_null(strstr(s, "fnic1           1 down     0 0000:11:00.0 "
				  "        2000000        2000        200      "
				  "8/64       3       7       3\n"));
	assert_non_null(strstr(s, "fnic2           1 up       1 "));

	s = view(x, KVB_VIEW_NICS, 1);
	assert_non_null(strstr(s, "{\"transport\":\"rdma\",\"nics\":[{"));
	assert_non_null(strstr(
		s, ",{\"index\":1,\"name\":\"fnic1\",\"port\":1,\"up\":false,"
		   "\"numa\":0,\"pci\":\"0000:11:00.0\",\"bytes\":2000000,"
		   "\"wrs\":2000,\"doorbells\":200,\"qps\":8,\"max_qps\":64,"
		   "\"qp_refused\":3,\"moved\":7,\"qp_parked\":5,"
		   "\"regions\":3}"));
	assert_non_null(strstr(s, "\"index\":2,\"name\":\"fnic2\""));
	assert_non_null(strstr(s, "}]}\n"));

	/* a name that needs escaping; no budget: "-" */
	strcpy(x->f.nic[0].name, "a\"b");
	x->f.nic[0].max_qps = 0;
	s = view(x, KVB_VIEW_NICS, 1);
	assert_non_null(strstr(s, "\"name\":\"a\\\"b\""));
	s = view(x, KVB_VIEW_NICS, 0);
	assert_non_null(strstr(s, "      4/-       0       0       2\n"));
}

static void test_regions_view(void **state)
{
	struct fix *x = *state;
	char row[256];
	const char *s;
	int n;

	s = view(x, KVB_VIEW_REGIONS, 0);
	assert_non_null(strstr(s, "region     worker             size kind kv  "
				  "layer access state   nic\n"));
	for (int i = 0; i < 4; i++) {
		const struct kvb_region_ent *r = x->r[i];

		snprintf(row, sizeof(row),
			 "%#-10x %-8u %14llu %-4s %-3s %5u "
			 "%-6s %-7s %s\n",
			 r->mr.id, r->owner, (unsigned long long) r->mr.len,
			 i == 2 ? "gpu" : "host", i == 0 ? "yes" : "no",
			 i == 0 ? 5 : 0, i == 0 ? "-w" : "--", "live",
			 i == 3 ? "-" : x->f.nic[r->mr.id % 3].name);
		if (!strstr(s, row))
			fail_msg("no row '%s' in:\n%s", row, s);
	}

	s = view(x, KVB_VIEW_REGIONS, 1);
	snprintf(row, sizeof(row),
		 "{\"id\":%u,\"worker\":7,\"size\":4096,\"kind\":\"host\","
		 "\"kv\":true,\"layer\":5,\"remote_read\":false,"
		 "\"remote_write\":true,\"state\":\"live\",\"rdma\":true,"
		 "\"nic\":\"%s\",\"nic_index\":%u,\"why\":\"nearest to NUMA "
		 "node %d\"}",
		 x->r[0]->mr.id, x->f.nic[x->r[0]->mr.id % 3].name,
		 x->r[0]->mr.id % 3, x->f.nic[x->r[0]->mr.id % 3].numa);
	if (!strstr(s, row))
		fail_msg("no '%s' in:\n%s", row, s);
	snprintf(row, sizeof(row),
		 "{\"id\":%u,\"worker\":10,\"size\":32768,\"kind\":\"host\","
		 "\"kv\":false,\"layer\":0,\"remote_read\":false,"
		 "\"remote_write\":false,\"state\":\"live\",\"rdma\":false,"
		 "\"nic\":null,\"nic_index\":null,\"why\":null}",
		 x->r[3]->mr.id);
	assert_non_null(strstr(s, row));
	assert_non_null(strstr(s, "],\"live\":4,\"omitted\":0}\n"));

	/* the transport cannot tell: the reason, no NIC */
	x->f.nic_err = -ENOENT;
	s = view(x, KVB_VIEW_REGIONS, 1);
	assert_non_null(strstr(s, "\"rdma\":true,\"nic\":null,\"nic_index\":"
				  "null,\"why\":\"No such file or "
				  "directory\"}"));
	s = view(x, KVB_VIEW_REGIONS, 0);
	assert_null(strstr(s, "fnic"));
	x->f.nic_err = 0;

	/* a full reply: rows counted, the JSON whole */
	n = kvb_view_format(&x->b, KVB_VIEW_REGIONS, 1, buf, 2600);
	assert_int_equal(n, strlen(buf));
	assert_non_null(strstr(buf, "],\"live\":4,\"omitted\":"));
	assert_null(strstr(buf, "\"omitted\":0}"));
	assert_int_equal(buf[strlen(buf) - 2], '}');
}

static void test_stats(void **state)
{
	struct fix *x = *state;

	assert_true(kvb_stats_format(&x->b, 1, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "],\"nics\":[{\"index\":0,\"name\":"
				    "\"fnic0\",\"port\":1,\"up\":true,"));
	assert_non_null(
		strstr(buf, "\"moved\":14,\"qp_parked\":10,\"regions\":4}],"));
	assert_true(kvb_stats_format(&x->b, 0, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "nic          port state numa pci"));
	assert_non_null(strstr(buf, "\nfnic1           1 down "));
}

static void test_metrics(void **state)
{
	static const char *const want[] = {
		"# TYPE kvbroker_rdma_nic_bytes_total counter\n",
		"kvbroker_rdma_nic_bytes_total{nic=\"fnic0\"} 1000000\n",
		"kvbroker_rdma_nic_bytes_total{nic=\"fnic2\"} 3000000\n",
		"kvbroker_rdma_nic_wrs_total{nic=\"fnic1\"} 2000\n",
		"kvbroker_rdma_nic_doorbells_total{nic=\"fnic2\"} 300\n",
		"kvbroker_rdma_nic_moved_total{nic=\"fnic1\"} 7\n",
		"kvbroker_rdma_nic_qp_refused_total{nic=\"fnic2\"} 6\n",
		"kvbroker_rdma_nic_qp_parked_total{nic=\"fnic1\"} 5\n",
		"# TYPE kvbroker_rdma_nic_qps gauge\n",
		"kvbroker_rdma_nic_qps{nic=\"fnic2\"} 12\n",
		"kvbroker_rdma_nic_max_qps{nic=\"fnic0\"} 64\n",
		"kvbroker_rdma_nic_regions{nic=\"fnic1\"} 3\n",
		"kvbroker_rdma_nic_up{nic=\"fnic0\"} 1\n",
		"kvbroker_rdma_nic_up{nic=\"fnic1\"} 0\n",
	};
	struct fix *x = *state;
	char *m = NULL;
	size_t len;

	assert_int_equal(kvb_metrics_render(&x->b, 0, &m, &len), 0);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!strstr(m, want[i]))
			fail_msg("no '%s' in the exposition", want[i]);
	if (getenv("NIC_VIEWS_DUMP"))
		fwrite(m, 1, len, stdout);
	free(m);
	/* OpenMetrics: the counter family without _total */
	assert_int_equal(kvb_metrics_render(&x->b, 1, &m, &len), 0);
	assert_non_null(strstr(m, "# TYPE kvbroker_rdma_nic_bytes counter\n"));
	assert_non_null(
		strstr(m, "kvbroker_rdma_nic_bytes_total{nic=\"fnic0\"} "));
	free(m);
	/* a label value is escaped */
	strcpy(x->f.nic[2].name, "q\"\\z");
	assert_int_equal(kvb_metrics_render(&x->b, 0, &m, &len), 0);
	assert_non_null(
		strstr(m, "kvbroker_rdma_nic_up{nic=\"q\\\"\\\\z\"} 1\n"));
	free(m);
}

/* tcp, or rdma on one NIC that tells nothing: no NIC anywhere */
static void test_without_nics(void **state)
{
	struct fix *x = *state;
	char *m = NULL;
	size_t len;

	x->ops.nics = NULL;
	x->ops.mr_nic = NULL;
	assert_non_null(strstr(view(x, KVB_VIEW_NICS, 0), "(no NICs to show"));
	assert_string_equal(view(x, KVB_VIEW_NICS, 1),
			    "{\"transport\":\"rdma\",\"nics\":[]}\n");
	assert_non_null(strstr(view(x, KVB_VIEW_REGIONS, 1),
			       "\"rdma\":true,\"nic\":null,\"nic_index\":null,"
			       "\"why\":null}"));
	assert_true(kvb_stats_format(&x->b, 1, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "],\"nics\":[],"));
	assert_true(kvb_stats_format(&x->b, 0, buf, sizeof(buf)) > 0);
	assert_null(strstr(buf, "port state"));
	assert_int_equal(kvb_metrics_render(&x->b, 0, &m, &len), 0);
	assert_null(strstr(m, "kvbroker_rdma_nic"));
	free(m);
	x->b.trs[KVB_TS_RDMA] = NULL;
	assert_string_equal(view(x, KVB_VIEW_NICS, 1),
			    "{\"transport\":null,\"nics\":[]}\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_nics_view, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_regions_view, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
		cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
		cmocka_unit_test_setup_teardown(test_without_nics, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/*
 * `kvbench workload` options: the --help text (every knob with its default)
 * and the parser, which refuses bad arguments with a clear message. The run
 * itself is workload.c.
 */
#include "kvbench.h"

#include <errno.h>
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void workload_usage(FILE *f)
{
	fputs("Usage: kvbench [workload] [OPTIONS]\n"
	      "P worker processes write every request's KV blocks, layer by "
	      "layer, into\n"
	      "their D peers (P rank i -> D rank i), either each on its own "
	      "transport\n"
	      "instance (direct: one post per (request, layer), as vLLM's "
	      "MoRIIO connector\n"
	      "does per worker) or through a kvbroker that kvbench starts "
	      "(broker).\n"
	      "\n"
	      "Workload (defaults: Llama-3-70B at TP=8, trimmed to run in "
	      "seconds):\n"
	      "  --workers W        P worker processes, and as many D workers "
	      "(default 8:\n"
	      "                     TP=8, one process per rank)\n"
	      "  --layers L         transformer layers (default 80, "
	      "Llama-3-70B)\n"
	      "  --blocks B         KV blocks per request per layer (default "
	      "16: a\n"
	      "                     256-token prompt in 16-token blocks)\n"
	      "  --block-bytes S    bytes per block per rank per layer "
	      "(default 8192 =\n"
	      "                     2 (K,V) x 16 tokens x 1 KV head per rank "
	      "(8 heads / TP 8)\n"
	      "                     x head dim 128 x 2 bytes (bf16)); a "
	      "multiple of 8\n"
	      "  --requests R       concurrent requests per step (default 4)\n"
	      "  --iters N          steps per worker; R x N requests in all "
	      "(default 4)\n"
	      "  --iters-total N    instead of --iters: N steps split among "
	      "the workers\n"
	      "                     (N/W each, rounded up), so every worker "
	      "count of a\n"
	      "                     sweep moves the same bytes and its "
	      "trials last about\n"
	      "                     as long (bandwidth sweeps)\n"
	      "  --rate X           requests/s arriving at each P worker "
	      "(default 0 = back\n"
	      "                     to back); an open loop: arrivals keep "
	      "their schedule,\n"
	      "                     the ones that came during a step join the "
	      "next (up to\n"
	      "                     --requests), and latency counts from a "
	      "request's arrival\n"
	      "  --transport T      local (default), tcp (two nodes: see "
	      "--net), rdma\n"
	      "                     (a verbs device: the soft-RoCE guest, see "
	      "docs/testing.md)\n"
	      "                     or gpu (device memory on one node, see "
	      "--gpu-backend)\n"
	      "  --gpu-backend B    gpu: auto (default: hip, then cuda; "
	      "no GPU: exit 77),\n"
	      "                     cuda, hip, or host (memfd \"device "
	      "memory\" and host\n"
	      "                     copy threads: measures the host copy "
	      "path, not a GPU)\n"
	      "  --rdma-ip A        rdma broker mode: both brokers' --host-ip "
	      "(default\n"
	      "                     192.0.2.1, the soft-RoCE guest's); "
	      "$KVB_RDMA_DEV: device\n"
	      "  --net N            tcp placement: auto (default: two network "
	      "namespaces\n"
	      "                     joined by a veth pair, 192.0.2.1 = P, "
	      "192.0.2.2 = D,\n"
	      "                     when root and `ip netns` works, else "
	      "loopback), netns,\n"
	      "                     loopback (127.0.0.1, distinct ports)\n"
	      "  --mode M           direct | broker | ucx | both (= "
	      "direct,broker;\n"
	      "                     the default) | all (= direct,broker,ucx), "
	      "or a\n"
	      "                     comma-separated list (direct,ucx)\n"
	      "  --ucx-tls LIST     ucx mode: the UCX_TLS its workers set "
	      "(default: tcp\n"
	      "                     on --transport tcp, with UCX_NET_DEVICES "
	      "the veth end\n"
	      "                     or lo; rc_v (rc_verbs, ud_verbs for wireup "
	      "only) on\n"
	      "                     rdma; UCX's own on local); default:\n"
	      "                     set nothing (UCX picks, e.g. shared "
	      "memory between\n"
	      "                     two namespaces of one host). UCX_TLS / "
	      "UCX_NET_DEVICES\n"
	      "                     in the environment win over the defaults; "
	      "every other\n"
	      "                     UCX_* variable applies as usual\n"
	      "  --verify           D checks every byte (default on)\n"
	      "  --no-verify        skip it (speed runs: D regions then hold R "
	      "slots)\n"
	      "\n"
	      "Output:\n"
	      "  --json FILE        one object: \"direct\", \"broker\" and, "
	      "for both, \"ratio\"\n"
	      "                     (broker/direct); with a sweep, \"sweep\": "
	      "[...] of those\n"
	      "  --sweep-workers L  comma-separated worker counts, e.g. "
	      "1,2,4,8\n"
	      "  --repeat N         N trials of each mode per worker count "
	      "(default 1,\n"
	      "                     at most 15), direct and broker "
	      "alternating (ABBA);\n"
	      "                     rows, ratios and JSON figures are the "
	      "medians, JSON\n"
	      "                     \"trials\" holds each trial (and each "
	      "pair's ratio)\n"
	      "  --plot FILE.png    message rate and WRs/doorbell vs workers "
	      "(gnuplot)\n"
	      "  --progress         progress line on stderr (default: only on "
	      "a tty)\n"
	      "\n"
	      "Broker:\n"
	      "  --broker PATH      kvbroker binary (default $KVBROKER, else\n"
	      "                     ../../broker/kvbroker next to kvbench in "
	      "the build tree)\n"
	      "  --broker-opts STR  more broker options, space-separated (e.g. "
	      "\"--burst 256\")\n"
	      "\n"
	      "Figures: wrs and doorbells are the transport's counters "
	      "(direct: summed over\n"
	      "the workers' instances; broker: the broker's, from its STATS). "
	      "post_cpu_us_per_wr:\n"
	      "direct = thread CPU inside post() per WR; broker = the broker's "
	      "whole CPU per\n"
	      "WR (an upper bound: draining, completions and idle spinning "
	      "count too).\n"
	      "worker_post_cpu_us_per_wr = what the worker pays per descriptor "
	      "(post() or\n"
	      "kvb_submit_write()). Both time one call in 16, chosen at "
	      "random, less the\n"
	      "cost of the two clock reads (a system call each: timing every "
	      "call would\n"
	      "take more CPU than small-block posting itself).\n"
	      "msg_rate_mps = descriptors/s in millions; bw_gbps in GB/s "
	      "(1e9 bytes);\n"
	      "latency from a request's first write (with --rate: its "
	      "arrival) to its\n"
	      "write_done; percentiles by nearest rank (p99 of N: the "
	      "ceil(0.99 N)-th\n"
	      "smallest). n/a (null in JSON): not measured (post_cpu when "
	      "no call of the\n"
	      "sample was timed).\n"
	      "\n"
	      "tcp: direct = every P worker opens its own tcp transport and "
	      "socket to its\n"
	      "D peer, a receiver process per D worker (its own tcp transport, "
	      "regions\n"
	      "registered, polling); broker = two kvbrokers (--transport tcp "
	      "--host-ip, P\n"
	      "node and D node), workers on MoRIIO's WRITE path "
	      "(kvb_transfer_open_remote,\n"
	      "kvb_submit_layer per layer). doorbells = sendmsg calls sending "
	      "WRs (direct:\n"
	      "the workers' transports; broker: the P broker's \"tcp\" "
	      "counters); post_cpu:\n"
	      "n/a (null in JSON): tcp's sending continues outside post(). "
	      "cpu = P workers\n"
	      "+ D side (receivers or D workers, not verifying) + both "
	      "brokers.\n"
	      "\n"
	      "rdma: as tcp, with RDMA WRITEs on RC queue pairs: direct = "
	      "every P worker\n"
	      "its own rdma transport and QP to a receiver per D worker (QP "
	      "handshake over\n"
	      "a socketpair), one ibv_post_send per (request, layer); broker "
	      "= two\n"
	      "kvbrokers --transport rdma on one device, distinct ports. "
	      "doorbells =\n"
	      "ibv_post_send calls; post_cpu: thread CPU time inside "
	      "ibv_post_send on a\n"
	      "random 1 in 16 doorbells per WR of those (stats post_cpu_ns "
	      "/ post_cpu_wrs):\n"
	      "direct = the P workers' transports, broker = the P broker's; "
	      "JSON\n"
	      "post_wall_us_per_wr = wall time of every call per WR (stats "
	      "post_ns).\n"
	      "\n"
	      "ucx: the same writes through UCX (UCP): a UCP context and "
	      "worker per worker\n"
	      "process; D maps each layer region (ucp_mem_map) and sends "
	      "its worker address\n"
	      "and rkeys to P over a socketpair; P puts every block "
	      "(ucp_put_nbx, one per\n"
	      "block, as vLLM's per-block descriptors), progresses once per "
	      "(request, layer),\n"
	      "flushes the endpoint once per step and then tells D which "
	      "requests are done.\n"
	      "doorbells: n/a (UCX counts none); the lanes P0's endpoint "
	      "used are printed\n"
	      "after the table and in the JSON (config.ucx). Rows: ratio = "
	      "broker/direct,\n"
	      "b/ucx = broker/ucx, ucx/d = ucx/direct (JSON ratio, "
	      "ratio_broker_ucx,\n"
	      "ratio_ucx_direct).\n"
	      "\n"
	      "gpu: direct = every P worker opens its own gpu transport "
	      "(its streams and\n"
	      "events) and imports its D peer's exported layer regions (IPC "
	      "handles); D\n"
	      "workers allocate one device region per layer and, with "
	      "--verify, copy each\n"
	      "request back to the host to check it; broker = one kvbroker "
	      "--transport gpu\n"
	      "($KVB_GPU_BACKEND set to the same backend), regions "
	      "registered with\n"
	      "kvb_mem_register_gpu. doorbells = copy batches, WRs = copies; "
	      "post_cpu as on\n"
	      "local (copies run asynchronously after post()).\n",
	      f);
}

/* --- options -------------------------------------------------------- */

static int parse_sweep(struct wl_cfg *c, const char *arg)
{
	char buf[256], *save = NULL, *tok;
	uint64_t v;

	snprintf(buf, sizeof(buf), "%s", arg);
	c->nsweep = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (c->nsweep == KVB_BENCH_MAX_SWEEP) {
			fprintf(stderr,
				"kvbench: --sweep-workers: at most %u points\n",
				KVB_BENCH_MAX_SWEEP);
			return -1;
		}
		if (kvb_bench_parse_u64("--sweep-workers", tok, 1,
					KVB_BENCH_MAX_WORKERS, &v))
			return -1;
		c->sweep[c->nsweep++] = (unsigned) v;
	}
	if (!c->nsweep) {
		fprintf(stderr, "kvbench: --sweep-workers: empty list\n");
		return -1;
	}
	return 0;
}

/* --mode: a comma-separated list of direct, broker, ucx, both, all */
static int parse_modes(struct wl_cfg *c, const char *arg)
{
	char buf[128], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", arg);
	c->modes = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "direct"))
			c->modes |= MODE_DIRECT;
		else if (!strcmp(tok, "broker"))
			c->modes |= MODE_BROKER;
		else if (!strcmp(tok, "ucx"))
			c->modes |= MODE_UCX;
		else if (!strcmp(tok, "both"))
			c->modes |= MODE_DIRECT | MODE_BROKER;
		else if (!strcmp(tok, "all"))
			c->modes |= MODE_DIRECT | MODE_BROKER | MODE_UCX;
		else {
			fprintf(stderr,
				"kvbench: --mode: '%s' is not direct, broker, "
				"ucx, both or all\n",
				tok);
			return -1;
		}
	}
	if (!c->modes) {
		fprintf(stderr, "kvbench: --mode: empty\n");
		return -1;
	}
	return 0;
}

enum {
	O_WORKERS = 256,
	O_LAYERS,
	O_BLOCKS,
	O_BBYTES,
	O_REQS,
	O_ITERS,
	O_ITERS_TOTAL,
	O_RATE,
	O_TRANSPORT,
	O_MODE,
	O_VERIFY,
	O_NOVERIFY,
	O_JSON,
	O_SWEEP,
	O_PLOT,
	O_PROGRESS,
	O_BROKER,
	O_BOPTS,
	O_NET,
	O_RDMA_IP,
	O_GPU_BACKEND,
	O_REPEAT,
	O_UCX_TLS,
	O_HELP,
};

int wl_parse(struct wl_cfg *c, int argc, char **argv)
{
	static const struct option lo[] = {
		{"workers", 1, NULL, O_WORKERS},
		{"layers", 1, NULL, O_LAYERS},
		{"blocks", 1, NULL, O_BLOCKS},
		{"block-bytes", 1, NULL, O_BBYTES},
		{"requests", 1, NULL, O_REQS},
		{"iters", 1, NULL, O_ITERS},
		{"iters-total", 1, NULL, O_ITERS_TOTAL},
		{"rate", 1, NULL, O_RATE},
		{"transport", 1, NULL, O_TRANSPORT},
		{"mode", 1, NULL, O_MODE},
		{"verify", 0, NULL, O_VERIFY},
		{"no-verify", 0, NULL, O_NOVERIFY},
		{"json", 1, NULL, O_JSON},
		{"sweep-workers", 1, NULL, O_SWEEP},
		{"plot", 1, NULL, O_PLOT},
		{"progress", 0, NULL, O_PROGRESS},
		{"broker", 1, NULL, O_BROKER},
		{"broker-opts", 1, NULL, O_BOPTS},
		{"net", 1, NULL, O_NET},
		{"rdma-ip", 1, NULL, O_RDMA_IP},
		{"gpu-backend", 1, NULL, O_GPU_BACKEND},
		{"repeat", 1, NULL, O_REPEAT},
		{"ucx-tls", 1, NULL, O_UCX_TLS},
		{"help", 0, NULL, O_HELP},
		{NULL, 0, NULL, 0}};
	int o, iters_set = 0, workers_set = 0;
	struct in_addr in;
	uint64_t v;

	optind = 1;
	opterr = 0;
	while ((o = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		const char *a = optarg;

		switch (o) {
		case O_WORKERS:
			if (kvb_bench_parse_u64("--workers", a, 1,
						KVB_BENCH_MAX_WORKERS, &v))
				return -1;
			c->workers = (unsigned) v;
			workers_set = 1;
			break;
		case O_LAYERS:
			if (kvb_bench_parse_u64("--layers", a, 1, 1024, &v))
				return -1;
			c->layers = (unsigned) v;
			break;
		case O_BLOCKS:
			if (kvb_bench_parse_u64("--blocks", a, 1, 4096, &v))
				return -1;
			c->blocks = (unsigned) v;
			break;
		case O_BBYTES:
			if (kvb_bench_parse_u64("--block-bytes", a, 8,
						64ull << 20, &v))
				return -1;
			if (v % 8) {
				fprintf(stderr,
					"kvbench: --block-bytes: %llu is not a "
					"multiple of 8\n",
					(unsigned long long) v);
				return -1;
			}
			c->block_bytes = v;
			break;
		case O_REQS:
			if (kvb_bench_parse_u64("--requests", a, 1, 1024, &v))
				return -1;
			c->requests = (unsigned) v;
			break;
		case O_ITERS:
			if (kvb_bench_parse_u64("--iters", a, 1, 1000000, &v))
				return -1;
			c->iters = (unsigned) v;
			iters_set = 1;
			break;
		case O_ITERS_TOTAL:
			if (kvb_bench_parse_u64("--iters-total", a, 1, 1000000,
						&v))
				return -1;
			c->iters_total = (unsigned) v;
			break;
		case O_REPEAT:
			if (kvb_bench_parse_u64("--repeat", a, 1,
						KVB_BENCH_MAX_REPEAT, &v))
				return -1;
			c->repeat = (unsigned) v;
			break;
		case O_RATE:
			if (kvb_bench_parse_double("--rate", a, 0, 1e9,
						   &c->rate))
				return -1;
			break;
		case O_TRANSPORT:
			c->transport = kvb_bench_check_transport(a, 1);
			if (c->transport < 0)
				return -1;
			break;
		case O_NET:
			if (!strcmp(a, "auto"))
				c->net = NET_AUTO;
			else if (!strcmp(a, "netns"))
				c->net = NET_NETNS;
			else if (!strcmp(a, "loopback"))
				c->net = NET_LOOPBACK;
			else {
				fprintf(stderr,
					"kvbench: --net: '%s' is not auto, "
					"netns or loopback\n",
					a);
				return -1;
			}
			break;
		case O_RDMA_IP:
			if (inet_pton(AF_INET, a, &in) != 1) {
				fprintf(stderr,
					"kvbench: --rdma-ip: '%s' is not an "
					"IPv4 address\n",
					a);
				return -1;
			}
			c->rdma_ip = a;
			break;
		case O_GPU_BACKEND:
			if (strcmp(a, "auto") && strcmp(a, "cuda") &&
			    strcmp(a, "hip") && strcmp(a, "host")) {
				fprintf(stderr,
					"kvbench: --gpu-backend: '%s' is not "
					"auto, cuda, hip or host\n",
					a);
				return -1;
			}
			c->gpu_backend = a;
			break;
		case O_MODE:
			if (parse_modes(c, a))
				return -1;
			break;
		case O_UCX_TLS:
			if (!*a) {
				fprintf(stderr, "kvbench: --ucx-tls: empty\n");
				return -1;
			}
			c->ucx_tls_opt = a;
			break;
		case O_VERIFY:
			c->verify = 1;
			break;
		case O_NOVERIFY:
			c->verify = 0;
			break;
		case O_JSON:
			c->json = a;
			break;
		case O_SWEEP:
			if (parse_sweep(c, a))
				return -1;
			break;
		case O_PLOT:
			c->plot = a;
			break;
		case O_PROGRESS:
			c->progress = 1;
			break;
		case O_BROKER:
			c->broker = a;
			break;
		case O_BOPTS:
			c->broker_opts = a;
			break;
		case O_HELP:
			workload_usage(stdout);
			return 1;
		case ':':
			fprintf(stderr, "kvbench: %s needs a value\n",
				argv[optind - 1]);
			return -1;
		default:
			kvb_bench_unknown_option(argv, lo, "workload");
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvbench: unexpected argument '%s'\n",
			argv[optind]);
		return -1;
	}
	if (c->transport != KVB_BENCH_TR_LOCAL && c->block_bytes % 2) {
		fprintf(stderr, "kvbench: --block-bytes must be even\n");
		return -1;
	}
	if (c->gpu_backend && c->transport != KVB_BENCH_TR_GPU) {
		fprintf(stderr, "kvbench: --gpu-backend goes with --transport "
				"gpu\n");
		return -1;
	}
	if (c->rdma_ip && c->transport != KVB_BENCH_TR_RDMA) {
		fprintf(stderr, "kvbench: --rdma-ip goes with --transport "
				"rdma\n");
		return -1;
	}
	if ((c->modes & MODE_UCX) && !wl_ucx_version()) {
		fprintf(stderr, "kvbench: --mode ucx: this kvbench was built "
				"without UCX (libucx-dev; scripts/deps.sh "
				"bench)\n");
		return -1;
	}
	if ((c->modes & MODE_UCX) && c->transport == KVB_BENCH_TR_GPU) {
		fprintf(stderr, "kvbench: --mode ucx: not on --transport gpu "
				"(host memory only)\n");
		return -1;
	}
	if (c->ucx_tls_opt && !(c->modes & MODE_UCX)) {
		fprintf(stderr, "kvbench: --ucx-tls goes with --mode ucx or "
				"all\n");
		return -1;
	}
	if (workers_set && c->nsweep) {
		fprintf(stderr, "kvbench: --workers and --sweep-workers: give "
				"one of them\n");
		return -1;
	}
	if (c->plot && !c->nsweep) {
		fprintf(stderr, "kvbench: --plot needs --sweep-workers (it "
				"draws against the worker count)\n");
		return -1;
	}
	if (iters_set && c->iters_total) {
		fprintf(stderr, "kvbench: --iters and --iters-total: give one "
				"of them\n");
		return -1;
	}
	if (c->iters_total)
		c->iters = c->iters_total; /* the most a worker runs (W = 1) */
	if ((uint64_t) c->iters * c->requests > 1000000) {
		fprintf(stderr, "kvbench: --iters x --requests: at most "
				"1000000 requests per worker\n");
		return -1;
	}
	return 0;
}

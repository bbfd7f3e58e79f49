// SPDX-License-Identifier: MIT
/*
 * kvb-tcp-bench: throughput of the tcp transport between two processes
 * (two hosts, two network namespaces, or loopback), to set beside iperf3.
 *
 *   receiver:  kvb-tcp-bench --listen IP:PORT [--size 64M] [--seconds N]
 *   sender:    kvb-tcp-bench --connect IP:PORT [--size 1M] [--seconds 5]
 *                            [--depth 16] [--region 64M] [--read] [--json]
 *
 * The receiver registers one region (id 1, --size bytes, REMOTE_WRITE and
 * REMOTE_READ), prints "blob <hex>" and serves until killed or --seconds.
 * The sender builds the blob from --connect (or takes the printed one with
 * --blob HEX [--host IP]), keeps --depth ops of --size bytes in flight over
 * [0, --region) of that region and prints one line of figures.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "bridge/tcp/tcp.h"
#include "kvbroker/kvbroker.h"

#define REGION_ID 1

struct opts {
	const char *listen, *connect, *blob, *host;
	uint64_t size, region;
	double seconds;
	unsigned depth;
	int read, json, size_set;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void) sig;
	stop = 1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage:\n"
		"  kvb-tcp-bench --listen IP:PORT [--size BYTES] [--seconds "
		"N]\n"
		"      receiver: registers region 1 of --size bytes (default "
		"64M),\n"
		"      prints \"blob <hex>\" (its local_info) and serves "
		"until\n"
		"      killed or --seconds.\n"
		"  kvb-tcp-bench --connect IP:PORT [--size BYTES] [--seconds "
		"N]\n"
		"                [--depth N] [--region BYTES] [--read] "
		"[--json]\n"
		"  kvb-tcp-bench --blob HEX [--host IP] ...\n"
		"      sender: keeps --depth (16) ops of --size (1M) in "
		"flight\n"
		"      for --seconds (5), WRITE (or --read: READ) over [0, "
		"--region)\n"
		"      of the receiver's region 1 (--region <= receiver's "
		"--size,\n"
		"      default 64M). --blob takes the receiver's printed "
		"blob;\n"
		"      --host dials that address instead of the blob's (needed "
		"when\n"
		"      the receiver listens on 0.0.0.0). Prints #bytes #iters\n"
		"      BW[GB/s] (1e9 bytes/s) BW[Gbit/s] MsgRate[Mpps] "
		"writev/op\n"
		"      and latency p50/p99 [us]; --json prints one JSON "
		"object.\n"
		"  Sizes take K, M, G (binary) suffixes.\n");
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	switch (*end) {
	case 'k':
	case 'K':
		v <<= 10;
		end++;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		end++;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		end++;
		break;
	}
	if (*end || !v)
		return -EINVAL;
	*out = v;
	return 0;
}

/* "IP:PORT" or "[IPv6]:PORT" into ip (buffer) and port. */
static int parse_addr(const char *s, char *ip, size_t len, unsigned *port)
{
	const char *c = strrchr(s, ':');
	size_t n;

	if (!c)
		return -EINVAL;
	n = (size_t) (c - s);
	if (n && s[0] == '[' && s[n - 1] == ']') {
		s++;
		n -= 2;
	}
	if (n >= len)
		return -EINVAL;
	memcpy(ip, s, n);
	ip[n] = 0;
	*port = (unsigned) strtoul(c + 1, NULL, 10);
	return *port <= 65535 ? 0 : -EINVAL;
}

static struct kvb_transport *open_tcp(const char *ip, unsigned port,
				      unsigned depth)
{
	struct kvb_transport_params p;
	struct kvb_transport *t = NULL;
	char why[160] = "";
	int rc;

	memset(&p, 0, sizeof(p));
	p.host_ip = ip;
	p.tcp_port = port;
	p.sq_depth = depth;
	rc = kvb_tcp_ops.open(&p, &t, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "kvb-tcp-bench: open: %s (%s)\n", strerror(-rc),
			why);
		return NULL;
	}
	return t;
}

static void *alloc_region(struct kvb_mr *mr, uint64_t len, uint32_t flags)
{
	void *p;

	if (posix_memalign(&p, 4096, len))
		return NULL;
	memset(p, 0x5a, len);
	memset(mr, 0, sizeof(*mr));
	mr->id = REGION_ID;
	mr->flags = flags;
	mr->kind = KVB_MEM_HOST;
	mr->addr = p;
	mr->len = len;
	return p;
}

/* Sleep on the transport's wait fd, at most ms. */
static void wait_on(int epfd, int ms)
{
	struct epoll_event ev;

	epoll_wait(epfd, &ev, 1, ms);
}

static int run_listen(const struct opts *o)
{
	struct kvb_transport *t;
	struct kvb_tcp_stats st;
	struct kvb_xcqe c[64];
	struct kvb_mr mr;
	uint8_t blob[KVB_TCP_BLOB_LEN];
	size_t len = sizeof(blob), i;
	char ip[64];
	unsigned port;
	double end;
	void *mem;
	int ep;

	if (parse_addr(o->listen, ip, sizeof(ip), &port)) {
		fprintf(stderr, "kvb-tcp-bench: --listen wants IP:PORT\n");
		return 2;
	}
	t = open_tcp(ip, port, 0);
	if (!t)
		return 1;
	/* any sender of this tool (its public shared key) */
	if (kvb_tcp_peer_allow(t, 0, kvb_tcp_tool_key, NULL, -1))
		return 1;
	mem = alloc_region(&mr, o->size_set ? o->size : 64ull << 20,
			   KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ);
	if (!mem || kvb_tcp_ops.reg_mr(t, &mr)) {
		fprintf(stderr, "kvb-tcp-bench: cannot register the region\n");
		return 1;
	}
	kvb_tcp_ops.local_info(t, blob, &len);
	printf("blob ");
	for (i = 0; i < len; i++)
		printf("%02x", blob[i]);
	printf("\nlistening %s port %d region %u size %llu\n", ip,
	       kvb_tcp_port(t), REGION_ID, (unsigned long long) mr.len);
	fflush(stdout);

	ep = epoll_create1(EPOLL_CLOEXEC);
	{
		struct epoll_event ev = {.events = EPOLLIN};

		epoll_ctl(ep, EPOLL_CTL_ADD, kvb_tcp_ops.wait_fd(t), &ev);
	}
	end = o->seconds > 0 ? now_s() + o->seconds : 0;
	while (!stop && (!end || now_s() < end)) {
		kvb_tcp_ops.poll(t, c, 64);
		wait_on(ep, 100);
	}
	kvb_tcp_get_stats(t, &st);
	fprintf(stderr,
		"received %llu bytes in %llu frames; %llu connections, "
		"%llu rejected frames, %llu refused ops, %llu sendmsg\n",
		(unsigned long long) st.bytes_rx,
		(unsigned long long) st.frames_rx,
		(unsigned long long) st.conn_accepted,
		(unsigned long long) st.rejected,
		(unsigned long long) st.refused_ops,
		(unsigned long long) st.writev_calls);
	close(ep);
	kvb_tcp_ops.close(t);
	free(mem);
	return 0;
}

static int hex_blob(const char *s, uint8_t *out, size_t *len)
{
	size_t n = strlen(s) / 2, i;

	if (strlen(s) % 2 || n > *len)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (uint8_t) v;
	}
	*len = n;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

	return x < y ? -1 : x > y;
}

static int run_send(const struct opts *o)
{
	struct kvb_transport *t;
	struct kvb_tcp_stats st;
	struct kvb_xcqe c[64];
	struct kvb_ep *ep = NULL;
	struct kvb_mr mr;
	struct kvb_xop *ops;
	uint8_t blob[128];
	size_t len = sizeof(blob);
	uint64_t *lat = NULL, nlat = 0, cap = 0, done = 0, posted = 0;
	uint64_t errors = 0, slots, *t_post;
	double t0, end, last, secs, gbs;
	unsigned depth = o->depth ? o->depth : 16, i;
	int efd, rc, first_err = 0;
	void *mem;

	if (o->blob) {
		rc = hex_blob(o->blob, blob, &len);
	} else {
		char ip[64];
		unsigned port;

		rc = parse_addr(o->connect, ip, sizeof(ip), &port);
		if (!rc)
			rc = kvb_tcp_blob_make(ip, (uint16_t) port, 0, blob,
					       &len);
	}
	if (rc) {
		fprintf(stderr, "kvb-tcp-bench: bad --connect / --blob\n");
		return 2;
	}
	t = open_tcp(NULL, 0, depth);
	if (!t)
		return 1;
	rc = o->host ? kvb_tcp_connect_host(t, blob, len, o->host, &ep)
		     : kvb_tcp_ops.connect(t, blob, len, &ep);
	/* both ends are this tool: its public shared key (docs/tcp.md) */
	if (!rc)
		rc = kvb_tcp_ep_set_key(t, ep, kvb_tcp_tool_key);
	if (rc) {
		fprintf(stderr, "kvb-tcp-bench: connect: %s%s\n", strerror(-rc),
			rc == -EDESTADDRREQ ? " (pass --host)" : "");
		return 1;
	}
	mem = alloc_region(&mr, o->size, 0);
	if (!mem || kvb_tcp_ops.reg_mr(t, &mr)) {
		fprintf(stderr, "kvb-tcp-bench: cannot register the buffer\n");
		return 1;
	}
	slots = o->region / o->size ? o->region / o->size : 1;
	ops = calloc(depth, sizeof(*ops));
	t_post = calloc(depth, sizeof(*t_post));
	if (!ops || !t_post)
		return 1;
	efd = epoll_create1(EPOLL_CLOEXEC);
	{
		struct epoll_event ev = {.events = EPOLLIN};

		epoll_ctl(efd, EPOLL_CTL_ADD, kvb_tcp_ops.wait_fd(t), &ev);
	}

	t0 = now_s();
	end = t0 + o->seconds;
	last = t0;
	while (!stop && (now_s() < end || done < posted)) {
		unsigned n = 0;
		int k;

		/* cookie = op number; its slot in t_post is number % depth */
		while (now_s() < end && posted + n - done < depth) {
			uint64_t id = posted + n;
			struct kvb_xop *op = &ops[n++];

			memset(op, 0, sizeof(*op));
			op->opcode = o->read ? KVB_XOP_READ : KVB_XOP_WRITE;
			op->local = &mr;
			op->remote.region = REGION_ID;
			op->remote_off = (id % slots) * o->size;
			op->len = o->size;
			op->cookie = id;
		}
		if (n) {
			double tp = now_s();

			rc = kvb_tcp_ops.post(t, ep, ops, n);
			if (rc < 0) {
				fprintf(stderr, "kvb-tcp-bench: post: %s\n",
					strerror(-rc));
				break;
			}
			for (i = 0; i < (unsigned) rc; i++)
				t_post[(posted + i) % depth] =
					(uint64_t) (tp * 1e9);
			posted += (unsigned) rc;
		}
		k = kvb_tcp_ops.poll(t, c, 64);
		if (k < 0)
			break;
		for (i = 0; i < (unsigned) k; i++) {
			double tc = now_s();

			if (c[i].status) {
				errors++;
				if (!first_err)
					first_err = c[i].status;
			}
			if (nlat == cap) {
				cap = cap ? cap * 2 : 4096;
				lat = realloc(lat, cap * sizeof(*lat));
				if (!lat)
					return 1;
			}
			lat[nlat++] = (uint64_t) (tc * 1e9) -
				      t_post[c[i].cookie % depth];
			last = tc;
		}
		done += (uint64_t) k;
		if (!k && !n)
			wait_on(efd, 1);
		if (errors && errors == done && done > 100)
			break; /* nothing gets through */
	}
	kvb_tcp_get_stats(t, &st);
	secs = last - t0;
	if (secs <= 0)
		secs = 1e-9;
	done -= errors;
	gbs = (double) (done * o->size) / secs / 1e9;
	qsort(lat, nlat, sizeof(*lat), cmp_u64);
#define PCT(p) (nlat ? (double) lat[(size_t) ((nlat - 1) * (p))] / 1e3 : 0)
	if (o->json) {
		printf("{\"op\":\"%s\",\"bytes\":%llu,\"iters\":%llu,"
		       "\"depth\":%u,\"seconds\":%.3f,\"gbytes_per_s\":%.3f,"
		       "\"gbits_per_s\":%.3f,\"mpps\":%.4f,"
		       "\"writev_per_op\":%.3f,\"doorbells_per_op\":%.3f,"
		       "\"lat_p50_us\":%.1f,\"lat_p99_us\":%.1f,"
		       "\"errors\":%llu}\n",
		       o->read ? "read" : "write", (unsigned long long) o->size,
		       (unsigned long long) done, depth, secs, gbs, gbs * 8,
		       (double) done / secs / 1e6,
		       done ? (double) st.writev_calls / (double) done : 0,
		       done ? (double) t->stats.doorbells / (double) done : 0,
		       PCT(0.5), PCT(0.99), (unsigned long long) errors);
	} else {
		printf(" %-10s %-10s %-10s %-11s %-14s %-10s %-12s %-12s\n",
		       "#bytes", "#iters", "BW[GB/s]", "BW[Gbit/s]",
		       "MsgRate[Mpps]", "writev/op", "lat_p50[us]",
		       "lat_p99[us]");
		printf(" %-10llu %-10llu %-10.3f %-11.3f %-14.4f %-10.3f "
		       "%-12.1f %-12.1f\n",
		       (unsigned long long) o->size, (unsigned long long) done,
		       gbs, gbs * 8, (double) done / secs / 1e6,
		       done ? (double) st.writev_calls / (double) done : 0,
		       PCT(0.5), PCT(0.99));
	}
	if (errors)
		fprintf(stderr, "kvb-tcp-bench: %llu ops failed, first: %s\n",
			(unsigned long long) errors, strerror(-first_err));
	close(efd);
	kvb_tcp_ops.close(t);
	free(lat);
	free(ops);
	free(t_post);
	free(mem);
	return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"listen", required_argument, NULL, 'l'},
		{"connect", required_argument, NULL, 'c'},
		{"blob", required_argument, NULL, 'b'},
		{"host", required_argument, NULL, 'H'},
		{"size", required_argument, NULL, 's'},
		{"region", required_argument, NULL, 'r'},
		{"seconds", required_argument, NULL, 't'},
		{"depth", required_argument, NULL, 'd'},
		{"read", no_argument, NULL, 'R'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct opts o = {.size = 1u << 20,
			 .region = 64u << 20,
			 .seconds = 5,
			 .depth = 16};
	struct sigaction sa;
	int c;

	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'l':
			o.listen = optarg;
			break;
		case 'c':
			o.connect = optarg;
			break;
		case 'b':
			o.blob = optarg;
			break;
		case 'H':
			o.host = optarg;
			break;
		case 's':
			if (parse_size(optarg, &o.size))
				goto bad;
			o.size_set = 1;
			break;
		case 'r':
			if (parse_size(optarg, &o.region))
				goto bad;
			break;
		case 't':
			o.seconds = atof(optarg);
			break;
		case 'd':
			o.depth = (unsigned) atoi(optarg);
			break;
		case 'R':
			o.read = 1;
			break;
		case 'j':
			o.json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			goto bad;
		}
	}
	if (optind != argc || !!o.listen + !!o.connect + !!o.blob != 1)
		goto bad;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (o.listen)
		return run_listen(&o);
	if (o.size > KVB_TCP_MAX_OP)
		goto bad;
	return run_send(&o);
bad:
	usage(stderr);
	return 2;
}

/* SPDX-License-Identifier: MIT */
/* kvbctl: ask a running broker for its counters and tables. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"

static const struct {
	const char *name;
	uint32_t view; /* struct kvb_msg_stats's view */
} cmds[] = {
	{"stats", 0},
	{"workers", 1},
	{"transfers", 2},
	{"peers", 3},
	{"nics", 4},
	{"regions", 5},
};

static void usage(FILE *f)
{
	fputs("Usage: kvbctl [--socket PATH] [--json] [--watch S [--count N]] "
	      "COMMAND\n"
	      "Commands:\n"
	      "  stats      the broker's counters (workers, descriptors, "
	      "bytes,\n"
	      "             doorbells, wrs, wr_per_doorbell, transfers, "
	      "rejections)\n"
	      "  workers    each attached worker: id, role, dp, tp, pid, "
	      "descriptors,\n"
	      "             bytes, ring fill, transfers, ops in flight\n"
	      "  transfers  active transfers: handle, worker, state, age, "
	      "ops, id\n"
	      "  peers      cross-node peers: address, state, transport, "
	      "node\n"
	      "  nics       the rdma transport's NICs: port state, NUMA "
	      "node, PCI,\n"
	      "             bytes, wrs, doorbells, QPs, refused, moved, "
	      "regions\n"
	      "  regions    registered regions: id, worker, size, kind, "
	      "layer, access,\n"
	      "             the NIC their traffic goes through\n"
	      "Options:\n"
	      "  --socket PATH  the broker's socket (default: $KVB_SOCKET, "
	      "else\n"
	      "                 $XDG_RUNTIME_DIR/kvbroker/kvbroker.sock,\n"
	      "                 /run/kvbroker/kvbroker.sock for root, else "
	      "/tmp/kvbroker-UID/\n"
	      "                 kvbroker.sock; the directory must be private, "
	      "the broker\n"
	      "                 this uid, root or one in $KVB_BROKER_UIDS)\n"
	      "  --json         one JSON object instead of a table\n"
	      "  --watch S      repeat every S seconds (0.1 .. 3600) until "
	      "interrupted\n"
	      "  --count N      with --watch: stop after N times\n"
	      "  --version      print kvbctl's version\n"
	      "  -h, --help     this text\n"
	      "Options may come before or after the command.\n",
	      f);
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void) sig;
	stop = 1;
}

/* Sleep s seconds unless a signal stops us first. */
static void nap(double s)
{
	struct timespec ts = {.tv_sec = (time_t) s,
			      .tv_nsec =
				      (long) ((s - (double) (time_t) s) * 1e9)};

	while (!stop && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int check_dir(const char *path, const char *dflt)
{
	char dir[sizeof(((struct sockaddr_un *) 0)->sun_path)], why[256];

	if (strcmp(path, dflt) || kvb_default_socket_dir(dir, sizeof(dir)) <= 0)
		return 0;
	if (kvb_sock_dir_check(dir, getuid(), why, sizeof(why)) == -EACCES) {
		fprintf(stderr, "kvbctl: broker not trusted: %s\n", why);
		return 1;
	}
	return 0;
}

/* One request and its answer on stdout: 0, or 1 (said why). */
static int show(const char *path, const char *cmd, uint32_t view, int json,
		int watch)
{
	static char buf[KVB_MSG_MAX];
	int n = kvb_ctl_view(path, view, json, buf, sizeof(buf), 3000);

	if (n < 0) {
		if (n == -EINVAL && view)
			fprintf(stderr,
				"kvbctl: the broker at %s has no '%s' view "
				"(an older broker?)\n",
				path, cmd);
		else
			fprintf(stderr,
				"kvbctl: no %s from a broker at %s: %s\n", cmd,
				path,
				n == -EACCES ? kvb_strerror(n) : strerror(-n));
		return 1;
	}
	if (watch && !json) {
		char ts[32];
		time_t t = time(NULL);
		struct tm tm;

		strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S",
			 localtime_r(&t, &tm));
		printf("--- %s %s\n", cmd, ts);
	}
	fputs(buf, stdout);
	fflush(stdout);
	return 0;
}

static int parse_watch(const char *a, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(a, &end);
	if (errno || end == a || *end || !(v >= 0.1 && v <= 3600))
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_count(const char *a, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(a, &end, 10);
	if (errno || end == a || *end || v < 1)
		return -EINVAL;
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"watch", required_argument, NULL, 'w'},
		{"count", required_argument, NULL, 'c'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	char path[sizeof(((struct sockaddr_un *) 0)->sun_path)] = "";
	char dflt[sizeof(path)] = "";
	int c, json = 0, rc;
	double watch = 0;
	long count = 0;
	unsigned k;

	/* no "+": options after the command are taken too */
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg || strlen(optarg) >= sizeof(path)) {
				fprintf(stderr, "kvbctl: --socket: %s\n",
					*optarg ? "socket path too long"
						: "empty path");
				return 2;
			}
			memcpy(path, optarg, strlen(optarg) + 1);
			break;
		case 'j':
			json = 1;
			break;
		case 'w':
			if (parse_watch(optarg, &watch)) {
				fprintf(stderr,
					"kvbctl: --watch: bad seconds '%s' "
					"(0.1 .. 3600)\n",
					optarg);
				return 2;
			}
			break;
		case 'c':
			if (parse_count(optarg, &count)) {
				fprintf(stderr,
					"kvbctl: --count: bad number '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'V':
			printf("kvbctl %s (protocol %u)\n", KVB_VERSION_STRING,
			       KVB_PROTO_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	for (k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
		if (!strcmp(argv[optind], cmds[k].name))
			break;
	if (k == sizeof(cmds) / sizeof(cmds[0])) {
		fprintf(stderr, "kvbctl: unknown command '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "kvbctl: unknown argument '%s'\n",
			argv[optind + 1]);
		return 2;
	}
	if (count && !watch) {
		fprintf(stderr, "kvbctl: --count needs --watch\n");
		return 2;
	}
	if (!path[0]) {
		if (kvb_default_socket(path, sizeof(path)) < 0) {
			fprintf(stderr, "kvbctl: socket path too long\n");
			return 2;
		}
		memcpy(dflt, path, sizeof(path));
	}
	if (check_dir(path, dflt))
		return 1;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	for (long i = 0;; i++) {
		rc = show(path, cmds[k].name, cmds[k].view, json, watch > 0);
		/* watching: a broker that went away ends it (exit 1) */
		if (rc || !watch || stop || (count && i + 1 >= count))
			break;
		nap(watch);
		if (stop)
			break;
	}
	return rc;
}

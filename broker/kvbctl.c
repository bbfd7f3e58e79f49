/* SPDX-License-Identifier: MIT */
/* kvbctl: ask a running broker for its counters. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"

static void usage(FILE *f)
{
	fputs("Usage: kvbctl [--socket PATH] stats [--json]\n"
	      "  stats    print the broker's counters (workers, descriptors, "
	      "bytes,\n"
	      "           doorbells, wrs, wr_per_doorbell, transfers, "
	      "rejections)\n"
	      "  --socket PATH  the broker's socket (default: $KVB_SOCKET, "
	      "else\n"
	      "                 $XDG_RUNTIME_DIR/kvbroker/kvbroker.sock,\n"
	      "                 /run/kvbroker/kvbroker.sock for root, else "
	      "/tmp/kvbroker-UID/\n"
	      "                 kvbroker.sock; the directory must be private, "
	      "the broker\n"
	      "                 this uid, root or one in $KVB_BROKER_UIDS)\n"
	      "  --json   one JSON object instead of a table\n"
	      "Options may come before or after `stats`.\n",
	      f);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	static char buf[KVB_MSG_MAX];
	char path[sizeof(((struct sockaddr_un *) 0)->sun_path)] = "";
	char dflt[sizeof(path)] = "", dir[sizeof(path)];
	int c, json = 0, n;

	/* no "+": options after `stats` are taken too */
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
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
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc || strcmp(argv[optind], "stats")) {
		if (optind < argc)
			fprintf(stderr, "kvbctl: unknown command '%s'\n",
				argv[optind]);
		usage(stderr);
		return 2;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "kvbctl: unknown argument '%s'\n",
			argv[optind + 1]);
		return 2;
	}
	if (!path[0]) {
		if (kvb_default_socket(path, sizeof(path)) < 0) {
			fprintf(stderr, "kvbctl: socket path too long\n");
			return 2;
		}
		memcpy(dflt, path, sizeof(path));
	}
	if (!strcmp(path, dflt) &&
	    kvb_default_socket_dir(dir, sizeof(dir)) > 0) {
		char why[256];

		if (kvb_sock_dir_check(dir, getuid(), why, sizeof(why)) ==
		    -EACCES) {
			fprintf(stderr, "kvbctl: broker not trusted: %s\n",
				why);
			return 1;
		}
	}
	n = kvb_ctl_stats(path, json, buf, sizeof(buf), 3000);
	if (n < 0) {
		fprintf(stderr, "kvbctl: no stats from a broker at %s: %s\n",
			path, n == -EACCES ? kvb_strerror(n) : strerror(-n));
		return 1;
	}
	fputs(buf, stdout);
	return 0;
}

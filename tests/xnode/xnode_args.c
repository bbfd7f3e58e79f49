/* SPDX-License-Identifier: MIT */
/* xnode_worker's command line: the options, their defaults and checks. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker/kvbroker.h"
#include "xnode.h"

struct xnode_opts o = {.role = KVB_ROLE_P,
		       .tp_size = 1,
		       .peer_tp_size = 1,
		       .layers = 32,
		       .nblocks = 256,
		       .per_xfer = 24,
		       .xfers = 8,
		       .conc = 4,
		       .heads = 1,
		       .prefix = "tx",
		       .timeout_s = 60};

void xnode_usage(void)
{
	fprintf(stderr,
		"usage: xnode_worker --role P|D --socket PATH --peer HOST:PORT "
		"[--mode write|read] [--dp N] [--tp N] [--tp-size N] "
		"[--peer-tp-size N] [--peer-dp N] [--layers N] [--blocks N] "
		"[--per-xfer N] [--xfers N] [--conc N] [--prefix S] "
		"[--barrier DIR] [--expect-fail] [--timeout S] "
		"[--start-delay-ms N] [--swap-layer L --swap-after-xfers N] "
		"[--expect-some-fail] [--allow-fail] "
		"[--layer-delay-ms N] [--heads N] [--contig] [--no-verify] "
		"[--hold-s S] [--gpu host|cuda|hip|auto]\n"
		"  [--deadline-ms N]  kvb_transfer_set_timeouts: each "
		"transfer's deadline\n"
		"  [--quiet-check-ms N]  D (host memory): after a failure "
		"completion its regions\n"
		"                    must not change for N ms\n"
		"  [--peer-heads N]  D: heads a P rank holds (a head split: "
		"N = heads x D TP / P TP,\n"
		"                    or heads / (P TP / D TP))\n"
		"  [--notify-override HOST:PORT]  write_done/release go there\n"
		"  [--expect-cancel LIST]  these transfer indexes must end "
		"with\n"
		"                          -ECANCELED, the others succeed\n"
		"  [--expect-peer-error]  kvb_peer_connect must fail with "
		"-EACCES\n"
		"  [--hold-until FILE]  with --hold-s: stop holding once FILE "
		"exists\n"
		"  [--linger-until FILE]  after the transfers, stay attached "
		"(notify\n"
		"                         ports open) until FILE exists, at "
		"most --timeout\n"
		"  [--plain-release]  D, READ: release with the plain string\n"
		"  [--fail-errno N]  with --expect-fail: each transfer fails "
		"with -N\n"
		"  [--check-zero]  after holding: every byte of the regions is "
		"still 0\n"
		"  [--check LIST]  D, after holding: check the bytes of these\n"
		"                  transfers (opened by nobody here)\n");
}

int xnode_parse(int argc, char **argv)
{
	static const struct option lo[] = {{"role", 1, 0, 'r'},
					   {"socket", 1, 0, 's'},
					   {"peer", 1, 0, 'p'},
					   {"mode", 1, 0, 'm'},
					   {"dp", 1, 0, 'd'},
					   {"tp", 1, 0, 't'},
					   {"tp-size", 1, 0, 'T'},
					   {"peer-tp-size", 1, 0, 'R'},
					   {"peer-dp", 1, 0, 'D'},
					   {"layers", 1, 0, 'l'},
					   {"blocks", 1, 0, 'b'},
					   {"per-xfer", 1, 0, 'n'},
					   {"xfers", 1, 0, 'x'},
					   {"conc", 1, 0, 'c'},
					   {"prefix", 1, 0, 'P'},
					   {"barrier", 1, 0, 'B'},
					   {"expect-fail", 0, 0, 'F'},
					   {"timeout", 1, 0, 'o'},
					   {"layer-delay-ms", 1, 0, 'L'},
					   {"hold-s", 1, 0, 'H'},
					   {"heads", 1, 0, 'h'},
					   {"contig", 0, 0, 'C'},
					   {"no-verify", 0, 0, 'V'},
					   {"swap-layer", 1, 0, 'S'},
					   {"start-delay-ms", 1, 0, 'W'},
					   {"swap-after-xfers", 1, 0, 'A'},
					   {"expect-some-fail", 0, 0, 'e'},
					   {"allow-fail", 0, 0, 1001},
					   {"notify-override", 1, 0, 'N'},
					   {"expect-cancel", 1, 0, 'X'},
					   {"expect-peer-error", 0, 0, 'E'},
					   {"hold-until", 1, 0, 'U'},
					   {"linger-until", 1, 0, 'G'},
					   {"check", 1, 0, 'K'},
					   {"check-zero", 0, 0, 'Z'},
					   {"plain-release", 0, 0, 'Q'},
					   {"gpu", 1, 0, 'g'},
					   {"fail-errno", 1, 0, 'f'},
					   {"peer-heads", 1, 0, 'k'},
					   {"deadline-ms", 1, 0, 'j'},
					   {"quiet-check-ms", 1, 0, 'q'},
					   {0, 0, 0, 0}};
	int c;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'r':
			o.role = optarg[0] == 'D' ? KVB_ROLE_D : KVB_ROLE_P;
			break;
		case 's':
			o.socket = optarg;
			break;
		case 'p': {
			static char host[64];
			char *colon = strrchr(optarg, ':');

			if (!colon || colon - optarg >= 64)
				return -1;
			memcpy(host, optarg, (size_t) (colon - optarg));
			o.peer_host = host;
			o.peer_port = atoi(colon + 1);
			break;
		}
		case 'm':
			o.mode = !strcmp(optarg, "read") ? KVB_XFER_READ
							 : KVB_XFER_WRITE;
			break;
		case 'd':
			o.dp = atoi(optarg);
			break;
		case 't':
			o.tp = atoi(optarg);
			break;
		case 'T':
			o.tp_size = atoi(optarg);
			break;
		case 'R':
			o.peer_tp_size = atoi(optarg);
			break;
		case 'D':
			o.peer_dp = atoi(optarg);
			break;
		case 'l':
			o.layers = (unsigned) atoi(optarg);
			break;
		case 'b':
			o.nblocks = (unsigned) atoi(optarg);
			break;
		case 'n':
			o.per_xfer = (unsigned) atoi(optarg);
			break;
		case 'x':
			o.xfers = (unsigned) atoi(optarg);
			break;
		case 'c':
			o.conc = (unsigned) atoi(optarg);
			break;
		case 'P':
			o.prefix = optarg;
			break;
		case 'B':
			o.barrier = optarg;
			break;
		case 'F':
			o.expect_fail = 1;
			break;
		case 'S':
			o.swap_layer = atoi(optarg);
			break;
		case 'W':
			o.start_delay_ms = atoi(optarg);
			break;
		case 'A':
			o.swap_after = atoi(optarg);
			break;
		case 'e':
			o.expect_some_fail = 1;
			break;
		case 1001: /* any may fail (each must end), the last succeeds */
			o.expect_some_fail = 2;
			break;
		case 'o':
			o.timeout_s = atoi(optarg);
			break;
		case 'L':
			o.layer_delay_ms = atoi(optarg);
			break;
		case 'H':
			o.hold_s = atoi(optarg);
			break;
		case 'h':
			o.heads = (unsigned) atoi(optarg);
			break;
		case 'C':
			o.contig = 1;
			break;
		case 'V':
			o.no_verify = 1;
			break;
		case 'N': {
			char *colon = strrchr(optarg, ':');

			if (!colon || colon - optarg >= 64 || colon == optarg)
				return -1;
			memcpy(o.notify_host, optarg,
			       (size_t) (colon - optarg));
			o.notify_host[colon - optarg] = 0;
			o.notify_port = atoi(colon + 1);
			if (o.notify_port <= 0 || o.notify_port > 65535)
				return -1;
			break;
		}
		case 'X':
			o.expect_cancel = optarg;
			break;
		case 'Q':
			o.plain_release = 1;
			break;
		case 'E':
			o.expect_peer_error = 1;
			break;
		case 'U':
			o.hold_until = optarg;
			break;
		case 'G':
			o.linger_until = optarg;
			break;
		case 'K':
			o.check = optarg;
			break;
		case 'Z':
			o.check_zero = 1;
			break;
		case 'g':
			o.gpu = optarg;
			break;
		case 'f':
			o.fail_errno = atoi(optarg);
			break;
		case 'k':
			o.peer_heads = (unsigned) atoi(optarg);
			break;
		case 'j':
			o.deadline_ms = atoi(optarg);
			break;
		case 'q':
			o.quiet_check_ms = atoi(optarg);
			break;
		default:
			return -1;
		}
	}
	if (!o.socket || !o.peer_host || o.layers == 0 || o.conc == 0 ||
	    o.per_xfer == 0 || o.per_xfer * 3 > o.nblocks ||
	    o.per_xfer > 4096 || o.heads == 0 || (o.gpu && o.swap_after))
		return -1;
	if (o.peer_heads && o.peer_heads != o.heads &&
	    (o.tp_size == o.peer_tp_size ||
	     (o.tp_size > o.peer_tp_size ? o.tp_size % o.peer_tp_size
					 : o.peer_tp_size % o.tp_size)))
		return -1; /* a head split needs TP sizes that divide */
	return 0;
}

/* SPDX-License-Identifier: MIT */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "transport.h" /* KVB_NIC_MAX */

_Static_assert(KVB_RDMA_DEV_LEN >= KVB_NIC_MAX * KVB_RDMA_NAME_MAX,
	       "--rdma-dev holds KVB_NIC_MAX names");

int kvb_default_socket(char *buf, unsigned long len);
int kvb_default_socket_dir(char *buf, unsigned long len);

static const char *const tr_names[] = {"auto", "local", "tcp", "rdma", "gpu"};

const char *kvb_transport_name(enum kvb_transport_kind k)
{
	return (unsigned) k < 5 ? tr_names[k] : "?";
}

void kvb_options_default(struct kvb_options *o)
{
	memset(o, 0, sizeof(*o));
	/* too long ($KVB_SOCKET, $XDG_RUNTIME_DIR): empty, and parse refuses
	 * to start without --socket (workers would look elsewhere) */
	if (kvb_default_socket(o->socket_path, sizeof(o->socket_path)) < 0)
		o->socket_path[0] = '\0';
	else if (kvb_default_socket_dir(o->socket_dir, sizeof(o->socket_dir)) >
		 0)
		o->socket_private = 1;
	o->transport = KVB_TR_LOCAL;
	o->log_level = KVB_LOG_INFO;
	o->busy_poll_us = 50;
	o->sq_entries = 4096;
	o->cq_entries = 8192;
	o->max_workers = 256;
	o->burst = 64;
	o->post_batch_size = -1;
	o->transfer_timeout_ms = 30000;
	o->transfer_deadline_ms = 600000;
	o->defer_timeout_ms = 60000;
	o->peer_timeout_ms = 4000;
	o->unopened_timeout_ms = 60000;
	o->unknown_timeout_ms = 5000;
	snprintf(o->host_ip, sizeof(o->host_ip), "127.0.0.1");
	o->notify_port = 61005;
	o->handshake_port = 6301;
	o->ib_port = 1;
	o->gid_index = -1;
	o->qp_per_transfer = 1;
	o->tcp_conns = KVB_TCP_CONNS_DEF;
	o->tcp_max_conns = 256;
	o->tcp_max_conns_per_host = 32;
	o->tcp_auth_ms = 2000;
	o->gpu_streams = 64;
	o->copy_threads = -1;
	o->hello_timeout_ms = 2000;
	o->max_pending = 64;
	o->max_ring_entries = 1u << 16;
	o->max_undelivered = 16384;
}

/*
 * --help: the options, one entry each: the option and its argument, and
 * its text, lines separated by '\n'. The first line goes at column
 * USAGE_COL + 3 when the option fits in USAGE_COL columns, else right
 * after the option (whose gap is written in it); the others at that
 * column.
 */
#define USAGE_COL 22
struct usage_opt {
	const char *opt, *text;
};

static const struct usage_opt usage_opts[] = {
	{"--socket PATH",
	 "Unix socket (default $KVB_SOCKET, else kvbroker.sock in\n"
	 "$XDG_RUNTIME_DIR/kvbroker/, /run/kvbroker/ (root)\n"
	 "or /tmp/kvbroker-UID/: a 0700 directory of this uid)"},
	{"--transport NAME", "local|tcp|rdma|gpu|auto (default local)"},
	{"--log-level LEVEL", "error|warn|info|debug (default info)"},
	{"--log-format FMT", "text|json|journal|auto (default auto: journal\n"
			     "under systemd's journal, else text)"},
	{"--config FILE",
	 "read options from FILE first (\"key = value\" lines,\n"
	 "keys the long options without --); the command\n"
	 "line wins. A regular file of at most 1 MiB"},
	{"--busy-poll-us N", "spin N us idle before sleeping (default 50)"},
	{"--sq-entries N", "submission ring slots per worker (default 4096)"},
	{"--cq-entries N", "completion ring slots per worker (default 8192)"},
	{"--max-workers N", "(default 256)"},
	{"--burst N", "descriptors drained per worker per round (default 64,\n"
		      "at most 256)"},
	{"--post-batch-size N", "WRs per chain, -1 = all pending (default -1)"},
	{"--transfer-deadline S",
	 "seconds a transfer may take in all, from its open,\n"
	 "waiting its turn included (default 600)"},
	{"--stall-timeout S",
	 "seconds a transfer that started (ops submitted or\n"
	 "completed, a peer's message) may go without progress\n"
	 "(default 30); one that only waits its turn (opened,\n"
	 "nothing submitted, no peer activity) fails at its\n"
	 "deadline only"},
	{"--transfer-timeout S", "the same as --stall-timeout (older name)"},
	{"--defer-timeout S",
	 "seconds a write waits for remote blocks (default 60)\n"
	 "(each clock settable per transfer: kvb_transfer_set_timeouts)"},
	{"--peer-timeout S",
	 "seconds a peer broker with transfers in flight may go\n"
	 "without answering its heartbeat before it is declared\n"
	 "lost and its transfers fail with EHOSTDOWN (default 4)"},
	{"--unopened-timeout S",
	 "seconds remote_blocks for a transfer no P worker opened\n"
	 "is kept; then D hears kvb_write_failed ENOENT (default 60)"},
	{"--unknown-timeout S",
	 "the same for an id that the P worker, which declares the\n"
	 "transfers it will open (kvb_transfer_expect), does not\n"
	 "expect (default 5)"},
	{"--host-ip IP", "this node's address: enables the cross-node\n"
			 "bridge (notify ports, handshake port, tcp)"},
	{"--data-port N", "tcp transport port (default 0 = any free)"},
	{"--notify-port N", "(default 61005)"},
	{"--handshake-port N", "(default 6301)"},
	{"--read-mode", "ignored (MoRIIO compatibility): the client picks\n"
			"WRITE or READ per transfer (kvb_remote_xfer.mode)"},
	{"--trusted-hosts LIST",
	 "comma-separated peer IP addresses allowed to\n"
	 "hand-shake and to send to the notify ports"},
	{"--rdma-dev NAME",
	 "--ib-port N (1)  --gid-index N (auto)\n"
	 "NAME: a device, a comma-separated list (at most 8)\n"
	 "or all"},
	{"--max-qps N",
	 "rdma: QPs per device (default 0 = the device's limit)"},
	{"--qp-per-transfer N", "QPs per peer (default 1, at most 16)"},
	{"--tcp-conns N", "tcp: connections per peer (default 4, at most 16);\n"
			  "each chain goes to the one with the fewest bytes\n"
			  "in flight"},
	{"--tcp-max-conns N",
	 "tcp data port: connections served in all (default 256)"},
	{"--tcp-max-conns-per-host N",
	 "\n"
	 "... from one source address (default 32), authenticated\n"
	 "and, apart, not yet authenticated (a new one evicts\n"
	 "the address's oldest of those)"},
	{"--tcp-auth-timeout MS",
	 "ms a data-port connection has to authenticate\n"
	 "(default 2000)"},
	{"--cluster-key FILE",
	 "secret shared by the cluster's brokers: authenticates\n"
	 "handshakes and goes into the data port's keys\n"
	 "(docs/security.md)"},
	{"--gpu-streams N", "copy streams (default 64)"},
	{"--copy-threads N|auto",
	 "threads that copy large same-node chains with the\n"
	 "broker thread (0 = broker thread only; auto:\n"
	 "min(4, CPUs - 1), the default)"},
	{"--copy-plain", "same-node copies with memcpy only (default: copies\n"
			 "of >= 32 KiB use non-temporal stores where the CPU\n"
			 "has AVX2)"},
	{"--hello-timeout-ms N", "close connections that have not said HELLO\n"
				 "within N ms (default 2000)"},
	{"--max-pending N",
	 "connections before HELLO, apart from the worker\n"
	 "slots (default 64; the oldest is closed for a new one)"},
	{"--max-ring-entries N",
	 "largest ring a worker may ask for (default 65536)"},
	{"--max-transfers-per-worker N  ",
	 "hard cap (default 0: fair share only)"},
	{"--max-inflight-per-worker N   ",
	 "hard cap (default 0: fair share only)"},
	{"--max-undelivered N",
	 "completions queued for a worker past its full\n"
	 "completion ring before its submissions wait\n"
	 "(default 16384)"},
	{"--metrics-listen ADDR:PORT  ",
	 "serve Prometheus metrics on http://ADDR:PORT/metrics\n"
	 "(default off; 19476 suggested; docs/metrics.md)"},
	{"--help, --version", ""},
};

static void usage_opt_print(FILE *f, const struct usage_opt *u)
{
	const char *t = u->text, *nl = strchr(t, '\n');
	int n = nl ? (int) (nl - t) : (int) strlen(t);

	if (strlen(u->opt) > USAGE_COL)
		fprintf(f, "  %s%.*s\n", u->opt, n, t);
	else if (!n)
		fprintf(f, "  %s\n", u->opt);
	else
		fprintf(f, "  %-*s %.*s\n", USAGE_COL, u->opt, n, t);
	while (nl) {
		t = nl + 1;
		nl = strchr(t, '\n');
		n = nl ? (int) (nl - t) : (int) strlen(t);
		fprintf(f, "%*s%.*s\n", USAGE_COL + 3, "", n, t);
	}
}

void kvb_options_usage(FILE *f)
{
	fputs("Usage: kvbroker [OPTIONS]\n"
	      "One KV-cache transfer broker per node: workers attach over a "
	      "Unix socket\n"
	      "and submit descriptors through shared-memory rings.\n\n",
	      f);
	for (size_t i = 0; i < sizeof(usage_opts) / sizeof(usage_opts[0]); i++)
		usage_opt_print(f, &usage_opts[i]);
	fputs("\nExit status: 0 after a clean stop (SIGTERM, SIGINT); 1 when a "
	      "start-up\nfailure may pass on its own (a port or the socket "
	      "taken, a device\nmissing); 2 for a configuration error (a bad "
	      "option or config file, an\naddress not on this node, a missing "
	      "--cluster-key file): not restarted by\nthe systemd unit "
	      "(RestartPreventExitStatus=2).\n",
	      f);
}

static int fail(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* Parse an integer in [lo, hi]; 0 or -EINVAL. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int copy_str(char *dst, size_t cap, const char *s)
{
	if (strlen(s) >= cap)
		return -EINVAL;
	strcpy(dst, s);
	return 0;
}

enum {
	O_SOCKET = 256,
	O_TRANSPORT,
	O_LOG,
	O_BUSY,
	O_SQ,
	O_CQ,
	O_MAXW,
	O_BURST,
	O_BATCH,
	O_TTO,
	O_DTO,
	O_PEER_TO,
	O_UNOPENED_TO,
	O_UNKNOWN_TO,
	O_DEADLINE,
	O_STALL,
	O_HOST,
	O_NPORT,
	O_HPORT,
	O_READ,
	O_TRUST,
	O_RDEV,
	O_IBPORT,
	O_GID,
	O_QPS,
	O_TCP_CONNS,
	O_GSTREAMS,
	O_HELP,
	O_VER,
	O_DPORT,
	O_COPYT,
	O_COPYPLAIN,
	O_TCP_MAXC,
	O_TCP_MAXH,
	O_TCP_AUTHMS,
	O_CKEY,
	O_HELLO_TO,
	O_MAXPEND,
	O_MAXRING,
	O_MAXXPW,
	O_MAXIPW,
	O_MAXUNDEL,
	O_METRICS,
	O_LOGFMT,
	O_CONFIG,
	O_MAXQPS,
};

static const struct option longopts[] = {
	{"socket", required_argument, NULL, O_SOCKET},
	{"transport", required_argument, NULL, O_TRANSPORT},
	{"log-level", required_argument, NULL, O_LOG},
	{"log-format", required_argument, NULL, O_LOGFMT},
	{"config", required_argument, NULL, O_CONFIG},
	{"busy-poll-us", required_argument, NULL, O_BUSY},
	{"sq-entries", required_argument, NULL, O_SQ},
	{"cq-entries", required_argument, NULL, O_CQ},
	{"max-workers", required_argument, NULL, O_MAXW},
	{"burst", required_argument, NULL, O_BURST},
	{"post-batch-size", required_argument, NULL, O_BATCH},
	{"transfer-timeout", required_argument, NULL, O_TTO},
	{"stall-timeout", required_argument, NULL, O_STALL},
	{"transfer-deadline", required_argument, NULL, O_DEADLINE},
	{"defer-timeout", required_argument, NULL, O_DTO},
	{"peer-timeout", required_argument, NULL, O_PEER_TO},
	{"unopened-timeout", required_argument, NULL, O_UNOPENED_TO},
	{"unknown-timeout", required_argument, NULL, O_UNKNOWN_TO},
	{"host-ip", required_argument, NULL, O_HOST},
	{"notify-port", required_argument, NULL, O_NPORT},
	{"data-port", required_argument, NULL, O_DPORT},
	{"handshake-port", required_argument, NULL, O_HPORT},
	{"read-mode", no_argument, NULL, O_READ},
	{"trusted-hosts", required_argument, NULL, O_TRUST},
	{"rdma-dev", required_argument, NULL, O_RDEV},
	{"ib-port", required_argument, NULL, O_IBPORT},
	{"gid-index", required_argument, NULL, O_GID},
	{"qp-per-transfer", required_argument, NULL, O_QPS},
	{"max-qps", required_argument, NULL, O_MAXQPS},
	{"tcp-conns", required_argument, NULL, O_TCP_CONNS},
	{"gpu-streams", required_argument, NULL, O_GSTREAMS},
	{"copy-threads", required_argument, NULL, O_COPYT},
	{"copy-plain", no_argument, NULL, O_COPYPLAIN},
	{"tcp-max-conns", required_argument, NULL, O_TCP_MAXC},
	{"tcp-max-conns-per-host", required_argument, NULL, O_TCP_MAXH},
	{"tcp-auth-timeout", required_argument, NULL, O_TCP_AUTHMS},
	{"cluster-key", required_argument, NULL, O_CKEY},
	{"hello-timeout-ms", required_argument, NULL, O_HELLO_TO},
	{"max-pending", required_argument, NULL, O_MAXPEND},
	{"max-ring-entries", required_argument, NULL, O_MAXRING},
	{"max-transfers-per-worker", required_argument, NULL, O_MAXXPW},
	{"max-inflight-per-worker", required_argument, NULL, O_MAXIPW},
	{"max-undelivered", required_argument, NULL, O_MAXUNDEL},
	{"metrics-listen", required_argument, NULL, O_METRICS},
	{"help", no_argument, NULL, O_HELP},
	{"version", no_argument, NULL, O_VER},
	{NULL, 0, NULL, 0},
};

int kvb_option_kind(const char *name)
{
	for (const struct option *p = longopts; p->name; p++)
		if (!strcmp(p->name, name))
			return p->has_arg == required_argument;
	return -ENOENT;
}

static int is_pow2(long v)
{
	return v >= 2 && (v & (v - 1)) == 0;
}

/* The integer options: their range and the field they set. */
enum {
	N_POW2 = 1,    /* a power of two */
	N_SECONDS = 2, /* given in seconds, kept in ms */
	N_AUTO = 4,    /* "auto" is -1 */
	N_NONZERO = 8, /* 0 is not allowed inside the range */
};

struct num_opt {
	int code;
	long lo, hi;
	unsigned flags;
	size_t off, size; /* the field in struct kvb_options */
};

#define NUM(c, lo, hi, fl, field)                                   \
	{                                                           \
		c, lo, hi, fl, offsetof(struct kvb_options, field), \
			sizeof(((struct kvb_options *) 0)->field)   \
	}

static const struct num_opt num_opts[] = {
	NUM(O_BUSY, 0, 10000000, 0, busy_poll_us),
	NUM(O_SQ, 2, 1 << 20, N_POW2, sq_entries),
	NUM(O_CQ, 2, 1 << 20, N_POW2, cq_entries),
	NUM(O_MAXW, 1, 4096, 0, max_workers),
	NUM(O_BURST, 1, KVB_BURST_MAX, 0, burst),
	NUM(O_BATCH, -1, 65536, N_NONZERO, post_batch_size),
	NUM(O_TTO, 1, 86400, N_SECONDS, transfer_timeout_ms),
	NUM(O_STALL, 1, 86400, N_SECONDS, transfer_timeout_ms),
	NUM(O_DTO, 1, 86400, N_SECONDS, defer_timeout_ms),
	NUM(O_PEER_TO, 1, 3600, N_SECONDS, peer_timeout_ms),
	NUM(O_UNOPENED_TO, 1, 86400, N_SECONDS, unopened_timeout_ms),
	NUM(O_UNKNOWN_TO, 1, 86400, N_SECONDS, unknown_timeout_ms),
	NUM(O_DEADLINE, 1, 86400, N_SECONDS, transfer_deadline_ms),
	NUM(O_DPORT, 0, 65535, 0, data_port),
	NUM(O_NPORT, 1, 65535, 0, notify_port),
	NUM(O_HPORT, 1, 65535, 0, handshake_port),
	NUM(O_IBPORT, 1, 255, 0, ib_port),
	NUM(O_GID, -1, 255, 0, gid_index),
	NUM(O_QPS, 1, KVB_QP_PER_PEER_MAX, 0, qp_per_transfer),
	NUM(O_MAXQPS, 0, 1 << 24, 0, max_qps),
	NUM(O_TCP_CONNS, 1, KVB_TCP_CONNS_MAX, 0, tcp_conns),
	NUM(O_GSTREAMS, 1, 1024, 0, gpu_streams),
	NUM(O_COPYT, 0, 64, N_AUTO, copy_threads),
	NUM(O_TCP_MAXC, 1, 4096, 0, tcp_max_conns),
	NUM(O_TCP_MAXH, 1, 4096, 0, tcp_max_conns_per_host),
	NUM(O_TCP_AUTHMS, 10, 60000, 0, tcp_auth_ms),
	NUM(O_HELLO_TO, 10, 600000, 0, hello_timeout_ms),
	NUM(O_MAXPEND, 1, KVB_PENDING_MAX, 0, max_pending),
	NUM(O_MAXRING, 2, 1 << 20, N_POW2, max_ring_entries),
	NUM(O_MAXXPW, 0, 1 << 24, 0, max_xfers_per_worker),
	NUM(O_MAXIPW, 0, 1 << 24, 0, max_inflight_per_worker),
	NUM(O_MAXUNDEL, 1, 1 << 24, 0, max_undelivered),
};

static const char *opt_name(int code)
{
	for (const struct option *p = longopts; p->name; p++)
		if (p->val == code)
			return p->name;
	return "?";
}

/*
 * An integer option: 1 when `c` is not one, 0 when set, else -EINVAL with
 * the message in err.
 */
static int parse_num(struct kvb_options *o, int c, const char *a, char *err,
		     size_t err_len)
{
	const struct num_opt *n = NULL;
	int32_t i32;
	uint16_t u16;
	long v;

	for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++)
		if (num_opts[i].code == c)
			n = &num_opts[i];
	if (!n)
		return 1;
	if ((n->flags & N_AUTO) && !strcmp(a, "auto"))
		v = -1;
	else if (parse_int(a, n->lo, n->hi, &v) ||
		 ((n->flags & N_POW2) && !is_pow2(v)) ||
		 ((n->flags & N_NONZERO) && v == 0)) {
		if (n->flags & N_POW2)
			return fail(err, err_len,
				    "--%s: '%s' is not a power of two in [2, "
				    "%ld]",
				    opt_name(c), a, n->hi);
		return fail(err, err_len,
			    "--%s: bad value '%s' (%ld..%ld%s%s%s)",
			    opt_name(c), a, n->lo, n->hi,
			    n->flags & N_SECONDS ? " seconds" : "",
			    n->flags & N_NONZERO ? ", not 0" : "",
			    n->flags & N_AUTO ? " or auto" : "");
	}
	if (n->flags & N_SECONDS)
		v *= 1000;
	/* every field is a 16- or 32-bit integer and v is in its range */
	i32 = (int32_t) v;
	u16 = (uint16_t) v;
	memcpy((char *) o + n->off,
	       n->size == sizeof(u16) ? (void *) &u16 : (void *) &i32, n->size);
	return 0;
}

/*
 * --rdma-dev: "all", or device names separated by commas: none empty, none
 * longer than a verbs device name, at most KVB_NIC_MAX, none twice.
 */
static int check_rdma_dev(const char *a, char *err, size_t err_len)
{
	const char *name[KVB_NIC_MAX];
	size_t len[KVB_NIC_MAX];
	unsigned n = 0;

	if (!strcmp(a, "all"))
		return 0;
	for (const char *s = a;; s++) {
		size_t l = strcspn(s, ",");

		if (!l)
			return fail(err, err_len,
				    "--rdma-dev: '%s' has an empty device name",
				    a);
		if (l >= KVB_RDMA_NAME_MAX)
			return fail(err, err_len,
				    "--rdma-dev: a device name longer than %d "
				    "bytes in '%s'",
				    KVB_RDMA_NAME_MAX - 1, a);
		if (l == 3 && !strncmp(s, "all", 3))
			return fail(err, err_len,
				    "--rdma-dev: 'all' stands alone, not in a "
				    "list");
		if (n == KVB_NIC_MAX)
			return fail(err, err_len,
				    "--rdma-dev: more than %d devices in '%s'",
				    KVB_NIC_MAX, a);
		for (unsigned i = 0; i < n; i++)
			if (len[i] == l && !memcmp(name[i], s, l))
				return fail(err, err_len,
					    "--rdma-dev: '%.*s' named twice",
					    (int) l, s);
		name[n] = s;
		len[n++] = l;
		s += l;
		if (!*s)
			return 0;
	}
}

/* A string or flag option: 0, or -EINVAL with the message in err. */
static int parse_other(struct kvb_options *o, int c, const char *a,
		       const char *name, char *err, size_t err_len)
{
	int i;

	switch (c) {
	case O_SOCKET:
		if (copy_str(o->socket_path, sizeof(o->socket_path), a))
			return fail(err, err_len,
				    "--socket: path longer than %zu bytes",
				    sizeof(o->socket_path) - 1);
		o->socket_private = 0;
		return 0;
	case O_TRANSPORT:
		for (i = 0; i < 5; i++)
			if (!strcmp(a, tr_names[i]))
				break;
		if (i == 5)
			return fail(err, err_len,
				    "--transport: '%s' is not one of local, "
				    "tcp, rdma, gpu, auto",
				    a);
		o->transport = (enum kvb_transport_kind) i;
		return 0;
	case O_LOG:
		o->log_level = kvb_log_parse(a);
		if (o->log_level < 0)
			return fail(err, err_len,
				    "--log-level: '%s' is not error, warn, "
				    "info or debug",
				    a);
		return 0;
	case O_LOGFMT:
		o->log_format = kvb_log_format_parse(a);
		if (o->log_format < 0)
			return fail(err, err_len,
				    "--log-format: '%s' is not text, json, "
				    "journal or auto",
				    a);
		return 0;
	case O_HOST:
		o->xnode = 1;
		/* fall through */
	case O_CONFIG:
	case O_TRUST:
	case O_RDEV:
	case O_CKEY:
	case O_METRICS: { /* --metrics-listen is checked when it binds */
		char *dst = c == O_HOST	    ? o->host_ip
			    : c == O_CONFIG ? o->config_path
			    : c == O_TRUST  ? o->trusted_hosts
			    : c == O_RDEV   ? o->rdma_dev
			    : c == O_CKEY   ? o->cluster_key
					    : o->metrics_listen;
		size_t cap = c == O_HOST     ? sizeof(o->host_ip)
			     : c == O_CONFIG ? sizeof(o->config_path)
			     : c == O_TRUST  ? sizeof(o->trusted_hosts)
			     : c == O_RDEV   ? sizeof(o->rdma_dev)
			     : c == O_CKEY   ? sizeof(o->cluster_key)
					     : sizeof(o->metrics_listen);

		if (copy_str(dst, cap, a))
			return fail(err, err_len,
				    "--%s: too long (at most %zu bytes)",
				    opt_name(c), cap - 1);
		return c == O_RDEV ? check_rdma_dev(a, err, err_len) : 0;
	}
	case O_READ:
		o->read_mode = 1;
		return 0;
	case O_COPYPLAIN:
		o->copy_plain = 1;
		return 0;
	case O_HELP:
		o->help = 1;
		return 0;
	case O_VER:
		o->version = 1;
		return 0;
	case ':':
		return fail(err, err_len, "%s: missing argument", name);
	default:
		return fail(err, err_len, "unknown option '%s' (see --help)",
			    name);
	}
}

int kvb_options_parse(struct kvb_options *o, int argc, char **argv, char *err,
		      size_t err_len)
{
	int c, rc;

	kvb_options_default(o);
	optind = 0; /* not 1: 0 also resets getopt's state from a previous parse
		     */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
		const char *name =
			optind > 0 && optind <= argc ? argv[optind - 1] : "?";

		rc = parse_num(o, c, optarg, err, err_len);
		if (rc == 1)
			rc = parse_other(o, c, optarg, name, err, err_len);
		if (rc)
			return rc;
	}
	if (optind < argc)
		return fail(err, err_len, "unexpected argument '%s'",
			    argv[optind]);
	/* the broker's own defaults are always allowed */
	if (o->sq_entries > o->max_ring_entries)
		o->max_ring_entries = o->sq_entries;
	if (o->cq_entries > o->max_ring_entries)
		o->max_ring_entries = o->cq_entries;
	if (!o->socket_path[0] && !o->help && !o->version)
		return fail(err, err_len,
			    "the default socket path ($KVB_SOCKET, else "
			    "$XDG_RUNTIME_DIR/kvbroker/kvbroker.sock) is "
			    "longer than "
			    "%zu bytes: give --socket",
			    sizeof(o->socket_path) - 1);
	return 0;
}

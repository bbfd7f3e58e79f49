/* SPDX-License-Identifier: MIT */
/*
 * Runs kvbroker's notify endpoints for a prefill (P) instance, DP=1 TP=2, and
 * moriio_peer.py as a vLLM MoRIIO decode (D) instance, DP rank 1 of TP=D_TP
 * (2, or 4 for heterogeneous TP).
 * P answers each remote_blocks with write_done to D's notify_port +
 * off(decode_rank, tp_rank), as the WRITE state machine does once every
 * layer landed. Exit 77 when no python3 with pyzmq and msgpack is found.
 *
 * usage: test_zmq_moriio_peer PATH/moriio_peer.py [D_TP]
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zmq/notify.h"

#define HOST "127.0.0.1"
#define P_TP 2
#define D_DP 1

static uint32_t d_tp = 2; /* argv[2]: 2 (equal TP) or 4 (heterogeneous) */

extern char **environ;

struct prank {
	struct kvb_notify *n;
	uint32_t tp_rank;
	uint32_t d_base;
	int remote_blocks, untyped, releases, release_ctp, plain, plain_tp;
	int write_done_sent, bye, errors;
};

static int on_msg(void *arg, const struct kvb_zmsg *m, uint16_t port)
{
	struct prank *p = arg;
	struct kvb_zmsg wd;
	int rank, dport, ret;

	switch (m->type) {
	case KVB_ZMSG_REMOTE_BLOCKS:
		p->remote_blocks++;
		if (m->flags & KVB_ZMSG_F_UNTYPED)
			p->untyped++;
		if (m->decode_rank != D_DP || m->nblocks == 0) {
			p->errors++;
			return -EINVAL;
		}
		/* "all layers landed": tell the D rank we map to */
		rank = kvb_tp_remote_rank(p->tp_rank, P_TP, d_tp);
		dport = kvb_port_of(p->d_base, m->decode_rank, (uint32_t) rank,
				    d_tp, KVB_PORT_DP_TIMES_TP);
		ret = kvb_zmsg_init(&wd, KVB_ZMSG_WRITE_DONE, m->transfer_id);
		if (!ret)
			ret = kvb_notify_send(p->n, HOST, (uint32_t) dport,
					      &wd);
		if (ret) {
			fprintf(stderr, "write_done send: %s\n",
				strerror(-ret));
			p->errors++;
		} else {
			p->write_done_sent++;
		}
		return 0;
	case KVB_ZMSG_RELEASE:
		if (!strcmp(m->transfer_id, "tx-bye")) {
			p->bye++;
			return 0;
		}
		p->releases++;
		if (m->flags & KVB_ZMSG_F_CONSUMER_TP) {
			p->release_ctp++;
			/* fan-in: P waits for this many release ACKs */
			if (m->consumer_tp_size != d_tp ||
			    kvb_tp_release_acks(P_TP, m->consumer_tp_size) !=
				    (int) (d_tp > P_TP ? d_tp / P_TP : 1))
				p->errors++;
		}
		return 0;
	case KVB_ZMSG_PLAIN:
		p->plain++;
		if (m->flags & KVB_ZMSG_F_TP_RANK) {
			p->plain_tp++;
			if (m->tp_rank != 1)
				p->errors++;
		}
		if (strcmp(m->transfer_id, "tx-untyped-9a2e"))
			p->errors++;
		return 0;
	default: /* write_done is for D, not P */
		p->errors++;
		return -EPROTO;
	}
}

static void on_log(void *arg, int level, const char *line)
{
	fprintf(stderr, "kvb: %s\n", line);
}

static int spawn(const char *const argv[], bool quiet, pid_t *pid)
{
	posix_spawn_file_actions_t fa;
	int ret;

	posix_spawn_file_actions_init(&fa);
	if (quiet) {
		posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY,
						 0);
		posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY,
						 0);
	}
	ret = posix_spawnp(pid, argv[0], &fa, NULL, (char *const *) argv,
			   environ);
	posix_spawn_file_actions_destroy(&fa);
	return -ret;
}

/* A python3 that has pyzmq and msgpack, or NULL. */
static const char *find_python(void)
{
	static const char *cands[] = {NULL, "python3", "/usr/bin/python3"};
	const char *argv[] = {NULL, "-c", "import zmq, msgpack", NULL};
	int status;
	pid_t pid;
	size_t i;

	cands[0] = getenv("KVB_PYTHON");
	for (i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		if (!cands[i])
			continue;
		argv[0] = cands[i];
		if (spawn(argv, true, &pid))
			continue;
		if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		    WEXITSTATUS(status) == 0)
			return cands[i];
	}
	return NULL;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static int check(bool ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "FAIL: %s\n", what);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	char a_pbase[16], a_ptp[16], a_dbase[16], a_ddp[16], a_dtp[16];
	struct prank pr[P_TP] = {{0}};
	struct kvb_notify_conf conf;
	struct kvb_notify_stats st;
	struct pollfd pfd[P_TP * KVB_NOTIFY_MAX_SOCKS];
	const char *py, *env = getenv("KVB_TEST_PORT_BASE");
	uint32_t p_base, d_base;
	int status = 0, nfd = 0, fails = 0, i, k, ret;
	bool exited = false;
	uint64_t deadline;
	pid_t pid;

	if (argc < 2) {
		fprintf(stderr, "usage: %s moriio_peer.py\n", argv[0]);
		return 2;
	}
	if (argc > 2)
		d_tp = (uint32_t) atoi(argv[2]);
	if (d_tp != 2 && d_tp != 4) {
		fprintf(stderr, "D_TP must be 2 or 4\n");
		return 2;
	}
	py = find_python();
	if (!py) {
		printf("skip: no python3 with pyzmq and msgpack\n");
		return 77;
	}
	p_base = env ? (uint32_t) atoi(env)
		     : 20000u + (uint32_t) (getpid() % 1000) * 12u;
	d_base = p_base + 4; /* D ports: d_base + D_DP * d_tp + [0, d_tp) */

	for (i = 0; i < P_TP; i++) {
		memset(&conf, 0, sizeof(conf));
		conf.host_ip = HOST;
		conf.notify_port = p_base;
		conf.dp_rank = 0;
		conf.tp_rank = (uint32_t) i;
		conf.tp_size = P_TP;
		conf.on_msg = on_msg;
		conf.on_log = on_log;
		conf.arg = &pr[i];
		pr[i].tp_rank = (uint32_t) i;
		pr[i].d_base = d_base;
		ret = kvb_notify_open(&pr[i].n, &conf);
		if (ret) {
			fprintf(stderr, "notify open: %s\n", strerror(-ret));
			return 1;
		}
	}
	for (i = 0; i < P_TP; i++) {
		int fds[KVB_NOTIFY_MAX_SOCKS];

		k = kvb_notify_fds(pr[i].n, fds, KVB_NOTIFY_MAX_SOCKS);
		while (k-- > 0)
			pfd[nfd++] =
				(struct pollfd){.fd = fds[k], .events = POLLIN};
	}

	snprintf(a_pbase, sizeof(a_pbase), "%u", p_base);
	snprintf(a_ptp, sizeof(a_ptp), "%d", P_TP);
	snprintf(a_dbase, sizeof(a_dbase), "%u", d_base);
	snprintf(a_ddp, sizeof(a_ddp), "%d", D_DP);
	snprintf(a_dtp, sizeof(a_dtp), "%u", d_tp);
	{
		const char *pargv[] = {py,	argv[1], HOST,	a_pbase, a_ptp,
				       a_dbase, a_ddp,	 a_dtp, NULL};

		ret = spawn(pargv, false, &pid);
	}
	if (ret) {
		fprintf(stderr, "spawn %s: %s\n", py, strerror(-ret));
		return 1;
	}

	/* the broker loop: poll, drain, until the peer is done and said bye */
	deadline = now_ms() + 30000;
	while (now_ms() < deadline) {
		bool all_bye = true;

		for (i = 0; i < P_TP; i++) {
			while (kvb_notify_recv(pr[i].n, 16) == 16)
				;
			all_bye &= pr[i].bye == 1;
		}
		if (!exited && waitpid(pid, &status, WNOHANG) == pid)
			exited = true;
		if (exited && all_bye)
			break;
		poll(pfd, (nfds_t) nfd, 50);
	}
	if (!exited) {
		fprintf(stderr, "FAIL: peer did not finish in time\n");
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		fails++;
	}

	fails += check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		       "python peer checks (write_done fields, ports)");
	for (i = 0; i < P_TP; i++) {
		struct prank *p = &pr[i];

		kvb_notify_get_stats(p->n, &st);
		fails += check(p->errors == 0, "no unexpected message");
		fails += check(p->remote_blocks == 2, "remote_blocks x2");
		fails += check(p->untyped == 1, "one untyped remote_blocks");
		fails += check(p->write_done_sent == 2, "write_done x2 sent");
		fails += check(p->releases == 1, "one typed release");
		fails += check(p->plain == 1, "one plain-string release");
		fails += check(p->bye == 1, "bye");
		if (i == 0) {
			fails += check(p->release_ctp == 1,
				       "release with consumer_tp_size");
			fails += check(p->plain_tp == 0, "plain w/o :tp");
			fails += check(st.messages_rejected == 1,
				       "malformed message rejected");
		} else {
			fails += check(p->release_ctp == 0,
				       "release w/o consumer_tp_size");
			fails += check(p->plain_tp == 1, "plain :tp1 variant");
			fails += check(st.messages_rejected == 0,
				       "nothing rejected on tp1");
		}
		fails += check(st.messages_sent == 2, "sent counter");
		kvb_notify_close(p->n);
	}
	if (!fails)
		printf("moriio peer test: ok\n");
	return fails ? 1 : 0;
}

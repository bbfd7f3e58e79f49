/* SPDX-License-Identifier: MIT */
/*
 * peer_death: what a broker does when its peer broker dies (netns-test.sh
 * cases peer_death and unopened; docs/cross-node.md "Peer death").
 *
 * Runs two brokers itself, A (prefill, 192.0.2.1) and B (decode,
 * 192.0.2.2), each in the network namespace netns-test.sh made, and one P
 * worker on A and one D worker on B (workers reach their broker through
 * its unix socket, from any namespace). So it knows the instant it kills a
 * broker and the instant the other side's transfer fails.
 *
 * --case peer_death: `tries` times A is SIGKILLed, then `tries` times B,
 * each time with two transfers at the stage where it dies:
 *   W: D announced its blocks, P wrote layer 0 of 4 and is still writing
 *   U: D announced its blocks, P never opened the transfer
 * and measures from the kill to the surviving worker's failure completion
 * (D's W and U when A dies; P's W, and P's U opened 100 ms after the
 * kill, when B dies), which must come within --peer-timeout + 1 s with
 * EHOSTDOWN (P's U: any failure). The killed broker is restarted and a
 * transfer between new workers on the two nodes must succeed (every byte
 * checked). The survivor counts each death once (remote.peers_lost).
 * When A died, D's new open with it after the loss is refused at once
 * (-EHOSTDOWN), not held for another --peer-timeout.
 * Prints p50 and max per side and stage.
 *
 * --case unopened: A with --unopened-timeout 2: D announces a transfer
 * that A's P worker never opens; D's transfer must fail with ENOENT
 * (kvb_write_failed from A) 2 s later, not at its own clocks; the P
 * worker's late open of that id fails; the counters say so.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbroker/kvbroker.h"

#define LAYERS	  4u
#define NBLOCKS	  64u
#define BSIZE	  16u
#define HEADS	  2u
#define HDIM	  64u
#define ELEM	  2u
#define PER	  4u /* blocks per transfer */
#define TRIES_MAX 64
#define TAG_W	  1001u
#define TAG_U	  1002u
#define TAG_OK	  1003u

struct node {
	const char *name, *ns, *ip;
	char sock[256], log[256];
	pid_t pid;
};

struct side {
	struct kvb_ctx *ctx;
	struct kvb_region reg[LAYERS];
	uint32_t peer;
};

static const char *broker, *kvbctl, *dir, *ns_a, *ns_b, *tcase = "peer_death";
static int tries = 10, peer_to = 1, unopened_to = 2;
static struct node na = {"a", NULL, "192.0.2.1", "", "", 0},
		   nb = {"b", NULL, "192.0.2.2", "", "", 0};
static int failures;

static int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void check(int ok, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
	va_list ap;

	printf("%s ", ok ? "ok " : "BAD");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (!ok)
		failures++;
}

static void kill_brokers(void)
{
	if (na.pid > 0)
		kill(na.pid, SIGKILL);
	if (nb.pid > 0)
		kill(nb.pid, SIGKILL);
}

static void on_signal(int sig)
{
	kill_brokers();
	signal(sig, SIG_DFL);
	raise(sig);
}

static int start_broker(struct node *n)
{
	char pt[16], ut[16];
	pid_t pid;

	snprintf(pt, sizeof(pt), "%d", peer_to);
	snprintf(ut, sizeof(ut), "%d", unopened_to);
	unlink(n->sock);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int fd = open(n->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		/* ip netns exec execs the broker: this pid is the broker's */
		execlp("ip", "ip", "netns", "exec", n->ns, broker, "--socket",
		       n->sock, "--host-ip", n->ip, "--transport", "tcp",
		       "--busy-poll-us", "20", "--peer-timeout", pt,
		       "--unopened-timeout", ut, "--stall-timeout", "60",
		       "--defer-timeout", "60", (char *) NULL);
		_exit(127);
	}
	n->pid = pid;
	for (int i = 0; i < 400; i++) { /* 20 s */
		struct stat st;

		if (!stat(n->sock, &st) && S_ISSOCK(st.st_mode))
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			n->pid = 0;
			return -ECHILD;
		}
		usleep(50000);
	}
	return -ETIMEDOUT;
}

/* A worker of role on node n, its KV regions declared, connected to the
 * other node's broker. */
static int side_up(struct side *s, struct node *n, enum kvb_role role,
		   const char *peer_ip)
{
	struct kvb_attach_opts o = {.socket_path = n->sock,
				    .role = role,
				    .tp_size = 1,
				    .timeout_ms = 3000};
	struct kvb_kv_geometry g = {KVB_KV_KV_FIRST, NBLOCKS, BSIZE,
				    HEADS,	     HDIM,    ELEM};
	size_t len = 2ull * NBLOCKS * BSIZE * HEADS * HDIM * ELEM;
	int64_t end = now_us() + 10000000;
	int rc;

	memset(s, 0, sizeof(*s));
	rc = kvb_attach(&o, &s->ctx);
	if (rc)
		return rc;
	for (uint32_t l = 0; l < LAYERS; l++) {
		rc = kvb_mem_alloc(s->ctx, len,
				   KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ,
				   l, &s->reg[l]);
		if (!rc)
			rc = kvb_mem_set_kv(s->ctx, s->reg[l].id, l, &g);
		if (rc)
			return rc;
		memset(s->reg[l].addr, role == KVB_ROLE_P ? (int) (l + 1) : 0,
		       len);
	}
	do {
		rc = kvb_peer_connect(s->ctx, peer_ip, 6301, &s->peer);
		if (rc)
			usleep(100000);
	} while (rc && now_us() < end);
	return rc;
}

static void side_down(struct side *s)
{
	if (s->ctx)
		kvb_detach(s->ctx);
	s->ctx = NULL;
}

static void blocks(uint32_t first, uint32_t *v)
{
	for (uint32_t i = 0; i < PER; i++)
		v[i] = first + i;
}

static int xopen(struct side *s, const char *id, uint32_t first, uint32_t *h)
{
	uint32_t b[PER];
	struct kvb_remote_xfer x = {.peer = s->peer,
				    .mode = KVB_XFER_WRITE,
				    .blocks = b,
				    .nblocks = PER};
	int rc;
	int64_t end = now_us() + 5000000;

	blocks(first, b);
	do { /* D: the P side may not be known yet */
		rc = kvb_transfer_open_remote(s->ctx, id, &x, h);
		if (rc == -EHOSTUNREACH)
			usleep(50000);
	} while (rc == -EHOSTUNREACH && now_us() < end);
	return rc;
}

/* Wait for the KVB_COMP_TRANSFER of tag (or a failed layer op when
 * layer_fail): its status into *st, the time it came into *at; 0, or
 * -ETIMEDOUT after timeout_us. Other transfers' completions are kept in
 * got[] (by tag - TAG_W). */
struct got {
	int have;
	int status;
	int64_t at;
};
static struct got got[3];

static void drain(struct side *s, int ms)
{
	struct kvb_completion c[16];
	int n = kvb_wait(s->ctx, c, 16, ms);

	for (int i = 0; i < n; i++) {
		uint64_t t = c[i].tag;

		if (c[i].kind != KVB_COMP_TRANSFER || t < TAG_W || t > TAG_OK)
			continue;
		got[t - TAG_W] = (struct got){1, c[i].status, now_us()};
	}
}

static int wait_tag(struct side *s, uint64_t tag, int64_t timeout_us)
{
	int64_t end = now_us() + timeout_us;

	while (!got[tag - TAG_W].have && now_us() < end)
		drain(s, 20);
	return got[tag - TAG_W].have ? 0 : -ETIMEDOUT;
}

/* A layer op's completion (signalled): its status, or -ETIMEDOUT. */
static int wait_layer(struct side *s, uint64_t tag, int64_t timeout_us)
{
	int64_t end = now_us() + timeout_us;

	while (now_us() < end) {
		struct kvb_completion c[16];
		int n = kvb_wait(s->ctx, c, 16, 20);

		for (int i = 0; i < n; i++) {
			if (c[i].kind == KVB_COMP_DESC && c[i].tag == tag)
				return c[i].status;
			if (c[i].kind == KVB_COMP_TRANSFER &&
			    c[i].tag >= TAG_W && c[i].tag <= TAG_OK)
				got[c[i].tag - TAG_W] =
					(struct got){1, c[i].status, now_us()};
		}
	}
	return -ETIMEDOUT;
}

static int64_t stat_of(struct node *n, const char *key)
{
	char cmd[512], buf[65536], pat[80];
	FILE *f;
	size_t len;
	const char *p;

	snprintf(cmd, sizeof(cmd), "KVB_SOCKET=%s %s stats --json", n->sock,
		 kvbctl);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	pclose(f);
	buf[len] = 0;
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(buf, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* A WRITE transfer between new workers: succeeds, D holds P's bytes. */
static int transfer_ok(const char *id)
{
	struct side p = {0}, d = {0};
	uint32_t hp, hd;
	int rc;

	memset(got, 0, sizeof(got));
	rc = side_up(&p, &na, KVB_ROLE_P, nb.ip);
	if (!rc)
		rc = side_up(&d, &nb, KVB_ROLE_D, na.ip);
	if (!rc)
		rc = xopen(&d, id, 16, &hd);
	if (!rc)
		rc = kvb_transfer_seal(d.ctx, hd, 1, TAG_OK);
	if (!rc)
		rc = xopen(&p, id, 0, &hp);
	for (uint32_t l = 0; !rc && l < LAYERS; l++)
		rc = kvb_submit_layer(p.ctx, hp, (uint16_t) l, 100 + l,
				      KVB_DESC_UNSIGNALED) == 1
			     ? 0
			     : -EIO;
	if (!rc)
		rc = kvb_transfer_seal(p.ctx, hp, LAYERS, TAG_OK);
	if (!rc)
		rc = wait_tag(&p, TAG_OK, 10000000);
	if (!rc)
		rc = got[2].status;
	if (!rc) {
		got[2].have = 0;
		rc = wait_tag(&d, TAG_OK, 10000000);
	}
	if (!rc)
		rc = got[2].status;
	/* K of block 16 of each layer: P's pattern (layer + 1) */
	for (uint32_t l = 0; !rc && l < LAYERS; l++) {
		const uint8_t *v = (const uint8_t *) d.reg[l].addr +
				   16ull * BSIZE * HEADS * HDIM * ELEM;

		for (size_t i = 0;
		     i < (size_t) PER * BSIZE * HEADS * HDIM * ELEM; i++)
			if (v[i] != l + 1) {
				rc = -EBADMSG;
				break;
			}
	}
	side_down(&p);
	side_down(&d);
	return rc;
}

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;

	return x < y ? -1 : x > y;
}

static void report(const char *what, int64_t *v, int n)
{
	int64_t s[TRIES_MAX];

	memcpy(s, v, (size_t) n * sizeof(*s));
	qsort(s, (size_t) n, sizeof(*s), cmp64);
	printf("%-44s p50 %6.0f ms  max %6.0f ms  (%d tries)\n", what,
	       (double) s[n / 2] / 1000, (double) s[n - 1] / 1000, n);
	check(s[n - 1] <= (int64_t) (peer_to + 1) * 1000000,
	      "%s: max %.0f ms <= peer timeout + 1 s (%d ms)", what,
	      (double) s[n - 1] / 1000, (peer_to + 1) * 1000);
}

/* One try: `victim` dies at stage W and U; the time to each survivor
 * failure in dw, du (us). */
static int one_try(struct node *victim, int k, int64_t *dw, int64_t *du)
{
	int p_dies = victim == &na;
	struct side p = {0}, d = {0};
	uint32_t hpw, hdw, hdu, hpu = 0;
	char idw[64], idu[64], idok[64];
	int rc, st;
	int64_t t0, bound = (int64_t) (peer_to + 5) * 1000000;

	snprintf(idw, sizeof(idw), "w-%s-%d", victim->name, k);
	snprintf(idu, sizeof(idu), "u-%s-%d", victim->name, k);
	snprintf(idok, sizeof(idok), "ok-%s-%d", victim->name, k);
	memset(got, 0, sizeof(got));
	rc = side_up(&p, &na, KVB_ROLE_P, nb.ip);
	if (rc) {
		check(0, "P worker on A: %s", kvb_strerror(rc));
		goto out;
	}
	rc = side_up(&d, &nb, KVB_ROLE_D, na.ip);
	if (rc) {
		check(0, "D worker on B: %s", kvb_strerror(rc));
		goto out;
	}
	/* U announced first: the same notify path carries W's after it */
	rc = xopen(&d, idu, 8, &hdu);
	if (!rc)
		rc = kvb_transfer_seal(d.ctx, hdu, 1, TAG_U);
	if (!rc)
		rc = xopen(&d, idw, 0, &hdw);
	if (!rc)
		rc = kvb_transfer_seal(d.ctx, hdw, 1, TAG_W);
	if (!rc)
		rc = xopen(&p, idw, 0, &hpw);
	if (!rc)
		rc = kvb_submit_layer(p.ctx, hpw, 0, 100, 0) == 1 ? 0 : -EIO;
	if (!rc)
		rc = kvb_transfer_seal(p.ctx, hpw, LAYERS, TAG_W);
	/* layer 0 landed: D's blocks reached P, bytes moved; the other
	 * three layers are never submitted (P is "still writing") */
	if (!rc)
		rc = wait_layer(&p, 100, 10000000);
	if (rc) {
		check(0, "try %s %d: set-up: %s", victim->name, k,
		      kvb_strerror(rc));
		goto out;
	}
	kill(victim->pid, SIGKILL);
	t0 = now_us();
	waitpid(victim->pid, NULL, 0);
	victim->pid = 0;
	if (p_dies) {
		/* D's two transfers: W waits for write_done, U for P */
		wait_tag(&d, TAG_W, bound);
		wait_tag(&d, TAG_U, bound);
	} else {
		/* P's W; P opens U now, after its D died */
		usleep(100000);
		rc = xopen(&p, idu, 0, &hpu);
		for (uint32_t l = 0; !rc && l < LAYERS; l++)
			rc = kvb_submit_layer(p.ctx, hpu, (uint16_t) l, 200 + l,
					      KVB_DESC_UNSIGNALED) == 1
				     ? 0
				     : -EIO;
		if (!rc)
			rc = kvb_transfer_seal(p.ctx, hpu, LAYERS, TAG_U);
		if (rc) /* refused at once: that is its failure */
			got[1] = (struct got){1, rc, now_us()};
		wait_tag(&p, TAG_W, bound);
		wait_tag(&p, TAG_U, bound);
	}
	for (int i = 0; i < 2; i++) {
		int64_t dt = got[i].have ? got[i].at - t0 : bound;
		int want_hd = p_dies || i == 0;

		st = got[i].status;
		if (i == 0)
			*dw = dt;
		else
			*du = dt;
		check(got[i].have && st != 0 && (!want_hd || st == -EHOSTDOWN),
		      "%s killed, try %d: %s's %s transfer ended %s after "
		      "%.0f ms",
		      p_dies ? "P's broker" : "D's broker", k,
		      p_dies ? "D" : "P", i ? "U" : "W",
		      got[i].have ? kvb_strerror(st) : "never",
		      (double) dt / 1000);
	}
	if (p_dies) {
		/* a new transfer with the lost peer: refused at once, not
		 * held for another --peer-timeout */
		uint32_t hn;
		char idn[64];
		int64_t t1 = now_us();

		snprintf(idn, sizeof(idn), "n-%s-%d", victim->name, k);
		rc = xopen(&d, idn, 16, &hn);
		check(rc == -EHOSTDOWN && now_us() - t1 < 200000,
		      "P's broker killed, try %d: D's new open after the loss: "
		      "%s after %.1f ms (want %s at once)",
		      k, rc ? kvb_strerror(rc) : "opened",
		      (double) (now_us() - t1) / 1000,
		      kvb_strerror(-EHOSTDOWN));
	}
	side_down(&p);
	side_down(&d);
	rc = start_broker(victim);
	if (rc) {
		check(0, "restart %s: %s", victim->name, kvb_strerror(rc));
		return rc;
	}
	rc = transfer_ok(idok);
	check(!rc, "%s restarted, try %d: a new transfer: %s", victim->name, k,
	      rc ? kvb_strerror(rc) : "done, bytes checked");
	return 0;
out: /* detached: no worker left behind (nor leak reports) */
	side_down(&p);
	side_down(&d);
	return rc;
}

static int case_peer_death(void)
{
	int64_t dw[2][TRIES_MAX], du[2][TRIES_MAX];
	struct node *victims[2] = {&na, &nb};
	int64_t t_start = now_us();

	for (int v = 0; v < 2; v++) {
		struct node *surv = v ? &na : &nb;
		int64_t lost0 = stat_of(surv, "peers_lost");

		for (int k = 0; k < tries; k++)
			if (one_try(victims[v], k, &dw[v][k], &du[v][k]))
				return 1;
		{
			int64_t lost1 = stat_of(surv, "peers_lost");

			check(lost1 - lost0 == tries,
			      "%s counted %lld peers lost for %d deaths of %s",
			      surv->name, (long long) (lost1 - lost0), tries,
			      victims[v]->name);
		}
	}
	printf("peer death (--peer-timeout %d s, tcp, veth between two "
	       "namespaces), kill -9 to the survivor's failure:\n",
	       peer_to);
	report("P's broker killed: D's transfer, stage W", dw[0], tries);
	report("P's broker killed: D's transfer, stage U", du[0], tries);
	report("D's broker killed: P's transfer, stage W", dw[1], tries);
	report("D's broker killed: P opens U after it", du[1], tries);
	printf("total %.1f s\n", (double) (now_us() - t_start) / 1e6);
	return 0;
}

static int case_unopened(void)
{
	struct side p = {0}, d = {0};
	uint32_t hd, hp;
	int rc;
	int64_t t0, dt;

	memset(got, 0, sizeof(got));
	if (side_up(&p, &na, KVB_ROLE_P, nb.ip) ||
	    side_up(&d, &nb, KVB_ROLE_D, na.ip)) {
		check(0, "workers up");
		side_down(&p);
		side_down(&d);
		return 1;
	}
	rc = xopen(&d, "never-opened", 0, &hd);
	if (!rc)
		rc = kvb_transfer_seal(d.ctx, hd, 1, TAG_W);
	t0 = now_us();
	if (!rc)
		rc = wait_tag(&d, TAG_W,
			      (int64_t) (unopened_to + 10) * 1000000);
	dt = now_us() - t0;
	check(!rc && got[0].status == -ENOENT &&
		      dt >= (int64_t) unopened_to * 1000000 - 500000 &&
		      dt <= (int64_t) unopened_to * 1000000 + 1500000,
	      "D's transfer that P never opened: %s after %.0f ms "
	      "(--unopened-timeout %d s; want ENOENT)",
	      rc ? kvb_strerror(rc) : kvb_strerror(got[0].status),
	      (double) dt / 1000, unopened_to);
	/* P's worker opens it too late: the id has ended there */
	rc = xopen(&p, "never-opened", 0, &hp);
	check(rc == -ESTALE, "P's late open of it: %s (want %s)",
	      rc ? kvb_strerror(rc) : "opened", kvb_strerror(-ESTALE));
	check(stat_of(&na, "unopened_expired") == 1,
	      "A: remote.unopened_expired %lld (want 1)",
	      (long long) stat_of(&na, "unopened_expired"));
	check(stat_of(&nb, "write_failed_received") >= 1,
	      "B: remote.write_failed_received %lld (want >= 1)",
	      (long long) stat_of(&nb, "write_failed_received"));
	side_down(&p);
	side_down(&d);
	rc = transfer_ok("after-unopened");
	check(!rc, "a transfer afterwards: %s",
	      rc ? kvb_strerror(rc) : "done, bytes checked");
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: peer_death --broker PATH --kvbctl PATH --dir DIR "
		"--ns-a NS --ns-b NS [--case peer_death|unopened] "
		"[--tries N] [--peer-timeout S] [--unopened-timeout S]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		if (!strcmp(a, "--broker"))
			broker = v;
		else if (!strcmp(a, "--kvbctl"))
			kvbctl = v;
		else if (!strcmp(a, "--dir"))
			dir = v;
		else if (!strcmp(a, "--ns-a"))
			ns_a = v;
		else if (!strcmp(a, "--ns-b"))
			ns_b = v;
		else if (!strcmp(a, "--case"))
			tcase = v;
		else if (!strcmp(a, "--tries"))
			tries = atoi(v);
		else if (!strcmp(a, "--peer-timeout"))
			peer_to = atoi(v);
		else if (!strcmp(a, "--unopened-timeout"))
			unopened_to = atoi(v);
		else
			usage();
		i++;
	}
	if (!broker || !kvbctl || !dir || !ns_a || !ns_b || tries < 1 ||
	    tries > TRIES_MAX || peer_to < 1 || unopened_to < 1)
		usage();
	na.ns = ns_a;
	nb.ns = ns_b;
	snprintf(na.sock, sizeof(na.sock), "%s/a.sock", dir);
	snprintf(nb.sock, sizeof(nb.sock), "%s/b.sock", dir);
	snprintf(na.log, sizeof(na.log), "%s/broker-a.log", dir);
	snprintf(nb.log, sizeof(nb.log), "%s/broker-b.log", dir);
	atexit(kill_brokers);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGPIPE, SIG_IGN);
	if (start_broker(&na) || start_broker(&nb)) {
		fprintf(stderr, "peer_death: brokers did not start\n");
		return 1;
	}
	rc = !strcmp(tcase, "unopened") ? case_unopened() : case_peer_death();
	printf("%s: %d check(s) failed\n", tcase, failures);
	return rc || failures ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Where the two sides of a tcp run live, and cleanup on every exit path.
 *
 * As root, with `ip netns` working, kvbench makes two network namespaces
 * (P side, D side) joined by a veth pair, 192.0.2.1 and 192.0.2.2, the
 * layout of tests/xnode/netns-test.sh; every process of a side joins its
 * namespace with setns() right after fork. Otherwise both sides share
 * 127.0.0.1 on distinct ports.
 *
 * Cleanup: the namespaces are deleted at exit (atexit), on SIGINT, SIGTERM,
 * SIGHUP and SIGQUIT (the handler only unmounts and unlinks, both
 * async-signal-safe; the veth pair dies with its namespaces), and the
 * broker sockets kvbench made are unlinked. Children die with kvbench
 * (PR_SET_PDEATHSIG). Only SIGKILL can leave namespaces behind: the next
 * kvbench deletes those whose owner (the pid in the name) is gone, so at
 * most one set per killed kvbench lingers, until the next run.
 */
#include "kvbench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define NETNS_DIR "/run/netns"
#define NS_PREFIX "kvbench-"
#define MAX_PATHS 8
#define PATH_CAP  128
#define IP_P	  "192.0.2.1"
#define IP_D	  "192.0.2.2"

/* What the signal handler and atexit clean; written only by the parent
 * with signals blocked. */
static struct {
	pid_t owner;
	char paths[MAX_PATHS][PATH_CAP];
	char ns[2][PATH_CAP]; /* full paths under /run/netns */
	int inited;
} g;

static void sweep_sockets(void);

static void block_signals(sigset_t *old)
{
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGINT);
	sigaddset(&s, SIGTERM);
	sigaddset(&s, SIGHUP);
	sigaddset(&s, SIGQUIT);
	sigprocmask(SIG_BLOCK, &s, old);
}

static void set_slot(char *slot, const char *v)
{
	sigset_t old;

	block_signals(&old);
	if (v)
		snprintf(slot, PATH_CAP, "%s", v);
	else
		slot[0] = '\0';
	sigprocmask(SIG_SETMASK, &old, NULL);
}

/* async-signal-safe: what `ip netns del` does */
static void ns_delete(const char *path)
{
	if (!path[0])
		return;
	umount2(path, MNT_DETACH);
	unlink(path);
}

static void clean_all(void)
{
	for (unsigned i = 0; i < MAX_PATHS; i++)
		if (g.paths[i][0])
			unlink(g.paths[i]);
	ns_delete(g.ns[0]);
	ns_delete(g.ns[1]);
}

static void on_signal(int sig)
{
	if (getpid() == g.owner)
		clean_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void at_exit(void)
{
	if (getpid() == g.owner)
		clean_all();
}

void kvb_bench_cleanup_init(void)
{
	struct sigaction sa;

	if (g.inited)
		return;
	g.inited = 1;
	g.owner = getpid();
	sweep_sockets();
	atexit(at_exit);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGQUIT, &sa, NULL);
}

void kvb_bench_cleanup_path(const char *path, int add)
{
	for (unsigned i = 0; i < MAX_PATHS; i++) {
		if (add && !g.paths[i][0]) {
			set_slot(g.paths[i], path);
			return;
		}
		if (!add && !strcmp(g.paths[i], path)) {
			set_slot(g.paths[i], NULL);
			return;
		}
	}
}

int kvb_bench_enter_netns(const char *name)
{
	char path[PATH_CAP];
	int fd;

	snprintf(path, sizeof(path), NETNS_DIR "/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET)) {
		fprintf(stderr,
			"kvbench: cannot join network namespace %s: %s\n", name,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

int kvb_bench_netns_sysfs(void)
{
	/* as `ip netns exec` does: a private mount namespace, nothing
	 * propagated back, /sys remounted for the network namespace */
	if (unshare(CLONE_NEWNS) ||
	    mount("", "/", NULL, MS_SLAVE | MS_REC, NULL)) {
		fprintf(stderr, "kvbench: mount namespace: %s\n",
			strerror(errno));
		return -1;
	}
	(void) umount2("/sys", MNT_DETACH);
	if (mount("sysfs", "/sys", "sysfs", 0, NULL)) {
		fprintf(stderr, "kvbench: sysfs of the network namespace: %s\n",
			strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * Run `ip ARGS...`; 0 when it exited 0. Its stdout (if out) and stderr go to
 * out/err (first bytes), else to /dev/null.
 */
static int run_ip(char *out, size_t out_cap, char *err, size_t err_cap,
		  char *const *args)
{
	char *argv[24];
	int po[2] = {-1, -1}, pe[2] = {-1, -1}, st, n = 0;
	pid_t pid;

	argv[n++] = "ip";
	for (int i = 0; args[i] && n < 23; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	if (out)
		out[0] = '\0';
	if (err)
		err[0] = '\0';
	if ((out && pipe(po)) || (err && pipe(pe)))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int dn = open("/dev/null", O_WRONLY);

		dup2(out ? po[1] : dn, STDOUT_FILENO);
		dup2(err ? pe[1] : dn, STDERR_FILENO);
		execvp("ip", argv);
		_exit(127);
	}
	if (out)
		close(po[1]);
	if (err)
		close(pe[1]);
	for (int k = 0; k < 2; k++) {
		int fd = k ? pe[0] : po[0];
		char *buf = k ? err : out, sink[256];
		size_t cap = k ? err_cap : out_cap, len = 0;
		ssize_t r;

		if (fd < 0)
			continue;
		/* keep the first cap - 1 bytes, read the rest to EOF */
		while ((r = read(fd, len + 1 < cap ? buf + len : sink,
				 len + 1 < cap ? cap - 1 - len
					       : sizeof(sink))) > 0)
			if (len + 1 < cap)
				len += (size_t) r;
		buf[len] = '\0';
		close(fd);
		if (len && buf[len - 1] == '\n')
			buf[len - 1] = '\0';
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

#define IP(...) \
	run_ip(NULL, 0, e, sizeof(e), (char *const[]){__VA_ARGS__, NULL})

/* Is pid a live kvbench (not gone, not a zombie, not another program)? */
static int kvbench_alive(long pid)
{
	char path[64], buf[256], *p;
	size_t n;
	FILE *f;

	if (kill((pid_t) pid, 0) < 0 && errno == ESRCH)
		return 0;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
		return 0;
	*p = '\0';
	p = strchr(buf, '(');
	return p && !strcmp(p + 1, "kvbench");
}

/* Broker sockets of kvbench runs that were SIGKILLed. */
static void sweep_sockets(void)
{
	DIR *d = opendir("/tmp");
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[sizeof("/tmp/") + sizeof(de->d_name)], *end;
		long pid;

		if (strncmp(de->d_name, "kvbench-", 8))
			continue;
		pid = strtol(de->d_name + 8, &end, 10);
		if (*end != '-' || pid <= 0 || !strstr(end, ".sock") ||
		    pid == getpid() || kvbench_alive(pid))
			continue;
		snprintf(path, sizeof(path), "/tmp/%s", de->d_name);
		unlink(path);
	}
	closedir(d);
}

/* Namespaces of kvbench runs that were SIGKILLed: owner pid is gone. */
static void sweep_stale(void)
{
	DIR *d = opendir(NETNS_DIR);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[sizeof(NETNS_DIR) + sizeof(de->d_name) + 1], *end;
		const char *p = de->d_name;
		long pid;

		if (strncmp(p, NS_PREFIX, strlen(NS_PREFIX)))
			continue;
		p += strlen(NS_PREFIX);
		if ((*p != 'p' && *p != 'd') || p[1] != '-')
			continue;
		pid = strtol(p + 2, &end, 10);
		if (*end || pid <= 0 || pid == getpid() || kvbench_alive(pid))
			continue;
		snprintf(path, sizeof(path), NETNS_DIR "/%s", de->d_name);
		ns_delete(path);
		fprintf(stderr,
			"kvbench: deleted network namespace %s left by a "
			"killed kvbench (pid %ld)\n",
			de->d_name, pid);
	}
	closedir(d);
}

static void loopback(struct bench_net *n)
{
	/* distinct ports per kvbench below the ephemeral range: two brokers
	 * on one address need their own handshake and notify ports */
	int base = 20000 + (int) (getpid() % 30) * 400;

	n->netns = 0;
	snprintf(n->ip[0], sizeof(n->ip[0]), "127.0.0.1");
	snprintf(n->ip[1], sizeof(n->ip[1]), "127.0.0.1");
	n->hs_port[0] = base;
	n->hs_port[1] = base + 1;
	n->notify_port[0] = base + 10;
	n->notify_port[1] = base + 200;
}

static int up_wait(struct bench_net *n)
{
	char out[512], e[256];

	/* the veth reports UP once both ends are up: at most ~2 s */
	for (int i = 0; i < 100; i++) {
		int up = 1;

		for (int s = 0; s < 2; s++) {
			run_ip(out, sizeof(out), e, sizeof(e),
			       (char *const[]){"-n", n->ns[s], "-o", "link",
					       "show", "dev", n->veth[s],
					       NULL});
			up &= strstr(out, "state UP") != NULL;
		}
		if (up)
			return 0;
		usleep(20000);
	}
	return -1;
}

int kvb_bench_net_setup(struct bench_net *n, int want)
{
	const char *ip[2] = {IP_P, IP_D};
	char e[256] = "", cidr[2][24];
	int pid = (int) getpid();

	memset(n, 0, sizeof(*n));
	kvb_bench_cleanup_init();
	if (want == NET_LOOPBACK) {
		snprintf(n->why, sizeof(n->why), "--net loopback");
		loopback(n);
		return 0;
	}
	if (geteuid() != 0) {
		snprintf(n->why, sizeof(n->why), "not root");
		goto fallback;
	}
	sweep_stale();
	for (int s = 0; s < 2; s++) {
		snprintf(n->ns[s], sizeof(n->ns[s]), NS_PREFIX "%c-%d",
			 s ? 'd' : 'p', pid);
		snprintf(n->veth[s], sizeof(n->veth[s]), "kvbb%c%d",
			 s ? 'd' : 'p', pid % 10000000);
		snprintf(cidr[s], sizeof(cidr[s]), "%s/24", ip[s]);
	}
	/* registered first: a signal in the middle still deletes them */
	for (int s = 0; s < 2; s++) {
		char path[PATH_CAP];

		snprintf(path, sizeof(path), NETNS_DIR "/%s", n->ns[s]);
		set_slot(g.ns[s], path);
	}
	if (IP("netns", "add", n->ns[0])) {
		snprintf(n->why, sizeof(n->why), "ip netns add: %.120s",
			 e[0] ? e : "failed");
		set_slot(g.ns[0], NULL);
		set_slot(g.ns[1], NULL);
		goto fallback;
	}
	if (IP("netns", "add", n->ns[1]) ||
	    IP("link", "add", n->veth[0], "type", "veth", "peer", "name",
	       n->veth[1])) {
		snprintf(n->why, sizeof(n->why), "namespaces: %.120s",
			 e[0] ? e : "failed");
		goto undo;
	}
	for (int s = 0; s < 2; s++)
		if (IP("link", "set", n->veth[s], "netns", n->ns[s])) {
			snprintf(n->why, sizeof(n->why), "veth: %.120s",
				 e[0] ? e : "failed");
			IP("link", "del", n->veth[0]);
			goto undo;
		}
	for (int s = 0; s < 2; s++)
		if (IP("-n", n->ns[s], "addr", "add", cidr[s], "dev",
		       n->veth[s]) ||
		    IP("-n", n->ns[s], "link", "set", "lo", "up") ||
		    IP("-n", n->ns[s], "link", "set", n->veth[s], "up")) {
			snprintf(n->why, sizeof(n->why), "addresses: %.120s",
				 e[0] ? e : "failed");
			goto undo;
		}
	if (up_wait(n)) {
		snprintf(n->why, sizeof(n->why),
			 "the veth pair did not come up");
		goto undo;
	}
	n->netns = 1;
	for (int s = 0; s < 2; s++) {
		snprintf(n->ip[s], sizeof(n->ip[s]), "%s", ip[s]);
		n->hs_port[s] = 6301;
		n->notify_port[s] = 61005;
	}
	return 0;
undo:
	kvb_bench_net_teardown(n);
fallback:
	if (want == NET_NETNS) {
		fprintf(stderr,
			"kvbench: --net netns: cannot make the namespaces "
			"(%s)\n",
			n->why);
		return -1;
	}
	{
		char why[sizeof(n->why)];

		memcpy(why, n->why, sizeof(why));
		memset(n, 0, sizeof(*n));
		memcpy(n->why, why, sizeof(why));
	}
	loopback(n);
	return 0;
}

void kvb_bench_net_teardown(struct bench_net *n)
{
	sigset_t old;

	block_signals(&old);
	ns_delete(g.ns[0]);
	ns_delete(g.ns[1]);
	g.ns[0][0] = g.ns[1][0] = '\0';
	sigprocmask(SIG_SETMASK, &old, NULL);
	n->netns = 0;
}

void kvb_bench_net_describe(const struct bench_net *n, char *buf, size_t cap)
{
	if (n->netns)
		snprintf(buf, cap,
			 "network namespaces %s (P side, %s) and %s (D side, "
			 "%s) joined by a veth pair",
			 n->ns[0], n->ip[0], n->ns[1], n->ip[1]);
	else
		snprintf(buf, cap,
			 "loopback %s, distinct ports (no namespaces: %s)",
			 n->ip[0], n->why[0] ? n->why : "asked for");
}

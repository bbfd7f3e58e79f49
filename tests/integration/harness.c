/* SPDX-License-Identifier: MIT */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"

#ifndef KVB_BROKER_BIN
#error "KVB_BROKER_BIN must name the kvbroker binary"
#endif

#define MAX_ARGS 48

int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ms_since(int64_t t0)
{
	return (double) (now_ns() - t0) / 1e6;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000,
			      .tv_nsec = (long) (ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int broker_stats(const struct broker *b, char *buf, size_t cap)
{
	struct kvb_msg_stats req;
	int fd, n;

	if (cap < sizeof(struct kvb_msg_hdr) + 2)
		return -EINVAL;
	fd = kvb_ctl_connect(b->sock, 3000);
	if (fd < 0)
		return fd;
	kvb_msg_init(&req.h, KVB_MSG_STATS, sizeof(req));
	req.json = 1;
	n = kvb_ctl_send(fd, &req, sizeof(req), NULL, 0);
	if (!n)
		n = kvb_ctl_recv(fd, buf, cap - 1, NULL, NULL);
	close(fd);
	if (n < 0)
		return n;
	if (kvb_ctl_check_reply((struct kvb_msg_hdr *) buf, n, KVB_MSG_STATS,
				sizeof(struct kvb_msg_hdr) + 1))
		return -EPROTO;
	buf[n] = '\0';
	memmove(buf, buf + sizeof(struct kvb_msg_hdr),
		(size_t) n - sizeof(struct kvb_msg_hdr) + 1);
	return 0;
}

int broker_stats_as(const struct broker *b, uid_t uid, char *buf, size_t cap)
{
	int pfd[2], status, rc;
	size_t n = 0;
	ssize_t k;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		close(pfd[0]);
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 ||
		    setuid(uid) < 0)
			_exit(126);
		rc = broker_stats(b, buf, cap);
		if (rc)
			_exit(1);
		if (write(pfd[1], buf, strlen(buf) + 1) < 0)
			_exit(2);
		_exit(0);
	}
	close(pfd[1]);
	while (n < cap - 1 && (k = read(pfd[0], buf + n, cap - 1 - n)) > 0)
		n += (size_t) k;
	buf[n] = '\0';
	close(pfd[0]);
	if (waitpid(pid, &status, 0) != pid)
		return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

int64_t stat_get(const char *json, const char *key)
{
	char pat[96];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

int64_t broker_stat(const struct broker *b, const char *key)
{
	static char buf[KVB_MSG_MAX];

	if (broker_stats(b, buf, sizeof(buf)))
		return -1;
	return stat_get(buf, key);
}

int broker_wait_stat(const struct broker *b, const char *key, int64_t want,
		     int timeout_ms)
{
	int64_t t0 = now_ns();

	for (;;) {
		if (broker_stat(b, key) == want)
			return 0;
		if (ms_since(t0) > timeout_ms)
			return -ETIMEDOUT;
		sleep_ms(5);
	}
}

/* Fork and exec the broker with its log in a fresh temporary directory;
 * b->pid is the child. */
static int broker_spawn(struct broker *b, const struct broker_opts *o)
{
	const char *argv[MAX_ARGS];
	int argc = 0, logfd;

	memset(b, 0, sizeof(*b));
	snprintf(b->dir, sizeof(b->dir), "/tmp/kvbt-XXXXXX");
	if (!mkdtemp(b->dir))
		return -errno;
	snprintf(b->sock, sizeof(b->sock), "%s/b.sock", b->dir);
	snprintf(b->log, sizeof(b->log), "%s/broker.log", b->dir);
	if (o && o->uid && chown(b->dir, o->uid, o->uid) < 0)
		return -errno;
	logfd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (logfd < 0)
		return -errno;

	/* $KVB_TEST_BROKER_BIN: another build's broker (e.g. an older one,
	 * to see a test fail there) */
	argv[argc++] = getenv("KVB_TEST_BROKER_BIN")
			       ? getenv("KVB_TEST_BROKER_BIN")
			       : KVB_BROKER_BIN;
	argv[argc++] = "--socket";
	argv[argc++] = b->sock;
	argv[argc++] = "--busy-poll-us";
	argv[argc++] = "20";
	for (int i = 0; o && o->args && o->args[i] && argc < MAX_ARGS - 1; i++)
		argv[argc++] = o->args[i];
	argv[argc] = NULL;

	b->pid = fork();
	if (b->pid < 0) {
		close(logfd);
		return -errno;
	}
	if (b->pid == 0) {
		int nullfd = open("/dev/null", O_RDONLY);

		/* fds 0-2 always open, so an idle broker holds exactly
		 * BROKER_IDLE_FDS */
		if (nullfd >= 0 && nullfd != 0) {
			dup2(nullfd, 0);
			close(nullfd);
		}
		dup2(logfd, 1);
		dup2(logfd, 2);
		/* nothing of ours (or of ctest's) leaks into its fd table */
		for (int fd = 3; fd < 1024; fd++)
			close(fd);
		if (o && o->uid &&
		    (setgroups(0, NULL) < 0 || setgid(o->uid) < 0 ||
		     setuid(o->uid) < 0)) {
			perror("setuid");
			_exit(126);
		}
		execv(argv[0], (char *const *) argv);
		perror("execv " KVB_BROKER_BIN);
		_exit(127);
	}
	close(logfd);
	return 0;
}

int broker_start(struct broker *b, const struct broker_opts *o)
{
	static char buf[KVB_MSG_MAX];
	int64_t t0;
	int rc, status;

	rc = broker_spawn(b, o);
	if (rc)
		return rc;
	t0 = now_ns();
	while (ms_since(t0) < 10000) {
		if (waitpid(b->pid, &status, WNOHANG) == b->pid) {
			fprintf(stderr,
				"harness: broker exited at start (%#x)\n",
				status);
			broker_log_dump(b);
			b->pid = 0;
			return -ECHILD;
		}
		/* a broker of another uid refuses us: ask as that uid */
		if (o && o->uid && o->uid != getuid()) {
			if (broker_stats_as(b, o->uid, buf, sizeof(buf)) == 0)
				return 0;
		} else if (broker_stats(b, buf, sizeof(buf)) == 0) {
			return 0;
		}
		sleep_ms(5);
	}
	fprintf(stderr, "harness: broker did not answer within 10 s\n");
	broker_log_dump(b);
	broker_kill(b);
	return -ETIMEDOUT;
}

static int reap(pid_t pid, int timeout_ms)
{
	int64_t t0 = now_ns();
	int status;

	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status)
						 : 128 + WTERMSIG(status);
		if (r < 0)
			return -errno;
		if (ms_since(t0) > timeout_ms)
			return -ETIMEDOUT;
		sleep_ms(2);
	}
}

int broker_run_to_exit(struct broker *b, const struct broker_opts *o,
		       int timeout_ms)
{
	int rc = broker_spawn(b, o);

	if (rc)
		return rc;
	rc = reap(b->pid, timeout_ms);
	if (rc == -ETIMEDOUT) {
		kill(b->pid, SIGKILL);
		reap(b->pid, 10000);
	}
	b->pid = 0;
	return rc;
}

void broker_cleanup(struct broker *b)
{
	if (!b->dir[0])
		return;
	unlink(b->sock);
	unlink(b->log);
	rmdir(b->dir);
	b->dir[0] = '\0';
}

int broker_stop(struct broker *b)
{
	int rc;

	if (b->pid <= 0)
		return -ECHILD;
	kill(b->pid, SIGTERM);
	rc = reap(b->pid, 10000);
	if (rc == -ETIMEDOUT) {
		fprintf(stderr, "harness: broker ignored SIGTERM for 10 s\n");
		kill(b->pid, SIGKILL);
		reap(b->pid, 10000);
	}
	b->pid = 0;
	if (rc)
		broker_log_dump(b);
	return rc;
}

void broker_kill(struct broker *b)
{
	if (b->pid > 0) {
		kill(b->pid, SIGKILL);
		reap(b->pid, 10000);
	}
	b->pid = 0;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t cap = 0, n = 0, k;

	if (!f)
		return NULL;
	do {
		if (cap - n < 4096) {
			char *nb = realloc(buf, cap + 65536);

			if (!nb)
				break;
			buf = nb;
			cap += 65536;
		}
		k = fread(buf + n, 1, cap - n - 1, f);
		n += k;
	} while (k > 0);
	fclose(f);
	if (buf)
		buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}

int broker_log_has(const struct broker *b, const char *s)
{
	char *t = slurp(b->log, NULL);
	int found = t && strstr(t, s);

	free(t);
	return found;
}

void broker_log_dump(const struct broker *b)
{
	size_t n = 0;
	char *t = slurp(b->log, &n);

	if (!t)
		return;
	fprintf(stderr, "---- broker log (%s), last 8 KiB ----\n%s\n----\n",
		b->log, n > 8192 ? t + n - 8192 : t);
	free(t);
}

static int count_dir(const char *path, const char *contains)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
		    (!contains || strstr(e->d_name, contains)))
			n++;
	closedir(d);
	return n;
}

int proc_fd_count(pid_t pid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
	return count_dir(path, NULL);
}

int proc_map_count(pid_t pid)
{
	char path[64];
	char *t;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int) pid);
	t = slurp(path, NULL);
	if (!t)
		return -errno;
	for (char *p = t; *p; p++)
		n += *p == '\n';
	free(t);
	return n;
}

int proc_fd_wait(pid_t pid, int max, int timeout_ms)
{
	int64_t t0 = now_ns();
	int n;

	while ((n = proc_fd_count(pid)) > max && ms_since(t0) < timeout_ms)
		sleep_ms(5);
	return n;
}

int devshm_kvb_count(void)
{
	return count_dir("/dev/shm", "kvb");
}

static inline uint8_t pat(uint32_t seed, uint64_t off)
{
	uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^
		     (off >> 3) * 0xbf58476d1ce4e5b9ull;

	x ^= x >> 29;
	return (uint8_t) (x ^ off);
}

void pattern_fill(void *p, uint64_t len, uint32_t seed, uint64_t off)
{
	uint8_t *b = p;

	for (uint64_t i = 0; i < len; i++)
		b[i] = pat(seed, off + i);
}

uint64_t pattern_check(const void *p, uint64_t len, uint32_t seed, uint64_t off)
{
	const uint8_t *b = p;
	uint64_t bad = 0;

	for (uint64_t i = 0; i < len; i++)
		bad += b[i] != pat(seed, off + i);
	return bad;
}

int run_cmd(char *const argv[], char *out, size_t cap, int timeout_s)
{
	int pfd[2] = {-1, -1};
	size_t n = 0;
	pid_t pid;
	int rc;

	if (out && pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		if (out)
			dup2(pfd[1], 1);
		execv(argv[0], argv);
		perror("execv");
		_exit(127);
	}
	if (out) {
		int64_t t0 = now_ns();

		close(pfd[1]);
		for (;;) {
			struct pollfd p = {.fd = pfd[0], .events = POLLIN};
			ssize_t k;

			if (poll(&p, 1, 100) <= 0) {
				if (ms_since(t0) > timeout_s * 1000.0)
					break;
				continue;
			}
			k = read(pfd[0], out + n, cap - 1 - n);
			if (k <= 0)
				break;
			n += (size_t) k;
			if (n == cap - 1)
				break;
		}
		out[n] = '\0';
		close(pfd[0]);
	}
	rc = reap(pid, timeout_s * 1000);
	if (rc == -ETIMEDOUT) {
		kill(pid, SIGKILL);
		reap(pid, 5000);
	}
	return rc;
}

struct kvb_ctx *w_attach(const struct broker *b, enum kvb_role role,
			 uint32_t tp_rank, uint32_t tp_size,
			 uint32_t sq_entries)
{
	struct kvb_attach_opts o = {.socket_path = b->sock,
				    .role = role,
				    .tp_rank = tp_rank,
				    .tp_size = tp_size,
				    .sq_entries = sq_entries};
	struct kvb_ctx *c = NULL;
	int rc = kvb_attach(&o, &c);

	if (rc) {
		errno = -rc;
		return NULL;
	}
	return c;
}

int w_collect(struct kvb_ctx *c, struct kvb_completion *v, unsigned want,
	      int timeout_ms)
{
	int64_t t0 = now_ns();
	unsigned got = 0;

	while (got < want) {
		int left = timeout_ms - (int) ms_since(t0);
		int n;

		if (left <= 0)
			break;
		n = kvb_wait(c, v + got, want - got, left);
		if (n == -ETIMEDOUT)
			break;
		if (n < 0)
			return got ? (int) got : n;
		got += (unsigned) n;
	}
	return (int) got;
}

int w_find(const struct kvb_completion *v, int n, uint32_t kind, uint64_t tag)
{
	for (int i = 0; i < n; i++)
		if (v[i].kind == kind && v[i].tag == tag)
			return i;
	return -1;
}

int w_transfer_write(struct kvb_ctx *c, const char *id, struct kvb_desc d)
{
	struct kvb_completion v[2];
	uint32_t h;
	int rc, n;

	rc = kvb_transfer_open(c, id, &h);
	if (rc)
		return rc;
	d.transfer = h;
	rc = kvb_submit_write(c, &d, 1);
	if (rc != 1)
		return rc < 0 ? rc : -EAGAIN;
	rc = kvb_transfer_seal(c, h, 1, 2);
	if (rc)
		return rc;
	n = w_collect(c, v, 2, 5000);
	if (n < 0)
		return n;
	if (n < 2)
		return -ETIMEDOUT;
	n = w_find(v, 2, KVB_COMP_TRANSFER, 2);
	return n < 0 ? -EPROTO : v[n].status;
}

struct fixture fx;

int fixture_setup(void **state)
{
	const struct broker_opts o = {.args = fx.args};

	(void) state;
	fx.ctx = NULL;
	if (broker_start(&fx.br, &o))
		return -1;
	if (!fx.size)
		return 0;
	fx.ctx = w_attach(&fx.br, KVB_ROLE_P, 0, 1, 0);
	if (!fx.ctx || kvb_mem_alloc(fx.ctx, fx.size, 0, 1, &fx.src) ||
	    kvb_mem_alloc(fx.ctx, fx.size, 0, 2, &fx.dst))
		return -1;
	pattern_fill(fx.src.addr, fx.size, fx.seed, 0);
	return 0;
}

int fixture_teardown(void **state)
{
	int rc;

	(void) state;
	if (fx.ctx)
		kvb_detach(fx.ctx);
	fx.ctx = NULL;
	rc = broker_stop(&fx.br);
	broker_cleanup(&fx.br);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------- broker pairs */

static int pair_args(const char **v, size_t cap, const char *hs,
		     const char *notify, const char *const *extra)
{
	const char *base[] = {
		"--host-ip",	 "127.0.0.1", "--handshake-port", hs,
		"--notify-port", notify,      "--trusted-hosts",  "127.0.0.1"};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++)
		v[n++] = base[i];
	for (size_t i = 0; extra && extra[i]; i++) {
		if (n + 1 >= cap)
			return -E2BIG;
		v[n++] = extra[i];
	}
	v[n] = NULL;
	return 0;
}

int broker_pair_start(struct broker_pair *p, const char *const *extra)
{
	static unsigned k;
	const char *aa[32], *ab[32];
	struct broker_opts oa = {.args = aa}, ob = {.args = ab};
	int rc = -1;

	for (int tries = 0; rc && tries < 4; tries++) {
		uint16_t base = (uint16_t) (20000 + (getpid() % 120) * 100 +
					    (k++ % 6) * 16);

		memset(&p->a, 0, sizeof(p->a));
		memset(&p->b, 0, sizeof(p->b));
		p->hs_a = base;
		p->hs_b = (uint16_t) (base + 8);
		snprintf(p->ha, sizeof(p->ha), "%u", p->hs_a);
		snprintf(p->na, sizeof(p->na), "%u", p->hs_a + 1);
		snprintf(p->hb, sizeof(p->hb), "%u", p->hs_b);
		snprintf(p->nb, sizeof(p->nb), "%u", p->hs_b + 1);
		rc = pair_args(aa, 32, p->ha, p->na, extra);
		if (!rc)
			rc = pair_args(ab, 32, p->hb, p->nb, extra);
		if (rc)
			return rc;
		rc = broker_start(&p->a, &oa);
		if (!rc)
			rc = broker_start(&p->b, &ob);
		if (rc)
			broker_pair_kill(p);
	}
	return rc;
}

int broker_pair_stop(struct broker_pair *p)
{
	int ra = broker_stop(&p->a), rb = broker_stop(&p->b);

	broker_cleanup(&p->a);
	broker_cleanup(&p->b);
	return ra ? ra : rb;
}

void broker_pair_kill(struct broker_pair *p)
{
	broker_kill(&p->a);
	broker_cleanup(&p->a);
	broker_kill(&p->b);
	broker_cleanup(&p->b);
}

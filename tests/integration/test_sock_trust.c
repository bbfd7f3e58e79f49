/* SPDX-License-Identifier: MIT */
/*
 * Whom a worker talks to. A process of another uid (nobody) that listens
 * where the broker should (a squatted path) gets nothing from the library:
 * no HELLO, no descriptor, no fd; it only sees the connect and the hang-up
 * (the peer's SO_PEERCRED uid is checked first). The default path lives in
 * a private directory ($XDG_RUNTIME_DIR/kvbroker here): the library
 * refuses one of another owner or open to others before connecting, and the
 * broker refuses to start in one (a missing one it creates 0700). Needs
 * root (setuid to nobody): skipped otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl.h"
#include "harness.h"

#define NOBODY 65534

static char top[64]; /* a root-owned 0700 temporary directory */

/* What the fake broker saw: connections, bytes and fds received. */
struct seen {
	int conns, bytes, fds;
};

struct fake {
	pid_t pid;
	int rd; /* its report */
};

static int become(uid_t uid)
{
	return setgroups(0, NULL) || setgid(uid) || setuid(uid) ? -1 : 0;
}

/* The fake broker's child: listen on path as uid, take one connection,
 * record everything that comes on it for up to 1.5 s, report. */
static void fake_main(const char *path, uid_t uid, int wr)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct seen s = {0};
	struct pollfd p;
	int fd, c;

	if (become(uid))
		_exit(126);
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) ||
	    chmod(path, 0777) || listen(fd, 8))
		_exit(125);
	if (write(wr, "R", 1) != 1)
		_exit(124);
	p = (struct pollfd){.fd = fd, .events = POLLIN};
	if (poll(&p, 1, 3000) == 1 && (c = accept(fd, NULL, NULL)) >= 0) {
		s.conns = 1;
		for (;;) {
			char buf[4096], cbuf[CMSG_SPACE(16 * sizeof(int))];
			struct iovec iov = {.iov_base = buf,
					    .iov_len = sizeof(buf)};
			struct msghdr mh = {.msg_iov = &iov,
					    .msg_iovlen = 1,
					    .msg_control = cbuf,
					    .msg_controllen = sizeof(cbuf)};
			struct cmsghdr *cm;
			ssize_t n;

			p = (struct pollfd){.fd = c, .events = POLLIN};
			if (poll(&p, 1, 1500) != 1)
				break;
			n = recvmsg(c, &mh, 0);
			if (n <= 0)
				break;
			s.bytes += (int) n;
			for (cm = CMSG_FIRSTHDR(&mh); cm;
			     cm = CMSG_NXTHDR(&mh, cm))
				if (cm->cmsg_type == SCM_RIGHTS)
					s.fds += (int) ((cm->cmsg_len -
							 CMSG_LEN(0)) /
							sizeof(int));
		}
	}
	if (write(wr, &s, sizeof(s)) != sizeof(s))
		_exit(123);
	unlink(path);
	_exit(0);
}

static void fake_start(struct fake *f, const char *path, uid_t uid)
{
	int pfd[2];
	char r;

	assert_int_equal(pipe(pfd), 0);
	f->pid = fork();
	assert_true(f->pid >= 0);
	if (f->pid == 0) {
		close(pfd[0]);
		fake_main(path, uid, pfd[1]);
	}
	close(pfd[1]);
	f->rd = pfd[0];
	assert_int_equal(read(f->rd, &r, 1), 1);
}

static struct seen fake_end(struct fake *f)
{
	struct seen s = {-1, -1, -1};
	int status;

	assert_int_equal(read(f->rd, &s, sizeof(s)), (ssize_t) sizeof(s));
	close(f->rd);
	assert_int_equal(waitpid(f->pid, &status, 0), f->pid);
	return s;
}

static int attach_at(const char *path, int timeout_ms)
{
	struct kvb_attach_opts o = {.socket_path = path,
				    .role = KVB_ROLE_P,
				    .tp_size = 1,
				    .timeout_ms = timeout_ms};
	struct kvb_ctx *c = NULL;
	int rc = kvb_attach(&o, &c);

	if (!rc)
		kvb_detach(c);
	return rc;
}

/* A directory of owner uid and mode under top; its path in buf. */
static void mkdir_as(char *buf, size_t len, const char *name, uid_t uid,
		     mode_t mode)
{
	snprintf(buf, len, "%s/%s", top, name);
	assert_int_equal(mkdir(buf, mode), 0);
	assert_int_equal(chmod(buf, mode), 0);
	assert_int_equal(chown(buf, uid, uid), 0);
}

static int setup(void **state)
{
	(void) state;
	if (geteuid() != 0)
		return 0;
	snprintf(top, sizeof(top), "/tmp/kvbt-XXXXXX");
	if (!mkdtemp(top) || chmod(top, 0711))
		return -1;
	unsetenv("KVB_SOCKET");
	unsetenv("KVB_BROKER_UIDS");
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void) state;
	if (!top[0])
		return 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
	return system(cmd) ? -1 : 0;
}

/* Another uid listening on the path given: refused before anything is
 * sent; trusted by $KVB_BROKER_UIDS, it gets the HELLO (the check is what
 * kept it out). */
static void test_peer_uid(void **state)
{
	char dir[96], path[128];
	struct fake f;
	struct seen s;
	int64_t t0;
	int rc;

	(void) state;
	if (geteuid() != 0)
		skip();
	mkdir_as(dir, sizeof(dir), "nb", NOBODY, 0700);
	snprintf(path, sizeof(path), "%s/fake.sock", dir);
	fake_start(&f, path, NOBODY);
	t0 = now_ns();
	rc = attach_at(path, 2000);
	fprintf(stderr, "attach to a uid-%d listener: %d (%s) in %.1f ms\n",
		NOBODY, rc, kvb_strerror(rc), ms_since(t0));
	s = fake_end(&f);
	fprintf(stderr, "fake saw %d connection(s), %d bytes, %d fds\n",
		s.conns, s.bytes, s.fds);
	assert_int_equal(rc, -EACCES);
	assert_non_null(strstr(kvb_strerror(rc), "not trusted"));
	assert_int_equal(s.conns, 1);
	assert_int_equal(s.bytes, 0);
	assert_int_equal(s.fds, 0);

	/* the same listener, its uid listed: the HELLO reaches it */
	setenv("KVB_BROKER_UIDS", "12,65534", 1);
	fake_start(&f, path, NOBODY);
	rc = attach_at(path, 500);
	s = fake_end(&f);
	unsetenv("KVB_BROKER_UIDS");
	assert_int_equal(rc, -ETIMEDOUT); /* the fake never answers */
	assert_true(s.bytes > 0);
}

/* The default path's directory owned by another uid, or open to others:
 * the library does not even connect (the peer's uid listed as trusted, so
 * only the directory rule can refuse). */
static void test_client_dir(void **state)
{
	char xdg[96], dir[128], path[160];
	struct fake f;
	struct seen s;

	(void) state;
	if (geteuid() != 0)
		skip();
	mkdir_as(xdg, sizeof(xdg), "xdg1", 0, 0755);
	snprintf(dir, sizeof(dir), "%s/kvbroker", xdg);
	assert_int_equal(mkdir(dir, 0700), 0);
	assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
	snprintf(path, sizeof(path), "%s/kvbroker.sock", dir);
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	setenv("KVB_BROKER_UIDS", "65534", 1);
	fake_start(&f, path, NOBODY);
	assert_int_equal(attach_at(NULL, 1000), -EACCES);
	s = fake_end(&f);
	assert_int_equal(s.conns, 0);
	assert_int_equal(s.bytes, 0);
	/* ours, but open to group and others */
	assert_int_equal(chown(dir, 0, 0), 0);
	assert_int_equal(chmod(dir, 0755), 0);
	assert_int_equal(attach_at(NULL, 1000), -EACCES);
	unsetenv("KVB_BROKER_UIDS");
	unsetenv("XDG_RUNTIME_DIR");
}

/* Start the broker on its default path with $XDG_RUNTIME_DIR = xdg; its
 * log into top/name.log. Returns its pid. */
static pid_t broker_default(const char *xdg, const char *logpath)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, 1);
		dup2(fd, 2);
		setenv("XDG_RUNTIME_DIR", xdg, 1);
		unsetenv("KVB_SOCKET");
		execl(KVB_BROKER_BIN, KVB_BROKER_BIN, "--busy-poll-us", "20",
		      (char *) NULL);
		_exit(127);
	}
	return pid;
}

static int wait_exit(pid_t pid, int ms)
{
	int64_t t0 = now_ns();
	int status;

	while (ms_since(t0) < ms) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
		usleep(5000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -ETIMEDOUT;
}

static int file_has(const char *path, const char *s)
{
	char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return strstr(buf, s) != NULL;
}

/* The broker refuses a socket directory of another owner, open to others,
 * or a symlink; one that is missing it creates 0700 and serves there. */
static void test_broker_dir(void **state)
{
	char xdg[96], dir[128], log[128], other[128], sock[160];
	struct kvb_ctx *c = NULL;
	struct kvb_attach_opts o = {.role = KVB_ROLE_P, .tp_size = 1};
	struct stat st;
	static char js[KVB_MSG_MAX];
	pid_t pid;
	int rc;

	(void) state;
	if (geteuid() != 0)
		skip();
	mkdir_as(xdg, sizeof(xdg), "xdg2", 0, 0755);
	snprintf(dir, sizeof(dir), "%s/kvbroker", xdg);
	snprintf(log, sizeof(log), "%s/broker.log", top);
	/* another owner */
	assert_int_equal(mkdir(dir, 0700), 0);
	assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
	rc = wait_exit(broker_default(xdg, log), 5000);
	assert_int_equal(rc, 2); /* a configuration error */
	assert_true(file_has(log, "owned by uid 65534"));
	/* open to others */
	assert_int_equal(chown(dir, 0, 0), 0);
	assert_int_equal(chmod(dir, 0755), 0);
	rc = wait_exit(broker_default(xdg, log), 5000);
	assert_int_equal(rc, 2); /* a configuration error */
	assert_true(file_has(log, "mode 0755"));
	/* a symlink to a private directory */
	assert_int_equal(rmdir(dir), 0);
	mkdir_as(other, sizeof(other), "elsewhere", 0, 0700);
	assert_int_equal(symlink(other, dir), 0);
	rc = wait_exit(broker_default(xdg, log), 5000);
	assert_int_equal(rc, 2); /* a configuration error */
	assert_true(file_has(log, "symlink"));
	assert_int_equal(unlink(dir), 0);
	/* missing: created 0700, served; workers and stats find it */
	pid = broker_default(xdg, log);
	snprintf(sock, sizeof(sock), "%s/kvbroker.sock", dir);
	for (int i = 0; i < 2000 && access(sock, F_OK); i++)
		usleep(5000);
	assert_int_equal(lstat(dir, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0700);
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	rc = kvb_attach(&o, &c);
	assert_int_equal(rc, 0);
	assert_int_equal(kvb_ctl_stats(sock, 1, js, sizeof(js), 3000) > 0, 1);
	assert_int_equal(stat_get(js, "workers"), 1);
	kvb_detach(c);
	unsetenv("XDG_RUNTIME_DIR");
	kill(pid, SIGTERM);
	assert_int_equal(wait_exit(pid, 10000), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_peer_uid),
		cmocka_unit_test(test_client_dir),
		cmocka_unit_test(test_broker_dir),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

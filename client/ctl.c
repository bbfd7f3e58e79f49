/* SPDX-License-Identifier: MIT */
/* Control-socket plumbing shared by the client library and kvbctl. */
#include "ctl.h"
#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SOCK_NAME "kvbroker.sock"

int kvb_default_socket_dir(char *buf, unsigned long len)
{
	const char *env = getenv("KVB_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	uid_t uid = getuid();
	int n;

	if (env && *env)
		return 0;
	if (xdg && *xdg)
		n = snprintf(buf, len, "%s/kvbroker", xdg);
	else if (uid == 0)
		n = snprintf(buf, len, "/run/kvbroker");
	else
		n = snprintf(buf, len, "/tmp/kvbroker-%u", (unsigned) uid);
	if (n < 0 || (unsigned long) n + sizeof("/" SOCK_NAME) > len)
		return -ENAMETOOLONG;
	return n;
}

int kvb_default_socket(char *buf, unsigned long len)
{
	const char *env = getenv("KVB_SOCKET");
	int n;

	if (env && *env) {
		n = snprintf(buf, len, "%s", env);
		if (n < 0 || (unsigned long) n >= len)
			return -ENAMETOOLONG;
		return n;
	}
	n = kvb_default_socket_dir(buf, len);
	if (n < 0)
		return n;
	return n + snprintf(buf + n, len - (unsigned long) n, "/" SOCK_NAME);
}

int kvb_sock_dir_check(const char *dir, uid_t uid, char *why, size_t why_len)
{
	struct stat st;

	if (lstat(dir, &st) < 0) {
		int rc = -errno;

		snprintf(why, why_len, "%s: %s", dir, strerror(errno));
		return rc;
	}
	if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
		snprintf(why, why_len, "%s is not a directory (a symlink?)",
			 dir);
		return -EACCES;
	}
	if (st.st_uid != uid) {
		snprintf(why, why_len, "%s is owned by uid %u, not %u", dir,
			 (unsigned) st.st_uid, (unsigned) uid);
		return -EACCES;
	}
	if (st.st_mode & 077) {
		snprintf(why, why_len,
			 "%s has mode %04o: group or others have access "
			 "(want 0700)",
			 dir, (unsigned) (st.st_mode & 07777));
		return -EACCES;
	}
	return 0;
}

/* Is uid in $KVB_BROKER_UIDS (comma-separated decimal uids)? */
static int uid_listed(uid_t uid)
{
	const char *p = getenv("KVB_BROKER_UIDS");

	while (p && *p) {
		char *end;
		unsigned long v;

		errno = 0;
		v = strtoul(p, &end, 10);
		if (end == p || errno)
			return 0; /* malformed: trust nothing more */
		if ((uid_t) v == uid && v == (unsigned long) uid)
			return 1;
		p = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return 0;
	}
	return 0;
}

int kvb_ctl_check_peer(int sock, uid_t *peer)
{
	struct ucred cred;
	socklen_t cl = sizeof(cred);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0)
		return -errno;
	if (peer)
		*peer = cred.uid;
	if (cred.uid == getuid() || cred.uid == 0 || uid_listed(cred.uid))
		return 0;
	return -EACCES;
}

int kvb_ctl_open(const char *path, int timeout_ms, int check_dir)
{
	char dir[108], why[256];
	uid_t peer = 0;
	int fd, rc;

	if (check_dir) {
		rc = kvb_default_socket_dir(dir, sizeof(dir));
		if (rc > 0) {
			rc = kvb_sock_dir_check(dir, getuid(), why,
						sizeof(why));
			if (rc == -EACCES && getenv("KVB_DEBUG"))
				fprintf(stderr, "libkvbroker: %s\n", why);
			if (rc)
				return rc;
		} else if (rc < 0) {
			return rc;
		}
	}
	fd = kvb_ctl_connect(path, timeout_ms);
	if (fd < 0)
		return fd;
	rc = kvb_ctl_check_peer(fd, &peer);
	if (rc) {
		if (getenv("KVB_DEBUG"))
			fprintf(stderr,
				"libkvbroker: %s is served by uid %u, not "
				"this uid, root or $KVB_BROKER_UIDS\n",
				path, (unsigned) peer);
		close(fd);
		return rc;
	}
	return fd;
}

int64_t kvb_ctl_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t kvb_ctl_deadline(int timeout_ms)
{
	return kvb_ctl_now_ns() +
	       (timeout_ms > 0 ? (int64_t) timeout_ms * 1000000 : 0);
}

/* Set a socket timeout (SO_RCVTIMEO / SO_SNDTIMEO) of ns, at least 1 us. */
static void set_timeo(int fd, int opt, int64_t ns)
{
	struct timeval tv;

	if (ns < 1000)
		ns = 1000;
	tv.tv_sec = (time_t) (ns / 1000000000);
	tv.tv_usec = (suseconds_t) (ns % 1000000000 / 1000);
	setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

int kvb_ctl_connect(const char *path, int timeout_ms)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int64_t deadline = kvb_ctl_deadline(timeout_ms);
	int fd, rc;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* for the plain kvb_ctl_send / kvb_ctl_recv (kvbctl, tests) */
	set_timeo(fd, SO_RCVTIMEO, (int64_t) timeout_ms * 1000000);
	/* connect waits (a full backlog) up to SO_SNDTIMEO: what is left of
	 * the deadline, each time a signal interrupts it */
	for (;;) {
		set_timeo(fd, SO_SNDTIMEO, deadline - kvb_ctl_now_ns());
		if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0)
			break;
		rc = errno == EAGAIN ? -ETIMEDOUT : -errno;
		if (rc == -EINTR && kvb_ctl_now_ns() < deadline)
			continue;
		if (rc == -EINTR)
			rc = -ETIMEDOUT;
		close(fd);
		return rc;
	}
	set_timeo(fd, SO_SNDTIMEO, (int64_t) timeout_ms * 1000000);
	return fd;
}

void kvb_msg_init(struct kvb_msg_hdr *h, uint16_t type, uint32_t len)
{
	memset(h, 0, len);
	h->magic = KVB_MSG_MAGIC;
	h->version = KVB_PROTO_VERSION;
	h->type = type;
	h->len = len;
}

/* One sendmsg: 0, -EAGAIN (would block / timed out) or -errno. */
static int send_once(int sock, const void *msg, size_t len, const int *fds,
		     unsigned nfds, int flags)
{
	char cbuf[CMSG_SPACE(sizeof(int) * KVB_CTL_MAX_FDS)];
	struct iovec iov = {.iov_base = (void *) msg, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (nfds > KVB_CTL_MAX_FDS)
		return -EINVAL;
	if (nfds) {
		struct cmsghdr *c;

		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	n = sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return (size_t) n == len ? 0 : -EIO;
}

/* One recvmsg: the length, -EAGAIN, -EPIPE (EOF), -EMSGSIZE or -errno;
 * *nfds is set in every case (0 on an error). */
static int recv_once(int sock, void *buf, size_t cap, int *fds, unsigned *nfds,
		     int flags)
{
	char cbuf[CMSG_SPACE(sizeof(int) * KVB_CTL_MAX_FDS)];
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf)};
	unsigned got = 0, want = nfds ? *nfds : 0;
	struct cmsghdr *c;
	ssize_t n;

	if (nfds)
		*nfds = 0;
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		unsigned k, cnt;
		int *p = (int *) CMSG_DATA(c);

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < cnt; k++) {
			if (got < want)
				fds[got++] = p[k];
			else
				close(p[k]); /* never leak what we did not ask
						for */
		}
	}
	if (nfds)
		*nfds = got;
	if (n == 0)
		return -EPIPE;
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		while (got)
			close(fds[--got]);
		if (nfds)
			*nfds = 0;
		return -EMSGSIZE;
	}
	return (int) n;
}

int kvb_ctl_send(int sock, const void *msg, size_t len, const int *fds,
		 unsigned nfds)
{
	int rc;

	do
		rc = send_once(sock, msg, len, fds, nfds, 0);
	while (rc == -EINTR);
	return rc == -EAGAIN ? -ETIMEDOUT : rc;
}

int kvb_ctl_recv(int sock, void *buf, size_t cap, int *fds, unsigned *nfds)
{
	unsigned room = nfds ? *nfds : 0;
	int rc;

	for (;;) {
		if (nfds)
			*nfds = room;
		rc = recv_once(sock, buf, cap, fds, nfds, 0);
		if (rc != -EINTR)
			break;
	}
	return rc == -EAGAIN ? -ETIMEDOUT : rc;
}

/* Wait for `events` on sock until the deadline: 0 (ready, or hung up: the
 * next call says which), -ETIMEDOUT or -errno. Signals shorten no wait and
 * lengthen none. */
static int wait_until(int sock, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = sock, .events = events};
		int64_t left = deadline - kvb_ctl_now_ns();
		int rc;

		if (left <= 0)
			return -ETIMEDOUT;
		left = (left + 999999) / 1000000;
		rc = poll(&p, 1, left > INT_MAX ? INT_MAX : (int) left);
		if (rc > 0)
			return 0;
		if (rc < 0 && errno != EINTR)
			return -errno;
	}
}

int kvb_ctl_send_by(int sock, const void *msg, size_t len, const int *fds,
		    unsigned nfds, int64_t deadline)
{
	for (;;) {
		int rc = send_once(sock, msg, len, fds, nfds, MSG_DONTWAIT);

		if (rc == -EINTR)
			continue;
		if (rc != -EAGAIN)
			return rc;
		rc = wait_until(sock, POLLOUT, deadline);
		if (rc)
			return rc;
	}
}

int kvb_ctl_recv_by(int sock, void *buf, size_t cap, int *fds, unsigned *nfds,
		    int64_t deadline)
{
	unsigned room = nfds ? *nfds : 0;

	for (;;) {
		int rc;

		if (nfds)
			*nfds = room;
		rc = recv_once(sock, buf, cap, fds, nfds, MSG_DONTWAIT);
		if (rc == -EINTR)
			continue;
		if (rc != -EAGAIN)
			return rc;
		rc = wait_until(sock, POLLIN, deadline);
		if (rc)
			return rc;
	}
}

int kvb_ctl_check_reply(const struct kvb_msg_hdr *h, int n, uint16_t type,
			size_t min_len)
{
	if (n < (int) sizeof(*h) || h->magic != KVB_MSG_MAGIC ||
	    h->version != KVB_PROTO_VERSION || h->type != type ||
	    h->len != (uint32_t) n)
		return -EPROTO;
	if (h->status)
		return h->status < 0 ? h->status : -EPROTO;
	if ((size_t) n < min_len)
		return -EPROTO;
	return 0;
}

int kvb_ctl_stats(const char *socket_path, int json, char *buf, size_t cap,
		  int timeout_ms)
{
	return kvb_ctl_view(socket_path, 0, json, buf, cap, timeout_ms);
}

int kvb_ctl_view(const char *socket_path, uint32_t view, int json, char *buf,
		 size_t cap, int timeout_ms)
{
	struct kvb_msg_stats req;
	int64_t deadline;
	size_t len;
	char *msg;
	int fd, n;

	if (!socket_path || !buf || !cap)
		return -EINVAL;
	buf[0] = '\0';
	msg = malloc(KVB_MSG_MAX + 1);
	if (!msg)
		return -ENOMEM;
	deadline = kvb_ctl_deadline(timeout_ms);
	fd = kvb_ctl_open(socket_path, timeout_ms, 0);
	if (fd < 0) {
		free(msg);
		return fd;
	}
	kvb_msg_init(&req.h, KVB_MSG_STATS, sizeof(req));
	req.h.seq = 1;
	req.json = json ? 1 : 0;
	req.view = view;
	n = kvb_ctl_send_by(fd, &req, sizeof(req), NULL, 0, deadline);
	if (!n)
		n = kvb_ctl_recv_by(fd, msg, KVB_MSG_MAX, NULL, NULL, deadline);
	close(fd);
	if (n >= 0) {
		int rc = kvb_ctl_check_reply((const struct kvb_msg_hdr *) msg,
					     n, KVB_MSG_STATS,
					     sizeof(struct kvb_msg_hdr) + 1);

		if (rc)
			n = rc;
	}
	if (n < 0) {
		free(msg);
		return n;
	}
	msg[n] = '\0'; /* the text is NUL-terminated; make sure */
	len = strlen(msg + sizeof(struct kvb_msg_hdr));
	if (len + 1 > cap) {
		free(msg);
		return -ENOSPC;
	}
	memcpy(buf, msg + sizeof(struct kvb_msg_hdr), len + 1);
	free(msg);
	return (int) len;
}

const char *kvb_strerror(int status)
{
	switch (status) {
	case 0:
		return "success";
	case -EFAULT:
		return "descriptor out of bounds of its region";
	case -EINVAL:
		return "invalid descriptor, region or transfer";
	case -ENXIO:
		return "region's owner is gone";
	case -ETIMEDOUT:
		return "timed out";
	case -ECANCELED:
		return "transfer aborted";
	case -EPIPE:
		return "broker is gone";
	case -ESTALE:
		return "transfer already ended";
	case -EEXIST:
		return "already there (a live transfer id opened again, a "
		       "layer "
		       "submitted or declared twice)";
	case -EACCES:
		/* kvb_attach's, or a completion's: the peer refused the
		 * access (rdma remote access error, tcp refusal) */
		return "access refused: at attach, broker not trusted (its "
		       "socket directory is not private to this uid, or the "
		       "broker runs as another uid: not root or "
		       "$KVB_BROKER_UIDS); in a completion, the remote side "
		       "refused the access (its region deregistered or "
		       "without that access)";
	case -EADDRINUSE:
		return "a worker with this role, dp rank and tp rank is "
		       "already attached";
	case -E2BIG:
		return "ring larger than the broker's --max-ring-entries";
	case -ENOSPC:
		return "transfer table full, or this worker's share of it used";
	case -EAGAIN:
		return "try again (ring full, or completions not reaped: "
		       "poll first)";
	default:
		return strerror(-status);
	}
}

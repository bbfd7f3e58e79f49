/* SPDX-License-Identifier: MIT */
/* Control-socket plumbing shared by the client library and kvbctl. */
#include "ctl.h"
#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int kvb_default_socket(char *buf, unsigned long len)
{
	const char *env = getenv("KVB_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (xdg && *xdg)
		n = snprintf(buf, len, "%s/kvbroker.sock", xdg);
	else
		n = snprintf(buf, len, "/tmp/kvbroker-%u.sock",
			     (unsigned) getuid());
	if (n < 0 || (unsigned long) n >= len)
		return -ENAMETOOLONG;
	return n;
}

int kvb_ctl_connect(const char *path, int timeout_ms)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = timeout_ms / 1000,
			     .tv_usec = (timeout_ms % 1000) * 1000};
	int fd, rc;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
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

int kvb_ctl_send(int sock, const void *msg, size_t len, const int *fds,
		 unsigned nfds)
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
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
	return (size_t) n == len ? 0 : -EIO;
}

int kvb_ctl_recv(int sock, void *buf, size_t cap, int *fds, unsigned *nfds)
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

	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
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
	struct kvb_msg_stats req;
	size_t len;
	char *msg;
	int fd, n;

	if (!socket_path || !buf || !cap)
		return -EINVAL;
	buf[0] = '\0';
	msg = malloc(KVB_MSG_MAX + 1);
	if (!msg)
		return -ENOMEM;
	fd = kvb_ctl_connect(socket_path, timeout_ms);
	if (fd < 0) {
		free(msg);
		return fd;
	}
	kvb_msg_init(&req.h, KVB_MSG_STATS, sizeof(req));
	req.json = json ? 1 : 0;
	n = kvb_ctl_send(fd, &req, sizeof(req), NULL, 0);
	if (!n)
		n = kvb_ctl_recv(fd, msg, KVB_MSG_MAX, NULL, NULL);
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
		return "transfer timed out";
	case -ECANCELED:
		return "transfer aborted";
	case -EPIPE:
		return "broker is gone";
	case -ESTALE:
		return "transfer already ended";
	case -EALREADY:
		return "duplicate write for this layer";
	default:
		return strerror(-status);
	}
}

/* SPDX-License-Identifier: MIT */
#include "metrics_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int tcp_connect_lo(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	return fd;
}

int http_raw(uint16_t port, const char *req, size_t req_len, char **resp,
	     int timeout_ms)
{
	int64_t end = now_ns() + (int64_t) timeout_ms * 1000000;
	size_t len = 0, cap = 65536;
	char *buf = malloc(cap);
	int fd, rc = 0;

	if (!buf)
		return -ENOMEM;
	fd = tcp_connect_lo(port);
	if (fd < 0) {
		free(buf);
		return fd;
	}
	if (send(fd, req, req_len, MSG_NOSIGNAL) != (ssize_t) req_len)
		rc = -EIO; /* the server may close early: read what it said */
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int64_t left = (end - now_ns()) / 1000000;
		ssize_t n;

		if (left <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		if (poll(&p, 1, (int) left) <= 0)
			continue;
		if (len + 4096 > cap) {
			char *nb = realloc(buf, cap * 2);

			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		n = recv(fd, buf + len, cap - len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ECONNRESET && len)
			break; /* closed with our unread bytes: it answered */
		if (n < 0) {
			rc = -errno;
			break;
		}
		if (!n) {
			rc = 0; /* all of it */
			break;
		}
		len += (size_t) n;
	}
	close(fd);
	buf[len] = '\0';
	if (rc && !len) {
		free(buf);
		return rc;
	}
	*resp = buf;
	return rc == -EIO ? 0 : rc;
}

int http_get(uint16_t port, const char *path, const char *accept, char **resp,
	     int timeout_ms)
{
	char req[1024];
	int n;

	if (accept)
		n = snprintf(req, sizeof(req),
			     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
			     "Connection: close\r\n"
			     "Accept: %s\r\n\r\n",
			     path, accept);
	else
		n = snprintf(req, sizeof(req),
			     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
			     "Connection: close\r\n\r\n",
			     path);
	if (n < 0 || (size_t) n >= sizeof(req))
		return -EINVAL;
	return http_raw(port, req, (size_t) n, resp, timeout_ms);
}

int http_status(const char *resp)
{
	int code;

	if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1)
		return -1;
	return code;
}

int http_header(const char *resp, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name);
	const char *body = http_body(resp);

	for (const char *l = strchr(resp, '\n'); l && (!body || l < body);
	     l = strchr(l + 1, '\n')) {
		const char *v, *e;

		if (strncasecmp(l + 1, name, nl) || l[1 + nl] != ':')
			continue;
		v = l + 2 + nl;
		while (*v == ' ')
			v++;
		e = strpbrk(v, "\r\n");
		if (!e || (size_t) (e - v) >= cap)
			return -ENOSPC;
		memcpy(out, v, (size_t) (e - v));
		out[e - v] = '\0';
		return 0;
	}
	return -ENOENT;
}

const char *http_body(const char *resp)
{
	const char *p = strstr(resp, "\r\n\r\n");

	return p ? p + 4 : NULL;
}

double metric(const char *body, const char *series)
{
	size_t sl = strlen(series);

	for (const char *l = body; l && *l;
	     l = strchr(l, '\n'), l = l ? l + 1 : l)
		if (!strncmp(l, series, sl) && l[sl] == ' ')
			return strtod(l + sl + 1, NULL);
	return -1;
}

uint16_t broker_metrics_port(const struct broker *b)
{
	static const char key[] = "metrics on http://127.0.0.1:";
	char line[512];
	unsigned port = 0;
	FILE *f = fopen(b->log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, key);

		if (p && sscanf(p + sizeof(key) - 1, "%u", &port) == 1)
			break;
	}
	fclose(f);
	return (uint16_t) port;
}

uint16_t free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint16_t port = 0;

	if (fd < 0)
		return 0;
	if (!bind(fd, (struct sockaddr *) &sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *) &sa, &sl))
		port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

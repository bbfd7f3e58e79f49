/* SPDX-License-Identifier: MIT */
/*
 * --config FILE: "key = value" lines, keys the long options without "--".
 * Each line becomes the command-line entry it stands for ("--key=value", or
 * "--flag" for a flag set true) and goes through the same parser
 * (options.c), first on its own, so that a bad line is reported with its
 * file and line, then with the file's entries ahead of the command line's:
 * the parser keeps the last value it sees, so the command line wins.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "options.h"

#define CONFIG_LINE_MAX	   4096
#define CONFIG_ENTRIES_MAX 256

struct entries {
	char **v;
	int n, cap;
};

static int fail(char *err, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' ||
			 e[-1] == '\r'))
		*--e = '\0';
	return s;
}

static int flag_value(const char *v)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};

	for (unsigned i = 0; i < 4; i++) {
		if (!strcmp(v, yes[i]))
			return 1;
		if (!strcmp(v, no[i]))
			return 0;
	}
	return -EINVAL;
}

static int push(struct entries *e, char *s)
{
	if (!s)
		return -ENOMEM;
	if (e->n == e->cap) {
		int cap = e->cap ? e->cap * 2 : 16;
		char **v = realloc(e->v, (size_t) cap * sizeof(*v));

		if (!v) {
			free(s);
			return -ENOMEM;
		}
		e->v = v;
		e->cap = cap;
	}
	e->v[e->n++] = s;
	return 0;
}

static void entries_free(struct entries *e)
{
	for (int i = 0; i < e->n; i++)
		free(e->v[i]);
	free(e->v);
	e->v = NULL;
	e->n = e->cap = 0;
}

/* One entry through the parser on its own: 0, or -EINVAL with its error. */
static int check_entry(char *entry, char *why, size_t why_len)
{
	static struct kvb_options tmp; /* 2.5 KiB: not on the stack */
	char prog[] = "kvbroker";
	char *argv[] = {prog, entry, NULL};

	return kvb_options_parse(&tmp, 2, argv, why, why_len);
}

/*
 * One line of the file (line `ln`) into e: nothing for a blank line or a
 * comment, "--key=value" or "--flag". 0 or -EINVAL with err set.
 */
static int config_line(const char *path, int ln, char *line, struct entries *e,
		       char *err, size_t err_len)
{
	char *s = trim(line), *eq, *key, *val, *entry;
	char why[256];
	size_t vl;
	int kind, rc;

	if (!*s || *s == '#')
		return 0;
	eq = strchr(s, '=');
	if (!eq)
		return fail(err, err_len,
			    "%s:%d: expected \"key = value\", got '%s'", path,
			    ln, s);
	*eq = '\0';
	key = trim(s);
	val = trim(eq + 1);
	vl = strlen(val);
	if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
		val[vl - 1] = '\0';
		val++;
	}
	kind = kvb_option_kind(key);
	if (kind < 0 || !strcmp(key, "config") || !strcmp(key, "help") ||
	    !strcmp(key, "version"))
		return fail(err, err_len,
			    "%s:%d: unknown key '%s' (keys are kvbroker's "
			    "long options without --, see kvbroker --help)",
			    path, ln, key);
	if (!kind) {
		rc = flag_value(val);
		if (rc < 0)
			return fail(err, err_len,
				    "%s:%d: %s: '%s' is not true or false",
				    path, ln, key, val);
		if (!rc)
			return 0;
		entry = malloc(strlen(key) + 3);
		if (entry)
			sprintf(entry, "--%s", key);
	} else {
		if (!*val)
			return fail(err, err_len, "%s:%d: %s: missing value",
				    path, ln, key);
		entry = malloc(strlen(key) + strlen(val) + 4);
		if (entry)
			sprintf(entry, "--%s=%s", key, val);
	}
	if (!entry)
		return -ENOMEM;
	if (check_entry(entry, why, sizeof(why))) {
		free(entry);
		return fail(err, err_len, "%s:%d: %s", path, ln, why);
	}
	if (e->n >= CONFIG_ENTRIES_MAX) {
		free(entry);
		return fail(err, err_len, "%s:%d: more than %d settings", path,
			    ln, CONFIG_ENTRIES_MAX);
	}
	return push(e, entry);
}

/*
 * The whole file into a NUL-terminated buffer: a regular file of at most
 * KVB_CONFIG_MAX bytes. Opened without blocking (a FIFO would wait for a
 * writer at open) and refused unless fstat says regular, so a FIFO, a device
 * (/dev/zero) or a socket is refused at once; a read error is an error, not
 * the end of the file. 0 or -errno with err set; *len: bytes read.
 */
static int read_whole(const char *path, char **out, size_t *len, char *err,
		      size_t err_len)
{
	struct stat st;
	size_t got = 0;
	char *buf;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		rc = -errno;
		fail(err, err_len, "%s: %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		fail(err, err_len, "%s: %s", path, strerror(-rc));
		goto err_fd;
	}
	if (S_ISDIR(st.st_mode)) {
		fail(err, err_len, "%s: %s", path, strerror(EISDIR));
		rc = -EISDIR;
		goto err_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = fail(err, err_len,
			  "%s: not a regular file (a config file must be "
			  "one)",
			  path);
		goto err_fd;
	}
	if (st.st_size > KVB_CONFIG_MAX) {
		fail(err, err_len, "%s: %lld bytes, more than %d", path,
		     (long long) st.st_size, KVB_CONFIG_MAX);
		rc = -EFBIG;
		goto err_fd;
	}
	/* one byte more than allowed: a file that grew is seen to */
	buf = malloc(KVB_CONFIG_MAX + 2);
	if (!buf) {
		fail(err, err_len, "%s: out of memory", path);
		rc = -ENOMEM;
		goto err_fd;
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, KVB_CONFIG_MAX + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			fail(err, err_len, "%s: read: %s", path, strerror(-rc));
			goto err_buf;
		}
		if (n == 0)
			break;
		got += (size_t) n;
		if (got > KVB_CONFIG_MAX) {
			fail(err, err_len, "%s: more than %d bytes", path,
			     KVB_CONFIG_MAX);
			rc = -EFBIG;
			goto err_buf;
		}
	}
	close(fd);
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;

err_buf:
	free(buf);
err_fd:
	close(fd);
	return rc;
}

int kvb_config_read(const char *path, char ***entries, int *n, char *err,
		    size_t err_len)
{
	struct entries e = {0};
	char *buf = NULL, *line;
	size_t len = 0, off = 0;
	int ln = 0, rc;

	rc = read_whole(path, &buf, &len, err, err_len);
	if (rc)
		return rc;
	while (off < len) {
		char *nl = memchr(buf + off, '\n', len - off);
		size_t ll = (nl ? (size_t) (nl - buf) + 1 : len) - off;

		line = buf + off;
		off += ll;
		ln++;
		if (ll > CONFIG_LINE_MAX) {
			rc = fail(err, err_len,
				  "%s:%d: line longer than %d bytes", path, ln,
				  CONFIG_LINE_MAX);
			goto out;
		}
		if (memchr(line, '\0', ll)) {
			rc = fail(err, err_len, "%s:%d: NUL byte in the line",
				  path, ln);
			goto out;
		}
		if (nl)
			*nl = '\0';
		rc = config_line(path, ln, line, &e, err, err_len);
		if (rc)
			goto out;
	}
out:
	free(buf);
	if (rc) {
		entries_free(&e);
		return rc;
	}
	*entries = e.v;
	*n = e.n;
	return 0;
}

size_t kvb_config_escape(char *dst, size_t cap, const char *src)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	if (!cap)
		return 0;
	for (; *src; src++) {
		unsigned char c = (unsigned char) *src;
		char tmp[4];
		size_t k = 0;

		if (c == '\\') {
			tmp[k++] = '\\';
			tmp[k++] = '\\';
		} else if (c < 0x20 || c >= 0x7f) {
			tmp[k++] = '\\';
			tmp[k++] = 'x';
			tmp[k++] = hex[c >> 4];
			tmp[k++] = hex[c & 15];
		} else {
			tmp[k++] = (char) c;
		}
		if (o + k >= cap)
			break;
		memcpy(dst + o, tmp, k);
		o += k;
	}
	dst[o] = '\0';
	return o;
}

void kvb_config_free(char **entries, int n)
{
	struct entries e = {.v = entries, .n = n};

	entries_free(&e);
}

int kvb_options_load(struct kvb_options *o, int argc, char **argv, char *err,
		     size_t err_len)
{
	char **ent = NULL, **all;
	int n = 0, rc;

	rc = kvb_options_parse(o, argc, argv, err, err_len);
	if (rc || !o->config_path[0] || o->help || o->version)
		return rc;
	rc = kvb_config_read(o->config_path, &ent, &n, err, err_len);
	if (rc)
		return rc;
	all = calloc((size_t) (argc + n + 1), sizeof(*all));
	if (!all) {
		kvb_config_free(ent, n);
		return fail(err, err_len, "out of memory");
	}
	/* argv[0], the file's entries, then the command line's: the parser
	 * takes the last value of each option */
	all[0] = argv[0];
	if (n) /* ent is NULL for a file without settings */
		memcpy(all + 1, ent, (size_t) n * sizeof(*all));
	memcpy(all + 1 + n, argv + 1, (size_t) (argc - 1) * sizeof(*all));
	rc = kvb_options_parse(o, argc + n, all, err, err_len);
	free(all);
	kvb_config_free(ent, n);
	return rc;
}

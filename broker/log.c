/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int kvb_log_level = KVB_LOG_INFO;
int kvb_log_format = KVB_LOG_FMT_TEXT;

static const char *const names[] = {"error", "warn", "info", "debug"};
/* sd-daemon(3) priorities: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
static const char prio[] = {'3', '4', '6', '7'};
static const char *const fmt_names[] = {"auto", "text", "json", "journal"};

#define LINE_MAX_BYTES 4096
#define MSG_MAX_BYTES  2048

int kvb_log_format_parse(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, fmt_names[i]))
			return i;
	return -EINVAL;
}

int kvb_log_journal_stream(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 ||
	    fstat(STDERR_FILENO, &st))
		return 0;
	return (unsigned long long) st.st_dev == dev &&
	       (unsigned long long) st.st_ino == ino;
}

void kvb_log_set_format(int fmt)
{
	if (fmt == KVB_LOG_FMT_AUTO)
		fmt = kvb_log_journal_stream() ? KVB_LOG_FMT_JOURNAL
					       : KVB_LOG_FMT_TEXT;
	kvb_log_format = fmt;
}

size_t kvb_log_iso8601(char *buf, size_t cap, const struct timespec *ts)
{
	struct tm tm;
	time_t t = ts->tv_sec;
	int n;

	if (cap < 25 || !gmtime_r(&t, &tm))
		return 0;
	n = snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		     tm.tm_min, tm.tm_sec, ts->tv_nsec / 1000000);
	return n > 0 && (size_t) n < cap ? (size_t) n : 0;
}

/* Length of the well-formed UTF-8 sequence at s (2..4), 0 if there is none
 * (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF,
 * a cut sequence). */
static int utf8_len(const unsigned char *s)
{
	unsigned c = s[0], n, v, i;

	if (c >= 0xc2 && c <= 0xdf)
		n = 2, v = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, v = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, v = c & 0x07;
	else
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		v = v << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && (v < 0x800 || (v >= 0xd800 && v <= 0xdfff))) ||
	    (n == 4 && (v < 0x10000 || v > 0x10ffff)))
		return 0;
	return (int) n;
}

/* Append a string JSON-escaped, at most up to end (exclusive); an escape
 * or a character that does not fit whole is left out. Bytes that are not
 * UTF-8 (a peer's garbage in a message) become U+FFFD: the line stays
 * valid JSON. */
static char *json_str(char *p, char *end, const char *str)
{
	const unsigned char *s = (const unsigned char *) str;

	while (*s) {
		unsigned char c = *s;
		char esc[8];
		size_t k = 1;
		int u;

		if (c >= 0x80) {
			u = utf8_len(s);
			if (u) {
				if (end - p < u)
					break;
				memcpy(p, s, (size_t) u);
				p += u;
				s += u;
				continue;
			}
			snprintf(esc, sizeof(esc), "\\ufffd");
		} else if (c != '"' && c != '\\' && c >= 0x20) {
			if (p >= end)
				break;
			*p++ = (char) c;
			s++;
			continue;
		} else if (c == '\n') {
			snprintf(esc, sizeof(esc), "\\n");
		} else if (c == '\t') {
			snprintf(esc, sizeof(esc), "\\t");
		} else if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
		} else {
			snprintf(esc, sizeof(esc), "\\%c", c);
		}
		k = strlen(esc);
		if (end - p < (ptrdiff_t) k)
			break;
		memcpy(p, esc, k);
		p += k;
		s++;
	}
	return p;
}

size_t kvb_log_format_line(char *buf, size_t cap, int fmt, int level,
			   const struct timespec *ts, uint64_t suppressed,
			   const char *msg)
{
	char iso[32] = "", tail[64] = "";
	size_t n;
	int k;

	if (cap < 64)
		return 0;
	if (level < 0 || level > KVB_LOG_DEBUG)
		level = KVB_LOG_ERROR;
	kvb_log_iso8601(iso, sizeof(iso), ts);
	if (fmt == KVB_LOG_FMT_JSON) {
		char *p = buf, *end = buf + cap - sizeof(tail) - 4;

		k = snprintf(p, cap,
			     "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", iso,
			     names[level]);
		p = json_str(p + k, end, msg);
		if (suppressed)
			snprintf(tail, sizeof(tail), ",\"suppressed\":%llu",
				 (unsigned long long) suppressed);
		n = (size_t) (p - buf);
		n += (size_t) snprintf(p, cap - n, "\"%s}\n", tail);
		return n;
	}
	if (suppressed)
		snprintf(tail, sizeof(tail), " [%llu more suppressed]",
			 (unsigned long long) suppressed);
	if (fmt == KVB_LOG_FMT_JOURNAL)
		k = snprintf(buf, cap, "<%c>%s: %s", prio[level], names[level],
			     msg);
	else
		k = snprintf(buf, cap, "kvbroker %s %s: %s", iso, names[level],
			     msg);
	n = k < 0 ? 0 : (size_t) k;
	if (n > cap - strlen(tail) - 2)
		n = cap - strlen(tail) - 2; /* cut: the count and \n stay */
	memcpy(buf + n, tail, strlen(tail));
	n += strlen(tail);
	buf[n++] = '\n';
	buf[n] = '\0';
	return n;
}

static void vlog(int level, uint64_t suppressed, const char *fmt, va_list ap)
{
	char msg[MSG_MAX_BYTES], line[LINE_MAX_BYTES];
	struct timespec ts;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &ts);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = kvb_log_format_line(line, sizeof(line), kvb_log_format, level, &ts,
				suppressed, msg);
	/* one write a line: lines of several threads do not interleave */
	fwrite(line, 1, n, stderr);
}

void kvb_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > kvb_log_level)
		return;
	va_start(ap, fmt);
	vlog(level, 0, fmt, ap);
	va_end(ap);
}

#define RL_WINDOW_NS 1000000000ll

static int vlog_rl(struct kvb_ratelimit *rl, int64_t now, int level,
		   const char *fmt, va_list ap)
{
	if (level > kvb_log_level)
		return 0;
	if (!rl->burst) /* a call site's static limiter, first use */
		kvb_ratelimit_init(rl, 1, RL_WINDOW_NS);
	if (!kvb_ratelimit_ok(rl, now))
		return 0;
	vlog(level, kvb_ratelimit_take(rl, now), fmt, ap);
	return 1;
}

int kvb_log_rl_at(struct kvb_ratelimit *rl, int64_t now, int level,
		  const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vlog_rl(rl, now, level, fmt, ap);
	va_end(ap);
	return rc;
}

int kvb_log_rl(struct kvb_ratelimit *rl, int level, const char *fmt, ...)
{
	struct timespec ts;
	va_list ap;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	va_start(ap, fmt);
	rc = vlog_rl(rl, (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec, level,
		     fmt, ap);
	va_end(ap);
	return rc;
}

int kvb_log_parse(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -EINVAL;
}

void kvb_ratelimit_init(struct kvb_ratelimit *rl, uint32_t burst,
			int64_t window_ns)
{
	memset(rl, 0, sizeof(*rl));
	rl->burst = burst;
	rl->window_ns = window_ns;
}

/* A window ends `window_ns` after its first line; an empty one never
 * started, so the next line starts the next window whenever it comes. */
static void ratelimit_roll(struct kvb_ratelimit *rl, int64_t now)
{
	if (!rl->window_ns || (!rl->lines && !rl->held) ||
	    now - rl->start < rl->window_ns)
		return;
	rl->missed += rl->held;
	rl->held = 0;
	rl->lines = 0;
}

int kvb_ratelimit_ok(struct kvb_ratelimit *rl, int64_t now)
{
	ratelimit_roll(rl, now);
	if (!rl->lines && !rl->held)
		rl->start = now;
	if (rl->lines < rl->burst) {
		rl->lines++;
		return 1;
	}
	rl->held++;
	return 0;
}

uint64_t kvb_ratelimit_take(struct kvb_ratelimit *rl, int64_t now)
{
	uint64_t n;

	ratelimit_roll(rl, now);
	n = rl->missed;
	rl->missed = 0;
	return n;
}

#define RL_KEYS 128u

int kvb_log_rl_keyed(const void *key, int level, const char *fmt, ...)
{
	static struct {
		const void *key;
		struct kvb_ratelimit rl;
	} tab[RL_KEYS];
	uintptr_t h = (uintptr_t) key;
	struct timespec ts;
	unsigned i, k;
	va_list ap;
	int rc;

	h ^= h >> 17;
	h *= 0x9e3779b97f4a7c15ull;
	for (i = 0, k = (unsigned) (h >> 40) % (RL_KEYS - 1); i < RL_KEYS - 1;
	     i++, k = (k + 1) % (RL_KEYS - 1))
		if (!tab[k].key || tab[k].key == key)
			break;
	if (i == RL_KEYS - 1)
		k = RL_KEYS - 1; /* full: the rest share one */
	tab[k].key = key;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	va_start(ap, fmt);
	rc = vlog_rl(&tab[k].rl, (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec,
		     level, fmt, ap);
	va_end(ap);
	return rc;
}

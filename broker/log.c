/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int kvb_log_level = KVB_LOG_INFO;

static const char *const names[] = {"error", "warn", "info", "debug"};

static void vlog(int level, uint64_t suppressed, const char *fmt, va_list ap)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	fprintf(stderr, "kvbroker %ld.%03ld %s: ", (long) ts.tv_sec,
		ts.tv_nsec / 1000000, names[level]);
	vfprintf(stderr, fmt, ap);
	if (suppressed)
		fprintf(stderr, " [%llu more suppressed]",
			(unsigned long long) suppressed);
	fputc('\n', stderr);
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

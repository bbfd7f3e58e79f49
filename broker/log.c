/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int kvb_log_level = KVB_LOG_INFO;

static const char *const names[] = {"error", "warn", "info", "debug"};

void kvb_log(int level, const char *fmt, ...)
{
	struct timespec ts;
	va_list ap;

	if (level > kvb_log_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	fprintf(stderr, "kvbroker %ld.%03ld %s: ", (long) ts.tv_sec,
		ts.tv_nsec / 1000000, names[level]);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int kvb_log_parse(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -EINVAL;
}

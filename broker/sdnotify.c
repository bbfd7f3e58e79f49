/* SPDX-License-Identifier: MIT */
/* sd_notify for Type=notify units (sdnotify.h). */
#include "sdnotify.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

#ifdef KVB_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static int64_t wd_period_ns; /* half of WatchdogSec, 0 = no watchdog */
static int64_t wd_next_ns;

int kvb_sd_built(void)
{
	return 1;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kvb_sd_ready(const char *socket_path)
{
	uint64_t usec = 0;
	int rc;

	rc = sd_notifyf(0, "READY=1\nSTATUS=listening on %s", socket_path);
	if (rc < 0)
		log_warn("sd_notify READY=1: %s", strerror(-rc));
	if (sd_watchdog_enabled(0, &usec) > 0 && usec) {
		wd_period_ns = (int64_t) usec * 1000 / 2;
		wd_next_ns = mono_ns() + wd_period_ns;
		sd_notify(0, "WATCHDOG=1");
		log_info("systemd watchdog: a ping every %lld ms",
			 (long long) (wd_period_ns / 1000000));
	}
}

void kvb_sd_tick(int64_t now_ns)
{
	if (!wd_period_ns || now_ns < wd_next_ns)
		return;
	sd_notify(0, "WATCHDOG=1");
	wd_next_ns = now_ns + wd_period_ns;
}

int kvb_sd_sleep_ms(int ms, int64_t now_ns)
{
	int64_t left;

	if (!wd_period_ns)
		return ms;
	left = (wd_next_ns - now_ns) / 1000000 + 1;
	if (left < 1)
		left = 1;
	return left < ms ? (int) left : ms;
}

void kvb_sd_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}

#else /* no libsystemd: nothing to tell */

int kvb_sd_built(void)
{
	return 0;
}

void kvb_sd_ready(const char *socket_path)
{
	(void) socket_path;
}

void kvb_sd_tick(int64_t now_ns)
{
	(void) now_ns;
}

int kvb_sd_sleep_ms(int ms, int64_t now_ns)
{
	(void) now_ns;
	return ms;
}

void kvb_sd_stopping(void)
{
}
#endif

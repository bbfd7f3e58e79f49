/* SPDX-License-Identifier: MIT */
#ifndef KVB_BROKER_SDNOTIFY_H
#define KVB_BROKER_SDNOTIFY_H

#include <stdint.h>

/*
 * systemd's service notifications (sd_notify(3), Type=notify units): READY=1
 * once the socket listens, WATCHDOG=1 at half of WatchdogSec from the event
 * loop, STOPPING=1 at shutdown. Without $NOTIFY_SOCKET, or in a build
 * without libsystemd (kvb_sd_built() 0), they do nothing. Broker thread
 * only.
 */
int kvb_sd_built(void);
/* READY=1 with a STATUS= line naming the socket; reads $WATCHDOG_USEC. */
void kvb_sd_ready(const char *socket_path);
/* WATCHDOG=1 when half the watchdog interval has passed since the last. */
void kvb_sd_tick(int64_t now_ns);
/* An idle sleep of ms, shortened to the next watchdog ping when one is due
 * sooner. */
int kvb_sd_sleep_ms(int ms, int64_t now_ns);
void kvb_sd_stopping(void);

#endif

/* SPDX-License-Identifier: MIT */
#ifndef KVB_BROKER_LOG_H
#define KVB_BROKER_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum kvb_log_level { KVB_LOG_ERROR, KVB_LOG_WARN, KVB_LOG_INFO, KVB_LOG_DEBUG };

extern int kvb_log_level;

/*
 * Line formats (--log-format): text "kvbroker 2026-12-03T12:00:00.123Z
 * info: msg"; json, one object a line {"ts":..,"level":..,"msg":..}; journal,
 * the sd-daemon priority prefix "<6>info: msg" (journald adds the time).
 * AUTO: journal when stderr is the journal's stream ($JOURNAL_STREAM), else
 * text.
 */
enum kvb_log_format {
	KVB_LOG_FMT_AUTO = 0,
	KVB_LOG_FMT_TEXT,
	KVB_LOG_FMT_JSON,
	KVB_LOG_FMT_JOURNAL,
};

extern int kvb_log_format;

/* Parse "auto|text|json|journal"; returns the format or -EINVAL. */
int kvb_log_format_parse(const char *s);
/* Set kvb_log_format; AUTO is resolved here (kvb_log_journal_stream). */
void kvb_log_set_format(int fmt);
/* Is stderr the journal's stream ($JOURNAL_STREAM names its device and
 * inode, set by systemd for StandardError=journal)? 1 or 0. */
int kvb_log_journal_stream(void);

/*
 * One log line, newline included, into buf (cap bytes; longer lines are
 * cut, the newline kept). ts is CLOCK_REALTIME; suppressed, when not 0, is
 * how many lines of this kind were left out before ("[N more suppressed]",
 * in json a "suppressed" field). Returns the length. Thread-safe.
 */
size_t kvb_log_format_line(char *buf, size_t cap, int fmt, int level,
			   const struct timespec *ts, uint64_t suppressed,
			   const char *msg);
/* ISO 8601 UTC with milliseconds, "2026-12-03T12:00:00.123Z" (24 chars and
 * the NUL: cap >= 25). Returns the length, 0 when it did not fit. */
size_t kvb_log_iso8601(char *buf, size_t cap, const struct timespec *ts);

void kvb_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Parse "error|warn|info|debug"; returns the level or -EINVAL. */
int kvb_log_parse(const char *s);

/*
 * A log-line rate limiter: at most `burst` lines a window of `window_ns`,
 * the rest counted. A window starts at the first line asked for after the
 * last one ended; window_ns 0 is one window that never ends (`burst` lines
 * in all). The caller passes the clock, so tests need no sleeps. Not
 * thread-safe: one limiter per thread (the broker's loop).
 */
struct kvb_ratelimit {
	int64_t window_ns; /* 0: never ends */
	int64_t start;	   /* the current window's first line */
	uint32_t burst;	   /* lines let through a window */
	uint32_t lines;	   /* of them, let through in the current one */
	uint64_t held;	   /* suppressed in the current window */
	uint64_t missed;   /* suppressed in ended windows, not yet taken */
};

void kvb_ratelimit_init(struct kvb_ratelimit *rl, uint32_t burst,
			int64_t window_ns);
/* Whether a line may be logged at `now`: 1, or 0 with the line counted as
 * suppressed. Ends the current window first if its time is up. */
int kvb_ratelimit_ok(struct kvb_ratelimit *rl, int64_t now);
/* The lines suppressed in windows that ended by `now` and not taken yet
 * (0 if none); they are not returned again. For a summary line ("N ...
 * lines suppressed") from a timer or before the next line logged. */
uint64_t kvb_ratelimit_take(struct kvb_ratelimit *rl, int64_t now);

/* Lines the current window still lets through (0 after its last one). */
static inline uint32_t kvb_ratelimit_left(const struct kvb_ratelimit *rl)
{
	return rl->burst - rl->lines;
}

/*
 * Rate-limited logging for lines that can repeat (a client that keeps
 * misbehaving, a flood of refusals): each call site (kind) logs at most one
 * line a second; the lines it suppressed meanwhile are counted and the next
 * line it logs says how many (" [N more suppressed]"). rl is the call
 * site's own limiter (a static zero one: initialised on first use); `now`
 * is CLOCK_MONOTONIC in ns. Lines above kvb_log_level are neither logged
 * nor counted. Returns 1 when the line was logged.
 */
int kvb_log_rl_at(struct kvb_ratelimit *rl, int64_t now, int level,
		  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The same at the current time. */
int kvb_log_rl(struct kvb_ratelimit *rl, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * The same for a call site that logs several kinds of line, told apart by
 * `key` (e.g. the string literal of the reason a caller passed): each key
 * its own limiter (a table of 128, the last one shared by any beyond).
 */
int kvb_log_rl_keyed(const void *key, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define KVB_LOG_RL(level, ...)                                     \
	do {                                                       \
		static struct kvb_ratelimit kvb_log_rl_site_;      \
		kvb_log_rl(&kvb_log_rl_site_, level, __VA_ARGS__); \
	} while (0)
#define log_err_rl(...)	 KVB_LOG_RL(KVB_LOG_ERROR, __VA_ARGS__)
#define log_warn_rl(...) KVB_LOG_RL(KVB_LOG_WARN, __VA_ARGS__)
#define log_info_rl(...) KVB_LOG_RL(KVB_LOG_INFO, __VA_ARGS__)

#define log_err(...)  kvb_log(KVB_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) kvb_log(KVB_LOG_WARN, __VA_ARGS__)
#define log_info(...) kvb_log(KVB_LOG_INFO, __VA_ARGS__)
#define log_dbg(...)                                         \
	do {                                                 \
		if (kvb_log_level >= KVB_LOG_DEBUG)          \
			kvb_log(KVB_LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif

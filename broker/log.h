/* SPDX-License-Identifier: MIT */
#ifndef KVB_BROKER_LOG_H
#define KVB_BROKER_LOG_H

enum kvb_log_level { KVB_LOG_ERROR, KVB_LOG_WARN, KVB_LOG_INFO, KVB_LOG_DEBUG };

extern int kvb_log_level;

void kvb_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Parse "error|warn|info|debug"; returns the level or -EINVAL. */
int kvb_log_parse(const char *s);

#define log_err(...)  kvb_log(KVB_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) kvb_log(KVB_LOG_WARN, __VA_ARGS__)
#define log_info(...) kvb_log(KVB_LOG_INFO, __VA_ARGS__)
#define log_dbg(...)                                         \
	do {                                                 \
		if (kvb_log_level >= KVB_LOG_DEBUG)          \
			kvb_log(KVB_LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif

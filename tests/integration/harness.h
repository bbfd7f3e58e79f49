/* SPDX-License-Identifier: MIT */
/*
 * Integration-test harness: run the real kvbroker binary on a private socket
 * in a temporary directory, talk to it, stop it, and look at it from outside
 * (/proc, its log). Every function returns 0 or -errno unless it says
 * otherwise; none of them calls cmocka, so child processes may use them.
 */
#ifndef KVB_TESTS_HARNESS_H
#define KVB_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvbroker/kvbroker.h"

struct broker {
	pid_t pid;
	char dir[64];
	char sock[128];
	char log[128];
};

struct broker_opts {
	const char *const *args; /* extra arguments, NULL-terminated */
	uid_t uid;		 /* 0 = as we are; else setuid() before exec */
};

/* Start the broker (--socket DIR/b.sock --busy-poll-us 20 + extra args) and
 * wait until its socket answers a STATS request (up to 10 s). */
int broker_start(struct broker *b, const struct broker_opts *o);

/* Start the broker as broker_start does (same socket, log and arguments),
 * expecting it to refuse to start: wait up to timeout_ms for it to exit.
 * Returns its exit status (0..255, or 128 + signal), -ETIMEDOUT when it was
 * still running (it is killed then), or -errno. The log stays readable
 * (broker_log_has) until broker_cleanup. */
int broker_run_to_exit(struct broker *b, const struct broker_opts *o,
		       int timeout_ms);

/* SIGTERM, wait up to 10 s; returns the exit status (0..255), or -errno,
 * or 128 + signal when it died of a signal. The log stays readable
 * (broker_log_has) until broker_cleanup, which removes the directory. */
int broker_stop(struct broker *b);

/* SIGKILL and reap (no exit-status check); removes the directory. */
void broker_kill(struct broker *b);

/* Remove the log and the directory (after the broker is gone). */
void broker_cleanup(struct broker *b);

/* STATS request on a fresh connection: JSON text into buf. */
int broker_stats(const struct broker *b, char *buf, size_t cap);

/* The same from a child running as uid (for a broker of another uid). */
int broker_stats_as(const struct broker *b, uid_t uid, char *buf, size_t cap);

/* "key":number from the stats JSON; -1 when absent. */
int64_t stat_get(const char *json, const char *key);

/* One counter straight from the broker; -1 on error. */
int64_t broker_stat(const struct broker *b, const char *key);

/* Poll until counter `key` == want (up to timeout_ms); returns 0 or -ETIMEDOUT.
 */
int broker_wait_stat(const struct broker *b, const char *key, int64_t want,
		     int timeout_ms);

/* Does the broker's log (stderr) contain s? 1 or 0. */
int broker_log_has(const struct broker *b, const char *s);

/* Print the broker's log to stderr (on failure). */
void broker_log_dump(const struct broker *b);

/* Entries in /proc/<pid>/fd and lines in /proc/<pid>/maps; -errno on error. */
int proc_fd_count(pid_t pid);
int proc_map_count(pid_t pid);

/* Wait up to timeout_ms for pid's fd count to drop to max (connections
 * the broker has not noticed closing yet); returns the last count. */
int proc_fd_wait(pid_t pid, int max, int timeout_ms);

/* fds of an idle broker: stdio, signalfd, eventfd, epoll, listen socket,
 * the local transport's eventfd (copy pool completions) */
#define BROKER_IDLE_FDS 8

/*
 * ms a loaded 2-core CI machine may add to a time bound (a process stalls
 * for most of a second now and then). Upper bounds that only catch a hang
 * get it; lower bounds (a timeout must not fire early) stay exact.
 */
#define SLACK 2000

/* Entries in /dev/shm whose name contains "kvb". */
int devshm_kvb_count(void);

/* Monotonic clock in ns / ms. */
int64_t now_ns(void);
double ms_since(int64_t t0);

/* Fill / check the test pattern: byte at `off` of stream `seed`. */
void pattern_fill(void *p, uint64_t len, uint32_t seed, uint64_t off);
/* Returns the number of bytes that differ. */
uint64_t pattern_check(const void *p, uint64_t len, uint32_t seed,
		       uint64_t off);

/* Run argv (argv[0] is a path) and wait; returns the exit status or -errno.
 * stdout goes into out (NUL-terminated) when out is not NULL. */
int run_cmd(char *const argv[], char *out, size_t cap, int timeout_s);

/* Attach to b as (role, tp_rank / tp_size) with sq_entries (0 = default);
 * returns the context or NULL (errno set). */
struct kvb_ctx *w_attach(const struct broker *b, enum kvb_role role,
			 uint32_t tp_rank, uint32_t tp_size,
			 uint32_t sq_entries);

/* Gather exactly `want` completions (kvb_wait) within timeout_ms; returns
 * how many arrived (< want on timeout) or -errno. */
int w_collect(struct kvb_ctx *c, struct kvb_completion *v, unsigned want,
	      int timeout_ms);

/* Index of the completion with (kind, tag) in v[0..n), or -1. */
int w_find(const struct kvb_completion *v, int n, uint32_t kind, uint64_t tag);

/* A transfer of one write: open `id`, submit d (its transfer set here),
 * seal (tag 2), and wait up to 5 s for both completions. Returns the
 * transfer's status, or -ETIMEDOUT / -EPROTO / a call's -errno. */
int w_transfer_write(struct kvb_ctx *c, const char *id, struct kvb_desc d);

/*
 * The fixture of a cmocka group: one broker for all its tests and, when
 * `size` is set, one attached P worker (tp 0 of 1) holding two regions of
 * `size` bytes without remote access: src (key 1, filled with pattern
 * `seed`) and dst (key 2). A test program sets args, size and seed, runs
 * cmocka_run_group_tests(tests, fixture_setup, fixture_teardown) and uses
 * the rest. Teardown detaches the worker and stops the broker: -1 (the
 * group fails) when the broker does not exit with 0.
 */
struct fixture {
	const char *const *args; /* extra broker arguments, NULL-terminated */
	uint64_t size;		 /* 0: no worker */
	uint32_t seed;
	struct broker br;
	struct kvb_ctx *ctx;
	struct kvb_region src, dst;
};

extern struct fixture fx;

int fixture_setup(void **state);
int fixture_teardown(void **state);

/* Two brokers on 127.0.0.1 that talk to each other (cross-node tests): a
 * (P's node) and b (D's), each trusting 127.0.0.1, on handshake ports
 * hs_a / hs_b (notify ports one above), below the ephemeral range. */
struct broker_pair {
	struct broker a, b;
	uint16_t hs_a, hs_b;
	char ha[8], hb[8], na[8], nb[8];
};

/* Start both, extra (NULL-terminated, may be NULL) added to each one's
 * arguments; a port another program or a connection took is tried again
 * on others (4 tries). 0 or -errno (neither left running). */
int broker_pair_start(struct broker_pair *p, const char *const *extra);
/* SIGTERM both: 0, or the first failure (both are stopped anyway). */
int broker_pair_stop(struct broker_pair *p);
/* SIGKILL what is left of both (a failed test's teardown). */
void broker_pair_kill(struct broker_pair *p);

#endif

/* SPDX-License-Identifier: MIT */
/* Control-socket helpers (private to libkvbroker and kvbctl). */
#ifndef KVB_CLIENT_CTL_H
#define KVB_CLIENT_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define KVB_CTL_MAX_FDS 4

#include <sys/types.h>

int kvb_default_socket(char *buf, unsigned long len);
/*
 * The private directory of the default socket path ($XDG_RUNTIME_DIR/
 * kvbroker, /run/kvbroker for root, else /tmp/kvbroker-UID) into buf:
 * its length, 0 when $KVB_SOCKET names the path (no directory rule), or
 * -ENAMETOOLONG.
 */
int kvb_default_socket_dir(char *buf, unsigned long len);
/*
 * Is dir private to uid: lstat (a symlink is refused), a directory, owned
 * by uid, no access for group or others? 0, -EACCES or -errno (-ENOENT),
 * with the reason in why.
 */
int kvb_sock_dir_check(const char *dir, uid_t uid, char *why, size_t why_len);
/* The peer of a connected socket runs as this uid, root or one listed in
 * $KVB_BROKER_UIDS: 0, else -EACCES (*peer: its uid), or -errno. */
int kvb_ctl_check_peer(int sock, uid_t *peer);
/* kvb_ctl_connect, then kvb_ctl_check_peer (nothing sent before); with
 * check_dir, first kvb_sock_dir_check of the default directory (when
 * $KVB_SOCKET does not name the path). An fd or -errno (-EACCES). */
int kvb_ctl_open(const char *path, int timeout_ms, int check_dir);
/* Connect to the broker socket; returns an fd or -errno. */
int kvb_ctl_connect(const char *path, int timeout_ms);
/* Zero a message of `len` bytes and fill its header. */
void kvb_msg_init(struct kvb_msg_hdr *h, uint16_t type, uint32_t len);
/* Send one message with up to KVB_CTL_MAX_FDS fds; 0 or -errno. */
int kvb_ctl_send(int sock, const void *msg, size_t len, const int *fds,
		 unsigned nfds);
/*
 * Receive one message; *nfds in: room in fds, out: fds received. Returns the
 * message length, -EPIPE on EOF, -ETIMEDOUT, -EMSGSIZE or -errno.
 * kvb_ctl_send and kvb_ctl_recv wait as the socket says (SO_SNDTIMEO /
 * SO_RCVTIMEO, set by kvb_ctl_connect; not at all on a non-blocking one),
 * and a signal restarts that wait: the client library uses the _by forms.
 */
int kvb_ctl_recv(int sock, void *buf, size_t cap, int *fds, unsigned *nfds);

/* CLOCK_MONOTONIC in ns: the clock of the deadlines below. */
int64_t kvb_ctl_now_ns(void);
/* A deadline timeout_ms from now (timeout_ms <= 0: now). */
int64_t kvb_ctl_deadline(int timeout_ms);
/*
 * kvb_ctl_send / kvb_ctl_recv that give up at `deadline` (kvb_ctl_now_ns's
 * clock) with -ETIMEDOUT, whatever the socket's timeouts and however many
 * signals interrupt them; a deadline already past still sends or receives
 * what can go without waiting.
 */
int kvb_ctl_send_by(int sock, const void *msg, size_t len, const int *fds,
		    unsigned nfds, int64_t deadline);
int kvb_ctl_recv_by(int sock, void *buf, size_t cap, int *fds, unsigned *nfds,
		    int64_t deadline);
/* Check a reply's header against the request type; 0 or the status. */
int kvb_ctl_check_reply(const struct kvb_msg_hdr *h, int n, uint16_t type,
			size_t min_len);
/*
 * Ask the broker at socket_path for its counters (KVB_MSG_STATS): a table,
 * or one JSON object with json != 0. The reply's text, NUL-terminated, goes
 * to buf. Returns its length (without the NUL), -ENOSPC when it does not fit
 * in cap bytes (buf then holds nothing), or -errno (-ENOENT / -ECONNREFUSED:
 * no broker there, -ETIMEDOUT after timeout_ms, -EPROTO: a bad reply).
 */
int kvb_ctl_stats(const char *socket_path, int json, char *buf, size_t cap,
		  int timeout_ms);
/* The same for one of kvbctl's views (1 = workers, 2 = transfers, 3 =
 * peers; 0 = the counters): -EINVAL from a broker that has no such view. */
int kvb_ctl_view(const char *socket_path, uint32_t view, int json, char *buf,
		 size_t cap, int timeout_ms);

#endif

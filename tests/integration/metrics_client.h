/* SPDX-License-Identifier: MIT */
/*
 * A tiny HTTP/1.x client for the metrics tests: one request on a fresh TCP
 * connection to 127.0.0.1, the whole answer read until the server closes.
 * Every function returns 0 or -errno unless it says otherwise.
 */
#ifndef KVB_TESTS_METRICS_CLIENT_H
#define KVB_TESTS_METRICS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "harness.h"

/* Send `req` verbatim to 127.0.0.1:port, read the answer (NUL-terminated,
 * malloc'd into *resp) until EOF or timeout_ms (-ETIMEDOUT). */
int http_raw(uint16_t port, const char *req, size_t req_len, char **resp,
	     int timeout_ms);

/* GET path with an optional Accept header value (NULL: none). */
int http_get(uint16_t port, const char *path, const char *accept, char **resp,
	     int timeout_ms);

/* The status code of an answer, or -1. */
int http_status(const char *resp);
/* The value of header `name` (case-insensitive) into out, or -ENOENT. */
int http_header(const char *resp, const char *name, char *out, size_t cap);
/* The body of an answer (after the blank line), or NULL. */
const char *http_body(const char *resp);

/* The value of the sample whose name and labels are exactly `series`
 * (`name` or `name{a="b",...}`), or -1 when there is none. */
double metric(const char *body, const char *series);

/* The endpoint's port from the broker's log ("metrics on http://...");
 * 0 when it is not there. */
uint16_t broker_metrics_port(const struct broker *b);

/* A free TCP port on 127.0.0.1 (bound and released), or 0. */
uint16_t free_port(void);

/* Connect to 127.0.0.1:port; an fd or -errno. */
int tcp_connect_lo(uint16_t port);

#endif

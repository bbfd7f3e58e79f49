/* SPDX-License-Identifier: MIT */
/*
 * Harness of the tcp transport tests: two transports in one process over
 * 127.0.0.1. A posts, B owns the target regions; both are driven by poll()
 * in bounded loops with a deadline (a hang fails the test, it never waits
 * forever). Every cookie must complete exactly once.
 */
#ifndef KVB_TESTS_TCP_HARNESS_H
#define KVB_TESTS_TCP_HARNESS_H
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bridge/tcp/tcp.h"
#include "kvbroker/kvbroker.h"

#define KiB	 1024ull
#define MiB	 (1024ull * KiB)
#define GUARD	 4096u
#define GUARD_B	 0xee
#define DEADLINE 20.0 /* seconds, per wait */

/* ---- harness ---- */

struct region {
	struct kvb_mr mr;
	uint8_t *base; /* guard | mem | guard */
	uint8_t *mem;
	size_t len;
};

struct tracker {
	uint64_t n, posted, done;
	uint8_t *state; /* 0 new, 1 posted, 2 completed */
	int32_t *status;
};

struct pair {
	struct kvb_transport *a, *b;
	struct kvb_ep *ep;
	struct tracker tr;
};

double now_s(void);
void region_init(struct region *r, uint32_t id, size_t len, uint32_t flags);
void region_fill(struct region *r, unsigned seed);
int guards_ok(const struct region *r);
void region_free(struct region *r);
struct kvb_transport *topen(const char *ip, uint32_t port, uint32_t depth,
			    int timeout_ms);
/* stripes: params.qp_per_peer, connections per connect() (0 = 1) */
struct kvb_transport *topen_stripes(const char *ip, uint32_t port,
				    uint32_t depth, int timeout_ms,
				    int stripes);
void tr_init(struct tracker *tr, uint64_t n);
void tr_free(struct tracker *tr);
void pair_open(struct pair *p, uint32_t depth, int timeout_ms,
	       uint64_t ncookies);
void pair_open_stripes(struct pair *p, uint32_t depth, int timeout_ms,
		       uint64_t ncookies, int stripes);
void pair_close(struct pair *p);
int reap(struct pair *p);
void pump(struct pair *p);
void post_all(struct pair *p, const struct kvb_xop *ops, unsigned n);
void wait_all(struct pair *p);
struct kvb_xop xop(uint32_t code, struct region *l, uint64_t loff,
		   uint32_t region, uint64_t roff, uint64_t len,
		   uint64_t cookie);
void reg(struct kvb_transport *t, struct region *r);
struct kvb_tcp_stats stats(struct kvb_transport *t);
void xfer_blocks(uint32_t code, unsigned n, uint64_t bs);

/* ---- authentication (docs/tcp.md) ---- */

/* The key every harness transport accepts from any dialer (topen) and
 * every endpoint made by pair_open proves. */
extern const uint8_t harness_key[KVB_TCP_KEY_LEN];
void ep_key(struct kvb_transport *t, struct kvb_ep *ep);
/* A raw connection to p->b, as a dialer with id `id` proving `key`:
 * HELLO, CHALLENGE (its MAC checked when check_srv), PROOF. The nonces
 * and the PROOF sent are copied out when not NULL (replay tests). */
void raw_auth(struct pair *p, int fd, uint64_t id, const uint8_t *key,
	      uint8_t hello[56], uint8_t proof[40]);
/* The test plays the server on fd (accepted): HELLO, CHALLENGE under
 * harness_key for server id srv_id, PROOF checked. */
void fake_auth(struct pair *p, int fd, uint64_t srv_id);
/* Read exactly n bytes from fd, pumping p; false at the deadline/EOF. */
int raw_read(struct pair *p, int fd, uint8_t *buf, size_t n);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * test_ctl_fuzz (see its header comment): the state, model and wire
 * helpers shared by test_ctl_fuzz.c (requests, checks, the run) and
 * ctl_fuzz_core.c (randomness, trace, the model, the wire, connections).
 */
#ifndef KVB_TESTS_CTL_FUZZ_H
#define KVB_TESTS_CTL_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "harness.h"

#define NCONN	    3
#define MAX_REGS    256 /* live regions the model tracks */
#define NDEAD	    64	/* ids of regions gone, remembered */
#define NPEERS	    16	/* peer ids the broker gave us */
#define NIDS	    12	/* shared transfer ids "fz-0".."fz-11" */
#define MAX_BLOCKS  1024
#define CHECK_EVERY 250
#define REPLY_MS    (5000 + SLACK)
#define HS_MS	    3000 /* the broker's handshake timeout */
#define MEMFD_SIZE  65536
/* fds and mappings over the idle broker's: the workers' sockets, notify
 * endpoints and segments, the peers' connections, closing ones; ASan's
 * allocator maps more as the heap grows (about +100 by 500k messages, flat) */
#define FD_SLACK     96
#define FD_SLACK_END 32 /* no worker left: the peers' connections */
#ifdef __SANITIZE_ADDRESS__
#define MAP_SLACK 256
#else
#define MAP_SLACK 64
#endif
#define TRACE_LINES 16
#define TRACE_LEN   200

/* ports: handshake, notify base (16 above it: dp <= 3, tp_size <= 4), two
 * free ones that PEER and XOPEN may name */
#define PORT_SPAN  24
#define KIND_HOST  0 /* kvb_msg_mem_reg.kind (shm/proto.h) */
#define KIND_GPU   1
#define NOTIFY_OFF 1
#define DEAD_OFF   20

struct conn {
	int fd; /* -1: not connected */
	uint32_t role, dp, tp, tp_size;
	uint32_t seq;		/* the next request's */
	uint32_t peer_out;	/* PEER requests not answered yet */
	uint32_t peer_seqs[64]; /* seqs of PEER requests, ring */
	uint32_t npeer_seqs;
	uint32_t worker_id;
	int64_t t_open;
};

struct reg {
	uint32_t id;
	int conn;
	uint32_t role, dp, tp, flags;
	uint64_t key, size;
	int has_kv;
	uint32_t layer;
};

/* requests sent and answered 0, per type; connections, hang-ups */
struct fuzz_stats {
	uint64_t sent[KVB_MSG_OPEN_BATCH + 1], ok[KVB_MSG_OPEN_BATCH + 1];
	uint64_t conns, drops, peer_late;
};

extern struct broker br;
extern uint16_t hs_port, notify_port, dead_port[2];
extern uint64_t seed, rng;
extern uint64_t msgs, max_msgs;
extern int64_t t_start, max_ms;
extern struct conn conns[NCONN];
extern struct reg regs[MAX_REGS];
extern uint32_t nregs;
extern uint32_t dead_ids[NDEAD], ndead;
extern uint32_t peers[NPEERS], npeers;
extern int fd_good, fd_short, fd_unsealed, fd_other;
extern int base_fds, base_maps, max_fds, max_maps;
extern int trace_all; /* KVB_FUZZ_TRACE=1: every line to stderr */
extern char rbuf[KVB_MSG_MAX];
extern struct fuzz_stats st;
extern const char *const type_name[];

uint64_t rnd(void);
uint32_t below(uint32_t n);
int chance(unsigned pct);
uint32_t edge32(void);
void tracef(const char *fmt, ...);
struct reg *reg_find(uint32_t id);
void reg_gone(struct reg *r);
uint32_t own_regs(int ci);
uint32_t pick_region(int ci);
int layer_taken(int ci, uint32_t layer);
uint32_t pick_peer(void);
void pick_id(char *id, uint32_t *len);
void conn_closed(int ci);
void send_msg(int ci, struct kvb_msg_hdr *h, const int *fds, unsigned nfds);
void peer_late(int ci, const struct kvb_msg_hdr *h, int n);
int read_one(int ci, int64_t deadline);
int await_reply(int ci, uint16_t type, size_t want);
void await_hangup(int ci);
void expect_status(int ci, const char *what, int got, int want);
void expect_one_of(int ci, const char *what, int got, int n, ...);
void conn_open(int ci);
void do_bye(int ci);

/* fails the test: the seed, the last requests, the broker's log */
void fuzz_fail(int line, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define CHECK(cond, ...)                                  \
	do {                                              \
		if (!(cond))                              \
			fuzz_fail(__LINE__, __VA_ARGS__); \
	} while (0)

#endif /* KVB_TESTS_CTL_FUZZ_H */

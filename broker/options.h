/* SPDX-License-Identifier: MIT */
#ifndef KVB_BROKER_OPTIONS_H
#define KVB_BROKER_OPTIONS_H

/* --burst: the most descriptors drained from one ring per round */
#define KVB_BURST_MAX 256u
/* --qp-per-transfer: the rdma transport's limit (KVB_RDMA_MAX_QP) */
#define KVB_QP_PER_PEER_MAX 16u
#define KVB_TCP_CONNS_MAX   16u
#define KVB_TCP_CONNS_DEF   4
/* --max-pending: at most; worker slot ids have 12 bits for all slots */
#define KVB_PENDING_MAX 1024u
/* --rdma-dev: a verbs device name's bytes with its NUL (IBV_SYSFS_NAME_MAX),
 * and the whole list: KVB_NIC_MAX (transport.h) of them with their commas */
#define KVB_RDMA_NAME_MAX 64
#define KVB_RDMA_DEV_LEN  (8 * KVB_RDMA_NAME_MAX)

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kvb_transport_kind {
	KVB_TR_AUTO = 0,
	KVB_TR_LOCAL,
	KVB_TR_TCP,
	KVB_TR_RDMA,
	KVB_TR_GPU,
};

struct kvb_options {
	char socket_path[108];
	/* the default path in its private directory (not --socket or
	 * $KVB_SOCKET): the broker creates and checks socket_dir */
	int socket_private;
	char socket_dir[108];
	enum kvb_transport_kind transport;
	int log_level;
	int log_format;	       /* enum kvb_log_format (log.h) */
	char config_path[256]; /* --config FILE ("" = none; config.c) */
	uint32_t busy_poll_us; /* spin this long idle before sleeping */
	uint32_t sq_entries;   /* per worker, power of two */
	uint32_t cq_entries;
	uint32_t max_workers;
	uint32_t burst;	     /* entries drained per worker per round */
	int post_batch_size; /* WRs per chain, -1 = all pending */
	/* the stall clock (--stall-timeout, alias --transfer-timeout) */
	uint32_t transfer_timeout_ms;
	uint32_t defer_timeout_ms;
	uint32_t peer_timeout_ms;      /* --peer-timeout: a peer is lost */
	uint32_t unopened_timeout_ms;  /* --unopened-timeout */
	uint32_t unknown_timeout_ms;   /* --unknown-timeout */
	uint32_t transfer_deadline_ms; /* --transfer-deadline */
	char host_ip[64];
	int xnode; /* --host-ip given: the cross-node module (bridge/xnode) */
	uint16_t data_port; /* tcp transport listen port, 0 = any */
	uint16_t notify_port;
	uint16_t handshake_port;
	int read_mode;
	char trusted_hosts[1024];
	/* --rdma-dev: one device, a comma-separated list of at most
	 * KVB_NIC_MAX, or "all" ("" = the first usable one) */
	char rdma_dev[KVB_RDMA_DEV_LEN];
	int max_qps; /* --max-qps: QPs per device, 0 = the device's limit */
	int ib_port;
	int gid_index;
	int qp_per_transfer;
	int tcp_conns;			 /* tcp: connections per peer */
	uint32_t tcp_max_conns;		 /* tcp: served connections in all */
	uint32_t tcp_max_conns_per_host; /* tcp: from one source address */
	uint32_t tcp_auth_ms;  /* tcp: a connection's time to authenticate */
	char cluster_key[256]; /* --cluster-key FILE ("" = none) */
	int gpu_streams;
	int copy_threads; /* local copy pool, -1 = auto (see options.c) */
	int copy_plain;	  /* --copy-plain: memcpy only, no streaming stores */
	/* node-side protection (docs/security.md, "On the node") */
	uint32_t hello_timeout_ms; /* a connection must say HELLO by then */
	uint32_t max_pending;	   /* connections that have not said HELLO */
	uint32_t max_ring_entries; /* largest ring a HELLO may ask for */
	uint32_t max_xfers_per_worker;	  /* 0 = fair share only */
	uint32_t max_inflight_per_worker; /* 0 = fair share only */
	uint32_t max_undelivered; /* completions queued past a full CQ */
	char metrics_listen[80];  /* --metrics-listen ADDR:PORT, "" = off */
	int help, version;
};

/* Fill defaults (socket path from the environment). */
void kvb_options_default(struct kvb_options *o);

/*
 * Parse argv into o (defaults first). Returns 0, or -EINVAL with a message
 * in err (err_len bytes). Not thread-safe (getopt).
 */
int kvb_options_parse(struct kvb_options *o, int argc, char **argv, char *err,
		      size_t err_len);

void kvb_options_usage(FILE *f);
/* Is `name` (a long option without "--") one of the broker's options:
 * 1 when it takes a value, 0 when it is a flag, -ENOENT when unknown. */
int kvb_option_kind(const char *name);
const char *kvb_transport_name(enum kvb_transport_kind k);

#endif

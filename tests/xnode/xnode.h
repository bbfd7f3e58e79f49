/* SPDX-License-Identifier: MIT */
/* xnode_worker's options (xnode_args.c) and the KV shape it uses. */
#ifndef KVB_TESTS_XNODE_H
#define KVB_TESTS_XNODE_H

#define BLOCK_SIZE 16u
#define HEAD_DIM   64u
#define ELEM	   2u

struct xnode_opts {
	const char *socket, *peer_host, *barrier, *prefix, *gpu;
	int role, mode, dp, tp, tp_size, peer_tp_size, peer_dp;
	unsigned layers, nblocks, per_xfer, xfers, conc, heads;
	unsigned peer_heads; /* D: heads of a P rank (0 = as ours) */
	int peer_port, expect_fail, timeout_s, layer_delay_ms, hold_s;
	int plain_release;
	int contig, no_verify;
	/* moriio_peer / untrusted cases */
	const char *expect_cancel, *check, *hold_until, *linger_until;
	char notify_host[64];
	int notify_port, expect_peer_error;
	int swap_layer, swap_after, swapped;
	/* 1: --expect-some-fail; 2: --allow-fail (the last must succeed) */
	int expect_some_fail;
	int start_delay_ms;
	int check_zero;	    /* after holding: every byte of our regions is 0 */
	int fail_errno;	    /* --expect-fail: every failure is -this */
	int deadline_ms;    /* --deadline-ms: each transfer's deadline */
	int quiet_check_ms; /* D: a failed transfer's regions stay as they
			     * were at its completion for this long */
	unsigned wrong_err; /* failures with another status */
	unsigned last_ok;   /* highest transfer index that succeeded, + 1 */
};

extern struct xnode_opts o;

/* Parse argv into o: 0, or -1 for anything invalid (then xnode_usage()). */
int xnode_parse(int argc, char **argv);
void xnode_usage(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of bridge/xnode/nic.c: a region's keys per NIC into the engine
 * descriptor (and through the codec), into the ops addressed to a peer, the
 * ops still queued when a peer's descriptor is replaced, and the log line
 * naming a region's NIC, and which op errors leave a peer usable (a queue
 * pair parked alone). A fake multi-NIC transport; no daemon, no device.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"
#include "log.h"
#include "regions.h"
#include "tests/unit/fake_nic.h"
#include "xnode/nic.h"
#include "zmq/handshake.h"

static struct kvb_hs_region plain(uint32_t id)
{
	struct kvb_hs_region hr = {.id = id, .rkey = 0x77, .addr = 0x10000};

	return hr;
}

static void test_region_keys(void **state)
{
	struct kvb_transport_ops ops;
	struct fake_nic_tr f;
	struct kvb_mr mr = {.id = 5, .rkey = 0x77};
	struct kvb_hs_region hr;

	(void) state;
	fake_nic_init(&f, &ops, "rdma", 3);
	hr = plain(5);
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), 3);
	assert_int_equal(hr.nrkeys, 3);
	assert_int_equal(hr.nic, 5 % 3);
	assert_int_equal(hr.rkeys[0], 5u << 8);
	assert_int_equal(hr.rkeys[2], 5u << 8 | 2);
	/* rkey is the key on the nearest NIC (what a one-NIC peer uses) */
	assert_int_equal(hr.rkey, 5u << 8 | 2);

	/* one key, none, an error, a bad nearest NIC: the plain rkey */
	f.keys_n = 1;
	hr = plain(5);
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), 0);
	assert_int_equal(hr.nrkeys, 0);
	assert_int_equal(hr.rkey, 0x77);
	f.keys_n = -ENOENT;
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), 0);
	assert_int_equal(hr.nrkeys, 0);
	f.keys_n = 0;
	f.home_bad = 1;
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), 0);
	assert_int_equal(hr.nrkeys, 0);
	assert_int_equal(hr.rkey, 0x77);
	f.home_bad = 0;
	/* more NICs than a descriptor carries: the first KVB_NIC_MAX */
	f.keys_n = KVB_NIC_MAX + 3;
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), KVB_NIC_MAX);
	assert_int_equal(hr.nrkeys, KVB_NIC_MAX);
	f.keys_n = 0;
	/* no transport, or one without mr_keys (tcp) */
	hr = plain(5);
	assert_int_equal(kvb_xn_region_keys(NULL, &mr, &hr), 0);
	ops.mr_keys = NULL;
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr, &hr), 0);
	assert_int_equal(hr.nrkeys, 0);
}

/* Our descriptor through the codec, as the peer's: its ops carry the keys. */
static void test_remote_keys(void **state)
{
	struct kvb_transport_ops ops;
	struct fake_nic_tr f;
	struct kvb_mr mr[2] = {{.id = 4}, {.id = 7}};
	struct kvb_hs_region regs[2];
	struct kvb_hs_worker w = {.role = KVB_HS_ROLE_D,
				  .tp_size = 1,
				  .nregions = 2,
				  .regions = regs};
	struct kvb_hs_desc d = {.nworkers = 1, .workers = &w}, e;
	struct kvb_remote rem;
	const struct kvb_hs_region *hr;
	const char *why = NULL;
	size_t len;
	char *buf;

	(void) state;
	fake_nic_init(&f, &ops, "rdma", 2);
	strcpy(d.node_id, "n1");
	for (int i = 0; i < 2; i++) {
		regs[i] = plain(mr[i].id);
		regs[i].size = 4096;
		regs[i].geom = (struct kvb_kv_geom){.num_blocks = 1,
						    .block_size = 1,
						    .num_heads = 1,
						    .head_dim = 1,
						    .elem_size = 2};
		regs[i].addr = 0x10000u * (uint64_t) (i + 1);
	}
	assert_int_equal(kvb_xn_region_keys(&f.base, &mr[1], &regs[1]), 2);
	assert_int_equal(kvb_hs_encode(&d, &buf, &len), 0);
	assert_int_equal(kvb_hs_decode(&e, buf, len, &why), 0);
	free(buf);

	hr = &e.workers[0].regions[1];
	memset(&rem, 0, sizeof(rem));
	kvb_xn_remote_keys(&rem, hr);
	assert_ptr_equal(rem.rkeys, hr->rkeys);
	assert_int_equal(rem.nrkeys, 2);
	assert_int_equal(rem.nic, 7 % 2);
	assert_int_equal(rem.rkeys[1], 7u << 8 | 1);

	/* a region without keys: none (tcp, one NIC, an old peer) */
	kvb_xn_remote_keys(&rem, &e.workers[0].regions[0]);
	assert_null(rem.rkeys);
	assert_int_equal(rem.nrkeys, 0);
	assert_int_equal(rem.nic, 0);
	kvb_hs_fini(&e);
}

/* The peer re-sent its descriptor: queued ops leave the old one. */
static void test_rekey_queued(void **state)
{
	enum { WORKERS = 4, SLOT = 2 };
	struct kvb_hs_region old_r = plain(9), new_r[2];
	struct kvb_hs_worker nw = {.nregions = 2, .regions = new_r};
	struct kvb_hs_desc nd = {.nworkers = 1, .workers = &nw};
	struct kvb_broker *b = calloc(1, sizeof(*b));
	struct kvb_xop ops[3];
	struct kvb_dest *dst;

	(void) state;
	assert_non_null(b);
	b->opt.max_workers = WORKERS;
	b->dests = calloc(KVB_TS_MAX * WORKERS, sizeof(*b->dests));
	assert_non_null(b->dests);
	old_r.nrkeys = 2;
	old_r.rkeys[0] = 1;
	old_r.rkeys[1] = 2;
	old_r.nic = 1;
	new_r[0] = plain(8);
	new_r[1] = plain(9);
	new_r[1].nrkeys = 3;
	new_r[1].rkeys[2] = 33;
	new_r[1].nic = 2;

	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 3; i++) {
		ops[i].remote.region = 9;
		ops[i].remote.addr = old_r.addr;
		kvb_xn_remote_keys(&ops[i].remote, &old_r);
	}
	ops[1].remote.addr = 0x99999; /* the region moved: not the same */
	ops[2].remote.rkeys = NULL;   /* one key: left alone */
	ops[2].remote.nrkeys = 0;
	dst = &b->dests[KVB_TS_RDMA * WORKERS + SLOT];
	dst->ops = ops;
	dst->n = 3;
	kvb_xn_rekey_queued(b, SLOT, &nd);
	assert_ptr_equal(ops[0].remote.rkeys, new_r[1].rkeys);
	assert_int_equal(ops[0].remote.nrkeys, 3);
	assert_int_equal(ops[0].remote.nic, 2);
	assert_null(ops[1].remote.rkeys);
	assert_int_equal(ops[1].remote.nrkeys, 0);
	assert_int_equal(ops[1].remote.nic, 0);
	assert_null(ops[2].remote.rkeys);
	/* another peer's queue is not touched */
	ops[0].remote.rkeys = old_r.rkeys;
	kvb_xn_rekey_queued(b, SLOT + 1, &nd);
	assert_ptr_equal(ops[0].remote.rkeys, old_r.rkeys);
	free(b->dests);
	free(b);
}

/* What kvb_xn_log_region_nic writes to stderr. */
static void log_of(struct kvb_transport *t, const struct kvb_region_ent *r,
		   char *out, size_t cap)
{
	FILE *tmp = tmpfile();
	int saved = dup(2);
	size_t n;

	assert_non_null(tmp);
	assert_true(saved >= 0);
	fflush(stderr);
	assert_true(dup2(fileno(tmp), 2) >= 0);
	kvb_xn_log_region_nic(t, r);
	fflush(stderr);
	assert_true(dup2(saved, 2) >= 0);
	close(saved);
	rewind(tmp);
	n = fread(out, 1, cap - 1, tmp);
	out[n] = '\0';
	fclose(tmp);
}

static void test_log_region_nic(void **state)
{
	struct kvb_transport_ops ops;
	struct fake_nic_tr f;
	struct kvb_region_ent r;
	char line[512];

	(void) state;
	kvb_log_level = KVB_LOG_INFO;
	kvb_log_set_format(KVB_LOG_FMT_TEXT);
	memset(&r, 0, sizeof(r));
	r.mr.id = 0x21; /* 33 % 3: NIC 0 */
	r.mr.len = 4096;
	r.owner = 3;
	fake_nic_init(&f, &ops, "rdma", 3);
	log_of(&f.base, &r, line, sizeof(line));
	assert_non_null(strstr(line, "region 0x21 (4096 bytes, worker 3): "
				     "NIC fnic0: nearest to NUMA node 0"));
	f.nic_err = -ENOENT;
	log_of(&f.base, &r, line, sizeof(line));
	assert_non_null(strstr(line, "region 0x21: no NIC"));
	f.nic_err = 0;
	/* one NIC: nothing chosen, nothing said */
	f.nnics = 1;
	log_of(&f.base, &r, line, sizeof(line));
	assert_string_equal(line, "");
	f.nnics = 3;
	ops.nics = NULL;
	log_of(&f.base, &r, line, sizeof(line));
	assert_string_equal(line, "");
}

static int ep_state_now = KVB_EP_STATE_READY;

static int fake_ep_state(struct kvb_transport *t, struct kvb_ep *ep)
{
	(void) t;
	(void) ep;
	return ep_state_now;
}

/* A QP parked alone: its retry and flush errors leave the peer usable;
 * other errors, a reset endpoint, one NIC or no way to tell do not. */
static void test_parked_error(void **state)
{
	struct kvb_transport_ops ops;
	struct fake_nic_tr f;
	struct kvb_ep *ep = (struct kvb_ep *) &f; /* any non-NULL handle */

	(void) state;
	fake_nic_init(&f, &ops, "rdma", 2);
	ops.ep_state = fake_ep_state;
	ep_state_now = KVB_EP_STATE_READY;
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ETIMEDOUT), 1);
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ECANCELED), 1);
	/* a remote access error: the peer's regions changed */
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -EACCES), 0);
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -EREMOTEIO), 0);
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, 0), 0);
	/* the endpoint was reset (its last working pair failed) */
	ep_state_now = KVB_EP_STATE_RESET;
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ETIMEDOUT), 0);
	ep_state_now = KVB_EP_STATE_READY;
	/* one NIC: a failed QP resets the endpoint, never parked */
	f.nnics = 1;
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ETIMEDOUT), 0);
	f.nnics = 2;
	/* no transport, no endpoint, a transport that cannot tell */
	assert_int_equal(kvb_xn_parked_error(NULL, ep, -ETIMEDOUT), 0);
	assert_int_equal(kvb_xn_parked_error(&f.base, NULL, -ETIMEDOUT), 0);
	ops.ep_state = NULL;
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ETIMEDOUT), 0);
	ops.ep_state = fake_ep_state;
	ops.nics = NULL;
	assert_int_equal(kvb_xn_parked_error(&f.base, ep, -ETIMEDOUT), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_region_keys),
		cmocka_unit_test(test_remote_keys),
		cmocka_unit_test(test_rekey_queued),
		cmocka_unit_test(test_log_region_nic),
		cmocka_unit_test(test_parked_error),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT */
/* Harness of the tcp transport tests (see tcp_harness.h). */
#include "tcp_harness.h"

#include <sodium.h>

#include "bridge/le.h"
#include "bridge/tcp/wire.h"

const uint8_t harness_key[KVB_TCP_KEY_LEN] = {
	0x6b, 0x76, 0x62, 0x2d, 0x74, 0x65, 0x73, 0x74, 0x2d, 0x6b, 0x65,
	0x79, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
	0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14};

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

void region_init(struct region *r, uint32_t id, size_t len, uint32_t flags)
{
	memset(r, 0, sizeof(*r));
	r->base = malloc(len + 2 * GUARD);
	assert_non_null(r->base);
	memset(r->base, GUARD_B, len + 2 * GUARD);
	r->mem = r->base + GUARD;
	memset(r->mem, 0, len);
	r->len = len;
	r->mr.id = id;
	r->mr.flags = flags;
	r->mr.kind = KVB_MEM_HOST;
	r->mr.addr = r->mem;
	r->mr.len = len;
}

void region_fill(struct region *r, unsigned seed)
{
	size_t i;
	uint32_t x = seed * 2654435761u + 1;

	for (i = 0; i < r->len; i++) {
		x = x * 1103515245u + 12345u;
		r->mem[i] = (uint8_t) (x >> 16);
	}
}

int guards_ok(const struct region *r)
{
	size_t i;

	for (i = 0; i < GUARD; i++)
		if (r->base[i] != GUARD_B || r->mem[r->len + i] != GUARD_B)
			return 0;
	return 1;
}

void region_free(struct region *r)
{
	free(r->base);
}

struct kvb_transport *topen(const char *ip, uint32_t port, uint32_t depth,
			    int timeout_ms)
{
	return topen_stripes(ip, port, depth, timeout_ms, 0);
}

struct kvb_transport *topen_stripes(const char *ip, uint32_t port,
				    uint32_t depth, int timeout_ms, int stripes)
{
	struct kvb_transport_params p;
	struct kvb_transport *t = NULL;
	char why[128] = "";
	int rc;

	memset(&p, 0, sizeof(p));
	p.host_ip = ip;
	p.tcp_port = port;
	p.sq_depth = depth;
	p.timeout_ms = timeout_ms;
	p.qp_per_peer = stripes;
	rc = kvb_tcp_ops.open(&p, &t, why, sizeof(why));
	if (rc)
		fprintf(stderr, "open %s:%u: %d %s\n", ip ? ip : "-", port, rc,
			why);
	assert_int_equal(rc, 0);
	assert_non_null(t);
	/* any dialer proving the harness key, every region */
	assert_int_equal(kvb_tcp_peer_allow(t, 0, harness_key, NULL, -1), 0);
	return t;
}

void tr_init(struct tracker *tr, uint64_t n)
{
	memset(tr, 0, sizeof(*tr));
	tr->n = n;
	tr->state = calloc(n, 1);
	tr->status = calloc(n, sizeof(int32_t));
	assert_non_null(tr->state);
	assert_non_null(tr->status);
}

void tr_free(struct tracker *tr)
{
	free(tr->state);
	free(tr->status);
}

void pair_open(struct pair *p, uint32_t depth, int timeout_ms,
	       uint64_t ncookies)
{
	pair_open_stripes(p, depth, timeout_ms, ncookies, 0);
}

void pair_open_stripes(struct pair *p, uint32_t depth, int timeout_ms,
		       uint64_t ncookies, int stripes)
{
	uint8_t blob[64];
	size_t len = sizeof(blob);

	memset(p, 0, sizeof(*p));
	p->a = topen_stripes("127.0.0.1", 0, depth, timeout_ms, stripes);
	p->b = topen("127.0.0.1", 0, depth, timeout_ms);
	assert_int_equal(kvb_tcp_ops.local_info(p->b, blob, &len), 0);
	assert_int_equal(len, KVB_TCP_BLOB_LEN);
	assert_int_equal(kvb_tcp_ops.connect(p->a, blob, len, &p->ep), 0);
	assert_non_null(p->ep);
	ep_key(p->a, p->ep);
	tr_init(&p->tr, ncookies);
}

void pair_close(struct pair *p)
{
	if (p->a)
		kvb_tcp_ops.close(p->a);
	if (p->b)
		kvb_tcp_ops.close(p->b);
	tr_free(&p->tr);
}

/* Reap A's completions into the tracker; B must never complete anything. */
int reap(struct pair *p)
{
	struct kvb_xcqe c[128];
	int n, i, got = 0;

	do {
		n = kvb_tcp_ops.poll(p->a, c, 128);
		assert_true(n >= 0);
		for (i = 0; i < n; i++) {
			uint64_t k = c[i].cookie;

			assert_true(k < p->tr.n);
			assert_int_equal(p->tr.state[k], 1); /* exactly once */
			p->tr.state[k] = 2;
			p->tr.status[k] = c[i].status;
			p->tr.done++;
		}
		got += n;
	} while (n == 128);
	return got;
}

/* One round: A, B, then a short sleep on both wait fds if nothing moved. */
void pump(struct pair *p)
{
	struct kvb_xcqe c[8];
	struct pollfd pf[2];
	int n = 0;

	if (p->b) {
		assert_int_equal(kvb_tcp_ops.poll(p->b, c, 8), 0);
		pf[n].fd = kvb_tcp_ops.wait_fd(p->b);
		pf[n++].events = POLLIN;
	}
	if (reap(p))
		return;
	pf[n].fd = kvb_tcp_ops.wait_fd(p->a);
	pf[n++].events = POLLIN;
	poll(pf, (nfds_t) n, 2);
}

/* Post ops[0..n) (cookies must be fresh), pumping while out of credit. */
void post_all(struct pair *p, const struct kvb_xop *ops, unsigned n)
{
	double end = now_s() + DEADLINE;
	unsigned i = 0, j;

	while (i < n) {
		int rc = kvb_tcp_ops.post(p->a, p->ep, ops + i, n - i);

		assert_true(rc >= 0);
		for (j = i; j < i + (unsigned) rc; j++) {
			assert_int_equal(p->tr.state[ops[j].cookie], 0);
			p->tr.state[ops[j].cookie] = 1;
			p->tr.posted++;
		}
		i += (unsigned) rc;
		if (i < n) {
			pump(p);
			assert_true(now_s() < end);
		}
	}
}

void wait_all(struct pair *p)
{
	double end = now_s() + DEADLINE;

	while (p->tr.done < p->tr.posted) {
		pump(p);
		if (now_s() > end)
			fail_msg("%llu of %llu ops complete after %.0f s",
				 (unsigned long long) p->tr.done,
				 (unsigned long long) p->tr.posted, DEADLINE);
	}
}

struct kvb_xop xop(uint32_t code, struct region *l, uint64_t loff,
		   uint32_t region, uint64_t roff, uint64_t len,
		   uint64_t cookie)
{
	struct kvb_xop o;

	memset(&o, 0, sizeof(o));
	o.opcode = code;
	o.local = &l->mr;
	o.local_off = loff;
	o.remote.region = region;
	o.remote_off = roff;
	o.len = len;
	o.cookie = cookie;
	return o;
}

void reg(struct kvb_transport *t, struct region *r)
{
	assert_int_equal(kvb_tcp_ops.reg_mr(t, &r->mr), 0);
}

struct kvb_tcp_stats stats(struct kvb_transport *t)
{
	struct kvb_tcp_stats s;

	kvb_tcp_get_stats(t, &s);
	return s;
}

/* ---- transfers ---- */

/* n blocks of bs bytes, the remote side scattered by a permutation. */
void xfer_blocks(uint32_t code, unsigned n, uint64_t bs)
{
	struct pair p;
	struct region l, r;
	struct kvb_xop *ops = calloc(n, sizeof(*ops));
	unsigned *perm = calloc(n, sizeof(*perm));
	unsigned i;
	uint32_t rflag = code == KVB_XOP_WRITE ? KVB_MEM_REMOTE_WRITE
					       : KVB_MEM_REMOTE_READ;

	assert_non_null(ops);
	assert_non_null(perm);
	pair_open(&p, 0, 5000, n);
	region_init(&l, 1, n * bs, 0);
	region_init(&r, 7, n * bs, rflag);
	region_fill(code == KVB_XOP_WRITE ? &l : &r, n);
	reg(p.a, &l);
	reg(p.b, &r);
	for (i = 0; i < n; i++)
		perm[i] = i;
	for (i = n - 1; i > 0; i--) {
		unsigned j = (unsigned) rand() % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (i = 0; i < n; i++)
		ops[i] = xop(code, &l, i * bs, 7, perm[i] * bs, bs, i);
	post_all(&p, ops, n);
	wait_all(&p);
	for (i = 0; i < n; i++) {
		assert_int_equal(p.tr.status[i], 0);
		assert_memory_equal(l.mem + i * bs, r.mem + perm[i] * bs, bs);
	}
	assert_true(guards_ok(&l));
	assert_true(guards_ok(&r));
	assert_int_equal(p.a->stats.wrs, n);
	assert_int_equal(p.a->stats.cqes, n);
	assert_int_equal(p.a->stats.errors, 0);
	assert_true(p.a->stats.doorbells >= 1);
	assert_int_equal(stats(p.b).rejected, 0);
	pair_close(&p);
	region_free(&l);
	region_free(&r);
	free(ops);
	free(perm);
}

/* ---- authentication ---- */

void ep_key(struct kvb_transport *t, struct kvb_ep *ep)
{
	assert_int_equal(kvb_tcp_ep_set_key(t, ep, harness_key), 0);
}

int raw_read(struct pair *p, int fd, uint8_t *buf, size_t n)
{
	double end = now_s() + DEADLINE;
	size_t got = 0;

	while (got < n && now_s() < end) {
		ssize_t r;

		pump(p);
		r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN))
			return 0;
		if (r > 0)
			got += (size_t) r;
	}
	return got == n;
}

/* the MAC input of bridge/tcp/auth.c, built independently */
static void tmac(const uint8_t *key, char role, uint64_t id_d, uint64_t id_s,
		 const uint8_t *nd, const uint8_t *ns, uint8_t *mac)
{
	uint8_t t[1 + 16 + 8 + 8 + 64];

	t[0] = (uint8_t) role;
	memcpy(t + 1, "kvb-tcp-auth-v1", 16);
	kvb_put64(t + 17, id_d);
	kvb_put64(t + 25, id_s);
	memcpy(t + 33, nd, 32);
	memcpy(t + 65, ns, 32);
	crypto_auth(mac, t, sizeof(t), key);
}

void raw_auth(struct pair *p, int fd, uint64_t id, const uint8_t *key,
	      uint8_t hello[56], uint8_t proof[40])
{
	uint8_t h[56], c[72], pr[40], mac[32];
	uint64_t srv = kvb_tcp_id(p->b);

	kvb_tcp_auth_head(h, KVB_TCP_A_HELLO);
	kvb_put64(h + 8, id);
	kvb_put64(h + 16, srv);
	randombytes_buf(h + 24, 32);
	assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t) sizeof(h));
	assert_true(raw_read(p, fd, c, sizeof(c)));
	assert_int_equal(kvb_tcp_auth_head_check(c, KVB_TCP_A_CHALLENGE), 0);
	if (!memcmp(key, harness_key, 32)) {
		tmac(key, 'S', id, srv, h + 24, c + 8, mac);
		assert_memory_equal(mac, c + 40, 32);
	}
	kvb_tcp_auth_head(pr, KVB_TCP_A_PROOF);
	tmac(key, 'C', id, srv, h + 24, c + 8, pr + 8);
	assert_int_equal(send(fd, pr, sizeof(pr), 0), (ssize_t) sizeof(pr));
	if (hello)
		memcpy(hello, h, sizeof(h));
	if (proof)
		memcpy(proof, pr, sizeof(pr));
}

void fake_auth(struct pair *p, int fd, uint64_t srv_id)
{
	uint8_t h[56], c[72], pr[40], mac[32];
	uint64_t id;

	assert_true(raw_read(p, fd, h, sizeof(h)));
	assert_int_equal(kvb_tcp_auth_head_check(h, KVB_TCP_A_HELLO), 0);
	id = kvb_get64(h + 8);
	assert_int_equal(kvb_get64(h + 16), srv_id);
	kvb_tcp_auth_head(c, KVB_TCP_A_CHALLENGE);
	randombytes_buf(c + 8, 32);
	tmac(harness_key, 'S', id, srv_id, h + 24, c + 8, c + 40);
	assert_int_equal(send(fd, c, sizeof(c), 0), (ssize_t) sizeof(c));
	assert_true(raw_read(p, fd, pr, sizeof(pr)));
	assert_int_equal(kvb_tcp_auth_head_check(pr, KVB_TCP_A_PROOF), 0);
	tmac(harness_key, 'C', id, srv_id, h + 24, c + 8, mac);
	assert_memory_equal(mac, pr + 8, 32);
}

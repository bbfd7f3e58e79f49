// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the requesting side of the tcp transport (bridge/tcp/dial.c,
 * rx.c, wire.c), what the peer an endpoint dialed sends back. The harness
 * plays that peer: it listens on 127.0.0.1, connect()s a real transport to
 * it (params.qp_per_peer 1, 2 or 3: one to three connections, chosen by the
 * input), posts WRITE and READ ops, accepts the connections and reads the
 * request frames to learn their sequence numbers (a record may carry
 * several WRITEs whose remote ranges continue each other: its op and the
 * riders the transport's slots name). Then the input scripts the
 * answers, connection by connection: ACK and READ_RESP frames built from the
 * requests (right or wrong seqs, duplicates, any order, statuses, lengths,
 * payload sizes, trailers, corrupted header fields), raw bytes, a frame cut
 * short and the connection reset. Every connection is reset at the end.
 *
 * A model parses each connection's answer stream the way docs/tcp.md
 * describes and predicts every op's status: the status of the answer that
 * completed it, -EPROTO for the ops still open when a malformed answer came
 * (`rejected` +1 per such connection), -ECONNRESET when the harness reset
 * the connection first. Each op completes exactly once with that status; a
 * READ that succeeded holds the bytes answered for it; no other byte of the
 * local region or its guards changes (READs that failed may hold anything).
 *
 * Built with KVB_FUZZ_TCP_GPU (target tcp_dial_gpu, same corpus): the local
 * region is "device memory" of the host gpu backend with opaque pointers
 * (KVB_MEM_GPU), so WRITE payloads leave and READ answers land through the
 * transport's staging buffers; the predictions are the same.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_auth.h"
#ifdef KVB_FUZZ_TCP_GPU
#include "gpu/gpu_api.h"
#endif
#include "kvbroker/kvbroker.h"
#include "tcp/tcp_priv.h"

#define GUARD	    64u
#define LOCAL_LEN   4096u
#define DEPTH	    8u
#define MAX_OPS	    12u
#define MAX_STRIPES 3u
#define MAX_REQS    (MAX_STRIPES * DEPTH)
#define DEADLINE_NS (5ull * 1000000000ull)
#define STREAM_MAX  (64u << 10)

static struct kvb_transport *tr[MAX_STRIPES]; /* qp_per_peer i + 1 */
static struct kvb_mr mr[MAX_STRIPES];
static uint8_t blob[KVB_TCP_BLOB_LEN];
static int lfd = -1;
static uint8_t *arena, *before; /* guard | local region | guard */
#ifdef KVB_FUZZ_TCP_GPU
static char *dev_arena; /* the same in device memory */
#endif

struct op {
	struct kvb_xop x;
	int done;
	int32_t status; /* what poll() said */
	int32_t expect; /* what the model says */
	int ok_data;	/* READ: answered with status 0; bytes in `data` */
	uint8_t data[LOCAL_LEN];
};

/* A request as the harness read it. */
struct req {
	uint64_t seq;
	uint8_t type; /* KVB_TCP_F_WRITE / _READ_REQ */
	uint64_t len;
	int op; /* index in ops[] */
	/* WRITEs that rode in its record (remote range continued): ops[] */
	int riders[MAX_OPS];
	unsigned nriders;
	int open, answered;
};

struct conn {
	int fd;
	struct kvb_ep *ep; /* the stripe on the other end */
	uint8_t *in;	   /* requests received */
	size_t nin;
	struct req req[DEPTH];
	unsigned nreq;
	/* answers sent, for the model */
	uint8_t *out;
	size_t nout;
	int reset, done;
};

static struct op ops[MAX_OPS];
static struct kvb_xop xs[MAX_OPS];
static unsigned nops;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static void setup(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	size_t blen = sizeof(blob);
	char why[256] = "";
	unsigned i;

	arena = calloc(1, LOCAL_LEN + 2 * GUARD);
	before = calloc(1, LOCAL_LEN + 2 * GUARD);
	FUZZ_CHECK(arena && before);
#ifdef KVB_FUZZ_TCP_GPU
	{
		void *d = NULL;

		setenv("KVB_GPU_HOST_OPAQUE", "1", 1);
		FUZZ_CHECK(!kvb_gpu_backend_init("host", why, sizeof(why)));
		FUZZ_CHECK(!kvb_gpu_backend()->alloc(
			kvb_gpu_backend(), 0, LOCAL_LEN + 2 * GUARD, &d));
		dev_arena = d;
	}
#endif
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(lfd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	FUZZ_CHECK(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
	FUZZ_CHECK(listen(lfd, 64) == 0);
	FUZZ_CHECK(getsockname(lfd, (struct sockaddr *) &sa, &sl) == 0);
	FUZZ_CHECK(kvb_tcp_blob_make("127.0.0.1", ntohs(sa.sin_port), 1, blob,
				     &blen) == 0);
	for (i = 0; i < MAX_STRIPES; i++) {
		struct kvb_transport_params p = {
			.host_ip = "127.0.0.1",
			.qp_per_peer = (int) i + 1,
			.sq_depth = DEPTH,
			.timeout_ms = 30000,
		};

		if (kvb_tcp_ops.open(&p, &tr[i], why, sizeof(why))) {
			fprintf(stderr, "tcp transport: %s\n", why);
			abort();
		}
		mr[i].id = 1;
#ifdef KVB_FUZZ_TCP_GPU
		mr[i].kind = KVB_MEM_GPU;
		mr[i].addr = dev_arena + GUARD;
#else
		mr[i].kind = KVB_MEM_HOST;
		mr[i].addr = arena + GUARD;
#endif
		mr[i].len = LOCAL_LEN;
		FUZZ_CHECK(kvb_tcp_ops.reg_mr(tr[i], &mr[i]) == 0);
	}
}

/* GPU: the device arena from (to_dev) or to its host view; else no-op */
static void arena_sync(int to_dev)
{
#ifdef KVB_FUZZ_TCP_GPU
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	size_t n = LOCAL_LEN + 2 * GUARD;

	FUZZ_CHECK(!(to_dev ? g->memcpy(g, dev_arena, arena, n, KVB_GPU_H2D)
			    : g->memcpy(g, arena, dev_arena, n, KVB_GPU_D2H)));
#else
	(void) to_dev;
#endif
}

static void reap(struct kvb_transport *t)
{
	struct kvb_xcqe cqe[16];
	int n, i;

	n = kvb_tcp_ops.poll(t, cqe, 16);
	FUZZ_CHECK(n >= 0);
	for (i = 0; i < n; i++) {
		struct op *o;

		FUZZ_CHECK(cqe[i].cookie < nops);
		o = &ops[cqe[i].cookie];
		if (o->done)
			fprintf(stderr, "cookie %llu again: %d (was %d)\n",
				(unsigned long long) cqe[i].cookie,
				cqe[i].status, o->status);
		FUZZ_CHECK(!o->done);
		o->done = 1;
		o->status = cqe[i].status;
	}
}

static uint16_t port_of(int fd, int peer)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	int rc = peer ? getpeername(fd, (struct sockaddr *) &sa, &sl)
		      : getsockname(fd, (struct sockaddr *) &sa, &sl);

	FUZZ_CHECK(rc == 0);
	return ntohs(sa.sin_port);
}

/* What the ops of a record end with: its op's and its riders'. */
static void req_expect(const struct req *q, int32_t st)
{
	ops[q->op].expect = st;
	for (unsigned k = 0; k < q->nriders; k++)
		ops[q->riders[k]].expect = st;
}

/*
 * The harness is the server (blob id 1, the shared key): HELLO,
 * CHALLENGE, PROOF checked, while the transport runs.
 */
static void fake_auth(struct kvb_transport *t, int fd)
{
	uint8_t h[KVB_TCP_HELLO_LEN], c[KVB_TCP_CHAL_LEN], p[KVB_TCP_PROOF_LEN];
	uint8_t mac[KVB_TCP_MAC_LEN];
	uint64_t deadline = now_ns() + DEADLINE_NS, id;
	size_t got = 0;

	while (got < sizeof(h)) {
		ssize_t r = recv(fd, h + got, sizeof(h) - got, MSG_DONTWAIT);

		reap(t);
		if (r > 0)
			got += (size_t) r;
		FUZZ_CHECK(r != 0 && now_ns() < deadline);
	}
	FUZZ_CHECK(!kvb_tcp_auth_head_check(h, KVB_TCP_A_HELLO));
	id = kvb_get64(h + 8);
	FUZZ_CHECK(kvb_get64(h + 16) == 1);
	kvb_tcp_auth_head(c, KVB_TCP_A_CHALLENGE);
	randombytes_buf(c + 8, 32);
	fa_mac(kvb_tcp_tool_key, 'S', id, 1, h + 24, c + 8, c + 40);
	FUZZ_CHECK(send(fd, c, sizeof(c), MSG_NOSIGNAL) == sizeof(c));
	got = 0;
	while (got < sizeof(p)) {
		ssize_t r = recv(fd, p + got, sizeof(p) - got, MSG_DONTWAIT);

		reap(t);
		if (r > 0)
			got += (size_t) r;
		FUZZ_CHECK(r != 0 && now_ns() < deadline);
	}
	FUZZ_CHECK(!kvb_tcp_auth_head_check(p, KVB_TCP_A_PROOF));
	fa_mac(kvb_tcp_tool_key, 'C', id, 1, h + 24, c + 8, mac);
	FUZZ_CHECK(!memcmp(mac, p + 8, sizeof(mac)));
}

/* The requests of one connection, from the bytes received (all of them). */
static void parse_reqs(struct conn *c)
{
	size_t pos = 0;

	while (pos < c->nin) {
		struct kvb_tcp_hdr h;
		unsigned i;

		FUZZ_CHECK(c->nin - pos >= KVB_TCP_HDR_LEN);
		FUZZ_CHECK(kvb_tcp_hdr_decode(&h, c->in + pos) == 0);
		FUZZ_CHECK(h.type == KVB_TCP_F_WRITE ||
			   h.type == KVB_TCP_F_READ_REQ);
		pos += KVB_TCP_HDR_LEN;
		FUZZ_CHECK(c->nin - pos >= (size_t) h.count * KVB_TCP_REC_LEN);
		for (i = 0; i < h.count; i++) {
			struct req *q = &c->req[c->nreq];
			struct kvb_tcp_rec r;
			struct tcp_slot *s;

			FUZZ_CHECK(c->nreq < DEPTH);
			kvb_tcp_rec_decode(&r, c->in + pos);
			pos += KVB_TCP_REC_LEN;
			s = &c->ep->slots[(uint32_t) r.seq % DEPTH];
			FUZZ_CHECK(s->used && s->seq == r.seq &&
				   s->cookie < nops);
			q->seq = r.seq;
			q->type = h.type;
			q->len = r.len;
			q->op = (int) s->cookie;
			q->open = 1;
			q->nriders = 0;
			FUZZ_CHECK(s->lead == (uint32_t) r.seq % DEPTH &&
				   r.region == ops[q->op].x.remote.region &&
				   r.off == ops[q->op].x.remote_off &&
				   !r.status);
			/* WRITEs whose remote range continues it ride in the
			 * record: the record's length is theirs together */
			{
				uint64_t end = r.off + ops[q->op].x.len;
				uint32_t k = s->rider;

				while (k != TCP_NO_SLOT) {
					const struct tcp_slot *rs =
						&c->ep->slots[k];
					const struct kvb_xop *x;

					FUZZ_CHECK(rs->used &&
						   tcp_slot_rider(c->ep, k) &&
						   rs->cookie < nops &&
						   q->nriders < MAX_OPS);
					x = &ops[rs->cookie].x;
					FUZZ_CHECK(x->opcode == KVB_XOP_WRITE &&
						   x->remote.region ==
							   r.region &&
						   x->remote_off == end);
					end += x->len;
					q->riders[q->nriders++] =
						(int) rs->cookie;
					k = rs->rider;
				}
				FUZZ_CHECK(r.len == end - r.off);
			}
			FUZZ_CHECK((h.type == KVB_TCP_F_WRITE) ==
				   (ops[q->op].x.opcode == KVB_XOP_WRITE));
			c->nreq++;
		}
		if (h.type == KVB_TCP_F_READ_REQ) {
			FUZZ_CHECK(h.payload == 0);
			continue;
		}
		/* the payloads are the source bytes, in record order (a
		 * record's: its op's, then its riders') */
		for (i = c->nreq - h.count; i < c->nreq; i++) {
			const struct req *q = &c->req[i];

			for (unsigned k = 0; k <= q->nriders; k++) {
				const struct kvb_xop *x =
					&ops[k ? q->riders[k - 1] : q->op].x;

				FUZZ_CHECK(c->nin - pos >= x->len);
				FUZZ_CHECK(!memcmp(c->in + pos,
						   arena + GUARD + x->local_off,
						   x->len));
				pos += x->len;
			}
		}
	}
}

static void send_all(struct kvb_transport *t, struct conn *c, const void *buf,
		     size_t len)
{
	uint64_t deadline = now_ns() + DEADLINE_NS;
	size_t sent = 0;

	if (c->nout + len > STREAM_MAX)
		return; /* long enough: the model sees what was sent */
	memcpy(c->out + c->nout, buf, len);
	c->nout += len;
	while (sent < len) {
		ssize_t r = send(c->fd, (const uint8_t *) buf + sent,
				 len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r > 0) {
			sent += (size_t) r;
			continue;
		}
		if (r < 0 && errno != EAGAIN && errno != EINTR)
			return; /* the endpoint closed it: the model knows */
		reap(t);
		FUZZ_CHECK(now_ns() < deadline);
	}
}

static void conn_reset(struct conn *c)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};

	if (c->fd < 0)
		return;
	/* a reset, not a FIN: no TIME_WAIT on either side */
	setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(c->fd);
	c->fd = -1;
	c->reset = 1;
}

static uint8_t pay_byte(unsigned seed, unsigned op, uint64_t k)
{
	return (uint8_t) (seed * 31u + op * 101u + (unsigned) k * 7u + 1u);
}

static const int32_t statuses[] = {-ENOENT, -EACCES,   -EFAULT,
				   5,	    INT32_MIN, -EIO};

/* An answer frame built from the requests; fields corrupted by the input. */
static size_t build(struct conn *c, struct fuzz_in *in, uint8_t type,
		    uint8_t *f)
{
	unsigned count = 1 + (unsigned) fuzz_take(in, 1) % 4, i;
	uint8_t mu = (uint8_t) fuzz_take(in, 1);
	unsigned seed = (unsigned) fuzz_take(in, 1);
	struct kvb_tcp_hdr h = {.type = type, .count = (uint16_t) count};
	struct kvb_tcp_rec rec[4];
	int32_t trailer[4] = {0};
	size_t pos, tlen;
	uint64_t pay = 0;

	for (i = 0; i < count; i++) {
		unsigned s = (unsigned) fuzz_take(in, 1);
		const struct req *q = &c->req[s % c->nreq];

		memset(&rec[i], 0, sizeof(rec[i]));
		rec[i].seq = q->seq;
		if (s & 0x80)
			rec[i].status = statuses[(s >> 4) % 6];
		if (type == KVB_TCP_F_READ_RESP && !rec[i].status)
			rec[i].len = q->len;
		pay += rec[i].len;
	}
	/* one corruption, picked by the high bits of mu */
	switch (mu >> 4) {
	case 1:
		rec[mu % count].seq += (mu & 8 ? -1ull : 1ull) << 32;
		break;
	case 2:
		rec[mu % count].seq ^= 1u << (mu & 3);
		break;
	case 3:
		rec[mu % count].region = 1;
		break;
	case 4:
		rec[mu % count].off = 1;
		break;
	case 5:
		rec[mu % count].len += 1;
		pay += 1;
		break;
	case 6:
		pay += 1;
		break;
	case 7:
		trailer[mu % count] = (mu & 8) ? 1 : -ENOENT;
		break;
	case 8:
		h.type = (uint8_t) (mu & 7);
		break;
	case 9:
		h.count = (mu & 8) ? 0 : (uint16_t) (count + 1);
		break;
	case 10:
		trailer[mu % count] = -EIO;
		break;
	default:
		break;
	}
	h.payload = pay;
	kvb_tcp_hdr_encode(&h, f);
	if (mu >> 4 == 11)
		f[mu & 15] ^= 0x40; /* magic, version, type, count, reserved */
	pos = KVB_TCP_HDR_LEN;
	for (i = 0; i < count; i++, pos += KVB_TCP_REC_LEN)
		kvb_tcp_rec_encode(&rec[i], f + pos);
	if (type != KVB_TCP_F_READ_RESP)
		return pos;
	for (i = 0; i < count; i++) {
		unsigned k = 0, op = 0;

		for (k = 0; k < c->nreq; k++)
			if (c->req[k].seq == rec[i].seq)
				op = (unsigned) c->req[k].op;
		for (k = 0; k < rec[i].len && pos < STREAM_MAX / 2; k++)
			f[pos++] = pay_byte(seed, op, k);
	}
	tlen = kvb_tcp_trailer_len(count);
	memset(f + pos, 0, tlen);
	for (i = 0; i < count; i++)
		kvb_tcp_status_put(f + pos + 4 * i, trailer[i]);
	return pos + tlen;
}

static uint64_t le(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;

	while (n--)
		v = v << 8 | p[n];
	return v;
}

/*
 * docs/tcp.md on the answers the connection carried: the status of every
 * op answered, the data of every READ answered with status 0, the end of
 * the connection for the others. Returns 1 if a malformed answer ends it.
 */
static int model(struct conn *c)
{
	const uint8_t *s = c->out;
	size_t n = c->nout, pos = 0;

	for (;;) {
		uint8_t type;
		unsigned count, i;
		uint64_t payload, total = 0;
		const uint8_t *recs;
		int idx[KVB_TCP_MAX_RECS];

		if (n - pos < KVB_TCP_HDR_LEN)
			return 0;
		type = s[pos + 5];
		count = (unsigned) le(s + pos + 6, 2);
		payload = le(s + pos + 16, 8);
		if (le(s + pos, 4) != KVB_TCP_FRAME_MAGIC || s[pos + 4] != 1 ||
		    le(s + pos + 8, 8) || !count || count > KVB_TCP_MAX_RECS ||
		    (type != KVB_TCP_F_ACK && type != KVB_TCP_F_READ_RESP) ||
		    (type == KVB_TCP_F_ACK && payload))
			return 1;
		pos += KVB_TCP_HDR_LEN;
		if (n - pos < (size_t) count * KVB_TCP_REC_LEN)
			return 0;
		recs = s + pos;
		pos += (size_t) count * KVB_TCP_REC_LEN;
		for (i = 0; i < count; i++) {
			const uint8_t *r = recs + i * KVB_TCP_REC_LEN;
			uint64_t seq = le(r, 8), len = le(r + 24, 8);
			int32_t st = (int32_t) le(r + 12, 4);
			struct req *q = NULL;
			unsigned k;

			for (k = 0; k < c->nreq; k++)
				if (c->req[k].seq == seq && c->req[k].open)
					q = &c->req[k];
			if (!q || q->answered || le(r + 8, 4) ||
			    le(r + 16, 8) || st > 0 ||
			    q->type != (type == KVB_TCP_F_ACK
						? KVB_TCP_F_WRITE
						: KVB_TCP_F_READ_REQ) ||
			    len != (type == KVB_TCP_F_ACK || st ? 0 : q->len))
				return 1;
			q->answered = 1;
			idx[i] = (int) (q - c->req);
			total += len;
		}
		if (total != payload)
			return 1;
		if (type == KVB_TCP_F_READ_RESP) {
			size_t tpos = pos + payload;

			if (n - pos < payload + kvb_tcp_trailer_len(count))
				return 0; /* cut short: the reset ends it */
			for (i = 0; i < count; i++) {
				const uint8_t *r = recs + i * KVB_TCP_REC_LEN;
				struct req *q = &c->req[idx[i]];
				struct op *o = &ops[q->op];
				int32_t st = (int32_t) le(r + 12, 4);

				if (!st) {
					memcpy(o->data, s + pos, q->len);
					pos += q->len;
					st = (int32_t) le(s + tpos + 4 * i, 4);
					/* a status is 0 or -errno */
					if (st > 0)
						return 1;
					o->ok_data = !st;
				}
				o->expect = st;
			}
			pos += kvb_tcp_trailer_len(count);
		} else {
			for (i = 0; i < count; i++)
				req_expect(
					&c->req[idx[i]],
					(int32_t) le(
						recs + i * KVB_TCP_REC_LEN + 12,
						4));
		}
		for (i = 0; i < count; i++)
			c->req[idx[i]].open = 0;
	}
}

/*
 * One round on the group `lead`: post, read the requests, answer, reset
 * every connection, check. The endpoints dial again in the next round
 * (slots reused, a new generation in their seqs).
 */
static void run_round(struct kvb_transport *t, struct kvb_ep *lead,
		      unsigned nst, struct fuzz_in *in, uint8_t *frame)
{
	struct conn conns[MAX_STRIPES];
	struct kvb_tcp_stats st0, st;
	unsigned nconn = 0, want = 0, i, k, nchains;
	unsigned cursor = (unsigned) fuzz_take(in, 1) % 64;
	uint64_t deadline, rejected = 0;
	struct kvb_ep *s;
	int done;

	for (i = 0; i < LOCAL_LEN + 2 * GUARD; i++)
		arena[i] = (uint8_t) (i * 13 + cursor);
	memcpy(before, arena, LOCAL_LEN + 2 * GUARD);
	arena_sync(1);
	memset(conns, 0, sizeof(conns));
	kvb_tcp_get_stats(t, &st0);

	/* 1..3 chains of 1..4 ops over disjoint local ranges */
	nops = 0;
	nchains = 1 + (unsigned) fuzz_take(in, 1) % 3;
	for (k = 0; k < nchains; k++) {
		unsigned n = 1 + (unsigned) fuzz_take(in, 1) % 4, first = nops;
		int rc;

		for (i = 0; i < n; i++) {
			struct op *o = &ops[nops];
			unsigned code = (unsigned) fuzz_take(in, 1);
			uint64_t len = fuzz_take(in, 1) * 3 % 600;

			if (cursor > LOCAL_LEN)
				cursor = LOCAL_LEN;
			if (cursor + len > LOCAL_LEN)
				len = LOCAL_LEN - cursor;
			memset(o, 0, offsetof(struct op, data));
			o->x.opcode = code & 1 ? KVB_XOP_READ : KVB_XOP_WRITE;
			o->x.local = &mr[nst - 1];
			o->x.local_off = cursor;
			o->x.len = len;
			o->x.remote.region = (code >> 1) & 7;
			o->x.remote_off = code >> 4;
			o->x.cookie = nops++;
			cursor += (unsigned) len + (code >> 6);
		}
		for (i = first; i < nops; i++)
			xs[i] = ops[i].x; /* post() takes an array of kvb_xop */
		rc = kvb_tcp_ops.post(t, lead, &xs[first], n);
		FUZZ_CHECK(rc >= 0 && (unsigned) rc <= n);
		/* what post() did not take was never posted */
		nops = first + (unsigned) rc;
	}
	for (s = lead; s; s = s->stripe)
		want += s->used > 0;

	/* accept and read every request */
	deadline = now_ns() + DEADLINE_NS;
	for (;;) {
		int fd = accept(lfd, NULL, NULL);

		reap(t);
		if (fd >= 0) {
			struct conn *c = &conns[nconn++];
			uint16_t port = port_of(fd, 1);
			int one = 1;

			/* answers go out as sent, as a real server's
			 * (TCP_NODELAY): not held until the dialer's delayed
			 * ACK of the one before (past the reset below) */
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
				   sizeof(one));
			fake_auth(t, fd);
			FUZZ_CHECK(nconn <= want);
			c->fd = fd;
			c->in = malloc(STREAM_MAX);
			c->out = malloc(STREAM_MAX);
			FUZZ_CHECK(c->in && c->out);
			for (s = lead; s; s = s->stripe)
				if (s->fd >= 0 && port_of(s->fd, 0) == port)
					c->ep = s;
			FUZZ_CHECK(c->ep);
		}
		done = nconn == want;
		for (i = 0; i < nconn; i++) {
			struct conn *c = &conns[i];
			ssize_t r = recv(c->fd, c->in + c->nin,
					 STREAM_MAX - c->nin, MSG_DONTWAIT);

			if (r > 0)
				c->nin += (size_t) r;
			if (c->ep->state != EP_CONNECTED || c->ep->tx.n ||
			    c->nin != c->ep->tx.queued)
				done = 0;
		}
		if (done)
			break;
		FUZZ_CHECK(now_ns() < deadline);
	}
	for (i = 0; i < nconn; i++) {
		FUZZ_CHECK(!conns[i].ep->tx.n);
		parse_reqs(&conns[i]);
	}
	for (i = 0; i < nops; i++)
		FUZZ_CHECK(!ops[i].done);

	/* the answers */
	while (nconn && in->left) {
		struct conn *c = &conns[fuzz_take(in, 1) % nconn];
		unsigned a = (unsigned) fuzz_take(in, 1);
		size_t len;

		if (a == 0xff)
			break; /* on to the next round */
		if (c->reset)
			continue;
		switch (a & 3) {
		case 0:
		case 1:
			len = build(c, in,
				    a & 1 ? KVB_TCP_F_READ_RESP : KVB_TCP_F_ACK,
				    frame);
			send_all(t, c, frame, len);
			break;
		case 2: /* raw bytes */
			len = (a >> 2) % 40;
			for (i = 0; i < len; i++)
				frame[i] = (uint8_t) fuzz_take(in, 1);
			send_all(t, c, frame, len);
			break;
		case 3: /* a frame cut short, and the reset */
			len = build(c, in,
				    a & 4 ? KVB_TCP_F_READ_RESP : KVB_TCP_F_ACK,
				    frame);
			send_all(t, c, frame, fuzz_take(in, 2) % (len + 1));
			conn_reset(c);
			break;
		}
		reap(t);
	}

	/* the model's verdict, then reset every connection and wait */
	for (i = 0; i < nops; i++)
		ops[i].expect = 1; /* not answered */
	for (i = 0; i < nconn; i++) {
		struct conn *c = &conns[i];
		int bad = model(c);

		rejected += (uint64_t) bad;
		for (k = 0; k < c->nreq; k++)
			if (c->req[k].open)
				req_expect(&c->req[k],
					   bad ? -EPROTO : -ECONNRESET);
		conn_reset(c);
	}
	deadline = now_ns() + DEADLINE_NS;
	for (;;) {
		reap(t);
		for (i = 0; i < nops && ops[i].done; i++)
			;
		if (i == nops)
			break;
		if (now_ns() > deadline) {
			fprintf(stderr, "op %u never completed\n", i);
			abort();
		}
	}
	for (i = 0; i < nops; i++) {
		if (ops[i].status == ops[i].expect)
			continue;
		fprintf(stderr,
			"op %u (%s, len %llu): status %d, expected %d\n", i,
			ops[i].x.opcode == KVB_XOP_READ ? "READ" : "WRITE",
			(unsigned long long) ops[i].x.len, ops[i].status,
			ops[i].expect);
		abort();
	}
	kvb_tcp_get_stats(t, &st);
	FUZZ_CHECK(st.rejected - st0.rejected == rejected);

	/* READ data landed where asked and nowhere else */
	arena_sync(0);
	for (i = 0; i < nops; i++) {
		const struct op *o = &ops[i];
		uint8_t *p = arena + GUARD + o->x.local_off;

		if (o->x.opcode != KVB_XOP_READ)
			continue;
		if (o->ok_data && !o->status)
			FUZZ_CHECK(!memcmp(p, o->data, o->x.len));
		memcpy(p, before + GUARD + o->x.local_off, o->x.len);
	}
	FUZZ_CHECK(!memcmp(arena, before, LOCAL_LEN + 2 * GUARD));

	/* every stripe that dialed saw its reset: idle before the next round */
	for (s = lead; s; s = s->stripe)
		while (s->fd >= 0) {
			reap(t);
			FUZZ_CHECK(now_ns() < deadline);
		}
	for (i = 0; i < nconn; i++) {
		free(conns[i].in);
		free(conns[i].out);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {.p = data, .left = size};
	struct kvb_tcp_stats st;
	struct kvb_transport *t;
	struct kvb_ep *lead;
	unsigned nst, rounds;
	uint8_t *frame;

	if (!tr[0])
		setup();
	nst = (unsigned) fuzz_take(&in, 1);
	rounds = 1 + (nst >> 7);
	nst = 1 + nst % MAX_STRIPES;
	t = tr[nst - 1];
	frame = malloc(STREAM_MAX);
	FUZZ_CHECK(frame);
	FUZZ_CHECK(kvb_tcp_ops.connect(t, blob, sizeof(blob), &lead) == 0);
	FUZZ_CHECK(kvb_tcp_ep_set_key(t, lead, kvb_tcp_tool_key) == 0);
	while (rounds--)
		run_round(t, lead, nst, &in, frame);
	kvb_tcp_ops.disconnect(t, lead);
	reap(t);
	kvb_tcp_get_stats(t, &st);
	FUZZ_CHECK(st.eps_open == 0);
	free(frame);
	return 0;
}

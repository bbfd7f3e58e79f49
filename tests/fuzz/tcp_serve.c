// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the served side of the tcp transport (bridge/tcp/serve.c,
 * rx.c, tx.c, wire.c), what a remote peer's connection delivers. The input
 * is the byte stream a peer sends: it goes through a real loopback TCP
 * connection to a real transport with five registered regions (write-only,
 * read-only, read-write, empty, no access), and the answers are read back.
 *
 * A model next to it parses the same bytes the way docs/tcp.md describes and
 * predicts everything observable: whether the connection is dropped as
 * malformed (`rejected` counted once), the ACKs (seq and status of every
 * WRITE record whose payload arrived), the READ_RESP frames (records,
 * statuses, payload bytes of the read-only region, zero trailer), and every
 * byte of the region arena afterwards, guards included: no byte lands where
 * no granted record put it. When the connection is dropped, answers still
 * queued may be lost: then what arrived must be a prefix of the prediction.
 *
 * Built with KVB_FUZZ_TCP_GPU (target tcp_serve_gpu, same corpus): the
 * arena is "device memory" of the host gpu backend with opaque pointers and
 * the regions are KVB_MEM_GPU, so every byte goes through the transport's
 * staging buffers; a WRITE's bytes then land only once its payload is
 * complete (the regions are far smaller than a staging buffer), which the
 * model says too.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_auth.h"
#ifdef KVB_FUZZ_TCP_GPU
#include "gpu/gpu_api.h"
#define FUZZ_GPU 1
#else
#define FUZZ_GPU 0
#endif
#include "kvbroker/kvbroker.h"
#include "tcp/tcp.h"
#include "tcp/wire.h"

#define GUARD	    64u
#define NREG	    5
#define DEADLINE_NS (10ull * 1000000000ull)
#define RW	    (KVB_MEM_REMOTE_WRITE | KVB_MEM_REMOTE_READ)

static const struct {
	uint32_t id, flags, len;
} layout[NREG] = {
	{1, KVB_MEM_REMOTE_WRITE, 64},
	{2, KVB_MEM_REMOTE_READ, 100},
	{3, RW, 4096},
	{5, RW, 0},
	{7, 0, 16},
};

static struct kvb_transport *srv;
static uint16_t srv_port;
static struct kvb_mr mrs[NREG];
static size_t reg_off[NREG];   /* in the arena */
static uint8_t *arena, *model; /* arena: the host view (GPU: a copy) */
static char *dev_arena;	       /* GPU: the regions' device memory */
static size_t arena_len;

/* What the model expects to see. */
struct exp_rec {
	uint64_t seq;
	int32_t status;
	uint64_t len;
	const uint8_t *src; /* READ of the read-only region: its bytes */
};

struct expect {
	struct exp_rec *acks;
	unsigned nacks;
	struct exp_rec *reads; /* records of every READ_RESP, in order */
	unsigned nreads;
	unsigned *frame_first; /* READ_RESP i: reads[frame_first[i]..] */
	unsigned *frame_count;
	unsigned nframes;
	int rejected;
};

/* What came back. */
struct got {
	uint8_t *buf;
	size_t len, cap, parsed;
	unsigned acks, reads, frames;
	int closed;
};

static void srv_poll(void);

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static void setup(void)
{
	struct kvb_transport_params p = {.host_ip = "127.0.0.1", .tcp_port = 0};
	char why[256] = "";
	size_t off = GUARD;
	int i;

	for (i = 0; i < NREG; i++) {
		reg_off[i] = off;
		off += layout[i].len + GUARD;
	}
	arena_len = off;
	arena = malloc(arena_len);
	model = malloc(arena_len);
	FUZZ_CHECK(arena && model);
#ifdef KVB_FUZZ_TCP_GPU
	{
		void *d = NULL;

		setenv("KVB_GPU_HOST_OPAQUE", "1", 1);
		FUZZ_CHECK(!kvb_gpu_backend_init("host", why, sizeof(why)));
		FUZZ_CHECK(!kvb_gpu_backend()->alloc(kvb_gpu_backend(), 0,
						     arena_len, &d));
		dev_arena = d;
	}
#endif
	if (kvb_tcp_ops.open(&p, &srv, why, sizeof(why))) {
		fprintf(stderr, "tcp transport: %s\n", why);
		abort();
	}
	srv_port = (uint16_t) kvb_tcp_port(srv);
	/* peers proving the shared key; an unfinished HELLO / PROOF waits
	 * 300 ms, not the broker's 2 s */
	FUZZ_CHECK(kvb_tcp_peer_allow(srv, 0, kvb_tcp_tool_key, NULL, -1) == 0);
	kvb_tcp_set_limits(srv, 0, 0, 300);
	for (i = 0; i < NREG; i++) {
		mrs[i].id = layout[i].id;
		mrs[i].flags = layout[i].flags;
		mrs[i].kind = FUZZ_GPU ? KVB_MEM_GPU : KVB_MEM_HOST;
		mrs[i].addr =
			(FUZZ_GPU ? dev_arena : (char *) arena) + reg_off[i];
		mrs[i].len = layout[i].len;
		FUZZ_CHECK(kvb_tcp_ops.reg_mr(srv, &mrs[i]) == 0);
	}
}

/* check_region() of serve.c, from the documentation's point of view */
static int32_t model_check(const struct kvb_tcp_rec *r, uint32_t flag, int *idx)
{
	int i;

	for (i = 0; i < NREG; i++)
		if (layout[i].id == r->region)
			break;
	if (i == NREG)
		return -ENOENT;
	if (!(layout[i].flags & flag))
		return -EACCES;
	if (r->off > layout[i].len || r->len > layout[i].len - r->off)
		return -EFAULT;
	*idx = i;
	return 0;
}

static void model_run(const uint8_t *s, size_t n, struct expect *e)
{
	struct kvb_tcp_rec rec[KVB_TCP_MAX_RECS];
	size_t pos = 0;
	uint8_t enc[KVB_TCP_HDR_LEN];

	for (;;) {
		struct kvb_tcp_hdr h;
		uint64_t total = 0;
		unsigned i;

		if (n - pos < KVB_TCP_HDR_LEN)
			return; /* the server waits for the rest */
		if (kvb_tcp_hdr_decode(&h, s + pos) ||
		    (h.type != KVB_TCP_F_WRITE &&
		     h.type != KVB_TCP_F_READ_REQ) ||
		    (h.type == KVB_TCP_F_READ_REQ && h.payload)) {
			e->rejected = 1;
			return;
		}
		/* every field is checked: encoding gives the same bytes */
		kvb_tcp_hdr_encode(&h, enc);
		FUZZ_CHECK(!memcmp(enc, s + pos, KVB_TCP_HDR_LEN));
		pos += KVB_TCP_HDR_LEN;
		if (n - pos < (size_t) h.count * KVB_TCP_REC_LEN)
			return;
		for (i = 0; i < h.count; i++) {
			kvb_tcp_rec_decode(&rec[i], s + pos);
			pos += KVB_TCP_REC_LEN;
			if (rec[i].status || rec[i].len > KVB_TCP_MAX_OP) {
				e->rejected = 1;
				return;
			}
			total += rec[i].len;
		}
		if (h.type == KVB_TCP_F_READ_REQ) {
			e->frame_first[e->nframes] = e->nreads;
			e->frame_count[e->nframes++] = h.count;
			for (i = 0; i < h.count; i++) {
				struct exp_rec *x = &e->reads[e->nreads++];
				int k = -1;

				x->seq = rec[i].seq;
				x->status = model_check(
					&rec[i], KVB_MEM_REMOTE_READ, &k);
				x->len = x->status ? 0 : rec[i].len;
				/* only the read-only region's bytes are
				 * certain when the READ_RESP leaves */
				x->src = !x->status && layout[k].id == 2
						 ? model + reg_off[k] +
							   rec[i].off
						 : NULL;
			}
			continue;
		}
		if (total != h.payload) {
			e->rejected = 1;
			return;
		}
		for (i = 0; i < h.count; i++) {
			int k = -1;
			int32_t st =
				model_check(&rec[i], KVB_MEM_REMOTE_WRITE, &k);
			uint64_t avail = n - pos;

			if (avail > rec[i].len)
				avail = rec[i].len;
			/* GPU: staged, copied in once the item is whole */
			if (!st && (!FUZZ_GPU || avail == rec[i].len))
				memcpy(model + reg_off[k] + rec[i].off, s + pos,
				       avail);
			pos += avail;
			if (avail < rec[i].len)
				return;
			e->acks[e->nacks].seq = rec[i].seq;
			e->acks[e->nacks++].status = st;
		}
	}
}

/* Check the complete frames received so far against the prediction. */
static void parse(struct got *g, const struct expect *e)
{
	for (;;) {
		const uint8_t *p = g->buf + g->parsed;
		size_t avail = g->len - g->parsed, need;
		struct kvb_tcp_hdr h;
		struct kvb_tcp_rec r;
		uint64_t pay = 0;
		unsigned i;

		if (avail < KVB_TCP_HDR_LEN)
			return;
		FUZZ_CHECK(kvb_tcp_hdr_decode(&h, p) == 0);
		FUZZ_CHECK(h.type == KVB_TCP_F_ACK ||
			   h.type == KVB_TCP_F_READ_RESP);
		need = KVB_TCP_HDR_LEN + (size_t) h.count * KVB_TCP_REC_LEN;
		if (h.type == KVB_TCP_F_ACK)
			FUZZ_CHECK(h.payload == 0);
		else
			need += h.payload + kvb_tcp_trailer_len(h.count);
		if (avail < need)
			return;
		p += KVB_TCP_HDR_LEN;
		if (h.type == KVB_TCP_F_ACK) {
			for (i = 0; i < h.count; i++, p += KVB_TCP_REC_LEN) {
				const struct exp_rec *x = &e->acks[g->acks++];

				FUZZ_CHECK(g->acks <= e->nacks);
				kvb_tcp_rec_decode(&r, p);
				FUZZ_CHECK(r.seq == x->seq &&
					   r.status == x->status && !r.region &&
					   !r.off && !r.len);
			}
			g->parsed += need;
			continue;
		}
		FUZZ_CHECK(g->frames < e->nframes);
		FUZZ_CHECK(h.count == e->frame_count[g->frames]);
		{
			const struct exp_rec *x =
				&e->reads[e->frame_first[g->frames++]];
			const uint8_t *data = p + h.count * KVB_TCP_REC_LEN;

			for (i = 0; i < h.count; i++, p += KVB_TCP_REC_LEN) {
				kvb_tcp_rec_decode(&r, p);
				FUZZ_CHECK(r.seq == x[i].seq &&
					   r.status == x[i].status &&
					   r.len == x[i].len && !r.region &&
					   !r.off);
				if (x[i].src)
					FUZZ_CHECK(!memcmp(data + pay, x[i].src,
							   r.len));
				pay += r.len;
			}
			FUZZ_CHECK(pay == h.payload);
			for (i = 0; i < h.count; i++)
				FUZZ_CHECK(kvb_tcp_status_get(data + pay +
							      4 * i) == 0);
			g->reads += h.count;
		}
		g->parsed += need;
	}
}

static void drain(int fd, struct got *g)
{
	for (;;) {
		ssize_t r;

		if (g->cap - g->len < 65536) {
			g->cap = g->cap ? g->cap * 2 : 131072;
			g->buf = realloc(g->buf, g->cap);
			FUZZ_CHECK(g->buf);
		}
		r = recv(fd, g->buf + g->len, g->cap - g->len, MSG_DONTWAIT);
		if (r > 0) {
			g->len += (size_t) r;
			continue;
		}
		if (r == 0 || (errno != EAGAIN && errno != EINTR))
			g->closed = 1;
		return;
	}
}

enum { KVB_GPU_TO_DEV, KVB_GPU_TO_HOST };

/* GPU: the device arena from / to its host view (no-op for host memory) */
static void arena_sync(int dir)
{
#ifdef KVB_FUZZ_TCP_GPU
	const struct kvb_gpu_api *g = kvb_gpu_backend();

	FUZZ_CHECK(!(
		dir == KVB_GPU_TO_DEV
			? g->memcpy(g, dev_arena, arena, arena_len, KVB_GPU_H2D)
			: g->memcpy(g, arena, dev_arena, arena_len,
				    KVB_GPU_D2H)));
#else
	(void) dir;
#endif
}

/* Read exactly n bytes from fd, serving meanwhile; 0 on EOF/deadline. */
static int read_n(int fd, uint8_t *buf, size_t n, uint64_t deadline)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r;

		srv_poll();
		r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			return 0;
		if (r > 0)
			got += (size_t) r;
		if (now_ns() > deadline)
			return 0;
	}
	return 1;
}

/* The harness authenticates as a peer (any id, the shared key). */
static void auth(int fd, uint64_t deadline)
{
	uint8_t h[KVB_TCP_HELLO_LEN], c[KVB_TCP_CHAL_LEN], p[KVB_TCP_PROOF_LEN];

	kvb_tcp_auth_head(h, KVB_TCP_A_HELLO);
	kvb_put64(h + 8, 0x66757a7a);
	kvb_put64(h + 16, kvb_tcp_id(srv));
	randombytes_buf(h + 24, 32);
	FUZZ_CHECK(send(fd, h, sizeof(h), MSG_NOSIGNAL) == sizeof(h));
	FUZZ_CHECK(read_n(fd, c, sizeof(c), deadline));
	FUZZ_CHECK(!kvb_tcp_auth_head_check(c, KVB_TCP_A_CHALLENGE));
	kvb_tcp_auth_head(p, KVB_TCP_A_PROOF);
	fa_mac(kvb_tcp_tool_key, 'C', 0x66757a7a, kvb_tcp_id(srv), h + 24,
	       c + 8, p + 8);
	FUZZ_CHECK(send(fd, p, sizeof(p), MSG_NOSIGNAL) == sizeof(p));
}

/*
 * An input that starts with the auth magic ("TVKA") goes as it is, with no
 * authentication of the harness's: the server's HELLO / PROOF parser. No
 * PROOF can be right (the server's nonce is fresh), so whatever it holds:
 * the connection ends refused (auth_failed: also for the EOF the harness
 * sends behind the input) or at the deadline (auth_timeout), no frame is
 * read, nothing but at most one CHALLENGE comes
 * back, not a byte of the regions changes.
 */
static void raw_auth_input(const uint8_t *data, size_t size)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct kvb_tcp_stats st0, st;
	uint8_t buf[256];
	size_t sent = 0, got = 0;
	uint64_t deadline = now_ns() + DEADLINE_NS;
	int fd, closed = 0;

	kvb_tcp_get_stats(srv, &st0);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	sa.sin_port = htons(srv_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	FUZZ_CHECK(connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
	while (!closed) {
		ssize_t r;

		if (sent < size) {
			r = send(fd, data + sent, size - sent,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (r > 0)
				sent += (size_t) r;
			else if (r < 0 && errno != EAGAIN && errno != EINTR)
				sent = size;
			/* all sent: EOF behind it, no wait for the deadline */
			if (sent == size)
				shutdown(fd, SHUT_WR);
		}
		srv_poll();
		r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r > 0)
			got += (size_t) r;
		else if (r == 0 || (errno != EAGAIN && errno != EINTR))
			closed = 1;
		FUZZ_CHECK(now_ns() < deadline);
	}
	close(fd);
	do {
		srv_poll();
		kvb_tcp_get_stats(srv, &st);
		FUZZ_CHECK(now_ns() < deadline);
	} while (st.conns_open);
	FUZZ_CHECK(got == 0 || got == KVB_TCP_CHAL_LEN);
	FUZZ_CHECK(st.frames_rx == st0.frames_rx);
	FUZZ_CHECK(st.auth_ok == st0.auth_ok);
	FUZZ_CHECK(st.rejected == st0.rejected);
	FUZZ_CHECK(st.refused_auth_failed + st.refused_auth_timeout ==
		   st0.refused_auth_failed + st0.refused_auth_timeout + 1);
	arena_sync(KVB_GPU_TO_HOST);
	FUZZ_CHECK(!memcmp(arena, model, arena_len));
}

static void srv_poll(void)
{
	struct kvb_xcqe cqe[8];

	/* the served side never completes anything of its own */
	FUZZ_CHECK(kvb_tcp_ops.poll(srv, cqe, 8) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t nrec = size / KVB_TCP_REC_LEN + 1, sent = 0, i;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct kvb_tcp_stats st0, st;
	struct expect e = {0};
	struct got g = {0};
	uint64_t deadline;
	int fd, one = 1;

	if (!srv)
		setup();
	for (i = 0; i < arena_len; i++)
		arena[i] = (uint8_t) (i * 7 + 3);
	memcpy(model, arena, arena_len);
	arena_sync(KVB_GPU_TO_DEV);
	if (size >= 4 && !memcmp(data, "TVKA", 4)) {
		raw_auth_input(data, size);
		return 0;
	}
	e.acks = calloc(nrec, sizeof(*e.acks));
	e.reads = calloc(nrec, sizeof(*e.reads));
	e.frame_first = calloc(nrec, sizeof(unsigned));
	e.frame_count = calloc(nrec, sizeof(unsigned));
	FUZZ_CHECK(e.acks && e.reads && e.frame_first && e.frame_count);
	model_run(data, size, &e);

	kvb_tcp_get_stats(srv, &st0);
	FUZZ_CHECK(st0.conns_open == 0);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(fd >= 0);
	/* close() sends a RST: no TIME_WAIT, the ephemeral ports last */
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	/* the input right behind the PROOF, not after a delayed ACK */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	sa.sin_port = htons(srv_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	FUZZ_CHECK(connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);

	deadline = now_ns() + DEADLINE_NS;
	auth(fd, deadline);
	/* the auth messages are received bytes too */
	st0.bytes_rx += KVB_TCP_HELLO_LEN + KVB_TCP_PROOF_LEN;
	for (;;) {
		if (sent < size) {
			ssize_t r = send(fd, data + sent, size - sent,
					 MSG_NOSIGNAL | MSG_DONTWAIT);

			if (r > 0)
				sent += (size_t) r;
			else if (r < 0 && errno != EAGAIN && errno != EINTR)
				sent = size; /* dropped by the server */
		}
		srv_poll();
		drain(fd, &g);
		parse(&g, &e);
		kvb_tcp_get_stats(srv, &st);
		if (e.rejected) {
			if (st.conns_open == 0 && g.closed)
				break;
		} else if (sent == size && st.bytes_rx - st0.bytes_rx == size &&
			   g.acks == e.nacks && g.reads == e.nreads) {
			break;
		}
		if (now_ns() > deadline) {
			fprintf(stderr,
				"no answer: rejected %d acks %u/%u reads "
				"%u/%u rx %llu/%zu conns %llu\n",
				e.rejected, g.acks, e.nacks, g.reads, e.nreads,
				(unsigned long long) (st.bytes_rx -
						      st0.bytes_rx),
				size, (unsigned long long) st.conns_open);
			abort();
		}
	}
	if (!e.rejected) {
		/* everything answered: nothing half-sent left over */
		FUZZ_CHECK(g.parsed == g.len && !g.closed);
		close(fd);
		while (st.conns_open) {
			srv_poll();
			kvb_tcp_get_stats(srv, &st);
			FUZZ_CHECK(now_ns() < deadline);
		}
	} else {
		close(fd);
	}
	FUZZ_CHECK(st.rejected - st0.rejected == (uint64_t) e.rejected);
	FUZZ_CHECK(st.conn_accepted - st0.conn_accepted == 1);
	arena_sync(KVB_GPU_TO_HOST);
	FUZZ_CHECK(!memcmp(arena, model, arena_len));
	free(g.buf);
	free(e.acks);
	free(e.reads);
	free(e.frame_first);
	free(e.frame_count);
	return 0;
}

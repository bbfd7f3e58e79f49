/* SPDX-License-Identifier: MIT */
/*
 * `local` transport: same-node writes between host regions that the broker
 * has mapped, done as memcpy. A chain is one flush (counted as a doorbell),
 * each op one WR, so the figures compare one-to-one with the RDMA transport.
 *
 * Small chains are copied inside post() and their completions handed out by
 * the next poll(). A chain of at least two pieces (params.copy_piece bytes,
 * 256 KiB by default) when params.copy_threads > 0 is cut into pieces of that
 * size, queued, and copied by a pool of threads; the caller's thread adds
 * itself a run of up to 2 MiB at a time through progress() (the broker
 * calls it once per round), so the broker thread copies too without rounds
 * growing longer than that: control requests (a transfer open) are not
 * held up behind a 16 MiB chain. Pool threads and the caller's thread each take
 * their own lane of consecutive pieces (struct achain). An op completes when
 * the last of the pieces covering it is copied. The completions a run of
 * pieces finishes go to a locked queue together after the run (one lock, one
 * drain of the copies' stores per run, not per piece) and wake wait_fd().
 *
 * Copies of at least LOCAL_NT_MIN bytes use non-temporal stores where the
 * CPU has AVX2 (unless params.copy_plain): the bytes are for another
 * process (or a device reading host memory), never read back by the thread
 * that copies them, so reading each destination line before writing it and
 * filling this core's cache with them is wasted. 256 KiB copies through
 * 128 MiB of memfd memory on one core of this project's VM: 25.3-25.7 GB/s
 * against memcpy's 20.9-21.4 (2026-12-01); from 8 KiB up they were ahead,
 * at 4 KiB behind (the closing fence). Each such copy ends with a store
 * fence, so its bytes are globally visible before its completion is handed
 * out. Sanitizer builds keep memcpy (the sanitizers do not see the
 * intrinsics' stores).
 *
 * Memory: the broker keeps a region mapped while an op on it is in flight
 * (in-flight ops hold references); dereg_mr() still waits until no chain is
 * being copied, so no copy can outlive a region even for a caller that does
 * not keep references. close() finishes the pieces already queued, joins the
 * threads and completes nothing.
 */
#include "transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LOCAL_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOCAL_SANITIZED 1
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(LOCAL_SANITIZED)
#define LOCAL_HAVE_NT 1
#include <immintrin.h>
#endif

#define LOCAL_CQ_INIT	  1024u
#define LOCAL_PIECE_DEF	  (256u << 10)
#define LOCAL_PIECE_MIN	  (4u << 10)
#define LOCAL_THREADS_MAX 64
#define LOCAL_NT_MIN	  (32u << 10) /* non-temporal copies from here */
#define LOCAL_RUN_BYTES	  (1u << 20)
/*
 * The caller's thread (the broker's, through progress()) takes runs of up
 * to 2 MiB: a broker round between pieces costs a few us, and one round per
 * 256 KiB piece cost it ~7 % of the broker's bandwidth at 8 workers (256 KiB
 * blocks, 2-core dev VM: medians of 6 alternating runs 20.8 -> 22.1 and
 * 20.0 -> 21.7 GB/s, 2026-12-01). A round then holds control requests up
 * to ~150 us of copying.
 */
#define LOCAL_CALLER_RUN_BYTES (2u << 20)

/* One op of an asynchronous chain. */
struct aop {
	char *dst;
	const char *src;
	uint64_t len;
	uint64_t start; /* offset of its first byte in the chain */
	uint64_t cookie;
	atomic_uint parts; /* pieces still to copy */
};

/*
 * An asynchronous chain: the pieces are [k * piece, (k+1) * piece), in two
 * lanes so that each copier streams through consecutive pieces: two
 * threads taking 256 KiB pieces in turn off one queue copied 29-31 GB/s on
 * the 2-core dev VM, each reading on through its own half 37-41 GB/s (a
 * two-thread memcpy loop over memfd buffers, 2026-11-30). The pool threads take
 * runs from lane A = [a, a_end), the caller's thread (progress()) takes lane B
 * = [b, b_end), the last 1/(threads+1) of the pieces; a copier whose lane is
 * empty takes from the far end of the other. Lane bounds: under the pool lock.
 */
struct achain {
	struct achain *next; /* queue of chains with pieces left to take */
	uint64_t total, piece;
	unsigned npieces;
	unsigned a, a_end, b, b_end;
	unsigned nops;
	atomic_uint ops_left; /* the last op to complete frees the chain */
	struct aop ops[];
};

struct done_q {
	struct kvb_xcqe *v;
	unsigned cap, head, len; /* cap: a power of two (indices masked) */
};

struct local_transport {
	struct kvb_transport base;
	struct done_q cq; /* inline copies: broker thread only */
	/* the pool */
	unsigned nthreads;
	uint64_t piece;
	unsigned run;  /* most pieces a pool thread takes at once */
	unsigned crun; /* ... and the caller's thread, in progress() */
	pthread_t th[LOCAL_THREADS_MAX];
	pthread_mutex_t lock; /* queue, stop, live */
	pthread_cond_t work;  /* a chain was queued, or stop */
	pthread_cond_t idle;  /* live dropped to 0 */
	struct achain *qhead, *qtail;
	unsigned live; /* chains not yet fully copied */
	/* pieces queued and not taken: progress() reads it without the lock
	 * (a stale 0 only defers the broker's piece to its next round) */
	atomic_uint untaken;
	int stop;
	pthread_mutex_t dlock; /* done queue, pending */
	struct done_q done;
	uint64_t pending; /* pooled ops posted, not yet in `done` */
	int signalled;	  /* efd written and not yet read */
	int efd;
	int nt; /* copies of >= LOCAL_NT_MIN bytes use copy_nt() */
};

#ifdef LOCAL_HAVE_NT
/* memcpy with non-temporal stores: regular ones up to the first 32-byte
 * aligned destination byte and for the tail under 128 bytes */
__attribute__((target("avx2"))) static void copy_nt(char *d, const char *s,
						    size_t n)
{
	size_t head = (size_t) (-(uintptr_t) d & 31u);

	if (head > n)
		head = n;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (; n >= 128; n -= 128, d += 128, s += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *) s);
		__m256i b = _mm256_loadu_si256((const __m256i *) (s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *) (s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *) (s + 96));

		_mm256_stream_si256((__m256i *) d, a);
		_mm256_stream_si256((__m256i *) (d + 32), b);
		_mm256_stream_si256((__m256i *) (d + 64), c);
		_mm256_stream_si256((__m256i *) (d + 96), e);
	}
	memcpy(d, s, n);
	/* the streamed stores are weakly ordered: drain them before anyone
	 * can see this copy's completion */
	_mm_sfence();
}
#endif

static int nt_available(void)
{
#ifdef LOCAL_HAVE_NT
	return __builtin_cpu_supports("avx2") != 0;
#else
	return 0;
#endif
}

static void copy_bytes(const struct local_transport *lt, char *dst,
		       const char *src, size_t n)
{
	/* a worker may name overlapping ranges of one region (its own):
	 * memcpy on them is undefined behaviour in the broker, memmove is
	 * not (the bytes are as memmove leaves them when the op is copied
	 * in one piece; pieces copied apart leave them unspecified) */
	if ((uintptr_t) dst < (uintptr_t) src + n &&
	    (uintptr_t) src < (uintptr_t) dst + n) {
		memmove(dst, src, n);
		return;
	}
#ifdef LOCAL_HAVE_NT
	if (lt->nt && n >= LOCAL_NT_MIN) {
		copy_nt(dst, src, n);
		return;
	}
#else
	(void) lt;
#endif
	memcpy(dst, src, n);
}

static int q_reserve(struct done_q *q, unsigned n)
{
	struct kvb_xcqe *nv;
	unsigned cap = q->cap ? q->cap : LOCAL_CQ_INIT, i;

	if (q->v && q->len + n <= q->cap)
		return 0;
	while (cap < q->len + n)
		cap *= 2;
	nv = malloc((size_t) cap * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	for (i = 0; i < q->len; i++)
		nv[i] = q->v[(q->head + i) & (q->cap - 1)];
	free(q->v);
	q->v = nv;
	q->cap = cap;
	q->head = 0;
	return 0;
}

/* Caller reserved room. */
static void q_push(struct done_q *q, uint64_t cookie, int status)
{
	struct kvb_xcqe *c = &q->v[(q->head + q->len++) & (q->cap - 1)];

	c->cookie = cookie;
	c->status = status;
	c->pad = 0;
}

static unsigned q_pop(struct done_q *q, struct kvb_xcqe *out, unsigned max)
{
	unsigned n = 0;

	while (n < max && q->len) {
		out[n++] = q->v[q->head];
		q->head = (q->head + 1) & (q->cap - 1);
		q->len--;
	}
	return n;
}

static void chain_free(struct local_transport *lt, struct achain *c)
{
	free(c);
	pthread_mutex_lock(&lt->lock);
	if (--lt->live == 0)
		pthread_cond_broadcast(&lt->idle);
	pthread_mutex_unlock(&lt->lock);
}

/* Completions found by one run of pieces, handed over together. */
#define DONE_BATCH 64u
struct done_batch {
	unsigned n;
	unsigned counted; /* ops pushed by this run */
	uint64_t cookie[DONE_BATCH];
};

/* Queue the batch's completions under one lock. */
static void batch_push(struct local_transport *lt, struct done_batch *b)
{
	if (!b->n)
		return;
	pthread_mutex_lock(&lt->dlock);
	/* room was reserved when the chain was posted */
	for (unsigned i = 0; i < b->n; i++)
		q_push(&lt->done, b->cookie[i], 0);
	lt->pending -= b->n;
	pthread_mutex_unlock(&lt->dlock);
	b->counted += b->n;
	b->n = 0;
}

/*
 * Count the run's completed ops off the chain (after copy_run's last use
 * of c). The chain's last ones wake a sleeping broker, once per chain (not
 * per op: a polling broker would pay a write and a read per completion;
 * earlier completions are reaped by its polls, which go on at least every
 * millisecond while anything is in flight), and free it.
 */
static void chain_count(struct local_transport *lt, struct achain *c,
			unsigned n)
{
	uint64_t one = 1;

	if (!n || atomic_fetch_sub_explicit(&c->ops_left, n,
					    memory_order_acq_rel) != n)
		return;
	pthread_mutex_lock(&lt->dlock);
	if (!lt->signalled && write(lt->efd, &one, sizeof(one)) == sizeof(one))
		lt->signalled = 1;
	pthread_mutex_unlock(&lt->dlock);
	chain_free(lt, c);
}

/* Pieces of size piece that hold bytes of [s, e) (0 when empty). */
static unsigned pieces_in(uint64_t piece, uint64_t s, uint64_t e)
{
	return e > s ? (unsigned) ((e - 1) / piece - s / piece + 1) : 0u;
}

/* The part [*s, *e) of op inside the chain's byte range [lo, hi). */
static void op_clip(const struct aop *op, uint64_t lo, uint64_t hi, uint64_t *s,
		    uint64_t *e)
{
	*s = op->start > lo ? op->start : lo;
	*e = op->start + op->len < hi ? op->start + op->len : hi;
}

/*
 * Copy pieces [k, k + n) of c, then complete the ops they finish: one
 * batch (one lock, one wait for the copies' stores to drain) per run, not
 * per piece. An op inside a single piece is finished by its copier alone;
 * one spread over several counts down its parts atomically. Ops complete
 * strictly after their bytes landed (zero-length ops were completed at
 * post). The run's ops are counted off the chain's ops_left only at the
 * end: until then c cannot be freed.
 */
static void copy_run(struct local_transport *lt, struct achain *c, unsigned k,
		     unsigned n)
{
	uint64_t lo = (uint64_t) k * c->piece,
		 hi = lo + (uint64_t) n * c->piece;
	struct done_batch b;
	unsigned i, first;

	b.n = b.counted = 0;
	if (hi > c->total)
		hi = c->total;
	/* the first op with bytes in [lo, hi): ops are ordered by start */
	{
		unsigned a = 0, e = c->nops;

		while (a < e) {
			unsigned m = a + (e - a) / 2;

			if (c->ops[m].start + c->ops[m].len <= lo)
				a = m + 1;
			else
				e = m;
		}
		first = a;
	}
	for (i = first; i < c->nops && c->ops[i].start < hi; i++) {
		struct aop *op = &c->ops[i];
		uint64_t s, e;

		op_clip(op, lo, hi, &s, &e);
		if (e > s)
			copy_bytes(lt, op->dst + (s - op->start),
				   op->src + (s - op->start), e - s);
	}
	for (unsigned j = first; j < i; j++) {
		struct aop *op = &c->ops[j];
		uint64_t s, e;
		unsigned p; /* the pieces of this run that hold bytes of op */

		op_clip(op, lo, hi, &s, &e);
		p = pieces_in(c->piece, s, e);
		if (!p)
			continue;
		/* acquire: the other copiers' bytes of op landed first */
		if (atomic_load_explicit(&op->parts, memory_order_acquire) !=
			    p &&
		    atomic_fetch_sub_explicit(&op->parts, p,
					      memory_order_acq_rel) != p)
			continue;
		b.cookie[b.n++] = op->cookie;
		if (b.n == DONE_BATCH)
			batch_push(lt, &b);
	}
	batch_push(lt, &b);
	chain_count(lt, c, b.counted);
}

/*
 * Take pieces [*k, *k + return) of the head chain under the lock; 0 when
 * the queue is empty. A pool thread takes a run from lane A (up to
 * LOCAL_RUN_BYTES, its share when the lane is short), the caller's thread
 * a run from lane B (up to LOCAL_CALLER_RUN_BYTES); an empty lane: one
 * piece off the other's end.
 */
static unsigned take(struct local_transport *lt, int pool, struct achain **c,
		     unsigned *k)
{
	struct achain *h = lt->qhead;
	unsigned n = 1;

	if (!h)
		return 0;
	*c = h;
	if (pool && h->a < h->a_end) {
		unsigned left = h->a_end - h->a, share = left / lt->nthreads;

		n = share < 1 ? 1 : share < lt->run ? share : lt->run;
		*k = h->a;
		h->a += n;
	} else if (pool) {
		*k = --h->b_end;
	} else if (h->b < h->b_end) {
		unsigned left = h->b_end - h->b;

		n = left < lt->crun ? left : lt->crun;
		*k = h->b;
		h->b += n;
	} else {
		*k = --h->a_end;
	}
	atomic_fetch_sub_explicit(&lt->untaken, n, memory_order_relaxed);
	if (h->a == h->a_end && h->b == h->b_end) {
		lt->qhead = h->next;
		if (!lt->qhead)
			lt->qtail = NULL;
	}
	return n;
}

static void *copier(void *arg)
{
	struct local_transport *lt = arg;

	pthread_mutex_lock(&lt->lock);
	for (;;) {
		struct achain *c;
		unsigned k, n = take(lt, 1, &c, &k);

		if (n) {
			pthread_mutex_unlock(&lt->lock);
			copy_run(lt, c, k, n);
			pthread_mutex_lock(&lt->lock);
			continue;
		}
		if (lt->stop)
			break;
		pthread_cond_wait(&lt->work, &lt->lock);
	}
	pthread_mutex_unlock(&lt->lock);
	return NULL;
}

static void pool_stop(struct local_transport *lt, unsigned started)
{
	pthread_mutex_lock(&lt->lock);
	lt->stop = 1;
	pthread_cond_broadcast(&lt->work);
	pthread_mutex_unlock(&lt->lock);
	for (unsigned i = 0; i < started; i++)
		pthread_join(lt->th[i], NULL);
}

static void local_free(struct local_transport *lt)
{
	if (lt->efd >= 0)
		close(lt->efd);
	pthread_cond_destroy(&lt->idle);
	pthread_cond_destroy(&lt->work);
	pthread_mutex_destroy(&lt->dlock);
	pthread_mutex_destroy(&lt->lock);
	free(lt->done.v);
	free(lt->cq.v);
	free(lt);
}

static int local_open(const struct kvb_transport_params *p,
		      struct kvb_transport **out, char *why, size_t why_len)
{
	struct local_transport *lt = calloc(1, sizeof(*lt));
	unsigned i;
	int rc;

	if (!lt)
		return -ENOMEM;
	lt->efd = -1;
	atomic_init(&lt->untaken, 0);
	pthread_mutex_init(&lt->lock, NULL);
	pthread_mutex_init(&lt->dlock, NULL);
	pthread_cond_init(&lt->work, NULL);
	pthread_cond_init(&lt->idle, NULL);
	if (p->copy_threads < 0 || p->copy_threads > LOCAL_THREADS_MAX) {
		if (why)
			snprintf(why, why_len,
				 "copy threads %d out of range 0..%d",
				 p->copy_threads, LOCAL_THREADS_MAX);
		local_free(lt);
		return -EINVAL;
	}
	lt->nt = !p->copy_plain && nt_available();
	lt->piece = p->copy_piece ? p->copy_piece : LOCAL_PIECE_DEF;
	if (lt->piece < LOCAL_PIECE_MIN)
		lt->piece = LOCAL_PIECE_MIN;
	lt->run = lt->piece < LOCAL_RUN_BYTES
			  ? (unsigned) (LOCAL_RUN_BYTES / lt->piece)
			  : 1;
	lt->crun = lt->piece < LOCAL_CALLER_RUN_BYTES
			   ? (unsigned) (LOCAL_CALLER_RUN_BYTES / lt->piece)
			   : 1;
	lt->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (lt->efd < 0 || q_reserve(&lt->cq, 0) || q_reserve(&lt->done, 0)) {
		rc = lt->efd < 0 ? -errno : -ENOMEM;
		local_free(lt);
		return rc;
	}
	for (i = 0; i < (unsigned) p->copy_threads; i++) {
		rc = -pthread_create(&lt->th[i], NULL, copier, lt);
		if (rc) {
			if (why)
				snprintf(why, why_len, "copy thread %u: %s", i,
					 strerror(-rc));
			pool_stop(lt, i);
			local_free(lt);
			return rc;
		}
	}
	lt->nthreads = i;
	lt->base.ops = &kvb_local_ops;
	*out = &lt->base;
	return 0;
}

static void local_close(struct kvb_transport *t)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);

	/* the threads finish every queued piece before they see stop */
	pool_stop(lt, lt->nthreads);
	local_free(lt);
}

static int local_reg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	/* host memory only: a GPU region needs the gpu transport */
	return mr->kind == KVB_MEM_HOST ? 0 : -EOPNOTSUPP;
}

static void local_dereg_mr(struct kvb_transport *t, struct kvb_mr *mr)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);

	/* no copy may touch the mapping after this returns */
	pthread_mutex_lock(&lt->lock);
	while (lt->live)
		pthread_cond_wait(&lt->idle, &lt->lock);
	pthread_mutex_unlock(&lt->lock);
}

static int local_local_info(struct kvb_transport *t, void *blob, size_t *len)
{
	*len = 0;
	return 0;
}

static int local_connect(struct kvb_transport *t, const void *blob, size_t len,
			 struct kvb_ep **ep)
{
	*ep = NULL; /* one node: no endpoint state */
	return 0;
}

static void local_disconnect(struct kvb_transport *t, struct kvb_ep *ep)
{
}

static void op_ends(const struct kvb_xop *op, char **dst, const char **src)
{
	char *l = (char *) op->local->addr + op->local_off;
	char *r = (char *) op->remote.mr->addr + op->remote_off;

	*dst = op->opcode == KVB_XOP_WRITE ? r : l;
	*src = op->opcode == KVB_XOP_WRITE ? l : r;
}

/* Hand a chain of `total` bytes to the pool; returns 0 or -ENOMEM. */
static int post_async(struct local_transport *lt, const struct kvb_xop *ops,
		      unsigned n, uint64_t total)
{
	struct achain *c = malloc(sizeof(*c) + (size_t) n * sizeof(c->ops[0]));
	unsigned i, nz = 0;
	uint64_t pos = 0;
	int rc;

	if (!c)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		nz += ops[i].len != 0;
	pthread_mutex_lock(&lt->dlock);
	/* room for every op still being copied, then these */
	rc = q_reserve(&lt->done, (unsigned) (lt->pending + nz));
	if (!rc)
		lt->pending += nz;
	pthread_mutex_unlock(&lt->dlock);
	if (rc) {
		free(c);
		return rc;
	}
	c->next = NULL;
	c->total = total;
	c->piece = lt->piece;
	c->npieces = (unsigned) ((total + c->piece - 1) / c->piece);
	c->a = 0;
	c->b = c->a_end = c->npieces - c->npieces / (lt->nthreads + 1);
	c->b_end = c->npieces;
	c->nops = n;
	for (i = 0; i < n; i++) {
		struct aop *a = &c->ops[i];

		op_ends(&ops[i], &a->dst, &a->src);
		a->len = ops[i].len;
		a->start = pos;
		a->cookie = ops[i].cookie;
		atomic_init(&a->parts, pieces_in(c->piece, pos, pos + a->len));
		pos += a->len;
	}
	/* zero-length ops copy nothing: complete them now */
	for (i = 0; i < n; i++)
		if (!c->ops[i].len)
			q_push(&lt->cq, c->ops[i].cookie, 0);
	atomic_init(&c->ops_left, nz);
	pthread_mutex_lock(&lt->lock);
	lt->live++;
	if (lt->qtail)
		lt->qtail->next = c;
	else
		lt->qhead = c;
	lt->qtail = c;
	atomic_fetch_add_explicit(&lt->untaken, c->npieces,
				  memory_order_relaxed);
	pthread_cond_broadcast(&lt->work);
	pthread_mutex_unlock(&lt->lock);
	return 0;
}

static int local_progress(struct kvb_transport *t)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);
	struct achain *c;
	unsigned k;
	int got;

	/* called every broker round: no lock unless a piece is waiting */
	if (!lt->nthreads ||
	    !atomic_load_explicit(&lt->untaken, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&lt->lock);
	got = (int) take(lt, 0, &c, &k);
	pthread_mutex_unlock(&lt->lock);
	if (got)
		copy_run(lt, c, k, (unsigned) got);
	return got;
}

static int local_post(struct kvb_transport *t, struct kvb_ep *ep,
		      const struct kvb_xop *ops, unsigned n)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);
	uint64_t bytes = 0;
	unsigned i;
	int rc;

	if (n == 0)
		return 0;
	for (i = 0; i < n; i++)
		bytes += ops[i].len;
	rc = q_reserve(&lt->cq, n);
	if (rc)
		return rc;
	if (lt->nthreads && bytes >= 2 * lt->piece) {
		rc = post_async(lt, ops, n, bytes);
		if (rc)
			return rc;
	} else {
		for (i = 0; i < n; i++) {
			char *dst;
			const char *src;

			op_ends(&ops[i], &dst, &src);
			copy_bytes(lt, dst, src, ops[i].len);
			q_push(&lt->cq, ops[i].cookie, 0);
		}
	}
	kvb_stats_doorbell(&t->stats, n, bytes);
	return (int) n;
}

static int local_poll(struct kvb_transport *t, struct kvb_xcqe *out,
		      unsigned max)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);
	unsigned n = q_pop(&lt->cq, out, max);

	if (n < max && lt->nthreads) {
		pthread_mutex_lock(&lt->dlock);
		n += q_pop(&lt->done, out + n, max - n);
		if (!lt->done.len && lt->signalled) {
			uint64_t v;

			/* under the lock: the next chain end writes again */
			if (read(lt->efd, &v, sizeof(v)) == sizeof(v))
				lt->signalled = 0;
		}
		pthread_mutex_unlock(&lt->dlock);
	}
	t->stats.cqes += n;
	return (int) n;
}

static int local_wait_fd(struct kvb_transport *t)
{
	struct local_transport *lt =
		container_of(t, struct local_transport, base);

	return lt->nthreads ? lt->efd : -1;
}

int kvb_local_streams(const struct kvb_transport *t)
{
	return container_of(t, const struct local_transport, base)->nt;
}

const struct kvb_transport_ops kvb_local_ops = {
	.name = "local",
	.open = local_open,
	.close = local_close,
	.reg_mr = local_reg_mr,
	.dereg_mr = local_dereg_mr,
	.local_info = local_local_info,
	.connect = local_connect,
	.disconnect = local_disconnect,
	.post = local_post,
	.poll = local_poll,
	.wait_fd = local_wait_fd,
	.progress = local_progress,
};

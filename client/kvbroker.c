/* SPDX-License-Identifier: MIT */
/* libkvbroker: the worker side (attach, control calls, transfers, submission
 * and completion); memory is in mem.c, cross-node calls in remote.c. See
 * include/kvbroker/kvbroker.h. */
#include "kvbroker/kvbroker.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "segment.h"

#define SUBMIT_CHUNK   64u
#define LIVENESS_EVERY 256u /* empty polls between broker liveness checks */
/*
 * kvb_wait busy-polls before it sleeps, for a budget that adapts between
 * WAIT_SPIN_MIN_NS and WAIT_SPIN_MAX_NS: halved by each wait whose spin
 * found nothing (it slept), raised to twice the time a spin took to find a
 * completion. Every WAIT_SPIN_PROBE-th wait spins the full budget, so a
 * workload whose completions come back quickly again regains it. Waits for
 * long transfers sleep anyway, and their spin took a core from the broker:
 * kvbench's large-block workload at 8 workers (2-core dev VM, 2026-12-01)
 * had 1548 waits sleep after 3.7 ms of busy-polling in all; a fixed 20 us
 * spin takes at least 31 ms for as many.
 */
#define WAIT_SPIN_MAX_NS 20000
#define WAIT_SPIN_MIN_NS 1000
#define WAIT_SPIN_PROBE	 16u

#include "client.h"

uint32_t kvb_worker_id(const struct kvb_ctx *ctx)
{
	return ctx->worker_id;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next request number: never 0. Under ctl_lock. */
static uint32_t next_seq(struct kvb_ctx *ctx)
{
	if (++ctx->seq == 0)
		ctx->seq = 1;
	return ctx->seq;
}

/* Take ctl_lock by the deadline (now_ns's clock): 0 or -ETIMEDOUT. */
static int ctl_lock_by(struct kvb_ctx *ctx, int64_t deadline)
{
	struct timespec ts = {.tv_sec = (time_t) (deadline / 1000000000),
			      .tv_nsec = (long) (deadline % 1000000000)};
	int rc = pthread_mutex_clocklock(&ctx->ctl_lock, CLOCK_MONOTONIC, &ts);

	return rc == ETIMEDOUT ? -ETIMEDOUT : -rc;
}

/*
 * The reply to a request nobody waits for any more (its call returned
 * -ETIMEDOUT), now in ctx->rx, n bytes. A region registered that late is
 * freed again (its caller was told it failed): a DEREG whose own reply is
 * one more of these. Under ctl_lock.
 */
static void stray(struct kvb_ctx *ctx, int n, int64_t deadline)
{
	const struct kvb_msg_mem_reply *mr = (const void *) ctx->rx.raw;
	const struct kvb_msg_hdr *h = &ctx->rx.h;

	if (__atomic_load_n(&ctx->strays, __ATOMIC_RELAXED))
		__atomic_fetch_sub(&ctx->strays, 1, __ATOMIC_RELAXED);
	if (h->type == KVB_MSG_PEER && h->seq == ctx->peer_seq)
		ctx->peer_seq = 0;
	if (h->type == KVB_MSG_MEM_REG && h->status == 0 &&
	    n == (int) sizeof(*mr)) {
		struct kvb_msg_mem_dereg d;

		kvb_msg_init(&d.h, KVB_MSG_MEM_DEREG, sizeof(d));
		d.h.seq = next_seq(ctx);
		d.region = mr->region;
		if (!kvb_ctl_send_by(ctx->sock, &d, sizeof(d), NULL, 0,
				     deadline))
			__atomic_fetch_add(&ctx->strays, 1, __ATOMIC_RELAXED);
	}
}

/*
 * Receive one message into ctx->rx by the deadline: its length, or -errno.
 * Replies carry no fds after HELLO: any are closed. A message too short
 * for a header, or of another magic or version, is -EPROTO. Under ctl_lock.
 */
static int ctl_read(struct kvb_ctx *ctx, int64_t deadline)
{
	int fds[KVB_CTL_MAX_FDS];
	unsigned nfds = KVB_CTL_MAX_FDS;
	int n;

	n = kvb_ctl_recv_by(ctx->sock, ctx->rx.raw, sizeof(ctx->rx), fds, &nfds,
			    deadline);
	while (nfds)
		close(fds[--nfds]);
	if (n >= 0 &&
	    (n < (int) sizeof(ctx->rx.h) || ctx->rx.h.magic != KVB_MSG_MAGIC ||
	     ctx->rx.h.version != KVB_PROTO_VERSION))
		return -EPROTO;
	return n;
}

/*
 * One request/reply on the control socket, serialised by ctl_lock, all of
 * it (the lock, the send, the reply) within ctx->timeout_ms. The reply is
 * the message that echoes the request's number; replies to calls that gave
 * up earlier are dropped on the way (stray()).
 */
int kvb_client_call(struct kvb_ctx *ctx, struct kvb_msg_hdr *req,
		    const int *fds, unsigned nfds, void *reply, size_t cap,
		    size_t min_len)
{
	int64_t deadline = kvb_ctl_deadline(ctx->timeout_ms);
	int rc, n;

	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	rc = ctl_lock_by(ctx, deadline);
	if (rc)
		return rc;
	/* one PEER unanswered at a time (shm/proto.h): wait for the last
	 * one's reply before sending another */
	while (!rc && req->type == KVB_MSG_PEER && ctx->peer_seq) {
		n = ctl_read(ctx, deadline);
		if (n < 0)
			rc = n;
		else
			stray(ctx, n, deadline);
	}
	/* no time left (the lock took it): a request sent now would only
	 * come back as a late reply */
	if (!rc && kvb_ctl_now_ns() >= deadline)
		rc = -ETIMEDOUT;
	if (!rc) {
		req->seq = next_seq(ctx);
		rc = kvb_ctl_send_by(ctx->sock, req, req->len, fds, nfds,
				     deadline);
	}
	while (!rc) {
		n = ctl_read(ctx, deadline);
		if (n == -ETIMEDOUT) {
			/* sent, not answered: its reply comes later */
			__atomic_fetch_add(&ctx->strays, 1, __ATOMIC_RELAXED);
			if (req->type == KVB_MSG_PEER)
				ctx->peer_seq = req->seq;
		}
		if (n < 0) {
			rc = n;
		} else if (ctx->rx.h.seq != req->seq) {
			stray(ctx, n, deadline);
		} else {
			rc = (size_t) n > cap ? -EPROTO : 0;
			if (!rc) {
				memcpy(reply, ctx->rx.raw, (size_t) n);
				rc = kvb_ctl_check_reply(reply, n, req->type,
							 min_len);
			}
			break;
		}
	}
	pthread_mutex_unlock(&ctx->ctl_lock);
	if (rc == -EPIPE || rc == -ECONNRESET)
		__atomic_store_n(&ctx->dead, 1, __ATOMIC_RELAXED);
	return rc == -ECONNRESET ? -EPIPE : rc;
}

/*
 * Drop the replies of calls that gave up, without waiting, unless a control
 * call is in progress (it reads them itself). Returns 1 when the socket
 * holds no such reply now, 0 when it may.
 */
static int drain_strays(struct kvb_ctx *ctx)
{
	if (!__atomic_load_n(&ctx->strays, __ATOMIC_RELAXED))
		return 1;
	if (pthread_mutex_trylock(&ctx->ctl_lock))
		return 0;
	for (;;) {
		int n = ctl_read(ctx, 0);

		if (n == -EPIPE || n == -ECONNRESET)
			__atomic_store_n(&ctx->dead, 1, __ATOMIC_RELAXED);
		if (n == -EPROTO)
			continue; /* not ours to answer: dropped too */
		if (n < 0)
			break;
		stray(ctx, n, 0);
	}
	pthread_mutex_unlock(&ctx->ctl_lock);
	return 1;
}

/* A non-blocking look at the socket: has the broker hung up? */
static int broker_alive(struct kvb_ctx *ctx)
{
	struct pollfd p = {.fd = ctx->sock, .events = 0};

	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return 0;
	drain_strays(ctx);
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR))) {
		__atomic_store_n(&ctx->dead, 1, __ATOMIC_RELAXED);
		return 0;
	}
	return !__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED);
}

int kvb_attach(const struct kvb_attach_opts *o, struct kvb_ctx **out)
{
	struct kvb_msg_hello req;
	struct kvb_msg_hello_reply rep;
	char path[108];
	int fds[3] = {-1, -1, -1};
	unsigned nfds = 3;
	struct kvb_ctx *ctx;
	int64_t deadline;
	int rc;

	if (!o || !out || (o->role != KVB_ROLE_P && o->role != KVB_ROLE_D) ||
	    o->tp_size == 0 || o->tp_rank >= o->tp_size)
		return -EINVAL;
	if (o->socket_path) {
		if (strlen(o->socket_path) >= sizeof(path))
			return -ENAMETOOLONG;
		strcpy(path, o->socket_path);
	} else {
		rc = kvb_default_socket(path, sizeof(path));
		if (rc < 0)
			return rc;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->broker_efd = ctx->worker_efd = -1;
	ctx->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
	ctx->spin_ns = WAIT_SPIN_MAX_NS;
	pthread_mutex_init(&ctx->ctl_lock, NULL);
	deadline = kvb_ctl_deadline(ctx->timeout_ms);
	/* before anything is sent: a private directory (default path) and a
	 * broker of this uid, root or $KVB_BROKER_UIDS; else -EACCES */
	rc = kvb_ctl_open(path, ctx->timeout_ms, !o->socket_path);
	if (rc < 0)
		goto err_free;
	ctx->sock = rc;

	kvb_msg_init(&req.h, KVB_MSG_HELLO, sizeof(req));
	req.role = o->role;
	req.dp_rank = o->dp_rank;
	req.tp_rank = o->tp_rank;
	req.tp_size = o->tp_size;
	req.pid = (uint32_t) getpid();
	req.sq_entries = o->sq_entries;
	req.cq_entries = o->cq_entries;
	req.h.seq = next_seq(ctx);
	rc = kvb_ctl_send_by(ctx->sock, &req, sizeof(req), NULL, 0, deadline);
	if (rc)
		goto err_sock;
	rc = kvb_ctl_recv_by(ctx->sock, &rep, sizeof(rep), fds, &nfds,
			     deadline);
	if (rc < 0)
		goto err_sock;
	rc = kvb_ctl_check_reply(&rep.h, rc, KVB_MSG_HELLO, sizeof(rep));
	if (!rc && rep.h.seq != req.h.seq)
		rc = -EPROTO;
	if (rc)
		goto err_fds;
	if (nfds != 3 || rep.seg_size == 0 || rep.seg_size > (1ull << 32)) {
		rc = -EPROTO;
		goto err_fds;
	}
	ctx->seg_size = rep.seg_size;
	ctx->seg_mem = mmap(NULL, ctx->seg_size, PROT_READ | PROT_WRITE,
			    MAP_SHARED, fds[0], 0);
	if (ctx->seg_mem == MAP_FAILED) {
		rc = -errno;
		goto err_fds;
	}
	close(fds[0]);
	fds[0] = -1;
	rc = kvb_seg_attach(&ctx->seg, ctx->seg_mem, ctx->seg_size);
	if (rc)
		goto err_unmap;
	ctx->broker_efd = fds[1];
	ctx->worker_efd = fds[2];
	ctx->worker_id = rep.worker_id;
	*out = ctx;
	return 0;

err_unmap:
	munmap(ctx->seg_mem, ctx->seg_size);
err_fds:
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
err_sock:
	close(ctx->sock);
err_free:
	pthread_mutex_destroy(&ctx->ctl_lock);
	free(ctx);
	return rc == -EPIPE || rc == -ECONNRESET ? -ECONNREFUSED : rc;
}

int kvb_detach(struct kvb_ctx *ctx)
{
	struct kvb_msg_hdr bye, rep;

	if (!ctx)
		return 0;
	if (!__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED)) {
		kvb_msg_init(&bye, KVB_MSG_BYE, sizeof(bye));
		kvb_client_call(ctx, &bye, NULL, 0, &rep, sizeof(rep),
				sizeof(rep));
	}
	munmap(ctx->seg_mem, ctx->seg_size);
	close(ctx->broker_efd);
	close(ctx->worker_efd);
	close(ctx->sock);
	pthread_mutex_destroy(&ctx->ctl_lock);
	free(ctx);
	return 0;
}

int kvb_transfer_open(struct kvb_ctx *ctx, const char *id, uint32_t *handle)
{
	struct kvb_msg_open req;
	struct kvb_msg_open_reply rep;
	size_t n;
	int rc;

	if (!ctx || !id || !handle)
		return -EINVAL;
	n = strlen(id);
	if (n == 0 || n > KVB_XFER_ID_MAX)
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_OPEN, sizeof(req));
	req.id_len = (uint32_t) n;
	memcpy(req.id, id, n);
	rc = kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep));
	if (rc)
		return rc;
	*handle = rep.handle;
	return 0;
}

int kvb_transfer_set_timeouts(struct kvb_ctx *ctx, uint32_t handle,
			      uint32_t deadline_ms, uint32_t stall_ms,
			      uint32_t defer_ms)
{
	const uint32_t max = 86400u * 1000u;
	struct kvb_msg_xtimeouts req;
	struct kvb_msg_hdr rep;

	if (!ctx || !handle || deadline_ms > max || stall_ms > max ||
	    defer_ms > max)
		return -EINVAL;
	kvb_msg_init(&req.h, KVB_MSG_XTIMEOUTS, sizeof(req));
	req.handle = handle;
	req.deadline_ms = deadline_ms;
	req.stall_ms = stall_ms;
	req.defer_ms = defer_ms;
	return kvb_client_call(ctx, &req.h, NULL, 0, &rep, sizeof(rep),
			       sizeof(rep));
}

_Static_assert(KVB_TRANSFER_OPEN_BATCH_MAX == KVB_OPEN_BATCH_MAX,
	       "public and wire batch limits agree");

int kvb_transfer_open_batch(struct kvb_ctx *ctx, const char *const *ids,
			    unsigned n, uint32_t *handles, int *status)
{
	union {
		struct kvb_msg_open_batch m;
		char raw[sizeof(struct kvb_msg_open_batch) +
			 KVB_OPEN_BATCH_MAX * (1 + KVB_XFER_ID_MAX)];
	} req;
	union {
		struct kvb_msg_open_batch_reply r;
		char raw[sizeof(struct kvb_msg_open_batch_reply) +
			 KVB_OPEN_BATCH_MAX * sizeof(struct kvb_open_result)];
	} rep;
	size_t len = sizeof(req.m);
	int rc, first = 0;

	if (!ctx || !ids || !handles || n == 0 || n > KVB_OPEN_BATCH_MAX)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		size_t k = ids[i] ? strlen(ids[i]) : 0;

		if (k == 0 || k > KVB_XFER_ID_MAX)
			return -EINVAL;
		req.raw[len] = (char) (uint8_t) k;
		memcpy(req.raw + len + 1, ids[i], k);
		len += 1 + k;
	}
	/* kvb_msg_init zeroes what it covers: the header only, ids kept */
	kvb_msg_init(&req.m.h, KVB_MSG_OPEN_BATCH, sizeof(req.m));
	req.m.h.len = (uint32_t) len;
	req.m.n = n;
	rc = kvb_client_call(ctx, &req.m.h, NULL, 0, &rep, sizeof(rep),
			     sizeof(rep.r) + n * sizeof(rep.r.res[0]));
	if (rc)
		return rc;
	if (rep.r.n != n ||
	    rep.r.h.len != sizeof(rep.r) + n * sizeof(rep.r.res[0]))
		return -EPROTO;
	for (unsigned i = 0; i < n; i++) {
		int s = rep.r.res[i].status;

		if (s > 0)
			s = -EPROTO;
		handles[i] = s ? 0 : rep.r.res[i].handle;
		if (status)
			status[i] = s;
		if (s && !first)
			first = s;
	}
	return first;
}

/* Tell a sleeping broker there is work. Pairs with the broker's sleep path. */
static inline void wake_broker(struct kvb_ctx *ctx)
{
	/*
	 * Dekker with the broker: we published prod (release), it publishes
	 * broker_sleeping then re-reads prod. Full fences on both sides.
	 */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&ctx->seg.hdr->broker_sleeping,
				 memory_order_relaxed)) {
		uint64_t one = 1;

		if (write(ctx->broker_efd, &one, sizeof(one)) < 0) {
			/* eventfd overflow is impossible at 1 per write */
		}
	}
}

/* End of a burst: wake the broker for what went in; none of n: why. */
static int submitted(struct kvb_ctx *ctx, unsigned done, unsigned n)
{
	if (done)
		wake_broker(ctx);
	if (done == 0 && n) {
		if (!broker_alive(ctx))
			return -EPIPE;
		return -EAGAIN;
	}
	return (int) done;
}

static int submit(struct kvb_ctx *ctx, uint8_t op, const struct kvb_desc *d,
		  unsigned n)
{
	struct kvb_sqe sqe[SUBMIT_CHUNK];
	unsigned done = 0;

	if (!ctx || (!d && n))
		return -EINVAL;
	/* undefined flag bits: the whole call is refused, nothing queued */
	for (unsigned i = 0; i < n; i++)
		if (d[i].flags & ~KVB_DESC_UNSIGNALED)
			return -EINVAL;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	while (done < n) {
		unsigned k = n - done < SUBMIT_CHUNK ? n - done : SUBMIT_CHUNK;
		unsigned i, got;

		for (i = 0; i < k; i++) {
			const struct kvb_desc *s = &d[done + i];
			struct kvb_sqe *e = &sqe[i];

			e->opcode = op;
			e->flags = (s->flags & KVB_DESC_UNSIGNALED)
					   ? KVB_SQE_F_UNSIGNALED
					   : 0;
			e->layer = s->layer;
			e->transfer = s->transfer;
			e->region = s->region;
			e->peer_region = s->peer_region;
			e->offset = s->offset;
			e->peer_offset = s->peer_offset;
			e->len = s->len;
			e->tag = s->tag;
			e->peer = s->peer;
			memset(e->rsvd, 0, sizeof(e->rsvd));
		}
		got = kvb_ring_enqueue_burst(&ctx->seg.sq, sqe, k);
		done += got;
		if (got < k)
			break;
	}
	return submitted(ctx, done, n);
}

int kvb_submit_write(struct kvb_ctx *ctx, const struct kvb_desc *d, unsigned n)
{
	return submit(ctx, KVB_OP_WRITE, d, n);
}

int kvb_submit_read(struct kvb_ctx *ctx, const struct kvb_desc *d, unsigned n)
{
	return submit(ctx, KVB_OP_READ, d, n);
}

static int submit_ctl(struct kvb_ctx *ctx, uint8_t op, uint32_t handle,
		      uint64_t len, uint64_t tag)
{
	struct kvb_sqe e = {
		.opcode = op, .transfer = handle, .len = len, .tag = tag};

	if (!ctx)
		return -EINVAL;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	if (kvb_ring_enqueue_bulk(&ctx->seg.sq, &e, 1) != 1)
		return broker_alive(ctx) ? -EAGAIN : -EPIPE;
	wake_broker(ctx);
	return 0;
}

int kvb_transfer_seal(struct kvb_ctx *ctx, uint32_t handle, uint32_t expected,
		      uint64_t tag)
{
	return submit_ctl(ctx, KVB_OP_SEAL, handle, expected, tag);
}

int kvb_transfer_abort(struct kvb_ctx *ctx, uint32_t handle, uint64_t tag)
{
	return submit_ctl(ctx, KVB_OP_ABORT, handle, 0, tag);
}

int kvb_submit_layer(struct kvb_ctx *ctx, uint32_t handle, uint16_t layer,
		     uint64_t tag, uint32_t flags)
{
	struct kvb_sqe e = {.opcode = KVB_OP_LAYER,
			    .transfer = handle,
			    .layer = layer,
			    .tag = tag,
			    .flags = (flags & KVB_DESC_UNSIGNALED)
					     ? KVB_SQE_F_UNSIGNALED
					     : 0};

	if (!ctx || (flags & ~KVB_DESC_UNSIGNALED))
		return -EINVAL;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	if (kvb_ring_enqueue_bulk(&ctx->seg.sq, &e, 1) != 1)
		return broker_alive(ctx) ? -EAGAIN : -EPIPE;
	wake_broker(ctx);
	return 1;
}

int kvb_submit_layers(struct kvb_ctx *ctx, const uint32_t *handles,
		      const uint64_t *tags, unsigned n, uint16_t layer,
		      uint32_t flags)
{
	struct kvb_sqe sqe[SUBMIT_CHUNK];
	unsigned done = 0;

	if (!ctx || (n && (!handles || !tags)) ||
	    (flags & ~KVB_DESC_UNSIGNALED))
		return -EINVAL;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	while (done < n) {
		unsigned k = n - done < SUBMIT_CHUNK ? n - done : SUBMIT_CHUNK;
		unsigned i, got;

		for (i = 0; i < k; i++)
			sqe[i] = (struct kvb_sqe){
				.opcode = KVB_OP_LAYER,
				.transfer = handles[done + i],
				.layer = layer,
				.tag = tags[done + i],
				.flags = (flags & KVB_DESC_UNSIGNALED)
						 ? KVB_SQE_F_UNSIGNALED
						 : 0};
		got = kvb_ring_enqueue_burst(&ctx->seg.sq, sqe, k);
		done += got;
		if (got < k)
			break;
	}
	return submitted(ctx, done, n);
}

int kvb_transfer_seal_many(struct kvb_ctx *ctx, const uint32_t *handles,
			   const uint32_t *expected, const uint64_t *tags,
			   unsigned n)
{
	struct kvb_sqe sqe[SUBMIT_CHUNK];
	unsigned done = 0;

	if (!ctx || (n && (!handles || !expected || !tags)))
		return -EINVAL;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	while (done < n) {
		unsigned k = n - done < SUBMIT_CHUNK ? n - done : SUBMIT_CHUNK;
		unsigned got;

		for (unsigned i = 0; i < k; i++)
			sqe[i] = (struct kvb_sqe){.opcode = KVB_OP_SEAL,
						  .transfer = handles[done + i],
						  .len = expected[done + i],
						  .tag = tags[done + i]};
		got = kvb_ring_enqueue_burst(&ctx->seg.sq, sqe, k);
		done += got;
		if (got < k)
			break;
	}
	return submitted(ctx, done, n);
}

static unsigned reap(struct kvb_ctx *ctx, struct kvb_completion *c,
		     unsigned max)
{
	struct kvb_cqe cqe[SUBMIT_CHUNK];
	unsigned n, i;

	if (max > SUBMIT_CHUNK)
		max = SUBMIT_CHUNK;
	n = kvb_ring_dequeue_burst(&ctx->seg.cq, cqe, max);
	if (n) {
		/* room made: a sleeping broker that owes us completions
		 * (its overflow list) moves them now. Dekker with its sleep:
		 * it announces broker_sleeping, fences, then looks for room
		 * in our ring. */
		atomic_thread_fence(memory_order_seq_cst);
		if (atomic_load_explicit(&ctx->seg.hdr->cq_backlog,
					 memory_order_relaxed))
			wake_broker(ctx);
	}
	for (i = 0; i < n; i++) {
		c[i].tag = cqe[i].tag;
		c[i].bytes = cqe[i].bytes;
		c[i].status = cqe[i].status;
		c[i].transfer = cqe[i].transfer;
		c[i].kind = cqe[i].opcode;
	}
	return n;
}

int kvb_poll(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max)
{
	unsigned n;

	if (!ctx || !c || !max)
		return -EINVAL;
	n = reap(ctx, c, max);
	if (n) {
		ctx->empty_polls = 0;
		return (int) n;
	}
	if (++ctx->empty_polls % LIVENESS_EVERY == 0 && !broker_alive(ctx))
		return (n = reap(ctx, c, max)) ? (int) n : -EPIPE;
	if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
		return -EPIPE;
	return 0;
}

/* How a busy-poll ended. */
enum spin_end { SPIN_FOUND, SPIN_SLEPT, SPIN_TIMED_OUT };

/* Count a busy-poll of spun_ns and adapt the budget to how it ended. */
static void spin_end(struct kvb_ctx *ctx, int64_t spun_ns, enum spin_end how)
{
	if (how == SPIN_SLEPT)
		ctx->spin_ns = ctx->spin_ns / 2 > WAIT_SPIN_MIN_NS
				       ? ctx->spin_ns / 2
				       : WAIT_SPIN_MIN_NS;
	else if (how == SPIN_FOUND && 2 * spun_ns > ctx->spin_ns)
		ctx->spin_ns = 2 * spun_ns < WAIT_SPIN_MAX_NS
				       ? 2 * spun_ns
				       : WAIT_SPIN_MAX_NS;
	atomic_fetch_add_explicit(&ctx->seg.hdr->worker_spin_ns,
				  (uint64_t) spun_ns, memory_order_relaxed);
}

static int shutdown_in(const struct kvb_completion *c, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (c[i].kind == KVB_COMP_SHUTDOWN)
			return 1;
	return 0;
}

int kvb_wait_min(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max,
		 unsigned min, int timeout_ms)
{
	int64_t start = now_ns(), deadline, budget, now = start;
	int spun = 0; /* 1: busy-polled, 2: and then slept */
	unsigned got = 0, n;

	if (!ctx || !c || !max)
		return -EINVAL;
	if (min > max)
		min = max;
	if (min > ctx->seg.cq.entries)
		min = ctx->seg.cq.entries; /* more could never be queued */
	if (min < 1)
		min = 1;
	deadline = timeout_ms < 0 ? INT64_MAX
				  : start + (int64_t) timeout_ms * 1000000;
	budget = ++ctx->waits % WAIT_SPIN_PROBE == 0 ? WAIT_SPIN_MAX_NS
						     : ctx->spin_ns;
	for (;;) {
		/* the control socket: for the broker hanging up (POLLHUP),
		 * and for replies nobody waits for, when they are ours to
		 * drop (never for a call in progress: spinning on it) */
		struct pollfd p[2] = {{.fd = ctx->worker_efd, .events = POLLIN},
				      {.fd = ctx->sock, .events = 0}};
		uint32_t want;
		int ms, rc;

		n = reap(ctx, c + got, max - got);
		got += n;
		if (got >= min || (n && shutdown_in(c + got - n, n))) {
			if (spun == 1)
				spin_end(ctx, now - start, SPIN_FOUND);
			return (int) got;
		}
		if (__atomic_load_n(&ctx->dead, __ATOMIC_RELAXED))
			return got ? (int) got : -EPIPE;
		now = now_ns();
		if (now >= deadline) {
			if (spun == 1)
				spin_end(ctx, now - start, SPIN_TIMED_OUT);
			return got ? (int) got : -ETIMEDOUT;
		}
		if (now - start < budget && spun < 2) {
			spun = 1;
			continue;
		}
		if (spun < 2) {
			/* the spin found too little: shorter next time */
			spin_end(ctx, now - start, SPIN_SLEPT);
			spun = 2;
		}
		/*
		 * Announce the sleep and how many more completions end it,
		 * then look once more (pairs with the broker's fence between
		 * publishing cq and reading the word).
		 */
		want = min - got;
		atomic_store_explicit(&ctx->seg.hdr->worker_waiting, want,
				      memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		if (kvb_ring_count(&ctx->seg.cq) >= want) {
			atomic_store_explicit(&ctx->seg.hdr->worker_waiting, 0,
					      memory_order_relaxed);
			continue;
		}
		if (drain_strays(ctx) &&
		    __atomic_load_n(&ctx->strays, __ATOMIC_RELAXED))
			p[1].events = POLLIN;
		ms = deadline == INT64_MAX
			     ? 1000
			     : (int) ((deadline - now + 999999) / 1000000);
		if (ms > 1000)
			ms = 1000; /* re-check liveness at least every second */
		atomic_fetch_add_explicit(&ctx->seg.hdr->worker_sleeps, 1,
					  memory_order_relaxed);
		rc = poll(p, 2, ms);
		/* slept to the timeout with the count there: nobody woke us */
		if (rc == 0 && kvb_ring_count(&ctx->seg.cq) >= want)
			atomic_fetch_add_explicit(
				&ctx->seg.hdr->worker_late_wakes, 1,
				memory_order_relaxed);
		if (rc > 0) {
			if (p[0].revents & POLLIN) {
				uint64_t v;

				if (read(ctx->worker_efd, &v, sizeof(v)) < 0) {
					/* raced with another reader: fine */
				}
			}
			if (p[1].revents & (POLLHUP | POLLERR))
				__atomic_store_n(&ctx->dead, 1,
						 __ATOMIC_RELAXED);
		}
		atomic_store_explicit(&ctx->seg.hdr->worker_waiting, 0,
				      memory_order_relaxed);
	}
}

int kvb_wait(struct kvb_ctx *ctx, struct kvb_completion *c, unsigned max,
	     int timeout_ms)
{
	return kvb_wait_min(ctx, c, max, 1, timeout_ms);
}

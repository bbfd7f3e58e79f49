/* SPDX-License-Identifier: MIT */
/* Worker lifecycle: accept, HELLO, control requests, teardown. */
#include "broker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"
#include "log.h"
#include "metrics.h"
#include "worker_priv.h"

#define EP_WORKER_TAG 0x100000000ull /* epoll data: tag | slot */

struct kvb_worker *kvb_worker_by_id(struct kvb_broker *b, uint32_t id)
{
	struct kvb_worker *w;

	if (KVB_WSLOT(id) >= b->opt.max_workers)
		return NULL;
	w = &b->workers[KVB_WSLOT(id)];
	return w->id == id && w->id ? w : NULL;
}

static void reject(struct kvb_broker *b, struct kvb_worker *w, const char *why);

static int is_pending(const struct kvb_broker *b, const struct kvb_worker *w)
{
	return w >= b->pend && w < b->pend + b->opt.max_pending;
}

/* A slot in the pre-HELLO table: a free one, else the oldest connection
 * there is closed for the new one (a legitimate client says HELLO at once,
 * so silent ones cannot keep it out). */
static struct kvb_worker *pending_slot(struct kvb_broker *b)
{
	struct kvb_worker *old = NULL;

	for (uint32_t i = 0; i < b->opt.max_pending; i++) {
		struct kvb_worker *p = &b->pend[i];

		if (!p->id)
			return p;
		if (!old || p->since < old->since)
			old = p;
	}
	b->st.pending_evicted++;
	log_warn_rl("connection from pid %d closed before HELLO: %u "
		    "connections without HELLO (--max-pending), a newer one "
		    "came",
		    (int) old->pid, b->opt.max_pending);
	kvb_worker_drop(b, old, "evicted (no HELLO yet)");
	return old;
}

int kvb_worker_accept(struct kvb_broker *b)
{
	struct epoll_event ev = {.events = EPOLLIN};
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	struct kvb_worker *w;
	int fd;

	fd = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		log_warn_rl("accept: SO_PEERCRED failed: %s", strerror(errno));
		close(fd);
		b->st.messages_rejected++;
		return 0;
	}
	if (cred.uid != b->uid) {
		log_warn_rl("refused connection from pid %d: uid %u is not the "
			    "broker's uid %u",
			    (int) cred.pid, (unsigned) cred.uid,
			    (unsigned) b->uid);
		b->st.messages_rejected++;
		close(fd);
		return 0;
	}
	w = pending_slot(b);
	memset(w, 0, sizeof(*w));
	w->id = 1;
	w->sock = fd;
	w->efd = -1;
	w->uid = cred.uid;
	w->pid = cred.pid;
	w->since = kvb_now_ns();
	ev.data.u64 = KVB_EP_PENDING_TAG | (uint64_t) (w - b->pend);
	if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int rc = -errno;

		close(fd);
		w->id = 0;
		return rc;
	}
	b->npending++;
	return 0;
}

void kvb_worker_timers(struct kvb_broker *b, int64_t now)
{
	int64_t limit = (int64_t) b->opt.hello_timeout_ms * 1000000;

	for (uint32_t i = 0; b->npending && i < b->opt.max_pending; i++) {
		struct kvb_worker *p = &b->pend[i];

		if (!p->id || now - p->since < limit)
			continue;
		b->st.hello_timeouts++;
		b->st.messages_rejected++;
		log_warn_rl("connection from pid %d closed: no HELLO within "
			    "%u ms (--hello-timeout-ms)",
			    (int) p->pid, b->opt.hello_timeout_ms);
		kvb_worker_drop(b, p, "no HELLO in time");
	}
}

/*
 * Move a pre-HELLO connection into a worker slot. Returns the worker, or
 * NULL when --max-workers are attached (the caller refuses the HELLO).
 */
static struct kvb_worker *promote(struct kvb_broker *b, struct kvb_worker *p)
{
	struct epoll_event ev = {.events = EPOLLIN};
	struct kvb_worker *w = NULL;
	uint16_t gen;
	uint32_t i;

	for (i = 0; i < b->opt.max_workers; i++)
		if (!b->workers[i].id) {
			w = &b->workers[i];
			break;
		}
	if (!w)
		return NULL;
	gen = (uint16_t) (w->gen + 1);
	*w = *p;
	w->gen = gen ? gen : 1;
	w->id = ((uint32_t) w->gen << 12) | i;
	kvb_ratelimit_init(&w->refuse_rl, KVB_REFUSALS_LOGGED, 0);
	ev.data.u64 = EP_WORKER_TAG | i;
	epoll_ctl(b->epfd, EPOLL_CTL_MOD, w->sock, &ev);
	memset(p, 0, sizeof(*p));
	b->npending--;
	b->nworkers++;
	return w;
}

/*
 * Replies echo the request's seq (shm/proto.h). req_seq: the seq of the
 * request kvb_worker_ctl is answering; peer_seq: per worker slot, the seq of
 * its last PEER request, which a deferred reply echoes (the library sends
 * no PEER while one of its PEERs is unanswered).
 */
static uint32_t req_seq;
static uint32_t peer_seq[KVB_WSLOT(~0u) + 1];

static void send_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		       int status, const int *fds, unsigned nfds, uint32_t seq)
{
	h->magic = KVB_MSG_MAGIC;
	h->version = KVB_PROTO_VERSION;
	h->len = (uint32_t) len;
	h->status = status;
	h->seq = seq;
	h->pad = 0;
	if (kvb_ctl_send(w->sock, h, len, fds, nfds))
		log_dbg("worker %u: reply failed", w->id);
}

/* A deferred reply (xnode.c): only PEER requests are answered later. */
void kvb_worker_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		      int status)
{
	send_reply(w, h, len, status, NULL, 0,
		   h->type == KVB_MSG_PEER ? peer_seq[KVB_WSLOT(w->id)] : 0);
}

/* The answer to the request kvb_worker_ctl is handling. */
static void reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		  int status, const int *fds, unsigned nfds)
{
	send_reply(w, h, len, status, fds, nfds, req_seq);
}

void kvb_ctl_reply(struct kvb_worker *w, struct kvb_msg_hdr *h, size_t len,
		   int status, const int *fds, unsigned nfds)
{
	reply(w, h, len, status, fds, nfds);
}

/* Is a worker with this identity attached? */
static struct kvb_worker *same_identity(struct kvb_broker *b,
					const struct kvb_msg_hello *m)
{
	for (uint32_t i = 0; i < b->nlive; i++) {
		struct kvb_worker *o = &b->workers[b->live[i]];

		if (o->role == m->role && o->dp_rank == m->dp_rank &&
		    o->tp_rank == m->tp_rank)
			return o;
	}
	return NULL;
}

/* A HELLO's identity and ring sizes: 0 or the status it is refused with
 * (logged, counted). */
static int hello_check(struct kvb_broker *b, const struct kvb_worker *p,
		       const struct kvb_msg_hello *m, uint32_t sq, uint32_t cq)
{
	struct kvb_worker *o;

	if ((m->role != KVB_ROLE_P && m->role != KVB_ROLE_D) ||
	    m->tp_size == 0 || m->tp_rank >= m->tp_size || sq < 2 ||
	    (sq & (sq - 1)) || cq < 2 || (cq & (cq - 1))) {
		log_warn_rl("worker pid %d: refused HELLO: bad identity or "
			    "ring sizes",
			    (int) p->pid);
		return -EINVAL;
	}
	if (sq > b->opt.max_ring_entries || cq > b->opt.max_ring_entries) {
		log_warn_rl("worker pid %d: refused HELLO: rings of %u/%u "
			    "entries asked, at most %u (--max-ring-entries)",
			    (int) p->pid, sq, cq, b->opt.max_ring_entries);
		return -E2BIG;
	}
	o = same_identity(b, m);
	if (o) {
		b->st.duplicate_identity++;
		log_warn_rl("worker pid %d: refused HELLO: role %s dp %u tp %u "
			    "is attached already (worker %u, pid %d)",
			    (int) p->pid, m->role == KVB_ROLE_P ? "P" : "D",
			    m->dp_rank, m->tp_rank, o->id, (int) o->pid);
		return -EADDRINUSE;
	}
	return 0;
}

/* Refuse a HELLO: the status to the client, then the connection goes. */
static void hello_refuse(struct kvb_broker *b, struct kvb_worker *w,
			 const struct kvb_msg_hello *m, int rc)
{
	struct kvb_msg_hdr h = m->h;

	b->st.hello_refused++;
	reply(w, &h, sizeof(h), rc, NULL, 0);
	reject(b, w, "HELLO refused");
}

/* Map a fresh segment for w; the fds to send in fds[0] and fds[2]. */
static int make_segment(struct kvb_broker *b, struct kvb_worker *w, uint32_t sq,
			uint32_t cq, int fds[3])
{
	size_t size = kvb_seg_bytes(sq, cq);
	void *mem;
	int rc;

	fds[0] = memfd_create("kvb-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fds[0] < 0)
		return -errno;
	/* the worker gets this fd: sealed, it cannot cut the file under the
	 * broker's mapping (a SIGBUS in the broker) */
	if (ftruncate(fds[0], (off_t) size) < 0 ||
	    fcntl(fds[0], F_ADD_SEALS,
		  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = -errno;
		goto err_fd;
	}
	mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (mem == MAP_FAILED) {
		rc = -errno;
		goto err_fd;
	}
	rc = kvb_seg_format(&w->seg, mem, size, sq, cq, w->id);
	if (rc)
		goto err_map;
	fds[2] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fds[2] < 0) {
		rc = -errno;
		goto err_map;
	}
	fds[1] = b->efd;
	w->seg_mem = mem;
	w->seg_size = size;
	w->efd = fds[2];
	return 0;

err_map:
	munmap(mem, size);
err_fd:
	close(fds[0]);
	return rc;
}

/* HELLO from pre-HELLO connection p: checked, moved to a worker slot,
 * answered with its segment; refused (status sent, connection closed). */
static void hello(struct kvb_broker *b, struct kvb_worker *p,
		  const struct kvb_msg_hello *m)
{
	struct kvb_msg_hello_reply rep = {.h.type = KVB_MSG_HELLO};
	uint32_t sq = m->sq_entries ? m->sq_entries : b->opt.sq_entries;
	uint32_t cq = m->cq_entries ? m->cq_entries : b->opt.cq_entries;
	int fds[3] = {-1, -1, -1};
	struct kvb_worker *w;
	int rc;

	rc = hello_check(b, p, m, sq, cq);
	if (rc) {
		hello_refuse(b, p, m, rc);
		return;
	}
	w = promote(b, p);
	if (!w) {
		log_warn_rl("refused HELLO from pid %d: %u workers attached "
			    "(--max-workers)",
			    (int) p->pid, b->opt.max_workers);
		hello_refuse(b, p, m, -ECONNREFUSED);
		return;
	}
	rc = make_segment(b, w, sq, cq, fds);
	if (rc) {
		hello_refuse(b, w, m, rc);
		return;
	}
	w->role = m->role;
	w->dp_rank = m->dp_rank;
	w->tp_rank = m->tp_rank;
	w->tp_size = m->tp_size;
	w->attached = 1;
	b->live[b->nlive++] = KVB_WSLOT(w->id);
	rep.worker_id = w->id;
	rep.seg_size = w->seg_size;
	reply(w, &rep.h, sizeof(rep), 0, fds, 3);
	close(fds[0]);
	b->st.workers_attached++;
	kvb_hook_worker_attached(b, w);
	log_info_rl("worker %u attached: pid %d role %s dp %u tp %u/%u", w->id,
		    (int) w->pid, w->role == KVB_ROLE_P ? "P" : "D", w->dp_rank,
		    w->tp_rank, w->tp_size);
}

/*
 * May w open (or be given) more transfers now? Not while its completions
 * pile up unread past --max-undelivered (-EAGAIN: reap, then retry).
 */
static int undelivered_check(struct kvb_broker *b, struct kvb_worker *w)
{
	if (w->ovf_len < b->opt.max_undelivered)
		return 0;
	b->st.undelivered_refused++;
	log_warn_rl("worker %u: request refused (-EAGAIN): %u completions "
		    "not reaped (--max-undelivered %u)",
		    w->id, w->ovf_len, b->opt.max_undelivered);
	return -EAGAIN;
}

/* OPEN, and each id of OPEN_BATCH: intern id[0..len) into *handle. */
static int xfer_open(struct kvb_broker *b, struct kvb_worker *w, const char *id,
		     uint32_t len, uint32_t *handle)
{
	struct kvb_xfer *x;
	int err = 0;

	if (len == 0 || len > KVB_XFER_ID_MAX)
		return -EINVAL;
	x = kvb_xfer_find(&b->xfers, w->id, id, len);
	if (!x && (err = kvb_xfer_admit(b, w, "transfer", id, len)))
		return err;
	if (!x)
		x = kvb_xfer_open(
			&b->xfers, w->id, id, len,
			kvb_now_ns() +
				(int64_t) b->opt.transfer_deadline_ms * 1000000,
			&err);
	if (!x)
		return err;
	/* an entry another worker's writes made for w is w's own now */
	kvb_xfer_charge(&b->xfers, x, w->id);
	x->opened = 1;
	*handle = kvb_xfer_handle(&b->xfers, x);
	return 0;
}

/*
 * OPEN_BATCH (proto.h): each id opened as by OPEN. Returns 0 with rep->n
 * results, -EINVAL for n out of range, or -EBADMSG when the ids do not fill
 * the message exactly (malformed: nothing was opened).
 */
static int open_batch(struct kvb_broker *b, struct kvb_worker *w,
		      const struct kvb_msg_open_batch *m, size_t len,
		      struct kvb_msg_open_batch_reply *rep)
{
	const uint8_t *p = (const uint8_t *) (m + 1), *q = p;
	const uint8_t *end = (const uint8_t *) m + len;

	if (m->n == 0 || m->n > KVB_OPEN_BATCH_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < m->n; i++) {
		if (q >= end || (size_t) (end - q - 1) < *q)
			return -EBADMSG;
		q += 1 + *q;
	}
	if (q != end)
		return -EBADMSG;
	for (uint32_t i = 0; i < m->n; i++) {
		rep->res[i].handle = 0;
		rep->res[i].status = xfer_open(b, w, (const char *) p + 1, *p,
					       &rep->res[i].handle);
		p += 1 + *p;
	}
	rep->n = m->n;
	return 0;
}

/*
 * XTIMEOUTS: a transfer's clocks (proto.h). The deadline counts from now;
 * 0 leaves a clock as it is.
 */
static int xfer_timeouts(struct kvb_broker *b, struct kvb_worker *w,
			 const struct kvb_msg_xtimeouts *m)
{
	struct kvb_xfer *x = kvb_xfer_get(&b->xfers, m->handle, w->id);
	const uint32_t max = 86400u * 1000u;

	if (m->deadline_ms > max || m->stall_ms > max || m->defer_ms > max)
		return -EINVAL;
	if (!x || x->closing)
		return -ESTALE;
	if (m->defer_ms && kvb_hook_set_defer(b, x, m->defer_ms))
		return -EINVAL; /* a same-node transfer has no defer clock */
	if (m->deadline_ms)
		x->deadline_ns =
			kvb_now_ns() + (int64_t) m->deadline_ms * 1000000;
	if (m->stall_ms)
		x->stall_ms = m->stall_ms;
	return 0;
}

static void reject(struct kvb_broker *b, struct kvb_worker *w, const char *why)
{
	b->st.messages_rejected++;
	kvb_worker_drop(b, w, why);
}

void kvb_ctl_reject(struct kvb_broker *b, struct kvb_worker *w, const char *why)
{
	reject(b, w, why);
}

/* recv said 0 bytes: the peer's end (1), or an empty message (0)? */
static int peer_hung_up(int sock)
{
	struct pollfd p = {.fd = sock, .events = POLLRDHUP};

	return poll(&p, 1, 0) > 0 &&
	       (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static union ctl_msg ctl_m;

static void close_fds(int *fds, unsigned *nfds)
{
	while (*nfds)
		close(fds[--*nfds]);
}

static void ctl_hello(struct kvb_broker *b, struct kvb_worker *w,
		      struct ctl_req *q)
{
	if (w->attached) {
		reject(b, w, "second HELLO");
		return;
	}
	hello(b, w, &q->m->hello);
}

static void ctl_open(struct kvb_broker *b, struct kvb_worker *w,
		     struct ctl_req *q)
{
	struct kvb_msg_open_reply rep = {.h.type = KVB_MSG_OPEN};
	int rc = undelivered_check(b, w);

	if (!rc)
		rc = xfer_open(b, w, q->m->open.id, q->m->open.id_len,
			       &rep.handle);
	reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

static void ctl_open_batch(struct kvb_broker *b, struct kvb_worker *w,
			   struct ctl_req *q)
{
	static union {
		struct kvb_msg_open_batch_reply r;
		char raw[sizeof(struct kvb_msg_open_batch_reply) +
			 KVB_OPEN_BATCH_MAX * sizeof(struct kvb_open_result)];
	} rep;
	int rc;

	memset(&rep.r, 0, sizeof(rep.r));
	rep.r.h.type = KVB_MSG_OPEN_BATCH;
	rc = undelivered_check(b, w);
	if (!rc)
		rc = open_batch(b, w, &q->m->open_batch, q->n, &rep.r);
	if (rc == -EBADMSG) {
		reject(b, w, "OPEN_BATCH: the ids do not fill the message");
		return;
	}
	reply(w, &rep.r.h, sizeof(rep.r) + rep.r.n * sizeof(rep.r.res[0]), rc,
	      NULL, 0);
}

/* XOPEN_BATCH (proto.h): each entry opened on its own by the cross-node
 * module; all of them -EAGAIN while w does not reap its completions. */
static void ctl_xopen_batch(struct kvb_broker *b, struct kvb_worker *w,
			    struct ctl_req *q)
{
	static union {
		struct kvb_msg_open_batch_reply r;
		char raw[sizeof(struct kvb_msg_open_batch_reply) +
			 KVB_XOPEN_BATCH_MAX * sizeof(struct kvb_open_result)];
	} rep;
	const struct kvb_msg_xopen_batch *m = &q->m->xopen_batch;
	int rc = 0, each;

	memset(&rep.r, 0, sizeof(rep.r));
	rep.r.h.type = KVB_MSG_XOPEN_BATCH;
	if (m->n == 0 || m->n > KVB_XOPEN_BATCH_MAX) {
		reply(w, &rep.r.h, sizeof(rep.r), -EINVAL, NULL, 0);
		return;
	}
	each = undelivered_check(b, w);
	if (!each)
		rc = kvb_hook_xopen_batch(b, w, m, (uint32_t) q->n, rep.r.res);
	if (rc == -EBADMSG) {
		reject(b, w,
		       "XOPEN_BATCH: the entries do not fill the message");
		return;
	}
	if (each || rc) /* refused as a whole: each entry says so */
		for (uint32_t i = 0; i < m->n; i++)
			rep.r.res[i] = (struct kvb_open_result){
				.status = each ? each : rc};
	rep.r.n = m->n;
	reply(w, &rep.r.h, sizeof(rep.r) + m->n * sizeof(rep.r.res[0]), 0, NULL,
	      0);
}

/* XEXPECT (proto.h): each id taken on its own by the cross-node module. */
static void ctl_xexpect(struct kvb_broker *b, struct kvb_worker *w,
			struct ctl_req *q)
{
	static union {
		struct kvb_msg_open_batch_reply r;
		char raw[sizeof(struct kvb_msg_open_batch_reply) +
			 KVB_XEXPECT_MAX * sizeof(struct kvb_open_result)];
	} rep;
	const struct kvb_msg_xexpect *m = &q->m->xexpect;
	int rc;

	memset(&rep.r, 0, sizeof(rep.r));
	rep.r.h.type = KVB_MSG_XEXPECT;
	if (m->n == 0 || m->n > KVB_XEXPECT_MAX ||
	    (m->flags & ~KVB_XEXPECT_F_WITHDRAW)) {
		reply(w, &rep.r.h, sizeof(rep.r), -EINVAL, NULL, 0);
		return;
	}
	rc = kvb_hook_expect(b, w, m, (uint32_t) q->n, rep.r.res);
	if (rc == -EBADMSG) {
		reject(b, w, "XEXPECT: the ids do not fill the message");
		return;
	}
	if (rc)
		for (uint32_t i = 0; i < m->n; i++)
			rep.r.res[i] = (struct kvb_open_result){.status = rc};
	rep.r.n = m->n;
	reply(w, &rep.r.h, sizeof(rep.r) + m->n * sizeof(rep.r.res[0]), 0, NULL,
	      0);
}

static void ctl_stats(struct kvb_broker *b, struct kvb_worker *w,
		      struct ctl_req *q)
{
	static char buf[KVB_MSG_MAX];
	struct kvb_msg_hdr *h = (struct kvb_msg_hdr *) buf;
	int rc = kvb_view_format(b, q->m->stats.view, q->m->stats.json,
				 buf + sizeof(*h), sizeof(buf) - sizeof(*h));
	size_t len = rc < 0 ? 0 : (size_t) rc;

	h->type = KVB_MSG_STATS;
	reply(w, h, sizeof(*h) + len + 1, rc < 0 ? rc : 0, NULL, 0);
	w->asked_stats = !w->attached;
}

static void ctl_mem_kv(struct kvb_broker *b, struct kvb_worker *w,
		       struct ctl_req *q)
{
	int rc = kvb_hook_mem_kv(b, w, &q->m->kv);

	reply(w, &q->m->h, sizeof(q->m->h), rc, NULL, 0);
}

static void ctl_peer(struct kvb_broker *b, struct kvb_worker *w,
		     struct ctl_req *q)
{
	struct kvb_msg_peer_reply rep = {.h.type = KVB_MSG_PEER};
	int rc;

	peer_seq[KVB_WSLOT(w->id)] = q->m->h.seq;
	rc = kvb_hook_peer_req(b, w, &q->m->peer);
	if (rc != 1) /* 1: the handshake answers later */
		reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

static void ctl_xopen(struct kvb_broker *b, struct kvb_worker *w,
		      struct ctl_req *q)
{
	struct kvb_msg_open_reply rep = {.h.type = KVB_MSG_XOPEN};
	const struct kvb_msg_xopen *m = &q->m->xopen;
	/* a bad length is the hook's to refuse */
	uint32_t len = m->id_len <= KVB_XFER_ID_MAX ? m->id_len : 0;
	int rc = undelivered_check(b, w);

	/* an id it holds already (a message's, or a duplicate the hook
	 * refuses) takes no entry */
	if (!rc && len && !kvb_xfer_find(&b->xfers, w->id, m->id, len))
		rc = kvb_xfer_admit(b, w, "remote transfer", m->id, len);
	if (!rc)
		rc = kvb_hook_xopen(b, w, m, (uint32_t) q->n, &rep.handle);
	reply(w, &rep.h, sizeof(rep), rc, NULL, 0);
}

static void ctl_xtimeouts(struct kvb_broker *b, struct kvb_worker *w,
			  struct ctl_req *q)
{
	int rc = xfer_timeouts(b, w, &q->m->xt);

	reply(w, &q->m->h, sizeof(q->m->h), rc, NULL, 0);
}

static void ctl_bye(struct kvb_broker *b, struct kvb_worker *w,
		    struct ctl_req *q)
{
	reply(w, &q->m->h, sizeof(q->m->h), 0, NULL, 0);
	kvb_worker_drop(b, w, "detached");
}

/*
 * The control requests: the handler of each type and the size its message
 * must have (exactly, or at least with `min`; 0: the handler checks it).
 */
static const struct ctl_type {
	void (*fn)(struct kvb_broker *b, struct kvb_worker *w,
		   struct ctl_req *q);
	size_t size;
	uint8_t min;
} ctl_types[] = {
	[KVB_MSG_HELLO] = {ctl_hello, sizeof(struct kvb_msg_hello), 0},
	[KVB_MSG_MEM_REG] = {kvb_ctl_mem_reg, 0, 0},
	[KVB_MSG_MEM_DEREG] = {kvb_ctl_mem_dereg,
			       sizeof(struct kvb_msg_mem_dereg), 0},
	[KVB_MSG_MEM_LOOKUP] = {kvb_ctl_mem_lookup,
				sizeof(struct kvb_msg_mem_lookup), 0},
	[KVB_MSG_OPEN] = {ctl_open, sizeof(struct kvb_msg_open), 0},
	[KVB_MSG_OPEN_BATCH] = {ctl_open_batch,
				sizeof(struct kvb_msg_open_batch), 1},
	[KVB_MSG_STATS] = {ctl_stats, sizeof(struct kvb_msg_stats), 0},
	[KVB_MSG_MEM_KV] = {ctl_mem_kv, sizeof(struct kvb_msg_mem_kv), 0},
	[KVB_MSG_PEER] = {ctl_peer, sizeof(struct kvb_msg_peer), 0},
	[KVB_MSG_XOPEN] = {ctl_xopen, sizeof(struct kvb_msg_xopen), 1},
	[KVB_MSG_XTIMEOUTS] = {ctl_xtimeouts, sizeof(struct kvb_msg_xtimeouts),
			       0},
	[KVB_MSG_BYE] = {ctl_bye, sizeof(struct kvb_msg_hdr), 0},
	[KVB_MSG_XOPEN_BATCH] = {ctl_xopen_batch,
				 sizeof(struct kvb_msg_xopen_batch), 1},
	[KVB_MSG_MEM_ALIAS] = {kvb_ctl_mem_alias,
			       sizeof(struct kvb_msg_mem_alias), 0},
	[KVB_MSG_XEXPECT] = {ctl_xexpect, sizeof(struct kvb_msg_xexpect), 1},
};

/*
 * Receive one request and check its header: its length (0) or, when it
 * was answered or the worker dropped already, a negative value.
 */
static int ctl_read(struct kvb_broker *b, struct kvb_worker *w,
		    struct ctl_req *q)
{
	int n;

	n = kvb_ctl_recv(w->sock, q->m, sizeof(*q->m), q->fds, &q->nfds);
	if (n == -ETIMEDOUT || n == -EAGAIN)
		return -1;
	if (n == -EPIPE && !peer_hung_up(w->sock)) {
		/* a zero-length message (SOCK_SEQPACKET), not the end */
		b->st.ctl_empty++;
		close_fds(q->fds, &q->nfds);
		reject(b, w, "zero-length message on the control socket");
		return -1;
	}
	if (n < 0) {
		close_fds(q->fds, &q->nfds);
		if (n == -EMSGSIZE)
			reject(b, w, "oversized message on the control socket");
		else
			kvb_worker_drop(b, w,
					n == -EPIPE ? "disconnected"
						    : strerror(-n));
		return -1;
	}
	if ((size_t) n < sizeof(q->m->h) || q->m->h.magic != KVB_MSG_MAGIC ||
	    q->m->h.len != (uint32_t) n) {
		close_fds(q->fds, &q->nfds);
		reject(b, w,
		       "garbage on the control socket (bad magic or length)");
		return -1;
	}
	req_seq = q->m->h.seq; /* echoed by reply() */
	if (q->m->h.version != KVB_PROTO_VERSION) {
		char why[96];

		close_fds(q->fds, &q->nfds);
		snprintf(why, sizeof(why),
			 "protocol version %u, this broker speaks %u",
			 q->m->h.version, KVB_PROTO_VERSION);
		reply(w, &q->m->h, sizeof(q->m->h), -EPROTO, NULL, 0);
		reject(b, w, why);
		return -1;
	}
	q->n = (size_t) n;
	return 0;
}

void kvb_worker_ctl(struct kvb_broker *b, struct kvb_worker *w)
{
	int fds[KVB_CTL_MAX_FDS];
	struct ctl_req q = {.m = &ctl_m, .fds = fds, .nfds = KVB_CTL_MAX_FDS};
	const struct ctl_type *t = NULL;
	uint32_t type;

	if (ctl_read(b, w, &q))
		return;
	type = q.m->h.type;
	if (type != KVB_MSG_STATS)
		b->st.ctl_requests++;
	/* only MEM_REG carries an fd */
	if (type != KVB_MSG_MEM_REG)
		close_fds(q.fds, &q.nfds);
	if (!w->attached && type != KVB_MSG_HELLO && type != KVB_MSG_STATS) {
		close_fds(q.fds, &q.nfds); /* a MEM_REG's fd is still open */
		if (type == KVB_MSG_MEM_REG)
			b->st.mem_reg_refused++;
		reject(b, w, "request before HELLO");
		return;
	}
	if (type < sizeof(ctl_types) / sizeof(ctl_types[0]))
		t = &ctl_types[type];
	if (!t || !t->fn) {
		reject(b, w, "unknown control message type");
		return;
	}
	if (t->size && (t->min ? q.n < t->size : q.n != t->size)) {
		reject(b, w, "control message of the wrong size");
		return;
	}
	t->fn(b, w, &q);
}

void kvb_worker_drop(struct kvb_broker *b, struct kvb_worker *w,
		     const char *why)
{
	if (!w->id)
		return;
	if (w->attached) {
		if (strcmp(why, "detached"))
			b->st.workers_lost++;
		kvb_log_rl_keyed(why, KVB_LOG_INFO, "worker %u (pid %d) %s",
				 w->id, (int) w->pid, why);
		kvb_engine_worker_gone(b, w);
		for (uint32_t i = 0; i < b->nlive; i++)
			if (b->live[i] == KVB_WSLOT(w->id)) {
				b->live[i] = b->live[--b->nlive];
				break;
			}
		b->st.worker_late_wakes_gone += atomic_load_explicit(
			&w->seg.hdr->worker_late_wakes, memory_order_relaxed);
		munmap(w->seg_mem, w->seg_size);
		close(w->efd);
	} else {
		/* kvbctl's routine query and hang-up: debug, not info */
		int quiet = w->asked_stats && !strcmp(why, "disconnected");

		kvb_log_rl_keyed(why, quiet ? KVB_LOG_DEBUG : KVB_LOG_INFO,
				 "connection from pid %d closed: %s",
				 (int) w->pid, why);
	}
	epoll_ctl(b->epfd, EPOLL_CTL_DEL, w->sock, NULL);
	close(w->sock);
	if (is_pending(b, w)) {
		w->id = 0;
		b->npending--;
		return;
	}
	free(w->ovf);
	kvb_hook_worker_free(b, w);
	w->id = 0;
	w->attached = 0;
	b->nworkers--;
}

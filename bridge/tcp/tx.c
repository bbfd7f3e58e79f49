// SPDX-License-Identifier: MIT
/*
 * Send queue of one connection: frames whose payload points straight into
 * registered memory. _kvb_tcp_txq_send() gathers as much of the queue as
 * fits TCP_IOV_MAX iovecs into one sendmsg and advances by what the socket
 * took; the rest stays queued for the next call (from poll()).
 *
 * GPU memory cannot be handed to the socket: its payload is copied by the
 * gpu runtime into the queue's staging buffer (TCP_STAGE bytes) just before
 * it is sent, and the iovecs point there. The buffer holds one run of
 * stream bytes, kept until the socket took them (a partial send resends
 * from it without copying again); a sendmsg stops at GPU bytes that do not
 * fit, so the copies stay bounded whatever is queued.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_api.h"
#include "tcp/tcp_priv.h"

void _kvb_tcp_txq_init(struct tcp_txq *q, tcp_drop_fn drop, void *owner)
{
	memset(q, 0, sizeof(*q));
	q->drop = drop;
	q->owner = owner;
}

struct tcp_frame *_kvb_tcp_frame_new(unsigned nseg, uint32_t meta_len,
				     uint32_t trailer_len)
{
	struct tcp_frame *f;

	f = calloc(1, sizeof(*f) + nseg * sizeof(f->seg[0]) + meta_len +
			      trailer_len);
	if (!f)
		return NULL;
	f->nseg = nseg;
	f->meta = (uint8_t *) &f->seg[nseg];
	f->meta_len = meta_len;
	f->trailer = trailer_len ? f->meta + meta_len : NULL;
	f->trailer_len = trailer_len;
	return f;
}

void _kvb_tcp_txq_push(struct tcp_txq *q, struct tcp_frame *f)
{
	q->queued += (uint64_t) f->meta_len + f->trailer_len;
	for (unsigned i = 0; i < f->nseg; i++)
		q->queued += f->seg[i].len;
	f->next = NULL;
	if (q->tail)
		q->tail->next = f;
	else
		q->head = f;
	q->tail = f;
	q->n++;
}

static void txq_pop(struct tcp_txq *q)
{
	struct tcp_frame *f = q->head;

	q->head = f->next;
	if (!q->head)
		q->tail = NULL;
	q->n--;
	free(f);
}

void _kvb_tcp_txq_clear(struct tcp_txq *q)
{
	while (q->head)
		txq_pop(q);
	q->queued = q->sent = 0;
	free(q->stage);
	q->stage = NULL;
	q->stage_lo = q->stage_hi = 0;
}

static uint64_t part_len(const struct tcp_frame *f, unsigned p)
{
	if (p == 0)
		return f->meta_len;
	if (p <= f->nseg)
		return f->seg[p - 1].len;
	return f->trailer_len;
}

/* Start of part p; NULL for a payload that is now zeros. */
static const char *part_base(const struct tcp_frame *f, unsigned p)
{
	if (p == 0)
		return (const char *) f->meta;
	if (p <= f->nseg)
		return f->seg[p - 1].base;
	return (const char *) f->trailer;
}

static void txq_advance(struct tcp_txq *q, uint64_t n)
{
	while (q->head) {
		struct tcp_frame *f = q->head;

		while (f->part <= f->nseg + 1) {
			uint64_t left = part_len(f, f->part) - f->done;

			if (n < left) {
				f->done += n;
				return;
			}
			n -= left;
			f->part++;
			f->done = 0;
		}
		txq_pop(q);
	}
}

/* The GPU region part p's payload is in, or NULL. */
static const struct kvb_mr *part_gpu(const struct tcp_frame *f, unsigned p)
{
	const struct tcp_seg *s;

	if (p == 0 || p > f->nseg)
		return NULL;
	s = &f->seg[p - 1];
	return s->base && s->mr && s->mr->kind == KVB_MEM_GPU ? s->mr : NULL;
}

/*
 * The iovec for GPU payload at stream position `pos` (offset `off` of part
 * p): bytes the stage holds already, else copied into it now. Returns the
 * bytes it covers, 0 when the stage holds unsent bytes of another run (send
 * those first), or -errno when the copy failed.
 */
static int64_t stage_piece(struct tcp_transport *tt, struct tcp_txq *q,
			   const struct tcp_frame *f, unsigned p, uint64_t off,
			   uint64_t pos, struct iovec *iov)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	uint64_t c = part_len(f, p) - off;
	int rc;

	if (pos >= q->stage_lo && pos < q->stage_hi) {
		if (c > q->stage_hi - pos)
			c = q->stage_hi - pos;
		iov->iov_base = q->stage + (pos - q->stage_lo);
		iov->iov_len = c;
		return (int64_t) c;
	}
	/* nothing staged is unsent, or nothing before pos is in this
	 * sendmsg (pos == sent): the stage starts afresh at pos */
	if (q->sent >= q->stage_hi || pos == q->sent)
		q->stage_lo = q->stage_hi = pos;
	else if (pos != q->stage_hi || q->stage_hi - q->stage_lo == TCP_STAGE)
		return 0;
	if (c > TCP_STAGE - (q->stage_hi - q->stage_lo))
		c = TCP_STAGE - (q->stage_hi - q->stage_lo);
	if (!q->stage) {
		q->stage = malloc(TCP_STAGE);
		if (!q->stage)
			return -ENOMEM;
	}
	rc = g ? g->memcpy(g, q->stage + (q->stage_hi - q->stage_lo),
			   part_base(f, p) + off, c, KVB_GPU_D2H)
	       : -ENODEV;
	if (rc)
		return rc < 0 ? rc : -EIO;
	iov->iov_base = q->stage + (q->stage_hi - q->stage_lo);
	iov->iov_len = c;
	q->stage_hi += c;
	tt->st.gpu_tx_bytes += c;
	return (int64_t) c;
}

int64_t _kvb_tcp_txq_send(struct tcp_transport *tt, struct tcp_txq *q, int fd)
{
	struct iovec *iov = tt->iov;
	uint64_t pos = q->sent;
	struct msghdr msg;
	struct tcp_frame *f;
	unsigned n = 0;
	ssize_t rc;

	for (f = q->head; f && n < TCP_IOV_MAX; f = f->next) {
		uint64_t off = f->done;
		unsigned p;

		for (p = f->part; p <= f->nseg + 1 && n < TCP_IOV_MAX;
		     p++, off = 0) {
			uint64_t len = part_len(f, p);
			const char *base = part_base(f, p);

			if (len <= off)
				continue;
			if (base && part_gpu(f, p)) {
				struct tcp_seg *s = &f->seg[p - 1];
				int64_t c = stage_piece(tt, q, f, p, off, pos,
							&iov[n]);

				if (c > 0) {
					n++;
					pos += (uint64_t) c;
					if ((uint64_t) c < len - off)
						goto send; /* rest: the stage */
					continue;
				}
				if (!c)
					goto send;
				/* not copied: zeros go instead, the op fails */
				tt->st.gpu_copy_errors++;
				s->base = NULL;
				s->mr = NULL;
				base = NULL;
				if (q->drop)
					q->drop(q->owner, f, s->ref, -EIO);
			}
			if (base) {
				iov[n].iov_base = (void *) (base + off);
				iov[n++].iov_len = len - off;
				pos += len - off;
				continue;
			}
			while (off < len && n < TCP_IOV_MAX) {
				uint64_t c = len - off;

				if (c > TCP_ZBUF)
					c = TCP_ZBUF;
				iov[n].iov_base = tt->zeros;
				iov[n++].iov_len = c;
				off += c;
				pos += c;
			}
		}
	}
send:
	if (!n)
		return 0;
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = iov;
	msg.msg_iovlen = n;
	tt->st.writev_calls++;
	do
		rc = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return errno == EPIPE ? -ECONNRESET : -errno;
	}
	tt->st.bytes_tx += (uint64_t) rc;
	q->sent += (uint64_t) rc;
	txq_advance(q, (uint64_t) rc);
	return rc;
}

void _kvb_tcp_txq_drop_mr(struct tcp_txq *q, struct kvb_mr *mr)
{
	struct tcp_frame *f;
	unsigned i;

	for (f = q->head; f; f = f->next)
		for (i = 0; i < f->nseg; i++) {
			struct tcp_seg *s = &f->seg[i];

			/* part i + 1 is this seg; below f->part it is sent */
			if (s->mr != mr || f->part > i + 1)
				continue;
			s->base = NULL;
			s->mr = NULL;
			if (q->drop)
				q->drop(q->owner, f, s->ref, -ENOENT);
		}
}

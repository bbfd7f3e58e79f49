// SPDX-License-Identifier: MIT
/*
 * Send queue of one connection: frames whose payload points straight into
 * registered memory. _kvb_tcp_txq_send() gathers as much of the queue as
 * fits TCP_IOV_MAX iovecs into one sendmsg and advances by what the socket
 * took; the rest stays queued for the next call (from poll()).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tcp/tcp_priv.h"

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

int64_t _kvb_tcp_txq_send(struct tcp_transport *tt, struct tcp_txq *q, int fd)
{
	struct iovec *iov = tt->iov;
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
			if (base) {
				iov[n].iov_base = (void *) (base + off);
				iov[n++].iov_len = len - off;
				continue;
			}
			while (off < len && n < TCP_IOV_MAX) {
				uint64_t c = len - off;

				if (c > TCP_ZBUF)
					c = TCP_ZBUF;
				iov[n].iov_base = tt->zeros;
				iov[n++].iov_len = c;
				off += c;
			}
		}
	}
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

void _kvb_tcp_txq_drop_mr(struct tcp_txq *q, struct kvb_mr *mr,
			  void (*drop)(void *owner, struct tcp_frame *f,
				       uint32_t ref),
			  void *owner)
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
			drop(owner, f, s->ref);
		}
}

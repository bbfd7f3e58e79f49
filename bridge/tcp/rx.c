// SPDX-License-Identifier: MIT
/*
 * The receive state machine of one connection, used by both roles:
 *
 *   HDR (24 bytes) -> RECS (count x 32) -> PAY (items) -> [TRAILER] -> HDR
 *
 * The owner validates the header (EV_HDR) and the records (EV_RECS) and
 * decides, per item, where its payload lands (a region, or the discard
 * buffer) before a byte of payload is read. Each readv covers a contiguous
 * prefix of what the stream holds next: the rest of the payloads straight
 * into their destinations, then the trailer and the next header, so a
 * stream of frames costs about one syscall per frame.
 *
 * An item that lands in GPU memory is read into the connection's staging
 * buffer instead, up to TCP_STAGE bytes at a time (a readv ends there),
 * and copied to the device by the gpu runtime when the buffer is full or
 * the item complete. A copy that fails discards the rest of the item and
 * gives it -EIO.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gpu_api.h"
#include "tcp/tcp_priv.h"

int _kvb_tcp_rx_init(struct tcp_rx *rx)
{
	memset(rx, 0, sizeof(*rx));
	rx->rbuf = malloc(KVB_TCP_MAX_RECS * KVB_TCP_REC_LEN);
	rx->items = malloc(KVB_TCP_MAX_RECS * sizeof(*rx->items));
	rx->tbuf = malloc(KVB_TCP_TRAILER_MAX);
	if (!rx->rbuf || !rx->items || !rx->tbuf) {
		_kvb_tcp_rx_free(rx);
		return -ENOMEM;
	}
	return 0;
}

void _kvb_tcp_rx_free(struct tcp_rx *rx)
{
	free(rx->rbuf);
	free(rx->items);
	free(rx->tbuf);
	free(rx->stage);
	rx->rbuf = NULL;
	rx->items = NULL;
	rx->tbuf = NULL;
	rx->stage = NULL;
}

void _kvb_tcp_rx_reset(struct tcp_rx *rx)
{
	rx->st = RX_HDR;
	rx->hgot = 0;
	rx->n = 0;
	rx->cur = 0;
	rx->staged = 0;
}

static int item_gpu(const struct tcp_item *it)
{
	return it->dst && it->mr && it->mr->kind == KVB_MEM_GPU;
}

/* The item will not land: the rest of its payload is discarded. */
static void item_discard(struct tcp_rx *rx, struct tcp_item *it, int status)
{
	if (it == &rx->items[rx->cur])
		rx->staged = 0;
	it->dst = NULL;
	it->mr = NULL;
	if (!it->rec.status)
		it->rec.status = status;
}

/* Copy the staged bytes of the current item to the device. */
static void stage_flush(struct tcp_transport *tt, struct tcp_rx *rx,
			struct tcp_item *it)
{
	const struct kvb_gpu_api *g = kvb_gpu_backend();
	uint64_t n = rx->staged;
	int rc;

	rc = g ? g->memcpy(g, it->dst + (it->got - n), rx->stage, n,
			   KVB_GPU_H2D)
	       : -ENODEV;
	rx->staged = 0;
	if (!rc) {
		tt->st.gpu_rx_bytes += n;
		return;
	}
	tt->st.gpu_copy_errors++;
	item_discard(rx, it, -EIO);
}

void _kvb_tcp_rx_begin_recs(struct tcp_rx *rx)
{
	rx->rlen = (uint32_t) rx->h.count * KVB_TCP_REC_LEN;
	rx->rgot = 0;
	rx->hgot = 0; /* the next header will be read from byte 0 */
	rx->st = RX_RECS;
}

void _kvb_tcp_rx_begin_pay(struct tcp_rx *rx, unsigned n, int trailer)
{
	rx->n = n;
	rx->cur = 0;
	rx->tlen = trailer ? kvb_tcp_trailer_len(n) : 0;
	rx->tgot = 0;
	rx->st = RX_PAY;
}

void _kvb_tcp_rx_drop_mr(struct tcp_rx *rx, struct kvb_mr *mr)
{
	unsigned i;

	if (rx->st != RX_PAY)
		return;
	for (i = rx->cur; i < rx->n; i++) {
		struct tcp_item *it = &rx->items[i];

		if (it->mr != mr)
			continue;
		item_discard(rx, it, -ENOENT);
	}
}

unsigned _kvb_tcp_rx_drop_if(struct tcp_rx *rx,
			     int (*ok)(void *arg, const struct tcp_item *it),
			     void *arg, int status)
{
	unsigned i, n = 0;

	if (rx->st != RX_PAY)
		return 0;
	for (i = rx->cur; i < rx->n; i++) {
		struct tcp_item *it = &rx->items[i];

		if (!it->dst || it->got == it->rec.len || ok(arg, it))
			continue;
		item_discard(rx, it, status);
		n++;
	}
	return n;
}

/* Fill tt->iov with what comes next in the stream; returns the count. */
static unsigned rx_iov(struct tcp_transport *tt, struct tcp_rx *rx,
		       uint64_t budget)
{
	struct iovec *iov = tt->iov;
	unsigned n = 0, i;

	switch (rx->st) {
	case RX_HDR:
		iov[0].iov_base = rx->hbuf + rx->hgot;
		iov[0].iov_len = KVB_TCP_HDR_LEN - rx->hgot;
		return 1;
	case RX_RECS:
		iov[0].iov_base = rx->rbuf + rx->rgot;
		iov[0].iov_len = rx->rlen - rx->rgot;
		return 1;
	case RX_PAY:
		for (i = rx->cur; i < rx->n; i++) {
			struct tcp_item *it = &rx->items[i];
			uint64_t off = it->got;

			if (off < it->rec.len && item_gpu(it) && !rx->stage) {
				rx->stage = malloc(TCP_STAGE);
				if (!rx->stage)
					item_discard(rx, it, -ENOMEM);
			}
			while (off < it->rec.len) {
				uint64_t c = it->rec.len - off;

				if (n == TCP_IOV_MAX - 2 || !budget)
					return n;
				if (c > budget)
					c = budget;
				if (item_gpu(it)) {
					/* the stage holds this item only
					 * (rx->staged is 0 unless it is the
					 * current one): the readv ends here */
					if (c > TCP_STAGE - rx->staged)
						c = TCP_STAGE - rx->staged;
					iov[n].iov_base =
						rx->stage + rx->staged;
					iov[n++].iov_len = c;
					return n;
				}
				if (it->dst) {
					iov[n].iov_base = it->dst + off;
				} else {
					if (c > TCP_ZBUF)
						c = TCP_ZBUF;
					iov[n].iov_base = tt->scratch;
				}
				iov[n++].iov_len = c;
				off += c;
				budget -= c;
			}
		}
		if (rx->tlen) {
			iov[n].iov_base = rx->tbuf;
			iov[n++].iov_len = rx->tlen;
		}
		break;
	case RX_TRAILER:
		iov[n].iov_base = rx->tbuf + rx->tgot;
		iov[n++].iov_len = rx->tlen - rx->tgot;
		break;
	}
	iov[n].iov_base = rx->hbuf;
	iov[n++].iov_len = KVB_TCP_HDR_LEN;
	return n;
}

static size_t min_sz(size_t a, uint64_t b)
{
	return (uint64_t) a < b ? a : (size_t) b;
}

/*
 * Account up to n bytes that landed where rx_iov() said; stop after the
 * first event. Returns the bytes accounted (may be 0 with an event).
 */
static size_t rx_eat(struct tcp_transport *tt, struct tcp_rx *rx, size_t n,
		     enum tcp_rx_ev *ev, unsigned *idx)
{
	struct tcp_item *it;
	size_t k;

	*ev = EV_NONE;
	switch (rx->st) {
	case RX_HDR:
		k = min_sz(n, KVB_TCP_HDR_LEN - rx->hgot);
		rx->hgot += (unsigned) k;
		if (rx->hgot == KVB_TCP_HDR_LEN)
			*ev = EV_HDR;
		return k;
	case RX_RECS:
		k = min_sz(n, rx->rlen - rx->rgot);
		rx->rgot += (uint32_t) k;
		if (rx->rgot == rx->rlen)
			*ev = EV_RECS;
		return k;
	case RX_PAY:
		if (rx->cur < rx->n) {
			it = &rx->items[rx->cur];
			k = min_sz(n, it->rec.len - it->got);
			it->got += k;
			if (item_gpu(it)) {
				rx->staged += k;
				/* (a zero-length item has nothing to copy) */
				if (rx->staged && (rx->staged == TCP_STAGE ||
						   it->got == it->rec.len))
					stage_flush(tt, rx, it);
			}
			if (it->got == it->rec.len) {
				*ev = EV_ITEM;
				*idx = rx->cur++;
			}
			return k;
		}
		if (!rx->tlen) {
			rx->st = RX_HDR;
			*ev = EV_FRAME;
			return 0;
		}
		rx->st = RX_TRAILER;
		/* fall through */
	case RX_TRAILER:
		k = min_sz(n, rx->tlen - rx->tgot);
		rx->tgot += (uint32_t) k;
		if (rx->tgot == rx->tlen) {
			rx->st = RX_HDR;
			*ev = EV_FRAME;
		}
		return k;
	}
	return 0;
}

int _kvb_tcp_rx_pump(struct tcp_transport *tt, struct tcp_rx *rx, int fd,
		     int (*on)(void *owner, enum tcp_rx_ev ev, unsigned idx),
		     void *owner, uint64_t *progress)
{
	int stop = 0;

	while (!stop) {
		enum tcp_rx_ev ev;
		size_t want = 0, left;
		unsigned niov, i, idx = 0;
		ssize_t r;
		int rc;

		if (!tt->rx_budget)
			return 0;
		niov = rx_iov(tt, rx, tt->rx_budget);
		for (i = 0; i < niov; i++)
			want += tt->iov[i].iov_len;
		r = readv(fd, tt->iov, (int) niov);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		if (r == 0)
			return -ECONNRESET;
		tt->st.bytes_rx += (uint64_t) r;
		tt->rx_budget -= (uint64_t) r < tt->rx_budget ? (uint64_t) r
							      : tt->rx_budget;
		if (progress)
			*progress = tcp_now();
		left = (size_t) r;
		for (;;) {
			left -= rx_eat(tt, rx, left, &ev, &idx);
			if (ev == EV_NONE) {
				if (!left)
					break;
				continue;
			}
			if (ev == EV_FRAME)
				tt->st.frames_rx++;
			rc = on(owner, ev, idx);
			if (rc < 0)
				return rc;
			stop |= rc;
		}
		if ((size_t) r < want)
			return 0;
	}
	return 0;
}

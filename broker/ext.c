/* SPDX-License-Identifier: MIT */
/*
 * The engine's extension point: the hooks a module that extends the
 * engine registers (broker.h, struct kvb_engine_hooks), the fds it adds to
 * the daemon's epoll set; and the engine's clock.
 */
#include <errno.h>
#include <sys/epoll.h>
#include <time.h>

#include "broker.h"

void kvb_engine_set_hooks(struct kvb_broker *b,
			  const struct kvb_engine_hooks *h, void *ctx)
{
	b->hooks = h;
	b->hooks_ctx = h ? ctx : NULL;
	b->xfers.rx_free = h ? h->rx_free : NULL;
	b->xfers.rx_ctx = h ? ctx : NULL;
}

uint32_t kvb_dest_bind(struct kvb_broker *b, unsigned ts, uint32_t slot,
		       struct kvb_transport *tr, struct kvb_ep *ep)
{
	uint32_t di = ts * b->opt.max_workers + slot;

	b->dests[di].tr = tr;
	b->dests[di].ep = ep;
	return di;
}

void kvb_dest_fail(struct kvb_broker *b, unsigned ts, uint32_t slot, int status)
{
	struct kvb_dest *d = &b->dests[ts * b->opt.max_workers + slot];

	for (uint32_t i = 0; i < d->n; i++)
		kvb_complete_inflight(b, (uint32_t) d->ops[i].cookie, status);
	d->n = 0;
}

int kvb_engine_watch_fd(struct kvb_broker *b, int fd, uint64_t tag)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};

	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

void kvb_engine_unwatch_fd(struct kvb_broker *b, int fd)
{
	if (fd >= 0)
		epoll_ctl(b->epfd, EPOLL_CTL_DEL, fd, NULL);
}

void kvb_engine_hooks_fini(struct kvb_broker *b)
{
	if (b->hooks && b->hooks->fini)
		b->hooks->fini(b);
	b->hooks = NULL;
	b->hooks_ctx = NULL;
	b->xfers.rx_ctx = NULL;
}

int64_t kvb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

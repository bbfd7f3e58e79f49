/* SPDX-License-Identifier: MIT */
/* What every transport shares (transport.h): its kvb_mr.tpriv[] slot, and
 * the printf of its stats_format(). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "transport.h"

static const struct kvb_transport_ops *tpriv_owner[KVB_TPRIV_MAX];

int kvb_transport_tpriv(const struct kvb_transport_ops *ops)
{
	for (int i = 0; i < KVB_TPRIV_MAX; i++) {
		const struct kvb_transport_ops *cur =
			__atomic_load_n(&tpriv_owner[i], __ATOMIC_ACQUIRE);

		if (!cur && __atomic_compare_exchange_n(
				    &tpriv_owner[i], &cur, ops, 0,
				    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return i;
		if (cur == ops)
			return i;
	}
	return -ENOSPC;
}

void kvb_transport_vput(char *buf, size_t cap, size_t *len, const char *fmt,
			va_list ap)
{
	int n;

	if (*len + 1 >= cap)
		return;
	n = vsnprintf(buf + *len, cap - *len, fmt, ap);
	if (n > 0)
		*len += (size_t) n < cap - *len ? (size_t) n : cap - *len - 1;
}

void kvb_transport_put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvb_transport_vput(buf, cap, len, fmt, ap);
	va_end(ap);
}

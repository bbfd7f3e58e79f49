/* SPDX-License-Identifier: MIT */
/* A worker by hand: see raw_worker.h. */
#include "raw_worker.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"

int raw_worker_attach(struct raw_worker *w, const char *sock_path)
{
	struct kvb_msg_hello m;
	struct kvb_msg_hello_reply rep;
	int fds[KVB_CTL_MAX_FDS];
	unsigned nfds = KVB_CTL_MAX_FDS, i;
	int n, rc;

	memset(w, 0, sizeof(*w));
	w->sock = w->efd_broker = w->efd_worker = -1;
	w->sock = kvb_ctl_connect(sock_path, 3000);
	if (w->sock < 0) {
		rc = w->sock;
		w->sock = -1;
		return rc;
	}
	kvb_msg_init(&m.h, KVB_MSG_HELLO, sizeof(m));
	m.role = KVB_ROLE_P;
	m.tp_size = 1;
	m.pid = (uint32_t) getpid();
	rc = kvb_ctl_send(w->sock, &m, sizeof(m), NULL, 0);
	if (rc)
		goto fail;
	n = kvb_ctl_recv(w->sock, &rep, sizeof(rep), fds, &nfds);
	rc = kvb_ctl_check_reply(&rep.h, n, KVB_MSG_HELLO, sizeof(rep));
	if (!rc && nfds != 3)
		rc = -EPROTO;
	if (rc) {
		for (i = 0; n >= 0 && i < nfds; i++)
			close(fds[i]);
		goto fail;
	}
	w->mem_len = rep.seg_size;
	w->mem = mmap(NULL, w->mem_len, PROT_READ | PROT_WRITE, MAP_SHARED,
		      fds[0], 0);
	close(fds[0]);
	w->efd_broker = fds[1];
	w->efd_worker = fds[2];
	if (w->mem == MAP_FAILED) {
		w->mem = NULL;
		rc = -errno;
		goto fail;
	}
	rc = kvb_seg_attach(&w->seg, w->mem, w->mem_len);
	if (!rc)
		return 0;
fail:
	raw_worker_close(w);
	return rc;
}

int raw_worker_open(struct raw_worker *w, const char *id, uint32_t *handle)
{
	struct kvb_msg_open m;
	struct kvb_msg_open_reply rep;
	size_t len = strlen(id);
	int n, rc;

	if (len > KVB_XFER_ID_MAX)
		return -EINVAL;
	kvb_msg_init(&m.h, KVB_MSG_OPEN, sizeof(m));
	m.id_len = (uint32_t) len;
	memcpy(m.id, id, len);
	rc = kvb_ctl_send(w->sock, &m, sizeof(m), NULL, 0);
	if (rc)
		return rc;
	n = kvb_ctl_recv(w->sock, &rep, sizeof(rep), NULL, NULL);
	rc = kvb_ctl_check_reply(&rep.h, n, KVB_MSG_OPEN, sizeof(rep));
	if (!rc)
		*handle = rep.handle;
	return rc;
}

void raw_worker_close(struct raw_worker *w)
{
	if (w->mem)
		munmap(w->mem, w->mem_len);
	if (w->efd_broker >= 0)
		close(w->efd_broker);
	if (w->efd_worker >= 0)
		close(w->efd_worker);
	if (w->sock >= 0)
		close(w->sock);
	w->mem = NULL;
	w->sock = w->efd_broker = w->efd_worker = -1;
}

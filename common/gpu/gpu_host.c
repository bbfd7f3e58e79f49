/* SPDX-License-Identifier: MIT */
/*
 * Host backend of the gpu ops table: enough of a GPU runtime to test the
 * transport's logic on any machine.
 *
 * - "device memory" is a memfd mapping, so a handle can cross processes: the
 *   IPC handle names (pid, fd) and the importer opens /proc/<pid>/fd/<fd>;
 *   inside one process it resolves to the allocation itself.
 * - a stream is a FIFO of copies and event records; a small pool of worker
 *   threads runs streams, one worker per stream at a time, so each stream
 *   stays in order while streams run in parallel.
 * - an event completes when the worker reaches its record; it reports -EIO
 *   if a copy before it on the same stream failed (the stream's error is
 *   consumed by that event, as a batch's failure is reported by its event).
 * - with $KVB_GPU_HOST_OPAQUE=1 (read when the backend loads), the device
 *   pointers it hands out are not host addresses: the mapping's address
 *   with bit 62 flipped (non-canonical on x86-64 and arm64), turned back
 *   only inside the backend's own calls. Code that touches "device memory"
 *   without the runtime then faults (a syscall given one fails -EFAULT),
 *   as it would with a real GPU's memory.
 */
#include "gpu_api.h"
#include "gpu_host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_THREADS	3
#define HOST_IPC_MAGIC	0x4b564850u /* "KVHP" */
#define HOST_OPAQUE_BIT (1ull << 62)

enum { EV_IDLE, EV_PENDING, EV_OK, EV_ERR };
enum { IT_COPY, IT_EVENT };

struct host_alloc {
	struct host_alloc *next;
	char *base;
	uint64_t size;
	int fd; /* own allocation: its memfd; imported: -1 */
	int dev;
	int imported;
};

struct host_event {
	int dev;
	int state;
	uint64_t gen; /* a record supersedes earlier ones */
};

struct host_item {
	struct host_item *next;
	int type;
	int fail;
	void *dst;
	const void *src;
	uint64_t n;
	struct host_event *ev;
	uint64_t gen;
};

struct host_stream {
	struct host_stream *rnext; /* ready queue link */
	struct host_item *head, *tail;
	int scheduled; /* in the ready queue or being run */
	int err;       /* failure not yet reported by an event */
	int dev;
};

struct host_ipc {
	uint32_t magic;
	uint32_t pid;
	int32_t fd;
	int32_t dev;
	uint64_t size;
	uint64_t token; /* base address in the exporter, as an identity */
};
_Static_assert(sizeof(struct host_ipc) <= KVB_GPU_IPC_SIZE, "ipc handle");

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work; /* ready queue or stop changed */
	pthread_cond_t done; /* an item finished */
	struct host_stream *rhead, *rtail;
	pthread_t thr[HOST_THREADS];
	int nthr;
	int stop;
	int paused;
	unsigned delay_us;
	unsigned fail_countdown; /* 0 = none armed */
	int fail_sync;
	unsigned memcpy_fail_countdown; /* 0 = none armed */
	int opaque; /* device pointers are tagged (set at load) */
	int ndev;
	struct host_alloc *allocs;
	struct kvb_gpu_host_counts cnt;
} H = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
};

static __thread char host_err[96];
static __thread int host_cur_dev;

static int host_fail(int rc, const char *what)
{
	snprintf(host_err, sizeof(host_err), "%s: %s", what, strerror(-rc));
	return rc;
}

/* Device pointer handed out for a mapping's host address, and back. */
static void *dev_tag(void *p)
{
	return H.opaque ? (void *) ((uintptr_t) p ^ HOST_OPAQUE_BIT) : p;
}

static void *dev_host(const void *p)
{
	return (void *) (H.opaque ? (uintptr_t) p ^ HOST_OPAQUE_BIT
				  : (uintptr_t) p);
}

static void ready_push(struct host_stream *st)
{
	st->rnext = NULL;
	if (H.rtail)
		H.rtail->rnext = st;
	else
		H.rhead = st;
	H.rtail = st;
	pthread_cond_signal(&H.work);
}

static void *host_worker(void *arg)
{
	pthread_mutex_lock(&H.lock);
	for (;;) {
		struct host_stream *st;
		struct host_item *it;
		unsigned delay;
		int fail;

		while (!H.stop && (H.paused || !H.rhead))
			pthread_cond_wait(&H.work, &H.lock);
		if (H.stop)
			break;
		st = H.rhead;
		H.rhead = st->rnext;
		if (!H.rhead)
			H.rtail = NULL;
		it = st->head;
		st->head = it->next;
		if (!st->head)
			st->tail = NULL;
		fail = it->fail;
		delay = H.delay_us;
		pthread_mutex_unlock(&H.lock);

		if (it->type == IT_COPY && !fail) {
			if (delay)
				usleep(delay);
			memmove(it->dst, it->src, it->n);
		}

		pthread_mutex_lock(&H.lock);
		if (it->type == IT_COPY) {
			H.cnt.copies++;
			if (fail) {
				H.cnt.failed++;
				st->err = -EIO;
			} else {
				H.cnt.bytes += it->n;
			}
		} else if (it->ev->gen == it->gen) {
			it->ev->state = st->err ? EV_ERR : EV_OK;
			st->err = 0;
		}
		free(it);
		if (st->head)
			ready_push(st);
		else
			st->scheduled = 0;
		pthread_cond_broadcast(&H.done);
	}
	pthread_mutex_unlock(&H.lock);
	return NULL;
}

/* Called with H.lock held. */
static int workers_start(void)
{
	int rc;

	if (H.nthr)
		return 0;
	H.stop = 0;
	while (H.nthr < HOST_THREADS) {
		rc = pthread_create(&H.thr[H.nthr], NULL, host_worker, NULL);
		if (rc)
			return H.nthr ? 0 : -rc;
		H.nthr++;
	}
	return 0;
}

void kvb_gpu_host_shutdown(void)
{
	int i, n;

	pthread_mutex_lock(&H.lock);
	H.stop = 1;
	n = H.nthr;
	pthread_cond_broadcast(&H.work);
	pthread_mutex_unlock(&H.lock);
	for (i = 0; i < n; i++)
		pthread_join(H.thr[i], NULL);
	pthread_mutex_lock(&H.lock);
	H.nthr = 0;
	H.stop = 0;
	pthread_mutex_unlock(&H.lock);
}

void kvb_gpu_host_set_devices(int n)
{
	pthread_mutex_lock(&H.lock);
	H.ndev = n;
	pthread_mutex_unlock(&H.lock);
}

void kvb_gpu_host_pause(int paused)
{
	pthread_mutex_lock(&H.lock);
	H.paused = paused;
	pthread_cond_broadcast(&H.work);
	pthread_mutex_unlock(&H.lock);
}

void kvb_gpu_host_set_delay_us(unsigned us)
{
	pthread_mutex_lock(&H.lock);
	H.delay_us = us;
	pthread_mutex_unlock(&H.lock);
}

void kvb_gpu_host_fail_copy(unsigned after, int sync)
{
	pthread_mutex_lock(&H.lock);
	H.fail_countdown = after + 1;
	H.fail_sync = sync;
	pthread_mutex_unlock(&H.lock);
}

void kvb_gpu_host_fail_memcpy(unsigned after)
{
	pthread_mutex_lock(&H.lock);
	H.memcpy_fail_countdown = after + 1;
	pthread_mutex_unlock(&H.lock);
}

int kvb_gpu_host_opaque(void)
{
	int o;

	pthread_mutex_lock(&H.lock);
	o = H.opaque;
	pthread_mutex_unlock(&H.lock);
	return o;
}

void kvb_gpu_host_counts(struct kvb_gpu_host_counts *c)
{
	pthread_mutex_lock(&H.lock);
	*c = H.cnt;
	pthread_mutex_unlock(&H.lock);
}

static int host_ndev(void)
{
	const char *e;

	if (!H.ndev) {
		e = getenv("KVB_GPU_HOST_DEVICES");
		H.ndev = e ? atoi(e) : 4;
		if (H.ndev <= 0)
			H.ndev = 4;
	}
	return H.ndev;
}

static int host_device_count(const struct kvb_gpu_api *g, int *n)
{
	pthread_mutex_lock(&H.lock);
	*n = host_ndev();
	pthread_mutex_unlock(&H.lock);
	return 0;
}

static int dev_ok(int dev)
{
	int ok;

	pthread_mutex_lock(&H.lock);
	ok = dev >= 0 && dev < host_ndev();
	pthread_mutex_unlock(&H.lock);
	return ok;
}

static int host_set_device(const struct kvb_gpu_api *g, int dev)
{
	if (!dev_ok(dev))
		return host_fail(-ENODEV, "set_device");
	host_cur_dev = dev;
	return 0;
}

static int host_device_id(const struct kvb_gpu_api *g, int dev, char *buf,
			  size_t len)
{
	if (!dev_ok(dev))
		return host_fail(-ENODEV, "device_id");
	snprintf(buf, len, "host:%d", dev);
	return 0;
}

static int host_device_by_id(const struct kvb_gpu_api *g, const char *id,
			     int *dev)
{
	int d;

	if (sscanf(id, "host:%d", &d) != 1 || !dev_ok(d))
		return host_fail(-ENODEV, "device_by_id");
	*dev = d;
	return 0;
}

static struct host_alloc *find_alloc(const void *p)
{
	struct host_alloc *a;

	for (a = H.allocs; a; a = a->next)
		if ((const char *) p >= a->base &&
		    (const char *) p < a->base + a->size)
			return a;
	return NULL;
}

static int host_alloc(const struct kvb_gpu_api *g, int dev, uint64_t size,
		      void **ptr)
{
	struct host_alloc *a;
	int rc;

	if (!size)
		return host_fail(-EINVAL, "alloc");
	if (!dev_ok(dev))
		return host_fail(-ENODEV, "alloc");
	a = calloc(1, sizeof(*a));
	if (!a)
		return host_fail(-ENOMEM, "alloc");
	a->fd = memfd_create("kvb-gpu-host", MFD_CLOEXEC);
	if (a->fd < 0) {
		rc = -errno;
		goto err_free;
	}
	if (ftruncate(a->fd, (off_t) size) < 0) {
		rc = -errno;
		goto err_close;
	}
	a->base =
		mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (a->base == MAP_FAILED) {
		rc = -errno;
		goto err_close;
	}
	a->size = size;
	a->dev = dev;
	pthread_mutex_lock(&H.lock);
	a->next = H.allocs;
	H.allocs = a;
	H.cnt.allocs++;
	pthread_mutex_unlock(&H.lock);
	*ptr = dev_tag(a->base);
	return 0;

err_close:
	close(a->fd);
err_free:
	free(a);
	return host_fail(rc, "alloc");
}

/* Unlink the entry starting at `base` with the given imported-ness. */
static struct host_alloc *unlink_alloc(const void *base, int imported)
{
	struct host_alloc **pp, *a;

	for (pp = &H.allocs; (a = *pp); pp = &a->next) {
		if (a->base == base && a->imported == imported) {
			*pp = a->next;
			return a;
		}
	}
	return NULL;
}

static int host_free(const struct kvb_gpu_api *g, void *ptr)
{
	struct host_alloc *a;

	ptr = dev_host(ptr);
	pthread_mutex_lock(&H.lock);
	a = unlink_alloc(ptr, 0);
	if (a)
		H.cnt.allocs--;
	pthread_mutex_unlock(&H.lock);
	if (!a)
		return host_fail(-EINVAL, "free");
	munmap(a->base, a->size);
	close(a->fd);
	free(a);
	return 0;
}

static int host_memcpy(const struct kvb_gpu_api *g, void *dst, const void *src,
		       uint64_t n, enum kvb_gpu_dir dir)
{
	int fail;

	if (dir != KVB_GPU_H2D && dir != KVB_GPU_D2H && dir != KVB_GPU_D2D)
		return host_fail(-EINVAL, "memcpy: direction");
	pthread_mutex_lock(&H.lock);
	fail = H.memcpy_fail_countdown && --H.memcpy_fail_countdown == 0;
	H.cnt.memcpys++;
	if (!fail)
		H.cnt.memcpy_bytes += n;
	pthread_mutex_unlock(&H.lock);
	if (fail)
		return host_fail(-EIO, "memcpy (injected)");
	if (dir != KVB_GPU_D2H)
		dst = dev_host(dst);
	if (dir != KVB_GPU_H2D)
		src = dev_host(src);
	memmove(dst, src, n);
	return 0;
}

static int host_ipc_get(const struct kvb_gpu_api *g, void *ptr,
			struct kvb_gpu_ipc *h, uint64_t *offset,
			uint64_t *alloc_size)
{
	struct host_ipc hi = {0};
	struct host_alloc *a;

	ptr = dev_host(ptr);
	pthread_mutex_lock(&H.lock);
	a = find_alloc(ptr);
	if (a && !a->imported) {
		hi.magic = HOST_IPC_MAGIC;
		hi.pid = (uint32_t) getpid();
		hi.fd = a->fd;
		hi.dev = a->dev;
		hi.size = a->size;
		hi.token = (uint64_t) (uintptr_t) a->base;
		*offset = (uint64_t) ((char *) ptr - a->base);
		*alloc_size = a->size;
	}
	pthread_mutex_unlock(&H.lock);
	if (!hi.magic)
		return host_fail(-EINVAL,
				 "ipc_get: not a host-backend allocation");
	memset(h, 0, sizeof(*h));
	memcpy(h->b, &hi, sizeof(hi));
	return 0;
}

static int host_ipc_open(const struct kvb_gpu_api *g, int dev,
			 const struct kvb_gpu_ipc *h, uint64_t alloc_size,
			 void **base)
{
	struct host_alloc *a;
	struct host_ipc hi;
	char path[64];
	struct stat sb;
	int fd, rc;

	memcpy(&hi, h->b, sizeof(hi));
	if (hi.magic != HOST_IPC_MAGIC || hi.size != alloc_size)
		return host_fail(-EINVAL, "ipc_open: bad handle");
	if (hi.pid == (uint32_t) getpid()) {
		pthread_mutex_lock(&H.lock);
		a = find_alloc((void *) (uintptr_t) hi.token);
		if (a && a->imported)
			a = NULL;
		pthread_mutex_unlock(&H.lock);
		if (!a)
			return host_fail(-ENOENT,
					 "ipc_open: no such allocation");
		*base = dev_tag(a->base);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/%u/fd/%d", hi.pid, hi.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return host_fail(-errno, "ipc_open: open exporter's memfd");
	a = calloc(1, sizeof(*a));
	if (!a) {
		rc = -ENOMEM;
		goto err_close;
	}
	if (fstat(fd, &sb) < 0 || (uint64_t) sb.st_size < hi.size) {
		rc = -EINVAL;
		goto err_free;
	}
	a->base =
		mmap(NULL, hi.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a->base == MAP_FAILED) {
		rc = -errno;
		goto err_free;
	}
	close(fd);
	a->size = hi.size;
	a->fd = -1;
	a->dev = dev;
	a->imported = 1;
	pthread_mutex_lock(&H.lock);
	a->next = H.allocs;
	H.allocs = a;
	H.cnt.mappings++;
	pthread_mutex_unlock(&H.lock);
	*base = dev_tag(a->base);
	return 0;

err_free:
	free(a);
err_close:
	close(fd);
	return host_fail(rc, "ipc_open");
}

static int host_ipc_close(const struct kvb_gpu_api *g, void *base)
{
	struct host_alloc *a;
	int own;

	base = dev_host(base);
	pthread_mutex_lock(&H.lock);
	a = unlink_alloc(base, 1);
	if (a)
		H.cnt.mappings--;
	own = !a && find_alloc(base);
	pthread_mutex_unlock(&H.lock);
	if (own)
		return 0; /* same-process open: nothing was mapped */
	if (!a)
		return host_fail(-EINVAL, "ipc_close");
	munmap(a->base, a->size);
	free(a);
	return 0;
}

static int host_stream_create(const struct kvb_gpu_api *g, int dev, void **s)
{
	struct host_stream *st;
	int rc;

	if (!dev_ok(dev))
		return host_fail(-ENODEV, "stream_create");
	st = calloc(1, sizeof(*st));
	if (!st)
		return host_fail(-ENOMEM, "stream_create");
	st->dev = dev;
	pthread_mutex_lock(&H.lock);
	rc = workers_start();
	if (!rc)
		H.cnt.streams++;
	pthread_mutex_unlock(&H.lock);
	if (rc) {
		free(st);
		return host_fail(rc, "stream_create");
	}
	*s = st;
	return 0;
}

static int host_stream_sync(const struct kvb_gpu_api *g, void *s)
{
	struct host_stream *st = s;

	pthread_mutex_lock(&H.lock);
	while (st->scheduled)
		pthread_cond_wait(&H.done, &H.lock);
	pthread_mutex_unlock(&H.lock);
	return 0;
}

static int host_stream_destroy(const struct kvb_gpu_api *g, void *s)
{
	host_stream_sync(g, s);
	pthread_mutex_lock(&H.lock);
	H.cnt.streams--;
	pthread_mutex_unlock(&H.lock);
	free(s);
	return 0;
}

/* Called with H.lock held. */
static void stream_push(struct host_stream *st, struct host_item *it)
{
	it->next = NULL;
	if (st->tail)
		st->tail->next = it;
	else
		st->head = it;
	st->tail = it;
	if (!st->scheduled) {
		st->scheduled = 1;
		ready_push(st);
	}
}

static int host_copy_async(const struct kvb_gpu_api *g, void *dst, int dst_dev,
			   const void *src, int src_dev, uint64_t n, void *s)
{
	struct host_item *it = calloc(1, sizeof(*it));
	int fail = 0;

	if (!it)
		return host_fail(-ENOMEM, "copy_async");
	it->type = IT_COPY;
	it->dst = dev_host(dst);
	it->src = dev_host(src);
	it->n = n;
	pthread_mutex_lock(&H.lock);
	if (H.fail_countdown && --H.fail_countdown == 0)
		fail = H.fail_sync ? -EIO : 1;
	if (fail < 0) {
		H.cnt.failed++;
		pthread_mutex_unlock(&H.lock);
		free(it);
		return host_fail(-EIO, "copy_async (injected)");
	}
	it->fail = fail;
	stream_push(s, it);
	pthread_mutex_unlock(&H.lock);
	return 0;
}

static int host_event_create(const struct kvb_gpu_api *g, int dev, void **e)
{
	struct host_event *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return host_fail(-ENOMEM, "event_create");
	ev->dev = dev;
	ev->state = EV_IDLE;
	pthread_mutex_lock(&H.lock);
	H.cnt.events++;
	pthread_mutex_unlock(&H.lock);
	*e = ev;
	return 0;
}

static int host_event_sync(const struct kvb_gpu_api *g, void *e)
{
	struct host_event *ev = e;
	int st;

	pthread_mutex_lock(&H.lock);
	while (ev->state == EV_PENDING)
		pthread_cond_wait(&H.done, &H.lock);
	st = ev->state;
	pthread_mutex_unlock(&H.lock);
	return st == EV_ERR ? host_fail(-EIO, "event_sync: copy failed") : 0;
}

static int host_event_destroy(const struct kvb_gpu_api *g, void *e)
{
	host_event_sync(g, e); /* a queued record still points at it */
	pthread_mutex_lock(&H.lock);
	H.cnt.events--;
	pthread_mutex_unlock(&H.lock);
	free(e);
	return 0;
}

static int host_event_record(const struct kvb_gpu_api *g, void *e, void *s)
{
	struct host_item *it = calloc(1, sizeof(*it));
	struct host_event *ev = e;

	if (!it)
		return host_fail(-ENOMEM, "event_record");
	it->type = IT_EVENT;
	it->ev = ev;
	pthread_mutex_lock(&H.lock);
	it->gen = ++ev->gen;
	ev->state = EV_PENDING;
	stream_push(s, it);
	pthread_mutex_unlock(&H.lock);
	return 0;
}

static int host_event_query(const struct kvb_gpu_api *g, void *e)
{
	struct host_event *ev = e;
	int st;

	pthread_mutex_lock(&H.lock);
	st = ev->state;
	pthread_mutex_unlock(&H.lock);
	if (st == EV_PENDING)
		return -EAGAIN;
	return st == EV_ERR ? host_fail(-EIO, "event_query: copy failed") : 0;
}

static int host_can_access_peer(const struct kvb_gpu_api *g, int dev, int peer,
				int *ok)
{
	if (!dev_ok(dev) || !dev_ok(peer))
		return host_fail(-ENODEV, "can_access_peer");
	*ok = dev != peer;
	return 0;
}

static int host_enable_peer(const struct kvb_gpu_api *g, int dev, int peer)
{
	return dev_ok(dev) && dev_ok(peer) ? 0
					   : host_fail(-ENODEV, "enable_peer");
}

static int host_dmabuf_export(const struct kvb_gpu_api *g, void *ptr,
			      uint64_t size, int *fd, uint64_t *offset)
{
	snprintf(host_err, sizeof(host_err), "host backend has no dmabuf");
	return -ENOTSUP;
}

static const char *host_errstr(const struct kvb_gpu_api *g)
{
	return host_err;
}

static const struct kvb_gpu_api host_api = {
	.name = "host",
	.kind = KVB_GPU_HOST,
	.device_count = host_device_count,
	.set_device = host_set_device,
	.device_id = host_device_id,
	.device_by_id = host_device_by_id,
	.alloc = host_alloc,
	.free = host_free,
	.memcpy = host_memcpy,
	.ipc_get = host_ipc_get,
	.ipc_open = host_ipc_open,
	.ipc_close = host_ipc_close,
	.stream_create = host_stream_create,
	.stream_destroy = host_stream_destroy,
	.stream_sync = host_stream_sync,
	.copy_async = host_copy_async,
	.event_create = host_event_create,
	.event_destroy = host_event_destroy,
	.event_record = host_event_record,
	.event_query = host_event_query,
	.event_sync = host_event_sync,
	.can_access_peer = host_can_access_peer,
	.enable_peer = host_enable_peer,
	.dmabuf_export = host_dmabuf_export,
	.errstr = host_errstr,
};

int _kvb_gpu_host_load(const struct kvb_gpu_api **out, char *why,
		       size_t why_len)
{
	const char *e = getenv("KVB_GPU_HOST_OPAQUE");

	pthread_mutex_lock(&H.lock);
	if (!H.allocs)
		H.opaque = e && *e && strcmp(e, "0") != 0;
	pthread_mutex_unlock(&H.lock);
	*out = &host_api;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * rte_ring side of kvb-ring-bench: DPDK's ring with 64-byte elements
 * (rte_ring_create_elem, SP/SC), two pthreads pinned like the kvb runs.
 * rte_ring lives in the EAL's process memory, hence threads, not processes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "ring_bench_priv.h"

struct rb_rte {
	struct rte_ring *r;
	struct rb_ctl ctl;
	uint32_t burst;
	int cpu;
	int rc;
};

int _kvb_rb_rte_init(const char *prog)
{
	static int done, saved_rc;
	/*
	 * --no-huge: malloc'd memory, so no hugepages needed (it implies legacy
	 * memory, which --in-memory refuses: --no-shconf instead keeps the
	 * shared config out of /var/run/dpdk).
	 */
	char *args[] = {
		(char *) prog,
		"--no-huge",
		"--no-pci",
		"--no-shconf",
		"--file-prefix=kvb-ring-bench",
		"-l",
		"0",
		"-m",
		"64",
		"--no-telemetry",
		"--log-level=1",
		NULL,
	};
	int argc = (int) (sizeof(args) / sizeof(args[0])) - 1;

	if (done) /* EAL can be initialised once per process */
		return saved_rc;
	done = 1;
	if (rte_eal_init(argc, args) < 0)
		saved_rc = rte_errno ? -rte_errno : -EIO;
	return saved_rc;
}

static uint32_t rte_enq(void *ring, void *buf, uint32_t n)
{
	return rte_ring_sp_enqueue_burst_elem(ring, buf, RB_SLOT, n, NULL);
}

static uint32_t rte_deq(void *ring, void *buf, uint32_t n)
{
	return rte_ring_sc_dequeue_burst_elem(ring, buf, RB_SLOT, n, NULL);
}

static void *rb_rte_alloc(uint32_t burst)
{
	void *b = aligned_alloc(64, (size_t) burst * RB_SLOT);

	if (b)
		memset(b, 0x5a, (size_t) burst * RB_SLOT);
	return b;
}

static void *rb_rte_producer(void *arg)
{
	struct rb_rte *p = arg;
	void *src = rb_rte_alloc(p->burst);

	p->rc = _kvb_rb_pin(p->cpu);
	if (!src && !p->rc)
		p->rc = -ENOMEM;
	if (p->rc) {
		atomic_store(&p->ctl.prod_rc, p->rc);
		rb_sync_start(&p->ctl);
		free(src);
		return NULL;
	}
	rb_produce(&p->ctl, p->r, rte_enq, src, p->burst);
	free(src);
	return NULL;
}

int _kvb_rb_rte_run(uint32_t ring, uint32_t burst, double seconds, int cpu_p,
		    int cpu_c, struct rb_result *res)
{
	struct rb_rte *p;
	pthread_t t;
	void *dst;
	char name[RTE_RING_NAMESIZE];
	int rc;

	p = aligned_alloc(64, sizeof(*p));
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	p->burst = burst;
	p->cpu = cpu_p;
	snprintf(name, sizeof(name), "kvb_rb_%u", burst);
	/* same capacity as the kvb ring: rte keeps one slot empty otherwise */
	p->r = rte_ring_create_elem(name, RB_SLOT, ring, SOCKET_ID_ANY,
				    RING_F_SP_ENQ | RING_F_SC_DEQ |
					    RING_F_EXACT_SZ);
	if (!p->r) {
		rc = rte_errno ? -rte_errno : -ENOMEM;
		goto err_free;
	}
	dst = rb_rte_alloc(burst);
	if (!dst) {
		rc = -ENOMEM;
		goto err_ring;
	}
	rc = -pthread_create(&t, NULL, rb_rte_producer, p);
	if (rc)
		goto err_dst;
	rc = _kvb_rb_pin(cpu_c);
	if (!rc)
		rb_consume(&p->ctl, p->r, rte_deq, dst, burst, seconds, res);
	atomic_store(&p->ctl.stop, 1);
	pthread_join(t, NULL);
	if (!rc)
		rc = p->rc;
err_dst:
	free(dst);
err_ring:
	rte_ring_free(p->r);
err_free:
	free(p);
	return rc;
}

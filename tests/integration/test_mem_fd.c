/* SPDX-License-Identifier: MIT */
/*
 * kvb_mem_register_fd against a real broker: the broker maps the file, so
 * it takes only a memfd that holds the whole region and cannot shrink
 * (a truncated file under its mapping would be a SIGBUS that kills it).
 * A region past the end of its file and a file that cannot be sealed are
 * refused, counted and logged; a good one is sealed by the library and
 * carries writes both ways; kvb_mem_alloc's regions are sealed too; and
 * after all that the broker still serves.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define SIZE (256u << 10)
#define PAGE 4096u

static int memfd(unsigned flags, uint64_t len)
{
	int fd = memfd_create("test-mem-fd", MFD_CLOEXEC | flags);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t) len), 0);
	return fd;
}

/* One signaled write src -> dst of len bytes; its completion status. */
static int write_one(uint32_t src, uint64_t soff, uint32_t dst, uint64_t doff,
		     uint64_t len, uint64_t tag)
{
	struct kvb_desc d = {.region = src,
			     .peer_region = dst,
			     .offset = soff,
			     .peer_offset = doff,
			     .len = len,
			     .tag = tag};
	struct kvb_completion c;

	assert_int_equal(kvb_submit_write(fx.ctx, &d, 1), 1);
	assert_int_equal(w_collect(fx.ctx, &c, 1, 5000), 1);
	assert_int_equal(c.tag, tag);
	return c.status;
}

static void test_past_eof(void **state)
{
	int64_t rej = broker_stat(&fx.br, "messages_rejected");
	struct kvb_region r;
	int fd = memfd(MFD_ALLOW_SEALING, PAGE);

	/* 4 KiB of file, 1 MiB of region: the reviewer's SIGBUS */
	assert_int_equal(kvb_mem_register_fd(fx.ctx, fd, 0, 1u << 20, 0, 7, &r),
			 -EINVAL);
	/* inside the file's length, but offset + size past its end */
	assert_int_equal(ftruncate(fd, 4 * PAGE), 0);
	assert_int_equal(
		kvb_mem_register_fd(fx.ctx, fd, 2 * PAGE, 3 * PAGE, 0, 7, &r),
		-EINVAL);
	assert_int_equal(
		kvb_mem_register_fd(fx.ctx, fd, 8 * PAGE, PAGE, 0, 7, &r),
		-EINVAL);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rej + 3);
	assert_true(broker_log_has(&fx.br, "past the end of its file"));
	close(fd);
}

static void test_not_sealable(void **state)
{
	int64_t rej = broker_stat(&fx.br, "messages_rejected");
	struct kvb_region r;
	int fd = memfd(0, SIZE); /* no MFD_ALLOW_SEALING */

	assert_int_equal(kvb_mem_register_fd(fx.ctx, fd, 0, SIZE, 0, 7, &r),
			 -EPERM);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rej + 1);
	assert_true(broker_log_has(&fx.br, "not sealed against shrinking"));
	close(fd);
}

static void test_good_fd(void **state)
{
	int64_t rej = broker_stat(&fx.br, "messages_rejected");
	int fd = memfd(MFD_ALLOW_SEALING, 2 * SIZE);
	struct kvb_region r;
	char *p;

	/* the second half of the file */
	assert_int_equal(kvb_mem_register_fd(fx.ctx, fd, SIZE, SIZE, 0, 7, &r),
			 0);
	assert_null(r.addr);
	assert_true(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK);
	assert_int_equal(ftruncate(fd, PAGE), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(fd, 4 * (off_t) SIZE), 0); /* may grow */
	p = mmap(NULL, 2 * SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 0, 2 * SIZE);
	/* into it from the fixture's src, and back out into dst */
	assert_int_equal(write_one(fx.src.id, 0, r.id, 0, SIZE, 1), 0);
	assert_int_equal(pattern_check(p + SIZE, SIZE, fx.seed, 0), 0);
	for (unsigned i = 0; i < SIZE; i++) /* the first half untouched */
		assert_int_equal(p[i], 0);
	memset(fx.dst.addr, 0, SIZE);
	assert_int_equal(write_one(r.id, 0, fx.dst.id, 0, SIZE, 2), 0);
	assert_int_equal(pattern_check(fx.dst.addr, SIZE, fx.seed, 0), 0);
	/* the region ends where it was registered, not at the file's end */
	assert_int_equal(write_one(fx.src.id, 0, r.id, PAGE, SIZE, 3), -EFAULT);
	assert_int_equal(kvb_mem_free(fx.ctx, &r), 0);
	assert_int_equal(munmap(p, 2 * SIZE), 0);
	close(fd);
	assert_int_equal(broker_stat(&fx.br, "messages_rejected"), rej);
}

/* kvb_mem_alloc's memfd is sealed too: the broker took the fixture's */
static void test_alloc_sealed(void **state)
{
	struct kvb_region r;

	assert_int_equal(kvb_mem_alloc(fx.ctx, SIZE, 0, 9, &r), 0);
	memset(r.addr, 0, SIZE);
	assert_int_equal(write_one(fx.src.id, 0, r.id, 0, SIZE, 4), 0);
	assert_int_equal(pattern_check(r.addr, SIZE, fx.seed, 0), 0);
	assert_int_equal(kvb_mem_free(fx.ctx, &r), 0);
	assert_int_equal(broker_stat(&fx.br, "workers"), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_past_eof),
		cmocka_unit_test(test_not_sealable),
		cmocka_unit_test(test_good_fd),
		cmocka_unit_test(test_alloc_sealed),
	};

	fx.size = SIZE;
	fx.seed = 5;
	return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}

/* SPDX-License-Identifier: MIT */
/*
 * A program outside the tree, built against the installed library only
 * (tests/install/install-test.sh: pkg-config, shared and static): a P and a
 * D context on one broker, P writes 1 MiB into D's region in 16 pieces,
 * D's bytes are checked, the regions freed. Exit 0 when all of it worked.
 *
 *   consumer SOCKET
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <kvbroker/kvbroker.h>

#define LEN    (1u << 20)
#define PIECES 16u

static int fail(const char *what, int rc)
{
	fprintf(stderr, "consumer: %s: %s\n", what, kvb_strerror(rc));
	return 1;
}

int main(int argc, char **argv)
{
	struct kvb_attach_opts po = {.role = KVB_ROLE_P, .tp_size = 1};
	struct kvb_attach_opts dopt = {.role = KVB_ROLE_D, .tp_size = 1};
	struct kvb_ctx *p = NULL, *d = NULL;
	struct kvb_region src, dst;
	struct kvb_remote_region rdst;
	struct kvb_desc desc[PIECES];
	struct kvb_completion c[PIECES + 1];
	unsigned i, got = 0;
	uint32_t h;
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: consumer SOCKET\n");
		return 2;
	}
	po.socket_path = dopt.socket_path = argv[1];
	if ((rc = kvb_attach(&po, &p)) || (rc = kvb_attach(&dopt, &d)))
		return fail("attach", rc);
	if ((rc = kvb_mem_alloc(d, LEN, KVB_MEM_REMOTE_WRITE, 1, &dst)) ||
	    (rc = kvb_mem_alloc(p, LEN, 0, 0, &src)))
		return fail("mem_alloc", rc);
	for (i = 0; i < LEN; i++)
		((uint8_t *) src.addr)[i] = (uint8_t) (i * 7 + (i >> 12));
	memset(dst.addr, 0, LEN);
	if ((rc = kvb_mem_lookup(p, KVB_ROLE_D, 0, 0, 1, &rdst)))
		return fail("mem_lookup", rc);
	if ((rc = kvb_transfer_open(p, "consumer-1", &h)))
		return fail("transfer_open", rc);
	for (i = 0; i < PIECES; i++) /* pieces in reverse order at D */
		desc[i] = (struct kvb_desc){
			.transfer = h,
			.region = src.id,
			.peer_region = rdst.id,
			.offset = (uint64_t) i * (LEN / PIECES),
			.peer_offset =
				(uint64_t) (PIECES - 1 - i) * (LEN / PIECES),
			.len = LEN / PIECES,
			.tag = i};
	for (i = 0; i < PIECES;) {
		rc = kvb_submit_write(p, desc + i, PIECES - i);
		if (rc < 0 && rc != -EAGAIN)
			return fail("submit_write", rc);
		if (rc > 0)
			i += (unsigned) rc;
	}
	while ((rc = kvb_transfer_seal(p, h, PIECES, 99)) == -EAGAIN)
		;
	if (rc)
		return fail("transfer_seal", rc);
	while (got < PIECES + 1) {
		rc = kvb_wait(p, c + got, PIECES + 1 - got, 10000);
		if (rc < 0)
			return fail("wait", rc);
		got += (unsigned) rc;
	}
	for (i = 0; i < got; i++)
		if (c[i].status)
			return fail("a completion", c[i].status);
	for (i = 0; i < PIECES; i++)
		if (memcmp((uint8_t *) src.addr + (uint64_t) i * (LEN / PIECES),
			   (uint8_t *) dst.addr +
				   (uint64_t) (PIECES - 1 - i) * (LEN / PIECES),
			   LEN / PIECES)) {
			fprintf(stderr, "consumer: piece %u differs\n", i);
			return 1;
		}
	if ((rc = kvb_mem_free(p, &src)) || (rc = kvb_mem_free(d, &dst)))
		return fail("mem_free", rc);
	kvb_detach(p);
	kvb_detach(d);
	printf("consumer: 1 MiB in %u pieces written and checked\n", PIECES);
	return 0;
}

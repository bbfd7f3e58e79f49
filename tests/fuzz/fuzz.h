/* SPDX-License-Identifier: MIT */
/*
 * Shared by the fuzz targets of tests/fuzz: each target file defines
 * LLVMFuzzerTestOneInput() and is linked either with libFuzzer (clang,
 * KVB_FUZZ=ON) or with replay.c (any compiler: ctest fuzz_replay_<target>
 * feeds it every file of tests/fuzz/corpus/<target>/).
 *
 * A broken invariant aborts: libFuzzer saves the input as a crash, the replay
 * test fails.
 */
#ifndef KVB_TESTS_FUZZ_H
#define KVB_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                 \
	do {                                                             \
		if (!(cond)) {                                           \
			fprintf(stderr, "%s:%d: invariant broken: %s\n", \
				__FILE__, __LINE__, #cond);              \
			abort();                                         \
		}                                                        \
	} while (0)

/* Bytes of the input read in order; past the end everything reads as 0. */
struct fuzz_in {
	const uint8_t *p;
	size_t left;
};

static inline uint64_t fuzz_take(struct fuzz_in *in, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++) {
		v <<= 8;
		if (in->left) {
			v |= *in->p++;
			in->left--;
		}
	}
	return v;
}

#endif

// SPDX-License-Identifier: MIT
/*
 * main() for a fuzz target built without libFuzzer: runs the target on every
 * file named on the command line or found (not recursively) in a directory
 * named there, in name order. Exits 0 when every input passed (a broken
 * invariant aborts), 1 when no input was found at all.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
	uint8_t *buf = NULL;
	long len;
	FILE *f;

	f = fopen(path, "rb");
	if (!f || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET))
		goto err;
	/* +1: a 0-byte file still gets a valid pointer */
	buf = malloc((size_t) len + 1);
	if (!buf || fread(buf, 1, (size_t) len, f) != (size_t) len)
		goto err;
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t) len);
	free(buf);
	return 0;
err:
	fprintf(stderr, "%s: %s\n", path, strerror(errno ? errno : EIO));
	free(buf);
	if (f)
		fclose(f);
	return -1;
}

static int run_dir(const char *dir, unsigned *n)
{
	struct dirent **ents;
	char path[4096];
	int k, i, ret = 0;

	k = scandir(dir, &ents, NULL, alphasort);
	if (k < 0) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (i = 0; i < k; i++) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
		if (!stat(path, &st) && S_ISREG(st.st_mode)) {
			if (run_file(path))
				ret = -1;
			(*n)++;
		}
		free(ents[i]);
	}
	free(ents);
	return ret;
}

int main(int argc, char **argv)
{
	unsigned n = 0;
	int i, ret = 0;

	for (i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st)) {
			fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (S_ISDIR(st.st_mode))
			ret |= run_dir(argv[i], &n);
		else if (!run_file(argv[i]))
			n++;
		else
			ret = -1;
	}
	printf("%u inputs replayed\n", n);
	return ret || !n ? 1 : 0;
}

// SPDX-License-Identifier: MIT
/* Fake sysfs trees for tests (fake_sysfs.h). */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_sysfs.h"

/* snprintf that leaves "" (an unusable path) when the result is cut */
__attribute__((format(printf, 3, 4))) static void sf(char *buf, size_t len,
						     const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t) n >= len)
		buf[0] = '\0';
}

static int mkdir_p(const char *path)
{
	char p[PATH_MAX];
	size_t i;

	sf(p, sizeof(p), "%s", path);
	if (!p[0])
		return -ENAMETOOLONG;
	for (i = 1; p[i]; i++) {
		if (p[i] != '/')
			continue;
		p[i] = '\0';
		if (mkdir(p, 0755) && errno != EEXIST)
			return -errno;
		p[i] = '/';
	}
	return mkdir(p, 0755) && errno != EEXIST ? -errno : 0;
}

/* Write text + '\n' to the file at p, making its directories. */
static int put(const char *text, const char *p)
{
	char dir[PATH_MAX];
	FILE *f;
	int err;

	sf(dir, sizeof(dir), "%s", p);
	*strrchr(dir, '/') = '\0';
	err = mkdir_p(dir);
	if (err)
		return err;
	f = fopen(p, "w");
	if (!f)
		return -errno;
	fprintf(f, "%s\n", text);
	return fclose(f) ? -errno : 0;
}

/* Symlink p -> target, making p's directories. */
static int link_to(const char *target, const char *p)
{
	char dir[PATH_MAX];
	int err;

	sf(dir, sizeof(dir), "%s", p);
	*strrchr(dir, '/') = '\0';
	err = mkdir_p(dir);
	if (err)
		return err;
	return symlink(target, p) ? -errno : 0;
}

static int pci_dev(const char *root, const char *path, const char *numa)
{
	char t[PATH_MAX], d[PATH_MAX], p[PATH_MAX];
	const char *bdf = strrchr(path, '/');
	int err;

	bdf = bdf ? bdf + 1 : path;
	sf(d, sizeof(d), "%s/devices/%s", root, path);
	err = mkdir_p(d);
	sf(p, sizeof(p), "%s/numa_node", d);
	if (!err && strcmp(numa, "none"))
		err = put(numa, p);
	sf(t, sizeof(t), "../../../devices/%s", path);
	sf(p, sizeof(p), "%s/bus/pci/devices/%s", root, bdf);
	if (!err)
		err = link_to(t, p);
	return err;
}

/* ports of an RDMA device whose directory is <root>/<dir> */
static int ports(const char *root, const char *dir, char *save)
{
	char *tok, p[PATH_MAX];
	int err = 0;

	while (!err && (tok = strtok_r(NULL, " \t", &save))) {
		char n[16], state[16], ll[16];

		if (sscanf(tok, "%15[0-9]:%15[a-z]:%15[a-z]", n, state, ll) !=
		    3)
			return -EINVAL;
		sf(p, sizeof(p), "%s/%s/ports/%s/state", root, dir, n);
		err = put(strcmp(state, "active") ? "1: DOWN" : "4: ACTIVE", p);
		sf(p, sizeof(p), "%s/%s/ports/%s/link_layer", root, dir, n);
		if (!err)
			err = put(strcmp(ll, "eth") ? "InfiniBand" : "Ethernet",
				  p);
	}
	return err;
}

static int nic(const char *root, char *save, int virt)
{
	char *name = strtok_r(NULL, " \t", &save);
	char *path = virt ? NULL : strtok_r(NULL, " \t", &save);
	char *numa = virt ? NULL : strtok_r(NULL, " \t", &save);
	char dir[PATH_MAX], t[PATH_MAX], p[PATH_MAX];
	int err;

	if (!name || (!virt && (!path || !numa)))
		return -EINVAL;
	if (virt) {
		sf(dir, sizeof(dir), "devices/virtual/infiniband/%s", name);
	} else {
		err = pci_dev(root, path, numa);
		if (err)
			return err;
		sf(dir, sizeof(dir), "devices/%s/infiniband/%s", path, name);
		sf(p, sizeof(p), "%s/%s/device", root, dir);
		err = link_to("../..", p);
		if (err)
			return err;
	}
	sf(t, sizeof(t), "../../%s", dir);
	sf(p, sizeof(p), "%s/class/infiniband/%s", root, name);
	err = link_to(t, p);
	return err ? err : ports(root, dir, save);
}

static int gid(const char *root, char *save)
{
	char *f[5], p[PATH_MAX];
	int i, err;

	for (i = 0; i < 5; i++)
		if (!(f[i] = strtok_r(NULL, " \t", &save)))
			return -EINVAL;
	sf(p, sizeof(p), "%s/class/infiniband/%s/ports/%s/gids/%s", root, f[0],
	   f[1], f[2]);
	err = put(f[3], p);
	if (err || !strcmp(f[4], "-"))
		return err;
	sf(p, sizeof(p), "%s/class/infiniband/%s/ports/%s/gid_attrs/types/%s",
	   root, f[0], f[1], f[2]);
	return put(strcmp(f[4], "v2") ? "IB/RoCE v1" : "RoCE v2", p);
}

static int line(const char *root, char *l)
{
	char *save, *kind = strtok_r(l, " \t", &save);

	if (!kind || kind[0] == '#')
		return 0;
	if (!strcmp(kind, "pci")) {
		char *path = strtok_r(NULL, " \t", &save);
		char *numa = strtok_r(NULL, " \t", &save);

		return path && numa ? pci_dev(root, path, numa) : -EINVAL;
	}
	if (!strcmp(kind, "nic") || !strcmp(kind, "virt"))
		return nic(root, save, kind[0] == 'v');
	if (!strcmp(kind, "gid"))
		return gid(root, save);
	return -EINVAL;
}

int fake_sysfs_build(const char *desc, char *root, size_t len)
{
	const char *tmp = getenv("TMPDIR");
	char *copy, *l, *save;
	int err = 0;

	sf(root, len, "%s/kvb-sysfs.XXXXXX", tmp ? tmp : "/tmp");
	if (!root[0])
		return -ENAMETOOLONG;
	if (!mkdtemp(root))
		return -errno;
	copy = strdup(desc);
	if (!copy) {
		fake_sysfs_remove(root);
		return -ENOMEM;
	}
	for (l = strtok_r(copy, "\n", &save); l && !err;
	     l = strtok_r(NULL, "\n", &save)) {
		char keep[512];

		sf(keep, sizeof(keep), "%s", l);
		err = line(root, l);
		if (err)
			fprintf(stderr, "fake_sysfs: %s: %s\n", strerror(-err),
				keep);
	}
	free(copy);
	if (!err) {
		char p[PATH_MAX];

		sf(p, sizeof(p), "%s/class/infiniband", root);
		err = mkdir_p(p);
	}
	if (err)
		fake_sysfs_remove(root);
	return err;
}

int fake_sysfs_build_file(const char *file, char *root, size_t len)
{
	FILE *f = fopen(file, "r");
	char *buf;
	long n;
	int err;

	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -EIO;
	}
	buf = calloc(1, (size_t) n + 1);
	if (!buf || fread(buf, 1, (size_t) n, f) != (size_t) n) {
		free(buf);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	err = fake_sysfs_build(buf, root, len);
	free(buf);
	return err;
}

static int rm_one(const char *p, const struct stat *st, int flag,
		  struct FTW *ftw)
{
	(void) st;
	(void) flag;
	(void) ftw;
	return remove(p);
}

void fake_sysfs_remove(const char *root)
{
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

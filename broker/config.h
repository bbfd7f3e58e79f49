/* SPDX-License-Identifier: MIT */
#ifndef KVB_BROKER_CONFIG_H
#define KVB_BROKER_CONFIG_H

#include <stddef.h>

struct kvb_options;

/* A config file's size bound (bytes). */
#define KVB_CONFIG_MAX (1 << 20)

/*
 * Read a config file (a regular file of at most KVB_CONFIG_MAX bytes; a FIFO,
 * device or directory is refused at once, a read error is an error): "key =
 * value" lines (keys: the broker's long options without "--"; a flag's value
 * true/false, yes/no, on/off or 1/0), blank lines and lines starting with '#'
 * skipped, a value in double quotes unquoted. Each setting is checked by the
 * option parser on its own. On success *entries holds *n command-line entries
 * ("--key=value", "--flag"), freed with kvb_config_free. Returns 0, or -errno
 * with "FILE:LINE: why" (or "FILE: why") in err. Not thread-safe (getopt).
 */
int kvb_config_read(const char *path, char ***entries, int *n, char *err,
		    size_t err_len);
void kvb_config_free(char **entries, int n);

/*
 * src for a terminal or a log: bytes below 0x20, 0x7f and above are written
 * as \xNN and a backslash as two, into dst (cap bytes, NUL-terminated,
 * truncated at a whole escape). Returns the length written.
 */
size_t kvb_config_escape(char *dst, size_t cap, const char *src);

/*
 * kvb_options_parse with --config: the command line is parsed; when it names
 * a file, the file's settings are parsed ahead of the command line's, which
 * win. Returns 0 or -errno with a message in err.
 */
int kvb_options_load(struct kvb_options *o, int argc, char **argv, char *err,
		     size_t err_len);

#endif

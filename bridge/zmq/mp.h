/* SPDX-License-Identifier: MIT */
/*
 * Private msgpack helpers shared by the notify codec and the handshake codec.
 *
 * msgpack-c sizes its object tree from the counts in the input before it has
 * seen the elements: a 5-byte "array32 of 4G elements" asks the zone for
 * 96 GiB. _kvb_mp_scan() walks the bytes first with hard bounds (depth, every
 * container count checked against the bytes left, total object budget), so
 * that msgpack_unpack_next() only ever runs on input whose tree is at most a
 * small multiple of its length.
 */
#ifndef KVB_BRIDGE_ZMQ_MP_H
#define KVB_BRIDGE_ZMQ_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

/*
 * Check that buf[0..len) holds exactly one well-formed msgpack object, nested
 * at most max_depth containers deep and made of at most max_objects objects.
 * Returns 0, or -EBADMSG with *reason set.
 */
int _kvb_mp_scan(const void *buf, size_t len, unsigned int max_depth,
		 size_t max_objects, const char **reason);

/*
 * Scan, then unpack buf into *up (msgpack_unpacked_init() done here). On 0
 * the caller owns *up and must msgpack_unpacked_destroy() it; on -EBADMSG or
 * -ENOMEM nothing is held. Strings in the tree point into buf.
 */
int _kvb_mp_unpack(msgpack_unpacked *up, const void *buf, size_t len,
		   unsigned int max_depth, size_t max_objects,
		   const char **reason);

/* True when s[0..len) is well-formed UTF-8 (no overlongs, no surrogates). */
bool _kvb_mp_utf8_valid(const uint8_t *s, size_t len);

/*
 * Check a map object: every key a str, no key twice, at most max_entries.
 * Returns 0 or -EBADMSG with *reason set.
 */
int _kvb_mp_map_check(const msgpack_object *map, uint32_t max_entries,
		      const char **reason);

/* The value of key in a checked map, or NULL. */
const msgpack_object *_kvb_mp_map_get(const msgpack_object *map,
				      const char *key);

/*
 * An identifier string: a msgpack str, 1..max bytes, UTF-8, no ASCII control
 * characters (so it is a clean C string once copied). Copies it NUL-terminated
 * into out[max + 1]. Returns 0 or -EBADMSG.
 */
int _kvb_mp_get_ident(const msgpack_object *o, char *out, size_t max);

/* Same checks on raw bytes. Returns 0 or -EBADMSG. */
int _kvb_mp_ident_check(const uint8_t *s, size_t len, size_t max);

/*
 * An integer in [min, max] (min >= 0 callers still see negatives rejected).
 * Returns 0, -ERANGE (an integer outside) or -EBADMSG (not an integer).
 */
int _kvb_mp_get_int(const msgpack_object *o, int64_t min, int64_t max,
		    int64_t *out);

/* True when the str object equals the NUL-terminated s. */
bool _kvb_mp_str_eq(const msgpack_object *o, const char *s);

/* Pack a NUL-terminated string as a msgpack str. Returns 0 or -ENOMEM. */
int _kvb_mp_pack_cstr(msgpack_packer *pk, const char *s);

#endif

// SPDX-License-Identifier: MIT
/*
 * Who may use the tcp data port (docs/security.md).
 *
 * Every broker instance makes an X25519 key pair at start and puts the
 * public key in its engine descriptor ("kx"). Two brokers that exchanged
 * descriptors derive the same per-pair key
 *
 *   K = BLAKE2b-256(key = cluster key or none,
 *                   "kvb-tcp-key-v1" | X25519(own sk, peer pk) |
 *                   lower pk | higher pk | lower tcp id | higher tcp id)
 *
 * which never goes on the wire: the data port's challenge-response
 * (bridge/tcp/auth.c) proves it. The server side allows a peer's tcp id with
 * K and the ids of the regions our last descriptor to it offered.
 *
 * With --cluster-key the descriptors themselves carry a MAC (BLAKE2b-derived
 * key, HMAC-SHA512-256): a handshake from a broker without the key is
 * refused, and a man in the middle cannot substitute public keys; the
 * cluster key also goes into K.
 */
#include "xnode_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define CK_MIN 16    /* bytes of a cluster key file, at least */
#define CK_MAX 4096u /* and at most */

static int read_cluster_key(struct kvb_xn *xn, const char *path)
{
	uint8_t buf[CK_MAX + 1];
	struct stat st;
	ssize_t n;
	int fd, rc = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		log_err("--cluster-key %s: %s", path, strerror(errno));
		return rc;
	}
	if (!fstat(fd, &st) && (st.st_mode & 077))
		log_warn("--cluster-key %s: readable by group or others "
			 "(chmod 600)",
			 path);
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < CK_MIN || n > (ssize_t) CK_MAX) {
		log_err("--cluster-key %s: %zd bytes: between %d and %u "
			"needed (e.g. head -c 32 /dev/urandom)",
			path, n, CK_MIN, CK_MAX);
		sodium_memzero(buf, sizeof(buf));
		return -EINVAL;
	}
	crypto_generichash(xn->ck, sizeof(xn->ck), buf, (size_t) n,
			   (const uint8_t *) "kvb-cluster-key", 15);
	crypto_generichash(xn->hs_key, sizeof(xn->hs_key),
			   (const uint8_t *) "kvb-hs-mac-v1", 13, xn->ck,
			   sizeof(xn->ck));
	sodium_memzero(buf, sizeof(buf));
	xn->has_ck = 1;
	return 0;
}

static void tcp_log(void *arg, const char *line)
{
	(void) arg;
	log_warn("%s", line);
}

static void tcp_setup(struct kvb_broker *b)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];
	struct kvb_xn *xn = kvb_xn_of(b);
	const struct kvb_transport_auth_ops *a = t ? t->ops->auth : NULL;
	const char *hosts[MAX_TRUSTED];
	unsigned n = 0;

	if (!a)
		return;
	a->set_limits(t, b->opt.tcp_max_conns, b->opt.tcp_max_conns_per_host,
		      b->opt.tcp_auth_ms);
	a->set_log(t, tcp_log, NULL);
	for (uint32_t i = 0; i < xn->ntrusted; i++) {
		const char *h = xn->trusted[i];

		/* the handshake compares strings; the data port addresses */
		if (a->set_trusted(t, &h, 1)) {
			log_warn("--trusted-hosts: '%s' is not a numeric "
				 "address: no tcp connection from it",
				 h);
			continue;
		}
		hosts[n++] = h;
	}
	/* a list of names only still closes the data port to everyone */
	if (xn->ntrusted && !n) {
		static const char *const none[] = {"::"};

		a->set_trusted(t, none, 1);
		return;
	}
	a->set_trusted(t, hosts, n);
}

int kvb_xn_auth_init(struct kvb_broker *b)
{
	struct kvb_xn *xn = kvb_xn_of(b);
	int rc;

	if (sodium_init() < 0)
		return -EIO;
	crypto_kx_keypair(xn->kx_pk, xn->kx_sk);
	if (b->opt.cluster_key[0]) {
		rc = read_cluster_key(xn, b->opt.cluster_key);
		if (rc)
			return rc;
	}
	tcp_setup(b);
	return 0;
}

void kvb_xn_auth_fini(struct kvb_xn *xn)
{
	sodium_memzero(xn->kx_sk, sizeof(xn->kx_sk));
	sodium_memzero(xn->ck, sizeof(xn->ck));
	sodium_memzero(xn->hs_key, sizeof(xn->hs_key));
}

int kvb_xn_auth_offer(struct kvb_broker *b, struct kvb_peer *p,
		      const struct kvb_hs_desc *mine)
{
	uint32_t n = 0, *ids;

	(void) b;
	for (uint32_t i = 0; i < mine->nworkers; i++)
		n += mine->workers[i].nregions;
	ids = malloc((n ? n : 1) * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	n = 0;
	for (uint32_t i = 0; i < mine->nworkers; i++)
		for (uint32_t j = 0; j < mine->workers[i].nregions; j++)
			ids[n++] = mine->workers[i].regions[j].id;
	free(p->offer);
	p->offer = ids;
	p->noffer = n;
	return 0;
}

void kvb_xn_auth_hs_mac(struct kvb_xn *xn, const char *label,
			const uint8_t *pre, const void *desc, size_t len,
			uint8_t mac[32])
{
	crypto_auth_hmacsha512256_state st;

	crypto_auth_hmacsha512256_init(&st, xn->hs_key, sizeof(xn->hs_key));
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *) label,
					 strlen(label) + 1);
	if (pre)
		crypto_auth_hmacsha512256_update(&st, pre, 32);
	crypto_auth_hmacsha512256_update(&st, desc, len);
	crypto_auth_hmacsha512256_final(&st, mac);
}

int kvb_xn_auth_hs_mac_ok(struct kvb_xn *xn, const char *label,
			  const uint8_t *pre, const void *desc, size_t len,
			  const void *mac, size_t mac_len)
{
	uint8_t want[32];
	int ok;

	if (mac_len != sizeof(want))
		return 0;
	kvb_xn_auth_hs_mac(xn, label, pre, desc, len, want);
	ok = !sodium_memcmp(want, mac, sizeof(want));
	sodium_memzero(want, sizeof(want));
	return ok;
}

/* K of this pair (see the top of the file); 0 or -EINVAL (a bad key) */
static int derive(struct kvb_xn *xn, const uint8_t *peer_pk, uint64_t own,
		  uint64_t peer, uint8_t key[KVB_TRANSPORT_KEY_LEN])
{
	uint8_t q[crypto_scalarmult_BYTES];
	crypto_generichash_state st;
	const uint8_t *lo = xn->kx_pk, *hi = peer_pk;
	uint64_t ids[2] = {own < peer ? own : peer, own < peer ? peer : own};

	/* all-zero result: a low-order point, no secret at all */
	if (crypto_scalarmult(q, xn->kx_sk, peer_pk))
		return -EINVAL;
	if (memcmp(lo, hi, 32) > 0) {
		lo = peer_pk;
		hi = xn->kx_pk;
	}
	crypto_generichash_init(&st, xn->has_ck ? xn->ck : NULL,
				xn->has_ck ? sizeof(xn->ck) : 0,
				KVB_TRANSPORT_KEY_LEN);
	crypto_generichash_update(&st, (const uint8_t *) "kvb-tcp-key-v1", 14);
	crypto_generichash_update(&st, q, sizeof(q));
	crypto_generichash_update(&st, lo, 32);
	crypto_generichash_update(&st, hi, 32);
	crypto_generichash_update(&st, (const uint8_t *) ids, sizeof(ids));
	crypto_generichash_final(&st, key, KVB_TRANSPORT_KEY_LEN);
	sodium_memzero(q, sizeof(q));
	return 0;
}

void kvb_xn_auth_tcp_peer(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];
	const struct kvb_transport_auth_ops *a = t ? t->ops->auth : NULL;
	const struct kvb_hs_transport *ht;
	uint8_t key[KVB_TRANSPORT_KEY_LEN];
	uint64_t id;
	int rc;

	if (!a || !p->have_desc)
		return;
	ht = kvb_xn_desc_transport(&p->desc, "tcp");
	if (!ht || a->blob_id(ht->conn, ht->conn_len, &id))
		return;
	if (!p->desc.has_kx) {
		if (!p->no_kx_logged++)
			log_warn("peer %s:%u offers no key exchange (an older "
				 "broker?): no tcp data plane with it",
				 p->host, p->port);
		return;
	}
	if (derive(kvb_xn_of(b), p->desc.kx, a->id(t), id, key)) {
		log_warn("peer %s:%u: unusable kx public key: no tcp data "
			 "plane with it",
			 p->host, p->port);
		return;
	}
	if (p->tcp_id && p->tcp_id != id)
		a->peer_forget(t, p->tcp_id);
	rc = a->peer_allow(t, id, key, p->offer, (int) p->noffer);
	if (rc)
		log_warn("peer %s:%u: tcp data port: cannot allow it: %s",
			 p->host, p->port, strerror(-rc));
	else
		p->tcp_id = id;
	if (p->ep[KVB_TS_TCP])
		a->ep_set_key(t, p->ep[KVB_TS_TCP], key);
	sodium_memzero(key, sizeof(key));
}

void kvb_xn_auth_tcp_forget(struct kvb_broker *b, struct kvb_peer *p)
{
	struct kvb_transport *t = b->trs[KVB_TS_TCP];

	if (p->tcp_id && t && t->ops->auth)
		t->ops->auth->peer_forget(t, p->tcp_id);
	p->tcp_id = 0;
}

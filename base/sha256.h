/* sha256.h - SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), for the
 * rendezvous's peer authentication (src/rendezvous.c). Tested against
 * FIPS 180-2 and RFC 4231 (tests/unit/sha256.c). Not constant time in
 * anything but the MAC comparison; no secret-dependent branches.
 * Thread-safe (no shared state). */
#ifndef RUDA_BASE_SHA256_H
#define RUDA_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define RUDA__SHA256_BYTES 32

typedef struct ruda__sha256 {
  uint32_t h[8];
  uint64_t bytes;
  uint8_t buf[64];
  uint32_t nbuf;
} ruda__sha256;

void ruda__sha256_init(ruda__sha256 *s);
void ruda__sha256_update(ruda__sha256 *s, const void *p, size_t n);
void ruda__sha256_final(ruda__sha256 *s, uint8_t out[RUDA__SHA256_BYTES]);

/* HMAC in parts: init with the key, update with the message's pieces,
 * final writes the 32-byte tag. */
typedef struct ruda__hmac {
  ruda__sha256 inner, outer;
} ruda__hmac;

void ruda__hmac_init(ruda__hmac *m, const uint8_t *key, size_t klen);
void ruda__hmac_update(ruda__hmac *m, const void *p, size_t n);
void ruda__hmac_final(ruda__hmac *m, uint8_t out[RUDA__SHA256_BYTES]);

/* 1 when the n bytes are equal, else 0. Reads all n bytes of both
 * whatever they hold, so the time depends on n only, not on where they
 * differ (volatile accesses, which no compiler may drop: sha256.c).
 * Thread-safe, non-blocking. */
int ruda__bytes_equal(const uint8_t *a, const uint8_t *b, size_t n);

#endif /* RUDA_BASE_SHA256_H */

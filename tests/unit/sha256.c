/* sha256.c - base/sha256.c against the published vectors: SHA-256 from
 * FIPS 180-2 (appendix B: "abc", the 448-bit message, a million 'a'),
 * HMAC-SHA-256 from RFC 4231 (test cases 1 to 7: short, block-sized and
 * longer-than-a-block keys, the truncated tag of case 5), a message fed in
 * every split giving the one-shot digest, and the tag comparison. */
#include "common.h"
#include "base/sha256.h"

/* Hex to bytes; returns the byte count. */
static size_t unhex(const char *hex, uint8_t *out) {
  size_t n = strlen(hex) / 2;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
    out[i] = (uint8_t)v;
  }
  return n;
}

static void digest_of(const void *p, size_t n, uint8_t out[RUDA__SHA256_BYTES]) {
  ruda__sha256 s;
  ruda__sha256_init(&s);
  ruda__sha256_update(&s, p, n);
  ruda__sha256_final(&s, out);
}

/* got starts with the bytes of the hex string want (all 32, or the
 * truncated tag's 16). */
static void assert_hex(const uint8_t *got, const char *want) {
  uint8_t w[RUDA__SHA256_BYTES];
  const size_t n = unhex(want, w);
  for (size_t i = 0; i < n; i++)
    if (got[i] != w[i]) fail_msg("byte %zu is %02x, the vector says %02x (%s)", i, got[i], w[i], want);
}

static void fips_180_2_vectors(void **state) {
  (void)state;
  uint8_t d[RUDA__SHA256_BYTES];
  digest_of("abc", 3, d); /* B.1, one block */
  assert_hex(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  /* B.2, two blocks: the padding does not fit behind 448 bits. */
  const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  digest_of(m2, strlen(m2), d);
  assert_hex(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* B.3, a million 'a', fed in uneven pieces. */
  static uint8_t a[1000000];
  memset(a, 'a', sizeof a);
  ruda__sha256 s;
  ruda__sha256_init(&s);
  for (size_t off = 0, k = 1; off < sizeof a; off += k, k = k * 3 % 997 + 1)
    ruda__sha256_update(&s, a + off, off + k > sizeof a ? sizeof a - off : k);
  ruda__sha256_final(&s, d);
  assert_hex(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  /* The empty message. */
  digest_of("", 0, d);
  assert_hex(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

/* Lengths either side of where the length field stops fitting in the last
 * block (55/56 bytes) and of a whole block, against digests from another
 * implementation (Python's hashlib) of n 'a's. */
static void padding_boundaries(void **state) {
  (void)state;
  static const struct {
    size_t n;
    const char *hex;
  } v[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  uint8_t a[128], d[RUDA__SHA256_BYTES];
  memset(a, 'a', sizeof a);
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    digest_of(a, v[i].n, d);
    assert_hex(d, v[i].hex);
  }
}

/* Any split of a message into two updates gives the one-shot digest. */
static void every_split(void **state) {
  (void)state;
  uint8_t m[200], whole[RUDA__SHA256_BYTES], parts[RUDA__SHA256_BYTES];
  for (size_t i = 0; i < sizeof m; i++) m[i] = (uint8_t)(i * 131 + 7);
  for (size_t n = 0; n <= sizeof m; n += 13) {
    digest_of(m, n, whole);
    for (size_t cut = 0; cut <= n; cut++) {
      ruda__sha256 s;
      ruda__sha256_init(&s);
      ruda__sha256_update(&s, m, cut);
      ruda__sha256_update(&s, m + cut, n - cut);
      ruda__sha256_final(&s, parts);
      assert_memory_equal(parts, whole, sizeof whole);
    }
  }
}

static void hmac_of(const uint8_t *key, size_t klen, const void *msg, size_t n, uint8_t out[RUDA__SHA256_BYTES]) {
  ruda__hmac m;
  ruda__hmac_init(&m, key, klen);
  ruda__hmac_update(&m, msg, n);
  ruda__hmac_final(&m, out);
}

static void rfc_4231_vectors(void **state) {
  (void)state;
  static const struct {
    const char *key; /* hex */
    const char *data; /* text, or hex when hex_data */
    int hex_data;
    const char *mac; /* case 5: the 128-bit truncation */
  } v[] = {
      {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "Hi There", 0,
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"4a656665", "what do ya want for nothing?", 0,
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd", 1,
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"0102030405060708090a0b0c0d0e0f10111213141516171819",
       "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd", 1,
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "Test With Truncation", 0, "a3b6167473100ee06e0c796c2955552b"},
      {NULL, "Test Using Larger Than Block-Size Key - Hash Key First", 0,
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {NULL,
       "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
       "hashed before being used by the HMAC algorithm.",
       0, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    uint8_t key[131], data[256], mac[RUDA__SHA256_BYTES];
    size_t klen, dlen;
    if (v[i].key != NULL) {
      klen = unhex(v[i].key, key);
    } else { /* cases 6 and 7: 131 bytes of 0xaa, hashed first */
      klen = sizeof key;
      memset(key, 0xaa, klen);
    }
    if (v[i].hex_data) {
      dlen = unhex(v[i].data, data);
    } else {
      dlen = strlen(v[i].data);
      memcpy(data, v[i].data, dlen);
    }
    hmac_of(key, klen, data, dlen, mac);
    assert_hex(mac, v[i].mac);
    /* The message in two pieces gives the same tag. */
    ruda__hmac m;
    ruda__hmac_init(&m, key, klen);
    ruda__hmac_update(&m, data, dlen / 3);
    ruda__hmac_update(&m, data + dlen / 3, dlen - dlen / 3);
    uint8_t again[RUDA__SHA256_BYTES];
    ruda__hmac_final(&m, again);
    assert_memory_equal(again, mac, sizeof mac);
  }
}

/* Equal only when every byte is: a difference in the first, a middle or
 * the last byte, in one bit or all, is found; nothing to compare is equal. */
static void bytes_equal(void **state) {
  (void)state;
  uint8_t a[32], b[32];
  for (size_t i = 0; i < sizeof a; i++) a[i] = b[i] = (uint8_t)(i * 37);
  assert_int_equal(ruda__bytes_equal(a, b, sizeof a), 1);
  assert_int_equal(ruda__bytes_equal(a, b, 0), 1);
  for (size_t i = 0; i < sizeof a; i++) {
    for (unsigned bit = 0; bit < 8; bit++) {
      b[i] ^= (uint8_t)(1u << bit);
      assert_int_equal(ruda__bytes_equal(a, b, sizeof a), 0);
      assert_int_equal(ruda__bytes_equal(a, b, i), 1); /* the bytes before it */
      b[i] ^= (uint8_t)(1u << bit);
    }
    b[i] = (uint8_t)~a[i];
    assert_int_equal(ruda__bytes_equal(a, b, sizeof a), 0);
    b[i] = a[i];
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fips_180_2_vectors),
      cmocka_unit_test(padding_boundaries),
      cmocka_unit_test(every_split),
      cmocka_unit_test(rfc_4231_vectors),
      cmocka_unit_test(bytes_equal),
  };
  return test_main("unit_sha256", tests, sizeof tests / sizeof tests[0], argc, argv);
}

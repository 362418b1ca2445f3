/* half.h - f16 and bf16 to and from f32, for reductions done on the host
 * (the host backend's collectives, the MPI transport). Header only,
 * thread-safe, no state. Rounding to nearest even, as the device does;
 * NaN stays NaN, overflow becomes infinity. */
#ifndef RUDA_BASE_HALF_H
#define RUDA_BASE_HALF_H

#include <stdint.h>
#include <string.h>

static inline float ruda__f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t ruda__bits_of_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float ruda__bf16_to_f32(uint16_t h) { return ruda__f32_of_bits((uint32_t)h << 16); }

static inline uint16_t ruda__f32_to_bf16(float f) {
  uint32_t u = ruda__bits_of_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float ruda__f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return ruda__f32_of_bits(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
  if (exp != 0) return ruda__f32_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
  /* Zero or subnormal: man * 2^-24, exact in f32. */
  float f = (float)man * (1.0f / 16777216.0f);
  return sign ? -f : f;
}

static inline uint16_t ruda__f32_to_f16(float f) {
  const uint32_t u = ruda__bits_of_f32(f), sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
  if (abs >= 0x38800000u) {                                  /* normal in f16 */
    uint32_t r = abs - 0x38000000u;                          /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  /* Subnormal or zero in f16: units of 2^-24, rounded to nearest even. */
  float a = ruda__f32_of_bits(abs) * 16777216.0f;
  uint32_t q = (uint32_t)a;
  float rest = a - (float)q;
  if (rest > 0.5f || (rest == 0.5f && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}

#endif /* RUDA_BASE_HALF_H */

/* bfloat16 <-> float32 for the engine's C kernels (bf16 is the top half of a float32's bits), and a float32's bits. */
#ifndef CHATSITE_BF16_H
#define CHATSITE_BF16_H

#include <stdint.h>
#include <string.h>

/* The bits of |v|: NaN and infinity tests by bits, since -ffast-math lets the compiler assume v == v and v finite.
 * NaN: > 0x7f800000; finite: < 0x7f800000. */
static inline uint32_t f32_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion; NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif

/* What the float32 panel kernel's two files share (linear_fma.c: the register tiles and entry points;
 * linear_fma_pack.c: the load-time packing), which is all that differs between AVX2 and AVX-512: the panel width and
 * register tile shape, and the vector type with its operations (loads and FMAs, the swiglu activation, a panel row of
 * Q8_0 or Q4_1 weights dequantized). The operations are static inline so that the tiles keep them inlined.
 */
#ifndef CHATSITE_LINEAR_FMA_H
#define CHATSITE_LINEAR_FMA_H

#include <stdint.h>

/* The register tile's shape, by vector width: MR = 6 rows by NB panels of PANEL columns. AVX2: panels of 8 columns (one
 * ymm), 6 x 16 sums in 12 of the 16 ymm (BLIS's haswell sgemm). AVX-512: panels of 16 columns (one zmm), 6 x 64 sums
 * in 24 of the 32 zmm, 4 weight loads and 6 broadcasts per 24 FMAs (measured fastest of 12 x 32, 8 x 48 and 6 x 64 on
 * a Zen 5). A work item keeps 64 columns either way. */
#if defined(__AVX512F__)
#define PANEL 16
#define NB 4
#define ITEM_BLOCKS 1
#else
#define PANEL 8
#define NB 2          /* panels per column block */
#define ITEM_BLOCKS 4 /* column blocks per work item */
#endif
#define MR 6  /* rows per register block */
#define MC 96 /* rows per chunk: 96 x 1536 floats = 590 KB, within a Zen core's L2; a multiple of MR */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

#if defined(__AVX512F__)
typedef __m512 vec_t;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VBROADCAST(p) _mm512_set1_ps(*(p))
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)

/* glibc's libmvec expf for 16 floats (what GCC calls for an AVX-512-vectorised expf loop; linked with -lmvec). */
__m512 _ZGVeN16v_expf(__m512 x);

/* silu(g) * u = g / (1 + exp(-g)) * u on 16 sums; 0 where g < -88 (silu's limit; there exp(-g) would overflow, and
 * under -ffast-math GCC divides by a reciprocal estimate and a Newton step, which makes 1 / inf NaN). */
static inline vec_t swiglu_vec(vec_t g, vec_t u) {
    const __mmask16 live = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-88.f), _CMP_GE_OQ);
    const __m512 e = _ZGVeN16v_expf(_mm512_maskz_sub_ps(live, _mm512_setzero_ps(), g));
    return _mm512_maskz_mul_ps(live, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}

/* PANEL int8 weights at q times their column's scale: one rounding, as gguf-py's float32 dequantize. */
static inline vec_t dequant_q8_vec(const int8_t *q, vec_t scale) {
    const __m128i q8 = _mm_loadu_si128((const __m128i *)q);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)), scale);
}

/* PANEL Q4_1 weights from PANEL / 2 bytes at q (fma_pack_q4_1's nibble order): q * d + m. q * d is exact in float32
 * (4 bits times a float16's 11), so the one rounding of the FMA is gguf-py's d * q + m bit for bit. */
static inline vec_t dequant_q4_vec(const uint8_t *q, vec_t d, vec_t m) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)q), low = _mm_set1_epi8(0x0F);
    const __m128i nibbles = _mm_unpacklo_epi64(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nibbles)), d, m);
}
#else
typedef __m256 vec_t;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VBROADCAST(p) _mm256_broadcast_ss(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)

/* glibc's libmvec expf for 8 floats (what GCC calls for an AVX2-vectorised expf loop; linked with -lmvec). */
__m256 _ZGVdN8v_expf(__m256 x);

/* silu(g) * u = g / (1 + exp(-g)) * u on 8 sums; 0 where g < -88 (silu's limit; there exp(-g) would overflow,
 * and under -ffast-math GCC divides by a reciprocal estimate and a Newton step, which makes 1 / inf NaN). */
static inline vec_t swiglu_vec(vec_t g, vec_t u) {
    const __m256 live = _mm256_cmp_ps(g, _mm256_set1_ps(-88.f), _CMP_GE_OQ);
    const __m256 e = _ZGVdN8v_expf(_mm256_and_ps(live, _mm256_sub_ps(_mm256_setzero_ps(), g)));
    return _mm256_and_ps(live, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), u));
}

/* PANEL int8 weights at q times their column's scale: one rounding, as gguf-py's float32 dequantize. */
static inline vec_t dequant_q8_vec(const int8_t *q, vec_t scale) {
    const __m128i q8 = _mm_loadl_epi64((const __m128i *)q);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), scale);
}

/* PANEL Q4_1 weights from PANEL / 2 bytes at q (fma_pack_q4_1's nibble order): q * d + m. q * d is exact in float32
 * (4 bits times a float16's 11), so the one rounding of the FMA is gguf-py's d * q + m bit for bit. */
static inline vec_t dequant_q4_vec(const uint8_t *q, vec_t d, vec_t m) {
    int32_t word;
    memcpy(&word, q, 4);
    const __m128i b = _mm_cvtsi32_si128(word), low = _mm_set1_epi8(0x0F);
    const __m128i nibbles = _mm_unpacklo_epi32(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles)), d, m);
}
#endif
#endif

#endif

/* y = x @ W^T (+ b) for the few rows of a decode step, with W held in GGUF's block-quantized formats Q4_1 and Q8_0.
 *
 * The default model ships as a GGUF file whose projections are Q4_1 and whose (tied) embedding and lm_head are
 * Q8_0; the engine runs the dequantized values. The values are recovered exactly in this block form at load
 * (inference/engine/block_quant.py), so a one-sequence decode step can read ~5 bits per weight instead of 32
 * (float32) or 16 (bf16): a batch-1 step is bound by weight bytes per token. Formats and dot-product
 * factoring after llama.cpp (ggml-quants.c: ggml_vec_dot_q4_1_q8_1, ggml_vec_dot_q8_0_q8_0), with the
 * activations kept in float32 instead of being quantized to 8 bits, so the product is the float32 model's up to
 * summation order.
 *
 * Blocks of 32 input features; for output column c and block b:
 *   Q4_1: w[c][32b + j] = d[c][b] * q + mn[c][b], q = qs[c][16b + j] & 15 (j < 16) or qs[c][16b + j - 16] >> 4
 *   Q8_0: w[c][32b + j] = d[c][b] * qs[c][32b + j] (int8)
 * so sum_j x_j w_j = d * sum_j x_j q_j (+ mn * sum_j x_j): the row's per-block sums of x are computed once per
 * call, and each column costs one float dot product per block on the unpacked integers.
 *
 * Layouts (contiguous): x [m, k], bias [n] or NULL, y [m, n], element type float or bf16 (uint16_t);
 * qs [n, k/2] uint8 (Q4_1) or [n, k] int8 (Q8_0); d, mn [n, k/32] float. scratch: m*k + m*(k/32) floats.
 * Returns 0, or 1 when k is not a multiple of 32 or m < 1 (the caller uses oneDNN instead).
 */
#include <stdint.h>

#include "bf16.h"

#define QK 32
#define MAX_M 8
#define BLOCK 32

#define F32_ID(x) (x)

/* x as float32 in scratch[0 : m*k], each row's block sums in scratch[m*k : m*k + m*nb]. */
#define STAGE_ROWS(T, LOAD)                                                                                    \
    float *xf = scratch, *xsum = scratch + m * k;                                                              \
    const int64_t nb = k / QK;                                                                                 \
    for (int64_t j = 0; j < m * k; j++) xf[j] = LOAD(x[j]);                                                    \
    for (int64_t i = 0; i < m * nb; i++) {                                                                     \
        float s = 0.f;                                                                                         \
        for (int l = 0; l < QK; l++) s += xf[i * QK + l];                                                      \
        xsum[i] = s;                                                                                           \
    }

/* Q4_1's offsets: sum over blocks of mn[b] * (sum of the row's x in block b). */
static inline float min_terms(const float *mn, const float *xsum_row, int64_t nb) {
    float s = 0.f;
    for (int64_t b = 0; b < nb; b++) s += mn[b] * xsum_row[b];
    return s;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

/* One block's 32 weights are NV registers of VL floats: 2 with AVX-512 (half the AVX2 path's instructions; a
 * 2-vCPU Xeon, the bf16 model's projections, one row: ~2x faster), 4 with AVX2. */
#if defined(__AVX512F__)
#define VL 16
typedef __m512 vec;
#define VLOAD _mm512_loadu_ps
#define VMUL _mm512_mul_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define VSUM _mm512_reduce_add_ps
static inline vec u8_to_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
static inline vec i8_to_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
/* Q4_1: byte j holds element j in its low nibble and element j + 16 in its high one. */
static inline void q4_1_weights(const uint8_t *q, vec *w) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)q), low = _mm_set1_epi8(15);
    w[0] = u8_to_ps(_mm_and_si128(raw, low));
    w[1] = u8_to_ps(_mm_and_si128(_mm_srli_epi16(raw, 4), low));
}
static inline void q8_0_weights(const int8_t *q, vec *w) {
    w[0] = i8_to_ps(_mm_loadu_si128((const __m128i *)q));
    w[1] = i8_to_ps(_mm_loadu_si128((const __m128i *)(q + 16)));
}
#else
#define VL 8
typedef __m256 vec;
#define VLOAD _mm256_loadu_ps
#define VMUL _mm256_mul_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
static inline float VSUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vec u8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
static inline vec i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline void q4_1_weights(const uint8_t *q, vec *w) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)q), low = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    w[0] = u8_to_ps(lo), w[1] = u8_to_ps(_mm_srli_si128(lo, 8));
    w[2] = u8_to_ps(hi), w[3] = u8_to_ps(_mm_srli_si128(hi, 8));
}
static inline void q8_0_weights(const int8_t *q, vec *w) {
    const __m128i r0 = _mm_loadu_si128((const __m128i *)q), r1 = _mm_loadu_si128((const __m128i *)(q + 16));
    w[0] = i8_to_ps(r0), w[1] = i8_to_ps(_mm_srli_si128(r0, 8));
    w[2] = i8_to_ps(r1), w[3] = i8_to_ps(_mm_srli_si128(r1, 8));
}
#endif
#define NV (QK / VL)

/* sums[i] = sum over blocks b of d[b] * (x_i . w_b) for rows i < M; WEIGHTS unpacks block b's integers. */
#define COLUMN(WEIGHTS, q, QSTRIDE)                                                                            \
    const int64_t nb = k / QK;                                                                                 \
    vec acc[MAX_M];                                                                                            \
    for (int64_t i = 0; i < M; i++) acc[i] = VZERO();                                                          \
    for (int64_t b = 0; b < nb; b++) {                                                                         \
        vec w[NV];                                                                                             \
        WEIGHTS(q + b * (QSTRIDE), w);                                                                         \
        const vec db = VSET1(d[b]);                                                                            \
        for (int64_t i = 0; i < M; i++) {                                                                      \
            const float *xb = xf + i * k + b * QK;                                                             \
            vec t = VMUL(VLOAD(xb), w[0]);                                                                     \
            for (int v = 1; v < NV; v++) t = VFMA(VLOAD(xb + v * VL), w[v], t);                                \
            acc[i] = VFMA(db, t, acc[i]);                                                                      \
        }                                                                                                      \
    }

static inline __attribute__((always_inline)) void q4_1_col(const float *xf, const float *xsum, const uint8_t *q,
                                                           const float *d, const float *mn, int64_t M,
                                                           int64_t k, float *sums) {
    COLUMN(q4_1_weights, q, QK / 2)
    for (int64_t i = 0; i < M; i++) sums[i] = VSUM(acc[i]) + min_terms(mn, xsum + i * nb, nb);
}

static inline __attribute__((always_inline)) void q8_0_col(const float *xf, const float *xsum, const int8_t *q,
                                                           const float *d, const float *mn, int64_t M,
                                                           int64_t k, float *sums) {
    (void)xsum;
    (void)mn;
    COLUMN(q8_0_weights, q, QK)
    for (int64_t i = 0; i < M; i++) sums[i] = VSUM(acc[i]);
}

#else /* portable C: the compiler vectorises what it can */

static inline __attribute__((always_inline)) void q4_1_col(const float *xf, const float *xsum, const uint8_t *q,
                                                           const float *d, const float *mn, int64_t M,
                                                           int64_t k, float *sums) {
    const int64_t nb = k / QK;
    float acc[MAX_M][QK / 2];
    for (int64_t i = 0; i < M; i++)
        for (int l = 0; l < QK / 2; l++) acc[i][l] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        float lo[QK / 2], hi[QK / 2];
        for (int l = 0; l < QK / 2; l++) {
            lo[l] = (float)(q[b * 16 + l] & 15);
            hi[l] = (float)(q[b * 16 + l] >> 4);
        }
        const float db = d[b];
        for (int64_t i = 0; i < M; i++) {
            const float *xb = xf + i * k + b * QK;
            for (int l = 0; l < QK / 2; l++) acc[i][l] += db * (xb[l] * lo[l] + xb[l + 16] * hi[l]);
        }
    }
    for (int64_t i = 0; i < M; i++) {
        float s = 0.f;
        for (int l = 0; l < QK / 2; l++) s += acc[i][l];
        sums[i] = s + min_terms(mn, xsum + i * nb, nb);
    }
}

static inline __attribute__((always_inline)) void q8_0_col(const float *xf, const float *xsum, const int8_t *q,
                                                           const float *d, const float *mn, int64_t M,
                                                           int64_t k, float *sums) {
    (void)xsum;
    (void)mn;
    const int64_t nb = k / QK;
    float acc[MAX_M][QK / 2];
    for (int64_t i = 0; i < M; i++)
        for (int l = 0; l < QK / 2; l++) acc[i][l] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        float w[QK];
        for (int l = 0; l < QK; l++) w[l] = (float)q[b * QK + l];
        const float db = d[b];
        for (int64_t i = 0; i < M; i++) {
            const float *xb = xf + i * k + b * QK;
            for (int l = 0; l < QK / 2; l++) acc[i][l] += db * (xb[l] * w[l] + xb[l + 16] * w[l + 16]);
        }
    }
    for (int64_t i = 0; i < M; i++) {
        float s = 0.f;
        for (int l = 0; l < QK / 2; l++) s += acc[i][l];
        sums[i] = s;
    }
}

#endif

/* NAME(x, qs, d, mn, bias, y, m, n, k, scratch); QBYTES = bytes of qs per weight row per block. Rows go in
 * chunks of MAX_M per output column, so a column's blocks are read from memory once for all rows. */
#define DEFINE_LINEAR_BLOCKS(NAME, T, LOAD, STORE, COL, QT, QBYTES)                                          \
    int NAME(const T *x, const QT *qs, const float *d, const float *mn, const T *bias, T *y, int64_t m,        \
             int64_t n, int64_t k, float *scratch) {                                                           \
        if (k % QK != 0 || m < 1) return 1;                                                                    \
        STAGE_ROWS(T, LOAD)                                                                                    \
        _Pragma("omp parallel for schedule(static)") for (int64_t c0 = 0; c0 < n; c0 += BLOCK) {               \
            const int64_t end = c0 + BLOCK < n ? c0 + BLOCK : n;                                               \
            for (int64_t c = c0; c < end; c++) {                                                               \
                const QT *qc = qs + c * nb * QBYTES;                                                           \
                const float *mc = mn ? mn + c * nb : 0;                                                        \
                const float *dc = d + c * nb;                                                                  \
                const float add = bias ? LOAD(bias[c]) : 0.f;                                                  \
                for (int64_t r0 = 0; r0 < m; r0 += MAX_M) {                                                    \
                    float sums[MAX_M];                                                                         \
                    const float *xr = xf + r0 * k, *sr = xsum + r0 * nb;                                       \
                    const int64_t rm = m - r0 < MAX_M ? m - r0 : MAX_M;                                        \
                    switch (rm) { /* a constant row count per case keeps the accumulators in registers */       \
                        case 1: COL(xr, sr, qc, dc, mc, 1, k, sums); break;                                    \
                        case 2: COL(xr, sr, qc, dc, mc, 2, k, sums); break;                                    \
                        case 3: COL(xr, sr, qc, dc, mc, 3, k, sums); break;                                    \
                        case 4: COL(xr, sr, qc, dc, mc, 4, k, sums); break;                                    \
                        case 5: COL(xr, sr, qc, dc, mc, 5, k, sums); break;                                    \
                        case 6: COL(xr, sr, qc, dc, mc, 6, k, sums); break;                                    \
                        case 7: COL(xr, sr, qc, dc, mc, 7, k, sums); break;                                    \
                        default: COL(xr, sr, qc, dc, mc, 8, k, sums); break;                                   \
                    }                                                                                          \
                    for (int64_t i = 0; i < rm; i++) y[(r0 + i) * n + c] = STORE(sums[i] + add);               \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        return 0;                                                                                              \
    }

DEFINE_LINEAR_BLOCKS(linear_q4_1_f32, float, F32_ID, F32_ID, q4_1_col, uint8_t, 16)
DEFINE_LINEAR_BLOCKS(linear_q4_1_bf16, uint16_t, bf16_to_f32, f32_to_bf16, q4_1_col, uint8_t, 16)
DEFINE_LINEAR_BLOCKS(linear_q8_0_f32, float, F32_ID, F32_ID, q8_0_col, int8_t, 32)
DEFINE_LINEAR_BLOCKS(linear_q8_0_bf16, uint16_t, bf16_to_f32, f32_to_bf16, q8_0_col, int8_t, 32)

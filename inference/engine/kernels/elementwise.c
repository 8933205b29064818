/* The per-layer element-wise steps of a Llama layer, one call each instead of several torch ops.
 *
 * At batch 1 a decode step runs ~600 small torch ops (RMSNorm alone is pow, mean, add, rsqrt and two muls,
 * ~40 us per call on 2 threads); each is dispatched, allocated and (from torch's grain size up) forked onto
 * the OpenMP pool. These kernels do the same math in one pass per row:
 *   rms_norm:  y = w * (x * rsqrt(mean(x^2) + eps))      (LlamaRMSNorm; the product x * r rounded to T first)
 *   add_rms_norm: x += d (the residual add, in place), then rms_norm of x: one pass over x instead of two
 *              (vLLM's fused_add_rms_norm)
 *   silu_mul:  y[t, j] = silu(gu[t, j]) * gu[t, I + j]    (LlamaMLP's act(gate) * up on the fused gate_up)
 *   argmax:    out[t] = the first j with x[t, j] maximal    (greedy decoding; torch.argmax's result, a NaN
 *              counting as the maximum)
 * Layouts (contiguous): x, y [rows, dim]; w [dim]; gu [rows, 2 * inter], y [rows, inter]; element type float or
 * bf16 (uint16_t, rounded to nearest even at the same points torch rounds). Sums in float32; the results match
 * torch's up to float rounding of the mean. Rows split over torch's OpenMP threads only when there is enough
 * work to pay for the fork.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define F32_ID(x) (x)
#define BF16_NAN(b) (((b) & 0x7fffu) > 0x7f80u)
#define F32_NAN(v) (f32_bits(v) > 0x7f800000u)

#define PARALLEL_MIN 65536 /* elements: below this one thread is faster than forking */

/* One row of RMSNorm: yr = w * (xr * rsqrt(mean(xr^2) + eps)). */
#define NORM_ROW(LOAD, STORE)                                                                                  \
    float ss = 0.f;                                                                                           \
    for (int64_t j = 0; j < dim; j++) {                                                                       \
        const float v = LOAD(xr[j]);                                                                          \
        ss += v * v;                                                                                          \
    }                                                                                                         \
    const float inv = 1.f / sqrtf(ss / (float)dim + eps);                                                     \
    for (int64_t j = 0; j < dim; j++) yr[j] = STORE(LOAD(w[j]) * LOAD(STORE(LOAD(xr[j]) * inv)));

#define DEFINE_ELEMENTWISE(SUFFIX, T, LOAD, STORE)                                                          \
    void rms_norm_##SUFFIX(const T *x, const T *w, T *y, int64_t rows, int64_t dim, float eps) {              \
        _Pragma("omp parallel for schedule(static) if (rows * dim >= PARALLEL_MIN)")                          \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            const T *xr = x + r * dim;                                                                        \
            T *yr = y + r * dim;                                                                              \
            NORM_ROW(LOAD, STORE)                                                                             \
        }                                                                                                     \
    }                                                                                                         \
    /* x[r] += d[r] (rounded to T, as torch's add_) for r < drows, then rms_norm of every row of x. */        \
    void add_rms_norm_##SUFFIX(T *x, const T *d, int64_t drows, const T *w, T *y, int64_t rows, int64_t dim,   \
                               float eps) {                                                                   \
        _Pragma("omp parallel for schedule(static) if (rows * dim >= PARALLEL_MIN)")                          \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            T *xr = x + r * dim;                                                                              \
            T *yr = y + r * dim;                                                                              \
            if (r < drows)                                                                                    \
                for (int64_t j = 0; j < dim; j++) xr[j] = STORE(LOAD(xr[j]) + LOAD(d[r * dim + j]));         \
            NORM_ROW(LOAD, STORE)                                                                             \
        }                                                                                                     \
    }                                                                                                         \
    void silu_mul_##SUFFIX(const T *gu, T *y, int64_t rows, int64_t inter) {                                  \
        _Pragma("omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN)")                        \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            const T *g = gu + r * 2 * inter, *u = g + inter;                                                  \
            T *yr = y + r * inter;                                                                            \
            for (int64_t j = 0; j < inter; j++) {                                                             \
                const float a = LOAD(g[j]);                                                                   \
                yr[j] = STORE(LOAD(STORE(a / (1.f + expf(-a)))) * LOAD(u[j]));                                \
            }                                                                                                 \
        }                                                                                                     \
    }

/* Two passes per row, both vectorised: the maximum (and whether any NaN), then the first index holding it (the
 * early-exit scan is scalar but stops at the answer). Torch's argmax reads a [32, 49152] bf16 logits tensor in
 * ~0.5 ms on 2 threads after a 0.2 ms float32 copy; this takes ~0.1 ms. */
#define DEFINE_ARGMAX(SUFFIX, T, LOAD, ISNAN)                                                                  \
    void argmax_##SUFFIX(const T *x, int64_t *out, int64_t rows, int64_t n) {                                 \
        _Pragma("omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN)")                            \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            const T *xr = x + r * n;                                                                          \
            float best = LOAD(xr[0]);                                                                         \
            int nan = 0;                                                                                      \
            for (int64_t j = 0; j < n; j++) {                                                                 \
                const float v = LOAD(xr[j]);                                                                  \
                best = v > best ? v : best;                                                                   \
                nan |= ISNAN(xr[j]);                                                                          \
            }                                                                                                 \
            int64_t at = 0;                                                                                   \
            if (nan) {                                                                                        \
                while (!ISNAN(xr[at])) at++;                                                                  \
            } else {                                                                                          \
                while (LOAD(xr[at]) != best) at++;                                                            \
            }                                                                                                 \
            out[r] = at;                                                                                      \
        }                                                                                                     \
    }

DEFINE_ARGMAX(f32, float, F32_ID, F32_NAN)
DEFINE_ARGMAX(bf16, uint16_t, bf16_to_f32, BF16_NAN)

DEFINE_ELEMENTWISE(f32, float, F32_ID, F32_ID)
DEFINE_ELEMENTWISE(bf16, uint16_t, bf16_to_f32, f32_to_bf16)

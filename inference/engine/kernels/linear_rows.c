/* y = x @ W^T (+ b) for 1-8 rows of x, reading W once at memory bandwidth (the engine uses it for decode steps
 * of one sequence: from two rows up oneDNN's packed kernel is as fast here).
 *
 * Built with decode_attention.c (see inference/engine/kernels/build.py). For one row oneDNN's packed
 * bf16 kernel reads the default model's 270 MB of weights at ~11-13 GB/s on this box (21 ms of a 27 ms
 * batch-1 step) while one core streams ~19 GB/s; this kernel is a plain dot product per output column,
 * vectorised by the compiler, one OpenMP work item per block of output columns.
 *
 * Layouts (contiguous): x [m, k], w [n, k] (torch's Linear weight), bias [n] or NULL, y [m, n]; element type
 * bf16 (uint16_t) or float; sums in float32, bf16 output rounded to nearest even.
 * Returns 0, or 1 when k is not a multiple of 16 or m is outside 1..8 (the caller uses oneDNN instead).
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define LANES 16
#define MAX_M 8
#define BLOCK 64

#define F32_ID(x) (x)

#define DEFINE_LINEAR(NAME, T, LOAD, STORE)                                                                   \
    static inline __attribute__((always_inline)) void NAME##_col(const float *xf, const T *wr, int64_t M,    \
                                                                 int64_t k, float *sums) {                    \
        float part[MAX_M][LANES];                                                                              \
        for (int64_t i = 0; i < M; i++)                                                                        \
            for (int l = 0; l < LANES; l++) part[i][l] = 0.f;                                                  \
        for (int64_t d = 0; d < k; d += LANES) {                                                               \
            float wf[LANES];                                                                                   \
            for (int l = 0; l < LANES; l++) wf[l] = LOAD(wr[d + l]);                                           \
            for (int64_t i = 0; i < M; i++)                                                                    \
                for (int l = 0; l < LANES; l++) part[i][l] += xf[i * k + d + l] * wf[l];                      \
        }                                                                                                      \
        for (int64_t i = 0; i < M; i++) {                                                                      \
            float s = 0.f;                                                                                     \
            for (int l = 0; l < LANES; l++) s += part[i][l];                                                   \
            sums[i] = s;                                                                                       \
        }                                                                                                      \
    }                                                                                                          \
    int NAME(const T *x, const T *w, const T *bias, T *y, int64_t m, int64_t n, int64_t k, float *xf) {        \
        if (k % LANES != 0 || m < 1 || m > MAX_M) return 1;                                                    \
        for (int64_t j = 0; j < m * k; j++) xf[j] = LOAD(x[j]);                                                \
        _Pragma("omp parallel for schedule(static)") for (int64_t b = 0; b < (n + BLOCK - 1) / BLOCK; b++) {   \
            const int64_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;                                     \
            for (int64_t c = b * BLOCK; c < end; c++) {                                                        \
                float sums[MAX_M];                                                                             \
                if (m == 1) NAME##_col(xf, w + c * k, 1, k, sums);                                             \
                else NAME##_col(xf, w + c * k, m, k, sums);                                                    \
                const float add = bias ? LOAD(bias[c]) : 0.f;                                                  \
                for (int64_t i = 0; i < m; i++) y[i * n + c] = STORE(sums[i] + add);                           \
            }                                                                                                  \
        }                                                                                                      \
        return 0;                                                                                              \
    }

DEFINE_LINEAR(linear_rows_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
DEFINE_LINEAR(linear_rows_f32, float, F32_ID, F32_ID)

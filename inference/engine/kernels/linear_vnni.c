/* y = x @ W^T (+ bias) in bf16 on AVX512-BF16 CPUs, for every row count: decode steps and prefill chunks.
 *
 * Built with decode_attention.c (see inference/engine/kernels/build.py). A decode step of 32 sequences
 * multiplies 32 rows by every weight of the model once: 8.6 GFLOP over 270 MB for the default model. oneDNN's
 * packed bf16 kernel takes 16.2 ms for that on a 2-vCPU Zen 5: 530 GFLOP/s against the ~920 that vdpbf16ps
 * reaches on its two cores, and 17 GB/s against the ~32 GB/s its one-row kernel reads. This kernel is the
 * register-blocked micro-kernel of BLIS (Goto & van de Geijn, "Anatomy of high-performance matrix
 * multiplication", 2008) and of oneDNN's brgemm, with the weight read from DRAM exactly once per call:
 *   - the weight is packed once at load time in the VNNI layout of vdpbf16ps: panels of 16 output columns,
 *     each [k/2][16][2] (pairs of consecutive k of one column side by side), so one k-pair of a panel is one
 *     64-byte load (vnni_pack_bf16; torch gives the same with w.view(n/16, 16, k/2, 2).transpose(1, 2));
 *   - a thread owns a contiguous range of column blocks of NB = 3 panels (48 columns); for each block it runs
 *     the rows in blocks of MR = 8, each keeping its 8 x 48 float32 sums in 24 zmm registers over all of k
 *     (x's pairs broadcast; 3 weight loads and 24 vdpbf16ps per k-pair). The first row block brings the
 *     block's weights in from DRAM, the others read them from L1/L2;
 *   - while a block computes, its row blocks prefetch the thread's next block into L2 (prefetcht1), so the
 *     DRAM stream overlaps the arithmetic instead of stalling each block's first row block.
 * Measured on that Zen 5, the default model's projections, 2 threads: 32 rows 16.2 -> 10.2-11.9 ms (without the
 * prefetch 14.7), one row 8.4 -> 6.9, 512 rows 166 -> 145-151 ms (oneDNN ~840 GFLOP/s, this ~930).
 *
 * Layouts (contiguous): x [m, k] bf16, wp the packed weight (n * k bf16), bias [n] bf16 or NULL, y [m, n]
 * bf16. Sums in float32 (vdpbf16ps adds each pair's two products to the sum in one step, as oneDNN's bf16
 * kernels on these CPUs do); the output rounded to nearest even (vcvtneps2bf16).
 * With swiglu set, LlamaMLP's act(gate) * up comes out instead: wp is the fused [gate; up] weight (n = 2I)
 * packed with swiglu set, which interleaves gate panel j and up panel j; each column block is those two panels,
 * and y is [m, I] with y[:, c] = silu(g[:, c]) * u[:, c] taken on the float32 sums (no bias).
 * Returns 0; 1 when the shape is not taken (m < 1, n not a multiple of 16 (32 with swiglu), k odd, a bias
 * with swiglu); 2 when the object was built for a CPU without AVX512-BF16 (the caller keeps oneDNN).
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "tiles.h"

#define PANEL 16 /* output columns per panel: one zmm of float32 sums */
#define NB 3     /* panels per column block */
#define MR 8     /* rows per register block */

/* Pack w [n, k] (torch's Linear weight) into the VNNI panels; n a multiple of 16 (32 with swiglu), k even.
 * swiglu: w is [gate; up] and panel 2j of out is gate panel j, panel 2j + 1 up panel j. */
void vnni_pack_bf16(const uint16_t *w, uint16_t *out, int64_t n, int64_t k, int swiglu) {
    const int64_t panels = n / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t c = 0; c < PANEL; c++)
            for (int64_t j = 0; j < k / 2; j++) {
                const int64_t from = swiglu ? (p % 2) * (panels / 2) + p / 2 : p;
                uint16_t *dst = out + p * PANEL * k + (j * PANEL + c) * 2;
                const uint16_t *src = w + (from * PANEL + c) * k + 2 * j;
                dst[0] = src[0];
                dst[1] = src[1];
            }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

/* glibc's libmvec expf for 16 floats (what GCC calls for a vectorised expf loop; linked with -lmvec). */
__m512 _ZGVeN16v_expf(__m512 x);

/* silu(g) * u = g / (1 + exp(-g)) * u on 16 float32 sums; 0 where g < -88 (silu's limit; there exp(-g) would
 * overflow, and under -ffast-math GCC divides by a reciprocal estimate and a Newton step, which makes 1 / inf NaN). */
static inline __m512 swiglu16(__m512 g, __m512 u) {
    const __mmask16 live = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-88.f), _CMP_GE_OQ);
    const __m512 e = _ZGVeN16v_expf(_mm512_maskz_sub_ps(live, _mm512_setzero_ps(), g));
    return _mm512_maskz_mul_ps(live, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}

/* The sums of `rows` rows of x against `panels` panels of wp over all of k, kept in registers (rows x panels
 * zmm), then the epilogue: bias and bf16 output at column col0 of y (row stride ldy), or with swiglu (panels
 * == 2: gate, up) the 16 activations. Prefetches pf->lines cache lines of the next block per k-pair. */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                                                       uint16_t *y, int64_t ldy, int64_t k, int64_t col0,
                                                       const int rows, const int panels, const int swiglu,
                                                       prefetch_t *pf) {
    __m512 acc[MR][NB];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 3
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t panel_stride = PANEL * k; /* bf16 elements per panel */
    const char *p = pf->next;
    for (int64_t j = 0; j < k / 2; j++) {
        __m512bh w[NB];
#pragma GCC unroll 3
        for (int c = 0; c < NB; c++)
            if (c < panels) w[c] = (__m512bh)_mm512_loadu_si512(wp + c * panel_stride + j * 2 * PANEL);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            if (r < rows) {
                int32_t pair;
                memcpy(&pair, x + r * k + 2 * j, 4);
                const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 3
                for (int c = 0; c < NB; c++)
                    if (c < panels) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, w[c]);
            }
        }
        p = prefetch_step(p, pf);
    }
    pf->next = p;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= rows) continue;
        if (swiglu) {
            const __m512 a = swiglu16(acc[r][0], acc[r][1]);
            _mm256_storeu_si256((__m256i *)(y + r * ldy + col0), (__m256i)_mm512_cvtneps_pbh(a));
            continue;
        }
#pragma GCC unroll 3
        for (int c = 0; c < NB; c++) {
            if (c >= panels) continue;
            __m512 s = acc[r][c];
            if (bias != NULL) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(bias + col0 + c * PANEL));
                s = _mm512_add_ps(s, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
            }
            _mm256_storeu_si256((__m256i *)(y + r * ldy + col0 + c * PANEL), (__m256i)_mm512_cvtneps_pbh(s));
        }
    }
}

/* One register tile of `rows` rows: a case per row count, so that the tile's loops unroll with constant counts. */
#define ROWS_CASES(P, SW)                                                                                      \
    switch (rows) {                                                                                            \
        case 8: tile(xr, wb, bias, yr, ldy, k, col0, 8, P, SW, pf); break;                                   \
        case 7: tile(xr, wb, bias, yr, ldy, k, col0, 7, P, SW, pf); break;                                   \
        case 6: tile(xr, wb, bias, yr, ldy, k, col0, 6, P, SW, pf); break;                                   \
        case 5: tile(xr, wb, bias, yr, ldy, k, col0, 5, P, SW, pf); break;                                   \
        case 4: tile(xr, wb, bias, yr, ldy, k, col0, 4, P, SW, pf); break;                                   \
        case 3: tile(xr, wb, bias, yr, ldy, k, col0, 3, P, SW, pf); break;                                   \
        case 2: tile(xr, wb, bias, yr, ldy, k, col0, 2, P, SW, pf); break;                                   \
        default: tile(xr, wb, bias, yr, ldy, k, col0, 1, P, SW, pf); break;                                  \
    }

/* All rows of one column block: `panels` panels starting at wb, output from column col0 of y. */
static void column_block(const uint16_t *x, const uint16_t *wb, const uint16_t *bias, uint16_t *y, int64_t m,
                         int64_t ldy, int64_t k, int64_t col0, int panels, int swiglu, prefetch_t *pf) {
    for (int64_t r0 = 0; r0 < m; r0 += MR) {
        const int rows = (int)(m - r0 < MR ? m - r0 : MR);
        const uint16_t *xr = x + r0 * k;
        uint16_t *yr = y + r0 * ldy;
        if (swiglu) {
            ROWS_CASES(2, 1)
        } else if (panels == 3) {
            ROWS_CASES(3, 0)
        } else if (panels == 2) {
            ROWS_CASES(2, 0)
        } else {
            ROWS_CASES(1, 0)
        }
    }
}

int linear_vnni_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, uint16_t *y, int64_t m,
                     int64_t n, int64_t k, int swiglu) {
    if (m < 1 || n % (swiglu ? 2 * PANEL : PANEL) != 0 || k % 2 != 0 || k < 2 || (swiglu && bias != NULL)) return 1;
    const int64_t panels_total = n / PANEL, per_block = swiglu ? 2 : NB;
    const int64_t blocks = (panels_total + per_block - 1) / per_block, ldy = swiglu ? n / 2 : n;
    const int64_t iters = ((m + MR - 1) / MR) * (k / 2); /* k-pair steps per column block */
#pragma omp parallel
    {
        /* contiguous ranges of column blocks per thread, so that each knows the next block it will read */
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t lo = blocks * t / nt, hi = blocks * (t + 1) / nt;
        for (int64_t b = lo; b < hi; b++) {
            const int64_t p0 = b * per_block;
            const int panels = (int)(panels_total - p0 < per_block ? panels_total - p0 : per_block);
            prefetch_t pf = {NULL, NULL, 0};
            if (b + 1 < hi) {
                pf = next_block_prefetch((const char *)wp, PANEL * k * 2, panels_total, p0, panels, per_block, iters,
                                         4);
            }
            const int64_t col0 = swiglu ? b * PANEL : p0 * PANEL;
            column_block(x, wp + p0 * PANEL * k, bias, y, m, ldy, k, col0, panels, swiglu, &pf);
        }
    }
    return 0;
}
#else
int linear_vnni_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, uint16_t *y, int64_t m,
                     int64_t n, int64_t k, int swiglu) {
    (void)x, (void)wp, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)swiglu;
    return 2;
}
#endif

/* y = x @ W^T (+ bias) in float32 on AVX2/FMA CPUs, for the row counts past the few-rows kernels: decode steps of
 * many sequences and prefill chunks.
 *
 * Built with the other kernels (see inference/engine/kernels/__init__.py). The float32 twin of linear_vnni.c: a
 * decode step of 32 sequences multiplies 32 rows by every weight of the model once (8.6 GFLOP over 540 MB for
 * the default model), which on a 2-vCPU AVX2 CPU is bound by the two cores' FMA units, not by memory. The
 * register-blocked micro-kernel of BLIS (Goto & van de Geijn, "Anatomy of high-performance matrix
 * multiplication", 2008; BLIS's haswell sgemm kernel is 6 x 16), with the weight read from DRAM once per call:
 *   - the weight is packed once at load time in panels of 8 output columns, each [k][8] (one ymm per k), so a
 *     tile's weight loads are sequential (fma_pack_f32; torch gives the same with w.view(n/8, 8, k).transpose(1, 2));
 *   - a column block is NB = 2 panels (16 columns); its rows run in blocks of at most MR = 6 (of near-equal
 *     height), each keeping its 6 x 16 float32 sums in 12 ymm registers over all of k (x broadcast from memory;
 *     2 weight loads and 12 FMAs per k). The first row block brings the block's weights in from DRAM, the others
 *     read them from L1/L2;
 *   - the work is cut into items of ITEM_BLOCKS column blocks x MC rows, which the threads take dynamically, row
 *     chunk by row chunk, so that a long prefill's rows stay in L2 while they meet every column block and a vCPU
 *     slowed by the host does not hold up the call;
 *   - while a block computes, it prefetches the item's next block into L2 (prefetcht1).
 * Measured on a 2-vCPU AMD EPYC with AVX2 only (the two cores' FMA units peak at ~175 GFLOP/s), the default model's
 * 120 layer projections and lm_head, each layer's weights distinct so they come from DRAM: 32 rows 59-79 ms against
 * oneDNN's 75-87 (~140 against ~110 GFLOP/s), 512 rows level with oneDNN (978-1011 against 974-983 ms). In the
 * engine, N=32: decode step 92-97 against 118-125 ms, 32 x 128-token prefill 6.8-7.1 against 7.2-7.7 s.
 *
 * A weight that is exactly Q8_0 values (the default model's tied lm_head) can stay in that form (linear_fma_q8, below):
 * its int8 values and scales in the same panel order, each column block dequantized into a per-thread buffer before
 * its row tiles run: the sums are the float panels' bit for bit, at 8.5 bits a weight instead of 32 (lm_head 113 ->
 * 32 MB), and as fast (32 rows 16.1 against 16.2 ms; 1 row 3.7 against 4.4).
 *
 * Layouts (contiguous): x [m, k] float32, wp the packed weight (n * k floats), bias [n] or NULL, y [m, n].
 * Sums over k in order, one FMA per product (so results differ from oneDNN's and MKL's by float rounding).
 * With swiglu set, LlamaMLP's act(gate) * up comes out instead: wp is the fused [gate; up] weight (n = 2I) packed
 * with swiglu set, which interleaves gate panel j and up panel j; each column block is those two panels, and y is
 * [m, I] with y[:, c] = silu(g[:, c]) * u[:, c] taken on the sums (no bias).
 * Returns 0; 1 when the shape is not taken (m < 1, k < 1, n not a multiple of 8 (16 with swiglu), a bias with
 * swiglu); 2 when the object was built for a CPU without AVX2 and FMA (the caller keeps oneDNN).
 */
#include <omp.h>
#include <stdint.h>

#include "tiles.h"

#define PANEL 8 /* output columns per panel: one ymm of float32 sums */
#define NB 2    /* panels per column block */
#define MR 6    /* rows per register block */
#define MC 96   /* rows per chunk: 96 x 1536 floats = 590 KB, within a Zen core's L2 */
#define ITEM_BLOCKS 4 /* column blocks per work item */

/* Pack w [n, k] (torch's Linear weight) into panels [n / 8][k][8]; n a multiple of 8 (16 with swiglu).
 * swiglu: w is [gate; up] and panel 2j of out is gate panel j, panel 2j + 1 up panel j. */
void fma_pack_f32(const float *w, float *out, int64_t n, int64_t k, int swiglu) {
    const int64_t panels = n / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t from = swiglu ? (p % 2) * (panels / 2) + p / 2 : p;
        for (int64_t j = 0; j < k; j++)
            for (int64_t c = 0; c < PANEL; c++) out[(p * k + j) * PANEL + c] = w[(from * PANEL + c) * k + j];
    }
}

/* Q8_0 blocks (block_quant.BlockWeight: qs [n, k] int8, d [n, k / 32] float32) into the same panel order: qp
 * [n / 8][k][8] int8 and dp [n / 8][k / 32][8] float32 (one scale per column per block of 32 inputs). n a multiple of
 * 8, k of 32. */
void fma_pack_q8(const int8_t *qs, const float *d, int8_t *qp, float *dp, int64_t n, int64_t k) {
    const int64_t panels = n / PANEL, nb = k / 32;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        for (int64_t j = 0; j < k; j++)
            for (int64_t c = 0; c < PANEL; c++) qp[(p * k + j) * PANEL + c] = qs[(p * PANEL + c) * k + j];
        for (int64_t b = 0; b < nb; b++)
            for (int64_t c = 0; c < PANEL; c++) dp[(p * nb + b) * PANEL + c] = d[(p * PANEL + c) * nb + b];
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <stdlib.h>

/* glibc's libmvec expf for 8 floats (what GCC calls for an AVX2-vectorised expf loop; linked with -lmvec). */
__m256 _ZGVdN8v_expf(__m256 x);

/* silu(g) * u = g / (1 + exp(-g)) * u on 8 sums; 0 where g < -88 (silu's limit; there exp(-g) would overflow,
 * and under -ffast-math GCC divides by a reciprocal estimate and a Newton step, which makes 1 / inf NaN). */
static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 live = _mm256_cmp_ps(g, _mm256_set1_ps(-88.f), _CMP_GE_OQ);
    const __m256 e = _ZGVdN8v_expf(_mm256_and_ps(live, _mm256_sub_ps(_mm256_setzero_ps(), g)));
    return _mm256_and_ps(live, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), u));
}

/* The sums of `rows` rows of x against `panels` panels of wp over all of k, kept in registers (rows x panels
 * ymm), then the epilogue: bias and output at column col0 of y (row stride ldy), or with swiglu (panels == 2:
 * gate, up) the 8 activations. Prefetches pf->lines cache lines of the next block per k. */
static inline __attribute__((always_inline)) void tile(const float *x, const float *wp, const float *bias, float *y,
                                                       int64_t ldy, int64_t k, int64_t col0, const int rows,
                                                       const int panels, const int swiglu, prefetch_t *pf) {
    __m256 acc[MR][NB];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++) acc[r][c] = _mm256_setzero_ps();
    const int64_t panel_stride = PANEL * k; /* floats per panel */
    const char *p = pf->next;
    for (int64_t j = 0; j < k; j++) {
        __m256 w[NB];
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++)
            if (c < panels) w[c] = _mm256_loadu_ps(wp + c * panel_stride + j * PANEL);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            if (r < rows) {
                const __m256 xb = _mm256_broadcast_ss(x + r * k + j);
#pragma GCC unroll 2
                for (int c = 0; c < NB; c++)
                    if (c < panels) acc[r][c] = _mm256_fmadd_ps(xb, w[c], acc[r][c]);
            }
        }
        p = prefetch_step(p, pf);
    }
    pf->next = p;
    if (swiglu) {
        /* The sums go to memory first: swiglu8 calls libmvec's expf, across which no ymm register survives (all are
         * caller-saved), so calling it on live accumulators spilled the others around every call. */
        float g[MR][PANEL], u[MR][PANEL];
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            if (r >= rows) continue;
            _mm256_storeu_ps(g[r], acc[r][0]);
            _mm256_storeu_ps(u[r], acc[r][1]);
        }
        for (int r = 0; r < rows; r++)
            _mm256_storeu_ps(y + r * ldy + col0, swiglu8(_mm256_loadu_ps(g[r]), _mm256_loadu_ps(u[r])));
        return;
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        if (r >= rows) continue;
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++) {
            if (c >= panels) continue;
            __m256 s = acc[r][c];
            if (bias != NULL) s = _mm256_add_ps(s, _mm256_loadu_ps(bias + col0 + c * PANEL));
            _mm256_storeu_ps(y + r * ldy + col0 + c * PANEL, s);
        }
    }
}

/* One register tile of `rows` rows: a case per row count, so that the tile's loops unroll with constant counts. */
#define ROWS_CASES(P, SW)                                                                                      \
    switch (rows) {                                                                                            \
        case 6: tile(xr, wb, bias, yr, ldy, k, col0, 6, P, SW, pf); break;                                   \
        case 5: tile(xr, wb, bias, yr, ldy, k, col0, 5, P, SW, pf); break;                                   \
        case 4: tile(xr, wb, bias, yr, ldy, k, col0, 4, P, SW, pf); break;                                   \
        case 3: tile(xr, wb, bias, yr, ldy, k, col0, 3, P, SW, pf); break;                                   \
        case 2: tile(xr, wb, bias, yr, ldy, k, col0, 2, P, SW, pf); break;                                   \
        default: tile(xr, wb, bias, yr, ldy, k, col0, 1, P, SW, pf); break;                                  \
    }

/* Rows [r_lo, r_hi) of one column block: `panels` panels starting at wb, output from column col0 of y. */
static void column_block(const float *x, const float *wb, const float *bias, float *y, int64_t r_lo, int64_t r_hi,
                         int64_t ldy, int64_t k, int64_t col0, int panels, int swiglu, prefetch_t *pf) {
    /* ceil((r_hi - r_lo) / MR) row blocks of near-equal height (32 rows: 6, 6, 5, 5, 5, 5 rather than 5 x 6 and a 2):
     * a tile of few rows has too few independent sums to cover the FMA latency (4 cycles, 2 units: 8 in flight). */
    const int64_t total = r_hi - r_lo, nblk = (total + MR - 1) / MR, base = total / nblk, extra = total % nblk;
    int64_t r0 = r_lo;
    for (int64_t i = 0; i < nblk; i++) {
        const int rows = (int)(base + (i < extra));
        const float *xr = x + r0 * k;
        float *yr = y + r0 * ldy;
        if (swiglu) {
            ROWS_CASES(2, 1)
        } else if (panels == 2) {
            ROWS_CASES(2, 0)
        } else {
            ROWS_CASES(1, 0)
        }
        r0 += rows;
    }
}

/* Work item `item` of a call (linear_fma_f32 and linear_fma_q8 cut the work alike): rows [r_lo, r_hi), one chunk of
 * MC, against column blocks [lo, hi), ITEM_BLOCKS of them; iters is the k steps a block's row tiles take, over which
 * the next block's prefetch is spread. */
typedef struct {
    int64_t r_lo, r_hi, lo, hi, iters;
} work_item_t;

static inline work_item_t work_item(int64_t item, int64_t m, int64_t k, int64_t blocks, int64_t col_chunks) {
    work_item_t w;
    w.r_lo = item / col_chunks * MC;
    w.r_hi = m - w.r_lo < MC ? m : w.r_lo + MC;
    w.lo = item % col_chunks * ITEM_BLOCKS;
    w.hi = w.lo + ITEM_BLOCKS < blocks ? w.lo + ITEM_BLOCKS : blocks;
    w.iters = ((w.r_hi - w.r_lo + MR - 1) / MR) * k;
    return w;
}

int linear_fma_f32(const float *x, const float *wp, const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                   int swiglu) {
    if (m < 1 || k < 1 || n < 1 || n % (swiglu ? 2 * PANEL : PANEL) != 0 || (swiglu && bias != NULL)) return 1;
    const int64_t panels_total = n / PANEL;
    const int64_t blocks = (panels_total + NB - 1) / NB, ldy = swiglu ? n / 2 : n;
    const int64_t row_chunks = (m + MC - 1) / MC, col_chunks = (blocks + ITEM_BLOCKS - 1) / ITEM_BLOCKS;
    /* Work items of ITEM_BLOCKS column blocks x one chunk of MC rows, taken dynamically, row chunk by row chunk (so
     * the threads share one chunk of x in L3 at a time): on a shared VM one vCPU is often slowed by the host, and a
     * static split then made every call wait for it (the N=32 prefill was 5-8 % slower than oneDNN's, which
     * balances). */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < row_chunks * col_chunks; item++) {
        const work_item_t w = work_item(item, m, k, blocks, col_chunks);
        for (int64_t b = w.lo; b < w.hi; b++) {
            const int64_t p0 = b * NB;
            const int panels = (int)(panels_total - p0 < NB ? panels_total - p0 : NB);
            prefetch_t pf = {NULL, NULL, 0};
            if (b + 1 < w.hi) { /* the item's next block (the next item may go to the other thread) */
                pf = next_block_prefetch((const char *)wp, PANEL * k * 4, panels_total, p0, panels, NB, w.iters, 2);
            }
            const int64_t col0 = swiglu ? b * PANEL : p0 * PANEL;
            column_block(x, wp + p0 * PANEL * k, bias, y, w.r_lo, w.r_hi, ldy, k, col0, panels, swiglu, &pf);
        }
    }
    return 0;
}

/* `panels` float panels [k][8] at out from Q8 panels p0.. (fma_pack_q8's layout): each weight d * q in float32, one
 * rounding, as gguf-py's dequantize (so the sums equal linear_fma_f32's over the float32 weights bit for bit). */
static inline void dequant_q8_panels(const int8_t *qp, const float *dp, float *out, int64_t p0, int panels,
                                     int64_t k) {
    const int64_t nb = k / 32;
    for (int c = 0; c < panels; c++) {
        const int8_t *q = qp + (p0 + c) * PANEL * k;
        const float *ds = dp + (p0 + c) * nb * PANEL;
        float *o = out + c * PANEL * k;
        for (int64_t b = 0; b < nb; b++) {
            const __m256 scale = _mm256_loadu_ps(ds + b * PANEL);
#pragma GCC unroll 8
            for (int64_t j = b * 32; j < b * 32 + 32; j++) {
                const __m128i q8 = _mm_loadl_epi64((const __m128i *)(q + j * PANEL));
                _mm256_store_ps(o + j * PANEL, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), scale));
            }
        }
    }
}

/* y = x @ W^T (+ bias) with W in Q8 panels (fma_pack_q8): the same work items and register tiles as linear_fma_f32,
 * each column block first dequantized into a per-thread buffer of two float panels (16 x k floats: 37 KB for k = 576,
 * read by every row block from L1/L2). The weight then takes ~8.5 bits instead of 32: used for the default model's
 * tied lm_head (Q8_0), whose float panels were 113 MB of the float32 engine's memory. x [m, k], y [m, n], n a
 * multiple of 8, k of 32. Returns 0; 1 for a shape not taken; 3 when the buffer cannot be allocated. */
int linear_fma_q8(const float *x, const int8_t *qp, const float *dp, const float *bias, float *y, int64_t m, int64_t n,
                  int64_t k) {
    if (m < 1 || k < 32 || k % 32 != 0 || n < 1 || n % PANEL != 0) return 1;
    const int64_t panels_total = n / PANEL, blocks = (panels_total + NB - 1) / NB;
    const int64_t row_chunks = (m + MC - 1) / MC, col_chunks = (blocks + ITEM_BLOCKS - 1) / ITEM_BLOCKS;
    int failed = 0;
#pragma omp parallel
    {
        float *buf = aligned_alloc(64, (size_t)(NB * PANEL * k * sizeof(float) + 63) / 64 * 64);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < row_chunks * col_chunks; item++) {
            if (buf == NULL) continue;
            const work_item_t w = work_item(item, m, k, blocks, col_chunks);
            for (int64_t b = w.lo; b < w.hi; b++) {
                const int64_t p0 = b * NB;
                const int panels = (int)(panels_total - p0 < NB ? panels_total - p0 : NB);
                dequant_q8_panels(qp, dp, buf, p0, panels, k);
                prefetch_t pf = {NULL, NULL, 0};
                if (b + 1 < w.hi) {
                    pf = next_block_prefetch((const char *)qp, PANEL * k, panels_total, p0, panels, NB, w.iters, 1);
                }
                column_block(x, buf, bias, y, w.r_lo, w.r_hi, n, k, p0 * PANEL, panels, 0, &pf);
            }
        }
        free(buf);
    }
    return failed ? 3 : 0;
}
#else
int linear_fma_q8(const float *x, const int8_t *qp, const float *dp, const float *bias, float *y, int64_t m, int64_t n,
                  int64_t k) {
    (void)x, (void)qp, (void)dp, (void)bias, (void)y, (void)m, (void)n, (void)k;
    return 2;
}
int linear_fma_f32(const float *x, const float *wp, const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                   int swiglu) {
    (void)x, (void)wp, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)swiglu;
    return 2;
}
#endif

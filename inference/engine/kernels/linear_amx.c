/* y = x @ W^T (+ b), bf16, with W held in GGUF's block-quantized formats (Q4_1, Q8_0) and the products taken on
 * Intel AMX tiles: the kernel for the bf16 decode steps of many sequences on a CPU with AMX.
 *
 * A 32-sequence decode step reads every weight once and does little arithmetic per weight (32 multiply-adds):
 * oneDNN's bf16 matmul on the tiles reads the 270 MB of bf16 weights at the memory's speed and waits on it. The
 * default model's weights are GGUF blocks (Q4_1 projections, Q8_0 lm_head, recovered exactly at load:
 * inference/engine/block_quant.py), so this kernel reads ~5-8.5 bits per weight instead of 16, dequantizes them to
 * bf16 in cache and multiplies there (the idea of llama.cpp's AMX backend, ggml-cpu/amx, which however quantizes
 * the activations to 8 bits; here they stay bf16). Dequantizing is the float32 arithmetic of gguf-py's
 * dequantize_blocks (Q4_1: d * q, then + mn, two roundings; Q8_0: q * d), then round-to-nearest-even to bf16, so
 * the kernel multiplies exactly the bf16 weights the engine would otherwise give oneDNN; the sums are float32.
 *
 * Tiles (Intel SDM, "Intel AMX"; TDPBF16PS: C[16 x 16] float += A[16 x 32] bf16 . B[16 pairs x 16] bf16):
 *   A = 16 output features x 32 inputs of W, dequantized row by row (the blocks' natural order: a block is one
 *       feature's 32 inputs) into a per-thread buffer covering all of k for 32 features;
 *   B = 32 inputs x 16 rows of x in the VNNI pair layout, packed once per call (xpack);
 *   C = 16 features x 16 rows of x, written out transposed to y's [rows, features] order.
 * 2 A, 2 B and 4 C tiles: a 32-feature x 32-row block per pass over k; more rows re-use the dequantized A.
 * With swiglu the 32 features are gate features j..j+15 and up features I+j..I+j+15 of the fused [2I, k] gate/up
 * weight, and the output is silu(gate) * up, [m, I] (LlamaMLP's activation on the float32 sums).
 *
 * Layouts (contiguous): x [m, k] bf16; qs [n, k/2] uint8 (Q4_1) or [n, k] int8 (Q8_0); d, mn [n, k/32] float;
 * bias [n] bf16 or NULL; y [m, n] bf16 ([m, n/2] with swiglu); xpack: ceil(m/16) * k * 16 bf16.
 * Returns 0; 1 for shapes it does not take (k % 32, n % 16 (n % 32 with swiglu), m < 1); 2 when the CPU or the
 * kernel (Linux arch_prctl ARCH_REQ_XCOMP_PERM) does not allow AMX; 3 when built without AMX.
 * Each thread's tile configuration is saved before and restored after (oneDNN may have its own loaded).
 */
#include <stdint.h>
#include <string.h>

#define QK 32
#define ROWS 16  /* rows of a tile: features of A, input pairs of B, features of C */
#define FEATS 32 /* features per block: two A tiles */
#ifndef LEAD
#define LEAD 4
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int linear_amx_available(void) {
    /* Linux gives a process the AMX register state only on request (since 5.16); asking again is harmless. */
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return state;
}

/* glibc's libmvec expf for 16 floats (linked with -lmvec). */
__m512 _ZGVeN16v_expf(__m512 x);

/* silu(g) * u; 0 where g < -88 (as linear_vnni.c: exp(-g) would overflow and 1 / inf is NaN under -ffast-math). */
static inline __m512 swiglu16(__m512 g, __m512 u) {
    const __mmask16 live = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-88.f), _CMP_GE_OQ);
    const __m512 e = _ZGVeN16v_expf(_mm512_maskz_sub_ps(live, _mm512_setzero_ps(), g));
    return _mm512_maskz_mul_ps(live, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* One feature's 32 inputs of one block as 32 bf16 at dst (64 bytes). The *_round_ps forms are builtins, which
 * -ffast-math cannot contract into an FMA: the float32 values are gguf-py's bit for bit, then rounded to nearest
 * even. Q4_1 has 16 values per block: they are computed once (a 16-entry table, duplicated to 32 entries so that
 * VPERMW, which reads 5 bits of each index, ignores the high nibble left above a low one) and looked up. */
static inline void dequant_q4_1(const uint8_t *q, float d, float mn, uint16_t *dst) {
    const __m512 levels = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 values = _mm512_add_round_ps(_mm512_mul_round_ps(levels, _mm512_set1_ps(d), RNE), _mm512_set1_ps(mn), RNE);
    const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(values, values);
    /* 16-bit lanes 0-15: bytes 0-15 (low nibble = element j); lanes 16-31: the same bytes >> 4 (element j + 16) */
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q)));
    const __m512i index = _mm512_srlv_epi16(bytes, shifts);
    _mm512_storeu_si512((__m512i *)dst, _mm512_permutexvar_epi16(index, table));
}

static inline void dequant_q8_0(const int8_t *q, float d, uint16_t *dst) {
    const __m512 dv = _mm512_set1_ps(d);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    _mm512_storeu_si512((__m512i *)dst,
                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_round_ps(hi, dv, RNE), _mm512_mul_round_ps(lo, dv, RNE)));
}

/* Block kc of feature f (of W's n) as row `row` of the block's A tiles at a (32 rows of 32 bf16). */
static inline void dequant_row(int q8, const void *qs, const float *d, const float *mn, int64_t f, int64_t k,
                               int64_t kc, uint16_t *a, int row) {
    const int64_t nkc = k / QK;
    if (q8)
        dequant_q8_0((const int8_t *)qs + f * k + kc * QK, d[f * nkc + kc], a + row * QK);
    else
        dequant_q4_1((const uint8_t *)qs + f * (k / 2) + kc * (QK / 2), d[f * nkc + kc], mn[f * nkc + kc],
                     a + row * QK);
}

/* x rows g*16 .. g*16+15 (zeros past m), inputs kc*32 .. kc*32+31, as a B tile: 16 rows of 16 (x, x') pairs. */
static inline void pack_x(const uint16_t *x, uint16_t *xpack, int64_t m, int64_t k, int64_t g, int64_t kc) {
    const uint32_t *x32 = (const uint32_t *)x;
    uint32_t *dst = (uint32_t *)(xpack + (g * (k / QK) + kc) * (ROWS * QK));
    const int64_t rows = m - g * ROWS < ROWS ? m - g * ROWS : ROWS;
    const __mmask16 live = (__mmask16)((1u << rows) - 1u);
    const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int)(k / 2)));
    const uint32_t *base = x32 + g * ROWS * (k / 2) + kc * (QK / 2);
    for (int r = 0; r < ROWS; r++)
        _mm512_storeu_si512((__m512i *)(dst + r * 16),
                           _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, index, base + r, 4));
}

/* What one call computes, shared by its threads. */
typedef struct job {
    int q8, swiglu;
    const void *qs;
    const float *d, *mn;
    const uint16_t *bias, *xpack;
    uint16_t *y;
    int64_t m, n, k, nkc, groups, inter, blocks, ldy;
} job_t;

/* The next block's weight bytes (its quants, d and mn: up to 6 ranges) spread as L2 prefetches over the k steps
 * of this block's first pass: while the tiles multiply, the memory streams the next block in. */
typedef struct {
    const char *at[6], *end[6];
    int ranges, range, lines;
} prefetch_ranges;

static inline void add_range(prefetch_ranges *pf, const void *start, int64_t bytes) {
    pf->at[pf->ranges] = (const char *)start;
    pf->end[pf->ranges++] = (const char *)start + bytes;
}

static inline void next_block_ranges(prefetch_ranges *pf, const struct job *j, int64_t blk) {
    const int64_t qbytes = j->q8 ? j->k : j->k / 2;
    const int64_t f0 = j->swiglu ? blk * ROWS : blk * FEATS;
    const int64_t feats = j->swiglu ? ROWS : (j->n - f0 < FEATS ? j->n - f0 : FEATS);
    int64_t total = 0;
    for (int part = 0; part < (j->swiglu ? 2 : 1); part++) {
        const int64_t f = f0 + part * j->inter;
        add_range(pf, (const char *)j->qs + f * qbytes, feats * qbytes);
        add_range(pf, j->d + f * j->nkc, feats * j->nkc * 4);
        if (j->mn != NULL) add_range(pf, j->mn + f * j->nkc, feats * j->nkc * 4);
    }
    for (int r = 0; r < pf->ranges; r++) total += (pf->end[r] - pf->at[r] + 63) / 64;
    pf->lines = (int)((total + j->nkc - 1) / j->nkc);
}

static inline __attribute__((always_inline)) void pf_step(prefetch_ranges *pf) {
    for (int l = 0; l < pf->lines && pf->range < pf->ranges; l++) {
        __builtin_prefetch(pf->at[pf->range], 0, 2);
        pf->at[pf->range] += 64;
        if (pf->at[pf->range] >= pf->end[pf->range]) pf->range++;
    }
}

static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = ROWS, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

/* C tiles 4..7 (A tile a = 0, 1 against B tile b = 0, 1 as tile 4 + 2a + b) out of row block g0 (rows g0*16 ..,
 * two B tiles) into y: bias, swiglu or plain, bf16. c: 4 x 16 x 16 floats, [tile][feature][row]. */
static inline void store_block(float *c, const uint16_t *bias, uint16_t *y, int64_t ldy, int64_t m, int64_t row0,
                               int64_t f0, int64_t feats, int swiglu) {
    _tile_stored(4, c, 64);
    _tile_stored(5, c + 256, 64);
    _tile_stored(6, c + 512, 64);
    _tile_stored(7, c + 768, 64);
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t r = 0; r < 2 * ROWS && row0 + r < m; r++) {
        const int b = (int)(r / ROWS), t = (int)(r % ROWS);
        /* feature i of A tile a, this row: c[(2a + b) * 256 + i * 16 + t] */
        const __m512 s0 = _mm512_i32gather_ps(column, c + b * 256 + t, 4);
        if (swiglu) {
            const __m512 s1 = _mm512_i32gather_ps(column, c + (2 + b) * 256 + t, 4);
            _mm256_storeu_si256((__m256i *)(y + (row0 + r) * ldy + f0), (__m256i)_mm512_cvtneps_pbh(swiglu16(s0, s1)));
            continue;
        }
        for (int a = 0; a < 2 && a * ROWS < feats; a++) {
            __m512 s = a ? _mm512_i32gather_ps(column, c + (2 + b) * 256 + t, 4) : s0;
            if (bias != NULL) {
                const __m256i bv = _mm256_loadu_si256((const __m256i *)(bias + f0 + a * ROWS));
                s = _mm512_add_ps(s, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bv), 16)));
            }
            _mm256_storeu_si256((__m256i *)(y + (row0 + r) * ldy + f0 + a * ROWS), (__m256i)_mm512_cvtneps_pbh(s));
        }
    }
}

/* Block blk (32 features) against all m rows: the first pass over k dequantizes the block LEAD steps ahead of
 * its tiles (into a, per thread; passes for more rows re-use it) while prefetching the next block (pf). */
static inline __attribute__((always_inline)) void run_block(const job_t *j, int64_t blk, uint16_t *a, float *c,
                                                           prefetch_ranges *pf) {
    /* in locals: the vector stores below may alias anything, which would reload them from *j after each */
    const int64_t nkc = j->nkc, k = j->k, groups = j->groups;
    const int q8 = j->q8;
    const void *qs = j->qs;
    const float *d = j->d, *mn = j->mn;
    /* A tile 0: features f0 .. f0+15; tile 1: the next 16 (with swiglu, the up features I+f0 ..). */
    const int64_t f0 = j->swiglu ? blk * ROWS : blk * FEATS;
    const int64_t feats = j->swiglu ? FEATS : (j->n - f0 < FEATS ? j->n - f0 : FEATS);
    const int64_t second = (j->swiglu ? j->inter : ROWS) - ROWS; /* + i: feature of A tile 1's row i - 16 */
    const int na = feats > ROWS ? FEATS : ROWS; /* A tile 1 keeps an earlier block's values when 16: not stored */
#define DEQUANT(kc)                                                                                            \
    for (int i = 0; i < na; i++)                                                                               \
        dequant_row(q8, qs, d, mn, (i < ROWS ? 0 : second) + f0 + i, k, kc, a + (kc) * FEATS * QK, i);
    for (int64_t g = 0; g < groups; g += 2) {
        const uint16_t *b0 = j->xpack + g * nkc * (ROWS * QK);
        const uint16_t *b1 = g + 1 < groups ? b0 + nkc * (ROWS * QK) : b0;
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        if (g == 0)
            for (int64_t kc = 0; kc < LEAD && kc < nkc; kc++) DEQUANT(kc)
        for (int64_t kc = 0; kc < nkc; kc++) {
            if (g == 0) pf_step(pf);
            const uint16_t *ak = a + kc * FEATS * QK;
            _tile_loadd(0, ak, 64);
            _tile_loadd(1, ak + ROWS * QK, 64);
            _tile_loadd(2, b0 + kc * (ROWS * QK), 64);
            _tile_loadd(3, b1 + kc * (ROWS * QK), 64);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
            if (g == 0 && kc + LEAD < nkc) DEQUANT(kc + LEAD)
        }
        store_block(c, j->bias, j->y, j->ldy, j->m, g * ROWS, f0, feats, j->swiglu);
    }
#undef DEQUANT
}

/* The next block for thread me: the front of its own range, else the back of another's; -1 when none is left. */
static int64_t take_block(uint64_t *ranges, int threads, int me) {
    for (int i = 0; i < threads; i++) {
        const int t = (me + i) % threads;
        uint64_t r = __atomic_load_n(&ranges[t], __ATOMIC_RELAXED);
        for (;;) {
            const uint64_t front = r >> 32, back = r & 0xffffffffu;
            if (front >= back) break;
            const uint64_t want = i == 0 ? ((front + 1) << 32) | back : (front << 32) | (back - 1);
            if (__atomic_compare_exchange_n(&ranges[t], &r, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return (int64_t)(i == 0 ? front : back - 1);
        }
    }
    return -1;
}

static int linear_amx(int q8, const uint16_t *x, const void *qs, const float *d, const float *mn,
                      const uint16_t *bias, uint16_t *y, int64_t m, int64_t n, int64_t k, int swiglu,
                      uint16_t *xpack) {
    if (k % QK != 0 || m < 1 || n % (swiglu ? 2 * ROWS : ROWS) != 0 || (swiglu && bias != NULL)) return 1;
    if (!linear_amx_available()) return 2;
    job_t j = {q8, swiglu, qs, d, mn, bias, xpack, y, m, n, k, k / QK, (m + ROWS - 1) / ROWS, n / 2, 0, 0};
    j.blocks = swiglu ? j.inter / ROWS : (n + FEATS - 1) / FEATS;
    j.ldy = swiglu ? j.inter : n;
    /* Each thread owns a contiguous range of blocks and walks it forward (one long stream per core, which the
     * hardware prefetchers follow; blocks dealt out in small items from one counter were ~15 % slower); a thread
     * done with its own range takes blocks from the back of the others' (a thread slowed by a neighbour process
     * hands work over). ranges[t]: (front << 32) | back, changed only by compare-and-swap. */
    const int threads = omp_get_max_threads();
    uint64_t ranges[threads];
    for (int t = 0; t < threads; t++)
        ranges[t] = ((uint64_t)(j.blocks * t / threads) << 32) | (uint64_t)(j.blocks * (t + 1) / threads);
#pragma omp parallel num_threads(threads)
    {
        tile_config saved;
        _tile_storeconfig(&saved);
        configure_tiles();
        uint16_t a[j.nkc * FEATS * QK];
        float c[4 * 256];
#pragma omp for schedule(static) collapse(2)
        for (int64_t g = 0; g < j.groups; g++)
            for (int64_t kc = 0; kc < j.nkc; kc++) pack_x(x, xpack, m, k, g, kc);
        const int me = omp_get_thread_num();
        int64_t blk = take_block(ranges, threads, me);
        while (blk >= 0) {
            const int64_t next = take_block(ranges, threads, me);
            prefetch_ranges pf = {0};
            if (next >= 0) next_block_ranges(&pf, &j, next);
            run_block(&j, blk, a, c, &pf);
            blk = next;
        }
        if (saved.palette_id)
            _tile_loadconfig(&saved);
        else
            _tile_release();
    }
    return 0;
}

int linear_amx_q4_1(const uint16_t *x, const uint8_t *qs, const float *d, const float *mn, const uint16_t *bias,
                    uint16_t *y, int64_t m, int64_t n, int64_t k, int swiglu, uint16_t *xpack) {
    return linear_amx(0, x, qs, d, mn, bias, y, m, n, k, swiglu, xpack);
}

int linear_amx_q8_0(const uint16_t *x, const int8_t *qs, const float *d, const uint16_t *bias, uint16_t *y,
                    int64_t m, int64_t n, int64_t k, int swiglu, uint16_t *xpack) {
    return linear_amx(1, x, qs, d, NULL, bias, y, m, n, k, swiglu, xpack);
}

#else /* built without AMX (the CPU or the compiler lacks it): the engine does not bind these */

int linear_amx_available(void) { return 0; }

int linear_amx_q4_1(const uint16_t *x, const uint8_t *qs, const float *d, const float *mn, const uint16_t *bias,
                    uint16_t *y, int64_t m, int64_t n, int64_t k, int swiglu, uint16_t *xpack) {
    (void)x, (void)qs, (void)d, (void)mn, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)swiglu, (void)xpack;
    return 3;
}

int linear_amx_q8_0(const uint16_t *x, const int8_t *qs, const float *d, const uint16_t *bias, uint16_t *y,
                    int64_t m, int64_t n, int64_t k, int swiglu, uint16_t *xpack) {
    (void)x, (void)qs, (void)d, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)swiglu, (void)xpack;
    return 3;
}

#endif

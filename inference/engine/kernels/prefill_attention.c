/* Causal attention of a step's prefill chunks over the slot KV cache (tiled, online softmax: FlashAttention-2,
 * Dao 2023, in the form of llama.cpp's and vLLM's CPU kernels: one work item per block of queries and KV head).
 * This file: the entry points (prefill_attention_bf16, prefill_attention_f32), the generic float path for any T
 * and its driver; the bf16 paths on AVX512-BF16 and AMX are in prefill_attention_bf16.c, and what the two files
 * share in prefill_attention.h.
 *
 * Why: torch's flash-attention CPU kernel takes an explicit mask for a chunk that follows a cached prefix, and
 * with a mask it computes every query-key pair, masked or not; GQA has to be folded into the query axis around
 * it. On the 2-core box (Zen 5, bf16) it ran a 1500-token prompt's attention at ~31 ms a layer, most of that
 * long prompt's time to first token. Here blocks of keys wholly after a query block's last position are never
 * visited, the rep query heads of a KV head share each K/V tile, and the products are vectorised with
 * register blocking (GCC vector extensions: AVX-512 or AVX2, whichever -march=native gives).
 *
 * Layouts (contiguous; T = element type, bf16 as uint16_t or float):
 *   q     [tokens, nkv, rep, hd]   the step's rotated queries (query head h uses KV head h / rep, as HF)
 *   k, v  [slots, nkv, slot_len, hd]   the cache, already holding every chunk's own keys and values
 *   chunks int64 [num_chunks, 4]   (slot, start, n, row): the chunk's queries are rows row..row+n-1 of q, at
 *                                  positions start..start+n-1; query i attends to positions 0..start+i
 *   out   [tokens, nkv, rep, hd]   only the chunks' rows are written
 * bf16 with head size 64 on a CPU with AMX (and an OS that grants the tiles): Q.K^T and P.V on the tiles
 * (item_amx), the softmax in AVX-512 with a polynomial exp; 2-vCPU Xeon, a 1500-token prompt 3.5 ms a layer
 * against torch's SDPA 5.0 (which also runs on the tiles) and the AVX-512 dot products' 15.7 (item_bf16_dp).
 * Math in float32 (as torch's kernel for bf16), the output rounded to T. Returns 0, 1 for an unsupported geometry
 * (hd not a multiple of 16 or > 256, rep > 8), 2 for a chunk outside the cache or q, 3 when scratch memory could
 * not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "prefill_attention.h"

#ifdef __AVX512F__
#define VL 16 /* floats per vector register */
/* rows per register block: 6 rows x 4 vectors of accumulators in AVX-512's 32 registers (a 1500-token prompt's
 * float32 attention over 30 layers on a 2-vCPU Zen 5: 4 rows 297 ms, 6 rows 256, 8 rows 274) */
#define RB 6
#else
#define VL 8 /* AVX2: 16 registers of 8 floats */
#define RB 2
#endif
#define CB 4 /* vectors of columns per register block */

typedef float vf __attribute__((vector_size(VL * 4)));

static inline float load_bf16(uint16_t x) { return bf16_to_f32(x); }
static inline float load_f32(float x) { return x; }
static inline float store_f32(float x) { return x; }

/* s[r][0:BK] = qf[r] . kt[:, 0:BK] for rows r0..r0+RB-1 (kt is [hd][BK], the tile transposed), CB vectors of keys
 * at a time so the accumulators stay in registers. */
static inline void scores_block(const float *qf, const float *kt, float *s, int64_t hd) {
    for (int c0 = 0; c0 < BK / VL; c0 += CB) {
        vf a[RB][CB];
        for (int i = 0; i < RB; i++)
            for (int c = 0; c < CB; c++) a[i][c] = (vf){0};
        for (int64_t d = 0; d < hd; d++) {
            const vf *kv = (const vf *)(kt + d * BK) + c0;
            for (int i = 0; i < RB; i++) {
                const float qv = qf[i * hd + d];
                for (int c = 0; c < CB; c++) a[i][c] += qv * kv[c];
            }
        }
        for (int i = 0; i < RB; i++)
            for (int c = 0; c < CB; c++) ((vf *)(s + i * BK))[c0 + c] = a[i][c];
    }
}

/* acc[r][d0:d0+VL*NC] += sum_j p[r][j] * vf[j][d0:d0+VL*NC] for rows r0..r0+RB-1 and j < nb. */
static inline __attribute__((always_inline)) void pv_cols(const float *p, const float *vt, float *acc, int64_t hd,
                                                          int64_t nb, int64_t d0, const int NC) {
    vf a[RB][CB];
    for (int i = 0; i < RB; i++)
        for (int c = 0; c < NC; c++) a[i][c] = ((const vf *)(acc + i * hd + d0))[c];
    for (int64_t j = 0; j < nb; j++) {
        const vf *vv = (const vf *)(vt + j * hd + d0);
        for (int i = 0; i < RB; i++) {
            const float pv = p[i * BK + j];
            for (int c = 0; c < NC; c++) a[i][c] += pv * vv[c];
        }
    }
    for (int i = 0; i < RB; i++)
        for (int c = 0; c < NC; c++) ((vf *)(acc + i * hd + d0))[c] = a[i][c];
}

static inline void pv_block(const float *p, const float *vt, float *acc, int64_t hd, int64_t nb) {
    int64_t d0 = 0;
    for (; d0 + CB * VL <= hd; d0 += CB * VL) pv_cols(p, vt, acc, hd, nb, d0, CB);
    const int64_t rest = (hd - d0) / VL; /* hd % 16 == 0, so no partial vector */
    if (rest == 3) pv_cols(p, vt, acc, hd, nb, d0, 3);
    else if (rest == 2) pv_cols(p, vt, acc, hd, nb, d0, 2);
    else if (rest == 1) pv_cols(p, vt, acc, hd, nb, d0, 1);
}

/* One work item: queries q0..q0+nq-1 of a chunk (all rep heads of KV head g). Rows are padded to a multiple of RB
 * with copies of the last row (their results are dropped). */
#define DEFINE_ITEM(SUFFIX, T, LOAD, STORE)                                                                  \
    static void item_##SUFFIX(const T *q, const T *kb, const T *vb, T *out, int64_t q0, int64_t nq,           \
                              int64_t start, int64_t g, int64_t nkv, int64_t rep, int64_t hd, float scale,    \
                              scratch_t *w) {                                                                 \
        const int64_t rows = nq * rep, padded = (rows + RB - 1) / RB * RB;                                    \
        for (int64_t r = 0; r < padded; r++) {                                                                \
            const int64_t rr = r < rows ? r : rows - 1, qi = q0 + rr / rep, h = rr % rep;                     \
            const T *src = q + ((qi * nkv + g) * rep + h) * hd;                                               \
            for (int64_t d = 0; d < hd; d++) w->qf[r * hd + d] = LOAD(src[d]) * scale;                        \
            memset(w->acc + r * hd, 0, sizeof(float) * (size_t)hd);                                           \
            w->m[r] = -INFINITY;                                                                              \
            w->l[r] = 0.f;                                                                                    \
        }                                                                                                     \
        const int64_t kend = start + q0 + nq; /* keys 0..kend-1: the last query's causal range */             \
        for (int64_t k0 = 0; k0 < kend; k0 += BK) {                                                           \
            const int64_t nb = kend - k0 < BK ? kend - k0 : BK;                                               \
            for (int64_t j = 0; j < nb; j++) {                                                                \
                const T *kr = kb + (k0 + j) * hd, *vr = vb + (k0 + j) * hd;                                   \
                for (int64_t d = 0; d < hd; d++) {                                                            \
                    w->kt[d * BK + j] = LOAD(kr[d]);                                                          \
                    w->vf[j * hd + d] = LOAD(vr[d]);                                                          \
                }                                                                                             \
            }                                                                                                 \
            for (int64_t j = nb; j < BK; j++)                                                                 \
                for (int64_t d = 0; d < hd; d++) w->kt[d * BK + j] = 0.f;                                     \
            for (int64_t r = 0; r < padded; r += RB) scores_block(w->qf + r * hd, w->kt, w->s + r * BK, hd);  \
            for (int64_t r = 0; r < padded; r++) { /* q is pre-scaled: the softmax's scale is 1 */           \
                const int64_t rr = r < rows ? r : rows - 1;                                                   \
                softmax_row(w->s + r * BK, start + q0 + rr / rep - k0, nb, 1.f, w->m + r, w->l + r,           \
                            w->acc + r * hd, hd);                                                             \
            }                                                                                                 \
            for (int64_t r = 0; r < padded; r += RB) pv_block(w->s + r * BK, w->vf, w->acc + r * hd, hd, nb); \
        }                                                                                                     \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            const int64_t qi = q0 + r / rep, h = r % rep;                                                     \
            T *dst = out + ((qi * nkv + g) * rep + h) * hd;                                                   \
            const float inv = 1.f / w->l[r];                                                                  \
            for (int64_t d = 0; d < hd; d++) dst[d] = STORE(w->acc[r * hd + d] * inv);                       \
        }                                                                                                     \
    }

DEFINE_ITEM(bf16, uint16_t, load_bf16, f32_to_bf16)
DEFINE_ITEM(f32, float, load_f32, store_f32)

typedef void (*item_fn)(const void *, const void *, const void *, void *, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, float, scratch_t *);

static int run(item_fn item, size_t elem, const void *q, const void *k, const void *v, const int64_t *chunks,
               int64_t num_chunks, void *out, int64_t tokens, int64_t nkv, int64_t rep, int64_t hd, int64_t slots,
               int64_t slot_len, float scale) {
    if (hd % 16 != 0 || hd > MAX_HD || rep < 1 || rep > MAX_REP) return 1;
    int64_t items;
    if (check_chunks(chunks, num_chunks, tokens, nkv, slots, slot_len, &items)) return 2;
    int failed = 0;
    const size_t rows = (size_t)(BQ * rep + RB + 4), tile = (size_t)hd * BK;
#pragma omp parallel
    {
        scratch_t w = {alloc_floats(rows * hd), alloc_floats(rows * hd), alloc_floats(rows * BK), alloc_floats(tile),
                       alloc_floats(tile),      alloc_floats(rows),      alloc_floats(rows),      NULL};
        const int ok = w.qf && w.acc && w.s && w.kt && w.vf && w.m && w.l;
        if (!ok) {
#pragma omp atomic write
            failed = 3;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!ok) continue;
            int64_t c, g, q0, nq;
            locate_item(chunks, num_chunks, nkv, it, &c, &g, &q0, &nq);
            const int64_t *ch = chunks + 4 * c;
            const size_t base = (size_t)((ch[0] * nkv + g) * slot_len * hd) * elem;
            const size_t row = (size_t)(ch[3] * nkv * rep * hd) * elem;
            item((const char *)q + row, (const char *)k + base, (const char *)v + base, (char *)out + row, q0, nq,
                 ch[1], g, nkv, rep, hd, scale, &w);
        }
        free(w.qf), free(w.acc), free(w.s), free(w.kt), free(w.vf), free(w.m), free(w.l);
    }
    return failed;
}

int prefill_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *chunks,
                           int64_t num_chunks, uint16_t *out, int64_t tokens, int64_t nkv, int64_t rep, int64_t hd,
                           int64_t slots, int64_t slot_len, float scale) {
#ifdef HAVE_BF16_DP
    if (hd % 64 == 0 && hd <= MAX_HD)
        return prefill_run_bf16_dp(q, k, v, chunks, num_chunks, out, tokens, nkv, rep, hd, slots, slot_len, scale);
#endif
    return run((item_fn)item_bf16, sizeof(uint16_t), q, k, v, chunks, num_chunks, out, tokens, nkv, rep, hd, slots,
               slot_len, scale);
}

int prefill_attention_f32(const float *q, const float *k, const float *v, const int64_t *chunks, int64_t num_chunks,
                          float *out, int64_t tokens, int64_t nkv, int64_t rep, int64_t hd, int64_t slots,
                          int64_t slot_len, float scale) {
    return run((item_fn)item_f32, sizeof(float), q, k, v, chunks, num_chunks, out, tokens, nkv, rep, hd, slots,
               slot_len, scale);
}

/* Decode attention over the engine's slot KV cache: one query token per decoding sequence.
 *
 * Built and loaded by inference/engine/kernels/build.py (gcc -O3 -march=native -fopenmp, linked against
 * the libgomp that torch itself uses, so it shares torch's OpenMP threads). Called through ctypes with raw
 * pointers; no Python or torch headers.
 *
 * Layouts (all contiguous, element type T = bf16 stored as uint16_t, or float):
 *   q     [nd, nkv, rep, hd]   the decoding rows' queries, the rep = n_heads / n_kv_heads query heads of a
 *                              KV head next to each other (GQA: query head h uses KV head h / rep, as HF)
 *   k, v  [slots, nkv, slot_len, hd]   the cache (inference/engine/kv_cache.py)
 *   slot  [nd] int64, len [nd] int64   each row's slot (< slots) and number of cached positions (>= 1) to attend
 *                              over
 *   out   [nd, nkv, rep, hd]
 * Math: out = softmax(scale * q . k[0:len]) @ v[0:len], in float32 (as torch's flash-attention CPU kernel
 * accumulates bf16 inputs), rounded to bf16 round-to-nearest-even on output.
 *
 * Why: torch's SDPA on CPU runs this case (query length 1-3 after folding GQA) at ~5 GB/s of K/V, a third
 * of the decode step at 32 sequences; here one work item per (sequence, KV head) reads its K rows once for
 * all rep query heads and its V rows once (the work split of vLLM's CPU paged-attention kernel), prefetching the next
 * item's rows as it goes: 30 layers of 32 sequences x 150 positions 8.6 -> 5.1 ms (12.8 -> 21.8 GB/s of K/V) on a
 * 2-vCPU Xeon, where K/V come from DRAM.
 * Returns 0, or 1 for unsupported geometry (hd not a multiple of 16 or > 256, rep > 8), 2 for a bad slot or length,
 * 3 when scratch memory could not be allocated; the caller then falls back to SDPA.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define LANES 16
#define MAX_HD 256
#define MAX_REP 8

static inline void load_row_bf16(const uint16_t *src, float *dst, int64_t hd) {
    for (int64_t d = 0; d < hd; d++) dst[d] = bf16_to_f32(src[d]);
}

static inline void load_row_f32(const float *src, float *dst, int64_t hd) { memcpy(dst, src, sizeof(float) * hd); }

/* Ask for the cache lines of one K or V row of the next work item (software prefetch: each item's rows are
 * contiguous, but the next item's start in memory elsewhere, so the hardware prefetcher starts every item cold). */
#define PREFETCH_ROW(ptr, bytes)                                                                               \
    for (int64_t o = 0; o < (bytes); o += 64) __builtin_prefetch((const char *)(ptr) + o, 0, 3)

/* One (sequence, KV head): scores, softmax, weighted sum of V. REP and HD are constants where inlined. kn, vn, nn:
 * the next work item's K and V rows and their count, prefetched row by row alongside this item's (nn = 0: none). */
#define DEFINE_ITEM(NAME, T, LOAD_ROW, STORE)                                                                 \
    static inline __attribute__((always_inline)) void NAME(const T *qb, const T *kb, const T *vb, T *ob,       \
                                                           int64_t n, const int64_t REP, const int64_t HD,     \
                                                           float scale, float *scores, int64_t stride,        \
                                                           const T *kn, const T *vn, int64_t nn) {            \
        float qf[MAX_REP * MAX_HD], acc[MAX_REP * MAX_HD], row[MAX_HD];                                        \
        for (int64_t r = 0; r < REP; r++) {                                                                    \
            LOAD_ROW(qb + r * HD, qf + r * HD, HD);                                                            \
            for (int64_t d = 0; d < HD; d++) qf[r * HD + d] *= scale;                                          \
        }                                                                                                      \
        for (int64_t t = 0; t < n; t++) {                                                                      \
            if (t < nn) PREFETCH_ROW(kn + t * HD, HD * (int64_t)sizeof(T));                                    \
            LOAD_ROW(kb + t * HD, row, HD);                                                                    \
            for (int64_t r = 0; r < REP; r++) {                                                                \
                float part[LANES] = {0};                                                                       \
                for (int64_t d = 0; d < HD; d += LANES)                                                        \
                    for (int l = 0; l < LANES; l++) part[l] += qf[r * HD + d + l] * row[d + l];                \
                float s = 0.f;                                                                                 \
                for (int l = 0; l < LANES; l++) s += part[l];                                                  \
                scores[r * stride + t] = s;                                                                    \
            }                                                                                                  \
        }                                                                                                      \
        for (int64_t r = 0; r < REP; r++) {                                                                    \
            float *sr = scores + r * stride, m = sr[0], sum = 0.f;                                             \
            for (int64_t t = 1; t < n; t++) m = sr[t] > m ? sr[t] : m;                                         \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                sr[t] = expf(sr[t] - m);                                                                       \
                sum += sr[t];                                                                                  \
            }                                                                                                  \
            const float inv = 1.f / sum;                                                                       \
            for (int64_t t = 0; t < n; t++) sr[t] *= inv;                                                      \
        }                                                                                                      \
        for (int64_t j = 0; j < REP * HD; j++) acc[j] = 0.f;                                                   \
        for (int64_t t = 0; t < n; t++) {                                                                      \
            if (t < nn) PREFETCH_ROW(vn + t * HD, HD * (int64_t)sizeof(T));                                    \
            LOAD_ROW(vb + t * HD, row, HD);                                                                    \
            for (int64_t r = 0; r < REP; r++) {                                                                \
                const float p = scores[r * stride + t];                                                        \
                for (int64_t d = 0; d < HD; d++) acc[r * HD + d] += p * row[d];                                \
            }                                                                                                  \
        }                                                                                                      \
        for (int64_t j = 0; j < REP * HD; j++) ob[j] = STORE(acc[j]);                                          \
    }

#define F32_STORE(x) (x)
DEFINE_ITEM(item_bf16, uint16_t, load_row_bf16, f32_to_bf16)
DEFINE_ITEM(item_f32, float, load_row_f32, F32_STORE)

/* Specialised copies for the common geometries (SmolLM2: 3 query heads per KV head, head dim 64). */
#define DISPATCH(ITEM, qb, kb, vb, ob, n, rep, hd, scale, scores, stride, kn, vn, nn)                       \
    do {                                                                                                       \
        if (rep == 3 && hd == 64) ITEM(qb, kb, vb, ob, n, 3, 64, scale, scores, stride, kn, vn, nn);          \
        else if (rep == 4 && hd == 64) ITEM(qb, kb, vb, ob, n, 4, 64, scale, scores, stride, kn, vn, nn);     \
        else if (rep == 1 && hd == 64) ITEM(qb, kb, vb, ob, n, 1, 64, scale, scores, stride, kn, vn, nn);     \
        else if (rep == 4 && hd == 128) ITEM(qb, kb, vb, ob, n, 4, 128, scale, scores, stride, kn, vn, nn);   \
        else ITEM(qb, kb, vb, ob, n, rep, hd, scale, scores, stride, kn, vn, nn);                              \
    } while (0)

#define DEFINE_KERNEL(NAME, T, ITEM)                                                                          \
    int NAME(const T *q, const T *k, const T *v, const int64_t *slot, const int64_t *len, T *out, int64_t nd,  \
             int64_t nkv, int64_t rep, int64_t hd, int64_t slots, int64_t slot_len, float scale) {             \
        if (hd % LANES != 0 || hd > MAX_HD || rep < 1 || rep > MAX_REP) return 1;                              \
        int64_t max_len = 1;                                                                                   \
        for (int64_t i = 0; i < nd; i++) {                                                                     \
            if (slot[i] < 0 || slot[i] >= slots || len[i] < 1 || len[i] > slot_len) return 2;                 \
            if (len[i] > max_len) max_len = len[i];                                                            \
        }                                                                                                      \
        int failed = 0;                                                                                        \
        _Pragma("omp parallel") {                                                                              \
            float *scores = malloc(sizeof(float) * (size_t)(rep * max_len));                                   \
            if (!scores) {                                                                                     \
                _Pragma("omp atomic write") failed = 3;                                                        \
            }                                                                                                  \
            _Pragma("omp for schedule(static)") for (int64_t w = 0; w < nd * nkv; w++) {                       \
                if (!scores) continue;                                                                         \
                const int64_t i = w / nkv, h = w % nkv, base = (slot[i] * nkv + h) * slot_len * hd;            \
                const int64_t wn = w + 1 < nd * nkv ? w + 1 : w, in = wn / nkv;                                \
                const int64_t next = (slot[in] * nkv + wn % nkv) * slot_len * hd, nn = wn == w ? 0 : len[in];  \
                DISPATCH(ITEM, q + w * rep * hd, k + base, v + base, out + w * rep * hd, len[i], rep, hd,      \
                         scale, scores, max_len, k + next, v + next, nn);                                      \
            }                                                                                                  \
            free(scores);                                                                                      \
        }                                                                                                      \
        return failed;                                                                                         \
    }

DEFINE_KERNEL(decode_attention_bf16, uint16_t, item_bf16)
DEFINE_KERNEL(decode_attention_f32, float, item_f32)

/* Rotary position embedding of a step's queries and keys, with the keys and values written straight into the
 * slot KV cache: one pass over the fused QKV projection instead of ~8 torch ops per layer (index_select of the
 * cos/sin rows, flip, two muls, an add, two index_copy_ into the cache). The same fusion as vLLM's
 * rotary_embedding + reshape_and_cache kernels; on the 2-core box the torch ops took ~11 % of a 512-token prefill
 * step, index_copy_ alone 8 %.
 *
 * Layouts (contiguous; T = step tokens, W = (nh + 2 nkv) hd):
 *   qkv [T, W]: per token nh query heads, nkv key heads, nkv value heads, hd each (the fused projection's output);
 *   cos, sin [P, hd]: HF's tables (cos, and sin with its first half negated: rotate_half's sign);
 *   pos, slots int64 [T]: each token's position in its sequence and its cache slot;
 *   q_out [T, nh, hd]: the rotated queries;
 *   k_cache, v_cache [S, nkv, L, hd]: rotated key / value of token t go to [slots[t], h, pos[t], :].
 * Math and rounding points are torch's for out = x * cos + rotate_half(x) * sin in the element type: both
 * products rounded to T, then their sum (no fused multiply-add, so float32 results are bit for bit torch's).
 * Returns 0, or 1 if a position or slot is out of range (nothing is written then).
 */
#pragma GCC optimize("fp-contract=off")
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define F32_ID(x) (x)
#define PARALLEL_MIN 32768 /* elements: below this one thread is faster than forking */

#define DEFINE_ROPE_CACHE(SUFFIX, T, LOAD, STORE)                                                           \
    static inline void rope_row_##SUFFIX(const T *x, const T *c, const T *sn, T *out, int64_t hd) {           \
        const int64_t half = hd / 2;                                                                          \
        for (int64_t j = 0; j < hd; j++) {                                                                    \
            const T swapped = j < half ? x[j + half] : x[j - half];                                           \
            const float a = LOAD(STORE(LOAD(x[j]) * LOAD(c[j])));                                             \
            const float b = LOAD(STORE(LOAD(swapped) * LOAD(sn[j])));                                         \
            out[j] = STORE(a + b);                                                                            \
        }                                                                                                     \
    }                                                                                                         \
    int rope_kv_write_##SUFFIX(const T *qkv, const T *cos, const T *sin, const int64_t *pos,                  \
                               const int64_t *slots, T *q_out, T *k_cache, T *v_cache, int64_t tokens,        \
                               int64_t nh, int64_t nkv, int64_t hd, int64_t num_pos, int64_t num_slots,       \
                               int64_t slot_len) {                                                            \
        for (int64_t t = 0; t < tokens; t++)                                                                  \
            if (pos[t] < 0 || pos[t] >= num_pos || pos[t] >= slot_len || slots[t] < 0 ||                      \
                slots[t] >= num_slots)                                                                        \
                return 1;                                                                                     \
        const int64_t width = (nh + 2 * nkv) * hd;                                                            \
        _Pragma("omp parallel for schedule(static) if (tokens * width >= PARALLEL_MIN)")                      \
        for (int64_t t = 0; t < tokens; t++) {                                                                \
            const T *x = qkv + t * width;                                                                     \
            const T *c = cos + pos[t] * hd, *sn = sin + pos[t] * hd;                                          \
            for (int64_t h = 0; h < nh; h++) rope_row_##SUFFIX(x + h * hd, c, sn, q_out + (t * nh + h) * hd, hd); \
            for (int64_t h = 0; h < nkv; h++) {                                                               \
                const int64_t row = ((slots[t] * nkv + h) * slot_len + pos[t]) * hd;                          \
                rope_row_##SUFFIX(x + (nh + h) * hd, c, sn, k_cache + row, hd);                               \
                memcpy(v_cache + row, x + (nh + nkv + h) * hd, (size_t)hd * sizeof(T));                       \
            }                                                                                                 \
        }                                                                                                     \
        return 0;                                                                                             \
    }

DEFINE_ROPE_CACHE(f32, float, F32_ID, F32_ID)
DEFINE_ROPE_CACHE(bf16, uint16_t, bf16_to_f32, f32_to_bf16)

/* What the two prefill-attention sources share (prefill_attention.c: the entry points, the generic float path
 * and its driver; prefill_attention_bf16.c: the bf16 paths on AVX512-BF16 and AMX): the work item's geometry, the
 * per-thread scratch, the generic online-softmax row, and the cutting of a call's chunks into work items.
 *
 * The helpers are static inline here, not functions of one of the two files, so that each file's loops keep them
 * inlined as they were when both paths were one file.
 */
#ifndef CHATSITE_PREFILL_ATTENTION_H
#define CHATSITE_PREFILL_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BQ 32 /* queries per work item (16: 11 % slower for a 1500-token prompt, the tiles packed twice as often) */
#define BK 64 /* keys per tile */
#define MAX_HD 256
#define MAX_REP 8

typedef struct {
    float *qf, *acc, *s, *kt, *vf, *m, *l;
    uint16_t *pb; /* the bf16 dot-product path's probabilities */
} scratch_t;

/* One row's online-softmax step over a tile (FlashAttention-2): the row's query sees the tile's first
 * min(last + 1, nb) keys (last: its position minus the tile's first; negative: none). sr (BK scores) becomes the
 * unnormalised probabilities exp(scale * (s - max)), zero past the visible keys; the running max *m and sum *l
 * and the row's accumulator acc (hd floats) are rescaled to the new max. Returns the visible key count (<= 0: the
 * tile is wholly after the query, sr all zero, nothing else changed). */
static inline int64_t softmax_row(float *sr, int64_t last, int64_t nb, float scale, float *m, float *l, float *acc,
                                  int64_t hd) {
    const int64_t nv = last + 1 < nb ? last + 1 : nb;
    if (nv <= 0) {
        memset(sr, 0, sizeof(float) * BK);
        return nv;
    }
    float mx = *m;
    for (int64_t j = 0; j < nv; j++) mx = sr[j] > mx ? sr[j] : mx;
    const float corr = expf((*m - mx) * scale);
    float sum = 0.f;
    for (int64_t j = 0; j < nv; j++) {
        sr[j] = expf((sr[j] - mx) * scale);
        sum += sr[j];
    }
    for (int64_t j = nv; j < BK; j++) sr[j] = 0.f;
    *l = *l * corr + sum;
    *m = mx;
    if (corr != 1.f)
        for (int64_t d = 0; d < hd; d++) acc[d] *= corr;
    return nv;
}

static inline float *alloc_floats(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); }

/* Checks every chunk against the cache and q; returns 0 and the number of work items, or 2. */
static inline int check_chunks(const int64_t *chunks, int64_t num_chunks, int64_t tokens, int64_t nkv,
                               int64_t slots, int64_t slot_len, int64_t *items) {
    *items = 0;
    for (int64_t c = 0; c < num_chunks; c++) {
        const int64_t *ch = chunks + 4 * c;
        if (ch[0] < 0 || ch[0] >= slots || ch[1] < 0 || ch[2] < 1 || ch[1] + ch[2] > slot_len || ch[3] < 0 ||
            ch[3] + ch[2] > tokens)
            return 2;
        *items += (ch[2] + BQ - 1) / BQ * nkv;
    }
    return 0;
}

/* Work item it: its chunk c, KV head g and query block q0..q0+nq-1. Each chunk's last query block comes first, so
 * the items with the most keys start early. */
static inline void locate_item(const int64_t *chunks, int64_t num_chunks, int64_t nkv, int64_t it, int64_t *c,
                               int64_t *g, int64_t *q0, int64_t *nq) {
    int64_t rest = it;
    for (*c = 0; *c < num_chunks; (*c)++) {
        const int64_t n_items = (chunks[4 * *c + 2] + BQ - 1) / BQ * nkv;
        if (rest < n_items) break;
        rest -= n_items;
    }
    const int64_t n = chunks[4 * *c + 2], blocks = (n + BQ - 1) / BQ, b = blocks - 1 - rest / nkv;
    *g = rest % nkv;
    *q0 = b * BQ;
    *nq = n - *q0 < BQ ? n - *q0 : BQ;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define HAVE_BF16_DP 1
/* prefill_attention_bf16.c: a bf16 call on AVX512-BF16 (hd % 64 == 0, hd <= MAX_HD), its products as bf16 dot
 * products or, where prefill_attention_amx(hd), on AMX tiles; returns as prefill_attention_bf16. Hidden: not one of
 * the library's entry points. */
__attribute__((visibility("hidden"))) int prefill_run_bf16_dp(const uint16_t *q, const uint16_t *k,
                                                               const uint16_t *v, const int64_t *chunks,
                                                               int64_t num_chunks, uint16_t *out, int64_t tokens,
                                                               int64_t nkv, int64_t rep, int64_t hd, int64_t slots,
                                                               int64_t slot_len, float scale);
#endif

#endif

/* Temperature, top-k and top-p (nucleus: Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR
 * 2020) sampling of one token per logits row, in one call for the whole batch.
 *
 * The engine's torch path (inference/engine/sampling.py: _sample_rows) divides the [R, V] logits by the
 * temperatures, takes torch.topk(256) and a logsumexp over every row, then cumsums and draws: 6.45 ms for 32 rows of
 * the default model's 49152-token vocabulary on one thread of a 2-vCPU Xeon, most of it topk's scalar scan, against
 * 1.56 ms here (python -m devtools.bench.sampling_probe, docs/engine.md "Sampling"). Here
 * each row is read twice, both passes vectorised (its maximum; the sum of exp((x - max) / T), glibc's libmvec
 * expf), and a third pass, 16 logits at a time, picks the candidates: for top-p alone every logit within
 * SAMPLE_SPAN / T of the maximum (usually tens of tokens; a flat row whose span holds more than SAMPLE_MAX_CAND
 * takes the `cand` largest instead), for top-k the k largest through a min-heap. The draw is then the torch
 * path's, over the candidates sorted by logit (descending, ties by index):
 *
 *   p_i = exp((x_i - max) / T) / sum            (the true softmax probability)
 *   top-k: p_i = 0 for i >= k; q_i = p_i / sum_{i<k} p_i (q = p without top-k)
 *   top-p: keep i while sum_{j<i} q_j < top_p   (the smallest prefix whose mass reaches top_p)
 *   token: the first kept i with sum_{j<=i} kept p_j > u * sum(kept p), u the row's uniform in [0, 1)
 *
 * The candidates of top-p alone are the most likely tokens, so when they hold top_p of the mass the nucleus is among
 * them; a row whose candidates hold less cannot be decided from them: out = -1, and the caller samples that row
 * its own way (the torch path: its top-256, else a full sort). Tokens of equal logits may be drawn in another order
 * than torch.topk's, which leaves every token's probability as it was. A row without top-k and top-p
 * (top_p >= 1) draws from the whole vocabulary in index order, as torch's cumsum over the full softmax does. A row
 * with a NaN logit or an infinite maximum also gets -1.
 *
 * Layouts (contiguous): x [rows, vocab] float32; inv_temp, top_p, u [rows] float32; top_k [rows] int64 (0: none);
 * out [rows] int64. Rows split over torch's OpenMP threads when there is enough work.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define SAMPLE_PARALLEL_MIN 65536 /* elements: below this one thread is faster than forking */
#define SAMPLE_MAX_CAND 1024      /* candidates a row may keep (the caller falls back to torch above it) */
#define SAMPLE_CHUNK 16
#define SAMPLE_SPAN 10.f /* top-p candidates: logits within SAMPLE_SPAN / T of the row's maximum */

/* Candidate i orders before j: a larger logit, or the same logit at a smaller index. */
static inline int cand_before(float vi, int32_t ii, float vj, int32_t ij) { return vi > vj || (vi == vj && ii < ij); }

/* Restore the min-heap (least-ordered candidate at the root) below position at. */
static void heap_down(float *hv, int32_t *hi, int64_t n, int64_t at) {
    for (;;) {
        int64_t l = 2 * at + 1, least = at;
        if (l < n && cand_before(hv[least], hi[least], hv[l], hi[l])) least = l;
        if (l + 1 < n && cand_before(hv[least], hi[least], hv[l + 1], hi[l + 1])) least = l + 1;
        if (least == at) return;
        const float tv = hv[at];
        const int32_t ti = hi[at];
        hv[at] = hv[least], hi[at] = hi[least];
        hv[least] = tv, hi[least] = ti;
        at = least;
    }
}

/* The kc largest logits of xr (kc <= n), sorted descending (ties by index) into sv / si. */
static void top_candidates(const float *xr, int64_t n, int64_t kc, float *sv, int32_t *si) {
    for (int64_t j = 0; j < kc; j++) sv[j] = xr[j], si[j] = (int32_t)j;
    for (int64_t j = kc / 2 - 1; j >= 0; j--) heap_down(sv, si, kc, j);
    int64_t j = kc;
    for (; j < n && j % SAMPLE_CHUNK; j++) {
        if (xr[j] > sv[0]) sv[0] = xr[j], si[0] = (int32_t)j, heap_down(sv, si, kc, 0);
    }
    for (; j + SAMPLE_CHUNK <= n; j += SAMPLE_CHUNK) {
        float m = xr[j];
        for (int64_t c = 1; c < SAMPLE_CHUNK; c++) m = xr[j + c] > m ? xr[j + c] : m;
        if (!(m > sv[0])) continue;
        for (int64_t c = 0; c < SAMPLE_CHUNK; c++) {
            if (xr[j + c] > sv[0]) sv[0] = xr[j + c], si[0] = (int32_t)(j + c), heap_down(sv, si, kc, 0);
        }
    }
    for (; j < n; j++) {
        if (xr[j] > sv[0]) sv[0] = xr[j], si[0] = (int32_t)j, heap_down(sv, si, kc, 0);
    }
    /* Heap-sort: the least goes to the back, so the array ends descending. */
    for (int64_t end = kc - 1; end > 0; end--) {
        const float tv = sv[0];
        const int32_t ti = si[0];
        sv[0] = sv[end], si[0] = si[end];
        sv[end] = tv, si[end] = ti;
        heap_down(sv, si, end, 0);
    }
}

/* Sorts n candidates descending (ties by index): insertion sort, n is small (tens to a few hundred). */
static void sort_candidates(float *sv, int32_t *si, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        const float v = sv[i];
        const int32_t id = si[i];
        int64_t j = i - 1;
        while (j >= 0 && cand_before(v, id, sv[j], si[j])) sv[j + 1] = sv[j], si[j + 1] = si[j], j--;
        sv[j + 1] = v, si[j + 1] = id;
    }
}

/* Every logit of xr at or above lo, in index order, into sv / si; returns how many, or -1 past cap. */
static int64_t above(const float *xr, int64_t n, float lo, float *sv, int32_t *si, int64_t cap) {
    int64_t c = 0, j = 0;
    for (; j + SAMPLE_CHUNK <= n; j += SAMPLE_CHUNK) {
        float m = xr[j];
        for (int64_t k = 1; k < SAMPLE_CHUNK; k++) m = xr[j + k] > m ? xr[j + k] : m;
        if (m < lo) continue;
        for (int64_t k = 0; k < SAMPLE_CHUNK; k++) {
            if (xr[j + k] >= lo) {
                if (c == cap) return -1;
                sv[c] = xr[j + k], si[c++] = (int32_t)(j + k);
            }
        }
    }
    for (; j < n; j++) {
        if (xr[j] >= lo) {
            if (c == cap) return -1;
            sv[c] = xr[j], si[c++] = (int32_t)j;
        }
    }
    return c;
}

static int64_t sample_row(const float *xr, int64_t n, float it, int64_t k, float top_p, float u, int64_t cand) {
    float mx = xr[0];
    int nan = 0;
    for (int64_t j = 0; j < n; j++) {
        mx = xr[j] > mx ? xr[j] : mx;
        nan |= f32_bits(xr[j]) > 0x7f800000u;
    }
    if (nan || f32_bits(mx) >= 0x7f800000u) return -1;
    if (k <= 0 && top_p >= 1.f) { /* the whole vocabulary, in index order; the running sum in double */
        double total = 0.0;
        for (int64_t j = 0; j < n; j++) total += expf((xr[j] - mx) * it);
        const double target = u * total;
        double cum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            cum += expf((xr[j] - mx) * it);
            if (cum > target) return j;
        }
        return n - 1;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < n; j++) sum += expf((xr[j] - mx) * it);
    float sv[SAMPLE_MAX_CAND];
    int32_t si[SAMPLE_MAX_CAND];
    int64_t kc;
    if (k > 0) { /* top-k: exactly the k largest */
        kc = k < n ? k : n;
        top_candidates(xr, n, kc, sv, si);
    } else {
        /* top-p alone: every logit within SAMPLE_SPAN / T of the maximum (probability at least e^-SAMPLE_SPAN of the
         * most likely token's). Those are the most likely tokens, so when they hold top_p of the mass the nucleus
         * is among them; else (or when more than cand of them) the row is left to the caller. */
        kc = above(xr, n, mx - SAMPLE_SPAN / it, sv, si, SAMPLE_MAX_CAND);
        if (kc > 0) {
            sort_candidates(sv, si, kc);
        } else { /* a flat row: the cand largest, as the torch path takes them */
            kc = cand < n ? cand : n;
            top_candidates(xr, n, kc, sv, si);
        }
    }
    float p[SAMPLE_MAX_CAND];
    float denom = 0.f;
    for (int64_t i = 0; i < kc; i++) {
        p[i] = expf((sv[i] - mx) * it) / sum;
        denom += p[i];
    }
    if (k <= 0) {
        if (denom < top_p) return -1; /* the candidates do not reach top_p: only a full sort can tell */
        denom = 1.f;
    }
    float before = 0.f, total = 0.f;
    int64_t last = 0;
    for (int64_t i = 0; i < kc; i++) {
        const float q = p[i] / denom;
        if (!(before < top_p) || p[i] <= 0.f) {
            p[i] = 0.f;
        } else {
            total += p[i];
            last = i;
        }
        before += q;
    }
    const float target = u * total;
    float cum = 0.f;
    for (int64_t i = 0; i <= last; i++) {
        cum += p[i];
        if (p[i] > 0.f && cum > target) return si[i];
    }
    return si[last];
}

void sample_top_p_f32(const float *x, int64_t rows, int64_t vocab, const float *inv_temp, const int64_t *top_k,
                      const float *top_p, const float *u, int64_t cand, int64_t *out) {
#pragma omp parallel for schedule(static) if (rows * vocab >= SAMPLE_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        out[r] = top_k[r] > SAMPLE_MAX_CAND || cand > SAMPLE_MAX_CAND
                     ? -1
                     : sample_row(x + r * vocab, vocab, inv_temp[r], top_k[r] < vocab ? top_k[r] : 0, top_p[r], u[r],
                                  cand);
    }
}

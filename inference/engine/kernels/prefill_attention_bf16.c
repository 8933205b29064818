/* The bf16 paths of prefill attention (prefill_attention.c: the entry points, the layouts, the generic float path):
 * on a CPU with AVX512-BF16, Q.K^T and P.V as bf16 pair dot products (item_bf16_dp), and where AMX is granted and the
 * head size is 64, on the tiles (item_amx); both run over K/V tiles packed once per call (pack_tile, driven by
 * prefill_run_bf16_dp) and, for head size 64, take the row's softmax in AVX-512 (softmax_row_64, exp16). Built
 * without AVX512-BF16 this file holds prefill_attention_amx alone, which then answers 0.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "prefill_attention.h"

#ifdef HAVE_BF16_DP
#include <immintrin.h>

/* bf16 inputs on a CPU with AVX512-BF16: Q.K^T and P.V as bf16 pair dot products (vdpbf16ps) with float32
 * accumulation, half the instructions of the float32 path, as oneDNN's and torch's bf16 GEMMs do; P is rounded
 * to bf16 before P.V (as torch's flash-attention CPU kernel does for bf16). The scale is applied to the float32
 * scores, not to q. Tiles: K as [hd/2][BK][2] and V as [BK/2][hd][2] (pairs along the reduced axis). hd % 64 == 0. */
/* Tile t of a (chunk, KV head): keys t*BK .. t*BK+BK-1 of the nkeys the chunk sees, packed (zeros past nkeys). */
static void pack_tile(const uint16_t *kb, const uint16_t *vb, uint32_t *kp, uint32_t *vp, int64_t t, int64_t nkeys,
                      int64_t hd) {
    const int64_t k0 = t * BK, nb = nkeys - k0 < BK ? nkeys - k0 : BK, pairs = hd / 2;
    for (int64_t j = 0; j < BK; j++) {
        const uint32_t *kr = (const uint32_t *)(kb + (k0 + j) * hd);
        for (int64_t p = 0; p < pairs; p++) kp[p * BK + j] = j < nb ? kr[p] : 0u;
    }
    for (int64_t jj = 0; jj < BK / 2; jj++) {
        const uint16_t *v0 = vb + (k0 + 2 * jj) * hd;
        const int first = 2 * jj < nb, second = 2 * jj + 1 < nb;
        for (int64_t d = 0; d < hd; d++)
            vp[jj * hd + d] = (first ? (uint32_t)v0[d] : 0u) | (second ? (uint32_t)v0[hd + d] << 16 : 0u);
    }
}

/* exp of 16 floats: 2^(x log2 e) as 2^n (VSCALEFPS, which takes n <= -150 to 0) times e^y, |y| <= ln2 / 2, by its
 * Taylor polynomial to degree 6 (relative error < 2e-7, float's own rounding; libmvec's expf took ~60 % of the
 * row's softmax). */
static inline __m512 exp16(__m512 x) {
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 y = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718056f));
    __m512 p = _mm512_set1_ps(1.f / 720.f);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* softmax_row for one row of BK == 64 scores in AVX-512 registers, hd == 64: the probabilities go out as bf16 (pr),
 * zeros past the visible keys (last + 1 of nb); the row's max m (finite: -1e30 before the first tile), sum l and
 * accumulator acc are updated. The AMX path's and the dot-product path's softmax for that head size: the generic
 * softmax_row's scalar loops and libmvec's expf took ~37 % of the dot-product path's time (a 1500-token prompt, 2-vCPU
 * Zen 5: 166-171 ms over 30 layers, 108 without the softmax). */
static inline void softmax_row_64(const float *sr, uint16_t *pr, int64_t last, int64_t nb, float scale, float *m,
                                  float *l, float *acc) {
    const int64_t nv = last + 1 < nb ? last + 1 : nb;
    if (nv <= 0) {
        memset(pr, 0, sizeof(uint16_t) * BK);
        return;
    }
    __m512 v[4];
    __mmask16 live[4];
    __m512 mx = _mm512_set1_ps(*m);
    for (int c = 0; c < 4; c++) {
        const int64_t left = nv - 16 * c;
        live[c] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        v[c] = _mm512_loadu_ps(sr + 16 * c);
        mx = _mm512_mask_max_ps(mx, live[c], mx, v[c]);
    }
    const float top = _mm512_reduce_max_ps(mx);
    const __m512 topv = _mm512_set1_ps(top), sc = _mm512_set1_ps(scale);
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < 4; c++) {
        v[c] = _mm512_maskz_mov_ps(live[c], exp16(_mm512_mul_ps(_mm512_sub_ps(v[c], topv), sc)));
        sum = _mm512_add_ps(sum, v[c]);
    }
    _mm512_storeu_si512((__m512i *)pr, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
    _mm512_storeu_si512((__m512i *)(pr + 32), (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]));
    const float total = _mm512_reduce_add_ps(sum);
    if (top == *m) { /* the max held: nothing to rescale */
        *l += total;
        return;
    }
    const __m512 cv = exp16(_mm512_set1_ps((*m - top) * scale)); /* 0 on the first tile: m = -1e30 */
    *l = *l * _mm512_cvtss_f32(cv) + total;
    *m = top;
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), cv));
}

/* One work item over tiles packed once per call (shared by every query block of the chunk and KV head). */
static void item_bf16_dp(const uint16_t *q, const uint32_t *kp_tiles, const uint32_t *vp_tiles, uint16_t *out,
                         int64_t q0, int64_t nq, int64_t start, int64_t g, int64_t nkv, int64_t rep, int64_t hd,
                         float scale, scratch_t *w) {
    const int64_t rows = nq * rep, padded = (rows + 3) / 4 * 4, pairs = hd / 2;
    const uint32_t *qrow[BQ * MAX_REP + 4];
    for (int64_t r = 0; r < padded; r++) {
        const int64_t rr = r < rows ? r : rows - 1, qi = q0 + rr / rep, h = rr % rep;
        qrow[r] = (const uint32_t *)(q + ((qi * nkv + g) * rep + h) * hd);
        memset(w->acc + r * hd, 0, sizeof(float) * (size_t)hd);
        w->m[r] = hd == 64 ? -1e30f : -INFINITY; /* softmax_row_64 needs it finite (exp16 of it is 0) */
        w->l[r] = 0.f;
    }
    const int64_t kend = start + q0 + nq;
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int64_t nb = kend - k0 < BK ? kend - k0 : BK, nb2 = (nb + 1) / 2;
        const uint32_t *kp = kp_tiles + (k0 / BK) * BK * pairs, *vp = vp_tiles + (k0 / BK) * BK * pairs;
        for (int64_t r = 0; r < padded; r += 4) {
            __m512 a[4][BK / 16];
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < BK / 16; c++) a[i][c] = _mm512_setzero_ps();
            for (int64_t p = 0; p < pairs; p++) {
                __m512bh kv[BK / 16];
                for (int c = 0; c < BK / 16; c++) kv[c] = (__m512bh)_mm512_loadu_si512(kp + p * BK + c * 16);
                for (int i = 0; i < 4; i++) {
                    const __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qrow[r + i][p]);
                    for (int c = 0; c < BK / 16; c++) a[i][c] = _mm512_dpbf16_ps(a[i][c], qv, kv[c]);
                }
            }
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < BK / 16; c++) _mm512_storeu_ps(w->s + (r + i) * BK + c * 16, a[i][c]);
        }
        for (int64_t r = 0; r < padded; r++) {
            const int64_t rr = r < rows ? r : rows - 1;
            float *sr = w->s + r * BK;
            uint16_t *pr = w->pb + r * BK;
            if (hd == 64) {
                softmax_row_64(sr, pr, start + q0 + rr / rep - k0, nb, scale, w->m + r, w->l + r, w->acc + r * hd);
                continue;
            }
            const int64_t nv = softmax_row(sr, start + q0 + rr / rep - k0, nb, scale, w->m + r, w->l + r,
                                           w->acc + r * hd, hd);
            for (int64_t j = 0; j < nv; j++) pr[j] = f32_to_bf16(sr[j]);
            for (int64_t j = nv > 0 ? nv : 0; j < BK; j++) pr[j] = 0;
        }
        for (int64_t r = 0; r < padded; r += 4) {
            const uint32_t *pr = (const uint32_t *)(w->pb + r * BK);
            for (int64_t d0 = 0; d0 < hd; d0 += 64) {
                __m512 a[4][4];
                for (int i = 0; i < 4; i++)
                    for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(w->acc + (r + i) * hd + d0 + c * 16);
                for (int64_t jj = 0; jj < nb2; jj++) {
                    __m512bh vv[4];
                    for (int c = 0; c < 4; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + jj * hd + d0 + c * 16);
                    for (int i = 0; i < 4; i++) {
                        const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pr[i * (BK / 2) + jj]);
                        for (int c = 0; c < 4; c++) a[i][c] = _mm512_dpbf16_ps(a[i][c], pv, vv[c]);
                    }
                }
                for (int i = 0; i < 4; i++)
                    for (int c = 0; c < 4; c++) _mm512_storeu_ps(w->acc + (r + i) * hd + d0 + c * 16, a[i][c]);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t qi = q0 + r / rep, h = r % rep;
        uint16_t *dst = out + ((qi * nkv + g) * rep + h) * hd;
        const float inv = 1.f / w->l[r];
        for (int64_t d = 0; d < hd; d++) dst[d] = f32_to_bf16(w->acc[r * hd + d] * inv);
    }
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(HAVE_BF16_DP)
#define HAVE_AMX 1
int linear_amx_available(void); /* linear_amx.c: asks Linux for the tile state once */

/* The same work item on AMX tiles (TDPBF16PS: C[16 x 16] float += A[16 x 32] bf16 . B[16 pairs x 16] bf16), over
 * the same packed tiles: K's [hd/2][BK][2] is B for the scores (dims in pairs down, keys across), V's
 * [BK/2][hd][2] is B for P.V (keys in pairs down, dims across). Rows (query, rep head) go 16 at a time: their
 * queries copied into qb as A, the scores of 4 key groups in 4 accumulator tiles; the probabilities (bf16, as
 * the dot-product path) are A for P.V, whose accumulators are loaded from and stored back to acc, where the
 * softmax rescales them. Needs hd % 32 == 0 and hd <= 64 * 4 ... hd == 64 here (4 tiles of 16 dims). */
static void item_amx(const uint16_t *q, const uint32_t *kp_tiles, const uint32_t *vp_tiles, uint16_t *out,
                     int64_t q0, int64_t nq, int64_t start, int64_t g, int64_t nkv, int64_t rep, int64_t hd,
                     float scale, scratch_t *w) {
    const int64_t rows = nq * rep, padded = (rows + 15) / 16 * 16;
    uint16_t *qb = (uint16_t *)w->qf;
    for (int64_t r = 0; r < padded; r++) {
        const int64_t rr = r < rows ? r : rows - 1, qi = q0 + rr / rep, h = rr % rep;
        memcpy(qb + r * hd, q + ((qi * nkv + g) * rep + h) * hd, sizeof(uint16_t) * (size_t)hd);
        memset(w->acc + r * hd, 0, sizeof(float) * (size_t)hd);
        w->m[r] = -1e30f; /* finite: -ffast-math may assume no infinities (exp16 of it is 0) */
        w->l[r] = 0.f;
    }
    const int64_t kend = start + q0 + nq;
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int64_t nb = kend - k0 < BK ? kend - k0 : BK;
        const uint32_t *kp = kp_tiles + (k0 / BK) * BK * (hd / 2), *vp = vp_tiles + (k0 / BK) * BK * (hd / 2);
        for (int64_t r = 0; r < padded; r += 16) {
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            for (int64_t d0 = 0; d0 < hd; d0 += 32) { /* 16 dim pairs: rows d0/2 .. of kp */
                _tile_loadd(0, qb + r * hd + d0, hd * 2);
                _tile_loadd(1, kp + (d0 / 2) * BK + 0, BK * 4);
                _tile_dpbf16ps(4, 0, 1);
                _tile_loadd(2, kp + (d0 / 2) * BK + 16, BK * 4);
                _tile_dpbf16ps(5, 0, 2);
                _tile_loadd(1, kp + (d0 / 2) * BK + 32, BK * 4);
                _tile_dpbf16ps(6, 0, 1);
                _tile_loadd(2, kp + (d0 / 2) * BK + 48, BK * 4);
                _tile_dpbf16ps(7, 0, 2);
            }
            _tile_stored(4, w->s + r * BK + 0, BK * 4);
            _tile_stored(5, w->s + r * BK + 16, BK * 4);
            _tile_stored(6, w->s + r * BK + 32, BK * 4);
            _tile_stored(7, w->s + r * BK + 48, BK * 4);
        }
        for (int64_t r = 0; r < padded; r++) {
            const int64_t rr = r < rows ? r : rows - 1;
            softmax_row_64(w->s + r * BK, w->pb + r * BK, start + q0 + rr / rep - k0, nb, scale, w->m + r,
                            w->l + r, w->acc + r * hd);
        }
        for (int64_t r = 0; r < padded; r += 16) {
            float *acc = w->acc + r * hd;
            _tile_loadd(0, w->pb + r * BK, BK * 2);      /* P, keys 0-31 */
            _tile_loadd(1, w->pb + r * BK + 32, BK * 2); /* keys 32-63 */
            for (int64_t d0 = 0; d0 < hd; d0 += 16) {
                _tile_loadd(4, acc + d0, hd * 4);
                _tile_loadd(2, vp + 0 * hd + d0, hd * 4);  /* key pairs 0-15 */
                _tile_dpbf16ps(4, 0, 2);
                _tile_loadd(3, vp + 16 * hd + d0, hd * 4); /* key pairs 16-31 */
                _tile_dpbf16ps(4, 1, 3);
                _tile_stored(4, acc + d0, hd * 4);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t qi = q0 + r / rep, h = r % rep;
        uint16_t *dst = out + ((qi * nkv + g) * rep + h) * hd;
        const float inv = 1.f / w->l[r];
        for (int64_t d = 0; d < hd; d++) dst[d] = f32_to_bf16(w->acc[r * hd + d] * inv);
    }
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;
#endif

/* Whether bf16 chunks of head size hd run on AMX tiles here (built with AMX, granted by the OS, hd == 64). */
int prefill_attention_amx(int64_t hd) {
#ifdef HAVE_AMX
    return hd == 64 && linear_amx_available();
#else
    (void)hd;
    return 0;
#endif
}

#ifdef HAVE_BF16_DP
/* The bf16 dot-product path: every (chunk, KV head)'s K/V tiles are packed once (phase 1, split over the threads),
 * then the query blocks run over them (phase 2). Packing per work item instead cost ~25 % of the time. */
int prefill_run_bf16_dp(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *chunks,
                        int64_t num_chunks, uint16_t *out, int64_t tokens, int64_t nkv, int64_t rep, int64_t hd,
                        int64_t slots, int64_t slot_len, float scale) {
    if (rep < 1 || rep > MAX_REP) return 1;
    int64_t items, units = 0;
    if (check_chunks(chunks, num_chunks, tokens, nkv, slots, slot_len, &items)) return 2;
    int64_t *tile_base = malloc(sizeof(int64_t) * (size_t)(num_chunks + 1));
    if (!tile_base) return 3;
    for (int64_t c = 0; c < num_chunks; c++) {
        tile_base[c] = units;
        units += (chunks[4 * c + 1] + chunks[4 * c + 2] + BK - 1) / BK * nkv;
    }
    tile_base[num_chunks] = units;
    const size_t tile = (size_t)BK * (size_t)(hd / 2); /* uint32 pairs per packed tile */
    uint32_t *kp_all = aligned_alloc(64, units * tile * 4 + 64), *vp_all = aligned_alloc(64, units * tile * 4 + 64);
    int failed = (kp_all && vp_all) ? 0 : 3;
    const size_t rows = (size_t)(BQ * rep + 16);
#ifdef HAVE_AMX
    const int amx = prefill_attention_amx(hd);
#endif
#pragma omp parallel if (!failed)
    {
        scratch_t w = {alloc_floats(rows * hd / 2 + 16), alloc_floats(rows * hd), alloc_floats(rows * BK), NULL, NULL,
                       alloc_floats(rows),   alloc_floats(rows),        (uint16_t *)alloc_floats(rows * BK / 2 + 16)};
        const int ok = !failed && w.qf && w.acc && w.s && w.m && w.l && w.pb;
#ifdef HAVE_AMX
        amx_config saved, mine = {1, 0, {0}, {0}, {0}};
        if (amx) {
            _tile_storeconfig(&saved);
            for (int t = 0; t < 8; t++) mine.rows[t] = 16, mine.colsb[t] = 64;
            _tile_loadconfig(&mine);
        }
#endif
        if (!ok) {
#pragma omp atomic write
            failed = 3;
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            if (!kp_all || !vp_all) continue;
            int64_t c = 0;
            while (tile_base[c + 1] <= u) c++;
            const int64_t *ch = chunks + 4 * c, nkeys = ch[1] + ch[2], tiles = (nkeys + BK - 1) / BK;
            const int64_t rest = u - tile_base[c], g = rest / tiles, t = rest % tiles;
            const size_t base = (size_t)((ch[0] * nkv + g) * slot_len * hd);
            pack_tile(k + base, v + base, kp_all + u * tile, vp_all + u * tile, t, nkeys, hd);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!ok) continue;
            int64_t c, g, q0, nq;
            locate_item(chunks, num_chunks, nkv, it, &c, &g, &q0, &nq);
            const int64_t *ch = chunks + 4 * c, tiles = (ch[1] + ch[2] + BK - 1) / BK;
            const size_t first = (size_t)(tile_base[c] + g * tiles) * tile, row = (size_t)(ch[3] * nkv * rep * hd);
#ifdef HAVE_AMX
            if (amx) {
                item_amx(q + row, kp_all + first, vp_all + first, out + row, q0, nq, ch[1], g, nkv, rep, hd, scale,
                         &w);
                continue;
            }
#endif
            item_bf16_dp(q + row, kp_all + first, vp_all + first, out + row, q0, nq, ch[1], g, nkv, rep, hd, scale,
                         &w);
        }
#ifdef HAVE_AMX
        if (amx) {
            if (saved.palette_id)
                _tile_loadconfig(&saved);
            else
                _tile_release();
        }
#endif
        free(w.qf), free(w.acc), free(w.s), free(w.m), free(w.l), free(w.pb);
    }
    free(kp_all), free(vp_all), free(tile_base);
    return failed;
}
#endif

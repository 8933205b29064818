/* The load-time packing of the float32 panel kernel (linear_fma.c): torch's Linear weight, or its GGUF Q8_0 or Q4_1
 * blocks, rearranged into panels of PANEL output columns (linear_fma.h: 8 with AVX2, 16 with AVX-512) so that the
 * tiles' weight loads are sequential. Plain loops, built whatever the CPU (outside the tiles' AVX2 guard).
 */
#include <stdint.h>

#include "linear_fma.h"

/* The panel width this object was built with: output columns per panel (8 with AVX2, 16 with AVX-512). The packed
 * layouts below depend on it, so the caller reads it rather than assuming one. */
int fma_panel(void) { return PANEL; }

/* Pack w [n, k] (torch's Linear weight) into panels [n / PANEL][k][PANEL]; n a multiple of PANEL (2 PANEL with
 * swiglu). swiglu: w is [gate; up] and panel 2j of out is gate panel j, panel 2j + 1 up panel j. */
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
 * [n / PANEL][k][PANEL] int8 and dp [n / PANEL][k / 32][PANEL] float32 (one scale per column per block of 32 inputs).
 * n a multiple of PANEL, k of 32. */
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

/* Q4_1 blocks (block_quant.BlockWeight: qs [n, k / 2] uint8, per block of 32 inputs byte j holding input j in its low
 * nibble and input j + 16 in its high one; d and mn [n, k / 32] float32) into the panel order: qp [n / PANEL][k][PANEL
 * / 2] uint8, byte c of a row holding column c in its low nibble and column c + PANEL / 2 in its high one, and dp, mp
 * [n / PANEL][k / 32][PANEL] float32. n a multiple of PANEL (2 PANEL with swiglu), k of 32. swiglu: the blocks are
 * [gate; up] and panel 2j is gate panel j, panel 2j + 1 up panel j (as fma_pack_f32). */
void fma_pack_q4_1(const uint8_t *qs, const float *d, const float *mn, uint8_t *qp, float *dp, float *mp, int64_t n,
                   int64_t k, int swiglu) {
    const int64_t panels = n / PANEL, nb = k / 32, half = PANEL / 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t from = swiglu ? (p % 2) * (panels / 2) + p / 2 : p;
        for (int64_t j = 0; j < k; j++) {
            const int64_t b = j / 32, jj = j % 32;
            for (int64_t c = 0; c < half; c++) {
                uint8_t nib[2];
                for (int64_t h = 0; h < 2; h++) {
                    const uint8_t byte = qs[(from * PANEL + c + h * half) * (k / 2) + b * 16 + jj % 16];
                    nib[h] = jj < 16 ? (byte & 0x0F) : (byte >> 4);
                }
                qp[(p * k + j) * half + c] = (uint8_t)(nib[0] | (nib[1] << 4));
            }
        }
        for (int64_t b = 0; b < nb; b++)
            for (int64_t c = 0; c < PANEL; c++) {
                dp[(p * nb + b) * PANEL + c] = d[(from * PANEL + c) * nb + b];
                mp[(p * nb + b) * PANEL + c] = mn[(from * PANEL + c) * nb + b];
            }
    }
}

/* What the register-tile matmuls (linear_vnni.c, linear_fma.c) share: the prefetch of the next column block.
 *
 * Both walk the packed weight one column block at a time; while a block's row tiles compute, the first of them
 * brings the next block in from DRAM to L2 a few cache lines per k step, so the stream overlaps the arithmetic
 * instead of stalling the next block's first tile. */
#ifndef CHATSITE_TILES_H
#define CHATSITE_TILES_H

#include <stdint.h>

/* Where the next column block starts and ends, and how many of its cache lines to prefetch per k step. */
typedef struct {
    const char *next, *end;
    int lines;
} prefetch_t;

/* The prefetch of the block after the one of `panels` panels at panel p0 (panels of panel_bytes each, blocks of
 * per_block panels, panels_total in all), spread over the `iters` k steps of this block, at most max_lines cache lines
 * a step. Only for a block that has a successor to prefetch (the caller keeps {NULL, NULL, 0} otherwise). */
static inline prefetch_t next_block_prefetch(const char *wp, int64_t panel_bytes, int64_t panels_total, int64_t p0,
                                             int64_t panels, int64_t per_block, int64_t iters, int max_lines) {
    const int64_t left = panels_total - p0 - panels;
    const int64_t next_panels = left < per_block ? left : per_block;
    prefetch_t pf;
    pf.next = wp + (p0 + panels) * panel_bytes;
    pf.end = pf.next + next_panels * panel_bytes;
    const int64_t lines = next_panels * panel_bytes / 64;
    pf.lines = (int)((lines + iters - 1) / iters);
    if (pf.lines > max_lines) pf.lines = max_lines;
    return pf;
}

/* One k step's share of the prefetch: pf->lines cache lines from p into L2 (prefetcht1), not past pf->end; returns
 * where the next step goes on. */
static inline __attribute__((always_inline)) const char *prefetch_step(const char *p, const prefetch_t *pf) {
#pragma GCC unroll 4
    for (int l = 0; l < pf->lines; l++) {
        if (p < pf->end) {
            __builtin_prefetch(p, 0, 2);
            p += 64;
        }
    }
    return p;
}

#endif

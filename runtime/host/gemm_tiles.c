/*
 * gemm_tiles.c - how the GEMM of C = A B is cut into tiles for the persistent kernel's workers:
 * the tile width (128 or 256 columns; MACO_GEMM_TILE_WIDTH) and the order of the tiles
 * (maco_gemm_plan_tiles, maco/persistent.h). Needs no GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

/* Appends the tiles of width tn in groups of `group` tile rows, column by column inside a
 * group; returns the new count. */
static size_t maco__gemm_plan_grid(uint32_t rows, uint32_t cols, uint32_t tn, uint32_t group,
                                   maco_gemm_tile_t *tiles, size_t at)
{
    for (uint32_t g0 = 0; g0 < rows; g0 += group)
        for (uint32_t c = 0; c < cols; c++)
            for (uint32_t r = g0; r < rows && r < g0 + group; r++, at++)
                if (tiles != NULL)
                    tiles[at] = (maco_gemm_tile_t){ r, c, tn };
    return at;
}

uint32_t maco__gemm_tile_width(uint32_t m, uint32_t n, uint64_t units, int *forced_p)
{
    /* A wide tile reads a third fewer bytes per FLOP than two narrow ones and pays the per-task
     * costs once; but half as many tasks leave workers idle when C is small
     * (docs/performance.md, "Tuning", "GEMM tiles"): wide only when there are at least as many
     * wide tiles as units. */
    const char *want = maco__config_string(MACO_CFG_GEMM_TILE_WIDTH);
    int forced = strcmp(want, "128") == 0 || strcmp(want, "256") == 0;
    if (!forced && strcasecmp(want, "auto") != 0)
        MACO_LOG(MACO_LOG_WARN, MACO_SUBSYS_PERSIST,
                 "MACO_GEMM_TILE_WIDTH=%s: auto, 128 or 256; auto is used", want);
    if (forced_p != NULL)
        *forced_p = forced;
    if (n % MACO_GEMM_TILE_N_WIDE != 0 || strcmp(want, "128") == 0)
        return MACO_GEMM_TILE_N;
    if (strcmp(want, "256") == 0)
        return MACO_GEMM_TILE_N_WIDE;
    uint64_t wide =
        (((uint64_t)m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M) * (n / MACO_GEMM_TILE_N_WIDE);
    return wide >= units ? MACO_GEMM_TILE_N_WIDE : MACO_GEMM_TILE_N;
}

maco_status_t maco_gemm_plan_tiles(uint32_t m, uint32_t n, int workers, maco_gemm_tile_t *tiles,
                                   size_t *ntiles_p)
{
    const char *fn = "maco_gemm_plan_tiles";
    if (ntiles_p == NULL || m == 0 || n == 0 || n % MACO_GEMM_TILE_N != 0 || workers < 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m = %u, n = %u, workers = %d, ntiles_p %p: m >= 1, n a non-zero "
                           "multiple of %d, workers >= 1",
                           fn, m, n, workers, (void *)ntiles_p, MACO_GEMM_TILE_N);
    /* A partial last row of tiles counts as a row (the GEMM tiles store only its rows < m). */
    const uint32_t rows = (uint32_t)(((uint64_t)m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M);
    const uint32_t W = (uint32_t)workers;
    int forced = 0;
    const uint32_t tn = maco__gemm_tile_width(m, n, W, &forced);
    const uint32_t cols = n / tn;
    uint32_t group = (W + cols - 1) / cols;
    group = group < 1 ? 1 : group > rows ? rows : group;
    /* Counting only is closed form (rows x cols), whatever m and n: the grid is walked only to
     * fill `tiles`, which the caller sized for it. */
    size_t at =
        tiles == NULL ? (size_t)rows * cols : maco__gemm_plan_grid(rows, cols, tn, group, tiles, 0);
    if (tn == MACO_GEMM_TILE_N_WIDE && !forced) {
        /* The last round's wide tiles, each as two narrow ones at the end. */
        size_t tail = at % W;
        if (tail != 0 && 2 * tail <= W) {
            size_t first = at - tail;
            if (tiles != NULL) {
                for (size_t i = tail; i-- > 0;) { /* back to front: the halves land later */
                    maco_gemm_tile_t t = tiles[first + i];
                    tiles[first + 2 * i] =
                        (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col, MACO_GEMM_TILE_N };
                    tiles[first + 2 * i + 1] =
                        (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col + 1, MACO_GEMM_TILE_N };
                }
            }
            at += tail;
        }
    }
    *ntiles_p = at;
    return MACO_OK;
}

/*
 * gemm_tiles.c - how the GEMM of C = A B is cut into tiles for the persistent kernel's workers:
 * the tile width (128 or 256 columns; MACO_GEMM_TILE_WIDTH), the narrow last round, split-K
 * where C has fewer tiles than workers, and the order of the tiles (maco_gemm_plan and
 * maco_gemm_plan_tiles, maco/persistent.h; the model: docs/persistent.md, "Planning a GEMM").
 * Needs no GPU.
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

/* ---------------------------------------------------------------- per-shape planning */

/* The model's time of one GEMM task of width tn over `kk` elements of K (steps of 64). */
static uint64_t maco__gemm_task_steps(uint32_t tn, uint32_t kk)
{
    return ((uint64_t)kk + 63) / 64 * (tn / MACO_GEMM_TILE_N) + MACO_GEMM_PLAN_TASK_STEPS;
}

/* Tasks at most for which the model schedules task by task; beyond, rounds of the longest. */
enum { MACO__GEMM_PLAN_SIMULATE_MAX = 1 << 22 };

/* The makespan of n1 tasks of time t1 then n2 of time t2, each taken by the worker that is free
 * first (the workers pop their queues in the order the tasks were added), on W workers. */
static uint64_t maco__gemm_makespan(uint64_t n1, uint64_t t1, uint64_t n2, uint64_t t2, uint32_t W)
{
    uint64_t n = n1 + n2;
    if (n == 0)
        return 0;
    if (n > MACO__GEMM_PLAN_SIMULATE_MAX) {
        uint64_t tmax = t1 > t2 ? t1 : t2;
        return (n + W - 1) / W * tmax;
    }
    /* A binary min-heap of the workers' free times (at most n of them matter). */
    uint32_t w = n < W ? (uint32_t)n : W;
    uint64_t *heap = calloc(w, sizeof(uint64_t));
    if (heap == NULL) {
        uint64_t tmax = t1 > t2 ? t1 : t2;
        return (n + W - 1) / W * tmax;
    }
    uint64_t span = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t end = heap[0] + (i < n1 ? t1 : t2);
        span = end > span ? end : span;
        /* The root (the worker free first) takes the task: its new free time sifts down. */
        uint32_t at = 0;
        for (;;) {
            uint32_t l = 2 * at + 1, r = l + 1, c = at;
            uint64_t cv = end;
            if (l < w && heap[l] < cv) {
                c = l;
                cv = heap[l];
            }
            if (r < w && heap[r] < cv)
                c = r;
            if (c == at)
                break;
            heap[at] = heap[c];
            at = c;
        }
        heap[at] = end;
    }
    free(heap);
    return span;
}

/* The plan (see maco_gemm_plan) with the width given: tn, `forced` when MACO_GEMM_TILE_WIDTH
 * chose it (no narrow tail then). Fills `tiles` when not NULL; the model's cost (and so a
 * split) only when `cost`. */
static void maco__gemm_plan_core(uint32_t m, uint32_t n, uint32_t k, uint32_t W, uint64_t l2_bytes,
                                 uint32_t max_split, uint32_t tn, int forced, int want_cost,
                                 maco_gemm_plan_t *p, maco_gemm_tile_t *tiles)
{
    memset(p, 0, sizeof(*p));
    const uint32_t rows = (uint32_t)(((uint64_t)m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M);
    const uint32_t cols = n / tn;
    const uint64_t T = (uint64_t)rows * cols;
    uint32_t group = (W + cols - 1) / cols;
    group = group < 1 ? 1 : group > rows ? rows : group;
    /* Raised to as many rows of A as fit half of L2 (A then stays while the group sweeps B). */
    const uint64_t fit = l2_bytes / 2 / ((uint64_t)MACO_GEMM_TILE_M * k * 2);
    if (fit > group)
        group = fit < rows ? (uint32_t)fit : rows;
    if (tiles != NULL)
        maco__gemm_plan_grid(rows, cols, tn, group, tiles, 0);
    /* The last round of wide tiles as narrow ones (the shape's rule: maco_gemm_plan_tiles). */
    uint64_t tail = 0;
    if (tn == MACO_GEMM_TILE_N_WIDE && !forced) {
        uint64_t left = T % W;
        if (left != 0 && 2 * left <= W)
            tail = left;
    }
    if (tiles != NULL && tail > 0) {
        size_t first = (size_t)(T - tail);
        for (size_t i = (size_t)tail; i-- > 0;) { /* back to front: the halves land later */
            maco_gemm_tile_t t = tiles[first + i];
            tiles[first + 2 * i] =
                (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col, MACO_GEMM_TILE_N };
            tiles[first + 2 * i + 1] =
                (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col + 1, MACO_GEMM_TILE_N };
        }
    }
    /* Split-K where C has fewer tiles than workers: the s of least cost. */
    uint32_t best_s = 1;
    uint64_t best = !want_cost
                        ? 0
                        : maco__gemm_makespan(T - tail, maco__gemm_task_steps(tn, k), 2 * tail,
                                              maco__gemm_task_steps(MACO_GEMM_TILE_N, k), W);
    const uint32_t smax =
        max_split < MACO_GEMM_PLAN_MAX_SPLIT ? max_split : MACO_GEMM_PLAN_MAX_SPLIT;
    for (uint32_t s = 2; want_cost && T < W && tail == 0 && s <= smax; s++) {
        if (k % s != 0 || (k / s) % 64 != 0 || k / s < MACO_GEMM_PLAN_MIN_SLICE)
            continue;
        uint64_t cost = maco__gemm_makespan(T * s, maco__gemm_task_steps(tn, k / s), 0, 0, W) +
                        (T + W - 1) / W * (uint64_t)(s + 1) * (tn / MACO_GEMM_TILE_N);
        if (cost < best) {
            best = cost;
            best_s = s;
        }
    }
    p->tile_n = tn;
    p->split_k = best_s;
    p->k_slice = k / best_s;
    p->group = group;
    p->tail_narrow = (uint32_t)tail;
    p->tiles = T + tail;
    p->tasks = p->tiles * best_s;
    p->waves = (uint32_t)((p->tasks + W - 1) / W);
    p->last_wave_tasks = (uint32_t)(p->tasks - (uint64_t)(p->waves - 1) * W);
    p->cost = best;
    p->b_bytes = (uint64_t)((rows + group - 1) / group) * k * n * 2;
}

maco_status_t maco_gemm_plan(uint32_t m, uint32_t n, uint32_t k, int workers, uint64_t l2_bytes,
                             uint32_t max_split_k, maco_gemm_plan_t *plan_p,
                             maco_gemm_tile_t *tiles, size_t *ntiles_p)
{
    if (plan_p == NULL || m == 0 || n == 0 || n % MACO_GEMM_TILE_N != 0 || k == 0 ||
        k % MACO_GEMM_TILE_K != 0 || workers < 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_gemm_plan: m = %u, n = %u, k = %u, workers = %d, plan_p %p: m "
                           ">= 1, n a non-zero multiple of %d, k of %d, workers >= 1",
                           m, n, k, workers, (void *)plan_p, MACO_GEMM_TILE_N, MACO_GEMM_TILE_K);
    int forced = 0;
    const uint32_t tn = maco__gemm_tile_width(m, n, (uint32_t)workers, &forced);
    maco_gemm_plan_t p;
    maco__gemm_plan_core(m, n, k, (uint32_t)workers, l2_bytes, max_split_k, tn, forced, 1, &p,
                         tiles);
    *plan_p = p;
    if (ntiles_p != NULL)
        *ntiles_p = (size_t)p.tiles;
    return MACO_OK;
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
    /* A partial last row of tiles counts as a row (the GEMM tiles store only its rows < m).
     * No split, no L2 raise: k plays no part. Counting only is closed form (rows x columns, and
     * the tail), whatever m and n: the grid is walked only to fill `tiles`, which the caller
     * sized for it. */
    int forced = 0;
    const uint32_t tn = maco__gemm_tile_width(m, n, (uint32_t)workers, &forced);
    maco_gemm_plan_t p;
    maco__gemm_plan_core(m, n, MACO_GEMM_TILE_K, (uint32_t)workers, 0, 1, tn, forced, 0, &p, tiles);
    *ntiles_p = (size_t)p.tiles;
    return MACO_OK;
}

/* test_kernels.h - GPU kernels of the tests, behind C launchers (STYLE.md rule 8). */
#ifndef MACO_TEST_KERNELS_H
#define MACO_TEST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "maco/device/memory_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Byte i of the pattern for `seed` (the same function on host and device). */
static inline uint8_t test_pattern_byte(uint64_t seed, uint64_t i)
{
    uint64_t x = (seed ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return (uint8_t)((x >> 29) ^ (x >> 47));
}

cudaError_t test_fill_pattern(char *dst, size_t bytes, uint64_t seed, cudaStream_t stream);

/**
 * One CTA per peer q != rank (grid = nranks): puts local[src_off, +bytes) into q's buffer
 * at dst_off through handles[q], signals q, waits for q's signal. status[q] gets the wait's
 * maco_status_t.
 */
cudaError_t test_put_all(const maco_memory_channel_device_t *handles, int nranks, int rank,
                         uint64_t src_off, uint64_t dst_off, uint64_t bytes, int *status,
                         cudaStream_t stream);

/**
 * One thread: `iters` rounds of signal-then-wait (initiator) or wait-then-signal.
 * *status gets MACO_OK or the first failing wait's status.
 */
cudaError_t test_ping_pong(const maco_memory_channel_device_t *handle, int iters, int initiator,
                           int *status, cudaStream_t stream);

/** One thread waits once on the channel; *status gets the result. */
cudaError_t test_wait_once(const maco_memory_channel_device_t *handle, int *status,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_TEST_KERNELS_H */

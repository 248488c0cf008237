/* test_kernels.h - GPU kernels of the tests, behind C launchers (small C launchers). */
#ifndef MACO_TEST_KERNELS_H
#define MACO_TEST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "maco/device/memory_channel.h"
#include "maco/device/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Byte i of the pattern for `seed` (the same function on host and device). */
#if defined(__CUDACC__)
__host__ __device__
#endif
    static inline uint8_t
    test_pattern_byte(uint64_t seed, uint64_t i)
{
    uint64_t x = (seed ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return (uint8_t)((x >> 29) ^ (x >> 47));
}

/** The 64-bit value rank `from` sends rank `to` in cell k of test_port_small_puts. */
#if defined(__CUDACC__)
__host__ __device__
#endif
    static inline uint64_t
    test_small_value(uint64_t seed, int from, int to, int k)
{
    uint64_t x = seed ^ ((uint64_t)from * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)to << 40) ^
                 ((uint64_t)k * 0xD6E8FEB86659FD93ull);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 29);
}

cudaError_t test_fill_pattern(char *dst, size_t bytes, uint64_t seed, cudaStream_t stream);

/**
 * The reduction the collectives compute, on the host with the kernels' own arithmetic
 * (reduce.cuh): for each of `count` elements, the values of in[0..n) (host buffers of
 * `datatype`) widened to the type's accumulator, combined with `op` in rank order 0..n-1,
 * divided by n for MACO_AVG, converted once. Writes out[0..count). Returns 0, or -1 for a
 * type or op it does not know.
 */
int test_reference_fold(int datatype, int op, const void *const *in, int n, size_t count,
                        void *out);

/** Stores v as one element of `datatype` at p (floats rounded to nearest; integers: v * 50
 * truncated). */
void test_store_value(int datatype, double v, void *p);

/**
 * Adds to *mismatches the number of bytes of [p, p+bytes) that differ from
 * test_pattern_byte(seed, pattern_offset + i).
 */
cudaError_t test_count_pattern_mismatch(const char *p, size_t bytes, uint64_t seed,
                                        uint64_t pattern_offset, unsigned long long *mismatches,
                                        cudaStream_t stream);

/**
 * Checks a destination slot on the GPU: bytes [0, skew) and [skew+size, slot_bytes) must
 * still hold the poison 0xAB, bytes [skew, skew+size) test_pattern_byte(seed, offset + i).
 * Returns the number of wrong bytes (synchronous; ~0 when a CUDA call failed).
 * `counter` is a device unsigned long long the call may overwrite.
 */
unsigned long long test_count_wrong_slot(const char *slot, size_t slot_bytes, size_t skew,
                                         size_t size, uint64_t seed, uint64_t offset,
                                         unsigned long long *counter);

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

/**
 * One CTA per peer q != rank: gets q's buffer [src_off + q * slot, +bytes) into the local
 * buffer at dst_off + q * slot through handles[q].
 */
cudaError_t test_get_all(const maco_memory_channel_device_t *handles, int nranks, int rank,
                         uint64_t src_off, uint64_t dst_off, uint64_t slot, uint64_t bytes,
                         cudaStream_t stream);

/**
 * LL packet round trip with every peer, one CTA per peer q != rank: put `bytes` bytes of the
 * local buffer at src_off as packets with `flag` into q's buffer at
 * pkt_off + ((flag & 1) * nranks + rank) * pkt_slot, then unpack the packets q sent here
 * (from pkt_off + ((flag & 1) * nranks + q) * pkt_slot) into out_off + q * out_slot.
 * ll8 selects LL8 (else LL16). status[q] gets the unpack's status (CTA-wide OR of errors).
 */
cudaError_t test_packets_round_trip(const maco_memory_channel_device_t *handles, int nranks,
                                    int rank, uint64_t src_off, uint64_t pkt_off, uint64_t pkt_slot,
                                    uint64_t out_off, uint64_t out_slot, uint64_t bytes,
                                    uint32_t flag, int ll8, int *status, cudaStream_t stream);

/**
 * `nblocks` CTAs, `iters` rounds: each CTA writes (round, block) into its slot of `slots`,
 * crosses maco_grid_barrier, checks every CTA's slot holds this round, crosses it again.
 * *errors counts wrong slots seen; *status the first barrier failure.
 */
cudaError_t test_grid_barrier(void *barrier, uint32_t *slots, int nblocks, int iters,
                              const maco_device_wait_bound_t *bound, unsigned long long *errors,
                              int *status, cudaStream_t stream);

/**
 * `nblocks` CTAs use a device semaphore set to 1 as a mutex: each CTA, `iters` times,
 * acquires, increments *counter non-atomically (read, add, write), releases. *counter ends at
 * nblocks * iters only with mutual exclusion and release/acquire ordering.
 */
cudaError_t test_device_semaphore(void *sem, unsigned long long *counter, int nblocks, int iters,
                                  const maco_device_wait_bound_t *bound, int *status,
                                  cudaStream_t stream);

/**
 * Port channels, one CTA per peer q != rank, thread 0: put_with_signal of `bytes` bytes from
 * src_off to dst_off through handles[q] (or, with `flush_only`, a put and a flush and no
 * signal), then (unless flush_only) wait for q's signal. status[q] gets the result.
 */
cudaError_t test_port_put_all(const maco_port_channel_device_t *handles, int nranks, int rank,
                              uint64_t src_off, uint64_t dst_off, uint64_t bytes, int flush_only,
                              int *status, cudaStream_t stream);

/**
 * `nblocks` CTAs each put their 1/nblocks share of [base, base+bytes) to every peer; the last
 * CTA to finish (an atomic counter, *done zeroed by the caller) then signals every peer, and
 * CTA 0's thread q waits for peer q's signal. status[q] gets each wait's result.
 */
cudaError_t test_port_many_ctas(const maco_port_channel_device_t *handles, int nranks, int rank,
                                uint64_t base, uint64_t bytes, int nblocks, unsigned *done,
                                int *status, cudaStream_t stream);

/**
 * One thread: up to `iters` rounds of put + flush through `handle`; stops at the first
 * error, which *status gets (MACO_OK when all rounds completed); *rounds counts completed
 * rounds.
 */
cudaError_t test_port_flush_loop(const maco_port_channel_device_t *handle, int iters,
                                 uint64_t bytes, int *status, int *rounds, cudaStream_t stream);

/** One thread pushes `pushes` puts of 64 bytes (offsets 0) and no flush; *status: the first
 * failure (MACO_ERR_REMOTE once the ring is full and the proxy stopped), else MACO_OK. */
cudaError_t test_port_push_only(const maco_port_channel_device_t *handle, int pushes, int *status,
                                cudaStream_t stream);

/**
 * The single-element and polling calls of memory channels, one CTA per peer q != rank,
 * thread 0: write a u64 and a u32 at rank * 16 of q's buffer and read them back through the
 * channel, signal, poll until q's signal arrives, check q's values at q * 16 of the local
 * buffer, then a relaxed signal/wait pair. status[q]: MACO_OK, MACO_ERR_INTERNAL for a wrong
 * value, or a wait's error.
 */
cudaError_t test_channel_element_ops(const maco_memory_channel_device_t *handles, int nranks,
                                     int rank, int *status, cudaStream_t stream);

/**
 * Port channels, one CTA per peer q != rank, thread 0: put_with_signal_and_flush of `bytes`
 * bytes from src_off to dst_off, then poll until q's signal arrives. status[q] gets the result.
 */
cudaError_t test_port_flush_and_poll(const maco_port_channel_device_t *handles, int nranks,
                                     int rank, uint64_t src_off, uint64_t dst_off, uint64_t bytes,
                                     int *status, cudaStream_t stream);

/**
 * Port channels in a ring, one CTA of 512 threads per rank, `rounds` rounds: every thread
 * writes its share of a fresh pattern (seed + 64 * round + rank) into this rank's slot of
 * `buf`; thread 0 pushes it to the next rank's buffer (same offset) as a put_with_signal, a
 * put and a signal, or four puts and a signal (round % 3), then waits for the previous
 * rank's signal; every thread checks the previous rank's slot, thread 0 acknowledges with a
 * signal and waits for the next rank's acknowledgement before the source is written again.
 * Adds wrong bytes to *wrong; *status gets the first failure or MACO_OK.
 */
cudaError_t test_port_write_put_rounds(const maco_port_channel_device_t *handles, int nranks,
                                       int rank, char *buf, uint64_t slot, uint64_t bytes,
                                       int rounds, uint64_t seed, unsigned long long *wrong,
                                       int *status, cudaStream_t stream);

/* Cells of test_port_small_puts: TEST_SMALL_CELLS cells of 16 bytes, then the final 8-byte
 * put_with_signal, then (at TEST_SMALL_SCRATCH) sources of inline values, in a region of
 * TEST_SMALL_REGION bytes. */
#define TEST_SMALL_CELLS 28
#define TEST_SMALL_SCRATCH 512
#define TEST_SMALL_REGION 1024

/** Byte b (0..15) of the 16-byte pattern cell k of test_port_small_puts copies. */
#if defined(__CUDACC__)
__host__ __device__
#endif
    static inline uint8_t
    test_small_pattern(uint64_t seed, int from, int to, int k, int b)
{
    uint64_t w = test_small_value(seed, from, to, 1000 + k);
    return (uint8_t)((w >> (8 * (b & 7))) ^ (b >= 8 ? 0x5Au : 0u));
}

/**
 * Small port-channel puts, one CTA per peer q != rank, thread 0. Rank r's region for q is at
 * r * slot + q * TEST_SMALL_REGION in both buffers (source here, destination at q). Cell k
 * (16 bytes at region + 16 k) and v = test_small_value(seed, r, q, k), by k % 7:
 *   0  8 bytes of v at +0            (inline)
 *   1  the low 4 bytes of v at +4    (inline)
 *   2  8 bytes of v at +1            (misaligned: copied)
 *   3  the low 4 bytes of v at +8    (inline)
 *   4  the 16-byte pattern copied to +0, then v put over its first 8 bytes from the scratch
 *      source at TEST_SMALL_SCRATCH + 8 k (order: copy, then inline value)
 *   5  v put at +0 from the scratch source, then the pattern copied over the 16 bytes
 *   6  8 bytes of v from source +8 to destination +4 (destination not 8-aligned: copied)
 * Thread 0 writes each source just before its put; with `clobber`, it overwrites the source
 * of every 4- or 8-byte put whose offsets allow the inline path right after the call (which
 * only an inline put tolerates). Then an 8-byte put_with_signal of test_small_value(seed, r,
 * q, TEST_SMALL_CELLS) at 16 * TEST_SMALL_CELLS, and a wait for q's signal. status[q] gets
 * the result.
 */
cudaError_t test_port_small_puts(const maco_port_channel_device_t *handles, int nranks, int rank,
                                 char *buf, uint64_t slot, uint64_t seed, int clobber, int *status,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_TEST_KERNELS_H */

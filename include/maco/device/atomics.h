/*
 * maco/device/atomics.h - the memory operations MACO's device code synchronises with.
 *
 * Each is one PTX instruction with an explicit ordering and scope (PTX ISA, "Memory
 * Consistency Model"). Scopes: `sys` orders against other GPUs and the CPU (memory mapped
 * from a peer over NVLink/PCIe, host-mapped memory); `gpu` orders against other CTAs of
 * this GPU only. Pointers are generic addresses of global memory, naturally aligned.
 *
 * Header-only; depends on nothing but CUDA. Callable from device code only.
 */
#ifndef MACO_DEVICE_ATOMICS_H
#define MACO_DEVICE_ATOMICS_H

#include <stdint.h>

#if defined(__CUDACC__)

/* Acquire load, system scope: later reads of this thread see everything the releasing
 * writer (any GPU or CPU) wrote before its matching release. */
static __device__ __forceinline__ uint64_t maco_load_acquire_sys_u64(const uint64_t *p);

/* Relaxed load, system scope: a coherent read with no ordering of other accesses. */
static __device__ __forceinline__ uint64_t maco_load_relaxed_sys_u64(const uint64_t *p);

/* Acquire load, GPU scope (32-bit): pairs with a gpu-scope release on this GPU. */
static __device__ __forceinline__ uint32_t maco_load_acquire_gpu_u32(const uint32_t *p);

/* Acquire load, GPU scope (64-bit): pairs with a gpu-scope release of another CTA of this
 * GPU (counters only this GPU's CTAs write, e.g. the persistent kernel's queues). */
static __device__ __forceinline__ uint64_t maco_load_acquire_gpu_u64(const uint64_t *p);

/* Relaxed load, GPU scope (64-bit): a coherent read with no ordering of other accesses. */
static __device__ __forceinline__ uint64_t maco_load_relaxed_gpu_u64(const uint64_t *p);

/* Release store, GPU scope (64-bit): this thread's earlier writes (and those it observed)
 * are visible to a thread of this GPU that acquires the value. */
static __device__ __forceinline__ void maco_store_release_gpu_u64(uint64_t *p, uint64_t v);

/* Relaxed fetch-add, GPU scope (64-bit): returns the old value, orders nothing else (a ticket). */
static __device__ __forceinline__ uint64_t maco_fetch_add_relaxed_gpu_u64(uint64_t *p, uint64_t v);

/* Acquire-release fetch-add, GPU scope (64-bit): returns the old value; the last of several
 * arrivals sees what every earlier one wrote before its add (dependency counters). */
static __device__ __forceinline__ uint64_t maco_fetch_add_acq_rel_gpu_u64(uint64_t *p, uint64_t v);

/* Release add, system scope, no return value: every earlier write of this thread (and,
 * by cumulativity, writes it observed, e.g. other threads' writes ordered before a
 * __syncthreads() that preceded this call) is visible to a thread that acquires the
 * new value. This is the semaphore signal. */
static __device__ __forceinline__ void maco_red_add_release_sys_u64(uint64_t *p, uint64_t v);

/* Relaxed add, system scope: increments atomically but orders nothing else. */
static __device__ __forceinline__ void maco_red_add_relaxed_sys_u64(uint64_t *p, uint64_t v);

/* Release store, system scope (32-bit). */
static __device__ __forceinline__ void maco_store_release_sys_u32(uint32_t *p, uint32_t v);

/* Acquire-release fetch-add, GPU scope (32-bit): the grid barrier's arrival. */
static __device__ __forceinline__ uint32_t maco_fetch_add_acq_rel_gpu_u32(uint32_t *p, uint32_t v);

/* Nanoseconds from the GPU's global timer (%globaltimer; resolution about 1 us on
 * Hopper). Used only to bound waits, never for measurements. */
static __device__ __forceinline__ uint64_t maco_globaltimer_ns(void);

#include "maco/device/impl/atomics.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_ATOMICS_H */

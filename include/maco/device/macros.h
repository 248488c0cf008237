/*
 * maco/device/macros.h - what every device header needs to be read by C, C++ and nvcc alike:
 *   MACO_HOST_DEVICE              __host__ __device__ under nvcc, nothing elsewhere, for the
 *                                 small helpers both sides call (trigger builders)
 *   MACO_STATIC_ASSERT(cond, msg) static_assert in C++, _Static_assert in C11: the layout
 *                                 checks of every struct the host fills and the GPU reads
 *   MACO_ALIGNOF(type)            alignof in C++, _Alignof in C11
 */
#ifndef MACO_DEVICE_MACROS_H
#define MACO_DEVICE_MACROS_H

#if defined(__CUDACC__)
#define MACO_HOST_DEVICE __host__ __device__
#else
#define MACO_HOST_DEVICE
#endif

#ifdef __cplusplus
#define MACO_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define MACO_ALIGNOF(type) alignof(type)
#else
#define MACO_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define MACO_ALIGNOF(type) _Alignof(type)
#endif

#endif /* MACO_DEVICE_MACROS_H */

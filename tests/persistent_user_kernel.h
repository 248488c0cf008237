/* persistent_user_kernel.h - the C launcher of persistent_user_kernel.cu (a user task type). */
#ifndef MACO_TEST_PERSISTENT_USER_KERNEL_H
#define MACO_TEST_PERSISTENT_USER_KERNEL_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The user task type of the test kernel: out[i] = a[i] * a[i] + alpha, count floats. */
enum { TEST_TASK_SQUARE = 256 + 1 };

/* Launches the test's persistent kernel over `view` (a maco_pk_view_t from
 * maco_persistent_kernel_get_launch). */
cudaError_t test_launch_user_persistent(const void *view, int grid, int block, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_TEST_PERSISTENT_USER_KERNEL_H */

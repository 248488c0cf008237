/*
 * persistent_user_kernel.cu - a user task type, the way maco/device/persistent.h documents it:
 * a kernel of the user's own around maco_pk_run with a function for types >= MACO_PK_USER,
 * launched with the grid, block and view of maco_persistent_kernel_get_launch().
 */
#include "maco/device/persistent.h"
#include "persistent_user_kernel.h"

/* out[i] = a[i] * a[i] + alpha over `count` floats (type TEST_TASK_SQUARE). */
static __device__ maco_status_t test_user_task(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                               uint32_t task)
{
    if (t->type != TEST_TASK_SQUARE)
        return MACO_ERR_INVALID_ARGUMENT;
    float *out = (float *)t->ptr[0];
    const float *a = (const float *)t->ptr[1];
    for (uint64_t i = threadIdx.x; i < t->count; i += blockDim.x)
        out[i] = __fmaf_rn(a[i], a[i], t->alpha);
    return MACO_OK;
}

__global__ void test_user_persistent_kernel(maco_pk_view_t view)
{
    maco_pk_run(&view, test_user_task);
}

extern "C" cudaError_t test_launch_user_persistent(const void *view, int grid, int block,
                                                   cudaStream_t stream)
{
    test_user_persistent_kernel<<<grid, block, 0, stream>>>(*(const maco_pk_view_t *)view);
    return cudaGetLastError();
}

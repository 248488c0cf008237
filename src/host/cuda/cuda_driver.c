/* cuda_driver.c - see cuda_driver.h. */
#include "src/host/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "maco/comm.h"

static maco__cu_table_t maco__cu_table;
static pthread_once_t maco__cu_once = PTHREAD_ONCE_INIT;

/* The driver's entry point `name` (CUDA 12.0 ABI), or NULL with the runtime's error cleared. */
static void *maco__cu_entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        return fn;
    cudaGetLastError();
    return NULL;
}

#define MACO__CU_LOAD(name, type) maco__cu_table.name = (type)maco__cu_entry(#name);

static void maco__cu_load(void)
{
    MACO_CU_SYMBOLS(MACO__CU_LOAD)
}

#undef MACO__CU_LOAD

const maco__cu_table_t *maco__cu(void)
{
    pthread_once(&maco__cu_once, maco__cu_load);
    return &maco__cu_table;
}

int maco_cuda_device_count(char *why, size_t why_bytes)
{
    char local[8];
    if (why == NULL || why_bytes == 0) {
        why = local;
        why_bytes = sizeof(local);
    }
    why[0] = '\0';
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaSuccess && n > 0)
        return n;
    cudaGetLastError();
    /* The runtime says "driver version is insufficient" also when there is no driver at all;
     * ask the driver library itself what is true. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    /* Each text names the cause, then what to do about it. */
    if (lib == NULL) {
        const char *dl = dlerror();
        snprintf(why, why_bytes,
                 "no NVIDIA driver: libcuda.so.1 is not installed or not on the loader path (%s); "
                 "install the NVIDIA driver (nvidia-smi then lists the GPUs), or in a container "
                 "start it with the GPUs (docker run --gpus all)",
                 dl != NULL ? dl : "dlopen failed");
        return 0;
    }
    int driver = 0;
    int (*get_version)(int *) = (int (*)(int *))dlsym(lib, "cuDriverGetVersion");
    if (get_version == NULL || get_version(&driver) != 0)
        driver = 0;
    dlclose(lib);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (driver > 0 && driver < CUDART_VERSION)
        snprintf(why, why_bytes,
                 "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime MACO "
                 "was built with: update the driver to one for CUDA %d.%d or newer",
                 driver / 1000, (driver % 1000) / 10, CUDART_VERSION / 1000,
                 (CUDART_VERSION % 1000) / 10, CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    else if ((err == cudaSuccess || err == cudaErrorNoDevice) && visible != NULL)
        snprintf(why, why_bytes,
                 "no CUDA device is visible (driver CUDA %d.%d, CUDA_VISIBLE_DEVICES='%s'); "
                 "unset CUDA_VISIBLE_DEVICES or name devices that nvidia-smi -L lists",
                 driver / 1000, (driver % 1000) / 10, visible);
    else if (err == cudaSuccess || err == cudaErrorNoDevice)
        snprintf(why, why_bytes,
                 "no CUDA device is visible (driver CUDA %d.%d); check nvidia-smi -L: the driver "
                 "is loaded but lists no GPU (in a container: docker run --gpus all)",
                 driver / 1000, (driver % 1000) / 10);
    else
        snprintf(why, why_bytes,
                 "the CUDA runtime found no usable device: %s (driver CUDA %d.%d); nvidia-smi "
                 "shows whether the GPUs are in an error state or held exclusively by another "
                 "process",
                 cudaGetErrorString(err), driver / 1000, (driver % 1000) / 10);
    return 0;
}

const char *maco__cu_error_text(CUresult res, char *buf, size_t cap)
{
    const char *text = NULL;
    if (maco__cu()->cuGetErrorString != NULL)
        maco__cu()->cuGetErrorString(res, &text);
    snprintf(buf, cap, "CUresult %d (%s)", (int)res, text != NULL ? text : "no text");
    return buf;
}

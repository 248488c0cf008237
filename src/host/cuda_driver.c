/* cuda_driver.c - see cuda_driver.h. */
#include "cuda_driver.h"

#include <pthread.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

static maco__cu_table_t maco__cu_table;
static pthread_once_t maco__cu_once = PTHREAD_ONCE_INIT;

static void maco__cu_load(void)
{
    enum cudaDriverEntryPointQueryResult q;
    void *fn;
#define MACO__CU_LOAD(name, type)                                                                  \
    fn = NULL;                                                                                     \
    if (cudaGetDriverEntryPointByVersion(#name, &fn, 12000, cudaEnableDefault, &q) ==              \
            cudaSuccess &&                                                                         \
        q == cudaDriverEntryPointSuccess)                                                          \
        maco__cu_table.name = (type)fn;                                                            \
    else                                                                                           \
        cudaGetLastError();
    MACO_CU_SYMBOLS(MACO__CU_LOAD)
#undef MACO__CU_LOAD
}

const maco__cu_table_t *maco__cu(void)
{
    pthread_once(&maco__cu_once, maco__cu_load);
    return &maco__cu_table;
}

const char *maco__cu_error_text(CUresult res, char *buf, size_t cap)
{
    const char *text = NULL;
    if (maco__cu()->cuGetErrorString != NULL)
        maco__cu()->cuGetErrorString(res, &text);
    snprintf(buf, cap, "CUresult %d (%s)", (int)res, text != NULL ? text : "no text");
    return buf;
}

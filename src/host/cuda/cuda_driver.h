/*
 * cuda_driver.h - the CUDA driver entry points MACO uses, without linking libcuda.so.
 *
 * One X-macro table names each symbol and its prototype (cudaTypedefs.h); the pointers are
 * filled once through cudaGetDriverEntryPointByVersion(), so libmaco.so loads on machines
 * with no driver at all (docs/design.md, rules). A missing symbol leaves its pointer NULL; callers
 * go through maco__cu() which reports that as MACO_ERR_CUDA.
 */
#ifndef MACO_CUDA_DRIVER_H
#define MACO_CUDA_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO_CU_SYMBOLS(X)                                                                         \
    X(cuGetErrorString, PFN_cuGetErrorString_v6000)                                                \
    X(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                                      \
    X(cuMemGetAddressRange, PFN_cuMemGetAddressRange_v3020)                                        \
    X(cuMemCreate, PFN_cuMemCreate_v10020)                                                         \
    X(cuMemRelease, PFN_cuMemRelease_v10020)                                                       \
    X(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020)                                         \
    X(cuMemAddressFree, PFN_cuMemAddressFree_v10020)                                               \
    X(cuMemMap, PFN_cuMemMap_v10020)                                                               \
    X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                                           \
    X(cuMemSetAccess, PFN_cuMemSetAccess_v10020)                                                   \
    X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020)                     \
    X(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020)                       \
    X(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020)                   \
    X(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)                         \
    X(cuMemGetAllocationPropertiesFromHandle, PFN_cuMemGetAllocationPropertiesFromHandle_v10020)   \
    X(cuStreamWriteValue64, PFN_cuStreamWriteValue64_v11070)                                       \
    X(cuStreamBatchMemOp, PFN_cuStreamBatchMemOp_v11070)                                           \
    X(cuMemcpyDtoDAsync, PFN_cuMemcpyDtoDAsync_v3020)                                              \
    X(cuMemGetHandleForAddressRange, PFN_cuMemGetHandleForAddressRange_v11070)

typedef struct maco__cu_table {
#define MACO__CU_FIELD(name, type) type name;
    MACO_CU_SYMBOLS(MACO__CU_FIELD)
#undef MACO__CU_FIELD
} maco__cu_table_t;

/** The table, loaded on first use (thread-safe). Never NULL; entries may be NULL. */
const maco__cu_table_t *maco__cu(void);

/** "CUDA_ERROR_INVALID_VALUE: invalid argument" style text of a CUresult. */
const char *maco__cu_error_text(CUresult res, char *buf, size_t cap);

/*
 * Calls driver function `name` with the arguments that follow; on a missing symbol or a
 * failure records MACO_ERR_CUDA with `what` and the driver's error text in `st` and jumps to
 * `label`.
 */
#define MACO_CU_GOTO(st, label, what, name, ...)                                                   \
    do {                                                                                           \
        if (maco__cu()->name == NULL) {                                                            \
            (st) = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,                                     \
                               "%s: the CUDA driver does not provide " #name, (what));             \
            goto label;                                                                            \
        }                                                                                          \
        CUresult maco__res = maco__cu()->name(__VA_ARGS__);                                        \
        if (maco__res != CUDA_SUCCESS) {                                                           \
            char maco__txt[160];                                                                   \
            (st) = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM, "%s: " #name " failed: %s", (what), \
                               maco__cu_error_text(maco__res, maco__txt, 160));                    \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MACO_CUDA_DRIVER_H */

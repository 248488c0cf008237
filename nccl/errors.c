/* errors.c - status mapping, the per-thread last error, a communicator's peer failure
 * (maco_nccl__comm_note), call counters, ncclGetVersion and ncclGetErrorString (shim.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "maco_nccl.h"
#include "shim.h"

/* The ABI this library implements: nccl.h of NCCL 2.32.6. Sizes and offsets an application
 * compiled against that header, or against 2.28.9's (whose structs are prefixes of these:
 * NCCL only appends), relies on. */
_Static_assert(NCCL_VERSION_CODE == 23206, "built against nccl.h of NCCL 2.32.6");
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(sizeof(ncclUniqueId) == sizeof(maco_unique_id_t), "a MACO id fits an NCCL id");
_Static_assert(sizeof(ncclConfig_t) == 120, "ncclConfig_t of 2.32: 120 bytes");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t.blocking");
_Static_assert(offsetof(ncclConfig_t, netName) == 32, "ncclConfig_t.netName");
_Static_assert(offsetof(ncclConfig_t, commName) == 48, "ncclConfig_t.commName");
_Static_assert(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "ncclConfig_t.nvlink...");
_Static_assert(offsetof(ncclConfig_t, graphUsageMode) == 80, "2.28.9's 80 bytes come first");
_Static_assert(sizeof(ncclSimInfo_t) == 24, "ncclSimInfo_t of 2.22+: 24 bytes");
_Static_assert(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4, "enum sizes");
_Static_assert(ncclNumTypes == 12 && ncclNumOps == 5, "the data types and ops of 2.28.9");
_Static_assert(ncclInProgress == 7 && ncclTimeout == 8, "ncclTimeout (2.30) follows 2.28.9's");

static _Thread_local char maco_nccl__error_text[1024];

static const char *const maco_nccl__call_names[] = {
#define MACO_NCCL__CALL_NAME(name) #name,
    MACO_NCCL_CALLS(MACO_NCCL__CALL_NAME)
#undef MACO_NCCL__CALL_NAME
};

static uint64_t maco_nccl__native[MACO_NCCL_CALL_COUNT];
static uint64_t maco_nccl__forwarded[MACO_NCCL_CALL_COUNT];

const char *maco_nccl__call_name(maco_nccl__call_t call)
{
    return (unsigned)call < MACO_NCCL_CALL_COUNT ? maco_nccl__call_names[call] : "?";
}

void maco_nccl__count_native(maco_nccl__call_t call)
{
    if ((unsigned)call >= MACO_NCCL_CALL_COUNT)
        return;
    if (__atomic_fetch_add(&maco_nccl__native[call], 1, __ATOMIC_RELAXED) == 0)
        maco_log_write(MACO_LOG_INFO, "coll",
                       "nccl: %s runs on MACO (first call; later ones are counted, not logged)",
                       maco_nccl__call_names[call]);
}

void maco_nccl__count_forwarded(maco_nccl__call_t call, const char *why)
{
    if ((unsigned)call >= MACO_NCCL_CALL_COUNT)
        return;
    if (__atomic_fetch_add(&maco_nccl__forwarded[call], 1, __ATOMIC_RELAXED) == 0)
        maco_log_write(MACO_LOG_INFO, "coll",
                       "nccl: %s forwarded to NCCL (%s) because MACO cannot run it: %s "
                       "(first call; later ones are counted, not logged)",
                       maco_nccl__call_names[call],
                       getenv("MACO_NCCL_LIBRARY") != NULL ? getenv("MACO_NCCL_LIBRARY")
                                                           : "libnccl.so.2",
                       why != NULL ? why : "");
}

int maco_nccl_call_count(const char *name, uint64_t *native_p, uint64_t *forwarded_p)
{
    for (int i = 0; name != NULL && i < MACO_NCCL_CALL_COUNT; i++) {
        if (strcmp(name, maco_nccl__call_names[i]) != 0)
            continue;
        if (native_p != NULL)
            *native_p = __atomic_load_n(&maco_nccl__native[i], __ATOMIC_RELAXED);
        if (forwarded_p != NULL)
            *forwarded_p = __atomic_load_n(&maco_nccl__forwarded[i], __ATOMIC_RELAXED);
        return 0;
    }
    return -1;
}

/* At exit, one info line with every counted call (how a job proves where its calls ran). */
__attribute__((destructor)) static void maco_nccl__log_counts(void)
{
    char line[2048];
    size_t n = 0;
    for (int i = 0; i < MACO_NCCL_CALL_COUNT; i++) {
        uint64_t a = maco_nccl__native[i], b = maco_nccl__forwarded[i];
        if ((a != 0 || b != 0) && n < sizeof(line)) {
            int m = snprintf(line + n, sizeof(line) - n, " %s %llu/%llu", maco_nccl__call_names[i],
                             (unsigned long long)a, (unsigned long long)b);
            if (m > 0)
                n += (size_t)m;
        }
    }
    if (n > 0)
        maco_log_write(MACO_LOG_INFO, "coll", "nccl: calls (on MACO/forwarded to NCCL):%s", line);
}

ncclResult_t maco_nccl__result(maco_status_t st)
{
    switch (st) {
    case MACO_OK:
        return ncclSuccess;
    case MACO_ERR_INVALID_ARGUMENT:
        return ncclInvalidArgument;
    case MACO_ERR_CUDA:
        return ncclUnhandledCudaError;
    case MACO_ERR_SYSTEM:
    case MACO_ERR_NO_MEMORY:
        return ncclSystemError;
    case MACO_ERR_TIMEOUT: /* a bounded wait for a peer: the peer is late or gone */
    case MACO_ERR_REMOTE:
    case MACO_ERR_REVOKED: /* NCCL's revoked communicators fail their work as a remote error */
        return ncclRemoteError;
    case MACO_ERR_UNSUPPORTED:
    case MACO_ERR_INVALID_USAGE:
        return ncclInvalidUsage;
    case MACO_ERR_INTERNAL:
        break;
    }
    return ncclInternalError;
}

ncclResult_t maco_nccl__fail(ncclResult_t res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(maco_nccl__error_text, sizeof(maco_nccl__error_text), fmt, ap);
    va_end(ap);
    static const char *const names[] = { "ncclSuccess",         "ncclUnhandledCudaError",
                                         "ncclSystemError",     "ncclInternalError",
                                         "ncclInvalidArgument", "ncclInvalidUsage",
                                         "ncclRemoteError",     "ncclInProgress",
                                         "ncclTimeout" };
    maco_log_write(MACO_LOG_ERROR, "coll", "%s (%s)", maco_nccl__error_text,
                   (unsigned)res < sizeof(names) / sizeof(names[0]) ? names[res] : "?");
    return res;
}

ncclResult_t maco_nccl__fail_maco(maco_status_t st, const char *what)
{
    const char *msg = maco_log_last_error();
    snprintf(maco_nccl__error_text, sizeof(maco_nccl__error_text), "%s: %s", what,
             msg[0] != '\0' ? msg : maco_status_string(st));
    return maco_nccl__result(st);
}

/* Here with the statuses, not in comm_core.c: fallback.c notes peer failures too, and
 * comm_core.c calls fallback.c (the files call one way: scripts/check_layers.py). */
void maco_nccl__comm_note(struct ncclComm *c, maco_status_t st)
{
    if (c != NULL && (st == MACO_ERR_REMOTE || st == MACO_ERR_TIMEOUT))
        __atomic_store_n(&c->peer_error, (int)ncclRemoteError, __ATOMIC_RELEASE);
}

const char *maco_nccl__last_error(void)
{
    return maco_nccl__error_text;
}

int maco_nccl__fallback_mode(void)
{
    const char *v = getenv("MACO_NCCL_FALLBACK");
    if (v == NULL || v[0] == '\0' || strcasecmp(v, "auto") == 0)
        return 1;
    if (strcasecmp(v, "never") == 0)
        return 0;
    maco_nccl__fail(ncclInvalidArgument,
                    "MACO_NCCL_FALLBACK='%s' is invalid: it accepts auto or never", v);
    return -1;
}

size_t maco_nccl__type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    case ncclNumTypes:
        break;
    }
    return 0;
}

int maco_nccl__maco_type(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8:
        return MACO_INT8;
    case ncclUint8:
        return MACO_UINT8;
    case ncclInt32:
        return MACO_INT32;
    case ncclUint32:
        return MACO_UINT32;
    case ncclInt64:
        return MACO_INT64;
    case ncclUint64:
        return MACO_UINT64;
    case ncclFloat16:
        return MACO_FLOAT16;
    case ncclFloat32:
        return MACO_FLOAT32;
    case ncclFloat64:
        return MACO_FLOAT64;
    case ncclBfloat16:
        return MACO_BFLOAT16;
    case ncclFloat8e4m3:
        return MACO_FP8_E4M3;
    case ncclFloat8e5m2:
        return MACO_FP8_E5M2;
    case ncclNumTypes:
        break;
    }
    return -1;
}

/* ------------------------------------------------------------------ public calls */

ncclResult_t pncclGetVersion(int *version)
{
    if (version == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclGetVersion)

const char *pncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "success";
    case ncclUnhandledCudaError:
        return "a CUDA call failed (ncclGetLastError names it)";
    case ncclSystemError:
        return "an operating-system call failed or host memory ran out (ncclGetLastError says "
               "which)";
    case ncclInternalError:
        return "internal error in MACO's NCCL library: please report it with ncclGetLastError's "
               "text";
    case ncclInvalidArgument:
        return "an argument is out of range (ncclGetLastError names it)";
    case ncclInvalidUsage:
        return "the call is not allowed here or not available (ncclGetLastError says why)";
    case ncclRemoteError:
        return "a peer rank failed, exited or timed out (ncclGetLastError names it)";
    case ncclInProgress:
        return "operation in progress";
    case ncclTimeout: /* NCCL 2.30+: a device API wait ran out; this library never returns it */
        return "a wait ran out of time";
    case ncclNumResults:
        break;
    }
    return "unknown ncclResult_t";
}
MACO_NCCL_ALIAS(ncclGetErrorString)

/* NCCL re-reads NCCL_DEBUG here; MACO reads its log settings once, so this does nothing.
 * nccl.h marks it deprecated; it is still part of the ABI: 2.28.9's declares it, and clients
 * built against that call it. 2.32's declares it only where NCCL_OS_LINUX is defined (NCCL's
 * own build) and is otherwise a macro that expands to nothing; NCCL's library exports it all
 * the same, and so does this one. */
#undef ncclResetDebugInit
#undef pncclResetDebugInit
void pncclResetDebugInit(void);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void pncclResetDebugInit(void) {}
MACO_NCCL_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop

/* Exported by NCCL's library (2.28 to 2.32) though no header declares it; kept for the same
 * symbol set. */
void ncclResetDebugInitInternal(void);
void ncclResetDebugInitInternal(void) {}

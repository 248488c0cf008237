/*
 * params.c - NCCL's parameter registry (the ncclParam* calls of NCCL 2.30) and ncclSetEncryption
 * (NCCL 2.32), as MACO's library answers them (shim.h; docs/nccl.md).
 *
 * NCCL's registry holds NCCL's own tuning knobs, typed, with defaults; MACO has none of them
 * (the few NCCL_* variables it reads are mapped onto MACO's: env.c). So the registry here is
 * empty: the key list is empty, a dump prints nothing but its header, and binding or reading a
 * key fails as NCCL fails for a key it does not know (ncclInvalidArgument), saying why.
 * MACO's TCP sockets carry no encryption: ncclSetEncryption accepts NCCL_ENCRYPTION_MODE_NONE
 * (what they are) and refuses a pre-shared key.
 */
#include <stdio.h>

#include "shim.h"

static ncclResult_t maco_nccl__no_key(const char *what, const char *key)
{
    return maco_nccl__fail(ncclInvalidArgument,
                           "%s: '%s' is not a parameter: MACO's NCCL library has no NCCL "
                           "parameters (ncclParamGetAllParameterKeys lists none; the NCCL_* "
                           "variables it maps onto MACO's are in docs/nccl.md)",
                           what, key != NULL ? key : "(null)");
}

ncclResult_t pncclParamBind(ncclParamHandle_t *out, const char *key)
{
    if (out == NULL || key == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "ncclParamBind: out %p or key %p is NULL",
                               (void *)out, (const void *)key);
    return maco_nccl__no_key("ncclParamBind", key);
}
MACO_NCCL_ALIAS(ncclParamBind)

/* No handle can come from ncclParamBind, so none is read. */
static ncclResult_t maco_nccl__no_handle(const char *what, ncclParamHandle_t h)
{
    return maco_nccl__fail(ncclInvalidArgument,
                           "%s: handle %p was not made by ncclParamBind (which binds no key in "
                           "MACO's NCCL library: it has no NCCL parameters)",
                           what, (void *)h);
}

#define MACO_NCCL_PARAM_GETTER(suffix, ctype)                                                      \
    ncclResult_t pncclParamGet##suffix(ncclParamHandle_t h, ctype *out)                            \
    {                                                                                              \
        (void)out;                                                                                 \
        return maco_nccl__no_handle("ncclParamGet" #suffix, h);                                    \
    }                                                                                              \
    MACO_NCCL_ALIAS(ncclParamGet##suffix)

MACO_NCCL_PARAM_GETTER(I8, int8_t)
MACO_NCCL_PARAM_GETTER(I16, int16_t)
MACO_NCCL_PARAM_GETTER(I32, int32_t)
MACO_NCCL_PARAM_GETTER(I64, int64_t)
MACO_NCCL_PARAM_GETTER(U8, uint8_t)
MACO_NCCL_PARAM_GETTER(U16, uint16_t)
MACO_NCCL_PARAM_GETTER(U32, uint32_t)
MACO_NCCL_PARAM_GETTER(U64, uint64_t)
MACO_NCCL_PARAM_GETTER(Str, const char *)

ncclResult_t pncclParamGet(ncclParamHandle_t h, void *out, int maxLen, int *len)
{
    return maco_nccl__no_handle("ncclParamGet", h);
}
MACO_NCCL_ALIAS(ncclParamGet)

ncclResult_t pncclParamGetParameter(const char *key, const char **value, int *valueLen)
{
    if (key == NULL || value == NULL || valueLen == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclParamGetParameter: key %p, value %p or valueLen %p is NULL",
                               (const void *)key, (void *)value, (void *)valueLen);
    *value = NULL;
    *valueLen = 0;
    return maco_nccl__no_key("ncclParamGetParameter", key);
}
MACO_NCCL_ALIAS(ncclParamGetParameter)

ncclResult_t pncclParamGetAllParameterKeys(const char ***table, int *tableLen)
{
    static const char *none[1] = { NULL };
    if (table == NULL || tableLen == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclParamGetAllParameterKeys: table %p or tableLen %p is NULL",
                               (void *)table, (void *)tableLen);
    *table = none;
    *tableLen = 0;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclParamGetAllParameterKeys)

/* NCCL prints its registry to stdout under this header; MACO's is empty. */
void pncclParamDumpAll(void)
{
    printf("=== ncclParam Registry Dump ===\n");
    fflush(stdout);
}
MACO_NCCL_ALIAS(ncclParamDumpAll)

ncclResult_t pncclSetEncryption(const ncclEncryptionConfig_t *config)
{
    static const char what[] = "ncclSetEncryption";
    if (config == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: config is NULL", what);
    if (config->magic != NCCL_API_MAGIC)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->magic is %#x, not %#x: initialise the config with "
                               "NCCL_ENCRYPTION_CONFIG_INITIALIZER",
                               what, config->magic, (unsigned)NCCL_API_MAGIC);
    if (config->size < offsetof(ncclEncryptionConfig_t, mode) + sizeof(config->mode) ||
        config->size > (1u << 20))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->size is %zu, outside [%zu, 1 MiB]: initialise the "
                               "config with NCCL_ENCRYPTION_CONFIG_INITIALIZER",
                               what, config->size,
                               offsetof(ncclEncryptionConfig_t, mode) + sizeof(config->mode));
    if (config->mode == NCCL_ENCRYPTION_MODE_NONE)
        return ncclSuccess; /* plaintext: what MACO's sockets are */
    if (config->mode == NCCL_ENCRYPTION_MODE_PSK)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: NCCL_ENCRYPTION_MODE_PSK: MACO's TCP sockets (bootstrap and "
                               "TCP transport) are not encrypted; keep the job on a trusted "
                               "network",
                               what);
    return maco_nccl__fail(ncclInvalidArgument,
                           "%s: config->mode %d is not an ncclEncryptionMode_t (0 or 1)", what,
                           config->mode);
}
MACO_NCCL_ALIAS(ncclSetEncryption)

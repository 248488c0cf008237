/* status.c - status texts and the version string. */
#include "maco/status.h"

const char *maco_status_string(maco_status_t status)
{
    switch (status) {
    case MACO_OK:
        return "success";
    case MACO_ERR_INVALID_ARGUMENT:
        return "invalid argument";
    case MACO_ERR_CUDA:
        return "CUDA error";
    case MACO_ERR_SYSTEM:
        return "system error";
    case MACO_ERR_TIMEOUT:
        return "timeout";
    case MACO_ERR_REMOTE:
        return "remote peer failure";
    case MACO_ERR_UNSUPPORTED:
        return "unsupported";
    case MACO_ERR_INTERNAL:
        return "internal error";
    case MACO_ERR_NO_MEMORY:
        return "out of host memory";
    case MACO_ERR_INVALID_USAGE:
        return "invalid usage";
    case MACO_ERR_REVOKED:
        return "communicator revoked";
    }
    return "unknown status";
}

const char *maco_version_string(void)
{
    return MACO_VERSION_STRING;
}

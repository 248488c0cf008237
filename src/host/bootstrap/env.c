/* env.c - starting a bootstrap from the environment (MACO_* or torchrun's variables):
 * the rank-0 address, the job nonce (given: never derived), the world size; under torchrun the
 * unique id through torchrun's store (torch_store.c). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* Reads an integer variable, MACO's name first, then torchrun's; *name_p (may be NULL) gets the
 * name it was read from. */
static maco_status_t maco__env_int(const char *maco_name, const char *torch_name, int *value_p,
                                   int required, const char **name_p)
{
    const char *name = maco_name;
    const char *v = getenv(maco_name);
    if (v == NULL || v[0] == '\0') {
        name = torch_name;
        v = getenv(torch_name);
    }
    if (v == NULL || v[0] == '\0') {
        if (!required)
            return MACO_OK;
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "neither %s nor %s is set: initialisation from the environment "
                           "needs both the rank and the world size (maco-run sets them)",
                           maco_name, torch_name);
    }
    int64_t x;
    if (maco__parse_int(v, &x) != 0 || x < 0 || x > 0x7fffffff)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s='%s' is not a non-negative integer", name, v);
    *value_p = (int)x;
    if (name_p != NULL)
        *name_p = name;
    return MACO_OK;
}

maco_status_t maco_bootstrap_create_from_env(maco_bootstrap_t *bs_p)
{
    if (bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create_from_env: bs_p is NULL");
    int rank = -1, nranks = -1;
    const char *rank_name = "MACO_RANK", *size_name = "MACO_WORLD_SIZE";
    maco_status_t st = maco__env_int("MACO_RANK", "RANK", &rank, 1, &rank_name);
    if (st == MACO_OK)
        st = maco__env_int("MACO_WORLD_SIZE", "WORLD_SIZE", &nranks, 1, &size_name);
    if (st != MACO_OK)
        return st;
    if (nranks > MACO_MAX_RANKS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s=%d is out of range: a job has 1 to %d ranks (MACO_MAX_RANKS)",
                           size_name, nranks, MACO_MAX_RANKS);
    if (nranks < 1 || rank >= nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s=%d with %s=%d: the world size must be at least 1 and the rank "
                           "from 0 to world size - 1",
                           rank_name, rank, size_name, nranks);
    char addr_text[512];
    const char *what = "MACO_BOOTSTRAP_ADDR";
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_ADDR)) {
        snprintf(addr_text, sizeof(addr_text), "%s", maco__config_string(MACO_CFG_BOOTSTRAP_ADDR));
    } else {
        const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
        if (host == NULL || port == NULL || !host[0] || !port[0])
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_BOOTSTRAP_ADDR is not set, nor are MASTER_ADDR and "
                               "MASTER_PORT: rank 0's address is unknown");
        if (strchr(host, ':') != NULL && host[0] != '[')
            snprintf(addr_text, sizeof(addr_text), "[%s]:%s", host, port);
        else
            snprintf(addr_text, sizeof(addr_text), "%s:%s", host, port);
        what = "MASTER_ADDR:MASTER_PORT";
    }
    maco__sockaddr_t root;
    st = maco__sockaddr_parse(addr_text, what, &root);
    if (st != MACO_OK)
        return st;
    if (maco__torch_store_wanted()) {
        /* torchrun's agent holds MASTER_PORT (its store): the id travels through that store. */
        maco_unique_id_t id;
        st = maco__torch_store_unique_id(&root, addr_text, rank, &id);
        if (st != MACO_OK)
            return st;
        return maco_bootstrap_create(&id, rank, nranks, -1, bs_p);
    }
    uint64_t nonce;
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_NONCE)) {
        const char *text = maco__config_string(MACO_CFG_BOOTSTRAP_NONCE);
        if (maco__parse_nonce(text, &nonce) != 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_BOOTSTRAP_NONCE='%s' is invalid: it accepts 1 to 16 hex "
                               "digits (no sign, no 0x)",
                               text);
    } else {
        /* No nonce derived from what others can know (the address, a run id): a process that
         * could compute it could take a rank. */
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "MACO_BOOTSTRAP_NONCE is not set: every rank of a job started from "
                           "the environment needs the same random job nonce (1 to 16 hex "
                           "digits, e.g. from `openssl rand -hex 8`), so that no other process "
                           "can take a rank. maco-run sets it; under torchrun "
                           "(TORCHELASTIC_USE_AGENT_STORE=True) MACO draws one and passes it "
                           "through the agent's store; other launchers must export it to all "
                           "ranks");
    }
    maco_unique_id_t id;
    maco__unique_id_encode(&id, nonce, &root);
    return maco_bootstrap_create(&id, rank, nranks, -1, bs_p);
}

/* unique_id.c - the 128-byte unique id (magic, version, nonce, root address) and the
 * listening sockets of ids this process created, until their rank 0 takes them. */
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

/* ------------------------------------------------------------------ unique id */

static pthread_mutex_t maco__root_lock = PTHREAD_MUTEX_INITIALIZER;
/* Listening sockets of unique ids this process created, until their rank 0 takes them. Any
 * nonce is valid (0 too), so a slot says whether it is used with its own flag. */
static struct {
    int used;
    uint64_t nonce;
    int fd;
} maco__root_sockets[16];

void maco__unique_id_encode(maco_unique_id_t *id, uint64_t nonce, const maco__sockaddr_t *root)
{
    memset(id, 0, sizeof(*id));
    maco__put_u32(id->bytes, MACO__ID_MAGIC);
    maco__put_u16(id->bytes + 4, MACO__ID_VERSION);
    maco__put_u64(id->bytes + 8, nonce);
    maco__sockaddr_to_wire(root, id->bytes + 16);
}

maco_status_t maco__unique_id_decode(const maco_unique_id_t *id, uint64_t *nonce,
                                     maco__sockaddr_t *root)
{
    if (maco__get_u32(id->bytes) != MACO__ID_MAGIC)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id does not start with MACO's magic: it was not made by "
                           "maco_unique_id_create or it was damaged in transit");
    if (maco__get_u16(id->bytes + 4) != MACO__ID_VERSION)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id has version %u; this MACO reads version %u",
                           maco__get_u16(id->bytes + 4), MACO__ID_VERSION);
    maco__sockaddr_t addr;
    if (maco__sockaddr_from_wire(id->bytes + 16, &addr) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id holds no valid root address");
    *nonce = maco__get_u64(id->bytes + 8);
    *root = addr;
    return MACO_OK;
}

maco_status_t maco_unique_id_create(maco_unique_id_t *id_p)
{
    if (id_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_unique_id_create: id_p is NULL");
    maco__sockaddr_t addr;
    maco_status_t st = maco__socket_default_address(&addr);
    if (st != MACO_OK)
        return st;
    int fd;
    st = maco__socket_listen(&addr, &fd);
    if (st != MACO_OK)
        return st;
    uint64_t nonce = maco__random_u64();
    pthread_mutex_lock(&maco__root_lock);
    int slot = -1;
    for (int i = 0; i < 16 && slot < 0; i++)
        if (!maco__root_sockets[i].used)
            slot = i;
    if (slot >= 0) {
        maco__root_sockets[slot].used = 1;
        maco__root_sockets[slot].nonce = nonce;
        maco__root_sockets[slot].fd = fd;
    }
    pthread_mutex_unlock(&maco__root_lock);
    if (slot < 0) {
        close(fd);
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_BOOTSTRAP,
                           "maco_unique_id_create: 16 unique ids of this process are waiting "
                           "for their rank 0 to call maco_bootstrap_create; use some first");
    }
    maco__unique_id_encode(id_p, nonce, &addr);
    return MACO_OK;
}

/* Takes the listening socket a unique id of this process opened, if any. */
int maco__take_root_socket(uint64_t nonce)
{
    int fd = -1;
    pthread_mutex_lock(&maco__root_lock);
    for (int i = 0; i < 16; i++) {
        if (maco__root_sockets[i].used && maco__root_sockets[i].nonce == nonce) {
            fd = maco__root_sockets[i].fd;
            maco__root_sockets[i].used = 0;
            maco__root_sockets[i].fd = -1;
            break;
        }
    }
    pthread_mutex_unlock(&maco__root_lock);
    return fd;
}

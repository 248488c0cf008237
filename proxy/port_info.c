/*
 * port_info.c - what a persistent kernel's task graph keeps of a port channel (port_info.h).
 */
#include <string.h>

#include "src/host/base/log.h"
#include "proxy/port_info.h"
#include "proxy/proxy_internal.h"

maco_status_t maco__port_channel_info(maco_port_channel_t ch, int host_fifo,
                                      maco__port_info_t *info)
{
    if (ch == NULL || info == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco__port_channel_info: NULL argument");
    maco__port_info_t i;
    memset(&i, 0, sizeof(i));
    if (!host_fifo) {
        maco_status_t st = maco_port_channel_get_device_handle(ch, &i.handle);
        if (st != MACO_OK)
            return st;
    } else {
        if (!ch->sem_host || ch->inbound == NULL)
            return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                               "port channel %u to rank %d: its semaphore is not in host memory, "
                               "so host threads cannot wait on it",
                               ch->id, ch->peer);
        i.handle.fifo = ch->proxy->host_fifo.view;
        i.handle.semaphore.inbound = ch->inbound;
        i.handle.semaphore.peer = ch->peer;
        i.handle.channel = ch->id;
        i.handle.push_order = MACO__PUSH_RELEASE_SYS;
    }
    i.src = ch->src;
    i.src_bytes = ch->src_bytes;
    i.dst_bytes = ch->dst_bytes;
    i.peer = ch->peer;
    *info = i;
    return MACO_OK;
}

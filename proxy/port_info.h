/*
 * port_info.h - what a persistent kernel's task graph keeps of a port channel
 * (runtime/host/graph.c): its device handle, or the handle of its proxy's host FIFO for the CPU
 * simulation of the runtime, its buffers' sizes and its peer (port_info.c fills it).
 */
#ifndef MACO_PROXY_PORT_INFO_H
#define MACO_PROXY_PORT_INFO_H

#include <stdint.h>

#include "maco/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco__port_info {
    maco_port_channel_device_t handle; /* what the kernel's port tasks push with */
    const char *src;                   /* the channel's source buffer (this rank's address) */
    uint64_t src_bytes, dst_bytes;     /* its source's and its destination's sizes */
    int peer;                          /* the rank it leads to */
} maco__port_info_t;

/**
 * Fills *info for channel `ch`. host_fifo 0: the device handle (maco_port_channel_get_device_
 * handle, with its errors); 1: a handle whose FIFO is the proxy's host FIFO and whose
 * semaphore is the channel's host semaphore (host addresses: host threads push and read them),
 * for channels whose semaphore is in host memory (MACO_ERR_UNSUPPORTED otherwise).
 */
maco_status_t maco__port_channel_info(maco_port_channel_t ch, int host_fifo,
                                      maco__port_info_t *info);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_PORT_INFO_H */

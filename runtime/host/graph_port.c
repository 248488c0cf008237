/*
 * graph_port.c - port channels in a task graph (maco_task_graph_add_port_channel): what the
 * graph keeps of each, from the proxy (proxy/port_info.h). Apart from graph.c, which the CPU
 * tests link without the proxy.
 */
#include <stdlib.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

/* Adds port channel `ch` with its device handle, or (host_fifo) its host FIFO's. */
static maco_status_t maco__graph_add_port(maco_task_graph_t g, maco_port_channel_t ch,
                                          int host_fifo, int *index_p, const char *fn)
{
    if (g == NULL || ch == NULL || index_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: NULL argument", fn);
    maco__port_info_t info;
    maco_status_t st = maco__port_channel_info(ch, host_fifo, &info);
    if (st != MACO_OK)
        return st; /* logged where it was found */
    return maco__task_graph_add_port_info(g, &info, index_p, fn);
}

maco_status_t maco_task_graph_add_port_channel(maco_task_graph_t g, maco_port_channel_t ch,
                                               int *index_p)
{
    return maco__graph_add_port(g, ch, 0, index_p, "maco_task_graph_add_port_channel");
}

maco_status_t maco__task_graph_add_port_channel_host(maco_task_graph_t g, maco_port_channel_t ch,
                                                     int *index_p)
{
    return maco__graph_add_port(g, ch, 1, index_p, "maco__task_graph_add_port_channel_host");
}

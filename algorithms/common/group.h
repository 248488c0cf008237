/*
 * group.h - the calling thread's group of calls (group.c: maco_group_start / maco_group_end),
 * through which every collective, send, receive and all-to-all is issued.
 */
#ifndef MACO_ALGORITHMS_COMMON_GROUP_H
#define MACO_ALGORITHMS_COMMON_GROUP_H

#include "algorithms/collectives/collectives.h"
#include "algorithms/p2p/p2p_plan.h"
#include "maco/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The calling thread's group (maco_group_start/end). Every operation goes through
 * it: outside a group a call is a group of its own.
 * maco__group_depth: how deep the calling thread is inside maco_group_start (0: none).
 * maco__group_add_coll / _p2p: queue a checked call (its arguments copied); outside a group
 * the call is issued at once. `msgs` are the call's sends and receives (an all-to-all has
 * one of each per peer). maco__group_fail: a call inside a group failed its checks
 * (status and message are the thread's last error): the group will fail at its end.
 */
int maco__group_depth(void);
maco_status_t maco__group_add_coll(const maco__coll_call_t *c, maco_comm_t comm,
                                   maco_stream_t stream);
maco_status_t maco__group_add_p2p(const char *fn, const maco__p2p_msg_t *msgs, int nmsgs,
                                  maco_comm_t comm, maco_stream_t stream);
maco_status_t maco__group_fail(const char *fn, maco_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_COMMON_GROUP_H */

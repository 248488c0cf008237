/*
 * maco/maco.h - the whole public host API of MACO.
 *
 * Device code includes the headers under maco/device/ it needs.
 */
#ifndef MACO_MACO_H
#define MACO_MACO_H

#include "maco/bootstrap.h"
#include "maco/collectives.h"
#include "maco/comm.h"
#include "maco/config.h"
#include "maco/ep.h"
#include "maco/log.h"
#include "maco/memory.h"
#include "maco/memory_channel.h"
#include "maco/nccl_bootstrap.h"
#include "maco/plan.h"
#include "maco/persistent.h"
#include "maco/port_channel.h"
#include "maco/status.h"

#endif /* MACO_MACO_H */

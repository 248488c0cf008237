/*
 * maco/device.h - the whole public device API in one include: semaphores, memory channels,
 * port channels, the trigger FIFO, LL packets, copies, grid-wide synchronisation, the
 * acquire/release atomics and the bounded-wait error reports. Each header is a contract (what
 * a call does, its ordering, which threads call it); the bodies are in maco/device/impl/.
 * Device functions are visible only when compiled by nvcc; the handle types in C and C++ too.
 */
#ifndef MACO_DEVICE_H
#define MACO_DEVICE_H

#include "maco/device/atomics.h"
#include "maco/device/copy.h"
#include "maco/device/error.h"
#include "maco/device/fifo.h"
#include "maco/device/macros.h"
#include "maco/device/memory_channel.h"
#include "maco/device/packet.h"
#include "maco/device/port_channel.h"
#include "maco/device/semaphore.h"
#include "maco/device/sync.h"

#endif /* MACO_DEVICE_H */

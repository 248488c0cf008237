/*
 * maco/plan.h - execution plans: collective algorithms as data.
 *
 * A plan (docs/plan-format.md) is a versioned JSON document, usually written with the Python
 * DSL `maco.language`, that lists for one collective and one world size each rank's
 * channels and, per thread block, the channel operations it runs on chunks of its input,
 * output and scratch buffers. MACO verifies a plan on the CPU before it runs (postcondition,
 * races, deadlocks, bounds; maco_plan_verify_file) and runs it with one launch of a generic
 * executor kernel. Plans are read with Jansson, loaded at run time (MACO_JSON_LIBRARY).
 */
#ifndef MACO_PLAN_H
#define MACO_PLAN_H

#include <stddef.h>

#include "maco/collectives.h"
#include "maco/comm.h"
#include "maco/export.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A loaded, verified plan bound to one communicator (opaque). */
typedef struct maco_plan *maco_plan_t;

/**
 * Reads the plan file at `path` and verifies it (docs/plan-format.md, "Verification").
 * Needs no communicator and no GPU. `report` (may be NULL when `report_bytes` is 0) gets
 * one line per problem, each naming rank, thread block, operation index and chunk,
 * NUL-terminated and truncated to report_bytes (a last line "..." says so); on success it
 * gets an empty string.
 * Returns MACO_OK when the plan is valid; MACO_ERR_INVALID_ARGUMENT when `path` is NULL,
 * `report` is NULL with report_bytes > 0, the file cannot be read, is not a version-1 MACO
 * plan (the report names the JSON path and the limit), or the verifier rejects it (also a plan
 * too large to verify: more than 1 GiB of clocks and values, or more than 2^28 steps, which
 * bounds the time well under a second; docs/plan-format.md, "Verification");
 * MACO_ERR_UNSUPPORTED when the JSON library cannot be loaded (the report says why);
 * MACO_ERR_NO_MEMORY. Blocks only on reading the file. Thread-safe.
 */
MACO_API maco_status_t maco_plan_verify_file(const char *path, char *report, size_t report_bytes);

/**
 * Reads, verifies and prepares the plan at `path` for `comm` (collective: every rank of
 * `comm` calls it with the same file): allocates this rank's plan buffers (input and output
 * units of MACO_PLAN_MAX_BYTES each, plus scratch), registers them, and sets up the plan's
 * channels plus one per peer for the executor's entry and exit barriers. A plan with port
 * channels (or a communicator spanning nodes) also gets a proxy thread and a host buffer of
 * shared pinned memory per rank (docs/plan-format.md, "Execution"); its port channels run
 * over TCP (or IB) between nodes and over host memory inside one. Blocks until every rank
 * has done so (bootstrap exchanges; bounded by
 * MACO_BOOTSTRAP_TIMEOUT). *plan_p is written only on success; free it with
 * maco_plan_destroy before destroying `comm`.
 * Returns MACO_OK; MACO_ERR_INVALID_ARGUMENT (NULL argument, unreadable or invalid plan:
 * the communicator's last error holds the verifier's first problem; a plan whose world size
 * differs from comm's); MACO_ERR_UNSUPPORTED (no GPU, a memory channel between ranks on
 * different nodes of `comm`, a put_packets reading a chunk a port channel writes, more than 8
 * ranks, no JSON library);
 * MACO_ERR_CUDA, MACO_ERR_NO_MEMORY, MACO_ERR_TIMEOUT / MACO_ERR_REMOTE (a peer failed
 * during the exchange). Not thread-safe with other calls on `comm`.
 */
MACO_API maco_status_t maco_plan_load(maco_comm_t comm, const char *path, maco_plan_t *plan_p);

/**
 * Runs the plan's collective on `stream`: one launch of the executor kernel that copies
 * `sendbuf` into the plan's input buffer, runs every thread block's operations, and copies
 * the output buffer into `recvbuf`. `count` is the collective's unit in elements of `type`
 * (allreduce: the whole buffer; allgather: one rank's send buffer, recvbuf holds world_size
 * times that; reduce-scatter: one rank's receive buffer, sendbuf holds world_size times
 * that); `op` applies to reductions (ignored by allgather). Every rank must call it with the
 * same count, type and op. Asynchronous: returns once the launch is enqueued; capturable in
 * a CUDA graph (per-launch state lives on the device). In place (sendbuf == recvbuf) is
 * allowed.
 * Returns MACO_OK; MACO_ERR_INVALID_ARGUMENT (NULL plan or buffers with count > 0, `comm`
 * not the plan's communicator, unknown type or op, a unit larger than MACO_PLAN_MAX_BYTES);
 * MACO_ERR_INVALID_USAGE (an earlier device wait of the communicator failed);
 * MACO_ERR_CUDA (the launch failed). count == 0 enqueues nothing and returns MACO_OK.
 * Device waits are bounded by MACO_DEVICE_TIMEOUT; a timeout is reported by
 * maco_comm_get_async_error. Calls on one plan must not run concurrently (one stream at a
 * time), as with the collectives.
 */
MACO_API maco_status_t maco_plan_execute(maco_plan_t plan, const void *sendbuf, void *recvbuf,
                                         size_t count, maco_datatype_t type, maco_redop_t op,
                                         maco_comm_t comm, maco_stream_t stream);

/**
 * Frees the plan's buffers and channels after waiting for the device to finish its work
 * (cudaDeviceSynchronize). NULL is a no-op. Not collective. Returns MACO_OK, or the first
 * error met while freeing (MACO_ERR_CUDA); the plan is freed either way.
 */
MACO_API maco_status_t maco_plan_destroy(maco_plan_t plan);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PLAN_H */

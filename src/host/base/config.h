/*
 * config.h - MACO's one configuration table (internal).
 *
 * Every environment variable MACO reads is a row here: X(ID, type, default, unit, doc).
 * The variable's name is "MACO_" followed by ID. maco-info --env prints the table, README's
 * configuration section is checked against it by a test, and MACO_* variables not in it get
 * a warning naming the closest known one.
 *
 * Types and their accepted spellings:
 *   STRING    any text
 *   INT       a decimal integer
 *   SIZE      bytes: an integer with an optional K, M, G or T suffix (binary: 64M = 64 MiB)
 *   DURATION  milliseconds: an integer with a unit us, ms, s or m (30s, 500ms); a bare
 *             integer means milliseconds. Longer values saturate at MACO__DURATION_MAX_MS
 *             (about 292 years), so a duration converts to nanoseconds, or adds to a clock,
 *             without overflow
 * A value out of int64's range is invalid (never wrapped). MACO_LOG_LEVEL and
 * MACO_LOG_SUBSYS are checked by the logger's own parsers (log.h).
 *   BOOL      1/0, true/false, yes/no, on/off (any case)
 */
#ifndef MACO_CONFIG_INTERNAL_H
#define MACO_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO_CONFIG_TABLE(X)                                                                       \
    X(LOG_LEVEL, STRING, "warn", "",                                                               \
      "Log level: error, warn, info, debug or trace (another value: warned, warn is used).")       \
    X(LOG_SUBSYS, STRING, "all", "",                                                               \
      "Subsystems to log (init,bootstrap,mem,channel,coll,proxy,tool,persist,all); ^ inverts. "    \
      "Errors are logged whatever it says; an unknown name is warned about and ignored.")          \
    X(LOG_FILE, STRING, "", "",                                                                    \
      "Log file path; %h expands to the host name, %p to the pid. Empty: standard error "          \
      "(also when the file cannot be opened, with a warning there).")                              \
    X(RANK, INT, "", "", "This process's rank, for initialisation from the environment.")          \
    X(WORLD_SIZE, INT, "", "", "Number of ranks, for initialisation from the environment.")        \
    X(LOCAL_RANK, INT, "", "", "Rank among the ranks of this node (default: derived).")            \
    X(BOOTSTRAP_ADDR, STRING, "", "",                                                              \
      "host:port (or [v6]:port) where rank 0 listens, for initialisation from the environment.")   \
    X(BOOTSTRAP_NONCE, STRING, "", "",                                                             \
      "Job nonce (1 to 16 hex digits), the same random value on every rank; maco-run sets it. "    \
      "Required when starting from the environment other than through torchrun's agent store.")    \
    X(BOOTSTRAP_TIMEOUT, DURATION, "120s", "ms", "Deadline of every bootstrap wait.")              \
    X(BOOTSTRAP_PORT, INT, "", "",                                                                 \
      "Port rank 0 listens on when its address comes from Slurm's node list (no PMIx, "            \
      "MACO_BOOTSTRAP_NONCE given). Default: 20000 + (job id * 16 + step id) mod 10000.")          \
    X(LAUNCHER, STRING, "auto", "",                                                                \
      "Whose variables describe the job: auto (MACO's, torchrun's, Open MPI's, MPICH's, PMIx's, "  \
      "Slurm's: the first found), or maco, torchrun, ompi, mpich, pmix or slurm alone.")           \
    X(PMIX_LIBRARY, STRING, "libpmix.so.2", "",                                                    \
      "Path or name of the PMIx library, loaded at run time where the launcher offers PMIx "       \
      "(Open MPI's mpirun, srun --mpi=pmix) to pass the unique id to the ranks.")                  \
    X(HOST_ID, STRING, "", "",                                                                     \
      "Node identity override (default: host name + boot id); ranks with equal ids share a "       \
      "node.")                                                                                     \
    X(SOCKET_IFNAME, STRING, "", "",                                                               \
      "Network interfaces for bootstrap sockets, as NCCL_SOCKET_IFNAME: prefixes (eth,ib), "       \
      "=exact names, ^ to exclude. Default: the first up non-loopback IPv4 one.")                  \
    X(DEVICE_TIMEOUT, DURATION, "60s", "ms",                                                       \
      "Deadline of every device-side wait (semaphores, LL packets); 0 disables it.")               \
    X(GEMM_TILE, STRING, "auto", "",                                                               \
      "GEMM tiles of the persistent kernel: auto (gmma where built and this GPU runs it, else "    \
      "cublasdx), gmma (Hopper TMA + wgmma through CUTLASS's SM90 warp-specialized mainloop, "     \
      "sm_90a, 384 threads per CTA; the faster: docs/performance.md, \"Tuning\") or cublasdx "     \
      "(cuBLASDx, mma.sync).")                                                                     \
    X(GEMM_TILE_WIDTH, STRING, "auto", "",                                                         \
      "Width of the GEMM tiles that maco_gemm_plan_tiles and the fused operators make: auto "      \
      "(256 where n allows it and there are at least as many 128 x 256 tiles as workers or SMs, "  \
      "else 128), 128 or 256 (256 only where n is a multiple of 256).")                            \
    X(SHARED_GPU, BOOL, "0", "",                                                                   \
      "Let ranks share a GPU without MPS (correct, but kernels time-slice: each hand-off "         \
      "between ranks costs a time slice, about 4 ms). Under MPS sharing needs no setting.")        \
    X(SCRATCH_SIZE, SIZE, "128M", "bytes",                                                         \
      "Scratch buffer per rank for collectives on unregistered buffers.")                          \
    X(ALGO_ALLREDUCE, STRING, "", "",                                                              \
      "Force an allreduce algorithm: oneshot_ll, twoshot_ll, rsag (one node) or hier (across "     \
      "nodes). Default: chosen by size and node count.")                                           \
    X(ALGO_ALLGATHER, STRING, "", "",                                                              \
      "Force an allgather algorithm: ll or mesh (one node), hier (across nodes).")                 \
    X(ALGO_REDUCE_SCATTER, STRING, "", "",                                                         \
      "Force a reduce-scatter algorithm: ll or mesh (one node), hier (across nodes).")             \
    X(ALGO_BROADCAST, STRING, "", "",                                                              \
      "Force a broadcast algorithm: ll or mesh (one node), hier (across nodes).")                  \
    X(ALGO_REDUCE, STRING, "", "",                                                                 \
      "Force a reduce algorithm: ll or mesh (one node), hier (across nodes).")                     \
    X(ALGO_ALLTOALL, STRING, "", "",                                                               \
      "Force how all-to-all messages travel: ll (LL packets) or copy (through scratch), or "       \
      "hier across nodes (maco_alltoall outside groups: blocks gathered per rail).")               \
    X(ALGO_SENDRECV, STRING, "", "",                                                               \
      "Force how send/recv messages travel: ll (LL packets) or copy (through scratch).")           \
    X(P2P_LL_MAX, SIZE, "256K", "bytes",                                                           \
      "Largest send/recv or all-to-all message (bytes per peer) sent as LL packets; larger "       \
      "ones are copied through the receiver's scratch in chunks.")                                 \
    X(P2P_LANES, INT, "32", "",                                                                    \
      "Lanes per pair of ranks for send/recv and all-to-all (1..32): each has its own scratch "    \
      "slots, credits and CTA; a message's chunks are spread over them.")                          \
    X(P2P_CHUNK_SIZE, SIZE, "0", "bytes",                                                          \
      "Send/recv and all-to-all: most bytes of a chunk copied through scratch (16K..4M); 0: "      \
      "automatic (512K, halved until the slots of all peers fit 64 MiB).")                         \
    X(ALLREDUCE_ONESHOT_MAX, SIZE, "256K", "bytes",                                                \
      "Largest message (bytes per rank) of the LL kernels (one-shot up to 128K, two-shot "         \
      "blocks, ll of the other collectives); unset with at most 2 ranks in the job: 1M.")          \
    X(ALLREDUCE_INPLACE_MAX, SIZE, "8M", "bytes",                                                  \
      "Largest allreduce that uses registered buffers in place (above it, through scratch: "       \
      "faster there: docs/performance.md, \"Tuning\").")                                           \
    X(ALLREDUCE_RSAG_CTAS, INT, "128", "",                                                         \
      "CTAs of the rsag allreduce (1..128, at most the SM count); each has its own scratch "       \
      "slot and semaphores.")                                                                      \
    X(MESH_GATE_MIN, SIZE, "0", "bytes",                                                           \
      "Smallest message (bytes per rank) whose mesh kernel waits for every rank behind a one-CTA " \
      "gate kernel instead of on its own SMs (a rank that arrives first leaves its SMs to the "    \
      "work beside it); 0: never.")                                                                \
    X(COLL_MAX_CTAS, INT, "0", "",                                                                 \
      "Most CTAs a collective or send/recv kernel launches (0: no cap beyond the co-resident "     \
      "bound, SM count / ranks sharing the GPU, halved when any GPU of the job is shared); the "   \
      "rest of the SMs stay free for other work. Every rank must set the "                         \
      "same value (checked at creation). maco_collective_set_max_ctas changes it.")                \
    X(HIER_CTAS, INT, "8", "",                                                                     \
      "Collectives across nodes: CTAs (1..64), each with its own scratch slot and port "           \
      "channels to the rail peers on every other node.")                                           \
    X(PROXY_FIFO_SIZE, INT, "1024", "triggers",                                                    \
      "Slots of each proxy trigger FIFO (a power of two, 2..65536).")                              \
    X(PROXY_STREAM_MEMOPS, BOOL, "1", "",                                                          \
      "Port-channel signals and small puts as CUDA stream memory operations; 0: as staged "        \
      "copies (slower; for drivers without them).")                                                \
    X(TRANSPORT, STRING, "auto", "",                                                               \
      "Port-channel transport for channels created with MACO_TRANSPORT_AUTO: auto, cuda, host, "   \
      "ib or tcp.")                                                                                \
    X(TCP_NSOCKS, INT, "2", "",                                                                    \
      "TCP transport: sockets per pair of proxies (1..8); large puts are striped over them.")      \
    X(TCP_CHUNK_SIZE, SIZE, "1M", "bytes",                                                         \
      "TCP transport: the piece a large put is cut into (64K..64M); GPU memory is staged through " \
      "pinned host buffers of this size.")                                                         \
    X(IB_LIBRARY, STRING, "libibverbs.so.1", "",                                                   \
      "Path or name of libibverbs, loaded at run time by the IB transport.")                       \
    X(IB_HCA, STRING, "", "",                                                                      \
      "RDMA devices and ports for the IB transport: mlx5_0:1,mlx5_1; a leading ^ excludes, a "     \
      "leading = matches names exactly (else as prefixes). Default: the active port nearest the "  \
      "GPU.")                                                                                      \
    X(IB_GID_INDEX, INT, "-1", "",                                                                 \
      "GID index for RoCE; -1 picks a RoCE v2 IPv4-mapped GID (InfiniBand uses the LID).")         \
    X(IB_TIMEOUT, INT, "18", "",                                                                   \
      "IB queue pairs' transport timeout exponent (4.096 us * 2^value, 1..31): a dead peer "       \
      "fails a connection after about timeout * (retry count + 1), 7.5 s by default.")             \
    X(IB_RETRY_CNT, INT, "6", "",                                                                  \
      "IB queue pairs' retry count (0..7; 7 retries forever on some providers, soft-RoCE "         \
      "among them).")                                                                              \
    X(JSON_LIBRARY, STRING, "libjansson.so.4", "",                                                 \
      "Path or name of Jansson, the JSON library loaded at run time to read execution plans.")     \
    X(PLAN_MAX_BYTES, SIZE, "32M", "bytes",                                                        \
      "Largest unit (bytes) a loaded plan executes; each rank allocates this per input and "       \
      "output unit of the plan, plus scratch.")                                                    \
    X(NCCL_LIBRARY, STRING, "libnccl.so.2", "",                                                    \
      "Path or name of the NCCL library that maco-perf --nccl, maco_comm_create_from_nccl and "    \
      "the NCCL-compatible library's fallback dlopen (never MACO's own libnccl.so.2: give the "    \
      "real NCCL's path when MACO's is first).")                                                   \
    X(NCCL_FALLBACK, STRING, "auto", "",                                                           \
      "NCCL-compatible library: auto forwards what MACO cannot do to MACO_NCCL_LIBRARY; never "    \
      "returns ncclInvalidUsage saying why instead.")                                              \
    X(NCCL_FORWARD, STRING, "", "",                                                                \
      "NCCL-compatible library: NCCL calls to forward to the real NCCL even where MACO runs "      \
      "them (comma list, e.g. ncclAllReduce,ncclSend), to compare or to bisect a problem.")

typedef enum maco__config_type {
    MACO_CONFIG_STRING,
    MACO_CONFIG_INT,
    MACO_CONFIG_SIZE,
    MACO_CONFIG_DURATION,
    MACO_CONFIG_BOOL,
} maco__config_type_t;

typedef enum maco__config_id {
#define MACO__CONFIG_ENUM(id, type, def, unit, doc) MACO_CFG_##id,
    MACO_CONFIG_TABLE(MACO__CONFIG_ENUM)
#undef MACO__CONFIG_ENUM
        MACO_CFG_COUNT
} maco__config_id_t;

/** Full variable name ("MACO_LOG_LEVEL"). */
const char *maco__config_name(maco__config_id_t id);

/** The value as text: the environment's when set and non-empty, else the default. */
const char *maco__config_string(maco__config_id_t id);

/** True when the variable is set (non-empty) in the environment. */
int maco__config_is_set(maco__config_id_t id);

/**
 * The value as a number in the row's unit (INT: itself, SIZE: bytes, DURATION: ms, BOOL: 0/1).
 * Returns MACO_ERR_INVALID_ARGUMENT, with a logged message naming the variable and what it
 * accepts, when the text does not parse or lies outside the variable's rule (its range in
 * config.c); *value_p is then untouched. A STRING row, or an
 * INT row with no value and no default, is MACO_ERR_INVALID_ARGUMENT too.
 */
maco_status_t maco__config_int64(maco__config_id_t id, int64_t *value_p);

/**
 * A STRING variable's value (set or default) after the checks of its rule in config.c: a word
 * from its list (compared without case) or a length limit. MACO_ERR_INVALID_ARGUMENT, logged
 * with the variable's name, the value and what it accepts, otherwise (*value_p untouched).
 * Variables without a rule always pass. maco__config_int64 applies the numeric rules (ranges,
 * powers of two) the same way, and maco__config_validate both.
 */
maco_status_t maco__config_word(maco__config_id_t id, const char **value_p);

/** Longest DURATION in ms: its nanoseconds still fit int64. */
#define MACO__DURATION_MAX_MS (INT64_MAX / 1000000)

/**
 * Parsers shared with the tools and tests; they return 0 on success, -1 on bad text (and on
 * a value out of range: nothing wraps); a failed parse does not write the output.
 * maco__parse_nonce: MACO_BOOTSTRAP_NONCE's text, 1 to 16 hex digits, nothing else.
 */
int maco__parse_nonce(const char *text, uint64_t *nonce_p);
int maco__parse_size(const char *text, int64_t *bytes_p);
int maco__parse_duration_ms(const char *text, int64_t *ms_p);
int maco__parse_bool(const char *text, int *value_p);
int maco__parse_int(const char *text, int64_t *value_p);

struct sockaddr_storage;
/**
 * Parses "host:port", "[v6addr]:port" or "v4addr:port" (a port from 1 to 65535) and resolves
 * the host (getaddrinfo; it may block on name resolution) into *ss and *len_p: 0, or -1 with
 * `why` (cap bytes) saying what is wrong ("expected host:port", "the port must be 1..65535",
 * "cannot resolve host 'x': ..."); outputs untouched then. The one check of
 * MACO_BOOTSTRAP_ADDR: maco__config_validate and maco__sockaddr_parse (the reader) use it.
 */
int maco__parse_address(const char *text, struct sockaddr_storage *ss, unsigned *len_p, char *why,
                        size_t cap);

/**
 * Checks the environment's value of `id` with the parser the library reads it with (the
 * typed parsers above; the logger's for MACO_LOG_LEVEL and MACO_LOG_SUBSYS). Returns MACO_OK
 * when it is unset, empty or valid; else MACO_ERR_INVALID_ARGUMENT with `why` (cap bytes)
 * saying what is wrong and what the variable accepts ("accepts: ..."). Logs nothing.
 */
maco_status_t maco__config_validate(maco__config_id_t id, char *why, size_t cap);

/** The index of variable `name`, or -1 with *closest_p (when not NULL) the nearest name's. */
int maco__config_lookup(const char *name, int *closest_p);

/**
 * Warns once per process about each MACO_* variable of the environment that is not in the
 * table, naming the closest known variable. Returns how many were unknown.
 */
int maco__config_check_environment(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_CONFIG_INTERNAL_H */

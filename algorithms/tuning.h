/*
 * tuning.h - the collectives' measured thresholds and built-in defaults, in one table.
 *
 * A row: NAME (the code uses MACO__TUNING_<NAME>, an int enum constant, in host and device
 * code alike), its value, the unit, what it decides, and the section of docs/performance.md
 * ("Tuning", one subsection per topic) that says how the value was placed: the measurement,
 * the machine, the raw output, or that it is a bound set without a measurement of its own.
 * Changing a value changes behaviour, never correctness: every rank computes the same choices
 * from the same values, and each reader of a row handles any value in its range.
 *
 * Settings a user can change (MACO_ALLREDUCE_ONESHOT_MAX, MACO_HIER_CTAS, MACO_P2P_LANES, ...)
 * keep their defaults in the configuration table (src/host/base/config.h); the rows here are
 * the values that are not settings, or that replace a setting's default in one case. The
 * `tuning` part of test_unit checks that every row's section exists in docs/performance.md.
 *
 * X(NAME, value, unit, what it decides, docs/performance.md section under "Tuning")
 */
#ifndef MACO_ALGORITHMS_TUNING_H
#define MACO_ALGORITHMS_TUNING_H

#define MACO__TUNING_TABLE(X)                                                                      \
    /* ---- the LL kernels */                                                                      \
    X(LL_MAX_TWO_RANKS, 1 << 20, "bytes per rank",                                                 \
      "MACO_ALLREDUCE_ONESHOT_MAX's default in a job of at most 2 ranks (the largest message of "  \
      "the LL kernels; with more ranks the configuration table's 256K stays)",                     \
      "LL kernels up to 1 MiB on two ranks")                                                       \
    X(ALLREDUCE_ONESHOT_CUTOFF, 128 << 10, "bytes",                                                \
      "allreduce: one-shot LL up to this size, two-shot LL above while its scratch holds the "     \
      "call, rsag beyond",                                                                         \
      "One-shot against two-shot LL allreduce")                                                    \
    X(LL_MAX_CTAS, 64, "CTAs",                                                                     \
      "most CTAs of a one-shot or two-shot LL launch (below it about one packet per thread)",      \
      "Bounds without a measurement of their own")                                                 \
    /* ---- the mesh and hier kernels */                                                           \
    X(MESH_PIECE_MIN, 4096, "bytes",                                                               \
      "smallest piece of a mesh kernel's segment where the message allows",                        \
      "Bounds without a measurement of their own")                                                 \
    X(HIER_PIECE_MIN, 4096, "bytes",                                                               \
      "smallest piece of a hier kernel's segment where the message allows",                        \
      "Bounds without a measurement of their own")                                                 \
    X(SHARED_GPU_CTA_DIVISOR, 2, "",                                                               \
      "when ranks share a GPU, a collective or send/recv kernel launches at most the "             \
      "co-resident CTAs divided by this",                                                          \
      "CTAs when ranks share a GPU")                                                               \
    /* ---- all-to-all across nodes */                                                             \
    X(HIER_ALLTOALL_MIN_BLOCK, 512 << 10, "bytes",                                                 \
      "maco_alltoall across nodes runs hier by default from blocks of this size (with "            \
      "HIER_ALLTOALL_MIN_LOCAL_RANKS ranks per node or more), direct below",                       \
      "Hierarchical all-to-all across nodes")                                                      \
    X(HIER_ALLTOALL_MIN_LOCAL_RANKS, 2, "ranks per node",                                          \
      "hier all-to-all by default only with this many ranks per node or more",                     \
      "Hierarchical all-to-all across nodes")                                                      \
    X(HIER_ALLTOALL_RAIL_MESSAGE_MIN, 512 << 10, "bytes",                                          \
      "hier all-to-all: smallest rail message of a segment where the blocks and the region "       \
      "allow (fewer, larger segments)",                                                            \
      "Hierarchical all-to-all across nodes")                                                      \
    /* ---- send/recv and all-to-all */                                                            \
    X(P2P_COPY_CHUNK_MIN, 16 << 10, "bytes",                                                       \
      "copy-mode message spread over its lanes: smallest chunk", "Send/recv chunks and lanes")     \
    X(P2P_COPY_CHUNK_ONE, 256 << 10, "bytes",                                                      \
      "copy-mode message: up to this many bytes per lane one chunk per lane, above it about two "  \
      "(a lane's two slots pipeline)",                                                             \
      "Send/recv chunks and lanes")                                                                \
    X(P2P_AUTO_CHUNK_MIN, 16 << 10, "bytes", "MACO_P2P_CHUNK_SIZE=0: smallest automatic chunk",    \
      "Send/recv chunks and lanes")                                                                \
    X(P2P_AUTO_CHUNK_MAX, 512 << 10, "bytes", "MACO_P2P_CHUNK_SIZE=0: largest automatic chunk",    \
      "Send/recv chunks and lanes")                                                                \
    X(P2P_AUTO_SLOT_BYTES, 64 << 20, "bytes",                                                      \
      "MACO_P2P_CHUNK_SIZE=0: the chunk is halved until the copy slots of every peer and lane "    \
      "fit this",                                                                                  \
      "Send/recv chunks and lanes")                                                                \
    X(P2P_INTERNODE_SLOTS, 4, "chunks",                                                            \
      "send/recv across nodes: chunks a sender may have in flight to one peer (each costs 2 x "    \
      "(16 + MACO_P2P_CHUNK_SIZE) bytes of pinned host memory per peer on another node)",          \
      "Send/recv across nodes")                                                                    \
    /* ---- expert parallelism */                                                                  \
    X(EP_COMBINE_GROUP_TOKENS_MIN, 128, "tokens",                                                  \
      "smallest token group of the combine's pipeline", "Expert parallelism")                      \
    X(EP_DISPATCH_GRAB, 4, "entries",                                                              \
      "normal-mode dispatch: entries a warp takes from the shared counter at a time",              \
      "Expert parallelism")

#define MACO__TUNING_ENUM(name, value, unit, what, section) MACO__TUNING_##name = (value),
enum { MACO__TUNING_TABLE(MACO__TUNING_ENUM) };
#undef MACO__TUNING_ENUM

#endif /* MACO_ALGORITHMS_TUNING_H */

/*
 * launcher.h - who started this process (internal to the bootstrap): launcher.c reads the
 * variables of MACO's own launcher, torchrun, Open MPI, MPICH/Hydra, PMIx and Slurm into one
 * description of the job; pmix.c passes a unique id through the PMIx server of the launcher.
 * env.c (maco_bootstrap_create_from_env) uses both. docs/multi-node.md is the user's side.
 *
 * Which launcher describes the job (the first found, innermost launcher first; MACO_LAUNCHER
 * names one to use alone):
 *   1. maco      MACO_RANK, MACO_WORLD_SIZE [MACO_LOCAL_RANK]: maco-run, or set by hand
 *   2. torchrun  RANK, WORLD_SIZE [LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK]; torchrun's own
 *                when TORCHELASTIC_RUN_ID is set, else set by another tool (Kubernetes'
 *                PyTorchJob, a script)
 *   3. ompi      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (Open MPI's mpirun)
 *   4. mpich     PMI_RANK, PMI_SIZE [MPI_LOCALRANKID, MPI_LOCALNRANKS] (MPICH's Hydra)
 *   5. pmix      PMIX_RANK, PMIX_NAMESPACE; the size from the PMIx server (prterun...)
 *   6. slurm     SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID,
 *                SLURM_NODEID, SLURM_STEP_NUM_NODES, inside a step (SLURM_STEP_ID set)
 * Each later launcher can start an earlier one (torchrun or mpirun inside a Slurm job), so the
 * outer launcher's variables are ignored then. srun --mpi=pmix sets both Slurm's and PMIx's
 * variables: a PMIx namespace of Slurm's own ("slurm.pmix.<job>.<step>") makes it 6, with
 * PMIx as its store. Variables set by hand (1, and 2 without TORCHELASTIC_RUN_ID) are checked
 * against the launcher found after them: a different rank or size is an error naming both
 * (unless MACO_LAUNCHER says whose to use, or MACO_BOOTSTRAP_ADDR is a loopback address: a job
 * on one machine, as maco-run starts inside an interactive srun step). A PMIx server serves
 * the job when PMIX_RANK equals the rank of Open MPI, MPICH, PMIx or Slurm (a different
 * PMIX_RANK is an error naming both).
 */
#ifndef MACO_BOOTSTRAP_LAUNCHER_H
#define MACO_BOOTSTRAP_LAUNCHER_H

#include <stddef.h>

#include "maco/bootstrap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum maco__launcher_kind {
    MACO__LAUNCHER_MACO = 0,
    MACO__LAUNCHER_TORCHRUN,
    MACO__LAUNCHER_OMPI,
    MACO__LAUNCHER_MPICH,
    MACO__LAUNCHER_PMIX,
    MACO__LAUNCHER_SLURM,
    MACO__LAUNCHER_COUNT
} maco__launcher_kind_t;

/* The job as the launcher describes it. Counts and indices are -1 where it does not say. */
typedef struct maco__launcher {
    maco__launcher_kind_t kind;
    int rank, nranks;
    int local_rank, local_size;
    int node, nnodes;
    char rank_var[40], size_var[40]; /* the variables rank and nranks came from */
    int torch_agent; /* torchrun's workers share its agent's store (TORCHELASTIC_USE_AGENT_STORE) */
    int pmix;        /* a PMIx server knows this process as `rank` (PMIX_RANK agrees) */
    int slurm;       /* Slurm's step variables describe this job (SLURM_PROCID agrees) */
} maco__launcher_t;

/* "maco", "torchrun", "ompi", "mpich", "pmix", "slurm". */
const char *maco__launcher_name(maco__launcher_kind_t kind);

/*
 * Reads the environment into *l (rules above). Not blocking, except that a bare PMIx launcher
 * (5) asks its server for the job's size (pmix.c). Errors, each naming the variables:
 * MACO_ERR_INVALID_ARGUMENT (no launcher's variables, one of a pair missing, a malformed
 * value, a rank outside the world, contradictory variables, Slurm's batch script instead of
 * a task, MACO_LAUNCHER naming a launcher whose variables are missing); those of
 * maco__pmix_job_info for a bare PMIx launcher.
 */
maco_status_t maco__launcher_detect(maco__launcher_t *l);

/*
 * The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01"; "r[1-2]-n[3-4]" ->
 * "r1-n3") into out (cap bytes). Returns 0, or -1 for an empty or malformed list (unbalanced
 * brackets) or a name longer than cap - 1.
 */
int maco__slurm_first_host(const char *list, char *out, size_t cap);

/* The tasks on node `node` by a Slurm tasks-per-node list ("2(x3),1": 2 on nodes 0 to 2, 1 on
 * node 3); -1 when the list is malformed or shorter. */
int maco__slurm_tasks_on_node(const char *spec, int node);

/*
 * The job's rank 0 publishes `*id` (rank 0) through the PMIx server of the launcher, every
 * rank waits at a PMIx fence, and the others read it into *id. Keys count this process's
 * exchanges ("maco.unique_id.<n>"), so every rank must make them in the same order.
 * libpmix is loaded at run time (MACO_PMIX_LIBRARY) and initialised once per process; it is
 * finalised at exit. Blocking, bounded by MACO_BOOTSTRAP_TIMEOUT. Errors: MACO_ERR_UNSUPPORTED
 * (libpmix cannot be loaded or lacks a call; PMIx_Init failed: the message says why and what
 * to install), MACO_ERR_TIMEOUT (the fence or the read did not complete in time: a rank did
 * not start), MACO_ERR_REMOTE (the server refused the put, fence or get, or held no id).
 */
maco_status_t maco__pmix_exchange_id(int rank, maco_unique_id_t *id);

/*
 * What the PMIx server says about this process's job: its size, this process's local rank,
 * the number of its processes on this node, its node and the number of nodes (each -1 where
 * the server does not say). Loads and initialises PMIx as maco__pmix_exchange_id does;
 * PMIX_NAMESPACE/PMIX_RANK's process; each value waits 5 s at most. Errors: MACO_ERR_UNSUPPORTED as
 * above.
 */
maco_status_t maco__pmix_job_info(int *size, int *local_rank, int *local_size, int *node,
                                  int *nnodes);

#ifdef __cplusplus
}
#endif

#endif /* MACO_BOOTSTRAP_LAUNCHER_H */

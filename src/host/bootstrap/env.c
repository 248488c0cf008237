/* env.c - starting a bootstrap from the environment: who started the job (launcher.c), how the
 * unique id reaches the ranks (through the launcher's store: torchrun's (torch_store.c) or
 * PMIx (pmix.c); else from rank 0's address and a job nonce that was given, never derived),
 * and the public calls that read the environment. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/bootstrap/launcher.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* How the unique id reaches the ranks, in the order they are tried. */
typedef enum maco__id_source {
    MACO__ID_ADDRESS,     /* MACO_BOOTSTRAP_ADDR or MASTER_ADDR:MASTER_PORT, and the nonce */
    MACO__ID_TORCH_STORE, /* torchrun's agent store (torch_store.c) */
    MACO__ID_PMIX,        /* the launcher's PMIx server (pmix.c) */
    MACO__ID_SLURM_NODE,  /* the first node of the Slurm step, and the nonce */
} maco__id_source_t;

static const char *const maco__id_source_names[] = { "address", "torchrun-store", "pmix",
                                                     "slurm-nodelist" };

typedef struct maco__env_job {
    maco__launcher_t l;
    maco__id_source_t source;
    char addr_text[320];   /* rank 0's (or the store's) address as text */
    const char *addr_what; /* where it came from, for messages */
} maco__env_job_t;

static const char *maco__env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* "host:port", bracketing an IPv6 host. */
static void maco__host_port(char *out, size_t cap, const char *host, const char *port)
{
    if (strchr(host, ':') != NULL && host[0] != '[')
        snprintf(out, cap, "[%s]:%s", host, port);
    else
        snprintf(out, cap, "%s:%s", host, port);
}

static int maco__is_loopback(const maco__sockaddr_t *a)
{
    if (a->ss.ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss.ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
    return 0;
}

/* Rank 0's address from Slurm: the first node of the step and MACO_BOOTSTRAP_PORT (default
 * from the job and step ids). Rank 0 must run there; a name that resolves to loopback cannot
 * serve a step over several nodes. */
static maco_status_t maco__slurm_address(maco__env_job_t *job)
{
    const char *var = "SLURM_STEP_NODELIST";
    const char *list = maco__env(var);
    if (list == NULL)
        list = maco__env(var = "SLURM_JOB_NODELIST");
    if (list == NULL)
        list = maco__env(var = "SLURM_NODELIST");
    char host[256];
    if (list == NULL || maco__slurm_first_host(list, host, sizeof(host)) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "rank 0's host is unknown: %s%s%s is no Slurm host list; set "
                           "MACO_BOOTSTRAP_ADDR to rank 0's host:port",
                           list != NULL ? var : "SLURM_STEP_NODELIST", list != NULL ? "=" : "",
                           list != NULL ? list : " is not set and");
    char port[16];
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_PORT)) {
        int64_t p = 0;
        maco_status_t st = maco__config_int64(MACO_CFG_BOOTSTRAP_PORT, &p);
        if (st != MACO_OK)
            return st;
        snprintf(port, sizeof(port), "%d", (int)p);
    } else {
        int64_t jobid = -1, stepid = -1;
        const char *j = maco__env("SLURM_JOB_ID"), *s = maco__env("SLURM_STEP_ID");
        if (s == NULL)
            s = maco__env("SLURM_STEPID");
        if (j == NULL || s == NULL || maco__parse_int(j, &jobid) != 0 ||
            maco__parse_int(s, &stepid) != 0 || jobid < 0 || stepid < 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "SLURM_JOB_ID='%s' and SLURM_STEP_ID='%s' do not give rank 0's "
                               "port: set MACO_BOOTSTRAP_PORT",
                               j != NULL ? j : "", s != NULL ? s : "");
        snprintf(port, sizeof(port), "%d", 20000 + (int)((jobid * 16 + stepid) % 10000));
    }
    maco__host_port(job->addr_text, sizeof(job->addr_text), host, port);
    job->addr_what = "the first node of the Slurm step and MACO_BOOTSTRAP_PORT";
    if (job->l.rank == 0 && job->l.node > 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "rank 0 runs on node %d of the step (SLURM_NODEID), not on its first "
                           "node %s where the other ranks look for it: set MACO_BOOTSTRAP_ADDR, "
                           "or use srun --mpi=pmix",
                           job->l.node, host);
    return MACO_OK;
}

/* The id source when there is neither an address nor a store: what to add. */
static maco_status_t maco__no_id_source(const maco__launcher_t *l)
{
    const char *name = maco__launcher_name(l->kind);
    if (l->kind == MACO__LAUNCHER_MACO || l->kind == MACO__LAUNCHER_TORCHRUN)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "MACO_BOOTSTRAP_ADDR is not set, nor are MASTER_ADDR and "
                           "MASTER_PORT: rank 0's address is unknown");
    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                       "launcher %s offers no PMIx server (PMIX_RANK and PMIX_NAMESPACE are not "
                       "set) to pass the unique id, and MACO_BOOTSTRAP_ADDR is not set: start "
                       "the job with a launcher that runs PMIx (Open MPI's mpirun, srun "
                       "--mpi=pmix), or give every rank MACO_BOOTSTRAP_ADDR (rank 0's host and a "
                       "free port) and MACO_BOOTSTRAP_NONCE (the same random 16 hex digits; "
                       "mpiexec -genv passes both) (docs/multi-node.md)",
                       name);
}

/* The job nonce for the address sources; never derived (a process that could compute it
 * could take a rank). */
static maco_status_t maco__env_nonce(const maco__env_job_t *job, uint64_t *nonce_p)
{
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_NONCE)) {
        const char *text = maco__config_string(MACO_CFG_BOOTSTRAP_NONCE);
        if (maco__parse_nonce(text, nonce_p) != 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_BOOTSTRAP_NONCE='%s' is invalid: it accepts 1 to 16 hex "
                               "digits (no sign, no 0x)",
                               text);
        return MACO_OK;
    }
    if (job->source == MACO__ID_SLURM_NODE)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "MACO_BOOTSTRAP_NONCE is not set and this Slurm step offers no PMIx "
                           "server (PMIX_RANK is not set) to pass the unique id: start the step "
                           "with srun --mpi=pmix (the PMIx runtime, libpmix2, on the nodes), or "
                           "export MACO_BOOTSTRAP_NONCE=$(openssl rand -hex 8) in the batch "
                           "script before srun (rank 0 is then found on the step's first node; "
                           "docs/multi-node.md)");
    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                       "MACO_BOOTSTRAP_NONCE is not set: every rank of a job started from "
                       "the environment needs the same random job nonce (1 to 16 hex "
                       "digits, e.g. from `openssl rand -hex 8`), so that no other process "
                       "can take a rank. maco-run sets it; torchrun's agent store "
                       "(TORCHELASTIC_USE_AGENT_STORE=True) and PMIx (mpirun, srun "
                       "--mpi=pmix) carry one that MACO draws; other launchers must export it "
                       "to all ranks (docs/multi-node.md)");
}

/* Who started the job and how the id will travel; nothing sent yet. */
static maco_status_t maco__env_job_read(maco__env_job_t *job)
{
    memset(job, 0, sizeof(*job));
    maco_status_t st = maco__launcher_detect(&job->l);
    if (st != MACO_OK)
        return st;
    const maco__launcher_t *l = &job->l;
    if (l->nranks > MACO_MAX_RANKS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s=%d is out of range: a job has 1 to %d ranks (MACO_MAX_RANKS: the "
                           "bootstrap keeps a connection to every other rank)",
                           l->size_var, l->nranks, MACO_MAX_RANKS);
    int torch_vars = l->kind == MACO__LAUNCHER_MACO || l->kind == MACO__LAUNCHER_TORCHRUN;
    const char *host = maco__env("MASTER_ADDR"), *port = maco__env("MASTER_PORT");
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_ADDR)) {
        job->source = MACO__ID_ADDRESS;
        snprintf(job->addr_text, sizeof(job->addr_text), "%s",
                 maco__config_string(MACO_CFG_BOOTSTRAP_ADDR));
        job->addr_what = "MACO_BOOTSTRAP_ADDR";
    } else if (torch_vars && host != NULL && port != NULL && maco__torch_store_wanted()) {
        /* torchrun's agent holds MASTER_PORT (its store): the id travels through that store. */
        job->source = MACO__ID_TORCH_STORE;
        maco__host_port(job->addr_text, sizeof(job->addr_text), host, port);
        job->addr_what = "MASTER_ADDR:MASTER_PORT";
    } else if (l->pmix) {
        job->source = MACO__ID_PMIX;
    } else if (torch_vars && host != NULL && port != NULL) {
        job->source = MACO__ID_ADDRESS;
        maco__host_port(job->addr_text, sizeof(job->addr_text), host, port);
        job->addr_what = "MASTER_ADDR:MASTER_PORT";
    } else if (l->slurm) {
        job->source = MACO__ID_SLURM_NODE;
    } else {
        return maco__no_id_source(l);
    }
    if (job->source == MACO__ID_ADDRESS || job->source == MACO__ID_SLURM_NODE) {
        uint64_t nonce;
        st = maco__env_nonce(job, &nonce);
        if (st == MACO_OK && job->source == MACO__ID_SLURM_NODE)
            st = maco__slurm_address(job);
        if (st != MACO_OK)
            return st;
    }
    if (job->source == MACO__ID_PMIX && (job->l.node < 0 || job->l.nnodes < 0)) {
        int size, local_rank, local_size, node, nnodes;
        st = maco__pmix_job_info(&size, &local_rank, &local_size, &node, &nnodes);
        if (st != MACO_OK)
            return st;
        job->l.node = job->l.node < 0 ? node : job->l.node;
        job->l.nnodes = job->l.nnodes < 0 ? nnodes : job->l.nnodes;
    }
    return MACO_OK;
}

/* The INFO line: "launcher slurm: rank 5 of 16, node 1 of 4, local rank 1; unique id ...". */
static void maco__env_job_log(const maco__env_job_t *job)
{
    const maco__launcher_t *l = &job->l;
    char where[128] = "", local[64] = "";
    if (l->node >= 0 && l->nnodes > 0)
        snprintf(where, sizeof(where), ", node %d of %d", l->node, l->nnodes);
    else if (l->nnodes > 0)
        snprintf(where, sizeof(where), ", %d nodes", l->nnodes);
    if (l->local_rank >= 0 && l->local_size > 0)
        snprintf(local, sizeof(local), ", local rank %d of %d", l->local_rank, l->local_size);
    else if (l->local_rank >= 0)
        snprintf(local, sizeof(local), ", local rank %d", l->local_rank);
    char how[400];
    switch (job->source) {
    case MACO__ID_TORCH_STORE:
        snprintf(how, sizeof(how), "through torchrun's store at %s", job->addr_text);
        break;
    case MACO__ID_PMIX:
        snprintf(how, sizeof(how), "through PMIx (namespace %s)", getenv("PMIX_NAMESPACE"));
        break;
    default:
        snprintf(how, sizeof(how), "rank 0 at %s (%s) with MACO_BOOTSTRAP_NONCE", job->addr_text,
                 job->addr_what);
        break;
    }
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "launcher %s: rank %d of %d%s%s (%s, %s); unique id %s",
              maco__launcher_name(l->kind), l->rank, l->nranks, where, local, l->rank_var,
              l->size_var, how);
}

/* The unique id by the job's source: made here from the address and the nonce, or made by
 * rank 0 and passed through the launcher's store. */
static maco_status_t maco__env_unique_id(const maco__env_job_t *job, maco_unique_id_t *id)
{
    maco__sockaddr_t root;
    maco_status_t st;
    if (job->source == MACO__ID_PMIX) {
        if (job->l.rank == 0) {
            st = maco_unique_id_create(id);
            if (st != MACO_OK)
                return st;
        }
        st = maco__pmix_exchange_id(job->l.rank, id);
        if (st != MACO_OK && job->l.rank == 0) {
            uint64_t nonce;
            if (maco__unique_id_decode(id, &nonce, &root) == MACO_OK) {
                int fd = maco__take_root_socket(nonce);
                if (fd >= 0)
                    close(fd);
            }
        }
        return st;
    }
    st = maco__sockaddr_parse(job->addr_text, job->addr_what, &root);
    if (st != MACO_OK)
        return st;
    if (job->source == MACO__ID_TORCH_STORE)
        return maco__torch_store_unique_id(&root, job->addr_text, job->l.rank, id);
    if (job->source == MACO__ID_SLURM_NODE && job->l.nnodes > 1 && maco__is_loopback(&root))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "rank 0's host %s resolves to a loopback address here, which the "
                           "other nodes of the step cannot reach: set MACO_BOOTSTRAP_ADDR to an "
                           "address of rank 0's node, or use srun --mpi=pmix",
                           job->addr_text);
    uint64_t nonce = 0;
    st = maco__env_nonce(job, &nonce);
    if (st != MACO_OK)
        return st;
    maco__unique_id_encode(id, nonce, &root);
    return MACO_OK;
}

maco_status_t maco_launch_info_from_env(maco_launch_info_t *info_p)
{
    if (info_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_launch_info_from_env: info_p is NULL");
    maco__env_job_t job;
    maco_status_t st = maco__env_job_read(&job);
    if (st != MACO_OK)
        return st;
    maco_launch_info_t info;
    memset(&info, 0, sizeof(info));
    snprintf(info.launcher, sizeof(info.launcher), "%s", maco__launcher_name(job.l.kind));
    snprintf(info.id_source, sizeof(info.id_source), "%s", maco__id_source_names[job.source]);
    info.rank = job.l.rank;
    info.world_size = job.l.nranks;
    info.local_rank = job.l.local_rank;
    info.local_size = job.l.local_size;
    info.node = job.l.node;
    info.num_nodes = job.l.nnodes;
    *info_p = info;
    return MACO_OK;
}

maco_status_t maco_unique_id_from_env(maco_unique_id_t *id_p, int *rank_p, int *nranks_p)
{
    if (id_p == NULL || rank_p == NULL || nranks_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_unique_id_from_env: %s is NULL",
                           id_p == NULL     ? "id_p"
                           : rank_p == NULL ? "rank_p"
                                            : "nranks_p");
    maco__env_job_t job;
    maco_status_t st = maco__env_job_read(&job);
    if (st != MACO_OK)
        return st;
    maco__env_job_log(&job);
    maco_unique_id_t id;
    st = maco__env_unique_id(&job, &id);
    if (st != MACO_OK)
        return st;
    *id_p = id;
    *rank_p = job.l.rank;
    *nranks_p = job.l.nranks;
    return MACO_OK;
}

maco_status_t maco_bootstrap_create_from_env(maco_bootstrap_t *bs_p)
{
    if (bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create_from_env: bs_p is NULL");
    maco_unique_id_t id;
    int rank = -1, nranks = 0;
    maco_status_t st = maco_unique_id_from_env(&id, &rank, &nranks);
    if (st != MACO_OK)
        return st;
    return maco_bootstrap_create(&id, rank, nranks, -1, bs_p);
}

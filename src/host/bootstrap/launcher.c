/* launcher.c - see launcher.h: the launchers' variables read into one description of the job. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/host/bootstrap/launcher.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"

static const char *const maco__launcher_names[MACO__LAUNCHER_COUNT] = {
    "maco", "torchrun", "ompi", "mpich", "pmix", "slurm",
};
/* Whose variables they are, for messages. */
static const char *const maco__launcher_owners[MACO__LAUNCHER_COUNT] = {
    "MACO's", "torchrun's", "Open MPI's", "MPICH's", "PMIx's", "Slurm's",
};

const char *maco__launcher_name(maco__launcher_kind_t kind)
{
    return kind >= 0 && kind < MACO__LAUNCHER_COUNT ? maco__launcher_names[kind] : "none";
}

/* One launcher's variables as found. */
typedef struct maco__cand {
    maco__launcher_t l;
    int present;                    /* some of its variables are set */
    const char *missing;            /* a variable it needs that is not set, or NULL */
    const char *bad_var, *bad_text; /* a variable that is no non-negative integer, or NULL */
    int launched;                   /* torchrun: started by torchrun itself (TORCHELASTIC_RUN_ID) */
    int in_step; /* slurm: a task of a step (SLURM_STEP_ID), not the batch script */
} maco__cand_t;

/* The value of variable `name`, NULL when unset or empty. */
static const char *maco__lenv(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* Reads `name` as a non-negative int into *v: 1 when read; 0 when unset, or when malformed
 * (then noted in c->bad_var for a message, if it is c's first). `mark`: a set variable makes
 * the launcher present. */
static int maco__cand_int(maco__cand_t *c, const char *name, int *v, int mark)
{
    const char *t = maco__lenv(name);
    if (t == NULL)
        return 0;
    if (mark)
        c->present = 1;
    int64_t x;
    if (maco__parse_int(t, &x) != 0 || x < 0 || x > INT32_MAX) {
        if (c->bad_var == NULL) {
            c->bad_var = name;
            c->bad_text = t;
        }
        return 0;
    }
    *v = (int)x;
    return 1;
}

/* The first of `names` (NULL-terminated) that is set, read into *v; its name, or NULL. */
static const char *maco__cand_first_int(maco__cand_t *c, const char *const *names, int *v, int mark)
{
    for (; *names != NULL; names++)
        if (maco__lenv(*names) != NULL) {
            maco__cand_int(c, *names, v, mark);
            return *names;
        }
    return NULL;
}

/* The rank and the size from two variables; either one makes the launcher present. */
static void maco__cand_pair(maco__cand_t *c, const char *rank_var, const char *size_var)
{
    snprintf(c->l.rank_var, sizeof(c->l.rank_var), "%s", rank_var);
    snprintf(c->l.size_var, sizeof(c->l.size_var), "%s", size_var);
    maco__cand_int(c, rank_var, &c->l.rank, 1);
    maco__cand_int(c, size_var, &c->l.nranks, 1);
    if (maco__lenv(rank_var) == NULL)
        c->missing = rank_var;
    else if (maco__lenv(size_var) == NULL)
        c->missing = size_var;
}

static void maco__cand_read(maco__cand_t *c, maco__launcher_kind_t kind)
{
    memset(c, 0, sizeof(*c));
    c->l.kind = kind;
    c->l.rank = c->l.nranks = c->l.local_rank = c->l.local_size = c->l.node = c->l.nnodes = -1;
    switch (kind) {
    case MACO__LAUNCHER_MACO:
        maco__cand_pair(c, "MACO_RANK", "MACO_WORLD_SIZE");
        maco__cand_int(c, "MACO_LOCAL_RANK", &c->l.local_rank, 0);
        break;
    case MACO__LAUNCHER_TORCHRUN: {
        maco__cand_pair(c, "RANK", "WORLD_SIZE");
        /* Generic names: only both together are taken for a job description. */
        c->present = c->missing == NULL;
        maco__cand_int(c, "LOCAL_RANK", &c->l.local_rank, 0);
        maco__cand_int(c, "LOCAL_WORLD_SIZE", &c->l.local_size, 0);
        maco__cand_int(c, "GROUP_RANK", &c->l.node, 0);
        maco__cand_int(c, "GROUP_WORLD_SIZE", &c->l.nnodes, 0);
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        c->l.torch_agent = agent != NULL && strcasecmp(agent, "true") == 0;
        c->launched = maco__lenv("TORCHELASTIC_RUN_ID") != NULL;
        break;
    }
    case MACO__LAUNCHER_OMPI:
        maco__cand_pair(c, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
        maco__cand_int(c, "OMPI_COMM_WORLD_LOCAL_RANK", &c->l.local_rank, 0);
        maco__cand_int(c, "OMPI_COMM_WORLD_LOCAL_SIZE", &c->l.local_size, 0);
        maco__cand_int(c, "OMPI_MCA_orte_num_nodes", &c->l.nnodes, 0);
        break;
    case MACO__LAUNCHER_MPICH:
        maco__cand_pair(c, "PMI_RANK", "PMI_SIZE");
        maco__cand_int(c, "MPI_LOCALRANKID", &c->l.local_rank, 0);
        maco__cand_int(c, "MPI_LOCALNRANKS", &c->l.local_size, 0);
        break;
    case MACO__LAUNCHER_PMIX:
        snprintf(c->l.rank_var, sizeof(c->l.rank_var), "PMIX_RANK");
        snprintf(c->l.size_var, sizeof(c->l.size_var), "the PMIx job size");
        maco__cand_int(c, "PMIX_RANK", &c->l.rank, 1);
        if (maco__lenv("PMIX_NAMESPACE") == NULL)
            c->missing = "PMIX_NAMESPACE";
        if (maco__lenv("PMIX_RANK") == NULL)
            c->missing = "PMIX_RANK";
        break;
    case MACO__LAUNCHER_SLURM: {
        static const char *const sizes[] = { "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
                                             NULL };
        static const char *const nodes[] = { "SLURM_STEP_NUM_NODES", "SLURM_NNODES", NULL };
        snprintf(c->l.rank_var, sizeof(c->l.rank_var), "SLURM_PROCID");
        maco__cand_int(c, "SLURM_PROCID", &c->l.rank, 1);
        const char *size = maco__cand_first_int(c, sizes, &c->l.nranks, 0);
        snprintf(c->l.size_var, sizeof(c->l.size_var), "%s", size != NULL ? size : sizes[0]);
        if (size == NULL)
            c->missing = sizes[0];
        if (maco__lenv("SLURM_PROCID") == NULL)
            c->missing = "SLURM_PROCID";
        maco__cand_int(c, "SLURM_LOCALID", &c->l.local_rank, 0);
        maco__cand_int(c, "SLURM_NODEID", &c->l.node, 0);
        maco__cand_first_int(c, nodes, &c->l.nnodes, 0);
        const char *per_node = maco__lenv("SLURM_STEP_TASKS_PER_NODE");
        if (per_node != NULL && c->l.node >= 0)
            c->l.local_size = maco__slurm_tasks_on_node(per_node, c->l.node);
        c->in_step = maco__lenv("SLURM_STEP_ID") != NULL || maco__lenv("SLURM_STEPID") != NULL;
        break;
    }
    default:
        break;
    }
}

/* The candidate's own faults: a malformed or missing variable, a rank outside the world. */
static maco_status_t maco__cand_check(const maco__cand_t *c)
{
    const char *who = maco__launcher_owners[c->l.kind];
    if (c->bad_var != NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s='%s' is not a non-negative integer (%s variables describe this job)",
                           c->bad_var, c->bad_text, who);
    if (c->missing != NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s is set but %s is not: %s variables describe a job only together "
                           "(maco-run, torchrun, mpirun and srun set them all)",
                           strcmp(c->missing, c->l.rank_var) == 0 ? c->l.size_var : c->l.rank_var,
                           c->missing, who);
    if (c->l.nranks >= 0 && (c->l.nranks < 1 || c->l.rank >= c->l.nranks))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s=%d with %s=%d: the world size must be at least 1 and the rank "
                           "from 0 to world size - 1",
                           c->l.rank_var, c->l.rank, c->l.size_var, c->l.nranks);
    return MACO_OK;
}

/* Whether candidate k describes a job by itself (present, complete, inside a Slurm step). */
static int maco__cand_usable(const maco__cand_t *c)
{
    if (!c->present || c->missing != NULL || c->bad_var != NULL)
        return 0;
    return c->l.kind != MACO__LAUNCHER_SLURM || c->in_step;
}

/* Whether MACO_BOOTSTRAP_ADDR names a loopback host (127.x.x.x, localhost, [::1]): a job on
 * one machine, as maco-run starts, maybe inside another launcher's job (an interactive srun
 * step), which then does not describe it. */
static int maco__on_one_machine(void)
{
    const char *a = maco__lenv("MACO_BOOTSTRAP_ADDR");
    if (a == NULL)
        return 0;
    return strncmp(a, "127.", 4) == 0 || strncmp(a, "localhost:", 10) == 0 ||
           strncmp(a, "[::1]:", 6) == 0;
}

/* Variables set by hand (MACO's, or RANK/WORLD_SIZE without torchrun) must agree with the
 * launcher found after them; that launcher's store and node list then serve the job too. */
static maco_status_t maco__cross_check(maco__launcher_t *l, const maco__cand_t *outer)
{
    const maco__launcher_t *o = &outer->l;
    int size_known = o->kind != MACO__LAUNCHER_PMIX;
    if (o->rank != l->rank || (size_known && o->nranks != l->nranks)) {
        char theirs[160];
        if (size_known)
            snprintf(theirs, sizeof(theirs), "%s=%d and %s=%d", o->rank_var, o->rank, o->size_var,
                     o->nranks);
        else
            snprintf(theirs, sizeof(theirs), "%s=%d", o->rank_var, o->rank);
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s=%d and %s=%d disagree with %s %s: unset %s and %s (MACO reads %s "
                           "variables itself), or set MACO_LAUNCHER=%s to use them alone",
                           l->rank_var, l->rank, l->size_var, l->nranks,
                           maco__launcher_owners[o->kind], theirs, l->rank_var, l->size_var,
                           maco__launcher_owners[o->kind], maco__launcher_names[l->kind]);
    }
    if (l->local_rank < 0)
        l->local_rank = o->local_rank;
    if (l->local_size < 0)
        l->local_size = o->local_size;
    if (l->node < 0)
        l->node = o->node;
    if (l->nnodes < 0)
        l->nnodes = o->nnodes;
    return MACO_OK;
}

/* No launcher's variables: what MACO reads, and Slurm's batch script as a special case. */
static maco_status_t maco__no_launcher(const maco__cand_t *c)
{
    const maco__cand_t *slurm = &c[MACO__LAUNCHER_SLURM];
    if (slurm->present && !slurm->in_step)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "SLURM_PROCID is set but SLURM_STEP_ID is not: this is Slurm's batch "
                           "script, not a task of a step; start the ranks with srun (srun "
                           "--mpi=pmix ./program; docs/multi-node.md)");
    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                       "no launcher's variables describe this job: MACO reads MACO_RANK and "
                       "MACO_WORLD_SIZE (maco-run), RANK and WORLD_SIZE (torchrun), "
                       "OMPI_COMM_WORLD_RANK and _SIZE (Open MPI's mpirun), PMI_RANK and PMI_SIZE "
                       "(MPICH), PMIX_RANK (PMIx) or SLURM_PROCID (srun); none is set. Start the "
                       "ranks with one of those (docs/multi-node.md)");
}

/* The chosen launcher's rank where a PMIx server may know it: PMIX_RANK must agree. */
static maco_status_t maco__pmix_check(maco__launcher_t *l, maco__launcher_kind_t base)
{
    if (base != MACO__LAUNCHER_OMPI && base != MACO__LAUNCHER_MPICH &&
        base != MACO__LAUNCHER_PMIX && base != MACO__LAUNCHER_SLURM)
        return MACO_OK;
    const char *text = maco__lenv("PMIX_RANK");
    if (text == NULL || maco__lenv("PMIX_NAMESPACE") == NULL)
        return MACO_OK;
    int64_t r;
    if (maco__parse_int(text, &r) != 0 || r != l->rank)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "PMIX_RANK='%s' disagrees with %s=%d: the PMIx server of this process "
                           "knows another process (variables left from an enclosing job?); set "
                           "MACO_LAUNCHER to the launcher that started this process",
                           text, l->rank_var, l->rank);
    l->pmix = 1;
    return MACO_OK;
}

maco_status_t maco__launcher_detect(maco__launcher_t *out)
{
    maco__cand_t c[MACO__LAUNCHER_COUNT];
    for (int k = 0; k < MACO__LAUNCHER_COUNT; k++)
        maco__cand_read(&c[k], (maco__launcher_kind_t)k);
    const char *forced = NULL;
    maco_status_t st = maco__config_word(MACO_CFG_LAUNCHER, &forced);
    if (st != MACO_OK)
        return st;
    int chosen = -1, is_forced = strcasecmp(forced, "auto") != 0;
    if (is_forced) {
        for (int k = 0; k < MACO__LAUNCHER_COUNT; k++)
            if (strcasecmp(forced, maco__launcher_names[k]) == 0)
                chosen = k;
        if (chosen < 0) /* maco__config_word checked the word: not reached */
            return maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_LAUNCHER='%s' names no launcher", forced);
        if (!c[chosen].present || c[chosen].missing != NULL)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_LAUNCHER=%s but %s is not set", forced,
                               c[chosen].missing != NULL ? c[chosen].missing
                                                         : c[chosen].l.rank_var);
    } else {
        /* srun --mpi=pmix runs a PMIx server of Slurm's own (namespace "slurm.pmix.<job>.<step>"):
         * then Slurm's variables describe the job and PMIx is its store; any other PMIx
         * server (prterun inside a Slurm job) started the process itself. */
        const char *ns = maco__lenv("PMIX_NAMESPACE");
        int slurm_pmix = ns != NULL && strncmp(ns, "slurm.pmix.", 11) == 0 &&
                         c[MACO__LAUNCHER_SLURM].present && c[MACO__LAUNCHER_SLURM].in_step;
        for (int k = 0; k < MACO__LAUNCHER_COUNT && chosen < 0; k++)
            if (c[k].present && (k != MACO__LAUNCHER_SLURM || c[k].in_step) &&
                (k != MACO__LAUNCHER_PMIX || !slurm_pmix))
                chosen = k;
        if (chosen < 0)
            return maco__no_launcher(c);
    }
    st = maco__cand_check(&c[chosen]);
    if (st != MACO_OK)
        return st;
    maco__launcher_t l = c[chosen].l;
    if (chosen == MACO__LAUNCHER_SLURM && !c[chosen].in_step)
        return maco__no_launcher(c);
    maco__launcher_kind_t base = (maco__launcher_kind_t)chosen;
    int by_hand = (chosen == MACO__LAUNCHER_MACO && !maco__on_one_machine()) ||
                  (chosen == MACO__LAUNCHER_TORCHRUN && !c[chosen].launched);
    if (by_hand && !is_forced) {
        for (int k = chosen + 1; k < MACO__LAUNCHER_COUNT; k++)
            if (maco__cand_usable(&c[k])) {
                st = maco__cross_check(&l, &c[k]);
                if (st != MACO_OK)
                    return st;
                base = (maco__launcher_kind_t)k;
                break;
            }
    }
    if (chosen == MACO__LAUNCHER_PMIX) {
        int size = -1, local_rank = -1, local_size = -1, node = -1, nnodes = -1;
        st = maco__pmix_job_info(&size, &local_rank, &local_size, &node, &nnodes);
        if (st != MACO_OK)
            return st;
        if (size < 1 || l.rank >= size)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "PMIX_RANK=%d but the PMIx server says the job has %d processes",
                               l.rank, size);
        l.nranks = size;
        l.local_rank = local_rank;
        l.local_size = local_size;
        l.node = node;
        l.nnodes = nnodes;
    }
    st = maco__pmix_check(&l, base);
    if (st != MACO_OK)
        return st;
    l.slurm = base == MACO__LAUNCHER_SLURM;
    *out = l;
    return MACO_OK;
}

int maco__slurm_tasks_on_node(const char *spec, int node)
{
    /* "2(x3),1": 2 tasks on each of 3 nodes, then 1. */
    const char *p = spec;
    int first = 0, found = -1;
    while (*p != '\0') {
        char *end;
        long tasks = strtol(p, &end, 10), times = 1;
        if (end == p || tasks < 0 || tasks > INT32_MAX)
            return -1;
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1 || times > INT32_MAX)
                return -1;
            p = end + 1;
        }
        if (found < 0 && node >= first && node - first < times)
            found = (int)tasks;
        first = times > INT32_MAX - first ? INT32_MAX : first + (int)times;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
    }
    return found;
}

int maco__slurm_first_host(const char *list, char *out, size_t cap)
{
    size_t n = 0;
    int depth = 0, in_first = 0;
    for (const char *p = list; *p != '\0'; p++) {
        char ch = *p;
        if (ch == '[') {
            if (depth++ != 0)
                return -1;
            in_first = 1;
            continue;
        }
        if (ch == ']') {
            if (depth-- != 1)
                return -1;
            in_first = 0;
            continue;
        }
        if (depth == 0 && ch == ',')
            break;
        if (depth == 1 && (ch == ',' || ch == '-'))
            in_first = 0;
        if (depth == 1 && !in_first)
            continue;
        if (n + 1 >= cap)
            return -1;
        out[n++] = ch;
    }
    if (depth != 0 || n == 0)
        return -1;
    out[n] = '\0';
    return 0;
}

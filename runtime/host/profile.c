/*
 * profile.c - the persistent kernel's profile written for people: a Chrome trace (the
 * trace-event format's complete events, "ph":"X", one lane per CTA; Google's "Trace Event
 * Format" document) and a summary table per operation.
 *
 * Overlap of an operation = |busy(op) ∩ busy(other role)| / |busy(op)|, where busy() is the
 * union of task intervals (an operation's own tasks; all tasks of the other role: compute vs
 * communication).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

typedef struct maco__span {
    uint64_t a, b;
} maco__span_t;

static int maco__span_cmp(const void *x, const void *y)
{
    const maco__span_t *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* Sorts and merges spans in place; returns how many disjoint spans remain. */
static size_t maco__merge(maco__span_t *s, size_t n)
{
    if (n == 0)
        return 0;
    qsort(s, n, sizeof(*s), maco__span_cmp);
    size_t m = 0;
    for (size_t i = 1; i < n; i++) {
        if (s[i].a <= s[m].b) {
            if (s[i].b > s[m].b)
                s[m].b = s[i].b;
        } else {
            s[++m] = s[i];
        }
    }
    return m + 1;
}

static uint64_t maco__total(const maco__span_t *s, size_t n)
{
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += s[i].b - s[i].a;
    return t;
}

/* Length of the intersection of two merged span lists. */
static uint64_t maco__intersect(const maco__span_t *x, size_t nx, const maco__span_t *y, size_t ny)
{
    uint64_t t = 0;
    size_t i = 0, j = 0;
    while (i < nx && j < ny) {
        uint64_t a = x[i].a > y[j].a ? x[i].a : y[j].a;
        uint64_t b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (a < b)
            t += b - a;
        if (x[i].b < y[j].b)
            i++;
        else
            j++;
    }
    return t;
}

typedef struct maco__prof {
    maco_persistent_kernel_t k;
    maco_task_profile_t *rec;
    uint32_t n;
    uint64_t t0, t1; /* first start, last end over the tasks that ran */
} maco__prof_t;

static maco_status_t maco__prof_load(maco_persistent_kernel_t k, const char *fn, maco__prof_t *p)
{
    memset(p, 0, sizeof(*p));
    if (k == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: kernel is NULL",
                           fn);
    p->k = k;
    p->n = maco__pk_ntasks(k);
    p->rec = malloc(p->n * sizeof(*p->rec));
    if (p->rec == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", fn);
    maco_status_t st = maco__pk_profile_read(k, fn, p->rec, p->n);
    if (st != MACO_OK) {
        free(p->rec);
        p->rec = NULL;
        return st;
    }
    p->t0 = ~0ull;
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->rec[i].end_ns == 0)
            continue; /* never ran */
        if (p->rec[i].start_ns < p->t0)
            p->t0 = p->rec[i].start_ns;
        if (p->rec[i].end_ns > p->t1)
            p->t1 = p->rec[i].end_ns;
    }
    if (p->t0 == ~0ull)
        p->t0 = 0;
    return MACO_OK;
}

static void maco__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

maco_status_t maco_persistent_kernel_write_trace(maco_persistent_kernel_t k, const char *path)
{
    const char *fn = "maco_persistent_kernel_write_trace";
    if (path == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: path is NULL", fn);
    maco__prof_t p;
    maco_status_t st = maco__prof_load(k, fn, &p);
    if (st != MACO_OK)
        return st;
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PERSIST, "%s: cannot open %s: %s", fn, path,
                         strerror(errno));
        free(p.rec);
        return st;
    }
    maco_persistent_config_t c;
    maco_persistent_kernel_get_config(k, &c);
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    int ncta = c.workers + c.comm_workers;
    for (int cta = 0; cta < ncta; cta++)
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":"
                "\"%s %d\"}},\n",
                cta, cta < c.workers ? "worker" : "comm worker",
                cta < c.workers ? cta : cta - c.workers);
    int first = 1;
    for (uint32_t i = 0; i < p.n; i++) {
        const maco_task_profile_t *r = &p.rec[i];
        if (r->end_ns == 0)
            continue;
        fprintf(f, "%s{\"name\":", first ? "" : ",\n");
        first = 0;
        maco__json_string(f, maco__pk_label(k, i));
        fprintf(f,
                ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"task\":%u,\"sm\":%d}}",
                maco__pk_role(k, i) == MACO_PK_ROLE_COMM ? "comm" : "compute", r->cta,
                (double)(r->start_ns - p.t0) / 1e3, (double)(r->end_ns - r->start_ns) / 1e3, i,
                r->sm);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0)
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PERSIST, "%s: writing %s failed: %s", fn,
                         path, strerror(errno));
    free(p.rec);
    return st;
}

static int maco__label_cmp(const void *x, const void *y, void *kernel)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    maco_persistent_kernel_t k = kernel;
    int c = strcmp(maco__pk_label(k, a), maco__pk_label(k, b));
    return c != 0 ? c : (a < b ? -1 : a > b);
}

maco_status_t maco_persistent_kernel_print_summary(maco_persistent_kernel_t k, FILE *out)
{
    const char *fn = "maco_persistent_kernel_print_summary";
    if (out == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: out is NULL", fn);
    maco__prof_t p;
    maco_status_t st = maco__prof_load(k, fn, &p);
    if (st != MACO_OK)
        return st;
    uint32_t n = p.n;
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    maco__span_t *role_sp[2] = { malloc(n * sizeof(maco__span_t)),
                                 malloc(n * sizeof(maco__span_t)) };
    maco__span_t *op_sp = malloc(n * sizeof(maco__span_t));
    char *sms = calloc(1024, 1);
    if (idx == NULL || role_sp[0] == NULL || role_sp[1] == NULL || op_sp == NULL || sms == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", fn);
        goto out;
    }
    size_t nrole[2] = { 0, 0 };
    uint32_t nran = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p.rec[i].end_ns == 0)
            continue;
        int r = maco__pk_role(k, i) == MACO_PK_ROLE_COMM;
        role_sp[r][nrole[r]].a = p.rec[i].start_ns;
        role_sp[r][nrole[r]++].b = p.rec[i].end_ns;
        idx[nran++] = i;
    }
    nrole[0] = maco__merge(role_sp[0], nrole[0]);
    nrole[1] = maco__merge(role_sp[1], nrole[1]);
    qsort_r(idx, nran, sizeof(uint32_t), maco__label_cmp, k);
    fprintf(out, "%-24s %7s %10s %10s %9s %5s\n", "operation", "tasks", "time(ms)", "busy(ms)",
            "overlap%", "SMs");
    for (uint32_t g = 0; g < nran;) {
        const char *label = maco__pk_label(k, idx[g]);
        uint32_t e = g;
        uint64_t a = ~0ull, b = 0;
        int role = maco__pk_role(k, idx[g]) == MACO_PK_ROLE_COMM;
        memset(sms, 0, 1024);
        int nsm = 0;
        size_t nop = 0;
        while (e < nran && strcmp(maco__pk_label(k, idx[e]), label) == 0) {
            const maco_task_profile_t *r = &p.rec[idx[e]];
            if (r->start_ns < a)
                a = r->start_ns;
            if (r->end_ns > b)
                b = r->end_ns;
            if (r->sm >= 0 && r->sm < 1024 && !sms[r->sm]) {
                sms[r->sm] = 1;
                nsm++;
            }
            op_sp[nop].a = r->start_ns;
            op_sp[nop++].b = r->end_ns;
            e++;
        }
        nop = maco__merge(op_sp, nop);
        uint64_t busy = maco__total(op_sp, nop);
        uint64_t ov = maco__intersect(op_sp, nop, role_sp[!role], nrole[!role]);
        fprintf(out, "%-24.24s %7u %10.4f %10.4f %8.1f%% %5d\n", label, e - g,
                (double)(b - a) / 1e6, (double)busy / 1e6,
                busy ? 100.0 * (double)ov / (double)busy : 0.0, nsm);
        g = e;
    }
    uint64_t comp = maco__total(role_sp[0], nrole[0]), comm = maco__total(role_sp[1], nrole[1]);
    uint64_t both = maco__intersect(role_sp[0], nrole[0], role_sp[1], nrole[1]);
    uint64_t shorter = comp < comm ? comp : comm;
    fprintf(out,
            "launch: %u of %u tasks ran in %.4f ms; compute busy %.4f ms, communication busy "
            "%.4f ms, overlapped %.4f ms (%.1f%% of the shorter)\n",
            nran, n, (double)(p.t1 - p.t0) / 1e6, (double)comp / 1e6, (double)comm / 1e6,
            (double)both / 1e6, shorter ? 100.0 * (double)both / (double)shorter : 0.0);
out:
    free(idx);
    free(role_sp[0]);
    free(role_sp[1]);
    free(op_sp);
    free(sms);
    free(p.rec);
    return st;
}

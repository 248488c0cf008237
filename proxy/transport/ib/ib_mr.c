/*
 * ib_mr.c - the IB verbs transport: memory regions over whole allocations, host memory
 * and GPU memory (dma-buf, else nvidia-peermem), cached per proxy and counted by the channels
 * that use them (transport_ib.c has the design).
 */
#include "proxy/transport/ib/ib_internal.h"

/* ------------------------------------------------------------------ memory regions */

/* Registers GPU memory: a dma-buf of the range from the CUDA driver, else the address itself
 * (nvidia-peermem). The range is widened to whole host pages, as both need. Not run on our
 * machines (no GPU next to an RDMA NIC): kept small. */
static struct ibv_mr *maco__ib_reg_gpu(maco__ib_state_t *t, char *base, size_t bytes, char *why,
                                       size_t cap)
{
    const maco__ibv_table_t *v = t->v;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)base & ~(page - 1);
    size_t len = (size_t)((((uintptr_t)base + bytes + page - 1) & ~(page - 1)) - start);
    struct ibv_mr *mr = NULL;
    why[0] = '\0';
    if (v->reg_dmabuf_mr == NULL) {
        snprintf(why, cap, "libibverbs has no ibv_reg_dmabuf_mr");
    } else if (maco__cu()->cuMemGetHandleForAddressRange == NULL) {
        snprintf(why, cap, "the CUDA driver has no cuMemGetHandleForAddressRange");
    } else {
        int fd = -1;
        CUresult res = maco__cu()->cuMemGetHandleForAddressRange(
            &fd, (CUdeviceptr)start, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (res != CUDA_SUCCESS) {
            char txt[160];
            snprintf(why, cap, "cuMemGetHandleForAddressRange: %s",
                     maco__cu_error_text(res, txt, sizeof(txt)));
        } else {
            /* The MR's addresses are the GPU's virtual addresses (iova), as for host memory. */
            mr = v->reg_dmabuf_mr(t->pd, 0, len, (uint64_t)start, fd, MACO__IB_ACCESS);
            if (mr == NULL)
                snprintf(why, cap, "ibv_reg_dmabuf_mr: %s", strerror(errno));
            close(fd);
        }
    }
    if (mr == NULL) {
        mr = v->reg_mr(t->pd, (void *)start, len, MACO__IB_ACCESS);
        if (mr == NULL) {
            size_t used = strlen(why);
            snprintf(why + used, cap - used, "; ibv_reg_mr (nvidia-peermem): %s", strerror(errno));
        }
    }
    return mr;
}

/* The memory region over the allocation holding [addr, addr + bytes): cached, one more ref. */
maco_status_t maco__ib_mr_get(maco__ib_state_t *t, uint64_t addr, uint64_t bytes, const char *what,
                              maco__ib_mr_t **mr_p)
{
    maco__mem_region_t r;
    maco_status_t st = maco__mem_lookup(addr, bytes, &r);
    if (st != MACO_OK)
        return st;
    for (maco__ib_mr_t *m = t->mrs; m != NULL; m = m->next) {
        if (m->base == r.base && m->bytes == r.bytes) {
            m->refs++;
            *mr_p = m;
            return MACO_OK;
        }
    }
    maco__ib_mr_t *m = (maco__ib_mr_t *)calloc(1, sizeof(*m));
    if (m == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    char why[400] = "";
    if (r.is_host) {
        m->mr = t->v->reg_mr(t->pd, r.base, r.bytes, MACO__IB_ACCESS);
        if (m->mr == NULL)
            snprintf(why, sizeof(why), "ibv_reg_mr: %s", strerror(errno));
    } else {
        m->mr = maco__ib_reg_gpu(t, r.base, r.bytes, why, sizeof(why));
    }
    if (m->mr == NULL) {
        free(m);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: registering the %s (%s memory at %p, %zu bytes) with %s "
                           "failed: %s",
                           what, r.is_host ? "host" : "GPU", (void *)r.base, r.bytes, t->dev, why);
    }
    m->base = r.base;
    m->bytes = r.bytes;
    m->is_host = r.is_host;
    m->refs = 1;
    m->next = t->mrs;
    t->mrs = m;
    *mr_p = m;
    return MACO_OK;
}

void maco__ib_mr_put(maco__ib_state_t *t, maco__ib_mr_t *m)
{
    if (m == NULL || --m->refs > 0)
        return;
    for (maco__ib_mr_t **pp = &t->mrs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    t->v->dereg_mr(m->mr);
    free(m);
}

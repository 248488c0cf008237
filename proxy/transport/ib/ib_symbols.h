/*
 * ib_symbols.h - the libibverbs entry points the IB transport uses, without linking it.
 *
 * libibverbs is loaded at run time (MACO_IB_LIBRARY, default libibverbs.so.1) and every
 * function MACO calls in it is one entry of the X-macro table below, filled once with dlsym
 * (docs/design.md, "No link-time dependency"). A machine without the library still loads
 * libmaco.so; the IB transport then says why it is unavailable.
 *
 * Only symbols the library really exports are listed. Parts of <infiniband/verbs.h> are
 * macros or static inlines over other symbols: ibv_post_send and ibv_poll_cq go through the
 * context's ops (callable as they are), ibv_reg_mr is a macro over the exported ibv_reg_mr,
 * ibv_query_port an inline over the provider's query_port with the exported compat symbol
 * as fallback (maco__ibv_query_port does the same through this table). Entries are named
 * without the "ibv_" prefix so that a call never expands one of those macros.
 *
 * Built only where the header exists (CMake's check for infiniband/verbs.h): MACO_HAVE_IBVERBS.
 */
#ifndef MACO_PROXY_IB_SYMBOLS_H
#define MACO_PROXY_IB_SYMBOLS_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, required, return type, parameters): the symbol is "ibv_" #name; a library that
 * lacks a required one is refused, an optional one (0) leaves its entry NULL. */
#define MACO_IBV_SYMBOLS(X)                                                                        \
    X(get_device_list, 1, struct ibv_device **, (int *num_devices))                                \
    X(free_device_list, 1, void, (struct ibv_device * *list))                                      \
    X(get_device_name, 1, const char *, (struct ibv_device * device))                              \
    X(open_device, 1, struct ibv_context *, (struct ibv_device * device))                          \
    X(close_device, 1, int, (struct ibv_context * context))                                        \
    X(query_device, 1, int, (struct ibv_context * context, struct ibv_device_attr * attr))         \
    X(query_port, 1, int, (struct ibv_context * context, uint8_t port, void *compat_attr))         \
    X(query_gid, 1, int,                                                                           \
      (struct ibv_context * context, uint8_t port, int index, union ibv_gid *gid))                 \
    X(alloc_pd, 1, struct ibv_pd *, (struct ibv_context * context))                                \
    X(dealloc_pd, 1, int, (struct ibv_pd * pd))                                                    \
    X(reg_mr, 1, struct ibv_mr *, (struct ibv_pd * pd, void *addr, size_t length, int access))     \
    X(dereg_mr, 1, int, (struct ibv_mr * mr))                                                      \
    X(create_cq, 1, struct ibv_cq *,                                                               \
      (struct ibv_context * context, int cqe, void *cq_context, struct ibv_comp_channel *channel,  \
       int comp_vector))                                                                           \
    X(destroy_cq, 1, int, (struct ibv_cq * cq))                                                    \
    X(create_qp, 1, struct ibv_qp *, (struct ibv_pd * pd, struct ibv_qp_init_attr * attr))         \
    X(modify_qp, 1, int, (struct ibv_qp * qp, struct ibv_qp_attr * attr, int mask))                \
    X(destroy_qp, 1, int, (struct ibv_qp * qp))                                                    \
    X(wc_status_str, 1, const char *, (enum ibv_wc_status status))                                 \
    X(reg_dmabuf_mr, 0, struct ibv_mr *,                                                           \
      (struct ibv_pd * pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access))

typedef struct maco__ibv_table {
#define MACO__IBV_FIELD(name, required, ret, params) ret(*name) params;
    MACO_IBV_SYMBOLS(MACO__IBV_FIELD)
#undef MACO__IBV_FIELD
} maco__ibv_table_t;

/**
 * The table, loading the library on first use (thread-safe; the library stays loaded).
 * NULL when it cannot be loaded or lacks a required symbol: then `why` (cap bytes) says which
 * library and what failed. The answer does not change later in the process.
 */
const maco__ibv_table_t *maco__ibv(char *why, size_t cap);

/**
 * ibv_query_port through the table: the provider's extended query where it has one (the full
 * struct), else the exported compat symbol (which fills the fields up to link_layer).
 * Returns 0 or an errno value, as ibv_query_port does.
 */
int maco__ibv_query_port(const maco__ibv_table_t *v, struct ibv_context *ctx, uint8_t port,
                         struct ibv_port_attr *attr);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_IB_SYMBOLS_H */

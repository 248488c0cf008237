/*
 * consumer.c - the smallest MACO program: a one-rank job from a unique id, a communicator
 * (with or without a GPU) and its queries. Exits 0 when every call succeeds.
 */
#include <stdio.h>

#include <maco/maco.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        maco_status_t st_ = (call);                                                                \
        if (st_ != MACO_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s\n", #call, maco_status_string(st_));                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    maco_unique_id_t id;
    maco_bootstrap_t bs;
    maco_comm_t comm;
    int rank, nranks, device;
    CHECK(maco_unique_id_create(&id));
    CHECK(maco_bootstrap_create(&id, 0, 1, 10000, &bs));
    CHECK(maco_comm_create(bs, -1, &comm));
    CHECK(maco_comm_get_rank(comm, &rank));
    CHECK(maco_comm_get_nranks(comm, &nranks));
    CHECK(maco_comm_get_cuda_device(comm, &device));
    printf("maco %s: rank %d of %d, device %d, %d config variables\n", maco_version_string(), rank,
           nranks, device, maco_config_count());
    CHECK(maco_comm_destroy(comm));
    CHECK(maco_bootstrap_destroy(bs));
    return 0;
}

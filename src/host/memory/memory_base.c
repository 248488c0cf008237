/* memory_base.c - what every file of src/host/memory shares: the lock and the lists of
 * allocations, exports and imports (memory_private.h), and the access descriptor for this
 * device. The files call each other one way: memory_base < import < register < alloc. */
#include <pthread.h>
#include <string.h>

#include "src/host/memory/memory_private.h"

pthread_mutex_t maco__mem_lock = PTHREAD_MUTEX_INITIALIZER;
maco__alloc_t *maco__allocs;
maco__export_t *maco__exports;
maco__import_t *maco__imports;

CUmemAccessDesc maco__rw_access(int device)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = device;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

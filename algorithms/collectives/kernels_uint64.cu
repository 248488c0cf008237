/* coll_kernels_uint64.cu - the collective kernels for uint64 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint64, maco__t_u64)

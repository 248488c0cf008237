/* coll_kernels_int64.cu - the collective kernels for int64 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int64, maco__t_i64)

/* coll_kernels_int32.cu - the collective kernels for int32 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int32, maco__t_i32)

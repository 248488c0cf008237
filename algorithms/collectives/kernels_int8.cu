/* coll_kernels_int8.cu - the collective kernels for int8 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int8, maco__t_i8)

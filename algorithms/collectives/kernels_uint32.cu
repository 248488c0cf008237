/* coll_kernels_uint32.cu - the collective kernels for uint32 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint32, maco__t_u32)

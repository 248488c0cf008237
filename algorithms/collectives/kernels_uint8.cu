/* coll_kernels_uint8.cu - the collective kernels for uint8 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint8, maco__t_u8)

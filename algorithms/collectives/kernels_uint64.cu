/* kernels_uint64.cu - the collectives' kernels for uint64 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint64, maco__t_u64)

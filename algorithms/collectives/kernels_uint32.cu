/* kernels_uint32.cu - the collectives' kernels for uint32 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint32, maco__t_u32)

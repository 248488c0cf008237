/* kernels_uint8.cu - the collectives' kernels for uint8 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(uint8, maco__t_u8)

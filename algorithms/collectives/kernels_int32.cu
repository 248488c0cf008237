/* kernels_int32.cu - the collectives' kernels for int32 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int32, maco__t_i32)

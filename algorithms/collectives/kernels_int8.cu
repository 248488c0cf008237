/* kernels_int8.cu - the collectives' kernels for int8 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int8, maco__t_i8)

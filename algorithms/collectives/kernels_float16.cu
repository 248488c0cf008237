/* kernels_float16.cu - the collectives' kernels for float16 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float16, maco__t_f16)

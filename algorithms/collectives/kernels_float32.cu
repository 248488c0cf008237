/* kernels_float32.cu - the collectives' kernels for float32 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float32, maco__t_f32)

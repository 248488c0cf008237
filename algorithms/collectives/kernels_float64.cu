/* kernels_float64.cu - the collectives' kernels for float64 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float64, maco__t_f64)

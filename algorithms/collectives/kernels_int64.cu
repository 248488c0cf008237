/* kernels_int64.cu - the collectives' kernels for int64 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(int64, maco__t_i64)

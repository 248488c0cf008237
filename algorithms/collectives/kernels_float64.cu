/* coll_kernels_float64.cu - the collective kernels for float64 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float64, maco__t_f64)

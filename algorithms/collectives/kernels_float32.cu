/* coll_kernels_float32.cu - the collective kernels for float32 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float32, maco__t_f32)

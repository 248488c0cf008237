/* coll_kernels_float16.cu - the collective kernels for float16 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(float16, maco__t_f16)

/* coll_kernels_bfloat16.cu - the collective kernels for bfloat16 (coll_kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(bfloat16, maco__t_bf16)

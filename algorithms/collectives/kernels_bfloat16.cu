/* kernels_bfloat16.cu - the collectives' kernels for bfloat16 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(bfloat16, maco__t_bf16)

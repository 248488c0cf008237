/* kernels_fp8_e4m3.cu - the collectives' kernels for fp8_e4m3 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(fp8_e4m3, maco__t_e4m3)

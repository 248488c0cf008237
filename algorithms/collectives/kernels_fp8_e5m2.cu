/* kernels_fp8_e5m2.cu - the collectives' kernels for fp8_e5m2 (kernels.cuh). */
#include "algorithms/collectives/kernels.cuh"

MACO__DEFINE_LAUNCHER(fp8_e5m2, maco__t_e5m2)

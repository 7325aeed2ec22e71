/* operand.c: which operand path a plan's products read Q, K, V and dO
 * through (operand.h): the float32 path, bf16 pairs where the table has
 * bf16 GEMMs (bf16 problems, and float32 ones at precision BF16, rounded
 * as they are packed: fmha.h), else the widened path. */
#include "operand.h"

const fmha_operand_path *fmha_operand_path_for(fmha_dtype dtype, fmha_precision precision, const fmha_ukernels *uk) {
    switch (dtype) {
    case FMHA_DTYPE_F32: return precision == FMHA_PRECISION_BF16 && uk->bf16.gemm ? &fmha_path_bf16 : &fmha_path_f32;
    case FMHA_DTYPE_BF16: return uk->bf16.gemm ? &fmha_path_bf16 : &fmha_path_widened;
    case FMHA_DTYPE_F16: return &fmha_path_widened;
    }
    return NULL;
}

/* Reduction kernels and 16-bit float conversions used by the CollNet engine. */
#ifndef CT_REDUCE_H
#define CT_REDUCE_H
#include <stddef.h>
#include <stdint.h>
#include "ct_nccl_abi.h"

/* Bytes per element, 0 for types we do not handle. */
size_t ct_dtype_size(ncclDataType_t t);
const char* ct_dtype_name(ncclDataType_t t);
const char* ct_op_name(ncclRedOp_t op);
/* 1 when ct_reduce handles (t, op). */
int ct_reduce_supported(ncclDataType_t t, ncclRedOp_t op);
/* dst[i] = a[i] (op) b[i] for i < count; dst may alias a or b.
 * Floats: sum/prod follow IEEE (NaN and inf propagate); min/max return NaN when
 * either input is NaN. Integers wrap on overflow (two's complement). */
void ct_reduce(void* dst, const void* a, const void* b, size_t count, ncclDataType_t t,
               ncclRedOp_t op);

/* d[i] = srcs[0][i] (op) srcs[1][i] (op) ... srcs[k-1][i], combined in that order (so
 * float results equal k-1 ct_reduce passes bit for bit), one pass where it can. d must
 * not overlap srcs[1..k-1]; it may be srcs[0]. */
void ct_reduce_multi(void* d, const void* const* srcs, int k, size_t n, ncclDataType_t t, ncclRedOp_t op);

float ct_half_to_float(uint16_t h);
uint16_t ct_float_to_half(float f);      /* round to nearest even */
float ct_bf16_to_float(uint16_t h);
uint16_t ct_float_to_bf16(float f);      /* round to nearest even, NaN stays NaN */
#endif

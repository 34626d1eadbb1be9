#include "ct_reduce.h"
#include <math.h>
#include <string.h>

size_t ct_dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* ct_dtype_name(ncclDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return (t >= 0 && t < ncclNumTypes) ? names[t] : "?";
}

const char* ct_op_name(ncclRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (op >= 0 && op < ncclNumOps) ? names[op] : "?";
}

int ct_reduce_supported(ncclDataType_t t, ncclRedOp_t op) {
  if (ct_dtype_size(t) == 0) return 0;
  return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin;
}

/* ---- 16-bit floats ---- */
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ct_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13));   /* inf / NaN */
  if (exp == 0) {                                                   /* zero / subnormal */
    float v = (float)man * (1.0f / 16777216.0f);                    /* man * 2^-24 */
    return sign ? -v : v;
  }
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t ct_float_to_half(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u)                                          /* inf / NaN */
    return sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 : 0);
  if (absu >= 0x477ff000u) return sign | 0x7c00;                    /* rounds to >= 65520: inf */
  if (absu < 0x38800000u) {                                         /* below 2^-14: subnormal */
    float a = u2f(absu) * 16777216.0f;                              /* scale by 2^24 */
    return sign | (uint16_t)lrintf(a);                              /* nearest even */
  }
  uint32_t mant = absu + 0xfffu + ((absu >> 13) & 1u);              /* round to nearest even */
  return sign | (uint16_t)((mant - 0x38000000u) >> 13);
}

float ct_bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t ct_float_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- kernels ---- */
#define FMIN(x, y) (((x) != (x)) ? (x) : ((y) != (y)) ? (y) : ((x) < (y) ? (x) : (y)))
#define FMAX(x, y) (((x) != (x)) ? (x) : ((y) != (y)) ? (y) : ((x) > (y) ? (x) : (y)))
#define IMIN(x, y) ((x) < (y) ? (x) : (y))
#define IMAX(x, y) ((x) > (y) ? (x) : (y))

/* Integer kernels compute sum/prod in the unsigned type U so overflow wraps, not UB. */
#define INT_KERNELS(NAME, T, U)                                                          \
  static void NAME(T* d, const T* a, const T* b, size_t n, ncclRedOp_t op) {             \
    size_t i = 0;                                                                        \
    if (op == ncclSum || op == ncclProd) i = NAME##_vec(d, a, b, n, op == ncclProd);     \
    d += i; a += i; b += i; n -= i;                                                      \
    switch (op) {                                                                        \
      case ncclSum: for (i = 0; i < n; i++) d[i] = (T)((U)a[i] + (U)b[i]); break;        \
      case ncclProd: for (i = 0; i < n; i++) d[i] = (T)((U)a[i] * (U)b[i]); break;       \
      case ncclMin: for (i = 0; i < n; i++) d[i] = IMIN(a[i], b[i]); break;              \
      case ncclMax: for (i = 0; i < n; i++) d[i] = IMAX(a[i], b[i]); break;              \
      default: break;                                                                    \
    }                                                                                    \
  }

#define FLOAT_KERNELS(NAME, T)                                                           \
  static void NAME(T* d, const T* a, const T* b, size_t n, ncclRedOp_t op) {             \
    size_t i = 0;                                                                        \
    if (op == ncclSum || op == ncclProd) i = NAME##_vec(d, a, b, n, op == ncclProd);     \
    d += i; a += i; b += i; n -= i;                                                      \
    switch (op) {                                                                        \
      case ncclSum: for (i = 0; i < n; i++) d[i] = a[i] + b[i]; break;                   \
      case ncclProd: for (i = 0; i < n; i++) d[i] = a[i] * b[i]; break;                  \
      case ncclMin: for (i = 0; i < n; i++) d[i] = FMIN(a[i], b[i]); break;              \
      case ncclMax: for (i = 0; i < n; i++) d[i] = FMAX(a[i], b[i]); break;              \
      default: break;                                                                    \
    }                                                                                    \
  }

#define HALF_KERNELS(NAME, TOF, FROMF)                                                   \
  static void NAME(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n,          \
                   ncclRedOp_t op) {                                                     \
    for (size_t i = 0; i < n; i++) {                                                     \
      float x = TOF(a[i]), y = TOF(b[i]), r;                                             \
      switch (op) {                                                                      \
        case ncclSum: r = x + y; break;                                                  \
        case ncclProd: r = x * y; break;                                                 \
        case ncclMin: r = FMIN(x, y); break;                                             \
        default: r = FMAX(x, y); break;                                                  \
      }                                                                                  \
      d[i] = FROMF(r);                                                                   \
    }                                                                                    \
  }

/* Sum and product a vector of 16 bytes at a time, two per step (SSE2 on x86-64; the
 * compiler's generic vectors elsewhere): the same IEEE operation per element as the scalar
 * loop, so float results are bit-identical; integers in the unsigned type (wrapping). Both
 * inputs of a step are loaded before its store, so d may be a or b. Returns the elements
 * done; the scalar loop finishes the tail. */
#define VEC_KERNEL(NAME, T, U)                                                           \
  typedef U NAME##_v __attribute__((vector_size(16)));                                   \
  static size_t NAME##_vec(T* d, const T* a, const T* b, size_t n, int prod) {           \
    enum { L = 16 / sizeof(T) };                                                         \
    size_t i = 0;                                                                        \
    for (; i + 2 * L <= n; i += 2 * L) {                                                 \
      NAME##_v x0, x1, y0, y1;                                                           \
      memcpy(&x0, a + i, 16); memcpy(&x1, a + i + L, 16);                                \
      memcpy(&y0, b + i, 16); memcpy(&y1, b + i + L, 16);                                \
      if (prod) { x0 = x0 * y0; x1 = x1 * y1; } else { x0 = x0 + y0; x1 = x1 + y1; }     \
      memcpy(d + i, &x0, 16); memcpy(d + i + L, &x1, 16);                                \
    }                                                                                    \
    return i;                                                                            \
  }

/* d = s[0] (op) s[1] (op) ... (op) s[k-1], in that order per element, in one pass (the
 * partial result stays in registers). Returns the elements done. */
#define VEC_MULTI(NAME, T, U)                                                            \
  static size_t NAME##_vecn(T* d, const void* const* s, int k, size_t n, int prod) {     \
    enum { L = 16 / sizeof(T) };                                                         \
    size_t i = 0;                                                                        \
    for (; i + 2 * L <= n; i += 2 * L) {                                                 \
      NAME##_v x0, x1, y0, y1;                                                           \
      memcpy(&x0, (const T*)s[0] + i, 16); memcpy(&x1, (const T*)s[0] + i + L, 16);     \
      for (int j = 1; j < k; j++) {                                                      \
        memcpy(&y0, (const T*)s[j] + i, 16); memcpy(&y1, (const T*)s[j] + i + L, 16);   \
        if (prod) { x0 = x0 * y0; x1 = x1 * y1; } else { x0 = x0 + y0; x1 = x1 + y1; }   \
      }                                                                                  \
      memcpy(d + i, &x0, 16); memcpy(d + i + L, &x1, 16);                                \
    }                                                                                    \
    return i;                                                                            \
  }
#define VEC_KERNELS(NAME, T, U) VEC_KERNEL(NAME, T, U) VEC_MULTI(NAME, T, U)

VEC_KERNELS(red_i8, int8_t, uint8_t)
VEC_KERNELS(red_u8, uint8_t, uint8_t)
VEC_KERNELS(red_i32, int32_t, uint32_t)
VEC_KERNELS(red_u32, uint32_t, uint32_t)
VEC_KERNELS(red_i64, int64_t, uint64_t)
VEC_KERNELS(red_u64, uint64_t, uint64_t)
VEC_KERNELS(red_f32, float, float)
VEC_KERNELS(red_f64, double, double)

INT_KERNELS(red_i8, int8_t, uint8_t)
INT_KERNELS(red_u8, uint8_t, uint8_t)
INT_KERNELS(red_i32, int32_t, uint32_t)
INT_KERNELS(red_u32, uint32_t, uint32_t)
INT_KERNELS(red_i64, int64_t, uint64_t)
INT_KERNELS(red_u64, uint64_t, uint64_t)
FLOAT_KERNELS(red_f32, float)
FLOAT_KERNELS(red_f64, double)
HALF_KERNELS(red_f16, ct_half_to_float, ct_float_to_half)
HALF_KERNELS(red_bf16, ct_bf16_to_float, ct_float_to_bf16)

void ct_reduce(void* d, const void* a, const void* b, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: red_i8(d, a, b, n, op); break;
    case ncclUint8: red_u8(d, a, b, n, op); break;
    case ncclInt32: red_i32(d, a, b, n, op); break;
    case ncclUint32: red_u32(d, a, b, n, op); break;
    case ncclInt64: red_i64(d, a, b, n, op); break;
    case ncclUint64: red_u64(d, a, b, n, op); break;
    case ncclFloat32: red_f32(d, a, b, n, op); break;
    case ncclFloat64: red_f64(d, a, b, n, op); break;
    case ncclFloat16: red_f16(d, a, b, n, op); break;
    case ncclBfloat16: red_bf16(d, a, b, n, op); break;
    default: break;
  }
}

void ct_reduce_multi(void* d, const void* const* srcs, int k, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  if (k < 2) { if (k == 1 && d != srcs[0]) memmove(d, srcs[0], n * ct_dtype_size(t)); return; }
  size_t done = 0;
  int prod = op == ncclProd;
  if (op == ncclSum || op == ncclProd) {
    switch (t) {
      case ncclInt8: done = red_i8_vecn(d, srcs, k, n, prod); break;
      case ncclUint8: done = red_u8_vecn(d, srcs, k, n, prod); break;
      case ncclInt32: done = red_i32_vecn(d, srcs, k, n, prod); break;
      case ncclUint32: done = red_u32_vecn(d, srcs, k, n, prod); break;
      case ncclInt64: done = red_i64_vecn(d, srcs, k, n, prod); break;
      case ncclUint64: done = red_u64_vecn(d, srcs, k, n, prod); break;
      case ncclFloat32: done = red_f32_vecn(d, srcs, k, n, prod); break;
      case ncclFloat64: done = red_f64_vecn(d, srcs, k, n, prod); break;
      default: break;
    }
  }
  if (done == n) return;
  /* the rest (the tail, other types and ops): pairwise passes, in order */
  size_t es = ct_dtype_size(t), o = done * es;
  char* dd = (char*)d + o;
  ct_reduce(dd, (const char*)srcs[0] + o, (const char*)srcs[1] + o, n - done, t, op);
  for (int j = 2; j < k; j++) ct_reduce(dd, dd, (const char*)srcs[j] + o, n - done, t, op);
}

#define _GNU_SOURCE
/* Reduction kernels for every dtype and op, odd lengths, NaN/inf, fp16/bf16 conversion. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ct_reduce.h"
#include "ct_test.h"

static const ncclDataType_t TYPES[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                       ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const ncclRedOp_t OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin};

static void put(void* b, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)b)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)b)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)b)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)b)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)b)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)b)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)b)[i] = ct_float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t*)b)[i] = ct_float_to_bf16((float)v); break;
    case ncclFloat32: ((float*)b)[i] = (float)v; break;
    default: ((double*)b)[i] = v; break;
  }
}
static double get(const void* b, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)b)[i];
    case ncclUint8: return ((const uint8_t*)b)[i];
    case ncclInt32: return ((const int32_t*)b)[i];
    case ncclUint32: return ((const uint32_t*)b)[i];
    case ncclInt64: return (double)((const int64_t*)b)[i];
    case ncclUint64: return (double)((const uint64_t*)b)[i];
    case ncclFloat16: return ct_half_to_float(((const uint16_t*)b)[i]);
    case ncclBfloat16: return ct_bf16_to_float(((const uint16_t*)b)[i]);
    case ncclFloat32: return ((const float*)b)[i];
    default: return ((const double*)b)[i];
  }
}

static double expect(ncclRedOp_t op, double a, double b) {
  switch (op) {
    case ncclSum: return a + b;
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    default: return a < b ? a : b;
  }
}

static void test_all_types_odd_lengths(void) {
  const size_t lens[] = {0, 1, 3, 7, 17, 1023};
  for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++)
    for (size_t oi = 0; oi < 4; oi++)
      for (size_t li = 0; li < 6; li++) {
        ncclDataType_t t = TYPES[ti];
        size_t n = lens[li], es = ct_dtype_size(t), bad = 0;
        CHECK(ct_reduce_supported(t, OPS[oi]), "%s %s supported", ct_dtype_name(t), ct_op_name(OPS[oi]));
        /* guard element after the end must stay untouched */
        unsigned char *a = malloc((n + 1) * es), *b = malloc((n + 1) * es), *d = malloc((n + 1) * es);
        for (size_t i = 0; i < n; i++) {
          put(a, i, t, (double)(i % 5) + 1);
          put(b, i, t, (double)(i % 3) + 2);
        }
        memset(d + n * es, 0xab, es);
        ct_reduce(d, a, b, n, t, OPS[oi]);
        for (size_t i = 0; i < n; i++)
          if (get(d, i, t) != expect(OPS[oi], (double)(i % 5) + 1, (double)(i % 3) + 2)) bad++;
        for (size_t k = 0; k < es; k++) bad += d[n * es + k] != 0xab;
        CHECK(bad == 0, "%s %s n=%zu: %zu wrong", ct_dtype_name(t), ct_op_name(OPS[oi]), n, bad);
        /* in place: dst aliases first input */
        ct_reduce(a, a, b, n, t, OPS[oi]);
        CHECK(n == 0 || memcmp(a, d, n * es) == 0, "%s %s in place", ct_dtype_name(t), ct_op_name(OPS[oi]));
        free(a); free(b); free(d);
      }
}

/* The vector path (16 bytes at a time, two per step) against the scalar operation, bit for
 * bit: random floats and doubles, unaligned pointers, the output aliasing either input. */
static void test_vector_path_exact(void) {
  enum { N = 1001 };
  float* fa = malloc((N + 1) * sizeof(float));
  float* fb = malloc((N + 1) * sizeof(float));
  float* fr = malloc(N * sizeof(float));
  double* da = malloc(N * sizeof(double));
  double* db = malloc(N * sizeof(double));
  double* dr = malloc(N * sizeof(double));
  unsigned x = 12345;
  for (int i = 0; i <= N; i++) {
    x = x * 1103515245u + 12345u;
    fa[i] = (float)((int)(x >> 8) - (1 << 23)) / 1024.0f;
    x = x * 1103515245u + 12345u;
    fb[i] = (float)((int)(x >> 8) - (1 << 23)) * 3.0e-5f;
  }
  for (int i = 0; i < N; i++) { da[i] = fa[i] * 1.0000001; db[i] = fb[i] / 7.0; }
  for (int p = 0; p < 2; p++) {
    ncclRedOp_t op = p ? ncclProd : ncclSum;
    const float* a = fa + 1;   /* 4 bytes off the allocation: unaligned for 16-byte vectors */
    float* b = fb + 1;
    for (int i = 0; i < N; i++) fr[i] = p ? a[i] * b[i] : a[i] + b[i];
    float* keep = malloc(N * sizeof(float));
    memcpy(keep, b, N * sizeof(float));
    ct_reduce(b, a, b, N, ncclFloat32, op);   /* into the second input */
    CHECK(memcmp(b, fr, N * sizeof(float)) == 0, "float %s into the second input: bit-identical", ct_op_name(op));
    memcpy(b, keep, N * sizeof(float));
    free(keep);
    for (int i = 0; i < N; i++) dr[i] = p ? da[i] * db[i] : da[i] + db[i];
    double* dd = malloc(N * sizeof(double));
    ct_reduce(dd, da, db, N, ncclFloat64, op);
    CHECK(memcmp(dd, dr, N * sizeof(double)) == 0, "double %s: bit-identical", ct_op_name(op));
    free(dd);
  }
  free(fa); free(fb); free(fr); free(da); free(db); free(dr);
}

/* ct_reduce_multi (one pass over k inputs) equals k-1 ct_reduce passes in order, bit for bit,
 * for every type and op, odd lengths, k = 2..5, and with the output being the first input. */
static void test_multi_equals_passes(void) {
  const size_t lens[] = {1, 7, 33, 1001};
  for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++)
    for (size_t oi = 0; oi < 4; oi++)
      for (size_t li = 0; li < 4; li++)
        for (int k = 2; k <= 5; k++) {
          ncclDataType_t t = TYPES[ti];
          size_t n = lens[li], es = ct_dtype_size(t), bytes = n * es;
          unsigned char* in[5];
          unsigned char *want = malloc(bytes), *got = malloc(bytes + es), *first = malloc(bytes);
          unsigned x = (unsigned)(ti * 131 + oi * 17 + li * 7 + (size_t)k);
          for (int j = 0; j < k; j++) {
            in[j] = malloc(bytes);
            for (size_t i = 0; i < n; i++) {
              x = x * 1103515245u + 12345u;
              put(in[j], i, t, (double)((x >> 16) % 7) + (t == ncclFloat32 || t == ncclFloat64 ? 0.1 * j : 0));
            }
          }
          ct_reduce(want, in[0], in[1], n, t, OPS[oi]);
          for (int j = 2; j < k; j++) ct_reduce(want, want, in[j], n, t, OPS[oi]);
          memset(got + bytes, 0xab, es);
          ct_reduce_multi(got, (const void* const*)in, k, n, t, OPS[oi]);
          size_t guard = 0;
          for (size_t b = 0; b < es; b++) guard += got[bytes + b] != 0xab;
          CHECK(memcmp(got, want, bytes) == 0 && guard == 0, "multi %s %s n=%zu k=%d equals %d passes",
                ct_dtype_name(t), ct_op_name(OPS[oi]), n, k, k - 1);
          memcpy(first, in[0], bytes);
          ct_reduce_multi(in[0], (const void* const*)in, k, n, t, OPS[oi]);   /* into the first input */
          CHECK(memcmp(in[0], want, bytes) == 0, "multi %s %s n=%zu k=%d in place", ct_dtype_name(t),
                ct_op_name(OPS[oi]), n, k);
          for (int j = 0; j < k; j++) free(in[j]);
          free(want); free(got); free(first);
        }
}

static void test_unsupported(void) {
  CHECK(!ct_reduce_supported(ncclFloat8e4m3, ncclSum), "fp8 unsupported");
  CHECK(!ct_reduce_supported(ncclFloat32, ncclAvg), "avg unsupported");
  CHECK(!ct_reduce_supported((ncclDataType_t)99, ncclSum), "bad type unsupported");
}

static void test_nan_inf(void) {
  const ncclDataType_t ft[] = {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  for (int k = 0; k < 4; k++) {
    ncclDataType_t t = ft[k];
    unsigned char a[32], b[32], d[32];
    put(a, 0, t, NAN); put(b, 0, t, 1.0);
    put(a, 1, t, 1.0); put(b, 1, t, NAN);
    put(a, 2, t, INFINITY); put(b, 2, t, 1.0);
    put(a, 3, t, INFINITY); put(b, 3, t, -INFINITY);
    ct_reduce(d, a, b, 4, t, ncclSum);
    CHECK(isnan(get(d, 0, t)) && isnan(get(d, 1, t)), "%s sum NaN propagates", ct_dtype_name(t));
    CHECK(isinf(get(d, 2, t)) && get(d, 2, t) > 0, "%s sum inf", ct_dtype_name(t));
    CHECK(isnan(get(d, 3, t)), "%s inf + -inf is NaN", ct_dtype_name(t));
    ct_reduce(d, a, b, 3, t, ncclMax);
    CHECK(isnan(get(d, 0, t)) && isnan(get(d, 1, t)), "%s max NaN either side", ct_dtype_name(t));
    CHECK(isinf(get(d, 2, t)), "%s max inf", ct_dtype_name(t));
    ct_reduce(d, a, b, 3, t, ncclMin);
    CHECK(isnan(get(d, 0, t)) && isnan(get(d, 1, t)), "%s min NaN either side", ct_dtype_name(t));
    CHECK(get(d, 2, t) == 1.0, "%s min(inf,1)", ct_dtype_name(t));
  }
}

static void test_int_wrap(void) {
  int32_t a = INT32_MAX, b = 1, d;
  ct_reduce(&d, &a, &b, 1, ncclInt32, ncclSum);
  CHECK(d == INT32_MIN, "int32 sum wraps");
  int8_t x = -128, y = -1, z;
  ct_reduce(&z, &x, &y, 1, ncclInt8, ncclMin);
  CHECK(z == -128, "int8 min");
  uint64_t u = UINT64_MAX, v = 2, w;
  ct_reduce(&w, &u, &v, 1, ncclUint64, ncclSum);
  CHECK(w == 1, "uint64 sum wraps");
}

static void test_half_conversions(void) {
  CHECK(ct_float_to_half(1.0f) == 0x3c00, "half 1.0");
  CHECK(ct_float_to_half(-2.0f) == 0xc000, "half -2.0");
  CHECK(ct_float_to_half(65504.0f) == 0x7bff, "half max");
  CHECK(ct_float_to_half(65520.0f) == 0x7c00, "half overflow to inf");
  CHECK(ct_float_to_half(1e-8f) == 0x0000, "half underflow to zero");
  CHECK(ct_float_to_half(5.9604645e-8f) == 0x0001, "half smallest subnormal");
  CHECK(ct_float_to_half(6.103515625e-05f) == 0x0400, "half smallest normal");
  CHECK(ct_float_to_half(1.0f + 1.0f / 2048) == 0x3c00, "half ties to even (down)");
  CHECK(ct_float_to_half(1.0f + 3.0f / 2048) == 0x3c02, "half ties to even (up)");
  CHECK((ct_float_to_half(NAN) & 0x7c00) == 0x7c00 && (ct_float_to_half(NAN) & 0x3ff), "half NaN");
  CHECK(ct_float_to_half(-INFINITY) == 0xfc00, "half -inf");
  CHECK(ct_half_to_float(0x3555) > 0.333f && ct_half_to_float(0x3555) < 0.3334f, "half 1/3");
  CHECK(ct_half_to_float(0x0001) == 5.9604645e-8f, "half subnormal to float");
  CHECK(isnan(ct_half_to_float(0x7e00)), "half NaN to float");
  int bad = 0;  /* every finite half round-trips exactly */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00) continue;
    if (ct_float_to_half(ct_half_to_float((uint16_t)h)) != h) bad++;
  }
  CHECK(bad == 0, "half round trip: %d wrong", bad);
}

static void test_bf16_conversions(void) {
  CHECK(ct_float_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
  CHECK(ct_float_to_bf16(-1.5f) == 0xbfc0, "bf16 -1.5");
  CHECK(ct_float_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "bf16 ties to even (down)");
  CHECK(ct_float_to_bf16(1.0f + 3.0f / 256) == 0x3f82, "bf16 ties to even (up)");
  CHECK(ct_float_to_bf16(INFINITY) == 0x7f80, "bf16 inf");
  CHECK(isnan(ct_bf16_to_float(ct_float_to_bf16(NAN))), "bf16 NaN stays NaN");
  CHECK(ct_float_to_bf16(3.4e38f) == 0x7f80, "bf16 rounds large float to inf");
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7f80) == 0x7f80) continue;
    if (ct_float_to_bf16(ct_bf16_to_float((uint16_t)h)) != h) bad++;
  }
  CHECK(bad == 0, "bf16 round trip: %d wrong", bad);
}

int main(void) {
  test_all_types_odd_lengths();
  test_vector_path_exact();
  test_multi_equals_passes();
  test_unsupported();
  test_nan_inf();
  test_int_wrap();
  test_half_conversions();
  test_bf16_conversions();
  return CT_SUMMARY();
}

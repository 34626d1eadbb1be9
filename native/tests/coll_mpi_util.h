/* Shared by the MPI CollNet tests: deterministic inputs per rank, the expected
 * result (reduced in rank order 0..n-1), communicator open/close through the plugin's
 * v12 CollNet table with handles swapped over MPI_Allgather, and agreement. */
#ifndef COLL_MPI_UTIL_H
#define COLL_MPI_UTIL_H
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "ct_nccl_abi.h"
#include "ct_reduce.h"
#include "ct_test.h"

static int rank, nranks;
static ncclCollNet_v12_t* cn;
static void* ctx;

static const ncclDataType_t TYPES[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                       ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const ncclRedOp_t OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin};

static void fill(void* buf, size_t count, ncclDataType_t t, int r, ncclRedOp_t op) {
  size_t es = ct_dtype_size(t);
  for (size_t i = 0; i < count; i++) {
    /* prod stays in {1,2} so 16-bit floats and int8 keep it exact */
    long v = op == ncclProd ? 1 + (long)((i + (size_t)r) % 2) : (long)((i * 5 + (size_t)r * 3) % 11) - 5;
    if (t == ncclUint8 || t == ncclUint32 || t == ncclUint64) v += 5;
    char* p = (char*)buf + i * es;
    switch (t) {
      case ncclInt8: *(int8_t*)p = (int8_t)v; break;
      case ncclUint8: *(uint8_t*)p = (uint8_t)v; break;
      case ncclInt32: *(int32_t*)p = (int32_t)v; break;
      case ncclUint32: *(uint32_t*)p = (uint32_t)v; break;
      case ncclInt64: *(int64_t*)p = v; break;
      case ncclUint64: *(uint64_t*)p = (uint64_t)v; break;
      case ncclFloat16: *(uint16_t*)p = ct_float_to_half((float)v); break;
      case ncclBfloat16: *(uint16_t*)p = ct_float_to_bf16((float)v); break;
      case ncclFloat32: *(float*)p = (float)v; break;
      default: *(double*)p = (double)v; break;
    }
  }
}

static void* expected(size_t count, ncclDataType_t t, ncclRedOp_t op) {
  size_t es = ct_dtype_size(t);
  void* acc = malloc(count * es + 1);
  void* tmp = malloc(count * es + 1);
  fill(acc, count, t, 0, op);
  for (int r = 1; r < nranks; r++) {
    fill(tmp, count, t, r, op);
    ct_reduce(acc, acc, tmp, count, t, op);
  }
  free(tmp);
  return acc;
}

typedef struct { void* comm; void* listen; } comm_t;

static int open_comm(comm_t* c, const char* algo, const char* socks, const char* chunk) {
  if (algo) setenv("CLUSTERTOOL_COLLNET_ALGO", algo, 1);
  else unsetenv("CLUSTERTOOL_COLLNET_ALGO");   /* the plugin's default */
  setenv("CLUSTERTOOL_SOCKS_PER_PEER", socks, 1);
  setenv("CLUSTERTOOL_CHUNK_BYTES", chunk, 1);
  char h[NCCL_NET_HANDLE_MAXSIZE];
  if (cn->listen(ctx, 0, h, &c->listen) != ncclSuccess) return -1;
  char* all = malloc((size_t)nranks * sizeof h);
  void** ptrs = malloc(sizeof(void*) * (size_t)nranks);
  MPI_Allgather(h, sizeof h, MPI_BYTE, all, sizeof h, MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 0; r < nranks; r++) ptrs[r] = all + (size_t)r * sizeof h;
  int rc = cn->connect(ptrs, nranks, rank, c->listen, &c->comm) == ncclSuccess ? 0 : -1;
  free(all);
  free(ptrs);
  return rc;
}

static void close_comm(comm_t* c) {
  cn->closeColl(c->comm);
  cn->closeListen(c->listen);
}

static int wait_req(void* req) {
  int done = 0, size = 0;
  while (!done)
    if (cn->test(req, &done, &size) != ncclSuccess) return -1;
  return 0;
}

/* NCCL's proxy shape: count floats of sb/rb cut into requests of per elements, at most
 * depth outstanding, posted and tested from this thread, only the oldest tested; a NULL
 * request (the plugin's window is full) is posted again on the next pass. */
__attribute__((unused)) static int run_stream(void* comm, const float* sb, float* rb, size_t count, size_t per, int depth) {
  enum { MAXQ = 1024 };
  void* fifo[MAXQ];
  size_t nreq = (count + per - 1) / per, posted = 0, done_n = 0;
  while (done_n < nreq) {
    while (posted < nreq && posted - done_n < (size_t)depth && posted - done_n < MAXQ) {
      size_t first = posted * per, n = count - first < per ? count - first : per;
      void* req = NULL;
      if (cn->iallreduce(comm, (void*)(sb + first), rb + first, n, ncclFloat32, ncclSum, NULL, NULL, &req) !=
          ncclSuccess)
        return -1;
      if (!req) break;
      fifo[posted++ % MAXQ] = req;
    }
    int done = 0, size = 0;
    if (cn->test(fifo[done_n % MAXQ], &done, &size) != ncclSuccess) return -1;
    if (done) done_n++;
  }
  return 0;
}

/* float inputs whose sum depends on the order of the additions, and the rank-order sum */
static float fvalue(int r, size_t i) { return (float)(sin((double)(r * 7919 + (int)i)) * pow(10.0, (double)((int)(i % 7) - 3))); }
__attribute__((unused)) static float* fexpected(size_t n) {
  float* want = malloc(n * 4 + 4);
  float* tmp = malloc(n * 4 + 4);
  for (size_t i = 0; i < n; i++) want[i] = fvalue(0, i);
  for (int r = 1; r < nranks; r++) {
    for (size_t i = 0; i < n; i++) tmp[i] = fvalue(r, i);
    ct_reduce(want, want, tmp, n, ncclFloat32, ncclSum);
  }
  free(tmp);
  return want;
}

static int agree(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

__attribute__((unused)) static void test_allreduce_matrix(comm_t* c, const char* label) {
  const size_t counts[] = {0, 1, (size_t)nranks - 1, (size_t)nranks + 1, 1001, 70001};
  for (size_t ti = 0; ti < 10; ti++)
    for (size_t oi = 0; oi < 4; oi++)
      for (size_t ci = 0; ci < 6; ci++)
        for (int inplace = 0; inplace < 2; inplace++) {
          ncclDataType_t t = TYPES[ti];
          ncclRedOp_t op = OPS[oi];
          size_t n = counts[ci], es = ct_dtype_size(t);
          char* sb = malloc(n * es + 1);
          char* rb = inplace ? sb : malloc(n * es + 1);
          fill(sb, n, t, rank, op);
          void* req = NULL;
          void* mh = NULL;
          cn->regMr(c->comm, sb, n * es, NCCL_PTR_HOST, &mh);
          int ok = cn->iallreduce(c->comm, sb, rb, n, t, op, mh, mh, &req) == ncclSuccess && req;
          ok = ok && wait_req(req) == 0;
          void* want = expected(n, t, op);
          ok = ok && memcmp(rb, want, n * es) == 0;
          ok = agree(ok);
          if (rank == 0)
            CHECK(ok, "%s allreduce %s %s n=%zu %s", label, ct_dtype_name(t), ct_op_name(op), n,
                  inplace ? "in place" : "out of place");
          free(want);
          if (!inplace) free(rb);
          free(sb);
        }
}

__attribute__((unused)) static void test_many_in_flight(comm_t* c, const char* label) {
  enum { K = 5 };
  size_t n = 50000;
  float *sb[K], *rb[K];
  void* req[K];
  int ok = 1;
  for (int k = 0; k < K; k++) {
    sb[k] = malloc(n * 4);
    rb[k] = malloc(n * 4);
    for (size_t i = 0; i < n; i++) sb[k][i] = (float)(k * 100 + rank + (int)(i % 3));
    ok &= cn->iallreduce(c->comm, sb[k], rb[k], n, ncclFloat32, ncclSum, NULL, NULL, &req[k]) == ncclSuccess;
  }
  for (int k = K - 1; k >= 0; k--) ok &= wait_req(req[k]) == 0;   /* tested newest first */
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < n; i++) {
      float want = (float)(nranks * (k * 100 + (int)(i % 3)) + nranks * (nranks - 1) / 2);
      if (rb[k][i] != want) { ok = 0; break; }
    }
    free(sb[k]);
    free(rb[k]);
  }
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: %d allreduces in flight, tested out of order", label, K);
}

__attribute__((unused)) static void test_nan_across_ranks(comm_t* c, const char* label) {
  float v[8], out[8];
  for (int i = 0; i < 8; i++) v[i] = (float)(rank + i);
  if (rank == nranks - 1) { v[3] = NAN; v[5] = INFINITY; }
  void* req;
  int ok = cn->iallreduce(c->comm, v, out, 8, ncclFloat32, ncclMax, NULL, NULL, &req) == ncclSuccess;
  ok = ok && wait_req(req) == 0 && isnan(out[3]) && isinf(out[5]) && out[0] == (float)(nranks - 1);
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: max propagates NaN and inf from one rank", label);
}

#endif

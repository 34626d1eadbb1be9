#define _GNU_SOURCE
/* Multi-rank CollNet correctness, run under mpirun -np 2..4 on localhost:
 * allreduce for every dtype/op, odd counts, in place, several ops in flight,
 * both algorithms, several sockets and tiny chunks; reduce-scatter and allgather
 * with windows and split receive parts. Expected values are computed locally
 * from the deterministic inputs of every rank. */
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
  setenv("CLUSTERTOOL_COLLNET_ALGO", algo, 1);
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

static int agree(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static void test_allreduce_matrix(comm_t* c, const char* label) {
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

static void test_many_in_flight(comm_t* c, const char* label) {
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

static void test_nan_across_ranks(comm_t* c, const char* label) {
  float v[8], out[8];
  for (int i = 0; i < 8; i++) v[i] = (float)(rank + i);
  if (rank == nranks - 1) { v[3] = NAN; v[5] = INFINITY; }
  void* req;
  int ok = cn->iallreduce(c->comm, v, out, 8, ncclFloat32, ncclMax, NULL, NULL, &req) == ncclSuccess;
  ok = ok && wait_req(req) == 0 && isnan(out[3]) && isinf(out[5]) && out[0] == (float)(nranks - 1);
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: max propagates NaN and inf from one rank", label);
}

/* Global buffer of nranks blocks of bpr bytes; window [woff, woff+wb). */
static void test_reducescatter(comm_t* c, const char* label, size_t bpr_elems, size_t woff_e, size_t wb_e) {
  size_t bpr = bpr_elems * 4, woff = woff_e * 4, wb = wb_e * 4, total = (size_t)nranks * bpr_elems;
  int32_t* full = malloc(total * 4 + 4);
  for (size_t i = 0; i < total; i++) full[i] = (int32_t)(i * 3 + (size_t)rank);
  /* my part of the window */
  size_t lo = (size_t)rank * bpr, hi = lo + bpr;
  if (lo < woff) lo = woff;
  if (hi > woff + wb) hi = woff + wb;
  size_t mine = hi > lo ? hi - lo : 0;
  int32_t* out = malloc(mine + 4);
  ncclNetSGE_v12_t parts[2];
  int np = wb > 8 ? 2 : 1;  /* split the send window in two parts when we can */
  size_t first = np == 2 ? (wb / 8) * 4 : wb;
  parts[0] = (ncclNetSGE_v12_t){NULL, (char*)full + woff, first};
  parts[1] = (ncclNetSGE_v12_t){NULL, (char*)full + woff + first, wb - first};
  void* req;
  int ok = cn->ireducescatter(c->comm, np, parts, out, bpr, woff, wb, ncclInt32, ncclSum, NULL, &req) == ncclSuccess;
  ok = ok && wait_req(req) == 0;
  for (size_t b = 0; ok && b < mine; b += 4) {
    size_t gi = (lo + b) / 4;
    int32_t want = (int32_t)(gi * 3 * (size_t)nranks + (size_t)(nranks * (nranks - 1) / 2));
    if (out[b / 4] != want) ok = 0;
  }
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: reduce-scatter bpr=%zu window [%zu,+%zu)", label, bpr_elems, woff_e, wb_e);
  free(full);
  free(out);
}

static void test_allgather(comm_t* c, const char* label, size_t bpr, size_t woff, size_t wb) {
  unsigned char* mine = malloc(bpr + 1);
  for (size_t i = 0; i < bpr; i++) mine[i] = (unsigned char)(rank * 41 + (int)i);
  size_t lo = (size_t)rank * bpr;
  const unsigned char* send = mine + (woff > lo && woff < lo + bpr ? woff - lo : 0);
  unsigned char* out = malloc(wb + 1);
  memset(out, 0, wb);
  ncclNetSGE_v12_t parts[2] = {{NULL, out, wb / 3}, {NULL, out + wb / 3, wb - wb / 3}};
  int np = wb >= 3 ? 2 : 1;
  if (np == 1) parts[0].size = wb;
  void* req;
  int ok = cn->iallgather(c->comm, (void*)send, np, parts, bpr, woff, wb, NULL, &req) == ncclSuccess;
  ok = ok && wait_req(req) == 0;
  for (size_t i = 0; ok && i < wb; i++) {
    size_t g = woff + i, r = g / bpr;
    if (out[i] != (unsigned char)(r * 41 + g % bpr)) ok = 0;
  }
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: allgather bpr=%zu window [%zu,+%zu) in %d parts", label, bpr, woff, wb, np);
  free(mine);
  free(out);
}

static void run_suite(const char* algo, const char* socks, const char* chunk) {
  char label[96];
  snprintf(label, sizeof label, "%s socks=%s chunk=%s np=%d", algo, socks, chunk, nranks);
  comm_t c;
  int ok = agree(open_comm(&c, algo, socks, chunk) == 0);
  if (rank == 0) CHECK(ok, "%s: connect", label);
  if (!ok) return;
  test_allreduce_matrix(&c, label);
  test_many_in_flight(&c, label);
  test_nan_across_ranks(&c, label);
  test_reducescatter(&c, label, 1000, 0, (size_t)nranks * 1000);
  test_reducescatter(&c, label, 1000, 700, 900);
  test_reducescatter(&c, label, 3, 1, 2);
  test_allgather(&c, label, 5000, 0, (size_t)nranks * 5000);
  test_allgather(&c, label, 5000, 4321, 3000);
  close_comm(&c);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", argc > 1 ? argv[1] : "build");
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  cn = lib ? dlsym(lib, "ncclCollNetPlugin_v12") : NULL;
  int ok = cn && cn->init(&ctx, 0, NULL) == ncclSuccess;
  if (rank == 0) CHECK(ok, "load and init collnet from %s", p);
  if (agree(ok)) {
    run_suite("sharded", "2", "524288");
    run_suite("ring", "2", "524288");
    run_suite("sharded", "3", "4096");
    run_suite("ring", "3", "4096");
    cn->finalize(ctx);
  }
  int rc = 0;
  if (rank == 0) rc = CT_SUMMARY();
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

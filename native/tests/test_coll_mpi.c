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
#include "coll_mpi_util.h"

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

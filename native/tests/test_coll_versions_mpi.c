#define _GNU_SOURCE
/* Every exported CollNet ABI version, through its own layout, at the rank count
 * mpirun gives (run_tests.sh: 2 and 3 ranks on localhost). */
#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "ct_nccl_abi_compat.h"
#include "ct_test.h"

static int rank, nranks;

static int agree(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

#define V 5
#define CN_T ncclCollNet_v5_t
#include "abi_collnet_mpi.inc"
#define V 6
#define CN_T ncclCollNet_v6_t
#include "abi_collnet_mpi.inc"
#define V 7
#define CN_T ncclCollNet_v7_t
#include "abi_collnet_mpi.inc"
#define V 8
#define CN_T ncclCollNet_v8_t
#define SGE_T ncclNetSGE_v8_t
#include "abi_collnet_mpi.inc"
#define V 9
#define CN_T ncclCollNet_v9_t
#define SGE_T ncclNetSGE_v9_t
#include "abi_collnet_mpi.inc"
#define V 10
#define CN_T ncclCollNet_v10_t
#define SGE_T ncclNetSGE_v9_t
#include "abi_collnet_mpi.inc"
#define V 11
#define CN_T ncclCollNet_v11_t
#define SGE_T ncclNetSGE_v12_t
#include "abi_collnet_mpi.inc"
#define V 12
#define CN_T ncclCollNet_v12_t
#define SGE_T ncclNetSGE_v12_t
#include "abi_collnet_mpi.inc"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", argc > 1 ? argv[1] : "build");
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  setenv("CLUSTERTOOL_OFI_LIB", "/nonexistent/libnccl-net-ofi.so", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  int ok = agree(lib != NULL);
  if (rank == 0) CHECK(ok, "load %s", p);
  if (ok) {
    mpi_collnet_v5(lib);
    mpi_collnet_v6(lib);
    mpi_collnet_v7(lib);
    mpi_collnet_v8(lib);
    mpi_collnet_v9(lib);
    mpi_collnet_v10(lib);
    mpi_collnet_v11(lib);
    mpi_collnet_v12(lib);
  }
  int rc = 0;
  if (rank == 0) rc = CT_SUMMARY();
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

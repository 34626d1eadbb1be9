// Real NCCL allreduce with the clustertool plugin loaded. One MPI rank per GPU
// (MPI only carries the ncclUniqueId). Run it with the environment clustertool
// gives jobs, e.g.:
//   mpirun -np 2 -H a,b -x NCCL_NET_PLUGIN=clustertool -x NCCL_COLLNET_ENABLE=1 \
//     -x LD_LIBRARY_PATH -x NCCL_DEBUG=INFO build/nccl_plugin_allreduce 64M
// and look for "Using network clustertool" and "Connected CollNet" (bench/nccl_gpu.py
// reads these for you: native/README.md "GPU proof").
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Our ABI header's values must match the real nccl.h.
static_assert(ncclFloat16 == 6 && ncclFloat32 == 7 && ncclBfloat16 == 9 && ncclInt64 == 4, "dtype values");
static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "redop values");
static_assert(ncclInProgress == 7 && ncclRemoteError == 6, "result values");

#define CK(call, what)                                                          \
  do {                                                                          \
    if (!(call)) { fprintf(stderr, "rank %d: %s failed\n", rank, what); MPI_Abort(MPI_COMM_WORLD, 1); } \
  } while (0)

__global__ void fill(float* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (float)((i % 7) + rank);
}

int main(int argc, char** argv) {
  int rank, nranks;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
  if (argc > 1 && (argv[1][strlen(argv[1]) - 1] == 'M')) bytes = strtoull(argv[1], NULL, 0) << 20;
  size_t n = bytes / sizeof(float);
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0, "cudaGetDeviceCount");
  const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  CK(cudaSetDevice((lr ? atoi(lr) : rank) % ndev) == cudaSuccess, "cudaSetDevice");
  ncclUniqueId id;
  if (rank == 0) CK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CK(ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess, "ncclCommInitRank");
  float* buf;
  cudaStream_t s;
  CK(cudaMalloc(&buf, bytes) == cudaSuccess, "cudaMalloc");
  CK(cudaStreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
  fill<<<256, 256, 0, s>>>(buf, n, rank);
  CK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s) == ncclSuccess, "warmup allreduce");
  CK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  fill<<<256, 256, 0, s>>>(buf, n, rank);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  CK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s) == ncclSuccess, "allreduce");
  cudaEventRecord(b, s);
  CK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  float* host = (float*)malloc(bytes);
  cudaMemcpy(host, buf, bytes, cudaMemcpyDeviceToHost);
  long wrong = 0;
  for (size_t i = 0; i < n; i++) {
    float want = (float)(nranks * (int)(i % 7) + nranks * (nranks - 1) / 2);
    if (host[i] != want) wrong++;
  }
  double algbw = bytes / (ms / 1e3) / 1e9;
  if (rank == 0)
    printf("nccl allreduce %zu bytes on %d ranks: %.3f ms algbw %.3f GB/s busbw %.3f GB/s wrong %ld\n", bytes, nranks,
           ms, algbw, algbw * 2.0 * (nranks - 1) / nranks, wrong);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return wrong ? 1 : 0;
}

/* A small C entry point to the CollNet allreduce for programs that are not NCCL,
 * e.g. a Python workload through ctypes (clustertool/workloads/plugin_allreduce.py):
 *
 *   ar = ct_allreduce_open(rank, nranks, "servers", handle, 128)   listen; fills my handle
 *   ... the caller exchanges handles (rank r's at offset r*128), e.g. mpi4py allgather ...
 *   ct_allreduce_connect(ar, all_handles, nranks * 128)            every rank at once
 *   ct_allreduce(ar, send, recv, count, dtype, op)                 blocking; send == recv is fine
 *   ct_allreduce_close(ar)
 *
 * dtype and op are NCCL's enums (ncclFloat32 = 7, ncclSum = 0, ...). Every call returns
 * 0 on success and -1 on failure, with a one-line reason from ct_allreduce_error(ar). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ct_coll.h"
#include "ct_plugin.h"
#include "ct_reduce.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  int rank, nranks;
  void* listen;
  void* comm;
  char err[256];
} ct_ar_t;

static void* g_ctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int fail(ct_ar_t* ar, const char* fmt, const char* arg) {
  snprintf(ar->err, sizeof ar->err, fmt, arg);
  return -1;
}

EXPORT int ct_allreduce_handle_size(void) { return NCCL_NET_HANDLE_MAXSIZE; }

EXPORT void* ct_allreduce_open(int rank, int nranks, const char* algo, void* handle, size_t handle_len) {
  if (rank < 0 || nranks < 1 || rank >= nranks || !handle || handle_len < NCCL_NET_HANDLE_MAXSIZE) return NULL;
  if (algo && *algo && ct_algo_parse(algo) < 0) return NULL;
  pthread_mutex_lock(&g_mu);
  ncclResult_t r = g_ctx ? ncclSuccess : ncclCollNetPlugin_v12.init(&g_ctx, 0, NULL);
  pthread_mutex_unlock(&g_mu);
  if (r != ncclSuccess) return NULL;
  ct_ar_t* ar = calloc(1, sizeof *ar);
  if (!ar) return NULL;
  ar->rank = rank;
  ar->nranks = nranks;
  memset(handle, 0, handle_len);
  if (ct_collnet_listen_algo(0, algo, handle, &ar->listen) != ncclSuccess) { free(ar); return NULL; }
  return ar;
}

EXPORT int ct_allreduce_connect(void* p, const void* handles, size_t total_len) {
  ct_ar_t* ar = p;
  if (!ar) return -1;
  if (ar->comm) return fail(ar, "%s", "already connected");
  if (!handles || total_len < (size_t)ar->nranks * NCCL_NET_HANDLE_MAXSIZE)
    return fail(ar, "%s", "want every rank's handle (nranks * 128 bytes)");
  void** hs = malloc(sizeof(void*) * (size_t)ar->nranks);
  if (!hs) return fail(ar, "%s", "out of memory");
  for (int r = 0; r < ar->nranks; r++) hs[r] = (char*)handles + (size_t)r * NCCL_NET_HANDLE_MAXSIZE;
  ncclResult_t rc = ncclCollNetPlugin_v12.connect(hs, ar->nranks, ar->rank, ar->listen, &ar->comm);
  free(hs);
  if (rc != ncclSuccess || !ar->comm) { ar->comm = NULL; return fail(ar, "%s", "connect failed (see the WARN above)"); }
  return 0;
}

EXPORT int ct_allreduce(void* p, const void* send, void* recv, size_t count, int dtype, int op) {
  ct_ar_t* ar = p;
  if (!ar) return -1;
  if (!ar->comm) return fail(ar, "%s", "not connected");
  if (!ct_reduce_supported((ncclDataType_t)dtype, (ncclRedOp_t)op))
    return fail(ar, "%s", "unsupported dtype or op");
  ct_req_t* req = NULL;
  int rc;
  while ((rc = ct_coll_allreduce(ar->comm, send, recv, count, (ncclDataType_t)dtype, (ncclRedOp_t)op, &req)) == 1)
    sched_yield();   /* the window is full (not from this blocking caller alone): wait for a slot */
  if (rc != 0 || ct_coll_wait(req, NULL) != 0) return fail(ar, "%s", "allreduce failed (see the WARN above)");
  return 0;
}

EXPORT const char* ct_allreduce_algo(void* p) {
  ct_ar_t* ar = p;
  return ar && ar->comm ? ct_collnet_comm_algo(ar->comm) : "";
}

EXPORT int ct_allreduce_servers(void* p) {
  ct_ar_t* ar = p;
  return ar && ar->comm ? ct_collnet_comm_servers(ar->comm) : 0;
}

EXPORT const char* ct_allreduce_error(void* p) {
  ct_ar_t* ar = p;
  return ar ? ar->err : "no handle";
}

EXPORT void ct_allreduce_close(void* p) {
  ct_ar_t* ar = p;
  if (!ar) return;
  if (ar->comm) ncclCollNetPlugin_v12.closeColl(ar->comm);
  if (ar->listen) ncclCollNetPlugin_v12.closeListen(ar->listen);
  free(ar);
}

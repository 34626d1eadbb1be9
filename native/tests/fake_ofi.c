/* Stand-in for libnccl-net-ofi.so: a v12 net table whose answers are easy to
 * recognise, to test that point-to-point calls are forwarded. */
#include <string.h>
#include "ct_nccl_abi.h"

static ncclResult_t f_init(void** ctx, uint64_t id, ncclNetCommConfig_v12_t* c, ncclDebugLogger_t l,
                           ncclProfilerCallback_t p) {
  (void)id; (void)c; (void)l; (void)p;
  static int token;
  *ctx = &token;
  return ncclSuccess;
}
static ncclResult_t f_devices(int* n) { *n = 7; return ncclSuccess; }
static ncclResult_t f_props(int dev, ncclNetProperties_v12_t* p) {
  (void)dev;
  memset(p, 0, sizeof *p);
  p->name = "fake-ofi-dev";
  p->speed = 400000;
  return ncclSuccess;
}
static ncclResult_t f_finalize(void* ctx) { (void)ctx; return ncclSuccess; }

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = "fake-ofi", .init = f_init, .devices = f_devices, .getProperties = f_props, .finalize = f_finalize};

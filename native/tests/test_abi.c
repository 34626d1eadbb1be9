#define _GNU_SOURCE
/* The built libraries export the symbols NCCL looks for, with tables laid out
 * as ct_nccl_abi.h says (and NCCL's headers publish), and every entry NCCL
 * calls unconditionally is filled in. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "ct_nccl_abi_compat.h"
#include "ct_test.h"

static char* path(const char* dir, const char* name) {
  static char buf[4][512];
  static int k;
  char* b = buf[k++ % 4];
  snprintf(b, 512, "%s/%s", dir, name);
  return b;
}

static void test_layout_runtime(void) {
  /* The same facts as the static assertions, checked again at run time so a
   * test report shows them. */
  CHECK(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "props.maxP2pBytes at 104");
  CHECK(sizeof(ncclNetProperties_v12_t) == 128, "props is 128 bytes");
  CHECK(sizeof(ncclNet_v12_t) == 22 * sizeof(void*), "net v12 has 22 entries");
  CHECK(sizeof(ncclCollNet_v12_t) == 19 * sizeof(void*), "collnet v12 has 19 entries");
  CHECK(sizeof(ncclTuner_v6_t) == 5 * sizeof(void*), "tuner v6 has 5 entries");
  CHECK(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*), "tuner v5 has 4 entries");
  CHECK(ncclBfloat16 == 9 && ncclFloat16 == 6 && ncclFloat32 == 7 && ncclInt64 == 4, "dtype values");
  CHECK(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "redop values");
  CHECK(NCCL_PTR_HOST == 1 && NCCL_PTR_CUDA == 2 && NCCL_PTR_DMABUF == 4, "pointer type flags");
  CHECK(ncclFuncAllReduce == 4 && ncclFuncAllGather == 2 && ncclFuncReduceScatter == 3, "ncclFunc_t values");
}

static void test_net_symbols(const char* dir) {
  void* lib = dlopen(path(dir, "libnccl-net-clustertool.so"), RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "dlopen net plugin: %s", dlerror());
  if (!lib) return;
  ncclNet_v12_t* net = dlsym(lib, "ncclNetPlugin_v12");
  ncclCollNet_v12_t* cn = dlsym(lib, "ncclCollNetPlugin_v12");
  CHECK(net != NULL, "exports ncclNetPlugin_v12");
  CHECK(cn != NULL, "exports ncclCollNetPlugin_v12");
  /* every version NCCL 2.19 .. 2.30 asks for (2.19 looks for v7..v5, 2.30 for v12..v6) */
  for (int v = 5; v <= 12; v++) {
    char sym[64];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    CHECK(dlsym(lib, sym) != NULL, "exports %s", sym);
    snprintf(sym, sizeof sym, "ncclCollNetPlugin_v%d", v);
    CHECK(dlsym(lib, sym) != NULL, "exports %s", sym);
  }
  CHECK(dlsym(lib, "ncclNetPlugin_v4") == NULL && dlsym(lib, "ncclNetPlugin_v13") == NULL,
        "no version NCCL 2.19 .. 2.30 does not know");
  CHECK(dlsym(lib, "ncclTunerPlugin_v6") == NULL && dlsym(lib, "ncclTunerPlugin_v2") == NULL,
        "no tuner symbols in the net library (NCCL >= 2.21 would take them as the tuner)");
  CHECK(dlsym(lib, "ct_reduce") == NULL && dlsym(lib, "ct_props_v9") == NULL, "internal symbols stay hidden");
  if (net) {
    CHECK(net->name && !strcmp(net->name, "clustertool"), "net name");
    CHECK(net->init && net->devices && net->getProperties && net->listen && net->connect && net->accept &&
              net->regMr && net->deregMr && net->isend && net->irecv && net->test && net->closeSend &&
              net->closeRecv && net->closeListen && net->finalize,
          "net entries NCCL always calls are set");
  }
  if (cn) {
    CHECK(cn->init && cn->devices && cn->getProperties && cn->listen && cn->connect && cn->reduceSupport &&
              cn->regMr && cn->deregMr && cn->iallreduce && cn->iallgather && cn->ireducescatter &&
              cn->iflush && cn->test && cn->closeColl && cn->closeListen && cn->finalize,
          "collnet entries are set");
    void* ctx = NULL;
    int n = -1;
    setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
    CHECK(cn->init(&ctx, 1, NULL) == ncclSuccess, "collnet init");
    CHECK(cn->devices(&n) == ncclSuccess && n == 1, "collnet has one device (the TCP net device)");
    ncclNetProperties_v12_t p;
    memset(&p, 0xee, sizeof p);
    CHECK(cn->getProperties(0, &p) == ncclSuccess, "collnet properties");
    CHECK(p.ptrSupport == NCCL_PTR_HOST, "host memory only");
    CHECK(p.maxRecvs == 1 && p.netDeviceType == NCCL_NET_DEVICE_HOST && p.vProps.ndevs == 1, "props fields");
    CHECK(p.speed > 0 && p.maxCollBytes > 0 && p.maxP2pBytes > 0, "props sizes");
    int sup = -1;
    cn->reduceSupport(ncclBfloat16, ncclSum, &sup);
    CHECK(sup == 1, "bf16 sum supported");
    cn->reduceSupport(ncclFloat8e4m3, ncclSum, &sup);
    CHECK(sup == 0, "fp8 not supported");
    cn->reduceSupport(ncclFloat32, ncclAvg, &sup);
    CHECK(sup == 0, "avg not supported");
    void* mh = NULL;
    CHECK(cn->regMr(NULL, &n, sizeof n, NCCL_PTR_CUDA, &mh) != ncclSuccess, "CUDA memory refused");
    cn->finalize(ctx);
  }
  const char* v = dlsym(lib, "clustertool_plugin_version");
  CHECK(v && !strncmp(v, "clustertool-nccl-plugin ", 24), "version string exported");
  dlclose(lib);
}

static void test_tuner_symbols(const char* dir) {
  void* lib = dlopen(path(dir, "libnccl-tuner-clustertool.so"), RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "dlopen tuner plugin: %s", dlerror());
  if (!lib) return;
  ncclTuner_v6_t* t6 = dlsym(lib, "ncclTunerPlugin_v6");
  ncclTuner_v5_t* t5 = dlsym(lib, "ncclTunerPlugin_v5");
  CHECK(t6 && t6->init && t6->getCollInfo && t6->finalize, "exports ncclTunerPlugin_v6");
  CHECK(t5 && t5->init && t5->getCollInfo && t5->finalize, "exports ncclTunerPlugin_v5");
  for (int v = 1; v <= 4; v++) {   /* v1 for NCCL 2.19/2.20, v2 for 2.21, v3 from 2.22, v4 from 2.24 */
    char sym[64];
    snprintf(sym, sizeof sym, "ncclTunerPlugin_v%d", v);
    const ncclTuner_v4_t* t = dlsym(lib, sym);   /* v1..v4 all have name, init, getCollInfo, destroy */
    CHECK(t && t->name && t->init && t->getCollInfo && t->destroy, "exports %s", sym);
  }
  CHECK(t6 && t6->getChunkSize != NULL, "v6 exports getChunkSize (NCCL 2.30: the CollNet chain's chunk)");
  dlclose(lib);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "build";
  test_layout_runtime();
  test_net_symbols(dir);
  test_tuner_symbols(dir);
  return CT_SUMMARY();
}

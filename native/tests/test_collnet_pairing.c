#define _GNU_SOURCE
/* NCCL's conditions for using a CollNet, each pinned against the plugin's own
 * answers (native/README.md "When NCCL uses the CollNet" has the list and where
 * each lives in NCCL's source):
 *   test_collnet_pairing BUILD_DIR             our TCP device
 *   test_collnet_pairing BUILD_DIR FAKE_OFI    p2p forwarded to a 7-device OFI plugin */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "ct_nccl_abi_compat.h"
#include "ct_test.h"

static ncclNet_v12_t* net;
static ncclCollNet_v12_t* cn;
static void *nctx, *cctx;

static int same_str(const char* a, const char* b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* ncclTopoFillNet keys the NIC node by name: CollNet i must be net i. */
static void test_devices_pair_by_index(int forwarded) {
  int nn = -1, nc = -2;
  net->devices(&nn);
  cn->devices(&nc);
  CHECK(nn >= 1 && nc == nn, "as many CollNet devices as net devices (%d, %d)", nc, nn);
  CHECK(!forwarded || nn == 7, "forwarded: the OFI plugin's 7 devices (got %d)", nn);
  for (int i = 0; i < nn; i++) {
    ncclNetProperties_v12_t n, c;
    memset(&n, 0, sizeof n);
    memset(&c, 0, sizeof c);
    CHECK(net->getProperties(i, &n) == ncclSuccess && cn->getProperties(i, &c) == ncclSuccess, "props of dev %d", i);
    CHECK(n.name && same_str(n.name, c.name), "dev %d: CollNet name '%s' is the net name '%s'", i, c.name, n.name);
    CHECK(same_str(n.pciPath, c.pciPath), "dev %d: same pciPath (%s, %s)", i, n.pciPath ? n.pciPath : "null",
          c.pciPath ? c.pciPath : "null");
    CHECK(n.guid == c.guid && n.speed == c.speed && n.port == c.port && n.latency == c.latency &&
              n.maxComms == c.maxComms,
          "dev %d: same guid/speed/port/latency/maxComms (first pass wins in NCCL's XML)", i);
    CHECK(c.speed > 0 && c.maxComms > 0, "dev %d: sane speed and maxComms", i);
    CHECK(c.vProps.ndevs == 1 && c.vProps.devs[0] == i, "dev %d: a physical device", i);
    if (forwarded) {
      char want[32];
      snprintf(want, sizeof want, "fake-ofi-dev%d", i);
      CHECK(same_str(c.name, want), "dev %d: OFI's name %s (got %s)", i, want, c.name);
    }
  }
  int again = -1;
  cn->devices(&again);
  CHECK(again == nc, "the count is stable, so every rank of a job reports the same (NCCL's collnet mismatch check)");
}

/* NCCL registers host buffers with the CollNet when the node has no GDR; our
 * CollNet reduces on the host, so it must say HOST only and take host memory. */
static void test_host_memory_only(void) {
  ncclNetProperties_v12_t c;
  cn->getProperties(0, &c);
  CHECK(c.ptrSupport == NCCL_PTR_HOST, "ptrSupport is NCCL_PTR_HOST only (NCCL then sets gdr=0, no GPUDirect)");
  CHECK(c.netDeviceType == NCCL_NET_DEVICE_HOST, "host device type");
  CHECK(c.maxCollBytes > 0 && c.maxCollBytes <= (size_t)NCCL_MAX_NET_SIZE_BYTES,
        "maxCollBytes in NCCL's allowed range (coll_net.cc sendProxySetup)");
  void *lc, *cc, *mh = NULL;
  char h[NCCL_NET_HANDLE_MAXSIZE];
  void* hp = h;
  CHECK(cn->listen(cctx, 0, h, &lc) == ncclSuccess, "listen");
  CHECK(cn->connect(&hp, 1, 0, lc, &cc) == ncclSuccess && cc, "a one-rank group connects");
  char buf[64];
  CHECK(cn->regMr(cc, buf, sizeof buf, NCCL_PTR_HOST, &mh) == ncclSuccess && mh, "host buffer registers");
  CHECK(cn->regMr(cc, buf, sizeof buf, NCCL_PTR_CUDA, &mh) != ncclSuccess, "CUDA buffer refused");
  cn->closeColl(cc);
  cn->closeListen(lc);
}

/* comm->collNetSupportMatrix[op][type] for op sum/prod/max/min; avg reaches the
 * CollNet as sum (enqueue.cc ncclGetCollNetSupport). */
static void test_reduce_support_matrix(void) {
  int bad = 0;
  for (int t = 0; t < ncclNumTypes; t++)
    for (int op = 0; op < 4; op++) {
      int s = -1;
      cn->reduceSupport((ncclDataType_t)t, (ncclRedOp_t)op, &s);
      int want = !(t == ncclFloat8e4m3 || t == ncclFloat8e5m2);
      if (s != want) { bad++; fprintf(stderr, "type %d op %d: %d\n", t, op, s); }
    }
  CHECK(bad == 0, "every NCCL type but fp8 reduces with sum/prod/max/min");
}

/* A listen on every net device index works: NCCL listens on the graph's netDev. */
static void test_listen_on_every_device(void) {
  int n = 0, ok = 1;
  cn->devices(&n);
  for (int i = 0; i < n; i++) {
    void* lc = NULL;
    char h[NCCL_NET_HANDLE_MAXSIZE];
    ok &= cn->listen(cctx, i, h, &lc) == ncclSuccess && lc;
    if (lc) cn->closeListen(lc);
  }
  void* lc = NULL;
  char h[NCCL_NET_HANDLE_MAXSIZE];
  CHECK(ok, "CollNet listens on each of its %d devices", n);
  CHECK(cn->listen(cctx, n, h, &lc) != ncclSuccess, "no device past the last");
}

/* CollNet Direct's allgather/reducescatter need the plugin's entries (tuning.cc). */
static void test_entries_for_direct(void* lib) {
  CHECK(cn->iallgather && cn->ireducescatter, "v12 has iallgather and ireducescatter");
  const ncclCollNet_v8_t* v8 = dlsym(lib, "ncclCollNetPlugin_v8");
  CHECK(v8 && v8->iallgather && v8->ireducescatter, "v8 (NCCL 2.20+) too");
}

int main(int argc, char** argv) {
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", argc > 1 ? argv[1] : "build");
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  setenv("CLUSTERTOOL_OFI_LIB", argc > 2 ? argv[2] : "/nonexistent/libnccl-net-ofi.so", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  net = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
  cn = lib ? dlsym(lib, "ncclCollNetPlugin_v12") : NULL;
  CHECK(net && cn, "load %s", p);
  if (!net || !cn) return CT_SUMMARY();
  ncclNetCommConfig_v12_t cfg = {-1};
  CHECK(net->init(&nctx, 1, &cfg, NULL, NULL) == ncclSuccess, "net init");
  CHECK(cn->init(&cctx, 1, NULL) == ncclSuccess, "CollNet init (NCCL's collNetSupport needs it and >0 devices)");
  test_devices_pair_by_index(argc > 2);
  test_host_memory_only();
  test_reduce_support_matrix();
  test_listen_on_every_device();
  test_entries_for_direct(lib);
  setenv("CLUSTERTOOL_COLLNET_DISABLE", "1", 1);
  int n = -1;
  cn->devices(&n);
  CHECK(n == 0, "CLUSTERTOOL_COLLNET_DISABLE=1 reports no CollNet device (NCCL then leaves CollNet off)");
  cn->finalize(cctx);
  net->finalize(nctx);
  return CT_SUMMARY();
}

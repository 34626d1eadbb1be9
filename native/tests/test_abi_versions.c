#define _GNU_SOURCE
/* Every exported ABI version, driven through its own layout (the layouts in
 * include/ct_nccl_abi_compat.h are written from each NCCL release's headers and
 * pinned there with static assertions), and the flags of every logger call:
 * NCCL prints nothing whose flags miss NCCL_DEBUG_SUBSYS, WARN included.
 *   test_abi_versions BUILD_DIR */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ct_nccl_abi_compat.h"
#include "ct_test.h"

/* ---------------- logger capture ---------------- */
#define MAXLOG 512
static struct { int level; unsigned long flags; char msg[160]; } logs[MAXLOG];
static int nlogs;
static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)file; (void)line;
  if (nlogs == MAXLOG) return;
  logs[nlogs].level = (int)level;
  logs[nlogs].flags = flags;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(logs[nlogs].msg, sizeof logs[nlogs].msg, fmt, ap);
  va_end(ap);
  nlogs++;
}

/* ---------------- net v5 .. v12 ---------------- */
#define V 5
#define NET_T ncclNet_v5_t
#define PROPS_T ncclNetProperties_v6_t
#include "abi_net_version.inc"
#define V 6
#define NET_T ncclNet_v6_t
#define PROPS_T ncclNetProperties_v6_t
#include "abi_net_version.inc"
#define V 7
#define NET_T ncclNet_v7_t
#define PROPS_T ncclNetProperties_v7_t
#include "abi_net_version.inc"
#define V 8
#define NET_T ncclNet_v8_t
#define PROPS_T ncclNetProperties_v8_t
#include "abi_net_version.inc"
#define V 9
#define NET_T ncclNet_v9_t
#define PROPS_T ncclNetProperties_v9_t
#include "abi_net_version.inc"
#define V 10
#define NET_T ncclNet_v10_t
#define PROPS_T ncclNetProperties_v10_t
#include "abi_net_version.inc"
#define V 11
#define NET_T ncclNet_v11_t
#define PROPS_T ncclNetProperties_v11_t
#include "abi_net_version.inc"
#define V 12
#define NET_T ncclNet_v12_t
#define PROPS_T ncclNetProperties_v12_t
#include "abi_net_version.inc"

/* ---------------- CollNet v5 .. v12 ---------------- */
#define V 5
#define CN_T ncclCollNet_v5_t
#define PROPS_T ncclNetProperties_v6_t
#include "abi_collnet_version.inc"
#define V 6
#define CN_T ncclCollNet_v6_t
#define PROPS_T ncclNetProperties_v6_t
#include "abi_collnet_version.inc"
#define V 7
#define CN_T ncclCollNet_v7_t
#define PROPS_T ncclNetProperties_v7_t
#include "abi_collnet_version.inc"
#define V 8
#define CN_T ncclCollNet_v8_t
#define PROPS_T ncclNetProperties_v8_t
#define SGE_T ncclNetSGE_v8_t
#include "abi_collnet_version.inc"
#define V 9
#define CN_T ncclCollNet_v9_t
#define PROPS_T ncclNetProperties_v9_t
#define SGE_T ncclNetSGE_v9_t
#include "abi_collnet_version.inc"
#define V 10
#define CN_T ncclCollNet_v10_t
#define PROPS_T ncclNetProperties_v10_t
#define SGE_T ncclNetSGE_v9_t
#include "abi_collnet_version.inc"
#define V 11
#define CN_T ncclCollNet_v11_t
#define PROPS_T ncclNetProperties_v11_t
#define SGE_T ncclNetSGE_v12_t
#include "abi_collnet_version.inc"
#define V 12
#define CN_T ncclCollNet_v12_t
#define PROPS_T ncclNetProperties_v12_t
#define SGE_T ncclNetSGE_v12_t
#include "abi_collnet_version.inc"

/* ---------------- tuner v1 .. v6 ---------------- */
enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };
static void fill(float t[NA][NP]) {
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) t[a][p] = 50.0f;
}

static void test_tuner_versions(const char* dir, const char* table) {
  char path[512];
  snprintf(path, sizeof path, "%s/libnccl-tuner-clustertool.so", dir);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "dlopen tuner");
  if (!lib) return;
  setenv("CLUSTERTOOL_TUNER_CONFIG", table, 1);
  float cost[NA][NP];
  int ch;
  /* v6, v5: cost table, per-communicator context, constants */
  const ncclTuner_v6_t* t6 = dlsym(lib, "ncclTunerPlugin_v6");
  const ncclTuner_v5_t* t5 = dlsym(lib, "ncclTunerPlugin_v5");
  void* ctx = NULL;
  ncclTunerConstants_v5_t k;
  if (t6 && t6->init(&ctx, 1, 8, 4, capture_log, NULL, &k) == ncclSuccess) {
    fill(cost), ch = 0;
    t6->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, 0, &ch);
    CHECK(cost[NCCL_ALGO_COLLNET_CHAIN][NCCL_PROTO_SIMPLE] == 0.0f, "tuner v6 picks CollNet chain");
    t6->finalize(ctx);
  } else CHECK(0, "tuner v6");
  if (t5 && t5->init(&ctx, 1, 8, 4, capture_log, NULL, &k) == ncclSuccess) {
    fill(cost), ch = 0;
    t5->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, 0, &ch);
    CHECK(cost[NCCL_ALGO_COLLNET_CHAIN][NCCL_PROTO_SIMPLE] == 0.0f, "tuner v5 picks CollNet chain");
    t5->finalize(ctx);
  } else CHECK(0, "tuner v5");
  /* v4, v3: cost table, context from init's last argument */
  const ncclTuner_v4_t* t4 = dlsym(lib, "ncclTunerPlugin_v4");
  const ncclTuner_v3_t* t3 = dlsym(lib, "ncclTunerPlugin_v3");
  if (t4 && t4->init(8, 4, capture_log, &ctx) == ncclSuccess) {
    fill(cost), ch = 0;
    t4->getCollInfo(ctx, ncclFuncAllReduce, 100, 1, (float**)cost, NA, NP, 0, &ch);
    CHECK(cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == 0.0f && ch == 2, "tuner v4: small allreduce -> ring/LL, 2 channels");
    t4->destroy(ctx);
  } else CHECK(0, "tuner v4");
  if (t3 && t3->init(8, 4, capture_log, &ctx) == ncclSuccess) {
    fill(cost), ch = 0;
    cost[NCCL_ALGO_COLLNET_CHAIN][NCCL_PROTO_SIMPLE] = (float)NCCL_ALGO_PROTO_IGNORE;
    t3->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, &ch);
    CHECK(cost[NCCL_ALGO_COLLNET_CHAIN][NCCL_PROTO_SIMPLE] == (float)NCCL_ALGO_PROTO_IGNORE &&
              cost[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] == 50.0f,
          "tuner v3: a rule for an algorithm NCCL marked unavailable is ignored");
    t3->destroy(ctx);
  } else CHECK(0, "tuner v3");
  /* v2, v1: one algorithm/protocol answer, honouring collNetSupport */
  const ncclTuner_v2_t* t2 = dlsym(lib, "ncclTunerPlugin_v2");
  const ncclTuner_v1_t* t1 = dlsym(lib, "ncclTunerPlugin_v1");
  int algo = NCCL_ALGO_UNDEF, proto = NCCL_PROTO_UNDEF;
  if (t2 && t2->init(8, 4, capture_log, &ctx) == ncclSuccess) {
    ch = 0;
    t2->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, /*collNetSupport*/ 0, /*nvls*/ 1, 1, &algo, &proto, &ch);
    CHECK(algo == NCCL_ALGO_UNDEF && proto == NCCL_PROTO_UNDEF, "tuner v2: no CollNet answer without collNetSupport");
    t2->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, /*collNetSupport*/ 1, /*nvls*/ 0, 1, &algo, &proto, &ch);
    CHECK(algo == NCCL_ALGO_COLLNET_CHAIN && proto == NCCL_PROTO_SIMPLE, "tuner v2: CollNet chain / Simple");
    t2->destroy(ctx);
  } else CHECK(0, "tuner v2");
  if (t1 && t1->init(8, 4, capture_log) == ncclSuccess) {
    algo = proto = -1, ch = 0;
    t1->getCollInfo(ncclFuncAllReduce, 100, 0, 0, 1, &algo, &proto, &ch);
    CHECK(algo == NCCL_ALGO_RING && proto == NCCL_PROTO_LL && ch == 2, "tuner v1: small allreduce -> ring/LL");
    algo = proto = -1;
    t1->getCollInfo(ncclFuncBroadcast, 100, 0, 0, 1, &algo, &proto, &ch);
    CHECK(algo == -1 && proto == -1, "tuner v1: no rule, NCCL decides");
    t1->destroy();
  } else CHECK(0, "tuner v1");
  setenv("CLUSTERTOOL_TUNER_CONFIG", "/nonexistent/ct-table.csv", 1);   /* a WARN */
  if (t6 && t6->init(&ctx, 1, 8, 4, capture_log, NULL, &k) == ncclSuccess) t6->finalize(ctx);
  unsetenv("CLUSTERTOOL_TUNER_CONFIG");
  dlclose(lib);
}

/* ---------------- logger flags ---------------- */
static void check_flags(int from, int to, unsigned long info_flags, const char* what) {
  int info = 0, warn = 0, bad = 0;
  for (int i = from; i < to; i++) {
    if (logs[i].level == NCCL_LOG_WARN) {
      warn++;
      if (logs[i].flags != NCCL_ALL) { bad++; fprintf(stderr, "WARN flags %#lx: %s\n", logs[i].flags, logs[i].msg); }
    } else if (logs[i].level == NCCL_LOG_INFO) {
      info++;
      if (logs[i].flags != info_flags) { bad++; fprintf(stderr, "INFO flags %#lx: %s\n", logs[i].flags, logs[i].msg); }
    }
  }
  CHECK(info > 0 && warn > 0, "%s: captured %d INFO and %d WARN lines", what, info, warn);
  CHECK(bad == 0, "%s: WARN carries NCCL_ALL, INFO carries %#lx", what, info_flags);
}

static const char* TABLE =
    "allreduce,0,1023,ring,ll,2,-1,-1\n"
    "allreduce,1024,16G,collnet_chain,simple,-1,-1,-1\n";

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "build";
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", dir);
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  setenv("CLUSTERTOOL_OFI_LIB", "/nonexistent/libnccl-net-ofi.so", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  ncclNet_v12_t* net = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
  CHECK(net != NULL, "load %s", p);
  if (!net) return CT_SUMMARY();
  ncclNetProperties_v12_t ref;
  void* ctx = NULL;
  net->init(&ctx, 0, NULL, capture_log, NULL);
  net->getProperties(0, &ref);
  test_net_v5(lib, &ref);
  test_net_v6(lib, &ref);
  test_net_v7(lib, &ref);
  test_net_v8(lib, &ref);
  test_net_v9(lib, &ref);
  test_net_v10(lib, &ref);
  test_net_v11(lib, &ref);
  test_net_v12(lib, &ref);
  test_collnet_v5(lib, &ref);
  test_collnet_v6(lib, &ref);
  test_collnet_v7(lib, &ref);
  test_collnet_v8(lib, &ref);
  test_collnet_v9(lib, &ref);
  test_collnet_v10(lib, &ref);
  setenv("CLUSTERTOOL_SOCKS_PER_PEER", "many", 1);   /* a WARN from a CollNet listen */
  test_collnet_v11(lib, &ref);
  unsetenv("CLUSTERTOOL_SOCKS_PER_PEER");
  test_collnet_v12(lib, &ref);
  net->finalize(ctx);
  check_flags(0, nlogs, NCCL_INIT | NCCL_NET, "net and CollNet");
  char table[] = "/tmp/ct_abi_table_XXXXXX";
  int fd = mkstemp(table);
  CHECK(fd >= 0 && write(fd, TABLE, strlen(TABLE)) == (ssize_t)strlen(TABLE), "tuner table");
  close(fd);
  int before = nlogs;
  test_tuner_versions(dir, table);
  unlink(table);
  check_flags(before, nlogs, NCCL_TUNING, "tuner");
  return CT_SUMMARY();
}

#define _GNU_SOURCE
/* Tuner CSV parsing (good and malformed lines), matching, the plugin's effect on
 * NCCL's cost table through the exported v6/v5 tables, and v1's one table shared by
 * every communicator. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ct_nccl_abi_compat.h"
#include "ct_tuner.h"
#include "ct_test.h"

static void test_parse_good(void) {
  ct_tune_rule_t r;
  char err[128];
  CHECK(ct_tune_parse_line("allreduce,0,1M,ring,simple,4,-1,-1", &r, err, sizeof err) == 1, "basic line");
  CHECK(r.coll == ncclFuncAllReduce && r.min_bytes == 0 && r.max_bytes == 1 << 20, "coll and range");
  CHECK(r.algo == NCCL_ALGO_RING && r.proto == NCCL_PROTO_SIMPLE && r.channels == 4, "algo proto channels");
  CHECK(r.nodes == -1 && r.ranks == -1, "wildcards");
  CHECK(ct_tune_parse_line(" AllReduce , 1K , 2G , CollNet_Direct , LL128 , -1 , 4 , 32 # comment", &r, err,
                           sizeof err) == 1, "spaces, case, suffixes, trailing comment");
  CHECK(r.algo == NCCL_ALGO_COLLNET_DIRECT && r.proto == NCCL_PROTO_LL128 && r.max_bytes == 2ull << 30, "fields");
  CHECK(r.nodes == 4 && r.ranks == 32 && r.channels == -1, "nodes ranks");
  CHECK(ct_tune_parse_line("collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks", &r, err,
                           sizeof err) == 0, "header skipped");
  CHECK(ct_tune_parse_line("   # only a comment", &r, err, sizeof err) == 0, "comment skipped");
  CHECK(ct_tune_parse_line("collnet_algo,0,1M,sharded", &r, err, sizeof err) == 0,
        "the net plugin's collnet_algo row is not the tuner's: skipped, not malformed");
  CHECK(ct_tune_parse_line("\n", &r, err, sizeof err) == 0, "blank skipped");
}

static void test_parse_malformed(void) {
  const char* bad[] = {
      "allreduce,0,1M,ring,simple,4,-1",          /* 7 fields */
      "allreduce,0,1M,ring,simple,4,-1,-1,9",     /* 9 fields */
      "alltoall,0,1M,ring,simple,4,-1,-1",        /* unknown collective */
      "allreduce,x,1M,ring,simple,4,-1,-1",       /* bad min */
      "allreduce,0,1Q,ring,simple,4,-1,-1",       /* bad suffix */
      "allreduce,2M,1M,ring,simple,4,-1,-1",      /* min > max */
      "allreduce,0,1M,butterfly,simple,4,-1,-1",  /* unknown algo */
      "allreduce,0,1M,ring,fast,4,-1,-1",         /* unknown proto */
      "allreduce,0,1M,ring,simple,0,-1,-1",       /* zero channels */
      "allreduce,0,1M,ring,simple,4,two,-1",      /* bad nodes */
      "allreduce,-5,1M,ring,simple,4,-1,-1",      /* negative size */
      "allreduce,0,1M,ring,simple,4,-1,",         /* empty ranks */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ct_tune_rule_t r;
    char err[128] = "";
    CHECK(ct_tune_parse_line(bad[i], &r, err, sizeof err) == -1 && err[0], "malformed line %zu rejected: %s", i,
          bad[i]);
  }
}

static const char* TABLE =
    "collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks\n"
    "allreduce,0,65535,ring,ll,2,-1,-1\n"
    "this line is broken\n"
    "allreduce,64K,1G,collnet_direct,simple,8,4,-1\n"
    "allreduce,64K,1G,ring,simple,-1,-1,-1\n"
    "collnet_algo,0,1M,ring\n"
    "allgather,0,1G,ring,simple,-1,-1,-1,extra\n"
    "allgather,0,1G,pat,simple,-1,2,-1\n";

static char* write_table(void) {
  static char name[] = "/tmp/ct_tuner_test_XXXXXX";
  int fd = mkstemp(name);
  if (fd < 0 || write(fd, TABLE, strlen(TABLE)) != (ssize_t)strlen(TABLE)) return NULL;
  close(fd);
  return name;
}

static void test_load_and_match(const char* file) {
  FILE* f = fopen(file, "r");
  ct_tune_table_t t;
  CHECK(f && ct_tune_load(f, file, &t) == 0, "load table");
  if (f) fclose(f);
  CHECK(t.n == 4 && t.bad == 2, "4 rules kept, 2 malformed skipped (got %d, %d)", t.n, t.bad);
  const ct_tune_rule_t* r = ct_tune_match(&t, ncclFuncAllReduce, 1000, 4, 32);
  CHECK(r && r->algo == NCCL_ALGO_RING && r->proto == NCCL_PROTO_LL, "small allreduce -> ring/LL");
  r = ct_tune_match(&t, ncclFuncAllReduce, 1 << 20, 4, 32);
  CHECK(r && r->algo == NCCL_ALGO_COLLNET_DIRECT, "large allreduce on 4 nodes -> collnet");
  r = ct_tune_match(&t, ncclFuncAllReduce, 1 << 20, 8, 64);
  CHECK(r && r->algo == NCCL_ALGO_RING && r->proto == NCCL_PROTO_SIMPLE, "8 nodes fall to next rule");
  CHECK(ct_tune_match(&t, ncclFuncAllReduce, 2ull << 30, 4, 32) == NULL, "beyond all ranges: no rule");
  CHECK(ct_tune_match(&t, ncclFuncBroadcast, 10, 4, 32) == NULL, "other collective: no rule");
  ct_tune_free(&t);
}

static void fill(float* table, int na, int np, float v) {
  for (int i = 0; i < na * np; i++) table[i] = v;
}

static void test_plugin(const char* dir, const char* file) {
  char lib[512];
  snprintf(lib, sizeof lib, "%s/libnccl-tuner-clustertool.so", dir);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen tuner: %s", dlerror());
  if (!h) return;
  ncclTuner_v6_t* t6 = dlsym(h, "ncclTunerPlugin_v6");
  ncclTuner_v5_t* t5 = dlsym(h, "ncclTunerPlugin_v5");
  setenv("CLUSTERTOOL_TUNER_CONFIG", file, 1);
  enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };
  float cost[NA][NP];
  float* rows[NA];
  for (int a = 0; a < NA; a++) rows[a] = cost[a];
  void* ctx = NULL;
  ncclTunerConstants_v5_t k;
  CHECK(t6->init(&ctx, 1, 32, 4, NULL, NULL, &k) == ncclSuccess, "v6 init");
  fill(&cost[0][0], NA, NP, 100.0f);
  int ch = 1;
  CHECK(t6->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, 0, &ch) == ncclSuccess, "v6 get");
  CHECK(cost[NCCL_ALGO_COLLNET_DIRECT][NCCL_PROTO_SIMPLE] == 0.0f && ch == 8, "collnet chosen, 8 channels");
  CHECK(cost[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] == 100.0f, "other entries untouched");
  fill(&cost[0][0], NA, NP, 100.0f);
  cost[NCCL_ALGO_COLLNET_DIRECT][NCCL_PROTO_SIMPLE] = (float)NCCL_ALGO_PROTO_IGNORE;
  ch = 1;
  t6->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, 0, &ch);
  CHECK(cost[NCCL_ALGO_COLLNET_DIRECT][NCCL_PROTO_SIMPLE] == (float)NCCL_ALGO_PROTO_IGNORE && ch == 1,
        "unavailable algorithm is left alone");
  t6->finalize(ctx);
  (void)rows;
  CHECK(t5->init(&ctx, 1, 32, 4, NULL, NULL, &k) == ncclSuccess, "v5 init");
  fill(&cost[0][0], NA, NP, 100.0f);
  t5->getCollInfo(ctx, ncclFuncAllReduce, 100, 1, (float**)cost, NA, NP, 0, &ch);
  CHECK(cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == 0.0f && ch == 2, "v5 small allreduce -> ring/LL");
  t5->finalize(ctx);
  setenv("CLUSTERTOOL_TUNER_CONFIG", "/nonexistent/table.csv", 1);
  CHECK(t6->init(&ctx, 1, 32, 4, NULL, NULL, &k) == ncclSuccess, "missing table: init still succeeds");
  fill(&cost[0][0], NA, NP, 100.0f);
  t6->getCollInfo(ctx, ncclFuncAllReduce, 100, 1, (float**)cost, NA, NP, 0, &ch);
  CHECK(cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == 100.0f, "missing table: NCCL defaults");
  t6->finalize(ctx);
  dlclose(h);
}

/* v1's answer for a small allreduce: ring/LL with 2 channels from the table, else -1s. */
static int v1_small_allreduce(const ncclTuner_v1_t* t1, int* algo, int* proto) {
  int ch = 0;
  *algo = *proto = -1;
  t1->getCollInfo(ncclFuncAllReduce, 100, 0, 0, 1, algo, proto, &ch);
  return ch;
}

/* NCCL 2.19/2.20 call v1's init and destroy once per communicator, and v1 has no
 * context: destroying one communicator must leave the table to the others. */
static void test_v1_communicators(const char* dir, const char* file) {
  char lib[512];
  snprintf(lib, sizeof lib, "%s/libnccl-tuner-clustertool.so", dir);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  const ncclTuner_v1_t* t1 = h ? dlsym(h, "ncclTunerPlugin_v1") : NULL;
  CHECK(t1 != NULL, "dlopen tuner, ncclTunerPlugin_v1");
  if (!t1) { if (h) dlclose(h); return; }
  setenv("CLUSTERTOOL_TUNER_CONFIG", file, 1);
  int algo, proto, ch;
  CHECK(t1->init(32, 4, NULL) == ncclSuccess && t1->init(32, 4, NULL) == ncclSuccess, "v1: two communicators");
  ch = v1_small_allreduce(t1, &algo, &proto);
  CHECK(algo == NCCL_ALGO_RING && proto == NCCL_PROTO_LL && ch == 2, "v1: table's choice with two communicators");
  CHECK(t1->destroy() == ncclSuccess, "v1: first communicator destroyed");
  ch = v1_small_allreduce(t1, &algo, &proto);
  CHECK(algo == NCCL_ALGO_RING && proto == NCCL_PROTO_LL && ch == 2,
        "v1: the live communicator still gets the table's choice (got algo %d proto %d ch %d)", algo, proto, ch);
  CHECK(t1->destroy() == ncclSuccess, "v1: last communicator destroyed");
  ch = v1_small_allreduce(t1, &algo, &proto);
  CHECK(algo == -1 && proto == -1 && ch == 0, "v1: no communicator, no table: NCCL decides");
  CHECK(t1->destroy() == ncclSuccess, "v1: a destroy too many is harmless");
  CHECK(t1->init(32, 4, NULL) == ncclSuccess, "v1: a new communicator after the last one went");
  ch = v1_small_allreduce(t1, &algo, &proto);
  CHECK(algo == NCCL_ALGO_RING && proto == NCCL_PROTO_LL && ch == 2, "v1: the new communicator loads the table");
  CHECK(t1->destroy() == ncclSuccess, "v1: destroyed");
  ch = v1_small_allreduce(t1, &algo, &proto);
  CHECK(algo == -1 && proto == -1, "v1: one destroy per init is enough (the extra one did not go negative)");
  dlclose(h);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "build";
  test_parse_good();
  test_parse_malformed();
  char* file = write_table();
  CHECK(file != NULL, "temp table written");
  if (file) {
    test_load_and_match(file);
    test_plugin(dir, file);
    test_v1_communicators(dir, file);
    unlink(file);
  }
  return CT_SUMMARY();
}

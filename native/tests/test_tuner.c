#define _GNU_SOURCE
/* Tuner CSV parsing (good and malformed lines), matching, the plugin's effect on
 * NCCL's cost table through the exported v6/v5 tables, and v1's one table shared by
 * every communicator; CollNet channel counts held to NCCL_MIN_NCHANNELS; v6's chunk
 * (chunk rows, the COLLNET_CHAIN default). */
#include <dlfcn.h>
#include <stdarg.h>
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
  CHECK(ct_tune_parse_line("chunk, AllReduce, 1M, 4G, CollNet_Chain, 1M", &r, err, sizeof err) == 1 && r.is_chunk &&
        r.coll == ncclFuncAllReduce && r.min_bytes == 1 << 20 && r.max_bytes == 4ull << 30 &&
        r.algo == NCCL_ALGO_COLLNET_CHAIN && r.chunk == 1 << 20, "chunk row");
  CHECK(ct_tune_parse_line("chunk,allreduce,0,1M,collnet_chain,nccl", &r, err, sizeof err) == 1 && r.is_chunk &&
        r.chunk == 0, "chunk row: nccl = NCCL's own");
  CHECK(ct_tune_parse_line("chunk,allreduce,0,1M,ring,auto", &r, err, sizeof err) == 1 && r.is_chunk &&
        r.chunk == CT_CHUNK_AUTO, "chunk row: auto");
  CHECK(ct_tune_parse_line("allreduce,0,1M,ring,simple,4,-1,-1", &r, err, sizeof err) == 1 && !r.is_chunk,
        "a cost rule is not a chunk row");
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
      "chunk,allreduce,0,1M,collnet_chain",       /* chunk row, 5 fields */
      "chunk,allreduce,0,1M,collnet_chain,1M,2",  /* chunk row, 7 fields */
      "chunk,allreduce,0,1M,collnet_chain,1K",    /* under NCCL's grain margin: NCCL would round it to 0 */
      "chunk,allreduce,0,1M,collnet_chain,0",     /* 0: say nccl */
      "chunk,allreduce,0,1M,collnet_chain,big",   /* not a size */
      "chunk,alltoall,0,1M,collnet_chain,1M",     /* unknown collective */
      "chunk,allreduce,2M,1M,collnet_chain,1M",   /* min > max */
      "chunk,allreduce,0,1M,butterfly,1M",        /* unknown algorithm */
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
  setenv("NCCL_MIN_NCHANNELS", "8", 1);   /* NCCL surely has the 8 channels the collnet rule asks for */
  CHECK(t6->init(&ctx, 1, 32, 4, NULL, NULL, &k) == ncclSuccess, "v6 init");
  unsetenv("NCCL_MIN_NCHANNELS");
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

static char g_warn[1024];
static void capture(ncclDebugLogLevel lvl, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (lvl != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_warn, sizeof g_warn, fmt, ap);
  va_end(ap);
}

/* NCCL (2.19-2.30) runs a CollNet collective on exactly the channels the tuner names, without
 * clamping them to the ones it has: the table's count is held to NCCL_MIN_NCHANNELS. */
static void test_collnet_channels(const char* dir, const char* file) {
  char lib[512];
  snprintf(lib, sizeof lib, "%s/libnccl-tuner-clustertool.so", dir);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  ncclTuner_v6_t* t6 = h ? dlsym(h, "ncclTunerPlugin_v6") : NULL;
  CHECK(t6 != NULL, "dlopen tuner v6");
  if (!t6) { if (h) dlclose(h); return; }
  setenv("CLUSTERTOOL_TUNER_CONFIG", file, 1);
  enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };
  float cost[NA][NP];
  static const struct { const char* min; int want; const char* what; } cases[] = {
      {NULL, 1, "NCCL_MIN_NCHANNELS unset: the count is left to NCCL"},
      {"4", 4, "NCCL_MIN_NCHANNELS=4: the rule's 8 held to 4"},
      {"16", 8, "NCCL_MIN_NCHANNELS=16: the rule's 8 as asked"},
      {"", 1, "NCCL_MIN_NCHANNELS empty: left to NCCL"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].min) setenv("NCCL_MIN_NCHANNELS", cases[i].min, 1);
    else unsetenv("NCCL_MIN_NCHANNELS");
    g_warn[0] = 0;
    void* ctx = NULL;
    ncclTunerConstants_v5_t k;
    t6->init(&ctx, 1, 32, 4, capture, NULL, &k);
    fill(&cost[0][0], NA, NP, 100.0f);
    int ch = 1;
    t6->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)cost, NA, NP, 0, &ch);
    CHECK(cost[NCCL_ALGO_COLLNET_DIRECT][NCCL_PROTO_SIMPLE] == 0.0f && ch == cases[i].want, "%s (got %d)",
          cases[i].what, ch);
    if (i == 0)
      CHECK(strstr(g_warn, ":4 asks for 8 channels for collnet_direct") && strstr(g_warn, "NCCL_MIN_NCHANNELS=8"),
            "the WARN names the rule and the setting that gets the channels: %s", g_warn);
    /* ring rules are NCCL's to clamp: left as written */
    fill(&cost[0][0], NA, NP, 100.0f);
    ch = 1;
    t6->getCollInfo(ctx, ncclFuncAllReduce, 100, 1, (float**)cost, NA, NP, 0, &ch);
    CHECK(ch == 2, "a ring rule's channels stay as written (%d)", ch);
    t6->finalize(ctx);
  }
  unsetenv("NCCL_MIN_NCHANNELS");
  dlclose(h);
}

/* The default chunk for COLLNET_CHAIN: requests (up to 8 channels folded) of at most 2 MiB, at
 * least 8 steps per channel, never below NCCL's chunk. */
static void test_default_chunk(void) {
  CHECK(ct_tune_default_chunk(16 << 20, 2, 1, 128 << 10) == 1 << 20,
        "16 MiB on 2 channels: 1 MiB chunks (2 MiB requests)");
  CHECK(ct_tune_default_chunk(64 << 20, 2, 1, 256 << 10) == 1 << 20, "64 MiB on 2 channels: 1 MiB chunks");
  CHECK(ct_tune_default_chunk(4 << 20, 2, 1, 128 << 10) == 256 << 10, "4 MiB on 2 channels: 256 KiB (8 steps each)");
  CHECK(ct_tune_default_chunk(2 << 20, 2, 1, 128 << 10) == 128 << 10, "2 MiB on 2 channels: NCCL's 128 KiB");
  CHECK(ct_tune_default_chunk(64 << 20, 8, 1, 128 << 10) == 256 << 10,
        "64 MiB on 8 channels: 256 KiB (2 MiB requests)");
  CHECK(ct_tune_default_chunk(64 << 20, 16, 1, 128 << 10) == 256 << 10, "16 channels fold 8 per request: 256 KiB");
  CHECK(ct_tune_default_chunk(1 << 20, 2, 1, 64 << 10) == 64 << 10, "small: never below NCCL's chunk");
  CHECK(ct_tune_default_chunk(1 << 30, 0, 1, 128 << 10) == 128 << 10, "no channels: NCCL's chunk");
  CHECK(ct_tune_default_chunk(32 << 20, 2, 4, 128 << 10) == 512 << 10,
        "4 ranks per node: 32 steps per channel (512 KiB at 32 MiB)");
  CHECK(ct_tune_default_chunk(16 << 20, 2, 8, 128 << 10) == 128 << 10, "8 ranks per node at 16 MiB: NCCL's chunk");
  int ok = 1;
  for (size_t n = 64 << 10; n <= (size_t)4 << 30; n *= 2)
    for (int c = 1; c <= 32; c++)
      for (size_t nccl = 32 << 10; nccl <= 256 << 10; nccl *= 2) {
        for (int d = 1; d <= 8; d *= 2) {
          size_t k = ct_tune_default_chunk(n, c, d, nccl), folded = (size_t)(c < 8 ? c : 8);
          ok &= k >= nccl &&
                (k == nccl || (folded * k <= (2u << 20) && n / ((size_t)c * k) >= 8u * d && k % 4096 == 0));
        }
      }
  CHECK(ok, "every size x channels x depth x NCCL chunk: >= NCCL's, else requests <= 2 MiB, >= 8 steps per chain rank, "
        "4 KiB-aligned");
}

static const char* CHUNK_TABLE =
    "chunk,allreduce,0,1M,collnet_chain,nccl\n"
    "chunk,allreduce,0,4G,ring,64K\n"
    "chunk,allreduce,0,4G,collnet_direct,auto\n"
    "chunk,allgather,0,4G,collnet_chain,512K\n";

/* v6's getChunkSize through the exported table. */
static void test_chunk_v6(const char* dir) {
  char lib[512], name[] = "/tmp/ct_tuner_chunk_XXXXXX";
  snprintf(lib, sizeof lib, "%s/libnccl-tuner-clustertool.so", dir);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  ncclTuner_v6_t* t6 = h ? dlsym(h, "ncclTunerPlugin_v6") : NULL;
  CHECK(t6 != NULL && t6->getChunkSize != NULL, "v6 exports getChunkSize");
  int fd = mkstemp(name);
  CHECK(fd >= 0 && write(fd, CHUNK_TABLE, strlen(CHUNK_TABLE)) == (ssize_t)strlen(CHUNK_TABLE), "chunk table written");
  if (fd >= 0) close(fd);
  if (!t6 || !t6->getChunkSize || fd < 0) { if (h) dlclose(h); unlink(name); return; }
  ncclTunerConstants_v5_t k;
  void* ctx = NULL;
  unsetenv("CLUSTERTOOL_TUNER_CONFIG");
  CHECK(t6->init(&ctx, 1, 4, 4, NULL, NULL, &k) == ncclSuccess, "v6 init without a table");
  size_t c = 128 << 10;
  CHECK(t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_COLLNET_CHAIN, NCCL_PROTO_SIMPLE, 2, &c) ==
            ncclSuccess && c == 1 << 20, "no table: CollNet chain 16 MiB on 2 channels gets 1 MiB chunks (%zu)", c);
  c = 256 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 256 << 10, "no table: ring keeps NCCL's chunk");
  c = 128 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_COLLNET_DIRECT, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 128 << 10, "no table: CollNet direct keeps NCCL's chunk");
  t6->finalize(ctx);
  setenv("CLUSTERTOOL_TUNER_CONFIG", name, 1);
  CHECK(t6->init(&ctx, 1, 4, 4, NULL, NULL, &k) == ncclSuccess, "v6 init with chunk rows");
  c = 64 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_COLLNET_CHAIN, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 64 << 10, "row 'nccl': NCCL's chunk kept at 1 MiB");
  c = 128 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_COLLNET_CHAIN, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 1 << 20, "no row for 16 MiB: the default (%zu)", c);
  c = 256 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 64 << 10, "a ring row's 64K (%zu)", c);
  c = 128 << 10;
  t6->getChunkSize(ctx, ncclFuncAllReduce, 16 << 20, NCCL_ALGO_COLLNET_DIRECT, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 1 << 20, "row 'auto' for CollNet direct: the default rule (%zu)", c);
  c = 128 << 10;
  t6->getChunkSize(ctx, ncclFuncAllGather, 16 << 20, NCCL_ALGO_COLLNET_CHAIN, NCCL_PROTO_SIMPLE, 2, &c);
  CHECK(c == 512 << 10, "a row for another collective (%zu)", c);
  t6->finalize(ctx);
  unlink(name);
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
  test_default_chunk();
  char* file = write_table();
  CHECK(file != NULL, "temp table written");
  if (file) {
    test_load_and_match(file);
    test_plugin(dir, file);
    test_v1_communicators(dir, file);
    test_collnet_channels(dir, file);
    unlink(file);
  }
  test_chunk_v6(dir);
  return CT_SUMMARY();
}

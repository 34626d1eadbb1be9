/* ncclTunerPlugin_v6 .. _v1: picks algorithm/protocol/channels from the CSV table at
 * $CLUSTERTOOL_TUNER_CONFIG. No table, or no matching rule: NCCL's own choice. CollNet rules get
 * no more channels than NCCL surely has (ct_tune_limit_channels). v6 (NCCL 2.30) also sets the
 * chunk: a chunk row's, else for COLLNET_CHAIN ct_tune_default_chunk (larger CollNet requests).
 * NCCL looks for (src/misc/tuner.cc up to 2.25, src/plugin/tuner.cc after):
 *   2.19-2.20 v1; 2.21 v2; 2.22-2.23 v3, v2; 2.24-2.27 v4..v2; 2.28-2.29 v5..v2; 2.30 v6..v2.
 * v3 on share the cost-table interface; v1/v2 return one algorithm and protocol,
 * so their adapter runs the same rule against a table marking what NCCL said is
 * unavailable (CollNet without collNetSupport, NVLS without nvlsSupport, and PAT,
 * which those releases do not have). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "ct_common.h"
#include "ct_nccl_abi_compat.h"
#include "ct_tuner.h"

typedef struct { ct_tune_table_t t; size_t nodes, ranks; int said_chunk; } ct_tuner_ctx_t;

static ncclResult_t tn_init(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                            ncclNvlDomainInfo_v5_t* nvl, ncclTunerConstants_v5_t* constants) {
  (void)commId; (void)nvl; (void)constants;
  if (log) ct_logger = log;
  ct_tuner_ctx_t* c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->nodes = nNodes;
  c->ranks = nRanks;
  const char* path = ct_env_str("CLUSTERTOOL_TUNER_CONFIG", NULL);
  if (path) {
    FILE* f = fopen(path, "r");
    if (!f) CT_WARN("tuner: cannot open %s; using NCCL defaults", path);
    else {
      ct_tune_load(f, path, &c->t);
      fclose(f);
      CT_INFO("tuner: %d rules from %s (%d malformed lines skipped)", c->t.n, path, c->t.bad);
      ct_tune_limit_channels(&c->t, ct_tune_sure_channels(), path);
    }
  }
  *ctx = c;
  return ncclSuccess;
}

static ncclResult_t tn_get(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                           int numProto, int regBuff, int* nChannels) {
  (void)numPipeOps; (void)regBuff;
  ct_tuner_ctx_t* c = ctx;
  const ct_tune_rule_t* r = ct_tune_match(&c->t, (int)coll, nBytes, c->nodes, c->ranks);
  if (r) ct_tune_apply(r, table, numAlgo, numProto, nChannels);
  return ncclSuccess;
}

/* v6: NCCL 2.30 asks after its own chunking (src/enqueue.cc calcCollChunking) and clamps the
 * answer to its buffer's step (NCCL_BUFFSIZE / NCCL_STEPS), then to its protocol grain. For
 * COLLNET_CHAIN the proxy folds up to 8 channels' chunks of a step into one CollNet request. */
static ncclResult_t tn_chunk(void* ctx, ncclFunc_t coll, size_t nBytes, int algo, int proto, int nChannels,
                             size_t* chunkSize) {
  ct_tuner_ctx_t* c = ctx;
  if (!c || !chunkSize || *chunkSize == 0) return ncclSuccess;
  const ct_tune_rule_t* r = ct_tune_match_chunk(&c->t, (int)coll, nBytes, algo);
  size_t want;
  if (r && r->chunk == 0) return ncclSuccess;   /* "nccl": NCCL's own */
  if (r && r->chunk != CT_CHUNK_AUTO) want = r->chunk;
  else if (r || (algo == NCCL_ALGO_COLLNET_CHAIN && proto == NCCL_PROTO_SIMPLE))
    want = ct_tune_default_chunk(nBytes, nChannels, c->nodes ? (int)(c->ranks / c->nodes) : 1, *chunkSize);
  else return ncclSuccess;
  if (want != *chunkSize && !c->said_chunk++)
    CT_INFO("tuner: chunk %zu instead of NCCL's %zu for %zu bytes on %d channels (algorithm %d%s)", want, *chunkSize,
            nBytes, nChannels, algo, r ? ", a chunk row" : "");
  *chunkSize = want;
  return ncclSuccess;
}

static ncclResult_t tn_finalize(void* ctx) {
  ct_tuner_ctx_t* c = ctx;
  if (c) { ct_tune_free(&c->t); free(c); }
  return ncclSuccess;
}

/* ---- v4, v3: the cost table without (v3) or with (v4) regBuff ---- */
static ncclResult_t tn_init_v4(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void** ctx) {
  return tn_init(ctx, 0, nRanks, nNodes, log, NULL, NULL);
}
static ncclResult_t tn_get_v4(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                              int numProto, int regBuff, int* nChannels) {
  return tn_get(ctx, coll, nBytes, numPipeOps, table, numAlgo, numProto, regBuff, nChannels);
}
static ncclResult_t tn_get_v3(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                              int numProto, int* nChannels) {
  return tn_get(ctx, coll, nBytes, numPipeOps, table, numAlgo, numProto, 0, nChannels);
}

/* ---- v2, v1: one answer instead of a cost table ---- */
static ncclResult_t tn_get_v2(void* ctx, ncclFunc_t coll, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  enum { NA = NCCL_NUM_ALGORITHMS_V5, NP = NCCL_NUM_PROTOCOLS_V5 };
  float cost[NA][NP];
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) {
      int off = ((a == NCCL_ALGO_COLLNET_DIRECT || a == NCCL_ALGO_COLLNET_CHAIN) && !collNetSupport) ||
                ((a == NCCL_ALGO_NVLS || a == NCCL_ALGO_NVLS_TREE) && !nvlsSupport) || a == NCCL_ALGO_PAT;
      cost[a][p] = off ? (float)NCCL_ALGO_PROTO_IGNORE : 1.0f;
    }
  int ch = nChannels ? *nChannels : 0;
  ncclResult_t r = tn_get(ctx, coll, nBytes, numPipeOps, (float**)cost, NA, NP, 0, &ch);
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++)
      if (cost[a][p] == 0.0f) { *algorithm = a; *protocol = p; if (nChannels) *nChannels = ch; }
  return r;
}
static ncclResult_t tn_destroy(void* ctx) { return tn_finalize(ctx); }

/* v1 gives the plugin no context, yet NCCL 2.19/2.20 call its init and destroy once per
 * communicator (2.19.3 src/init.cc). So every communicator shares one table, counted:
 * the first init loads it (with that communicator's node and rank counts; v1's
 * getCollInfo cannot tell communicators apart), later inits share it, and only the
 * last destroy frees it. Freeing it at the first destroy left the other communicators
 * with NCCL's defaults, silently. */
static void* g_v1_ctx;
static int g_v1_refs;   /* live communicators */
static pthread_mutex_t g_v1_mu = PTHREAD_MUTEX_INITIALIZER;
static ncclResult_t tn_init_v1(size_t nRanks, size_t nNodes, ncclDebugLogger_t log) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&g_v1_mu);
  if (g_v1_refs == 0) r = tn_init_v4(nRanks, nNodes, log, &g_v1_ctx);
  if (r == ncclSuccess) g_v1_refs++;
  pthread_mutex_unlock(&g_v1_mu);
  return r;
}
static ncclResult_t tn_get_v1(ncclFunc_t coll, size_t nBytes, int collNetSupport, int nvlsSupport, int numPipeOps,
                              int* algorithm, int* protocol, int* nChannels) {
  pthread_mutex_lock(&g_v1_mu);
  ncclResult_t r = g_v1_ctx ? tn_get_v2(g_v1_ctx, coll, nBytes, collNetSupport, nvlsSupport, numPipeOps, algorithm,
                                        protocol, nChannels)
                            : ncclSuccess;
  pthread_mutex_unlock(&g_v1_mu);
  return r;
}
static ncclResult_t tn_destroy_v1(void) {
  void* last = NULL;
  pthread_mutex_lock(&g_v1_mu);
  if (g_v1_refs > 0 && --g_v1_refs == 0) {   /* a destroy without an init changes nothing */
    last = g_v1_ctx;
    g_v1_ctx = NULL;
  }
  pthread_mutex_unlock(&g_v1_mu);
  return last ? tn_finalize(last) : ncclSuccess;
}

#define EXPORT __attribute__((visibility("default")))
EXPORT ncclTuner_v4_t ncclTunerPlugin_v4 = {
    .name = "clustertool", .init = tn_init_v4, .getCollInfo = tn_get_v4, .destroy = tn_destroy};
EXPORT ncclTuner_v3_t ncclTunerPlugin_v3 = {
    .name = "clustertool", .init = tn_init_v4, .getCollInfo = tn_get_v3, .destroy = tn_destroy};
EXPORT ncclTuner_v2_t ncclTunerPlugin_v2 = {
    .name = "clustertool", .init = tn_init_v4, .getCollInfo = tn_get_v2, .destroy = tn_destroy};
EXPORT ncclTuner_v1_t ncclTunerPlugin_v1 = {
    .name = "clustertool", .init = tn_init_v1, .getCollInfo = tn_get_v1, .destroy = tn_destroy_v1};

__attribute__((visibility("default"))) ncclTuner_v6_t ncclTunerPlugin_v6 = {
    .name = "clustertool", .init = tn_init, .getCollInfo = tn_get, .finalize = tn_finalize, .getChunkSize = tn_chunk};

__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "clustertool", .init = tn_init, .getCollInfo = tn_get, .finalize = tn_finalize};

/* ncclTunerPlugin_v6 / _v5: picks algorithm/protocol/channels from the CSV table at
 * $CLUSTERTOOL_TUNER_CONFIG. No table, or no matching rule: NCCL's own choice. */
#include <stdio.h>
#include <stdlib.h>
#include "ct_common.h"
#include "ct_tuner.h"

typedef struct { ct_tune_table_t t; size_t nodes, ranks; } ct_tuner_ctx_t;

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

static ncclResult_t tn_finalize(void* ctx) {
  ct_tuner_ctx_t* c = ctx;
  if (c) { ct_tune_free(&c->t); free(c); }
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclTuner_v6_t ncclTunerPlugin_v6 = {
    .name = "clustertool", .init = tn_init, .getCollInfo = tn_get, .finalize = tn_finalize, .getChunkSize = NULL};

__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "clustertool", .init = tn_init, .getCollInfo = tn_get, .finalize = tn_finalize};

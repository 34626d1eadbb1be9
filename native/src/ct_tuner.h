/* CSV tuning table: collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks
 * and chunk rows: chunk,collective,min_bytes,max_bytes,algorithm,CHUNK (tuner v6, NCCL 2.30+). */
#ifndef CT_TUNER_H
#define CT_TUNER_H
#include <stddef.h>
#include <stdio.h>
#include "ct_nccl_abi.h"

typedef struct {
  int coll;            /* ncclFunc_t */
  size_t min_bytes, max_bytes;   /* inclusive range */
  int algo, proto;     /* NCCL_ALGO_*, NCCL_PROTO_* */
  int channels;        /* -1: leave to NCCL */
  int nodes, ranks;    /* -1: any */
  int is_chunk;        /* a chunk row: chunk (bytes; 0 = NCCL's own, CT_CHUNK_AUTO = the default rule) */
  size_t chunk;
  int line;            /* in its file, for messages */
} ct_tune_rule_t;
#define CT_CHUNK_AUTO ((size_t)-1)

typedef struct {
  ct_tune_rule_t* rules;
  int n, cap;
  int bad;             /* malformed lines skipped */
} ct_tune_table_t;

/* Parses one line into *r. Returns 1 rule, 0 blank/comment/header, -1 malformed
 * (err gets a reason). */
int ct_tune_parse_line(const char* line, ct_tune_rule_t* r, char* err, size_t errlen);
/* Reads a whole table; malformed lines are reported through CT_WARN and skipped. */
int ct_tune_load(FILE* f, const char* name, ct_tune_table_t* t);
void ct_tune_free(ct_tune_table_t* t);
/* First cost rule matching; NULL when none. */
const ct_tune_rule_t* ct_tune_match(const ct_tune_table_t* t, int coll, size_t bytes, size_t nodes, size_t ranks);
/* First chunk row matching; NULL when none. */
const ct_tune_rule_t* ct_tune_match_chunk(const ct_tune_table_t* t, int coll, size_t bytes, int algo);

/* The channel count NCCL is sure to have (NCCL_MIN_NCHANNELS, or the older NCCL_MIN_NRINGS, at
 * most 32): NCCL raises every communicator to it. 0 when unset. NCCL schedules a CollNet
 * collective (collnet_direct, collnet_chain) on exactly the channels the tuner names, without
 * clamping them to the channels it has (enqueue.cc, 2.19 to 2.30); more fails or crashes. */
int ct_tune_sure_channels(void);
/* Caps the channels of CollNet rules at sure (ct_tune_sure_channels); with sure = 0 they go back
 * to NCCL's choice. WARNs (once per process) naming the first rule changed; returns how many. */
int ct_tune_limit_channels(ct_tune_table_t* t, int sure, const char* name);
/* The chunk for a COLLNET_CHAIN step when no row says otherwise: requests (NCCL folds up to 8
 * channels' chunks into one) of up to 2 MiB, while each channel keeps at least 8 steps (NCCL's
 * window of requests in flight) per rank of its node's chain (depth = ranks per node, as NCCL's
 * own chunking counts it); never below NCCL's own chunk, a multiple of 4 KiB. NCCL clamps the
 * answer to its buffer (NCCL_BUFFSIZE / 8). */
size_t ct_tune_default_chunk(size_t nBytes, int nChannels, int depth, size_t ncclChunk);
/* Applies a rule to NCCL's cost table; returns 1 if applied. */
int ct_tune_apply(const ct_tune_rule_t* r, float** table, int numAlgo, int numProto, int* nChannels);
#endif

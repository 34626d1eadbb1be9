/* CSV tuning table: collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks */
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
} ct_tune_rule_t;

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
/* First rule matching; NULL when none. */
const ct_tune_rule_t* ct_tune_match(const ct_tune_table_t* t, int coll, size_t bytes, size_t nodes, size_t ranks);
/* Applies a rule to NCCL's cost table; returns 1 if applied. */
int ct_tune_apply(const ct_tune_rule_t* r, float** table, int numAlgo, int numProto, int* nChannels);
#endif

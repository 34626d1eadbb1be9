#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "ct_common.h"
#include "ct_tuner.h"

static const char* COLLS[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* ALGOS[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
static const char* PROTOS[] = {"ll", "ll128", "simple"};

static int lookup(const char* s, const char** names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcasecmp(s, names[i])) return i;
  return -1;
}

static int parse_int(const char* s, int* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < -1 || v > 1 << 20) return -1;
  *out = (int)v;
  return 0;
}

#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

int ct_tune_parse_line(const char* line, ct_tune_rule_t* r, char* err, size_t errlen) {
  char buf[512];
  if (strlen(line) >= sizeof buf) BAD("line too long");
  strcpy(buf, line);
  char* hash = strchr(buf, '#');
  if (hash) *hash = 0;
  char* s = ct_trim(buf);
  if (!*s) return 0;
  char* f[9];
  int n = 0;
  for (char* p = s; n < 9; n++) {
    f[n] = p;
    char* comma = strchr(p, ',');
    if (!comma) { n++; break; }
    *comma = 0;
    p = comma + 1;
  }
  for (int i = 0; i < n; i++) f[i] = ct_trim(f[i]);
  if (n >= 1 && !strcasecmp(f[0], "collective")) return 0;  /* header */
  if (n >= 1 && !strcasecmp(f[0], "collnet_algo")) return 0;  /* the net plugin's per-size CollNet rule */
  if (n != 8) BAD("want 8 fields, got %d", n);
  if ((r->coll = lookup(f[0], COLLS, 5)) < 0) BAD("unknown collective '%s'", f[0]);
  uint64_t lo, hi;
  if (ct_parse_size(f[1], &lo)) BAD("bad min bytes '%s'", f[1]);
  if (ct_parse_size(f[2], &hi)) BAD("bad max bytes '%s'", f[2]);
  r->min_bytes = (size_t)lo;
  r->max_bytes = (size_t)hi;
  if (r->min_bytes > r->max_bytes) BAD("min bytes above max bytes");
  if ((r->algo = lookup(f[3], ALGOS, 7)) < 0) BAD("unknown algorithm '%s'", f[3]);
  if ((r->proto = lookup(f[4], PROTOS, 3)) < 0) BAD("unknown protocol '%s'", f[4]);
  if (parse_int(f[5], &r->channels) || r->channels == 0) BAD("bad channels '%s'", f[5]);
  if (parse_int(f[6], &r->nodes) || r->nodes == 0) BAD("bad nodes '%s'", f[6]);
  if (parse_int(f[7], &r->ranks) || r->ranks == 0) BAD("bad ranks '%s'", f[7]);
  return 1;
}

int ct_tune_load(FILE* f, const char* name, ct_tune_table_t* t) {
  memset(t, 0, sizeof *t);
  char line[1024], err[128];
  for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
    ct_tune_rule_t r;
    int k = ct_tune_parse_line(line, &r, err, sizeof err);
    if (k < 0) {
      CT_WARN("tuner: %s:%d: %s; line skipped", name, lineno, err);
      t->bad++;
      continue;
    }
    if (k == 0) continue;
    if (t->n == t->cap) {
      int cap = t->cap ? 2 * t->cap : 16;
      ct_tune_rule_t* nr = realloc(t->rules, sizeof *nr * (size_t)cap);
      if (!nr) return -1;
      t->rules = nr;
      t->cap = cap;
    }
    t->rules[t->n++] = r;
  }
  return 0;
}

void ct_tune_free(ct_tune_table_t* t) {
  free(t->rules);
  memset(t, 0, sizeof *t);
}

const ct_tune_rule_t* ct_tune_match(const ct_tune_table_t* t, int coll, size_t bytes, size_t nodes, size_t ranks) {
  for (int i = 0; i < t->n; i++) {
    const ct_tune_rule_t* r = &t->rules[i];
    if (r->coll == coll && bytes >= r->min_bytes && bytes <= r->max_bytes &&
        (r->nodes < 0 || (size_t)r->nodes == nodes) && (r->ranks < 0 || (size_t)r->ranks == ranks))
      return r;
  }
  return NULL;
}

int ct_tune_apply(const ct_tune_rule_t* r, float** table, int numAlgo, int numProto, int* nChannels) {
  if (r->algo >= numAlgo || r->proto >= numProto) return 0;
  float* cost = (float*)table + r->algo * numProto + r->proto;   /* [numAlgo][numProto] */
  if (*cost == (float)NCCL_ALGO_PROTO_IGNORE) return 0;           /* not available here */
  *cost = 0.0f;
  if (r->channels > 0 && nChannels) *nChannels = r->channels;
  return 1;
}

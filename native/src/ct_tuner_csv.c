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

/* The least chunk a row may ask for: NCCL rounds the chunk down to its protocol's grain (512 B
 * for SIMPLE, 1920 B for LL128) and divides by it, so a chunk under the grain would be 0. */
#define CT_CHUNK_MIN 4096

/* chunk,COLLECTIVE,MIN_BYTES,MAX_BYTES,ALGORITHM,CHUNK: f[0] is "chunk". */
static int parse_chunk_row(char** f, int n, ct_tune_rule_t* r, char* err, size_t errlen) {
  if (n != 6) BAD("a chunk row wants 6 fields, got %d", n);
  memset(r, 0, sizeof *r);
  r->is_chunk = 1;
  r->channels = r->nodes = r->ranks = r->proto = -1;
  if ((r->coll = lookup(f[1], COLLS, 5)) < 0) BAD("unknown collective '%s'", f[1]);
  uint64_t lo, hi, c;
  if (ct_parse_size(f[2], &lo)) BAD("bad min bytes '%s'", f[2]);
  if (ct_parse_size(f[3], &hi)) BAD("bad max bytes '%s'", f[3]);
  if (lo > hi) BAD("min bytes above max bytes");
  r->min_bytes = (size_t)lo;
  r->max_bytes = (size_t)hi;
  if ((r->algo = lookup(f[4], ALGOS, 7)) < 0) BAD("unknown algorithm '%s'", f[4]);
  if (!strcasecmp(f[5], "nccl")) r->chunk = 0;
  else if (!strcasecmp(f[5], "auto")) r->chunk = CT_CHUNK_AUTO;
  else if (ct_parse_size(f[5], &c) || c < CT_CHUNK_MIN || c > (1u << 30))
    BAD("bad chunk '%s' (want 4K..1G, auto or nccl)", f[5]);
  else r->chunk = (size_t)c;
  return 1;
}

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
  if (n >= 1 && !strcasecmp(f[0], "chunk")) return parse_chunk_row(f, n, r, err, errlen);
  if (n != 8) BAD("want 8 fields, got %d", n);
  memset(r, 0, sizeof *r);
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
    r.line = lineno;
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
    if (!r->is_chunk && r->coll == coll && bytes >= r->min_bytes && bytes <= r->max_bytes &&
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

const ct_tune_rule_t* ct_tune_match_chunk(const ct_tune_table_t* t, int coll, size_t bytes, int algo) {
  for (int i = 0; i < t->n; i++) {
    const ct_tune_rule_t* r = &t->rules[i];
    if (r->is_chunk && r->coll == coll && r->algo == algo && bytes >= r->min_bytes && bytes <= r->max_bytes) return r;
  }
  return NULL;
}

static int env_channels(const char* name, const char* older) {
  const char* s = getenv(name);
  if (!s || !*s) s = getenv(older);
  if (!s || !*s) return 0;
  char* end;
  long v = strtol(s, &end, 10);
  return (*end || v < 0) ? 0 : v > 32 ? 32 : (int)v;   /* 32: MAXCHANNELS up to 2.2x, and any CollNet's need */
}

int ct_tune_sure_channels(void) { return env_channels("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS"); }

int ct_tune_limit_channels(ct_tune_table_t* t, int sure, const char* name) {
  static int warned;
  int changed = 0;
  for (int i = 0; i < t->n; i++) {
    ct_tune_rule_t* r = &t->rules[i];
    if (r->is_chunk || (r->algo != NCCL_ALGO_COLLNET_DIRECT && r->algo != NCCL_ALGO_COLLNET_CHAIN)) continue;
    if (r->channels <= 0 || (sure > 0 && r->channels <= sure)) continue;
    if (!changed++ && !warned++) {
      if (sure)
        CT_WARN("tuner: %s:%d asks for %d channels for %s, more than NCCL_MIN_NCHANNELS=%d, the count NCCL surely "
                "has (it does not clamp a CollNet's channels to the ones it has); using %d",
                name, r->line, r->channels, ALGOS[r->algo], sure, sure);
      else
        CT_WARN("tuner: %s:%d asks for %d channels for %s, but NCCL_MIN_NCHANNELS is unset, so NCCL may have fewer "
                "(it does not clamp a CollNet's channels to the ones it has); leaving the count to NCCL: set "
                "NCCL_MIN_NCHANNELS=%d to get them", name, r->line, r->channels, ALGOS[r->algo], r->channels);
    }
    r->channels = sure > 0 ? sure : -1;
  }
  return changed;
}

size_t ct_tune_default_chunk(size_t nBytes, int nChannels, int depth, size_t ncclChunk) {
  if (nChannels < 1) return ncclChunk;
  size_t folded = (size_t)(nChannels < 8 ? nChannels : 8);   /* COLLNET_GROUP_NSUBS: channels per request */
  size_t steps = 8 * (size_t)(depth > 1 ? depth : 1);
  size_t c = ((size_t)2 << 20) / folded;
  while (c > ncclChunk && nBytes / ((size_t)nChannels * c) < steps) c /= 2;
  c &= ~(size_t)4095;   /* a whole number of NCCL's grains (512 B for SIMPLE) */
  return c > ncclChunk ? c : ncclChunk;
}

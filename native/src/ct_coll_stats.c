/* CLUSTERTOOL_COLLNET_STATS: per communicator, at close, the requests NCCL posted, their
 * mean size, collectives in flight (sampled at each post), post-to-done p50/p99 and the
 * p99 of one test() call. `1`: one line on stderr, "clustertool-collnet-stats {JSON}";
 * another value (not 0): a file the same JSON object is appended to as one line (one
 * write, O_APPEND, so ranks sharing the file do not interleave). Always an INFO line
 * with the same numbers when the variable is set. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ct_coll.h"

long long ct_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Buckets: 0..7 exact, then 8 per power of two. */
static int bucket(uint64_t v) {
  if (v < 8) return (int)v;
  int msb = 63 - __builtin_clzll(v);
  int b = (msb - 2) * 8 + (int)((v >> (msb - 3)) & 7);
  return b < CT_HIST_BUCKETS ? b : CT_HIST_BUCKETS - 1;
}

/* The upper end of a bucket's range. */
static double bucket_top(int b) {
  if (b < 8) return (double)b;
  int msb = b / 8 + 2, minor = b % 8;
  return (double)((8ULL + (uint64_t)minor + 1) << (msb - 3));
}

void ct_hist_add(ct_hist_t* h, uint64_t ns) {
  atomic_fetch_add_explicit(&h->n[bucket(ns)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

double ct_hist_pct_us(const ct_hist_t* h, double pct) {
  uint64_t total = atomic_load(&h->count);
  if (!total) return 0;
  uint64_t want = (uint64_t)((double)total * pct / 100.0 + 0.999999), seen = 0;
  if (want < 1) want = 1;
  for (int b = 0; b < CT_HIST_BUCKETS; b++) {
    seen += atomic_load(&h->n[b]);
    if (seen >= want) return bucket_top(b) / 1000.0;
  }
  return bucket_top(CT_HIST_BUCKETS - 1) / 1000.0;
}

void ct_stats_report(ct_coll_t* c) {
  const char* where = getenv("CLUSTERTOOL_COLLNET_STATS");
  if (!where || !*where || !strcmp(where, "0")) return;
  ct_stats_t* s = &c->stats;
  uint64_t req = atomic_load(&s->requests), bytes = atomic_load(&s->bytes);
  double mean = req ? (double)bytes / (double)req : 0, inflight = req ? (double)atomic_load(&s->inflight_sum) / (double)req : 0;
  long long cpu = 0;   /* every lane's progress thread, read after they ended */
  for (int l = 0; l < c->nlanes; l++) cpu += atomic_load(&c->lanes[l]->cpu_ns);
  char json[896];
  int n = snprintf(json, sizeof json,
                   "{\"rank\": %d, \"nranks\": %d, \"algo\": \"%s\", \"window\": %d, \"requests\": %llu, \"bytes\": %llu, "
                   "\"mean_bytes\": %.1f, \"inflight_mean\": %.3f, \"inflight_max\": %llu, "
                   "\"post_to_done_p50_us\": %.1f, \"post_to_done_p99_us\": %.1f, \"test_p99_us\": %.3f, "
                   "\"threads\": %d, \"progress_cpu_ms\": %.1f, \"progress_cpu_ns_per_byte\": %.3f}",
                   c->rank, c->nranks, ct_algo_name(c->algo), c->W, (unsigned long long)req, (unsigned long long)bytes,
                   mean, inflight, (unsigned long long)atomic_load(&s->inflight_max),
                   ct_hist_pct_us(&s->post_to_done, 50), ct_hist_pct_us(&s->post_to_done, 99),
                   ct_hist_pct_us(&s->test, 99), c->nlanes, (double)cpu / 1e6, bytes ? (double)cpu / (double)bytes : 0.0);
  CT_INFO("CollNet rank %d/%d stats: %s", c->rank, c->nranks, json);
  if (!strcmp(where, "1")) {
    fprintf(stderr, "clustertool-collnet-stats %s\n", json);
    fflush(stderr);
    return;
  }
  if (n < 0 || (size_t)n >= sizeof json - 1) return;
  json[n++] = '\n';
  int fd = open(where, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) { CT_WARN("CLUSTERTOOL_COLLNET_STATS=%s: cannot open it for appending", where); return; }
  if (write(fd, json, (size_t)n) != n) CT_WARN("CLUSTERTOOL_COLLNET_STATS=%s: short write", where);
  close(fd);
}

/* The lateness record of a reduction session (CT_RLATE_ENV; the format is in ct_reducer_proto.h).
 *
 * The session's receiver threads note when each rank's data for a request (one chunk of a collective) has fully
 * arrived (ct_rlate_arrival, under the session's lock, which they hold then anyway); the last of the n arrivals
 * closes the request: each rank's lateness after the first goes into its log2 histogram, and the rank that came
 * last is charged the time since the second-to-last arrival. A slot of the window holds one request's arrivals:
 * the window guarantees all n arrivals of request g are in before any of g + W. A writer thread copies the
 * counters under the lock once a second and appends one JSON line without it (only when requests came); the
 * session's end writes the last line, "final": true. Cost per arrival: one clock_gettime and a few additions;
 * per request: two passes over the n ranks. Without the variable nothing is allocated or measured. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ct_reducer.h"

typedef struct { uint64_t last, waited_us, late_sum_us, hist[CT_RLATE_BUCKETS]; } ct_rlate_w_t;

struct ct_rlate {
  int fd;                /* the session's record, O_APPEND */
  char reducer[96];      /* "<host>:<server index>" */
  ct_rlate_w_t* w;       /* [n], under the session's mu */
  uint64_t* arr_us;      /* [W][n] arrival of each rank's data for the request in that slot */
  uint32_t* got;         /* [W] arrivals so far for that request */
  uint64_t requests, written;
  atomic_int done;       /* the writer thread ends */
  pthread_t writer;
  int writer_started;
};

uint64_t ct_rlate_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000ull;
}

static int late_bucket(uint64_t us) {
  if (us <= 1) return 0;
  int k = 64 - __builtin_clzll(us - 1);   /* the smallest k with us <= 2^k */
  return k < CT_RLATE_BUCKETS - 1 ? k : CT_RLATE_BUCKETS - 1;
}

/* Rank w's data for the request in ``slot`` arrived at ``t``; the last of n arrivals closes the request. Lock held. */
void ct_rlate_arrival(ct_rsession_t* s, uint32_t w, size_t slot, uint64_t t) {
  struct ct_rlate* L = s->late;
  uint64_t* arr = L->arr_us + slot * s->n;
  arr[w] = t;
  if (++L->got[slot] < s->n) return;
  L->got[slot] = 0;
  uint64_t first = UINT64_MAX, second = 0;
  uint32_t last = 0;
  for (uint32_t r = 0; r < s->n; r++) {
    if (arr[r] < first) first = arr[r];
    if (arr[r] >= arr[last]) last = r;
  }
  for (uint32_t r = 0; r < s->n; r++) {
    uint64_t late = arr[r] - first;
    L->w[r].late_sum_us += late;
    L->w[r].hist[late_bucket(late)]++;
    if (r != last && arr[r] > second) second = arr[r];
  }
  if (s->n > 1) {
    L->w[last].last++;
    L->w[last].waited_us += arr[last] - (second > first ? second : first);
  }
  L->requests++;
}

/* One line of the record from a copy of the counters (no lock held). */
static void late_write(ct_rsession_t* s, const ct_rlate_w_t* w, uint64_t requests, int final) {
  struct ct_rlate* L = s->late;
  size_t cap = 512 + (size_t)s->n * (256 + 22 * CT_RLATE_BUCKETS), len = 0;   /* the widest numbers fit */
  char* buf = malloc(cap);
  if (!buf) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
#define LATE_PUT(...) do { int k_ = snprintf(buf + len, cap - len, __VA_ARGS__); \
                           if (k_ > 0 && (size_t)k_ < cap - len) len += (size_t)k_; } while (0)
  LATE_PUT("{\"v\": %d, \"t\": %.3f, \"reducer\": \"%s\", \"session\": \"%016llx\", \"nranks\": %u, "
           "\"requests\": %llu, \"final\": %s, \"buckets_us\": [", CT_RLATE_VERSION,
           (double)ts.tv_sec + (double)ts.tv_nsec / 1e9, L->reducer, (unsigned long long)s->id, s->n,
           (unsigned long long)requests, final ? "true" : "false");
  for (int k = 0; k < CT_RLATE_BUCKETS - 1; k++) LATE_PUT("%s%llu", k ? ", " : "", 1ull << k);
  LATE_PUT("], \"workers\": {");
  for (uint32_t r = 0; r < s->n; r++) {
    LATE_PUT("%s\"%u\": {\"peer\": \"%s\", \"last\": %llu, \"waited_for_us\": %llu, \"late_sum_us\": %llu, "
             "\"late_hist\": [", r ? ", " : "", r, s->conns[r].peer, (unsigned long long)w[r].last,
             (unsigned long long)w[r].waited_us, (unsigned long long)w[r].late_sum_us);
    for (int k = 0; k < CT_RLATE_BUCKETS; k++) LATE_PUT("%s%llu", k ? ", " : "", (unsigned long long)w[r].hist[k]);
    LATE_PUT("]}");
  }
  LATE_PUT("}}\n");
#undef LATE_PUT
  if (len && buf[len - 1] == '\n' && write(L->fd, buf, len) != (ssize_t)len) { /* best effort: a full disk */ }
  free(buf);
}

/* Copy the counters under the lock, write them without it (when ``final`` or something changed). */
static void late_flush(ct_rsession_t* s, int final) {
  struct ct_rlate* L = s->late;
  size_t bytes = sizeof(ct_rlate_w_t) * s->n;
  ct_rlate_w_t* copy = malloc(bytes);
  if (!copy) return;
  pthread_mutex_lock(&s->mu);
  memcpy(copy, L->w, bytes);
  uint64_t requests = L->requests;
  pthread_mutex_unlock(&s->mu);
  if (final || requests != L->written) {
    late_write(s, copy, requests, final);
    L->written = requests;
  }
  free(copy);
}

static void* late_main(void* arg) {
  ct_rsession_t* s = arg;
  for (int tick = 1; !atomic_load(&s->late->done); tick++) {
    usleep(100000);
    if (tick % 10 == 0) late_flush(s, 0);
  }
  return NULL;
}

/* Open the record where CT_RLATE_ENV says (no variable, or any failure: no record, the session runs as ever). */
void ct_rlate_open(ct_rsession_t* s) {
  const char* dir = getenv(CT_RLATE_ENV);
  if (!dir || !*dir) return;
  struct ct_rlate* L = calloc(1, sizeof *L);
  if (!L) return;
  char host[64] = "reducer", path[4096];
  gethostname(host, sizeof host - 1);
  snprintf(L->reducer, sizeof L->reducer, "%s:%u", host, s->server_index);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/%s.%016llx.%u.jsonl", dir, host, (unsigned long long)s->id, s->server_index);
  L->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  L->w = calloc(s->n, sizeof *L->w);
  L->arr_us = calloc((size_t)s->n * (size_t)s->W, sizeof *L->arr_us);
  L->got = calloc((size_t)s->W, sizeof *L->got);
  if (L->fd < 0 || !L->w || !L->arr_us || !L->got) {
    ct_rlog("session %016llx: no lateness record (%s: %s)", (unsigned long long)s->id, path,
            L->fd < 0 ? strerror(errno) : "out of memory");
    if (L->fd >= 0) close(L->fd);
    free(L->w);
    free(L->arr_us);
    free(L->got);
    free(L);
    return;
  }
  s->late = L;
}

void ct_rlate_start(ct_rsession_t* s) {
  if (s->late && !pthread_create(&s->late->writer, NULL, late_main, s)) s->late->writer_started = 1;
}

/* The session's threads have ended: the last line, then the record closed. */
void ct_rlate_close(ct_rsession_t* s) {
  struct ct_rlate* L = s->late;
  if (!L) return;
  atomic_store(&L->done, 1);
  if (L->writer_started) pthread_join(L->writer, NULL);
  late_flush(s, 1);
  close(L->fd);
  free(L->w);
  free(L->arr_us);
  free(L->got);
  free(L);
  s->late = NULL;
}

#define _GNU_SOURCE
/* The pipelined CollNet engine under mpirun -np 2..4, for sharded and ring:
 *  - a full window of requests in flight, tested in a shuffled order (not NCCL's oldest
 *    first), every result right and identical on every rank;
 *  - the window full: with this rank's progress thread held between passes, W posts are
 *    accepted, the next returns ncclSuccess with no request (NCCL posts it again later),
 *    and test() of a pending request answers not-done every time (it needs nothing from
 *    the progress thread); released, everything completes;
 *  - a stream of requests of mixed sizes with ranks posting at different times, one
 *    staging slot per connection (every phase-1 chunk waits for its credit) and 4 KiB
 *    chunks: phase 2 overtakes phase 1 without a deadlock, results bit-identical on every
 *    rank, float sums in rank order (sharded);
 *  - CLUSTERTOOL_COLLNET_STATS: the JSON line (stderr for `1`, appended to a file for a
 *    path) with the keys and counts of what ran;
 *  - pacing: every byte the engine moved went through ct_pace (its counters cover the
 *    payload); with `paced` (CLUSTERTOOL_LINK_RATE set by run_tests.sh) the transfer took
 *    at least the bytes over the rate, less the pacer's burst and catch-up allowance. */
#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <time.h>
#include "coll_mpi_util.h"

static int (*comm_window)(void*);
static void (*debug_freeze)(void*, int);
static void (*comm_paced)(void*, uint64_t*, uint64_t*);
static const char* BUILD = "build";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* FNV-1a over the bytes: equal on every rank when the results are bit-identical. */
static uint64_t digest(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ULL;
  return h;
}

static int same_everywhere(uint64_t h) {
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/* Small integers in float: exact in any order, so every algorithm must give exactly this. */
static float ivalue(int r, int k, size_t i) { return (float)((int)((i * 7 + (size_t)k * 3 + (size_t)r * 13) % 17) - 8); }
static int check_exact(const float* out, int k, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += ivalue(r, k, i);
    if (out[i] != want) return 0;
  }
  return 1;
}

static void test_out_of_order(comm_t* c, const char* label) {
  int W = comm_window(c->comm);
  float* sb[1024];
  float* rb[1024];
  void* req[1024];
  size_t n[1024];
  int ok = W >= 8 && W <= 1024;
  for (int k = 0; ok && k < W; k++) {
    n[k] = k % 5 == 0 ? (size_t)k : (size_t)(1000 + 7919 * k % 65536);   /* 0, small and mixed sizes */
    sb[k] = malloc(n[k] * 4 + 4);
    rb[k] = malloc(n[k] * 4 + 4);
    for (size_t i = 0; i < n[k]; i++) sb[k][i] = ivalue(rank, k, i);
    req[k] = NULL;
    ok &= cn->iallreduce(c->comm, sb[k], rb[k], n[k], ncclFloat32, ncclSum, NULL, NULL, &req[k]) == ncclSuccess &&
          req[k] != NULL;
  }
  /* every rank tests in its own shuffled order, one call per request in turn */
  int order[1024], left = ok ? W : 0;
  for (int k = 0; k < W; k++) order[k] = k;
  for (int k = W - 1; k > 0; k--) {
    int j = (int)((unsigned)(k * 2654435761u + (unsigned)rank * 40503u) % (unsigned)(k + 1)), t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  while (ok && left) {
    int before = left;
    for (int i = 0; i < W && ok; i++) {
      int k = order[i], done = 0, size = 0;
      if (!req[k]) continue;
      ok = cn->test(req[k], &done, &size) == ncclSuccess;
      if (done) { req[k] = NULL; left--; ok = ok && size == (int)(n[k] * 4); }
    }
    if (left == before) sched_yield();
  }
  uint64_t h = 0;
  for (int k = 0; k < W; k++) {
    if (ok) ok = check_exact(rb[k], k, n[k]);
    if (ok) h ^= digest(rb[k], n[k] * 4) + (uint64_t)k;
  }
  if (ok) for (int k = 0; k < W; k++) { free(sb[k]); free(rb[k]); }
  ok = agree(ok) && same_everywhere(h);
  if (rank == 0) CHECK(ok, "%s: %d requests in flight, tested in a shuffled order, all right on every rank", label, W);
}

static void test_window_full(comm_t* c, const char* label) {
  int W = comm_window(c->comm), ok = 1, pending_answers = 0;
  size_t n = 3000;
  float* sb = malloc((size_t)(W + 1) * n * 4);
  float* rb = malloc((size_t)(W + 1) * n * 4);
  void* req[1025] = {0};
  for (int k = 0; k <= W; k++)
    for (size_t i = 0; i < n; i++) sb[(size_t)k * n + i] = ivalue(rank, k, i);
  alarm(120);   /* a test() that waited on the held thread would hang: fail loudly instead */
  debug_freeze(c->comm, 1);
  for (int k = 0; k < W; k++)
    ok &= cn->iallreduce(c->comm, sb + (size_t)k * n, rb + (size_t)k * n, n, ncclFloat32, ncclSum, NULL, NULL,
                         &req[k]) == ncclSuccess && req[k];
  void* extra = (void*)1;
  int rc = cn->iallreduce(c->comm, sb + (size_t)W * n, rb + (size_t)W * n, n, ncclFloat32, ncclSum, NULL, NULL, &extra);
  int full = rc == ncclSuccess && extra == NULL;
  for (int i = 0; i < 1000 && ok; i++) {
    int done = 1, size = 0;
    ok = cn->test(req[i % W], &done, &size) == ncclSuccess;
    pending_answers += ok && !done;
  }
  debug_freeze(c->comm, 0);
  while (ok && !req[W])
    ok = cn->iallreduce(c->comm, sb + (size_t)W * n, rb + (size_t)W * n, n, ncclFloat32, ncclSum, NULL, NULL,
                        &req[W]) == ncclSuccess;
  for (int k = 0; k <= W && ok; k++) ok = wait_req(req[k]) == 0 && check_exact(rb + (size_t)k * n, k, n);
  alarm(0);
  ok = agree(ok);
  full = agree(full);
  pending_answers = agree(pending_answers == 1000);
  if (rank == 0) {
    CHECK(full, "%s: window of %d full: the next post returns ncclSuccess and no request", label, W);
    CHECK(pending_answers, "%s: test() of a pending request answers not-done while the progress thread is held", label);
    CHECK(ok, "%s: released, the %d requests and the one posted again complete, right", label, W + 1);
  }
  free(sb);
  free(rb);
}

static void test_stream_stress(const char* algo, const char* socks, const char* sched) {
  char label[128];
  snprintf(label, sizeof label, "%s socks=%s %s, 1 staging slot, 4K chunks np=%d", algo, socks, sched, nranks);
  setenv("CLUSTERTOOL_COLLNET_STAGE", "1", 1);
  setenv("CLUSTERTOOL_SHARDED_SCHED", sched, 1);
  comm_t c;
  int ok = agree(open_comm(&c, algo, socks, "4096") == 0);
  unsetenv("CLUSTERTOOL_COLLNET_STAGE");
  unsetenv("CLUSTERTOOL_SHARDED_SCHED");
  if (rank == 0) CHECK(ok, "%s: connect", label);
  if (!ok) return;
  enum { N = 120 };
  size_t sizes[N], total = 0;
  for (int k = 0; k < N; k++) total += sizes[k] = (size_t)(k % 7 == 0 ? k : 1 + (k * 104729) % 20000);
  float* in = malloc(total * 4 + 4);
  float* out = malloc(total * 4 + 4);
  for (size_t i = 0; i < total; i++) in[i] = fvalue(rank, i);
  void* fifo[N];
  int posted = 0, done_n = 0, alive = 1;
  alarm(240);
  size_t off = 0;
  while (alive && done_n < N) {
    if (posted < N && posted - done_n < 16) {
      if ((posted + rank) % 5 == 0) usleep((useconds_t)(200 * rank));   /* ranks post at different times */
      void* r = NULL;
      alive = cn->iallreduce(c.comm, in + off, out + off, sizes[posted], ncclFloat32, ncclSum, NULL, NULL, &r) ==
              ncclSuccess;
      if (r) { fifo[posted] = r; off += sizes[posted++]; }
    }
    int done = 0, size = 0;
    if (alive && done_n < posted) alive = cn->test(fifo[done_n], &done, &size) == ncclSuccess;
    if (done) done_n++;
    else sched_yield();
  }
  alarm(0);
  ok = alive;
  if (ok && !strcmp(algo, "sharded")) {
    float* want = fexpected(total);
    ok = memcmp(out, want, total * 4) == 0;
    free(want);
  }
  ok = agree(ok) && same_everywhere(digest(out, total * 4));
  if (rank == 0)
    CHECK(ok, "%s: %d requests of mixed sizes, 16 in flight, ranks out of step: done, bit-identical everywhere%s", label,
          N, strcmp(algo, "sharded") ? "" : ", rank-order sums");
  close_comm(&c);
  free(in);
  free(out);
}

/* "key": number in a one-line JSON object; NAN when absent. */
static double jnum(const char* line, const char* key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char* p = strstr(line, pat);
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static const char* KEYS[] = {"rank", "nranks", "window", "requests", "bytes", "mean_bytes", "inflight_mean",
                             "inflight_max", "post_to_done_p50_us", "post_to_done_p99_us", "test_p99_us",
                             "threads", "progress_cpu_ms", "progress_cpu_ns_per_byte"};

/* The lanes (progress threads) a comm must have: CLUSTERTOOL_COLLNET_THREADS when the run sets it. */
static int want_threads(void) {
  const char* t = getenv("CLUSTERTOOL_COLLNET_THREADS");
  return t && atoi(t) > 0 ? atoi(t) : 0;
}

static int stats_line_ok(const char* line, int r, const char* algo, int reqs, double bytes) {
  for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
    if (isnan(jnum(line, KEYS[i]))) return 0;
  char algo_kv[64];
  snprintf(algo_kv, sizeof algo_kv, "\"algo\": \"%s\"", algo);
  return line[0] == '{' && strstr(line, algo_kv) && jnum(line, "rank") == r && jnum(line, "nranks") == nranks &&
         jnum(line, "window") == 16 && jnum(line, "requests") == reqs && jnum(line, "bytes") == bytes &&
         fabs(jnum(line, "mean_bytes") - bytes / reqs) < 1 && jnum(line, "inflight_max") >= 1 &&
         jnum(line, "inflight_max") <= 16 && jnum(line, "inflight_mean") >= 1 &&
         jnum(line, "post_to_done_p50_us") <= jnum(line, "post_to_done_p99_us") && jnum(line, "test_p99_us") > 0 &&
         jnum(line, "threads") >= 1 && (!want_threads() || jnum(line, "threads") == want_threads()) &&
         jnum(line, "progress_cpu_ms") > 0;
}

static void test_stats(const char* dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/stats.jsonl", dir);
  size_t n = 10 * 65536;   /* 10 requests of 256 KiB */
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = ivalue(rank, 0, i);
  for (int mode = 0; mode < 2; mode++) {
    setenv("CLUSTERTOOL_COLLNET_STATS", mode ? "1" : path, 1);
    comm_t c;
    int ok = agree(open_comm(&c, "sharded", "1", "262144") == 0);
    ok = ok && agree(run_stream(c.comm, in, out, n, 65536, 8) == 0);
    char err_path[300];
    snprintf(err_path, sizeof err_path, "%s/stderr.%d", dir, rank);
    int saved = dup(2);
    if (mode) {   /* catch what close writes on stderr */
      int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 2);
      close(fd);
    }
    close_comm(&c);
    if (mode) { dup2(saved, 2); }
    close(saved);
    unsetenv("CLUSTERTOOL_COLLNET_STATS");
    int good = 0;
    if (mode) {
      FILE* f = fopen(err_path, "r");
      char line[2048];
      while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "clustertool-collnet-stats {", 27))
          good += stats_line_ok(line + 26, rank, "sharded", 10, (double)n * 4);
      if (f) fclose(f);
      ok = ok && agree(good == 1);
      if (rank == 0) CHECK(ok, "CLUSTERTOOL_COLLNET_STATS=1: one line 'clustertool-collnet-stats {JSON}' on stderr per rank");
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) {
        FILE* f = fopen(path, "r");
        char line[2048];
        int seen = 0, lines = 0;
        while (f && fgets(line, sizeof line, f)) {
          lines++;
          int r = (int)jnum(line, "rank");
          if (r >= 0 && r < nranks && stats_line_ok(line, r, "sharded", 10, (double)n * 4)) seen |= 1 << r;
        }
        if (f) fclose(f);
        CHECK(ok && lines == nranks && seen == (1 << nranks) - 1,
              "CLUSTERTOOL_COLLNET_STATS=PATH: one JSON line per rank appended (%d lines), keys and counts right", lines);
      }
    }
  }
  free(in);
  free(out);
}

static void test_paced_counters(int paced) {
  comm_t c;
  int ok = agree(open_comm(&c, "sharded", "1", "262144") == 0);
  if (!ok) return;
  size_t n = paced ? (1u << 20) : (4u << 20);   /* 4 or 16 MiB */
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = ivalue(rank, 1, i);
  uint64_t tx0, rx0, tx1, rx1;
  comm_paced(c.comm, &tx0, &rx0);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  ok = run_stream(c.comm, in, out, n, 65536, 8) == 0 && check_exact(out, 1, n);
  double took = now_s() - t0;
  comm_paced(c.comm, &tx1, &rx1);
  /* sharded moves (n-1)/n of the buffer out in phase 1 and my shard to n-1 peers in phase 2 */
  double payload = 2.0 * (nranks - 1) / nranks * (double)n * 4 * 0.999;
  ok = ok && (double)(tx1 - tx0) >= payload && (double)(rx1 - rx0) >= payload;
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "every byte the engine moved was taken from ct_pace (tx %llu, rx %llu, payload %.0f)",
                       (unsigned long long)(tx1 - tx0), (unsigned long long)(rx1 - rx0), payload);
  if (paced) {
    double rate = (double)strtoll(getenv("CT_TEST_RATE_BYTES"), NULL, 10);
    /* a lower bound only (a loaded box makes it slower, never faster): the bytes over the
     * rate, less a burst and the 20 ms catch-up the pacer allows */
    double least = ((double)(tx1 - tx0) - 0.022 * rate - 65536) / rate;
    int slow_enough = took >= least;
    slow_enough = agree(slow_enough);
    if (rank == 0)
      CHECK(slow_enough, "paced at %.0f bytes/s: %.0f bytes took %.2f s (at least %.2f s)", rate, (double)(tx1 - tx0),
            took, least);
  }
  close_comm(&c);
  free(in);
  free(out);
}

/* The blocking entry point (ct_allreduce, as a training step calls it): the caller sleeps until the progress
 * thread finishes the request instead of waking every few microseconds to look. Paced, one call takes about
 * half a second; the caller's voluntary context switches count its sleeps: a guard timeout every 50 ms at
 * most, where polling made thousands. The sums are checked too. */
static void test_blocking_caller_sleeps(void* lib) {
  int (*hsize)(void) = (int (*)(void))dlsym(lib, "ct_allreduce_handle_size");
  void* (*ar_open)(int, int, const char*, void*, size_t) =
      (void* (*)(int, int, const char*, void*, size_t))dlsym(lib, "ct_allreduce_open");
  int (*ar_connect)(void*, const void*, size_t) = (int (*)(void*, const void*, size_t))dlsym(lib, "ct_allreduce_connect");
  int (*ar_run)(void*, const void*, void*, size_t, int, int) =
      (int (*)(void*, const void*, void*, size_t, int, int))dlsym(lib, "ct_allreduce");
  void (*ar_close)(void*) = (void (*)(void*))dlsym(lib, "ct_allreduce_close");
  int ok = hsize && ar_open && ar_connect && ar_run && ar_close;
  if (!agree(ok)) { if (rank == 0) CHECK(0, "the ct_allreduce entry points are exported"); return; }
  size_t hs = (size_t)hsize();
  char* mine = calloc(1, hs);
  char* all = calloc((size_t)nranks, hs);
  void* ar = ar_open(rank, nranks, "sharded", mine, hs);
  ok = ar != NULL;
  MPI_Allgather(mine, (int)hs, MPI_BYTE, all, (int)hs, MPI_BYTE, MPI_COMM_WORLD);
  ok = agree(ok && ar_connect(ar, all, (size_t)nranks * hs) == 0);
  size_t n = 1u << 20;   /* 4 MiB of floats: about 0.4 s at 10^7 bytes/s with 2 ranks */
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = ivalue(rank, 2, i);
  long switches = -1;
  double took = 0;
  if (ok) {
    struct rusage r0, r1;
    MPI_Barrier(MPI_COMM_WORLD);
    getrusage(RUSAGE_THREAD, &r0);
    double t0 = now_s();
    ok = ar_run(ar, in, out, n, ncclFloat32, ncclSum) == 0 && check_exact(out, 2, n);
    took = now_s() - t0;
    getrusage(RUSAGE_THREAD, &r1);
    switches = r1.ru_nvcsw - r0.ru_nvcsw;
  }
  int few = ok && switches <= 10 + (long)(took / 0.05 * 1.5);
  few = agree(few);
  if (rank == 0)
    CHECK(few, "a blocking ct_allreduce of %.0f MiB paced: right, the caller slept (%ld voluntary switches in %.2f s)",
          (double)(n * 4) / (1 << 20), switches, took);
  if (ar) ar_close(ar);
  free(mine); free(all); free(in); free(out);
}

static void run_algo(const char* algo) {
  char label[96];
  snprintf(label, sizeof label, "%s np=%d", algo, nranks);
  comm_t c;
  int ok = agree(open_comm(&c, algo, "1", "65536") == 0);
  if (rank == 0) CHECK(ok, "%s: connect", label);
  if (!ok) return;
  test_out_of_order(&c, label);
  test_window_full(&c, label);
  close_comm(&c);
}

/* A rank leaves (closes its comm) while the others post: their request fails within the
 * bound instead of hanging, and the next post, which goes to the next lane when there are
 * several, is refused at once (one lane's failure fails them all). */
static void test_peer_leaves(void) {
  comm_t c;
  int ok = agree(open_comm(&c, "sharded", "1", "262144") == 0);
  size_t n = 65536;
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = ivalue(rank, 0, i);
  int leaver = nranks - 1, good = 1;
  /* one request that completes first: the failing one then goes to lane 1 of K >= 2, and the
   * refused post to another lane than the failed one */
  ok = ok && agree(run_stream(c.comm, in, out, n, n, 1) == 0 && check_exact(out, 0, n));
  if (ok && rank == leaver) close_comm(&c);
  if (ok && rank != leaver) {
    void* req = NULL;
    int failed = 0;
    if (cn->iallreduce(c.comm, in, out, n, ncclFloat32, ncclSum, NULL, NULL, &req) != ncclSuccess || !req) good = 0;
    for (double t0 = now_s(); good && !failed && now_s() - t0 < 120;) {   /* a hang guard, not a timing */
      int done = 0, size = 0;
      if (cn->test(req, &done, &size) != ncclSuccess) failed = 1;
      else if (done) good = 0;   /* it cannot complete without the rank that left */
      else sched_yield();
    }
    good = good && failed;
    void* again = NULL;
    good = good && cn->iallreduce(c.comm, in, out, n, ncclFloat32, ncclSum, NULL, NULL, &again) == ncclSystemError &&
           !again;
    close_comm(&c);
  }
  ok = agree(ok && good);
  if (rank == 0)
    CHECK(ok, "a rank left mid-collective (%d progress thread(s)): the request failed, the next post was refused",
          want_threads() ? want_threads() : 1);
  free(in);
  free(out);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc > 1) BUILD = argv[1];
  int paced = argc > 2 && !strcmp(argv[2], "paced");
  char p[512], dir[] = "/tmp/ct_pipeline_test_XXXXXX";
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", BUILD);
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  cn = lib ? dlsym(lib, "ncclCollNetPlugin_v12") : NULL;
  comm_window = lib ? (int (*)(void*))dlsym(lib, "ct_collnet_comm_window") : NULL;
  debug_freeze = lib ? (void (*)(void*, int))dlsym(lib, "ct_collnet_debug_freeze") : NULL;
  comm_paced = lib ? (void (*)(void*, uint64_t*, uint64_t*))dlsym(lib, "ct_collnet_comm_paced") : NULL;
  int ok = cn && comm_window && debug_freeze && comm_paced && cn->init(&ctx, 0, NULL) == ncclSuccess;
  if (rank == 0) ok = ok && mkdtemp(dir) != NULL;
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) CHECK(ok, "load and init collnet from %s", p);
  if (agree(ok)) {
    if (paced) {
      test_paced_counters(1);
      test_blocking_caller_sleeps(lib);
    } else {
      run_algo("sharded");
      run_algo("ring");
      test_stream_stress("sharded", "1", "lockstep");
      test_stream_stress("sharded", "2", "free");
      test_stream_stress("ring", "2", "lockstep");
      test_stats(dir);
      test_paced_counters(0);
      test_peer_leaves();
    }
    cn->finalize(ctx);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) { /* best effort */ }
  }
  int rc = 0;
  if (rank == 0) rc = CT_SUMMARY();
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

#define _GNU_SOURCE
/* The CollNet `servers` algorithm against real clustertool-reducer processes (started
 * by rank 0 on 127.0.0.1), under mpirun -np 2..4: allreduce for every dtype/op at
 * K = 1, 2, n and n+1 servers (chunks of 4 KiB and 512 KiB), float sums bit-identical
 * to the rank-order reduction on every rank, the default algorithm when
 * CLUSTERTOOL_REDUCERS is set, a stream of requests in NCCL's shape (many in flight), the fallback to sharded (with a WARN naming the server)
 * when a server does not answer, and failure: a server killed (SIGKILL) or frozen
 * (SIGSTOP) mid-allreduce makes every rank fail within the IO timeout, never hang. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include "coll_mpi_util.h"
#include "reducer_util.h"

#define NPOOL 16
static reducer_t pool[NPOOL];     /* rank 0's: n+1 for the matrix, 2 for each failure test, 1 for rules */
static char addrs[NPOOL][64];     /* every rank's copy */
static const char* (*comm_algo)(void*);
static int (*comm_servers)(void*);
static char last_warn[1024];

static void logger(ncclDebugLogLevel lvl, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (lvl != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warn, sizeof last_warn, fmt, ap);
  va_end(ap);
}

static void set_reducers(int from, int k, const char* extra) {
  char list[1024] = "";
  for (int i = 0; i < k; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", addrs[from + i]);
  if (extra) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? "," : "", extra);
  setenv("CLUSTERTOOL_REDUCERS", list, 1);
}

static void test_bit_identical(comm_t* c, const char* label) {
  size_t n = 300001;
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  float* want = malloc(n * 4);
  float* tmp = malloc(n * 4);
  for (size_t i = 0; i < n; i++) { in[i] = fvalue(rank, i); want[i] = fvalue(0, i); }
  for (int r = 1; r < nranks; r++) {
    for (size_t i = 0; i < n; i++) tmp[i] = fvalue(r, i);
    ct_reduce(want, want, tmp, n, ncclFloat32, ncclSum);
  }
  void* req = NULL;
  int ok = cn->iallreduce(c->comm, in, out, n, ncclFloat32, ncclSum, NULL, NULL, &req) == ncclSuccess && req;
  ok = ok && wait_req(req) == 0 && memcmp(out, want, n * 4) == 0;
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: float sums bit-identical on every rank (reduced in rank order 0..n-1)", label);
  free(in); free(out); free(want); free(tmp);
}

/* NCCL's shape: 4 MiB in 64 requests of 64 KiB, 8 outstanding, oldest tested first: each
 * server takes every rank's pipelined stream; rank-order sums, bit-identical everywhere. */
static void test_stream(comm_t* c, const char* label) {
  size_t n = 1u << 20;
  float* in = malloc(n * 4);
  float* out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = fvalue(rank, i);
  float* want = fexpected(n);
  int ok = run_stream(c->comm, in, out, n, 16384, 8) == 0 && memcmp(out, want, n * 4) == 0;
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "%s: 64 requests, 8 in flight, tested oldest first: rank-order sums on every rank", label);
  free(in); free(out); free(want);
}

static void run_servers(int k, const char* chunk) {
  char label[96];
  snprintf(label, sizeof label, "servers K=%d chunk=%s np=%d", k, chunk, nranks);
  set_reducers(0, k, NULL);
  comm_t c;
  int ok = agree(open_comm(&c, "servers", "1", chunk) == 0);
  if (rank == 0) CHECK(ok, "%s: connect", label);
  if (!ok) return;
  ok = agree(!strcmp(comm_algo(c.comm), "servers") && comm_servers(c.comm) == k);
  if (rank == 0) CHECK(ok, "%s: the comm runs servers over %d server(s) (%s)", label, k, comm_algo(c.comm));
  test_allreduce_matrix(&c, label);
  test_many_in_flight(&c, label);
  test_nan_across_ranks(&c, label);
  test_bit_identical(&c, label);
  test_stream(&c, label);
  close_comm(&c);
}

static void test_default_is_servers(void) {
  set_reducers(0, 2, NULL);
  comm_t c;
  int ok = agree(open_comm(&c, NULL, "1", "65536") == 0);
  ok = ok && agree(!strcmp(comm_algo(c.comm), "servers"));
  if (rank == 0) CHECK(ok, "CLUSTERTOOL_REDUCERS set, CLUSTERTOOL_COLLNET_ALGO unset: servers is the default");
  if (ok) test_bit_identical(&c, "default servers");
  close_comm(&c);
}

/* collnet_algo rows of rank 0's tuner table pick the algorithm per size: small allreduces
 * sharded, large ones servers. The dedicated server's session end line counts the bytes
 * it reduced: only the large allreduce's. */
static void test_rules_pick_by_size(int server, const char* dir) {
  char table[300];
  snprintf(table, sizeof table, "%s/tuner.csv", dir);
  if (rank == 0) {
    FILE* f = fopen(table, "w");
    if (f) {
      fprintf(f, "collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks\n"
                 "collnet_algo,0,64K,sharded\ncollnet_algo,65537,1G,servers\n");
      fclose(f);
    }
  }
  setenv("CLUSTERTOOL_TUNER_CONFIG", table, 1);   /* only rank 0 reads it (its dir) */
  set_reducers(server, 1, NULL);
  comm_t c;
  int ok = agree(open_comm(&c, "sharded", "1", "65536") == 0);
  if (rank == 0) CHECK(ok, "collnet_algo rules: connect (default sharded, servers wanted by a rule)");
  unsetenv("CLUSTERTOOL_TUNER_CONFIG");
  if (!ok) return;
  size_t counts[2] = {1000, 1u << 20};
  for (int i = 0; i < 2 && ok; i++) {
    float* b = malloc(counts[i] * 4);
    for (size_t j = 0; j < counts[i]; j++) b[j] = (float)(rank + 1);
    void* req = NULL;
    ok = cn->iallreduce(c.comm, b, b, counts[i], ncclFloat32, ncclSum, NULL, NULL, &req) == ncclSuccess &&
         wait_req(req) == 0 && b[counts[i] - 1] == (float)(nranks * (nranks + 1) / 2);
    free(b);
  }
  ok = agree(ok);
  if (rank == 0) CHECK(ok, "collnet_algo rules: 4 KB and 4 MiB allreduces right");
  close_comm(&c);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    const char* one[] = {"end:", " 4194304 bytes", NULL};   /* 4198304 had the 4 KB gone there too */
    CHECK(reducer_log_wait(&pool[server], one, 5000),
          "collnet_algo rules: the server reduced the 4 MiB allreduce only (4 KB went sharded)");
  }
}

/* A port on 127.0.0.1 where nothing listens (bound once, closed). */
static int dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  int port = bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr*)&a, &l) == 0
                 ? ntohs(a.sin_port) : 1;
  close(fd);
  return port;
}

static void test_fallback(void) {
  int port = rank == 0 ? dead_port() : 0;
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  char dead[64];
  snprintf(dead, sizeof dead, "127.0.0.1:%d", port);
  set_reducers(0, 1, dead);   /* one live server, one that never answers */
  setenv("CLUSTERTOOL_REDUCER_CONNECT_MS", "300", 1);
  last_warn[0] = 0;
  comm_t c;
  int ok = agree(open_comm(&c, "servers", "1", "65536") == 0);
  if (rank == 0) CHECK(ok, "a server that does not answer: connect still succeeds");
  unsetenv("CLUSTERTOOL_REDUCER_CONNECT_MS");
  if (!ok) return;
  ok = agree(!strcmp(comm_algo(c.comm), "sharded") && comm_servers(c.comm) == 0);
  if (rank == 0) CHECK(ok, "... and every rank falls back to sharded (runs %s)", comm_algo(c.comm));
  ok = agree(strstr(last_warn, dead) && strstr(last_warn, "sharded instead of servers"));
  if (rank == 0) CHECK(ok, "... with a WARN on every rank naming the server (%s)", last_warn);
  test_allreduce_matrix(&c, "fallback sharded");
  close_comm(&c);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);   /* one clock for every rank on this machine */
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct { int sig; pid_t pid; double at; } killer_t;
static void* killer(void* arg) {
  killer_t* k = arg;
  usleep(400000);
  k->at = now_s();
  kill(k->pid, k->sig);
  return NULL;
}

/* Rank 0 stops server `victim` (pool index) with sig while every rank runs allreduces
 * over two servers; every rank must see an error within the io timeout (+ slack). */
static void test_server_dies(int victim, int sig, const char* how) {
  const int tmo_ms = 1500;
  char tmo[16];
  snprintf(tmo, sizeof tmo, "%d", tmo_ms);
  setenv("CLUSTERTOOL_REDUCER_TIMEOUT_MS", tmo, 1);
  set_reducers(victim, 2, NULL);
  last_warn[0] = 0;
  comm_t c;
  int ok = agree(open_comm(&c, "servers", "1", "65536") == 0) && agree(!strcmp(comm_algo(c.comm), "servers"));
  if (rank == 0) CHECK(ok, "%s: comm over 2 servers", how);
  if (!ok) return;
  size_t n = 4u << 20;   /* 16 MiB of float per allreduce */
  float* b = calloc(n, 4);
  killer_t k = {sig, rank == 0 ? pool[victim].pid : 0, 0};
  pthread_t kt;
  alarm(120);   /* a hang fails the test instead of stalling it */
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) pthread_create(&kt, NULL, killer, &k);
  double t0 = now_s(), failed_at = 0;
  int failed = 0, iters = 0;
  while (!failed && now_s() - t0 < 30) {
    void* req = NULL;
    failed = cn->iallreduce(c.comm, b, b, n, ncclFloat32, ncclSum, NULL, NULL, &req) != ncclSuccess || !req ||
             wait_req(req) != 0;
    iters++;
  }
  failed_at = now_s();
  double tc = now_s();
  close_comm(&c);
  double close_s = now_s() - tc;
  alarm(0);
  if (rank == 0) pthread_join(kt, NULL);
  MPI_Bcast(&k.at, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double took = failed_at - k.at, worst = 0;
  MPI_Allreduce(&took, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  ok = agree(failed);
  if (rank == 0) printf("# %s after %d allreduce(s): last rank failed %.2f s later; WARN: %s\n", how, iters, worst, last_warn);
  if (rank == 0)
    CHECK(ok && worst < tmo_ms / 1000.0 + 3.0, "%s mid-allreduce: every rank fails, the last %.2f s after (io timeout %.1f s)",
          how, worst, tmo_ms / 1000.0);
  /* a rank whose own failure came first names the server; a rank beaten to it by another
   * rank's exit may instead see the other server end the session (its ABORT names the
   * rank that left) or close: its WARN names that server */
  int names = strstr(last_warn, addrs[victim]) != NULL;
  int any = 0;
  MPI_Allreduce(&names, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  ok = agree(strstr(last_warn, "reduction server 127.0.0.1:") != NULL);
  if (rank == 0) CHECK(ok && any, "%s: every WARN names a server, some rank's the one that died (%s)", how, last_warn);
  ok = agree(close_s < 5.0);
  if (rank == 0) CHECK(ok, "%s: the failed comm closes at once", how);
  if (rank == 0 && sig == SIGSTOP) kill(pool[victim].pid, SIGCONT);
  unsetenv("CLUSTERTOOL_REDUCER_TIMEOUT_MS");
  free(b);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const char* build = argc > 1 ? argv[1] : "build";
  char p[512], dir[] = "/tmp/ct_servers_test_XXXXXX";
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", build);
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  signal(SIGPIPE, SIG_IGN);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  cn = lib ? dlsym(lib, "ncclCollNetPlugin_v12") : NULL;
  comm_algo = lib ? (const char* (*)(void*))dlsym(lib, "ct_collnet_comm_algo") : NULL;
  comm_servers = lib ? (int (*)(void*))dlsym(lib, "ct_collnet_comm_servers") : NULL;
  int ok = cn && comm_algo && comm_servers && cn->init(&ctx, 0, logger) == ncclSuccess;
  int npool = nranks + 1 + 4 + 1;
  if (npool > NPOOL) { if (rank == 0) fprintf(stderr, "at most %d ranks\n", NPOOL - 6); MPI_Abort(MPI_COMM_WORLD, 2); }
  if (rank == 0) {
    ok = ok && mkdtemp(dir) != NULL;
    for (int i = 0; ok && i < npool; i++) {
      char name[16];
      snprintf(name, sizeof name, "r%d", i);
      ok = reducer_start(&pool[i], build, dir, name, NULL) == 0;
      snprintf(addrs[i], sizeof addrs[i], "%s", pool[i].addr);
    }
    CHECK(ok, "load the plugin, start %d clustertool-reducers", npool);
  }
  MPI_Bcast(addrs, sizeof addrs, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (agree(ok)) {
    run_servers(1, "4096");
    run_servers(2, "524288");
    run_servers(nranks, "4096");
    run_servers(nranks + 1, "524288");
    test_default_is_servers();
    test_fallback();
    test_rules_pick_by_size(nranks + 5, dir);
    test_server_dies(nranks + 1, SIGKILL, "a server killed (SIGKILL)");
    test_server_dies(nranks + 3, SIGSTOP, "a server frozen (SIGSTOP)");
    cn->finalize(ctx);
  }
  if (rank == 0) {
    int clean = 1;
    for (int i = 0; i < npool; i++)
      if (pool[i].pid > 0) {
        int st = reducer_stop(&pool[i], SIGTERM, 5000);
        int killed = i == nranks + 1;   /* the SIGKILLed one was reaped by reducer_stop as well */
        if (!killed) clean &= st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
      }
    CHECK(clean, "every reducer exits 0 on SIGTERM afterwards (sessions of failed comms cleaned up)");
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

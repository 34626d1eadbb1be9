#define _GNU_SOURCE
/* clustertool-reducer on its own, spoken to at the protocol level by fake workers
 * (raw sockets, one thread per rank): port file, sessions of any size side by side,
 * reduction in rank order, flow control over many chunks, heartbeats while it waits,
 * refusals (bad hello, duplicate rank), errors (chunks that disagree, a worker stalled
 * mid-message, a rank leaving before the session starts) with their log lines and the
 * ABORT reason the ranks get, SIGTERM (exit 0, port file removed), the command line, and
 * CLUSTERTOOL_LINK_RATE pacing its traffic. */
#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include "ct_reduce.h"
#include "ct_reducer_proto.h"
#include "ct_test.h"
#include "reducer_util.h"

static const char* BUILD = "build";
static char DIR_[256];

static int w_connect(const reducer_t* r) {
  char host[64];
  snprintf(host, sizeof host, "%s", r->addr);
  char* colon = strrchr(host, ':');
  if (!colon) return -1;
  *colon = 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) { if (fd >= 0) close(fd); return -1; }
  return fd;
}

static int w_send(int fd, const void* p, size_t len) {
  const char* c = p;
  while (len) {
    ssize_t k = send(fd, c, len, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    c += k;
    len -= (size_t)k;
  }
  return 0;
}

/* 1 full, 0 closed before the first byte, -1 error/timeout */
static int w_recv(int fd, void* p, size_t len, int tmo) {
  char* c = p;
  size_t got = 0;
  while (got < len) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, tmo) <= 0) return -1;
    ssize_t k = recv(fd, c + got, len - got, 0);
    if (k == 0) return got ? -1 : 0;
    if (k < 0) return -1;
    got += (size_t)k;
  }
  return 1;
}

static int w_hello(int fd, uint64_t session, uint32_t rank, uint32_t n, uint32_t chunk, uint32_t tmo) {
  ct_rhello_t h = {CT_RHELLO_MAGIC, CT_RPROTO_VERSION, session, rank, n, chunk, tmo, 0, 1};
  return w_send(fd, &h, sizeof h);
}

static int w_ack(int fd) {
  ct_rack_t a;
  return w_recv(fd, &a, sizeof a, 5000) == 1 && a.magic == CT_RACK_MAGIC ? (int)a.status : -1;
}

static int w_data(int fd, uint32_t seq, uint32_t chunk, const void* p, uint32_t len, ncclDataType_t dt, ncclRedOp_t op) {
  ct_rmsg_t h = {CT_RMSG_MAGIC, CT_RMSG_DATA, (uint8_t)dt, (uint8_t)op, 0, seq, chunk, len, 0};
  return w_send(fd, &h, sizeof h) || w_send(fd, p, len);
}

/* Next non-heartbeat message within tmo ms; *hb counts heartbeats skipped. 1 ok, 0 closed, -1 error/timeout. */
static int w_msg(int fd, ct_rmsg_t* h, void* buf, size_t cap, int tmo, int* hb) {
  long end = ru_now_ms() + tmo;   /* tmo bounds the whole wait, heartbeats included */
  for (;;) {
    long left = end - ru_now_ms();
    if (left <= 0) return -1;
    int r = w_recv(fd, h, sizeof *h, (int)left);
    if (r != 1) return r;
    if (h->magic != CT_RMSG_MAGIC || h->len > cap) return -1;
    if (h->type == CT_RMSG_HEARTBEAT) { if (hb) (*hb)++; continue; }
    return h->len ? w_recv(fd, buf, h->len, tmo) : 1;
  }
}

static float value(int rank, int chunk, size_t i) {
  /* values whose float sum depends on the order: rank order is what the server must use */
  return (float)(sin((double)(rank * 7919 + chunk * 104729 + (int)i)) * pow(10.0, (double)((int)(i % 7) - 3)));
}

typedef struct {
  const reducer_t* r;
  uint64_t session;
  int rank, n, nchunks;
  uint32_t elems;
  int fd, ok, ack;
  float* got;      /* [nchunks][elems] */
} fake_t;

static void* fake_sender(void* arg) {
  fake_t* f = arg;
  float* buf = malloc(f->elems * sizeof(float));
  for (int c = 0; c < f->nchunks; c++) {
    for (uint32_t i = 0; i < f->elems; i++) buf[i] = value(f->rank, c, i);
    if (w_data(f->fd, 7, (uint32_t)c, buf, f->elems * 4, ncclFloat32, ncclSum)) break;
  }
  free(buf);
  return NULL;
}

/* One rank: hello, ack, a sender thread for its chunks, results read here. */
static void* fake_worker(void* arg) {
  fake_t* f = arg;
  f->fd = w_connect(f->r);
  if (f->fd < 0 || w_hello(f->fd, f->session, (uint32_t)f->rank, (uint32_t)f->n, 65536, 5000)) return NULL;
  f->ack = w_ack(f->fd);
  if (f->ack != CT_RACK_OK) return NULL;
  pthread_t t;
  pthread_create(&t, NULL, fake_sender, f);
  int ok = 1;
  for (int c = 0; c < f->nchunks && ok; c++) {
    ct_rmsg_t h;
    ok = w_msg(f->fd, &h, f->got + (size_t)c * f->elems, f->elems * 4, 10000, NULL) == 1 &&
         h.type == CT_RMSG_RESULT && h.seq == 7 && h.chunk == (uint32_t)c && h.len == f->elems * 4;
  }
  pthread_join(t, NULL);
  f->ok = ok;
  close(f->fd);
  return NULL;
}

/* Expected chunk: ranks added in rank order 0, 1, ..., n-1 (what every rank must get). */
static int check_results(fake_t* fs, int n) {
  int ok = 1;
  float* want = malloc(fs[0].elems * sizeof(float));
  float* tmp = malloc(fs[0].elems * sizeof(float));
  for (int c = 0; c < fs[0].nchunks && ok; c++) {
    for (uint32_t i = 0; i < fs[0].elems; i++) want[i] = value(0, c, i);
    for (int r = 1; r < n; r++) {
      for (uint32_t i = 0; i < fs[0].elems; i++) tmp[i] = value(r, c, i);
      ct_reduce(want, want, tmp, fs[0].elems, ncclFloat32, ncclSum);
    }
    for (int r = 0; r < n; r++) ok &= memcmp(fs[r].got + (size_t)c * fs[0].elems, want, fs[0].elems * 4) == 0;
  }
  free(want);
  free(tmp);
  return ok;
}

static int run_session(const reducer_t* r, uint64_t id, int n, int nchunks, uint32_t elems, pthread_t* th, fake_t* fs) {
  for (int i = 0; i < n; i++) {
    fs[i] = (fake_t){r, id, n - 1 - i, n, nchunks, elems, -1, 0, -1, NULL};   /* ranks join in reverse order */
    fs[i].got = calloc((size_t)nchunks * elems, sizeof(float));
    pthread_create(&th[i], NULL, fake_worker, &fs[i]);
  }
  return 0;
}

static int finish_session(int n, pthread_t* th, fake_t* fs) {
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  fake_t byrank[16];
  int ok = 1;
  for (int i = 0; i < n; i++) { byrank[fs[i].rank] = fs[i]; ok &= fs[i].ok; }
  ok = ok && check_results(byrank, n);
  for (int i = 0; i < n; i++) free(fs[i].got);
  return ok;
}

static void test_sessions(const reducer_t* r) {
  pthread_t ta[3], tb[4];
  fake_t fa[3], fb[4];
  /* two sessions at once on one server: 3 ranks x 5 chunks, 4 ranks x 40 chunks of 64 KiB (window wraps) */
  run_session(r, 0x1111, 3, 5, 1000, ta, fa);
  run_session(r, 0x2222, 4, 40, 16384, tb, fb);
  CHECK(finish_session(3, ta, fa), "3-rank session: every rank gets the chunks reduced in rank order");
  CHECK(finish_session(4, tb, fb), "4-rank session of 40 chunks beside it: flow control over the window, all right");
  const char* start[] = {"session 0000000000001111 start: 3 ranks", NULL};
  const char* end[] = {"session 0000000000001111 end: 3 ranks, 5 reductions", NULL};
  const char* end2[] = {"session 0000000000002222 end: 4 ranks, 40 reductions", NULL};
  CHECK(reducer_log_has(r, start), "log: one line when a session starts");
  CHECK(reducer_log_wait(r, end, 5000) && reducer_log_wait(r, end2, 5000), "log: one line when each session ends");
}

static void test_refusals(const reducer_t* r) {
  int fd = w_connect(r);
  ct_rhello_t bad = {0xdeadbeef, CT_RPROTO_VERSION, 1, 0, 1, 65536, 5000, 0, 1};
  w_send(fd, &bad, sizeof bad);
  char b;
  CHECK(w_recv(fd, &b, 1, 5000) == 0, "a bad hello: connection closed");
  close(fd);
  const char* l1[] = {"refused connection from 127.0.0.1:", "bad magic", NULL};
  CHECK(reducer_log_wait(r, l1, 3000), "log: refused connection, with the reason");

  int a = w_connect(r), d = w_connect(r);
  w_hello(a, 0x3333, 0, 2, 65536, 5000);
  usleep(100000);
  w_hello(d, 0x3333, 0, 2, 65536, 5000);
  CHECK(w_recv(d, &b, 1, 5000) == 0, "a second rank 0 in a session is refused");
  const char* l2[] = {"refused connection", "rank already joined its session", NULL};
  CHECK(reducer_log_wait(r, l2, 3000), "log: duplicate rank");
  close(d);
  close(a);   /* leaves before rank 1 joined */
  const char* l3[] = {"session 0000000000003333 error:", "closed its connection before every rank had joined",
                      "(1 of 2 ranks had joined)", NULL};
  CHECK(reducer_log_wait(r, l3, 3000), "log: a rank leaving an assembling session drops it");
}

static void test_mismatch_and_abort(const reducer_t* r) {
  int f0 = w_connect(r), f1 = w_connect(r);
  w_hello(f0, 0x4444, 0, 2, 65536, 5000);
  w_hello(f1, 0x4444, 1, 2, 65536, 5000);
  CHECK(w_ack(f0) == CT_RACK_OK && w_ack(f1) == CT_RACK_OK, "both ranks acked");
  float x[16] = {0};
  w_data(f0, 1, 0, x, 64, ncclFloat32, ncclSum);
  w_data(f1, 1, 0, x, 32, ncclFloat32, ncclSum);     /* disagrees on the length */
  ct_rmsg_t h;
  char text[CT_RMAX_REASON + 1] = "";
  int got = w_msg(f0, &h, text, CT_RMAX_REASON, 5000, NULL);
  CHECK(got == 1 && h.type == CT_RMSG_ABORT && strstr(text, "rank 1") && strstr(text, "differs from rank 0"),
        "rank 0 gets an ABORT naming rank 1 (%s)", text);
  const char* l[] = {"session 0000000000004444 error: rank 1 (127.0.0.1:", "differs from rank 0's", NULL};
  CHECK(reducer_log_wait(r, l, 3000), "log: the session error names the rank and its address");
  close(f0);
  close(f1);
}

static void test_heartbeat_and_stall(const reducer_t* r) {
  int f0 = w_connect(r), f1 = w_connect(r);
  w_hello(f0, 0x5555, 0, 2, 65536, 400);   /* a worker timeout of 400 ms: heartbeats every 100 ms */
  w_hello(f1, 0x5555, 1, 2, 65536, 400);
  CHECK(w_ack(f0) == CT_RACK_OK && w_ack(f1) == CT_RACK_OK, "both ranks acked");
  float x[4] = {1, 2, 3, 4};
  w_data(f0, 1, 0, x, 16, ncclFloat32, ncclSum);   /* rank 1 is late */
  /* Rank 0 waits on rank 1: it must get heartbeats and nothing else. Count them until 3 have
   * come (the event), not within a fixed window: a loaded box or a sanitizer only delays them.
   * The 30 s deadline only bounds a server that never sends one. */
  int hb = 0, other = 0;
  ct_rmsg_t h;
  long deadline = ru_now_ms() + 30000;
  while (hb < 3 && !other) {
    long left = deadline - ru_now_ms();
    if (left <= 0 || w_recv(f0, &h, sizeof h, (int)left) != 1) break;
    if (h.magic == CT_RMSG_MAGIC && h.type == CT_RMSG_HEARTBEAT) hb++;
    else other = 1;
  }
  CHECK(hb == 3 && !other, "while rank 1 is late, rank 0 gets heartbeats and nothing else (%d heartbeats%s)", hb,
        other ? ", then another message" : "");
  /* rank 1 sends a header announcing 16 bytes and stalls after 4 */
  ct_rmsg_t d = {CT_RMSG_MAGIC, CT_RMSG_DATA, ncclFloat32, ncclSum, 0, 1, 0, 16, 0};
  w_send(f1, &d, sizeof d);
  w_send(f1, x, 4);
  const char* l[] = {"session 0000000000005555 error: rank 1 (127.0.0.1:", "receive: timed out", NULL};
  CHECK(reducer_log_wait(r, l, 5000), "a rank stalled mid-message: the session is dropped after the io timeout");
  close(f0);
  close(f1);
}

static void test_sigterm(void) {
  reducer_t r;
  CHECK(reducer_start(&r, BUILD, DIR_, "term", NULL) == 0, "start a second reducer");
  int f0 = w_connect(&r);
  w_hello(f0, 0x6666, 0, 1, 65536, 5000);
  CHECK(w_ack(f0) == CT_RACK_OK, "a one-rank session runs");
  int st = reducer_stop(&r, SIGTERM, 5000);
  CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: exit status 0 (status %d)", st);
  ct_rmsg_t h;
  char text[CT_RMAX_REASON + 1] = "";
  CHECK(w_msg(f0, &h, text, CT_RMAX_REASON, 2000, NULL) == 1 && h.type == CT_RMSG_ABORT &&
        strstr(text, "reducer stopped (SIGTERM)"), "the rank is told why (%s)", text);
  close(f0);
  CHECK(access(r.port_file, F_OK) != 0, "port file removed at exit");
  const char* l[] = {"exiting on SIGTERM (1 session(s) served, 1 active at exit)", NULL};
  CHECK(reducer_log_has(&r, l), "log: exit line");
}

static void test_port_file(const reducer_t* r) {
  char* colon = strrchr(r->addr, ':');
  CHECK(!strncmp(r->addr, "127.0.0.1:", 10) && colon && atoi(colon + 1) > 0, "port file holds ADDR:PORT (%s)",
        r->addr);
  DIR* d = opendir(DIR_);
  int tmp = 0;
  for (struct dirent* e; d && (e = readdir(d));) tmp += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  CHECK(tmp == 0, "no temporary port file left (written by rename)");
}

/* CLUSTERTOOL_LINK_RATE paces the reducer: a session's bytes take at least their time at
 * the rate (a lower bound only, less a burst and the pacer's 20 ms catch-up: load makes it
 * slower, never faster), and the results are still right. */
static void test_paced(void) {
  setenv("CLUSTERTOOL_LINK_RATE", "8mbit", 1);   /* 10^6 bytes/s */
  reducer_t r;
  int up = reducer_start(&r, BUILD, DIR_, "paced", NULL) == 0;
  unsetenv("CLUSTERTOOL_LINK_RATE");
  CHECK(up, "a reducer paced at 8 Mbit/s starts");
  if (!up) return;
  pthread_t th[2];
  fake_t fs[2];
  long t0 = ru_now_ms();
  run_session(&r, 0x7777, 2, 8, 16384, th, fs);
  int ok = finish_session(2, th, fs);
  double took = (double)(ru_now_ms() - t0) / 1000.0;
  double in_bytes = 2.0 * 8 * (65536 + sizeof(ct_rmsg_t)), least = (in_bytes - 65536 - 0.02e6) / 1e6;
  CHECK(ok, "paced: both ranks get the chunks reduced in rank order");
  CHECK(took >= least, "paced: %.0f bytes in took %.2f s, at least %.2f s at 8 Mbit/s", in_bytes, took, least);
  reducer_stop(&r, SIGTERM, 5000);
}

static int run_cli(const char* args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/clustertool-reducer %s >/dev/null 2>&1", BUILD, args);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char** argv) {
  if (argc > 1) BUILD = argv[1];
  signal(SIGPIPE, SIG_IGN);
  snprintf(DIR_, sizeof DIR_, "/tmp/ct_reducer_test_XXXXXX");
  if (!mkdtemp(DIR_)) return 1;
  CHECK(run_cli("--help") == 0, "--help exits 0");
  CHECK(run_cli("--bogus") == 2, "an unknown option exits 2");
  CHECK(run_cli("--bind not-an-ip") == 2, "--bind that is not IPv4 exits 2");
  CHECK(run_cli("--threads 0") == 2, "--threads 0 exits 2");
  reducer_t r;
  const char* extra[] = {"--io-timeout-ms", "500", "--threads", "2", NULL};
  int up = reducer_start(&r, BUILD, DIR_, "main", extra) == 0;
  CHECK(up, "reducer starts and writes its port file");
  if (up) {
    test_port_file(&r);
    test_sessions(&r);
    test_refusals(&r);
    test_mismatch_and_abort(&r);
    test_heartbeat_and_stall(&r);
    int st = reducer_stop(&r, SIGINT, 5000);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGINT: exit status 0");
  }
  test_sigterm();
  test_paced();
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
  if (system(cmd)) { /* best effort */ }
  return CT_SUMMARY();
}

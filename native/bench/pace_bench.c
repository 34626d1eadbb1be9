/* CLUSTERTOOL_LINK_RATE's pacer over loopback TCP: C connections in one process, paced at a
 * set rate, measured throughput as a ratio of that rate (the target is 0.97-1.02).
 *
 *   pace_bench -r 1gbit -c 4 [-t 3] [-w 0.5] [-m take|wait] [-d tx|rx|both] [-s 64K]
 *
 * -m take: the non-blocking use, as the net plugin (on NCCL's proxy thread) and an epoll engine
 *   pace: one thread sends on every connection and one receives on every connection, each with
 *   ct_pace_take/ct_pace_refund, never sleeping with tokens at hand; starved, it sleeps the
 *   wait_us the pacer names, or polls the sockets when they are full.
 * -m wait: the blocking use: a thread per connection and side, ct_pace_wait before each piece.
 * -d: which buckets pace: the senders' (tx), the receivers' (rx) or both; -s the piece size.
 * Prints one line: mode, connections, direction, set and measured Mbit/s, and their ratio,
 * measured over -t seconds after -w seconds of warm-up (the burst is spent by then). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "ct_pace.h"

#define MAXC 64
static int g_n = 1, g_take = 1, g_ptx = 1, g_prx = 1;
static size_t g_piece = 65536;
static int g_tx[MAXC], g_rx[MAXC];
static atomic_int g_stop;
static atomic_ullong g_bytes;   /* received, all connections */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static int pair(int* a, int* b) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (l < 0 || bind(l, (struct sockaddr*)&sa, sizeof sa) || listen(l, 1) || getsockname(l, (struct sockaddr*)&sa, &len))
    return -1;
  *a = socket(AF_INET, SOCK_STREAM, 0);
  if (*a < 0 || connect(*a, (struct sockaddr*)&sa, sizeof sa)) return -1;
  *b = accept(l, NULL, NULL);
  close(l);
  int one = 1;
  setsockopt(*a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return *b < 0 ? -1 : 0;
}

/* ---- -m take: one sending and one receiving thread over every connection, non-blocking ---- */
static void* take_engine(void* arg) {
  int is_rx = arg != NULL, paced = is_rx ? g_prx : g_ptx, dir = is_rx ? CT_PACE_RX : CT_PACE_TX;
  int* fds = is_rx ? g_rx : g_tx;
  char* buf = calloc(1, g_piece);
  struct pollfd pf[MAXC];
  while (!atomic_load(&g_stop)) {
    long wait = -1;   /* shortest wait the pacer named this pass; -1 = none starved */
    int moved = 0, nfull = 0;
    for (int i = 0; i < g_n; i++) {
      long w = 0;
      size_t n = paced ? ct_pace_take(dir, g_piece, &w) : g_piece;
      if (n == 0) { if (wait < 0 || w < wait) wait = w; continue; }
      ssize_t k = is_rx ? recv(fds[i], buf, n, MSG_DONTWAIT) : send(fds[i], buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      size_t used = k > 0 ? (size_t)k : 0;
      if (paced && used < n) ct_pace_refund(dir, n - used);
      if (is_rx && used) atomic_fetch_add(&g_bytes, used);
      if (used) moved = 1;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) { free(buf); return NULL; }
      else pf[nfull++] = (struct pollfd){fds[i], (short)(is_rx ? POLLIN : POLLOUT), 0};
    }
    if (moved) continue;
    if (nfull) poll(pf, (nfds_t)nfull, wait >= 0 ? (int)((wait + 999) / 1000) : 10);
    else if (wait > 0) sleep_us(wait);
  }
  free(buf);
  return NULL;
}

/* ---- -m wait: a thread per connection and side, blocking ---- */
static void* wait_tx(void* arg) {
  int fd = g_tx[(intptr_t)arg];
  char* buf = calloc(1, g_piece);
  while (!atomic_load(&g_stop)) {
    if (g_ptx) ct_pace_wait(CT_PACE_TX, g_piece);
    for (size_t off = 0; off < g_piece;) {
      ssize_t k = send(fd, buf + off, g_piece - off, MSG_NOSIGNAL);
      if (k <= 0) { free(buf); return NULL; }
      off += (size_t)k;
    }
  }
  free(buf);
  return NULL;
}

static void* wait_rx(void* arg) {
  int fd = g_rx[(intptr_t)arg];
  char* buf = calloc(1, g_piece);
  while (!atomic_load(&g_stop)) {
    if (g_prx) ct_pace_wait(CT_PACE_RX, g_piece);   /* then read exactly the piece taken */
    ssize_t k = recv(fd, buf, g_piece, MSG_WAITALL);
    if (k <= 0) break;
    atomic_fetch_add(&g_bytes, (unsigned long long)k);
  }
  free(buf);
  return NULL;
}

static size_t parse_bytes(const char* s) {
  char* end;
  double v = strtod(s, &end);
  double m = (*end == 'k' || *end == 'K') ? 1024 : (*end == 'm' || *end == 'M') ? 1048576 : 1;
  return (size_t)(v * m);
}

int main(int argc, char** argv) {
  const char* rate = "1gbit";
  const char* dirs = "both";
  double secs = 3, warm = 0.5;
  for (int o; (o = getopt(argc, argv, "r:c:t:w:m:d:s:h")) != -1;) {
    switch (o) {
      case 'r': rate = optarg; break;
      case 'c': g_n = atoi(optarg); break;
      case 't': secs = atof(optarg); break;
      case 'w': warm = atof(optarg); break;
      case 'm': g_take = strcmp(optarg, "wait") != 0; break;
      case 'd': dirs = optarg; break;
      case 's': g_piece = parse_bytes(optarg); break;
      default:
        fprintf(stderr, "usage: %s -r RATE -c CONNS [-t SECONDS] [-w WARMUP] [-m take|wait] [-d tx|rx|both] "
                        "[-s PIECE]\n", argv[0]);
        return 2;
    }
  }
  g_ptx = strcmp(dirs, "rx") != 0;
  g_prx = strcmp(dirs, "tx") != 0;
  if (g_n < 1 || g_n > MAXC || g_piece < 1 || secs <= 0 || (!g_ptx && !g_prx)) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  setenv("CLUSTERTOOL_LINK_RATE", rate, 1);
  double set_bits = (double)ct_pace_rate_bits();
  if (set_bits <= 0) { fprintf(stderr, "-r %s: not a rate\n", rate); return 2; }
  for (int i = 0; i < g_n; i++)
    if (pair(&g_tx[i], &g_rx[i])) { perror("loopback connection"); return 1; }
  pthread_t th[2 * MAXC];
  int nth = 0;
  if (g_take) {
    for (int i = 0; i < g_n; i++) {
      fcntl(g_tx[i], F_SETFL, O_NONBLOCK);
      fcntl(g_rx[i], F_SETFL, O_NONBLOCK);
    }
    pthread_create(&th[nth++], NULL, take_engine, NULL);
    pthread_create(&th[nth++], NULL, take_engine, (void*)1);
  } else {
    for (intptr_t i = 0; i < g_n; i++) {
      pthread_create(&th[nth++], NULL, wait_tx, (void*)i);
      pthread_create(&th[nth++], NULL, wait_rx, (void*)i);
    }
  }
  sleep_us((long)(warm * 1e6));
  unsigned long long b0 = atomic_load(&g_bytes);
  double t0 = now_s();
  sleep_us((long)(secs * 1e6));
  unsigned long long b1 = atomic_load(&g_bytes);
  double t1 = now_s();
  atomic_store(&g_stop, 1);
  for (int i = 0; i < g_n; i++) { shutdown(g_tx[i], SHUT_RDWR); shutdown(g_rx[i], SHUT_RDWR); }
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  double got = (double)(b1 - b0) * 8 / (t1 - t0);
  printf("mode=%s conns=%d paced=%s rate=%.1fMbit measured=%.1fMbit ratio=%.4f\n", g_take ? "take" : "wait", g_n, dirs,
         set_bits / 1e6, got / 1e6, got / set_bits);
  return 0;
}

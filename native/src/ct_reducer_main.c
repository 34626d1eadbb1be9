/* clustertool-reducer: the reduction server of the CollNet `servers` algorithm.
 *
 *   clustertool-reducer [--bind ADDR] [--port PORT] [--port-file PATH] [--io-timeout-ms T]
 *                       [--threads N] [--window CHUNKS] [--sndbuf BYTES]
 *
 * Listens on ADDR:PORT (port 0: the kernel picks one), writes "ADDR:PORT\n" to the port
 * file (atomically: a temporary file renamed) once listening, and serves any number of
 * sessions (one per CollNet communicator, identified by the id in its hello) until
 * SIGTERM or SIGINT, then exits 0 and removes the port file. One line on stderr per
 * session start, end or error (ct_reducer_session.c) and per refused connection. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "ct_common.h"
#include "ct_reducer.h"

#define MAX_PENDING 256
#define HELLO_TIMEOUT_MS 10000

typedef struct { int fd; size_t got; ct_rhello_t h; long deadline; char peer[48]; } pending_t;

static int g_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) {
  g_signal = sig;
  char b = 1;
  if (write(g_sigpipe[1], &b, 1) < 0) { /* nothing to do in a handler */ }
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: clustertool-reducer [--bind ADDR] [--port PORT] [--port-file PATH] [--io-timeout-ms T]\n"
          "                           [--threads N] [--window CHUNKS] [--sndbuf BYTES]\n"
          "Reduction server for the clustertool CollNet plugin's `servers` algorithm.\n"
          "  --bind ADDR         IPv4 address to listen on (default: the plugin's rule: CLUSTERTOOL_SOCKET_ADDR,\n"
          "                      CLUSTERTOOL_SOCKET_IFNAME/NCCL_SOCKET_IFNAME, first non-loopback interface)\n"
          "  --port PORT         0 (default): any free port\n"
          "  --port-file PATH    write ADDR:PORT and a newline here once listening (removed at exit)\n"
          "  --io-timeout-ms T   drop a session whose worker stalls mid-message or stops reading (30000)\n"
          "  --threads N         reduction threads per session (1)\n"
          "  --window CHUNKS     chunks buffered per worker and session (16)\n"
          "  --sndbuf BYTES      socket send buffer towards workers, 0 = kernel default (0)\n"
          "Exits 0 on SIGTERM/SIGINT; logs one line per session start, end and error on stderr.\n"
          "CLUSTERTOOL_LINK_RATE (e.g. 1gbit) paces all its traffic, one bucket per direction.\n");
}

static long arg_long(const char* opt, const char* v, long lo, long hi) {
  char* end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    fprintf(stderr, "clustertool-reducer: %s %s: want %ld..%ld\n", opt, v, lo, hi);
    exit(2);
  }
  return x;
}

static void fmt_addr(const struct sockaddr_in* a, char* out, size_t len) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
  snprintf(out, len, "%s:%d", ip, ntohs(a->sin_port));
}

static int write_port_file(const char* path, const char* text) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (!f) return -1;
  int ok = fprintf(f, "%s\n", text) > 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path)) { unlink(tmp); return -1; }
  return 0;
}

/* Validates a complete hello and places the connection in its session. Returns the
 * session when it just became complete, NULL otherwise (the connection is kept or closed). */
static ct_rsession_t* join(ct_rsession_t** sessions, pending_t* p, const ct_rconfig_t* cfg, int wake_fd) {
  const ct_rhello_t* h = &p->h;
  const char* bad = NULL;
  ct_rsession_t* s = NULL;
  if (h->magic != CT_RHELLO_MAGIC) bad = "not a clustertool worker (bad magic)";
  else if (h->version != CT_RPROTO_VERSION) bad = "protocol version differs (plugin and reducer from different builds?)";
  else if (h->nranks < 1 || h->nranks > CT_RMAX_RANKS || h->rank >= h->nranks) bad = "bad rank or rank count";
  else if (h->chunk_bytes < 64 || h->chunk_bytes > CT_RMAX_CHUNK) bad = "bad chunk size";
  if (!bad) {
    for (s = *sessions; s && s->id != h->session; s = s->next) {}
    if (s && s->state != CT_RS_ASSEMBLING) bad = "its session has already started";
    else if (s && (s->n != h->nranks || s->chunk != h->chunk_bytes)) bad = "rank count or chunk differs from its session's";
    else if (s && s->conns[h->rank].fd >= 0) bad = "rank already joined its session";
  }
  if (!bad && !s) {
    if (!(s = ct_rsession_new(h, cfg, wake_fd))) bad = "out of memory";
    else { s->next = *sessions; *sessions = s; }
  }
  if (bad) {
    ct_rlog("refused connection from %s: %s", p->peer, bad);
    close(p->fd);
    return NULL;
  }
  ct_rconn_t* c = &s->conns[h->rank];
  c->fd = p->fd;
  snprintf(c->peer, sizeof c->peer, "%s", p->peer);
  if (h->timeout_ms / 4 < s->hb_ms) s->hb_ms = h->timeout_ms / 4;   /* the strictest worker's pace */
  return ++s->joined == (int)s->n ? s : NULL;
}

static void drop_session(ct_rsession_t** sessions, ct_rsession_t* s, const char* fmt_why, const char* arg) {
  for (ct_rsession_t** pp = sessions; *pp; pp = &(*pp)->next)
    if (*pp == s) { *pp = s->next; break; }
  char why[256];
  snprintf(why, sizeof why, fmt_why, arg);
  ct_rlog("session %016llx error: %s (%d of %u ranks had joined)", (unsigned long long)s->id, why, s->joined, s->n);
  ct_rsession_free(s);
}

int main(int argc, char** argv) {
  ct_rconfig_t cfg = {30000, 1, 16, 0};
  const char *bind_addr = NULL, *port_file = NULL;
  long port = 0;
  static const struct option opts[] = {
      {"bind", required_argument, 0, 'b'}, {"port", required_argument, 0, 'p'},
      {"port-file", required_argument, 0, 'f'}, {"io-timeout-ms", required_argument, 0, 't'},
      {"threads", required_argument, 0, 'n'}, {"window", required_argument, 0, 'w'},
      {"sndbuf", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {"version", no_argument, 0, 'V'},
      {0, 0, 0, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    switch (c) {
      case 'b': bind_addr = optarg; break;
      case 'p': port = arg_long("--port", optarg, 0, 65535); break;
      case 'f': port_file = optarg; break;
      case 't': cfg.io_timeout_ms = (int)arg_long("--io-timeout-ms", optarg, 100, 3600000); break;
      case 'n': cfg.threads = (int)arg_long("--threads", optarg, 1, 64); break;
      case 'w': cfg.window = (int)arg_long("--window", optarg, 2, 1024); break;
      case 's': cfg.sndbuf = (int)arg_long("--sndbuf", optarg, 0, 1L << 30); break;
      case 'V': printf("clustertool-reducer %s (protocol %u)\n", CT_VERSION, CT_RPROTO_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) { usage(stderr); return 2; }
  struct sockaddr_in a, bound;
  if (bind_addr) {
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, bind_addr, &a.sin_addr) != 1) {
      fprintf(stderr, "clustertool-reducer: --bind %s is not an IPv4 address\n", bind_addr);
      return 2;
    }
  } else if (ct_local_addr(&a, NULL, 0)) {
    return 1;
  }
  a.sin_port = htons((uint16_t)port);
  int lfd = ct_listen_socket(&a, &bound);
  if (lfd < 0) return 1;
  struct sockaddr_in shown = bound;
  if (shown.sin_addr.s_addr == htonl(INADDR_ANY)) {  /* name a reachable address, not 0.0.0.0 */
    struct sockaddr_in local;
    if (ct_local_addr(&local, NULL, 0) == 0) shown.sin_addr = local.sin_addr;
  }
  char where[64];
  fmt_addr(&shown, where, sizeof where);
  int wake[2];
  if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) || pipe2(wake, O_CLOEXEC | O_NONBLOCK)) return 1;
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (port_file && write_port_file(port_file, where)) {
    fprintf(stderr, "clustertool-reducer: cannot write the port file %s: %s\n", port_file, strerror(errno));
    return 1;
  }
  ct_rlog("listening on %s (pid %d, io timeout %d ms, %d reduction thread(s) per session)", where, (int)getpid(),
          cfg.io_timeout_ms, cfg.threads);
  ct_rsession_t* sessions = NULL;
  pending_t pend[MAX_PENDING];
  int npend = 0;
  unsigned long served = 0;
  while (!g_signal) {
    /* poll set: listener, signal pipe, wake pipe, pending hellos, connections of assembling sessions */
    struct pollfd pf[3 + MAX_PENDING + 1024];
    ct_rconn_t* who[1024];
    int np = 0, nwho = 0;
    pf[np++] = (struct pollfd){lfd, npend < MAX_PENDING ? POLLIN : 0, 0};
    pf[np++] = (struct pollfd){g_sigpipe[0], POLLIN, 0};
    pf[np++] = (struct pollfd){wake[0], POLLIN, 0};
    for (int i = 0; i < npend; i++) pf[np++] = (struct pollfd){pend[i].fd, POLLIN, 0};
    for (ct_rsession_t* s = sessions; s; s = s->next)
      if (s->state == CT_RS_ASSEMBLING)
        for (uint32_t r = 0; r < s->n && nwho < 1024; r++)
          if (s->conns[r].fd >= 0) { who[nwho++] = &s->conns[r]; pf[np++] = (struct pollfd){s->conns[r].fd, POLLIN, 0}; }
    if (poll(pf, (nfds_t)np, 500) < 0 && errno != EINTR) break;
    long now = ct_now_ms();
    char drain[64];
    while (read(wake[0], drain, sizeof drain) > 0) {}
    /* a joined worker that closes (or talks) before its session starts: the session is off */
    for (int i = 0; i < nwho; i++)
      if (pf[3 + npend + i].revents) {
        ct_rconn_t* c = who[i];
        char why[128];
        snprintf(why, sizeof why, "rank %d (%s) closed its connection before every rank had joined", c->rank, c->peer);
        drop_session(&sessions, c->s, "%s", why);
        break;   /* the poll set is stale now */
      }
    /* pending hellos: read what arrived, time out the slow */
    for (int i = npend - 1; i >= 0; i--) {
      pending_t* p = &pend[i];
      int done = 0;
      if (pf[3 + i].revents) {
        ssize_t k = recv(p->fd, (char*)&p->h + p->got, sizeof p->h - p->got, MSG_DONTWAIT);
        if (k > 0) p->got += (size_t)k;
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
          ct_rlog("refused connection from %s: closed before its hello", p->peer);
          close(p->fd);
          done = 1;
        } else if (p->got == sizeof p->h) {
          ct_rsession_t* s = join(&sessions, p, &cfg, wake[1]);
          done = 1;
          if (s && ct_rsession_start(s)) drop_session(&sessions, s, "%s", "cannot start (out of memory?)");
          else if (s) served++;
        }
      } else if (now > p->deadline) {
        ct_rlog("refused connection from %s: no hello within %d ms", p->peer, HELLO_TIMEOUT_MS);
        close(p->fd);
        done = 1;
      }
      if (done) pend[i] = pend[--npend];
    }
    if (pf[0].revents & POLLIN) {
      struct sockaddr_in peer;
      socklen_t len = sizeof peer;
      int fd = accept4(lfd, (struct sockaddr*)&peer, &len, SOCK_CLOEXEC);
      if (fd >= 0) {
        ct_tune_socket(fd);
        pend[npend] = (pending_t){fd, 0, {0}, now + HELLO_TIMEOUT_MS, ""};
        fmt_addr(&peer, pend[npend].peer, sizeof pend[npend].peer);
        npend++;
      }
    }
    /* finished sessions: join and free */
    for (ct_rsession_t** pp = &sessions; *pp;) {
      ct_rsession_t* s = *pp;
      pthread_mutex_lock(&s->mu);
      int fin = s->state == CT_RS_FINISHED;
      pthread_mutex_unlock(&s->mu);
      if (fin) {
        pthread_join(s->master, NULL);
        *pp = s->next;
        ct_rsession_free(s);
      } else if (s->state == CT_RS_ASSEMBLING && now - s->created_ms > 4L * cfg.io_timeout_ms + 60000) {
        *pp = s->next;
        s->next = NULL;
        ct_rsession_t* tmp = s;
        drop_session(&tmp, s, "%s", "not every rank joined in time");
      } else {
        pp = &s->next;
      }
    }
  }
  int active = 0;
  for (ct_rsession_t* s = sessions; s; s = s->next) {
    if (s->state == CT_RS_ASSEMBLING) continue;
    active++;
    ct_rsession_abort(s, g_signal == SIGINT ? "reducer stopped (SIGINT)" : "reducer stopped (SIGTERM)");
  }
  while (sessions) {
    ct_rsession_t* s = sessions;
    sessions = s->next;
    if (s->state != CT_RS_ASSEMBLING) pthread_join(s->master, NULL);
    ct_rsession_free(s);
  }
  for (int i = 0; i < npend; i++) close(pend[i].fd);
  close(lfd);
  if (port_file) unlink(port_file);
  ct_rlog("exiting on %s (%lu session(s) served, %d active at exit)", g_signal == SIGINT ? "SIGINT" : "SIGTERM", served,
          active);
  return 0;
}

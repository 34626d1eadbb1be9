/* One reduction session (one CollNet communicator) of clustertool-reducer.
 *
 * Per rank a receiver thread reads DATA chunks into a window of W slots and a sender
 * thread returns RESULT chunks; `threads` reduction threads take reductions g in turn
 * (g % threads). Reduction g combines the g-th chunk of every rank in rank order
 * 0, 1, ..., n-1, so every rank gets the same bytes whatever the arrival order.
 * Flow control is the window: a receiver reads chunk g only once reduction g-W is done
 * (TCP holds the rest back at the worker); a reduction writes its output slot only once
 * every sender has sent reduction g-W. While a sender has nothing to send it sends a
 * heartbeat every hb_ms, so a worker tells a waiting server from a dead one.
 * Workers stream the chunks of many collectives back to back (the plugin's window); each
 * connection is one ordered stream, so the contract above holds whatever their size.
 * Every byte in and out goes through the process's pacer (CLUSTERTOOL_LINK_RATE,
 * ct_pace.h): the server's NIC is one link whatever the number of workers. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "ct_pace.h"
#include "ct_reduce.h"
#include "ct_reducer.h"

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

void ct_rlog(const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "clustertool-reducer: %s\n", msg);
  fflush(stderr);
}

/* First error wins; every socket is shut down so blocked threads return. Lock held. */
static void stop_locked(ct_rsession_t* s, const char* fmt, ...) {
  if (!s->err[0] && fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
  }
  if (!s->stop) {
    s->stop = 1;
    /* tell every rank why (best effort: a sender may be mid-message, then the rank just
     * sees the connection close) */
    char why[CT_RMAX_REASON];
    snprintf(why, sizeof why, "%.199s", s->err[0] ? s->err : "session stopped");
    ct_rmsg_t h = {CT_RMSG_MAGIC, CT_RMSG_ABORT, 0, 0, 0, 0, 0, (uint32_t)strlen(why), 0};
    for (uint32_t r = 0; r < s->n; r++) {
      if (s->conns[r].fd < 0) continue;
      if (!s->sending[r]) {
        struct iovec iov[2] = {{&h, sizeof h}, {why, h.len}};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
        if (sendmsg(s->conns[r].fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
      }
      shutdown(s->conns[r].fd, SHUT_RDWR);
    }
  }
  pthread_cond_broadcast(&s->cv);
}

void ct_rsession_abort(ct_rsession_t* s, const char* why) {
  pthread_mutex_lock(&s->mu);
  stop_locked(s, "%s", why);
  pthread_mutex_unlock(&s->mu);
}

/* Full transfers with a bound on each wait: -1 and errno ETIMEDOUT after timeout_ms
 * without progress; 0 for a connection closed before the first byte (recv only).
 * Received bytes are paid for after they arrived (ct_pace_wait sleeps off the debt): a
 * thread that took tokens first and then waited for its worker's data would hold the
 * other ranks' receivers back for nothing. Sends take their tokens first. */
static int recv_full(int fd, void* buf, size_t len, int timeout_ms, int first_blocks) {
  char* p = buf;
  size_t got = 0;
  while (got < len) {
    if (got > 0 || !first_blocks) {
      struct pollfd pf = {fd, POLLIN, 0};
      int r = poll(&pf, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) { errno = ETIMEDOUT; return -1; }
    }
    ssize_t k = recv(fd, p + got, len - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) { if (got == 0) return 0; errno = ECONNRESET; return -1; }
    if (k < 0) return -1;
    got += (size_t)k;
    ct_pace_wait(CT_PACE_RX, (size_t)k);
  }
  return 1;
}

static int send_full(int fd, const void* h, size_t hl, const void* p, size_t pl, int timeout_ms) {
  struct iovec iov[2] = {{(void*)h, hl}, {(void*)p, pl}};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = pl ? 2 : 1};
  size_t left = hl + pl;
  while (left) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int r = poll(&pf, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) { errno = ETIMEDOUT; return -1; }
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return -1;
    left -= (size_t)k;
    while (k > 0) {
      if ((size_t)k >= m.msg_iov[0].iov_len) { k -= (ssize_t)m.msg_iov[0].iov_len; m.msg_iov++; m.msg_iovlen--; }
      else { m.msg_iov[0].iov_base = (char*)m.msg_iov[0].iov_base + k; m.msg_iov[0].iov_len -= (size_t)k; k = 0; }
    }
  }
  return 0;
}

typedef struct { ct_rsession_t* s; int idx; } targ_t;

static const char* why(void) { return errno == ETIMEDOUT ? "timed out" : strerror(errno); }

static void* recv_main(void* arg) {
  targ_t* t = arg;
  ct_rsession_t* s = t->s;
  ct_rconn_t* c = &s->conns[t->idx];
  int w = t->idx, tmo = s->cfg->io_timeout_ms;
  for (uint64_t g = 0;; g++) {
    pthread_mutex_lock(&s->mu);
    while (!s->stop && g >= s->reduced + (uint64_t)s->W) pthread_cond_wait(&s->cv, &s->mu);
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    if (stop) break;
    size_t slot = g % (uint64_t)s->W;
    ct_rmsg_t* h = &s->ihdr[(size_t)w * (size_t)s->W + slot];
    int r = recv_full(c->fd, h, sizeof *h, tmo, 1);
    const char* bad = NULL;
    if (r == 0) {
      pthread_mutex_lock(&s->mu);
      s->eof[w] = 1;
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
      break;
    }
    int gone = 0;   /* the rank's connection went away (it failed or exited), not a protocol fault */
    if (r < 0) { gone = errno == ECONNRESET || errno == EPIPE; bad = why(); }
    else if (h->magic != CT_RMSG_MAGIC || h->type != CT_RMSG_DATA) bad = "not a data message";
    else if (h->len > s->chunk || !ct_reduce_supported((ncclDataType_t)h->dtype, (ncclRedOp_t)h->redop) ||
             h->len % ct_dtype_size((ncclDataType_t)h->dtype))
      bad = "bad chunk length, type or op";
    else if (h->len && recv_full(c->fd, s->in + ((size_t)w * (size_t)s->W + slot) * s->chunk, h->len, tmo, 0) <= 0) {
      gone = errno == ECONNRESET || errno == EPIPE;
      bad = why();
    }
    uint64_t arrived = s->late && !bad ? ct_rlate_now_us() : 0;   /* the whole chunk: what the reduction waits for */
    pthread_mutex_lock(&s->mu);
    if (bad && gone) stop_locked(s, "rank %d (%s) closed its connection mid-collective (receive: %s)", w, c->peer, bad);
    else if (bad) stop_locked(s, "rank %d (%s): receive: %s", w, c->peer, bad);
    else {
      s->recvd[w] = g + 1;
      if (s->late) ct_rlate_arrival(s, (uint32_t)w, slot, arrived);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (bad) break;
  }
  pthread_mutex_lock(&s->mu);
  s->recv_left--;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Reduction g can run (1), will never run (0: the session is over or broken), lock held. */
static int wait_inputs(ct_rsession_t* s, uint64_t g) {
  for (;;) {
    if (s->stop) return 0;
    uint32_t have = 0, closed = 0, ahead = 0;
    for (uint32_t r = 0; r < s->n; r++) {
      if (s->recvd[r] > g) have++;
      else if (s->eof[r]) closed = closed ? closed : r + 1;
      if (s->recvd[r] > g) ahead = 1;
    }
    uint64_t min_sent = UINT64_MAX;
    for (uint32_t r = 0; r < s->n; r++) min_sent = s->sent[r] < min_sent ? s->sent[r] : min_sent;
    if (have == s->n && g < min_sent + (uint64_t)s->W) return 1;
    if (closed && ahead) {
      stop_locked(s, "rank %u (%s) closed its connection mid-collective", closed - 1, s->conns[closed - 1].peer);
      return 0;
    }
    if (s->recv_left == 0 && have < s->n) return 0;   /* every rank has gone: the end */
    pthread_cond_wait(&s->cv, &s->mu);
  }
}

static void* reduce_main(void* arg) {
  targ_t* t = arg;
  ct_rsession_t* s = t->s;
  uint32_t n = s->n;
  const char** src = malloc(sizeof(char*) * n);
  for (uint64_t g = (uint64_t)t->idx;; g += (uint64_t)s->cfg->threads) {
    pthread_mutex_lock(&s->mu);
    int go = src && wait_inputs(s, g);
    pthread_mutex_unlock(&s->mu);
    if (!go) break;
    size_t slot = g % (uint64_t)s->W;
    const ct_rmsg_t* h0 = &s->ihdr[slot];
    const char* bad = NULL;
    uint32_t who = 0;
    for (uint32_t r = 1; r < n && !bad; r++) {
      const ct_rmsg_t* h = &s->ihdr[(size_t)r * (size_t)s->W + slot];
      if (h->seq != h0->seq || h->chunk != h0->chunk || h->len != h0->len || h->dtype != h0->dtype ||
          h->redop != h0->redop) {
        bad = "its chunk differs from rank 0's (collectives posted in a different order?)";
        who = r;
      }
    }
    if (!bad) {
      ncclDataType_t dt = (ncclDataType_t)h0->dtype;
      size_t cnt = h0->len / ct_dtype_size(dt);
      char* out = s->out + slot * s->chunk;
      for (uint32_t r = 0; r < n; r++) src[r] = s->in + ((size_t)r * (size_t)s->W + slot) * s->chunk;
      if (n == 1) memcpy(out, src[0], h0->len);
      else ct_reduce(out, src[0], src[1], cnt, dt, (ncclRedOp_t)h0->redop);
      for (uint32_t r = 2; r < n; r++) ct_reduce(out, out, src[r], cnt, dt, (ncclRedOp_t)h0->redop);
    }
    pthread_mutex_lock(&s->mu);
    if (bad) {
      stop_locked(s, "rank %u (%s): %s", who, s->conns[who].peer, bad);
    } else {
      s->ohdr[slot] = (ct_rmsg_t){CT_RMSG_MAGIC, CT_RMSG_RESULT, h0->dtype, h0->redop, 0, h0->seq, h0->chunk,
                                  h0->len, 0};
      s->done_g[slot] = g + 1;
      s->bytes += h0->len;
      while (s->done_g[s->reduced % (uint64_t)s->W] == s->reduced + 1) s->reduced++;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (bad) break;
  }
  free(src);
  return NULL;
}

static void* send_main(void* arg) {
  targ_t* t = arg;
  ct_rsession_t* s = t->s;
  ct_rconn_t* c = &s->conns[t->idx];
  int w = t->idx;
  for (uint64_t g = 0;;) {
    pthread_mutex_lock(&s->mu);
    int ready = 0, over = 0;
    while (!s->stop) {
      if (s->reduced > g) { ready = 1; break; }
      if (s->recv_left == 0 && s->recvd[w] <= g) { over = 1; break; }   /* nothing more will come */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      long ns = ts.tv_nsec + (long)s->hb_ms * 1000000L;
      ts.tv_sec += ns / 1000000000L;
      ts.tv_nsec = ns % 1000000000L;
      if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT && s->reduced <= g && !s->stop) break;
    }
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    if (stop || over) break;
    int rc;
    const char* what = "send";
    pthread_mutex_lock(&s->mu);
    s->sending[w] = 1;   /* an ABORT must not land inside this message */
    pthread_mutex_unlock(&s->mu);
    if (!ready) {
      /* heartbeat: only when the worker's socket has room; a worker not reading is not waiting on us */
      ct_rmsg_t hb = {CT_RMSG_MAGIC, CT_RMSG_HEARTBEAT, 0, 0, 0, 0, 0, 0, 0};
      ct_pace_wait(CT_PACE_TX, sizeof hb);
      ssize_t k = send(c->fd, &hb, sizeof hb, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k == (ssize_t)sizeof hb || (k < 0 && (errno == EAGAIN || errno == EINTR))) rc = 0;
      else rc = k < 0 ? -1 : send_full(c->fd, (char*)&hb + k, sizeof hb - (size_t)k, NULL, 0, s->cfg->io_timeout_ms);
      what = "heartbeat";
    } else {
      size_t slot = g % (uint64_t)s->W;
      ct_pace_wait(CT_PACE_TX, sizeof(ct_rmsg_t) + s->ohdr[slot].len);
      rc = send_full(c->fd, &s->ohdr[slot], sizeof(ct_rmsg_t), s->out + slot * s->chunk, s->ohdr[slot].len,
                     s->cfg->io_timeout_ms);
    }
    int err = errno;
    pthread_mutex_lock(&s->mu);
    s->sending[w] = 0;
    if (rc && (err == EPIPE || err == ECONNRESET))
      stop_locked(s, "rank %d (%s) closed its connection mid-collective (%s: %s)", w, c->peer, what, strerror(err));
    else if (rc)
      stop_locked(s, "rank %d (%s): %s: %s", w, c->peer, what, err == ETIMEDOUT ? "not reading (timed out)" : strerror(err));
    else if (ready) s->sent[w] = ++g;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc) break;
  }
  return NULL;
}

static void* master_main(void* arg) {
  ct_rsession_t* s = arg;
  uint32_t n = s->n;
  int T = s->cfg->threads, nt = 2 * (int)n + T;
  pthread_t* th = calloc((size_t)nt, sizeof *th);
  targ_t* ta = calloc((size_t)nt, sizeof *ta);
  long t0 = now_ms();
  int started = 0;
  ct_rlate_start(s);
  if (th && ta) {
    for (int i = 0; i < nt; i++) {
      ta[i] = (targ_t){s, i < (int)n ? i : i < 2 * (int)n ? i - (int)n : i - 2 * (int)n};
      void* (*fn)(void*) = i < (int)n ? recv_main : i < 2 * (int)n ? send_main : reduce_main;
      if (pthread_create(&th[i], NULL, fn, &ta[i])) break;
      started++;
    }
  }
  if (started < nt) {
    pthread_mutex_lock(&s->mu);
    s->recv_left -= (int)n - (started < (int)n ? started : (int)n);
    stop_locked(s, "cannot start the session's threads");
    pthread_mutex_unlock(&s->mu);
  }
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  ct_rlate_close(s);
  free(th);
  free(ta);
  double secs = (double)(now_ms() - t0) / 1000.0;
  if (s->err[0])
    ct_rlog("session %016llx error: %s (after %llu reductions, %llu bytes)", (unsigned long long)s->id, s->err,
            (unsigned long long)s->reduced, (unsigned long long)s->bytes);
  else
    ct_rlog("session %016llx end: %u ranks, %llu reductions, %llu bytes in %.1f s", (unsigned long long)s->id, n,
            (unsigned long long)s->reduced, (unsigned long long)s->bytes, secs);
  pthread_mutex_lock(&s->mu);
  s->state = CT_RS_FINISHED;
  pthread_mutex_unlock(&s->mu);
  char b = 1;
  if (write(s->wake_fd, &b, 1) < 0) { /* the main loop also polls on a timer */ }
  return NULL;
}

ct_rsession_t* ct_rsession_new(const ct_rhello_t* h, const ct_rconfig_t* cfg, int wake_fd) {
  ct_rsession_t* s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->id = h->session;
  s->n = h->nranks;
  s->chunk = h->chunk_bytes;
  s->server_index = h->server_index;
  s->nservers = h->nservers;
  s->hb_ms = h->timeout_ms / 4;
  s->cfg = cfg;
  s->wake_fd = wake_fd;
  s->created_ms = now_ms();
  s->conns = calloc(s->n, sizeof *s->conns);
  if (!s->conns) { free(s); return NULL; }
  for (uint32_t r = 0; r < s->n; r++) s->conns[r] = (ct_rconn_t){s, -1, (int)r, ""};
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  return s;
}

int ct_rsession_start(ct_rsession_t* s) {
  uint32_t n = s->n;
  s->W = s->cfg->window;
  if (s->hb_ms < 20) s->hb_ms = 20;
  if (s->hb_ms > 10000) s->hb_ms = 10000;
  size_t slots = (size_t)n * (size_t)s->W;
  s->in = malloc(slots * s->chunk + 1);
  s->ihdr = calloc(slots, sizeof *s->ihdr);
  s->out = malloc((size_t)s->W * s->chunk + 1);
  s->ohdr = calloc((size_t)s->W, sizeof *s->ohdr);
  s->done_g = calloc((size_t)s->W, sizeof *s->done_g);
  s->recvd = calloc(n, sizeof *s->recvd);
  s->sent = calloc(n, sizeof *s->sent);
  s->eof = calloc(n, sizeof *s->eof);
  s->sending = calloc(n, sizeof *s->sending);
  s->recv_left = (int)n;
  int ok = s->in && s->ihdr && s->out && s->ohdr && s->done_g && s->recvd && s->sent && s->eof && s->sending;
  ct_rack_t ack = {CT_RACK_MAGIC, ok ? CT_RACK_OK : CT_RACK_REFUSED, n, 0};
  for (uint32_t r = 0; r < n; r++) {
    if (send_full(s->conns[r].fd, &ack, sizeof ack, NULL, 0, s->cfg->io_timeout_ms)) ok = 0;
    int one = 1;
    setsockopt(s->conns[r].fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    if (s->cfg->sndbuf > 0) setsockopt(s->conns[r].fd, SOL_SOCKET, SO_SNDBUF, &s->cfg->sndbuf, sizeof(int));
  }
  s->state = CT_RS_RUNNING;
  if (!ok) return -1;
  ct_rlate_open(s);
  char who[256] = "";
  for (uint32_t r = 0; r < n && strlen(who) < 200; r++)
    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s", r ? " " : "", s->conns[r].peer);
  ct_rlog("session %016llx start: %u ranks (%s%s), server %u of %u, chunk %u bytes", (unsigned long long)s->id, n,
          who, strlen(who) >= 200 ? " ..." : "", s->server_index + 1, s->nservers, s->chunk);
  if (pthread_create(&s->master, NULL, master_main, s)) return -1;
  return 0;
}

void ct_rsession_free(ct_rsession_t* s) {
  if (!s) return;
  for (uint32_t r = 0; r < s->n; r++)
    if (s->conns[r].fd >= 0) close(s->conns[r].fd);
  free(s->conns);
  free(s->in);
  free(s->ihdr);
  free(s->out);
  free(s->ohdr);
  free(s->done_g);
  free(s->recvd);
  free(s->sent);
  free(s->eof);
  free(s->sending);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

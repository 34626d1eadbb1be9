/* Worker threads of the CollNet engine: per-peer senders and receivers, and the
 * reduction thread. Each thread walks the op queue in order, doing its part of
 * every op; a socket carries one op's messages before the next op's. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "ct_coll.h"
#include "ct_reduce.h"

#define MSG_MAGIC 0x43544d31u
typedef struct {
  uint32_t magic, seq, step, chunk;
  uint64_t len;
} ct_msg_t;

static size_t nch(const ct_op_t* op, size_t len) { return (len + op->chunk - 1) / op->chunk; }
static size_t clen(const ct_op_t* op, size_t len, size_t c) {
  size_t b = c * op->chunk;
  return len - b < op->chunk ? len - b : op->chunk;
}
static int mod(int a, int n) { return ((a % n) + n) % n; }

/* The first failure is WARNed (naming the peer or the server) and fails the
 * communicator; every socket is shut down so no thread stays blocked and the peers
 * and servers see the end at once. */
static void fail(ct_worker_t* w, ct_op_t* op, const char* what) {
  ct_coll_t* c = w->c;
  pthread_mutex_lock(&c->mu);
  if (!c->error && !c->shutdown) {
    if (w->why[0]) CT_WARN("rank %d: %s", c->rank, w->why);
    else CT_WARN("rank %d: %s with peer %d failed (%s)", c->rank, what, w->peer, strerror(errno));
  }
  if (!c->error) {
    size_t nfd = (size_t)c->nranks * (size_t)c->nsocks;
    for (size_t i = 0; i < nfd; i++)
      if (c->fds[i] >= 0) shutdown(c->fds[i], SHUT_RDWR);
    for (int s = 0; s < c->nserv; s++)
      if (c->sfds[s] >= 0) shutdown(c->sfds[s], SHUT_RDWR);
  }
  c->error = 1;
  if (op) op->error = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static int send_msg(int fd, const ct_op_t* op, uint32_t step, uint32_t chunk, const void* p, size_t len) {
  ct_msg_t h = {MSG_MAGIC, (uint32_t)op->seq, step, chunk, len};
  struct iovec iov[2] = {{&h, sizeof h}, {(void*)p, len}};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
  size_t left = sizeof h + len;
  while (left) {
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    left -= (size_t)r;
    while (r > 0 && m.msg_iovlen) {
      if ((size_t)r >= m.msg_iov[0].iov_len) {
        r -= (ssize_t)m.msg_iov[0].iov_len;
        m.msg_iov++;
        m.msg_iovlen--;
      } else {
        m.msg_iov[0].iov_base = (char*)m.msg_iov[0].iov_base + r;
        m.msg_iov[0].iov_len -= (size_t)r;
        r = 0;
      }
    }
  }
  return 0;
}

static int recv_hdr(int fd, const ct_op_t* op, ct_msg_t* h) {
  if (ct_recv_all(fd, h, sizeof *h)) return -1;
  if (h->magic != MSG_MAGIC || h->seq != (uint32_t)op->seq) { errno = EPROTO; return -1; }
  return 0;
}

/* Wait, with the lock held, until pred holds or the comm fails. */
#define WAIT_UNTIL(c, pred) \
  while (!(pred) && !(c)->error && !(c)->shutdown) pthread_cond_wait(&(c)->cv, &(c)->mu)

/* ---------------- sharded ---------------- */
static int sharded_send(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int p = w->peer, me = c->rank, ns = c->nsocks, fd = c->fds[p * ns + w->sock];
  size_t n1 = op->has_p1 ? nch(op, op->len[p]) : 0, n2 = op->has_p2 ? nch(op, op->len[me]) : 0;
  size_t c1 = (size_t)w->sock, c2 = (size_t)w->sock;
  while (c1 < n1 || c2 < n2) {
    int ready = 0;
    if (c2 < n2) {
      pthread_mutex_lock(&c->mu);
      if (c1 >= n1) WAIT_UNTIL(c, !op->has_p1 || (size_t)op->reduced > c2);
      ready = !op->has_p1 || (size_t)op->reduced > c2;
      int bad = c->error || c->shutdown;
      pthread_mutex_unlock(&c->mu);
      if (bad) return -1;
    }
    if (ready) {
      if (send_msg(fd, op, 2, (uint32_t)c2, op->p2_src + c2 * op->chunk, clen(op, op->len[me], c2))) return -1;
      c2 += (size_t)ns;
    } else {
      if (send_msg(fd, op, 1, (uint32_t)c1, op->p1_src + op->off[p] + c1 * op->chunk, clen(op, op->len[p], c1)))
        return -1;
      c1 += (size_t)ns;
    }
  }
  return 0;
}

/* Lock-step schedule: one thread per socket index sends to every peer in turn,
 * chunk by chunk: phase-1 chunk c to peers me+1, me+2, ..., then every reduced
 * chunk that is ready to all peers. Every peer's shard advances at the same pace,
 * so reductions never wait on one slow stream and the link never idles while
 * one peer's data is late. */
static int sharded_send_lockstep(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int me = c->rank, n = c->nranks, ns = c->nsocks;
  size_t n2 = op->has_p2 ? nch(op, op->len[me]) : 0, nmax = 0;
  if (op->has_p1)
    for (int p = 0; p < n; p++) nmax = nch(op, op->len[p]) > nmax ? nch(op, op->len[p]) : nmax;
  size_t c1 = (size_t)w->sock, c2 = (size_t)w->sock;
  while (c1 < nmax || c2 < n2) {
    if (c1 < nmax) {
      for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        if (c1 >= nch(op, op->len[p])) continue;
        if (send_msg(c->fds[p * ns + w->sock], op, 1, (uint32_t)c1, op->p1_src + op->off[p] + c1 * op->chunk,
                     clen(op, op->len[p], c1)))
          return -1;
      }
      c1 += (size_t)ns;
    }
    for (;;) {
      if (c2 >= n2) break;
      pthread_mutex_lock(&c->mu);
      if (c1 >= nmax) WAIT_UNTIL(c, !op->has_p1 || (size_t)op->reduced > c2);
      int ready = !op->has_p1 || (size_t)op->reduced > c2, bad = c->error || c->shutdown;
      pthread_mutex_unlock(&c->mu);
      if (bad) return -1;
      if (!ready) break;
      for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        if (send_msg(c->fds[p * ns + w->sock], op, 2, (uint32_t)c2, op->p2_src + c2 * op->chunk,
                     clen(op, op->len[me], c2)))
          return -1;
      }
      c2 += (size_t)ns;
    }
  }
  return 0;
}

static size_t count_mine(size_t total, int s, int ns) {
  return total > (size_t)s ? (total - (size_t)s + (size_t)ns - 1) / (size_t)ns : 0;
}

static int sharded_recv(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int p = w->peer, me = c->rank, ns = c->nsocks, fd = c->fds[p * ns + w->sock];
  size_t nme = nch(op, op->len[me]), npeer = nch(op, op->len[p]);
  size_t expect = (op->has_p1 ? count_mine(nme, w->sock, ns) : 0) + (op->has_p2 ? count_mine(npeer, w->sock, ns) : 0);
  char* slot = op->stage ? op->stage + (size_t)(p < me ? p : p - 1) * op->len[me] : NULL;
  for (size_t i = 0; i < expect; i++) {
    ct_msg_t h;
    if (recv_hdr(fd, op, &h)) return -1;
    int p1 = h.step == 1;
    size_t len = p1 ? op->len[me] : op->len[p];
    if ((p1 ? !op->has_p1 : (h.step != 2 || !op->has_p2)) || h.chunk >= nch(op, len) ||
        h.len != clen(op, len, h.chunk) || (int)(h.chunk % (uint32_t)ns) != w->sock) {
      errno = EPROTO;
      return -1;
    }
    char* dst = p1 ? slot + (size_t)h.chunk * op->chunk : op->p2_dst + op->off[p] + (size_t)h.chunk * op->chunk;
    if (ct_recv_all(fd, dst, h.len)) return -1;
    if (p1) {
      pthread_mutex_lock(&c->mu);
      if (++op->arrived[h.chunk] == c->nranks - 1) pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->mu);
    }
  }
  return 0;
}

static int sharded_reduce(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int me = c->rank, n = c->nranks;
  size_t len = op->len[me], chunks = nch(op, len);
  for (size_t k = 0; k < chunks; k++) {
    pthread_mutex_lock(&c->mu);
    WAIT_UNTIL(c, op->arrived[k] == n - 1);
    int bad = c->error || c->shutdown;
    pthread_mutex_unlock(&c->mu);
    if (bad) return -1;
    size_t b = k * op->chunk, l = clen(op, len, k), cnt = l / op->esz;
    const char* src[64];
    const char** srcs = n <= 64 ? src : malloc(sizeof(char*) * (size_t)n);
    for (int r = 0; r < n; r++)
      srcs[r] = r == me ? op->p1_src + op->off[me] + b : op->stage + (size_t)(r < me ? r : r - 1) * len + b;
    /* fixed rank order, so results do not depend on arrival order */
    ct_reduce(w->tmp, srcs[0], srcs[1], cnt, op->dt, op->rop);
    for (int r = 2; r < n; r++) ct_reduce(w->tmp, w->tmp, srcs[r], cnt, op->dt, op->rop);
    memcpy(op->p1_out + b, w->tmp, l);
    if (srcs != src) free(srcs);
    pthread_mutex_lock(&c->mu);
    op->reduced = (int)k + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  return 0;
}

/* ---------------- ring ----------------
 * Reduce-scatter step t (t < n-1): send segment me-t-1, receive me-t-2 and add our
 * own copy; the last step leaves segment `me` fully reduced. Allgather step j:
 * send segment me-j, receive me-j-1. */
static int ring_is_rs(const ct_op_t* op, int t) { return op->has_p1 && t < op->nsteps - (op->has_p2 ? op->nsteps / 2 : 0); }
static int ring_j(const ct_op_t* op, int t, int n) { return op->has_p1 ? t - (n - 1) : t; }
static int ring_send_seg(const ct_op_t* op, int t, int me, int n) {
  return ring_is_rs(op, t) ? mod(me - t - 1, n) : mod(me - ring_j(op, t, n), n);
}
static int ring_recv_seg(const ct_op_t* op, int t, int me, int n) {
  return ring_is_rs(op, t) ? mod(me - t - 2, n) : mod(me - ring_j(op, t, n) - 1, n);
}

static int ring_send(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int me = c->rank, n = c->nranks, ns = c->nsocks;
  int fd = c->fds[mod(me + 1, n) * ns + w->sock];
  for (int t = 0; t < op->nsteps; t++) {
    int seg = ring_send_seg(op, t, me, n);
    size_t chunks = nch(op, op->len[seg]);
    for (size_t k = (size_t)w->sock; k < chunks; k += (size_t)ns) {
      if (t > 0) {
        pthread_mutex_lock(&c->mu);
        WAIT_UNTIL(c, op->recvd[(size_t)(t - 1) * (size_t)op->maxch + k]);
        int bad = c->error || c->shutdown;
        pthread_mutex_unlock(&c->mu);
        if (bad) return -1;
      }
      const char* base;
      if (ring_is_rs(op, t)) base = t == 0 ? op->p1_src + op->off[seg] : op->acc + op->off[seg];
      else base = op->p2_dst + op->off[seg];
      if (send_msg(fd, op, (uint32_t)t, (uint32_t)k, base + k * op->chunk, clen(op, op->len[seg], k))) return -1;
    }
  }
  return 0;
}

static int ring_recv(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int me = c->rank, n = c->nranks, ns = c->nsocks;
  int fd = c->fds[mod(me - 1, n) * ns + w->sock];
  for (int t = 0; t < op->nsteps; t++) {
    int seg = ring_recv_seg(op, t, me, n), rs = ring_is_rs(op, t);
    size_t chunks = nch(op, op->len[seg]);
    for (size_t k = (size_t)w->sock; k < chunks; k += (size_t)ns) {
      ct_msg_t h;
      size_t l = clen(op, op->len[seg], k), b = k * op->chunk;
      if (recv_hdr(fd, op, &h)) return -1;
      if (h.step != (uint32_t)t || h.chunk != k || h.len != l) { errno = EPROTO; return -1; }
      if (rs) {
        if (ct_recv_all(fd, w->tmp, l)) return -1;
        int last = seg == me;
        char* dst = last ? op->p1_out + b : op->acc + op->off[seg] + b;
        ct_reduce(dst, w->tmp, op->p1_src + op->off[seg] + b, l / op->esz, op->dt, op->rop);
      } else if (ct_recv_all(fd, op->p2_dst + op->off[seg] + b, l)) {
        return -1;
      }
      pthread_mutex_lock(&c->mu);
      op->recvd[(size_t)t * (size_t)op->maxch + k] = 1;
      pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->mu);
    }
  }
  return 0;
}

/* ---------------- thread main ---------------- */
static int run_part(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int n = c->nranks;
  int server_role = w->role == CT_ROLE_SSEND || w->role == CT_ROLE_SRECV;
  if (op->algo == CT_ALGO_SERVERS || server_role) {
    if (op->algo != CT_ALGO_SERVERS || !server_role) return 0;
    return w->role == CT_ROLE_SSEND ? ct_servers_send(w, op) : ct_servers_recv(w, op);
  }
  if (op->algo == CT_ALGO_RING) {
    if (w->role == 0 && w->peer == mod(c->rank + 1, n)) return ring_send(w, op);
    if (w->role == 1 && w->peer == mod(c->rank - 1, n)) return ring_recv(w, op);
    return 0;
  }
  if (w->role == 0 && c->lockstep) return w->peer == mod(c->rank + 1, n) ? sharded_send_lockstep(w, op) : 0;
  if (w->role == 0) return sharded_send(w, op);
  if (w->role == 1) return sharded_recv(w, op);
  return op->has_p1 ? sharded_reduce(w, op) : 0;
}

void* ct_worker_main(void* arg) {
  ct_worker_t* w = arg;
  ct_coll_t* c = w->c;
  for (uint64_t seq = 0;; seq++) {
    ct_op_t* op = NULL;
    pthread_mutex_lock(&c->mu);
    for (;;) {
      for (op = c->head; op && op->seq != seq; op = op->next) {}
      if (op || c->shutdown || c->error) break;
      pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    if (!op) return NULL;
    int rc = run_part(w, op);
    if (rc) fail(w, op, w->role == CT_ROLE_SEND ? "send" : w->role == CT_ROLE_RECV ? "receive" : "reduce");
    pthread_mutex_lock(&c->mu);
    if (--op->threads_left == 0) op->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc) return NULL;
  }
}

void ct_op_free(ct_op_t* op) {
  if (!op) return;
  free(op->off);
  free(op->len);
  free(op->arrived);
  free(op->recvd);
  for (int i = 0; i < 3; i++) free(op->owned[i]);
  free(op->scatter.addr);
  free(op->scatter.size);
  free(op);
}

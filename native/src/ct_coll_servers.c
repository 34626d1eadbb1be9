/* The `servers` algorithm, worker side: the buffer is cut into K shards, one per
 * reduction server (clustertool-reducer); shard k goes to server k in chunks and comes
 * back reduced (protocol in ct_reducer_proto.h), straight into the output.
 *
 * Requests are pipelined: the progress thread streams the DATA chunks of every posted
 * collective in order (collective, then chunk c of every shard starting at server
 * (rank + c) mod K, going round), so each server sees every rank's chunks in the same
 * order (the g-th DATA of every rank forms reduction g) and, with depth 1
 * (CLUSTERTOOL_COLLNET_DEPTH), the ranks send to different servers at any moment (K >= n)
 * or spread evenly over them (K < n). A small send buffer (CLUSTERTOOL_SNDBUF) keeps the
 * order on the wire the order of the calls. RESULT messages are routed by (seq, chunk).
 *
 * A server that dies closes its sockets: every rank sees it at once. A server that hangs
 * stops its heartbeats: every rank gives up after io_timeout_ms without a byte from it.
 * Either way the communicator fails (the WARN names the server), never a hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_reducer_proto.h"


/* Non-blocking connect bounded by tmo_ms; refused connections are retried (a server
 * restarting), anything else fails at once. Returns a blocking socket or -1 (errno). */
static int connect_timeout(const struct sockaddr_in* a, int tmo_ms) {
  long deadline = ct_now_ms() + tmo_ms;
  for (;;) {
    int fd = ct_connect_start(a);
    if (fd < 0) return -1;
    int r;
    while ((r = ct_connect_check(fd)) == 0 && ct_now_ms() < deadline) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 20);
    }
    if (r == 1 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) return fd;
    int err = r == 0 ? ETIMEDOUT : errno;
    close(fd);
    if (err != ECONNREFUSED || ct_now_ms() >= deadline) { errno = err; return -1; }
    usleep(50000);
  }
}

int ct_servers_connect(ct_coll_t* c, const struct sockaddr_in* addrs, int k, int* bad) {
  int tmo = (int)ct_env_long("CLUSTERTOOL_REDUCER_CONNECT_MS", 5000, 100, 600000);
  for (int s = 0; s < k; s++) {
    errno = 0;
    int fd = connect_timeout(&addrs[s], tmo);
    ct_rhello_t h = {CT_RHELLO_MAGIC, CT_RPROTO_VERSION, c->session, (uint32_t)c->rank, (uint32_t)c->nranks,
                     (uint32_t)c->chunk_cfg, (uint32_t)c->io_timeout_ms, (uint32_t)s, (uint32_t)k};
    if (fd < 0 || ct_send_all(fd, &h, sizeof h)) {
      int err = errno ? errno : ECONNRESET;
      if (fd >= 0) close(fd);
      *bad = s;
      errno = err;
      return -1;
    }
    c->sfds[s] = fd;
  }
  return 0;
}

/* Full receive bounded by tmo_ms without a byte: 0, or -1 with errno (ETIMEDOUT, ECONNRESET). */
static int recv_tmo(int fd, void* buf, size_t len, int tmo_ms) {
  char* p = buf;
  while (len) {
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, tmo_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) { errno = ETIMEDOUT; return -1; }
    ssize_t k = recv(fd, p, len, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = ECONNRESET;
    if (k <= 0) return -1;
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

int ct_servers_wait_acks(ct_coll_t* c, int* bad) {
  /* every rank reached every server, so each session completes at once; the bound is generous */
  for (int s = 0; s < c->nserv; s++) {
    ct_rack_t a;
    errno = 0;
    if (recv_tmo(c->sfds[s], &a, sizeof a, c->io_timeout_ms) || a.magic != CT_RACK_MAGIC || a.status != CT_RACK_OK ||
        a.nranks != (uint32_t)c->nranks) {
      if (!errno) errno = EPROTO;
      *bad = s;
      return -1;
    }
  }
  /* the send buffer bounds how far ahead of the wire the lock-step order runs */
  long sndbuf = ct_env_long("CLUSTERTOOL_SNDBUF", 128 * 1024, 0, 1L << 30);
  if (sndbuf > 0 && !getenv("CLUSTERTOOL_SOCKBUF")) {
    int b = (int)sndbuf;
    for (int s = 0; s < c->nserv; s++) setsockopt(c->sfds[s], SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
  }
  return 0;
}

void ct_servers_close(ct_coll_t* c) {
  for (int s = 0; s < c->nserv && c->sfds; s++)
    if (c->sfds[s] >= 0) close(c->sfds[s]);
  free(c->sfds);
  free(c->saddr);
  c->sfds = NULL;
  c->saddr = NULL;
  c->nserv = 0;
}

void ct_servers_activate(ct_coll_t* c, ct_op_t* op) {
  for (int k = 0; k < c->nserv; k++) {
    size_t m = ct_nch(op, op->len[k]);
    op->pending += 2 * (long)m;   /* DATA out, RESULT in */
    op->need[k] = (long)m;
  }
}

int ct_servers_generate(ct_coll_t* c) {
  int K = c->nserv, me = c->rank, any = 0;
  ct_gen_t* g = &c->sgen;
  while (K && g->inflight < c->depth) {
    if (g->seq >= c->activated) break;
    ct_op_t* op = ct_op_at(c, g->seq);
    if (!op || op->algo != CT_ALGO_SERVERS || g->c >= op->maxch) {
      g->seq++;
      g->c = 0;
      g->j = 0;
      continue;
    }
    int s = (int)(((size_t)me + g->c + (size_t)g->j) % (size_t)K);
    if (g->c < ct_nch(op, op->len[s])) {
      ct_out_t* o = ct_out_new(c);
      if (!o) { ct_fail(c, "rank %d: out of memory for a message descriptor", me); return 1; }
      size_t l = ct_clen(op, op->len[s], g->c);
      o->h.r = (ct_rmsg_t){CT_RMSG_MAGIC, CT_RMSG_DATA, (uint8_t)op->dt, (uint8_t)op->rop, 0, (uint32_t)op->seq,
                           (uint32_t)g->c, (uint32_t)l, 0};
      o->hlen = sizeof(ct_rmsg_t);
      o->payload = op->p1_src + op->off[s] + g->c * op->chunk;
      o->plen = l;
      o->op = op;
      o->gen = 1;
      g->inflight += l;
      ct_emit(c, &c->ssocks[s], o, 1);
      any = 1;
    }
    if (++g->j == K) { g->j = 0; g->c++; }
  }
  return any;
}

static int server_fail(ct_coll_t* c, ct_sock_t* s, const char* what) {
  ct_fail(c, "rank %d: reduction server %s (server %d of %d): receive: %s", c->rank, c->saddr[s->peer], s->peer + 1,
          c->nserv, what);
  return -1;
}

int ct_servers_header(ct_coll_t* c, ct_sock_t* s) {
  const ct_rmsg_t* h = &s->ih.r;
  if (h->magic != CT_RMSG_MAGIC) return server_fail(c, s, "unexpected message (protocol error)");
  if (h->type == CT_RMSG_HEARTBEAT) return h->len ? server_fail(c, s, "unexpected message (protocol error)") : 0;
  if (h->type == CT_RMSG_ABORT) {
    if (h->len >= CT_RMAX_REASON) return server_fail(c, s, "the server ended the session: (no reason)");
    s->idst = s->tmp;
    s->ilen = h->len;
    return 0;
  }
  ct_op_t* op = h->type == CT_RMSG_RESULT ? ct_op_at(c, ct_seq_extend(c->activated, h->seq)) : NULL;
  size_t k = h->chunk;
  if (!op || op->algo != CT_ALGO_SERVERS || k >= ct_nch(op, op->len[s->peer]) ||
      h->len != ct_clen(op, op->len[s->peer], k))
    return server_fail(c, s, "unexpected message (protocol error)");
  s->iop = op;
  s->idst = op->p2_dst + op->off[s->peer] + k * op->chunk;
  s->ilen = h->len;
  return 0;
}

int ct_servers_payload(ct_coll_t* c, ct_sock_t* s) {
  const ct_rmsg_t* h = &s->ih.r;
  if (h->type == CT_RMSG_ABORT) {
    char why[CT_RMAX_REASON + 64];
    s->tmp[h->len] = 0;
    snprintf(why, sizeof why, "the server ended the session: %s", h->len ? s->tmp : "(no reason)");
    return server_fail(c, s, why);
  }
  s->iop->need[s->peer]--;
  ct_op_step(c, s->iop);
  return 0;
}

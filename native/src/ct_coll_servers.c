/* The `servers` algorithm, worker side: the buffer is cut into K shards, one per
 * reduction server (clustertool-reducer); shard k goes to server k in chunks and
 * comes back reduced (protocol in ct_reducer_proto.h).
 *
 * One sender thread serves all servers in lock-step: chunk c of every shard, starting
 * at server (rank + c) mod K and going round, so that at any moment the ranks send to
 * different servers (K >= n) or spread evenly over them (K < n) and no server's
 * receive link takes every rank's stream at once. A small send buffer
 * (CLUSTERTOOL_SNDBUF) keeps the order on the wire the order of the calls. One
 * receiver thread per server writes the reduced chunks straight into the result.
 *
 * A server that dies closes its sockets: every rank's receiver sees it at once. A
 * server that hangs stops its heartbeats: every rank's receiver gives up after
 * io_timeout_ms without a byte from it. Either way the communicator fails (the WARN
 * names the server) and its sockets are shut down, so no thread stays blocked. */
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

static size_t nch(const ct_op_t* op, size_t len) { return (len + op->chunk - 1) / op->chunk; }
static size_t clen(const ct_op_t* op, size_t len, size_t c) {
  size_t b = c * op->chunk;
  return len - b < op->chunk ? len - b : op->chunk;
}

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

static int send_chunk(int fd, const ct_rmsg_t* h, const void* p, size_t len) {
  struct iovec iov[2] = {{(void*)h, sizeof *h}, {(void*)p, len}};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
  size_t left = sizeof *h + len;
  while (left) {
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    left -= (size_t)r;
    while (r > 0) {
      if ((size_t)r >= m.msg_iov[0].iov_len) { r -= (ssize_t)m.msg_iov[0].iov_len; m.msg_iov++; m.msg_iovlen--; }
      else { m.msg_iov[0].iov_base = (char*)m.msg_iov[0].iov_base + r; m.msg_iov[0].iov_len -= (size_t)r; r = 0; }
    }
  }
  return 0;
}

int ct_servers_send(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int k = c->nserv, me = c->rank;
  size_t nmax = 0;
  for (int s = 0; s < k; s++) nmax = nch(op, op->len[s]) > nmax ? nch(op, op->len[s]) : nmax;
  for (size_t ch = 0; ch < nmax; ch++) {
    for (int j = 0; j < k; j++) {
      int s = (int)(((size_t)me + ch + (size_t)j) % (size_t)k);
      if (ch >= nch(op, op->len[s])) continue;
      size_t l = clen(op, op->len[s], ch);
      ct_rmsg_t h = {CT_RMSG_MAGIC, CT_RMSG_DATA, (uint8_t)op->dt, (uint8_t)op->rop, 0, (uint32_t)op->seq,
                     (uint32_t)ch, (uint32_t)l, 0};
      if (send_chunk(c->sfds[s], &h, op->p1_src + op->off[s] + ch * op->chunk, l)) {
        snprintf(w->why, sizeof w->why, "reduction server %s (server %d of %d): send: %s", c->saddr[s], s + 1, k,
                 errno == EPIPE || errno == ECONNRESET ? "connection closed" : strerror(errno));
        return -1;
      }
    }
  }
  return 0;
}

int ct_servers_recv(ct_worker_t* w, ct_op_t* op) {
  ct_coll_t* c = w->c;
  int s = w->peer, fd = c->sfds[s];
  size_t n = nch(op, op->len[s]);
  const char* what = NULL;
  char abort_why[CT_RMAX_REASON + 40];
  for (size_t i = 0; i < n && !what; i++) {
    ct_rmsg_t h;
    do {
      if (recv_tmo(fd, &h, sizeof h, c->io_timeout_ms)) what = "";
    } while (!what && h.magic == CT_RMSG_MAGIC && h.type == CT_RMSG_HEARTBEAT);
    size_t l = clen(op, op->len[s], i);
    if (what) break;
    if (h.magic == CT_RMSG_MAGIC && h.type == CT_RMSG_ABORT && h.len < CT_RMAX_REASON) {
      char text[CT_RMAX_REASON] = "";
      if (recv_tmo(fd, text, h.len, 1000) == 0) text[h.len] = 0;
      snprintf(abort_why, sizeof abort_why, "the server ended the session: %s", text[0] ? text : "(no reason)");
      what = abort_why;
      break;
    }
    if (h.magic != CT_RMSG_MAGIC || h.type != CT_RMSG_RESULT || h.seq != (uint32_t)op->seq || h.chunk != i ||
        h.len != l) {
      what = "unexpected message (protocol error)";
      break;
    }
    if (recv_tmo(fd, op->p2_dst + op->off[s] + i * op->chunk, l, c->io_timeout_ms)) what = "";
  }
  if (!what) return 0;
  char reason[CT_RMAX_REASON + 40];
  if (*what) snprintf(reason, sizeof reason, "%s", what);
  else if (errno == ETIMEDOUT) snprintf(reason, sizeof reason, "no data for %d ms (io timeout)", c->io_timeout_ms);
  else if (errno == ECONNRESET) snprintf(reason, sizeof reason, "connection closed");
  else snprintf(reason, sizeof reason, "%s", strerror(errno));
  snprintf(w->why, sizeof w->why, "reduction server %s (server %d of %d): receive: %s", c->saddr[s], s + 1,
           c->nserv, reason);
  return -1;
}

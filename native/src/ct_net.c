/* ncclNetPlugin_v12 (the one implementation the older ABI versions adapt, see
 * ct_net_compat.c): point-to-point over TCP sockets on host memory, or, when
 * libnccl-net-ofi.so (AWS EFA) is loadable and exports v12, forwarding to it.
 *
 * connect and accept never block NCCL's proxy thread: they return ncclSuccess
 * with a NULL comm until the connection is ready and NCCL calls again (the
 * contract in NCCL's net headers; NCCL's own socket transport keeps its progress
 * in the handle and the listen comm the same way).
 *
 * Every byte these sockets move (nonces, headers, data) goes through CLUSTERTOOL_LINK_RATE's
 * pacer (ct_pace.h) without ever sleeping: bytes the pacer does not grant yet are left for a
 * later call, as bytes a full socket does not take are, and test() answers not-done. What is
 * forwarded to the OFI plugin (EFA) is not our sockets' and is not paced. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "ct_pace.h"
#include "ct_plugin.h"

static ncclNet_v12_t* g_fwd;   /* set by init when forwarding to the OFI plugin */

typedef struct ct_p2p_comm ct_p2p_comm_t;
typedef struct {
  ct_p2p_comm_t* comm;
  int inuse, is_send, complete;
  char* data;
  size_t size, maxsize, hdr_done, done;
  uint64_t hdr;
} ct_req_t;

struct ct_p2p_comm {
  int fd, is_send, broken;
  ct_req_t pool[NCCL_NET_MAX_REQUESTS];
  ct_req_t* q[NCCL_NET_MAX_REQUESTS];  /* posted, not yet complete, in order */
  int qhead, qcount;
};

#define CT_MAX_PENDING 16
typedef struct { int fd; uint32_t got; uint64_t nonce; } ct_pending_t;
typedef struct {
  int fd;
  ct_handle_t h;
  ct_pending_t pend[CT_MAX_PENDING];   /* accepted, nonce not read in full yet */
  int npend;
} ct_listen_t;

enum { ST_START = 0, ST_CONNECTING = 1, ST_SENDING = 2, ST_DONE = 3 };
#define RETRY_MS 20

/* One non-blocking send or recv of at most len bytes, as many as the pacer grants now; what the
 * socket does not take goes back to the pacer. -1 with errno EAGAIN when either has nothing now. */
static ssize_t paced_io(int fd, int is_send, void* p, size_t len) {
  int dir = is_send ? CT_PACE_TX : CT_PACE_RX;
  size_t n = ct_pace_take(dir, len, NULL);
  if (n == 0) { errno = EAGAIN; return -1; }
  ssize_t k = is_send ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
  size_t used = k > 0 ? (size_t)k : 0;
  if (used < n) {
    int err = errno;
    ct_pace_refund(dir, n - used);
    errno = err;
  }
  return k;
}

static long connect_timeout_ms(void) {
  return ct_env_long("CLUSTERTOOL_CONNECT_TIMEOUT_MS", 120000, 100, 3600000);
}

static ncclResult_t net_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
  static int said;
  if (log) ct_logger = log;
  if (ct_fwd()) {
    ncclResult_t r = ct_fwd_init(ctx, commId, cfg, log, prof);
    if (r == ncclSuccess) {
      g_fwd = ct_fwd();
      if (!said++) {
        CT_INFO("net plugin %s: point-to-point forwarded to %s (%d devices)", CT_VERSION, g_fwd->name, ct_net_ndevs());
        if (ct_pace_rate_bits())
          CT_WARN("CLUSTERTOOL_LINK_RATE paces the CollNet's sockets only: point-to-point goes through %s, "
                  "whose traffic is not ours to pace", g_fwd->name);
      }
      return r;
    }
    CT_WARN("%s init failed (%d); using TCP for point-to-point", ct_fwd() ? ct_fwd()->name : "OFI plugin", (int)r);
  }
  g_fwd = NULL;
  struct sockaddr_in a;
  if (ct_plugin_addr(&a)) return ncclSystemError;
  *ctx = calloc(1, 1);
  if (!said++) {
    CT_INFO("net plugin %s: TCP on %s, device %s", CT_VERSION, ct_plugin_ifname(), CT_TCP_DEV_NAME);
    ct_pace_rate_bits();   /* a rate in force is logged now, not at the first message */
  }
  return *ctx ? ncclSuccess : ncclSystemError;
}

#define FWD(call) \
  do { if (g_fwd) return g_fwd->call; } while (0)

static ncclResult_t net_devices(int* n) { FWD(devices(n)); *n = ct_net_ndevs(); return ncclSuccess; }

static ncclResult_t net_props(int dev, ncclNetProperties_v12_t* p) {
  FWD(getProperties(dev, p));
  return ct_net_dev_props(dev, p);
}

ncclResult_t ct_plugin_listen(int dev, void* handle, int* fd_out, ct_handle_t* h) {
  struct sockaddr_in a;
  if (dev < 0 || dev >= ct_net_ndevs() || ct_plugin_addr(&a)) return ncclInvalidArgument;
  memset(h, 0, sizeof *h);
  int fd = ct_listen_socket(&a, &h->addr);
  if (fd < 0) return ncclSystemError;
  h->magic = CT_HANDLE_MAGIC;
  h->stage.fd = -1;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  h->nonce = ((uint64_t)tv.tv_sec << 32) ^ (uint64_t)tv.tv_usec ^ ((uint64_t)getpid() << 16) ^ (uint64_t)fd;
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  *fd_out = fd;
  return ncclSuccess;
}

static ncclResult_t net_listen(void* ctx, int dev, void* handle, void** lc) {
  FWD(listen(ctx, dev, handle, lc));
  ct_listen_t* l = calloc(1, sizeof *l);
  if (!l) return ncclSystemError;
  ncclResult_t r = ct_plugin_listen(dev, handle, &l->fd, &l->h);
  if (r != ncclSuccess) { free(l); return r; }
  fcntl(l->fd, F_SETFL, fcntl(l->fd, F_GETFL) | O_NONBLOCK);
  memcpy(handle, &l->h, sizeof l->h);
  *lc = l;
  return ncclSuccess;
}

static ct_p2p_comm_t* new_comm(int fd, int is_send) {
  ct_p2p_comm_t* c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->is_send = is_send;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) c->pool[i].comm = c;
  return c;
}

static int retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == EAGAIN || err == ENETUNREACH ||
         err == EHOSTUNREACH;
}

/* One non-blocking step of the connect state machine kept in h->stage. */
static ncclResult_t connect_step(ct_handle_t* h, void** sc) {
  long now = ct_now_ms(), tmo = connect_timeout_ms();
  if (h->stage.state == ST_START) {
    if (now < h->stage.t0_ms + (long)h->stage.tries * RETRY_MS) return ncclSuccess;   /* pace retries */
    int fd = ct_connect_start(&h->addr);
    if (fd < 0) goto failed;
    h->stage.fd = fd;
    h->stage.state = ST_CONNECTING;
  }
  if (h->stage.state == ST_CONNECTING) {
    int c = ct_connect_check(h->stage.fd);
    if (c == 0) {
      if (now - h->stage.t0_ms <= tmo) return ncclSuccess;
      errno = ETIMEDOUT;
    }
    if (c <= 0) {
      close(h->stage.fd);
      h->stage.fd = -1;
      h->stage.state = ST_START;
      goto failed;
    }
    h->stage.state = ST_SENDING;
    h->stage.sent = 0;
  }
  if (h->stage.state == ST_SENDING) {
    ssize_t n = paced_io(h->stage.fd, 1, (char*)&h->nonce + h->stage.sent, sizeof h->nonce - h->stage.sent);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return ncclSuccess;
    if (n <= 0) { close(h->stage.fd); h->stage.fd = -1; h->stage.state = ST_START; goto failed; }
    h->stage.sent += (uint32_t)n;
    if (h->stage.sent < sizeof h->nonce) return ncclSuccess;
    *sc = new_comm(h->stage.fd, 1);
    if (!*sc) return ncclSystemError;
    h->stage.state = ST_DONE;
  }
  return ncclSuccess;
failed:
  h->stage.tries++;
  if (retryable(errno) && ct_now_ms() - h->stage.t0_ms <= tmo) return ncclSuccess;   /* try again later */
  CT_WARN("connect to %s:%d failed after %u tries: %s", inet_ntoa(h->addr.sin_addr), ntohs(h->addr.sin_port),
          h->stage.tries, strerror(errno));
  return ncclSystemError;
}

static ncclResult_t net_connect(void* ctx, int dev, void* handle, void** sc, ncclNetDeviceHandle_v12_t** dc) {
  FWD(connect(ctx, dev, handle, sc, dc));
  *sc = NULL;
  if (dc) *dc = NULL;
  ct_handle_t h;   /* NCCL's handle buffer carries no alignment promise: work on a copy */
  memcpy(&h, handle, sizeof h);
  if (h.magic != CT_HANDLE_MAGIC || dev < 0 || dev >= ct_net_ndevs()) return ncclInvalidArgument;
  if (h.stage.state == ST_DONE) return ncclInvalidUsage;
  if (h.stage.state == ST_START && h.stage.tries == 0) { h.stage.t0_ms = ct_now_ms(); h.stage.fd = -1; }
  ncclResult_t r = connect_step(&h, sc);
  memcpy(handle, &h, sizeof h);
  return r;
}

static void drop_pending(ct_listen_t* l, int i) {
  close(l->pend[i].fd);
  l->pend[i] = l->pend[--l->npend];
}

static ncclResult_t net_accept(void* lc, void** rc, ncclNetDeviceHandle_v12_t** dc) {
  FWD(accept(lc, rc, dc));
  ct_listen_t* l = lc;
  *rc = NULL;
  if (dc) *dc = NULL;
  while (l->npend < CT_MAX_PENDING) {   /* take what the kernel has queued, never wait */
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    ct_tune_socket(fd);
    l->pend[l->npend++] = (ct_pending_t){fd, 0, 0};
  }
  for (int i = 0; i < l->npend; i++) {
    ct_pending_t* p = &l->pend[i];
    ssize_t n = paced_io(p->fd, 0, (char*)&p->nonce + p->got, sizeof p->nonce - p->got);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) { drop_pending(l, i--); continue; }   /* closed or failed: a stray */
    p->got += (uint32_t)n;
    if (p->got < sizeof p->nonce) continue;
    if (p->nonce != l->h.nonce) { drop_pending(l, i--); continue; }
    int fd = p->fd;
    l->pend[i] = l->pend[--l->npend];
    *rc = new_comm(fd, 0);
    return *rc ? ncclSuccess : ncclSystemError;
  }
  return ncclSuccess;
}

static int g_mr_token;
static ncclResult_t net_regmr(void* comm, void* data, size_t size, int type, void** mh) {
  FWD(regMr(comm, data, size, type, mh));
  if (type != NCCL_PTR_HOST) return ncclInvalidArgument;
  *mh = &g_mr_token;
  return ncclSuccess;
}
static ncclResult_t net_regmr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  FWD(regMrDmaBuf(comm, data, size, type, off, fd, mh));
  return net_regmr(comm, data, size, type, mh);
}
static ncclResult_t net_deregmr(void* comm, void* mh) { FWD(deregMr(comm, mh)); return ncclSuccess; }

static ct_req_t* post(ct_p2p_comm_t* c, int is_send, void* data, size_t size) {
  if (c->qcount == NCCL_NET_MAX_REQUESTS) return NULL;
  for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
    ct_req_t* r = &c->pool[i];
    if (r->inuse) continue;
    *r = (ct_req_t){.comm = c, .inuse = 1, .is_send = is_send, .data = data, .size = size, .maxsize = size,
                    .hdr = size};
    c->q[(c->qhead + c->qcount++) % NCCL_NET_MAX_REQUESTS] = r;
    return r;
  }
  return NULL;
}

static ncclResult_t net_isend(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req) {
  FWD(isend(sc, data, size, tag, mh, ph, req));
  (void)tag; (void)mh; (void)ph;
  *req = post(sc, 1, data, size);
  return ncclSuccess;
}

static ncclResult_t net_irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mh, void** ph, void** req) {
  FWD(irecv(rc, n, data, sizes, tags, mh, ph, req));
  if (n != 1) return ncclInternalError;   /* maxRecvs is 1 */
  *req = post(rc, 0, data[0], sizes[0]);
  return ncclSuccess;
}

static ncclResult_t net_iflush(void* rc, int n, void** data, int* sizes, void** mh, void** req) {
  FWD(iflush(rc, n, data, sizes, mh, req));
  *req = NULL;  /* host memory: nothing to flush */
  return ncclSuccess;
}

/* One non-blocking step on the head request; 1 progressed to completion, 0 would block, -1 error. */
static int step(ct_p2p_comm_t* c, ct_req_t* r) {
  while (r->hdr_done < sizeof r->hdr) {
    char* h = (char*)&r->hdr + r->hdr_done;
    size_t left = sizeof r->hdr - r->hdr_done;
    ssize_t n = paced_io(c->fd, r->is_send, h, left);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1;
    r->hdr_done += (size_t)n;
    if (r->hdr_done == sizeof r->hdr && !r->is_send) {
      if (r->hdr > r->maxsize) { CT_WARN("message of %llu bytes for a %zu byte receive", (unsigned long long)r->hdr, r->maxsize); return -1; }
      r->size = r->hdr;
    }
  }
  while (r->done < r->size) {
    ssize_t n = paced_io(c->fd, r->is_send, r->data + r->done, r->size - r->done);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1;
    r->done += (size_t)n;
  }
  return 1;
}

static ncclResult_t net_test(void* req, int* done, int* sizes) {
  FWD(test(req, done, sizes));
  ct_req_t* r = req;
  ct_p2p_comm_t* c = r->comm;
  *done = 0;
  while (!r->complete && c->qcount && !c->broken) {
    int s = step(c, c->q[c->qhead]);
    if (s < 0) { c->broken = 1; break; }
    if (s == 0) break;
    c->q[c->qhead]->complete = 1;
    c->qhead = (c->qhead + 1) % NCCL_NET_MAX_REQUESTS;
    c->qcount--;
  }
  if (r->complete) {
    *done = 1;
    if (sizes) *sizes = (int)r->size;
    r->inuse = 0;
    return ncclSuccess;
  }
  return c->broken ? ncclSystemError : ncclSuccess;
}

static ncclResult_t close_comm(void* comm) {
  ct_p2p_comm_t* c = comm;
  if (c) { close(c->fd); free(c); }
  return ncclSuccess;
}
static ncclResult_t net_close_send(void* c) { FWD(closeSend(c)); return close_comm(c); }
static ncclResult_t net_close_recv(void* c) { FWD(closeRecv(c)); return close_comm(c); }
static ncclResult_t net_close_listen(void* lc) {
  FWD(closeListen(lc));
  ct_listen_t* l = lc;
  if (!l) return ncclSuccess;
  while (l->npend) drop_pending(l, 0);
  close(l->fd);
  free(l);
  return ncclSuccess;
}
static ncclResult_t net_finalize(void* ctx) { FWD(finalize(ctx)); free(ctx); return ncclSuccess; }
static ncclResult_t net_set_attr(void* ctx, ncclNetAttr_v12_t* a) {
  if (g_fwd) return g_fwd->setNetAttr ? g_fwd->setNetAttr(ctx, a) : ncclSuccess;
  return ncclSuccess;  /* TCP has no per-flow knobs to apply */
}

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = CT_PLUGIN_NAME,
    .init = net_init,
    .devices = net_devices,
    .getProperties = net_props,
    .listen = net_listen,
    .connect = net_connect,
    .accept = net_accept,
    .regMr = net_regmr,
    .regMrDmaBuf = net_regmr_dmabuf,
    .deregMr = net_deregmr,
    .isend = net_isend,
    .irecv = net_irecv,
    .iflush = net_iflush,
    .test = net_test,
    .closeSend = net_close_send,
    .closeRecv = net_close_recv,
    .closeListen = net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = net_finalize,
    .setNetAttr = net_set_attr,
};

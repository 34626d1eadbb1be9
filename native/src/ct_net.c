/* ncclNetPlugin_v12: point-to-point over TCP sockets on host memory, or, when
 * libnccl-net-ofi.so (AWS EFA) is loadable and exports v12, forwarding to it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "ct_common.h"
#include "ct_plugin.h"

static ncclNet_v12_t* g_fwd;   /* set when forwarding to the OFI plugin */
static void* g_fwd_lib;

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

typedef struct { int fd; ct_handle_t h; } ct_listen_t;

/* ---------------- properties shared with CollNet ---------------- */
static char g_ifname[64];
static struct sockaddr_in g_addr;
static int g_addr_ok = -1;

int ct_plugin_addr(struct sockaddr_in* out) {
  if (g_addr_ok < 0) g_addr_ok = ct_local_addr(&g_addr, g_ifname, sizeof g_ifname) == 0;
  if (!g_addr_ok) return -1;
  *out = g_addr;
  return 0;
}

ncclResult_t ct_plugin_props(int dev, ncclNetProperties_v12_t* p, const char* name) {
  static char pci[PATH_MAX];
  struct sockaddr_in a;
  if (dev != 0 || ct_plugin_addr(&a)) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  char path[128];
  snprintf(path, sizeof path, "/sys/class/net/%s/device", g_ifname);
  p->name = (char*)name;
  p->pciPath = realpath(path, pci) ? pci : NULL;
  p->guid = 0x6374000000000000ull;
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 10000;
  snprintf(path, sizeof path, "/sys/class/net/%s/speed", g_ifname);
  FILE* f = fopen(path, "r");
  if (f) {
    int s = 0;
    if (fscanf(f, "%d", &s) == 1 && s > 0) p->speed = s;
    fclose(f);
  }
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = 0;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = 0;
  p->maxP2pBytes = (size_t)NCCL_MAX_NET_SIZE_BYTES;
  p->maxCollBytes = (size_t)NCCL_MAX_NET_SIZE_BYTES;
  p->maxMultiRequestSize = 1;
  p->railId = -1;
  p->planeId = -1;
  return ncclSuccess;
}

/* ---------------- forwarding ---------------- */
static void try_forward(void) {
  if (ct_env_long("CLUSTERTOOL_NET_FORWARD", 1, 0, 1) == 0) return;
  const char* lib = ct_env_str("CLUSTERTOOL_OFI_LIB", "libnccl-net-ofi.so");
  g_fwd_lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!g_fwd_lib) return;  /* absent: plain TCP */
  g_fwd = dlsym(g_fwd_lib, "ncclNetPlugin_v12");
  if (!g_fwd) {
    CT_INFO("%s has no ncclNetPlugin_v12; using TCP for point-to-point", lib);
    dlclose(g_fwd_lib);
    g_fwd_lib = NULL;
  }
}

const char* ct_net_forward_name(void) { return g_fwd ? g_fwd->name : NULL; }

static ncclResult_t net_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
  if (log) ct_logger = log;
  if (!g_fwd && !g_fwd_lib) try_forward();
  if (g_fwd) {
    ncclResult_t r = g_fwd->init(ctx, commId, cfg, log, prof);
    if (r == ncclSuccess) {
      CT_INFO("point-to-point forwarded to %s", g_fwd->name);
      return r;
    }
    CT_WARN("%s init failed (%d); using TCP", g_fwd->name, (int)r);
    g_fwd = NULL;
  }
  struct sockaddr_in a;
  if (ct_plugin_addr(&a)) return ncclSystemError;
  *ctx = calloc(1, 1);
  return *ctx ? ncclSuccess : ncclSystemError;
}

#define FWD(call) \
  do { if (g_fwd) return g_fwd->call; } while (0)

static ncclResult_t net_devices(int* n) { FWD(devices(n)); *n = 1; return ncclSuccess; }

static ncclResult_t net_props(int dev, ncclNetProperties_v12_t* p) {
  FWD(getProperties(dev, p));
  return ct_plugin_props(dev, p, "clustertool-tcp");
}

ncclResult_t ct_plugin_listen(int dev, void* handle, int* fd_out, ct_handle_t* h) {
  struct sockaddr_in a;
  if (dev != 0 || ct_plugin_addr(&a)) return ncclInvalidArgument;
  memset(h, 0, sizeof *h);
  int fd = ct_listen_socket(&a, &h->addr);
  if (fd < 0) return ncclSystemError;
  h->magic = CT_HANDLE_MAGIC;
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

static ncclResult_t net_connect(void* ctx, int dev, void* handle, void** sc, ncclNetDeviceHandle_v12_t** dc) {
  FWD(connect(ctx, dev, handle, sc, dc));
  ct_handle_t h;
  memcpy(&h, handle, sizeof h);
  if (h.magic != CT_HANDLE_MAGIC) return ncclInvalidArgument;
  int fd = ct_connect_socket(&h.addr, (int)ct_env_long("CLUSTERTOOL_CONNECT_TIMEOUT_MS", 120000, 100, 3600000));
  if (fd < 0 || ct_send_all(fd, &h.nonce, sizeof h.nonce)) { if (fd >= 0) close(fd); return ncclSystemError; }
  *sc = new_comm(fd, 1);
  if (dc) *dc = NULL;
  return *sc ? ncclSuccess : ncclSystemError;
}

static ncclResult_t net_accept(void* lc, void** rc, ncclNetDeviceHandle_v12_t** dc) {
  FWD(accept(lc, rc, dc));
  ct_listen_t* l = lc;
  *rc = NULL;
  if (dc) *dc = NULL;
  int fd = ct_accept_timeout(l->fd, 0);   /* must not block: NCCL calls again */
  if (fd < 0) return ncclSuccess;
  uint64_t nonce = 0;
  if (ct_recv_all(fd, &nonce, sizeof nonce) || nonce != l->h.nonce) { close(fd); return ncclSuccess; }
  *rc = new_comm(fd, 0);
  return *rc ? ncclSuccess : ncclSystemError;
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
    ssize_t n = r->is_send ? send(c->fd, h, left, MSG_NOSIGNAL) : recv(c->fd, h, left, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1;
    r->hdr_done += (size_t)n;
    if (r->hdr_done == sizeof r->hdr && !r->is_send) {
      if (r->hdr > r->maxsize) { CT_WARN("message of %llu bytes for a %zu byte receive", (unsigned long long)r->hdr, r->maxsize); return -1; }
      r->size = r->hdr;
    }
  }
  while (r->done < r->size) {
    ssize_t n = r->is_send ? send(c->fd, r->data + r->done, r->size - r->done, MSG_NOSIGNAL)
                           : recv(c->fd, r->data + r->done, r->size - r->done, 0);
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
  if (l) { close(l->fd); free(l); }
  return ncclSuccess;
}
static ncclResult_t net_finalize(void* ctx) { FWD(finalize(ctx)); free(ctx); return ncclSuccess; }
static ncclResult_t net_set_attr(void* ctx, ncclNetAttr_v12_t* a) {
  if (g_fwd) return g_fwd->setNetAttr ? g_fwd->setNetAttr(ctx, a) : ncclSuccess;
  return ncclSuccess;  /* TCP has no per-flow knobs to apply */
}

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = "clustertool",
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

/* The OFI plugin point-to-point calls are forwarded to, seen as a v12 table.
 *
 * aws-ofi-nccl releases export the net versions the NCCL of their day knew (v9 and v10
 * for NCCL 2.24-2.27, v11 later), not necessarily v12, so the newest of v12 .. v9 it
 * exports is taken and adapted: v11 differs only in its properties; v10 has no
 * per-communicator context (init once, listen/connect without ctx, a comm config on
 * connect); v9 also lacks the profiler callback and the isend/irecv phandles.
 * Nothing here opens a socket: what the OFI plugin moves (EFA) is not paced by
 * CLUSTERTOOL_LINK_RATE (ct_net.c says so at init when a rate is set). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "ct_compat.h"
#include "ct_plugin.h"

static ncclNet_v12_t g_tbl;
static ncclNet_v11_t* g_v11;
static ncclNet_v10_t* g_v10;
static ncclNet_v9_t* g_v9;
static int g_ver, g_refs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_token;

static void props_from_v9(const ncclNetProperties_v9_t* i, ncclNetProperties_v12_t* o) {
  memset(o, 0, sizeof *o);
  o->name = i->name;
  o->pciPath = i->pciPath;
  o->guid = i->guid;
  o->ptrSupport = i->ptrSupport;
  o->regIsGlobal = i->regIsGlobal;
  o->forceFlush = i->forceFlush;
  o->speed = i->speed;
  o->port = i->port;
  o->latency = i->latency;
  o->maxComms = i->maxComms;
  o->maxRecvs = i->maxRecvs;
  o->netDeviceType = i->netDeviceType;
  o->netDeviceVersion = i->netDeviceVersion;
  o->vProps.ndevs = i->vProps.ndevs;
  for (int k = 0; k < i->vProps.ndevs && k < NCCL_NET_MAX_DEVS_PER_NIC_V9; k++) o->vProps.devs[k] = i->vProps.devs[k];
  o->maxP2pBytes = i->maxP2pBytes;
  o->maxCollBytes = i->maxCollBytes;
  o->maxMultiRequestSize = 1;
  o->railId = -1;
  o->planeId = -1;
}

static ncclResult_t props_v11(int dev, ncclNetProperties_v12_t* p) {
  ncclNetProperties_v11_t q;
  ncclResult_t r = g_v11->getProperties(dev, &q);
  if (r != ncclSuccess) return r;
  ncclNetProperties_v9_t b;
  memcpy(&b, &q, sizeof b);   /* v11 = v9 + maxMultiRequestSize */
  props_from_v9(&b, p);
  p->maxMultiRequestSize = q.maxMultiRequestSize;
  return ncclSuccess;
}
static ncclResult_t props_v10(int dev, ncclNetProperties_v12_t* p) {
  ncclNetProperties_v10_t q;
  ncclResult_t r = g_v10 ? g_v10->getProperties(dev, &q) : g_v9->getProperties(dev, &q);
  if (r == ncclSuccess) props_from_v9(&q, p);
  return r;
}

/* v10/v9: initialized once for the process; every v12 init gets the same token back */
static ncclResult_t init_old(void** ctx, uint64_t id, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
  (void)id; (void)cfg;
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&g_mu);
  if (g_refs == 0) r = g_v10 ? g_v10->init(log, prof) : g_v9->init(log);
  if (r == ncclSuccess) g_refs++;
  pthread_mutex_unlock(&g_mu);
  *ctx = &g_token;
  return r;
}
static ncclResult_t finalize_old(void* ctx) {
  (void)ctx;
  pthread_mutex_lock(&g_mu);
  if (g_refs > 0) g_refs--;
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}
static ncclResult_t listen_old(void* ctx, int dev, void* h, void** lc) {
  (void)ctx;
  return g_v10 ? g_v10->listen(dev, h, lc) : g_v9->listen(dev, h, lc);
}
static ncclResult_t connect_old(void* ctx, int dev, void* h, void** sc, ncclNetDeviceHandle_v12_t** dc) {
  (void)ctx;
  if (g_v10) {
    ncclNetCommConfig_v10_t cfg = {-1};
    return g_v10->connect(dev, &cfg, h, sc, dc);
  }
  return g_v9->connect(dev, h, sc, dc);
}
static ncclResult_t isend_v9(void* sc, void* d, size_t size, int tag, void* mh, void* ph, void** req) {
  (void)ph;
  return g_v9->isend(sc, d, size, tag, mh, req);
}
static ncclResult_t irecv_v9(void* rc, int n, void** d, size_t* sizes, int* tags, void** mh, void** ph, void** req) {
  (void)ph;
  return g_v9->irecv(rc, n, d, sizes, tags, mh, req);
}

/* Copies the entries whose signature is the same in v9 .. v12. */
#define SAME(SRC)                                                                                     \
  do {                                                                                                \
    g_tbl.name = (SRC)->name; g_tbl.devices = (SRC)->devices; g_tbl.accept = (SRC)->accept;          \
    g_tbl.regMr = (SRC)->regMr; g_tbl.regMrDmaBuf = (SRC)->regMrDmaBuf; g_tbl.deregMr = (SRC)->deregMr; \
    g_tbl.iflush = (SRC)->iflush; g_tbl.test = (SRC)->test; g_tbl.closeSend = (SRC)->closeSend;      \
    g_tbl.closeRecv = (SRC)->closeRecv; g_tbl.closeListen = (SRC)->closeListen;                      \
    g_tbl.getDeviceMr = (SRC)->getDeviceMr; g_tbl.irecvConsumed = (SRC)->irecvConsumed;              \
  } while (0)

ncclNet_v12_t* ct_fwd_table(void* lib, int* version) {
  ncclNet_v12_t* v12 = dlsym(lib, "ncclNetPlugin_v12");
  memset(&g_tbl, 0, sizeof g_tbl);
  g_v11 = NULL, g_v10 = NULL, g_v9 = NULL;
  if (v12) { *version = g_ver = 12; return v12; }
  if ((g_v11 = dlsym(lib, "ncclNetPlugin_v11"))) {
    g_tbl = (ncclNet_v12_t){.init = g_v11->init, .listen = g_v11->listen, .connect = g_v11->connect,
                            .isend = g_v11->isend, .irecv = g_v11->irecv, .finalize = g_v11->finalize,
                            .setNetAttr = g_v11->setNetAttr};
    SAME(g_v11);
    g_tbl.getProperties = props_v11;
    *version = g_ver = 11;
    return &g_tbl;
  }
  if ((g_v10 = dlsym(lib, "ncclNetPlugin_v10"))) {
    SAME(g_v10);
    g_tbl.isend = g_v10->isend;
    g_tbl.irecv = g_v10->irecv;
    *version = g_ver = 10;
  } else if ((g_v9 = dlsym(lib, "ncclNetPlugin_v9"))) {
    SAME(g_v9);
    g_tbl.isend = isend_v9;
    g_tbl.irecv = irecv_v9;
    *version = g_ver = 9;
  } else {
    return NULL;
  }
  g_tbl.init = init_old;
  g_tbl.getProperties = props_v10;
  g_tbl.listen = listen_old;
  g_tbl.connect = connect_old;
  g_tbl.finalize = finalize_old;
  return &g_tbl;
}

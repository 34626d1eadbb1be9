/* ncclNetPlugin_v5 .. v11: thin adapters over the one implementation,
 * ncclNetPlugin_v12 (ct_net.c). NCCL tries the newest version it knows first
 * (2.19: v7; 2.20-2.23: v8; 2.24-2.25: v9; 2.26-2.27: v10; 2.28-2.29: v11;
 * 2.30: v12), so every release finds one here. What changes between versions:
 *   v5 -> v6  regMrDmaBuf added
 *   v6 -> v7  device handles on connect/accept, netDeviceType/Version in properties
 *   v7 -> v8  regMr takes size_t, regIsGlobal in properties
 *   v8 -> v9  isend/irecv sizes are size_t, virtual devices, maxP2p/CollBytes
 *   v9 -> v10 init gets a profiler callback, connect a comm config, isend/irecv phandles
 *   v10 -> v11 per-communicator context (init/listen/connect/finalize), setNetAttr
 *   v11 -> v12 8-entry vProps, railId/planeId in properties */
#include <pthread.h>
#include <string.h>
#include "ct_compat.h"
#include "ct_plugin.h"

#define I ncclNetPlugin_v12
#define EXPORT __attribute__((visibility("default")))

/* ---------------- properties ---------------- */
void ct_props_v6(const ncclNetProperties_v12_t* p, ncclNetProperties_v6_t* o) {
  memset(o, 0, sizeof *o);
  o->name = p->name;
  o->pciPath = p->pciPath;
  o->guid = p->guid;
  o->ptrSupport = p->ptrSupport;
  o->speed = p->speed;
  o->port = p->port;
  o->latency = p->latency;
  o->maxComms = p->maxComms;
  o->maxRecvs = p->maxRecvs;
}

void ct_props_v7(const ncclNetProperties_v12_t* p, ncclNetProperties_v7_t* o) {
  ncclNetProperties_v6_t b;
  ct_props_v6(p, &b);
  memset(o, 0, sizeof *o);
  memcpy(o, &b, sizeof b);   /* v7 = v6 + two trailing fields */
  o->netDeviceType = p->netDeviceType;
  o->netDeviceVersion = p->netDeviceVersion;
}

void ct_props_v8(const ncclNetProperties_v12_t* p, ncclNetProperties_v8_t* o) {
  memset(o, 0, sizeof *o);
  o->name = p->name;
  o->pciPath = p->pciPath;
  o->guid = p->guid;
  o->ptrSupport = p->ptrSupport;
  o->regIsGlobal = p->regIsGlobal;
  o->speed = p->speed;
  o->port = p->port;
  o->latency = p->latency;
  o->maxComms = p->maxComms;
  o->maxRecvs = p->maxRecvs;
  o->netDeviceType = p->netDeviceType;
  o->netDeviceVersion = p->netDeviceVersion;
}

void ct_props_v9(const ncclNetProperties_v12_t* p, ncclNetProperties_v9_t* o) {
  memset(o, 0, sizeof *o);
  o->name = p->name;
  o->pciPath = p->pciPath;
  o->guid = p->guid;
  o->ptrSupport = p->ptrSupport;
  o->regIsGlobal = p->regIsGlobal;
  o->forceFlush = p->forceFlush;
  o->speed = p->speed;
  o->port = p->port;
  o->latency = p->latency;
  o->maxComms = p->maxComms;
  o->maxRecvs = p->maxRecvs;
  o->netDeviceType = p->netDeviceType;
  o->netDeviceVersion = p->netDeviceVersion;
  o->vProps.ndevs = p->vProps.ndevs < NCCL_NET_MAX_DEVS_PER_NIC_V9 ? p->vProps.ndevs : NCCL_NET_MAX_DEVS_PER_NIC_V9;
  for (int i = 0; i < o->vProps.ndevs; i++) o->vProps.devs[i] = p->vProps.devs[i];
  o->maxP2pBytes = p->maxP2pBytes;
  o->maxCollBytes = p->maxCollBytes;
}

void ct_props_v11(const ncclNetProperties_v12_t* p, ncclNetProperties_v11_t* o) {
  ncclNetProperties_v9_t b;
  ct_props_v9(p, &b);
  memset(o, 0, sizeof *o);
  memcpy(o, &b, sizeof b);   /* v11 = v9 + maxMultiRequestSize */
  o->maxMultiRequestSize = p->maxMultiRequestSize;
}

CT_DEFINE_PROPS_ADAPTER(props_v6, I, v6)
CT_DEFINE_PROPS_ADAPTER(props_v7, I, v7)
CT_DEFINE_PROPS_ADAPTER(props_v8, I, v8)
CT_DEFINE_PROPS_ADAPTER(props_v9, I, v9)
CT_DEFINE_PROPS_ADAPTER(props_v11, I, v11)

/* ---------------- one context for the versions without one ---------------- */
static void* g_ctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t init_v10(ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&g_mu);
  if (!g_ctx) r = I.init(&g_ctx, 0, NULL, log, prof);
  else if (log) ct_logger = log;
  pthread_mutex_unlock(&g_mu);
  return r;
}
static ncclResult_t init_v5(ncclDebugLogger_t log) { return init_v10(log, NULL); }
static ncclResult_t listen_v5(int dev, void* h, void** lc) { return I.listen(g_ctx, dev, h, lc); }
static ncclResult_t connect_v5(int dev, void* h, void** sc) { return I.connect(g_ctx, dev, h, sc, NULL); }
static ncclResult_t connect_v7(int dev, void* h, void** sc, ncclNetDeviceHandle_old_t** dc) {
  return I.connect(g_ctx, dev, h, sc, dc);
}
static ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t* cfg, void* h, void** sc,
                                ncclNetDeviceHandle_old_t** dc) {
  (void)cfg;   /* traffic class: nothing to apply on TCP; the OFI plugin got it at init */
  return I.connect(g_ctx, dev, h, sc, dc);
}
static ncclResult_t accept_v5(void* lc, void** rc) { return I.accept(lc, rc, NULL); }
static ncclResult_t accept_v7(void* lc, void** rc, ncclNetDeviceHandle_old_t** dc) { return I.accept(lc, rc, dc); }

/* ---------------- calls whose argument types changed ---------------- */
static ncclResult_t regmr_int(void* c, void* d, int size, int type, void** mh) {
  if (size < 0) return ncclInvalidArgument;
  return I.regMr(c, d, (size_t)size, type, mh);
}
static ncclResult_t regmr(void* c, void* d, size_t size, int type, void** mh) { return I.regMr(c, d, size, type, mh); }
static ncclResult_t regmr_dmabuf(void* c, void* d, size_t size, int type, uint64_t off, int fd, void** mh) {
  return I.regMrDmaBuf(c, d, size, type, off, fd, mh);
}
static ncclResult_t deregmr(void* c, void* mh) { return I.deregMr(c, mh); }
static ncclResult_t isend_int(void* sc, void* d, int size, int tag, void* mh, void** req) {
  if (size < 0) return ncclInvalidArgument;
  return I.isend(sc, d, (size_t)size, tag, mh, NULL, req);
}
static ncclResult_t isend_v9(void* sc, void* d, size_t size, int tag, void* mh, void** req) {
  return I.isend(sc, d, size, tag, mh, NULL, req);
}
static ncclResult_t isend_v10(void* sc, void* d, size_t size, int tag, void* mh, void* ph, void** req) {
  return I.isend(sc, d, size, tag, mh, ph, req);
}
#define CT_MAX_RECVS 8
static ncclResult_t irecv_int(void* rc, int n, void** d, int* sizes, int* tags, void** mh, void** req) {
  size_t s[CT_MAX_RECVS];
  if (n < 1 || n > CT_MAX_RECVS) return ncclInvalidArgument;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return ncclInvalidArgument;
    s[i] = (size_t)sizes[i];
  }
  return I.irecv(rc, n, d, s, tags, mh, NULL, req);
}
static ncclResult_t irecv_v9(void* rc, int n, void** d, size_t* sizes, int* tags, void** mh, void** req) {
  return I.irecv(rc, n, d, sizes, tags, mh, NULL, req);
}
static ncclResult_t irecv_v10(void* rc, int n, void** d, size_t* sizes, int* tags, void** mh, void** ph,
                              void** req) {
  return I.irecv(rc, n, d, sizes, tags, mh, ph, req);
}
static ncclResult_t iflush(void* rc, int n, void** d, int* sizes, void** mh, void** req) {
  return I.iflush(rc, n, d, sizes, mh, req);
}
static ncclResult_t test(void* req, int* done, int* sizes) { return I.test(req, done, sizes); }
static ncclResult_t close_send(void* c) { return I.closeSend(c); }
static ncclResult_t close_recv(void* c) { return I.closeRecv(c); }
static ncclResult_t close_listen(void* c) { return I.closeListen(c); }
static ncclResult_t devices(int* n) { return I.devices(n); }

/* ---------------- v11: v12 with the v11 properties ---------------- */
static ncclResult_t init_v11(void** ctx, uint64_t id, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
  return I.init(ctx, id, cfg, log, prof);
}
static ncclResult_t listen_v11(void* ctx, int dev, void* h, void** lc) { return I.listen(ctx, dev, h, lc); }
static ncclResult_t connect_v11(void* ctx, int dev, void* h, void** sc, ncclNetDeviceHandle_old_t** dc) {
  return I.connect(ctx, dev, h, sc, dc);
}
static ncclResult_t finalize_v11(void* ctx) { return I.finalize(ctx); }
static ncclResult_t set_attr_v11(void* ctx, ncclNetAttr_v12_t* a) { return I.setNetAttr(ctx, a); }

#define COMMON_TAIL .iflush = iflush, .test = test, .closeSend = close_send, .closeRecv = close_recv, \
                    .closeListen = close_listen

EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = CT_PLUGIN_NAME, .init = init_v11, .devices = devices, .getProperties = props_v11, .listen = listen_v11,
    .connect = connect_v11, .accept = accept_v7, .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .isend = isend_v10, .irecv = irecv_v10, COMMON_TAIL, .getDeviceMr = NULL, .irecvConsumed = NULL,
    .makeVDevice = NULL, .finalize = finalize_v11, .setNetAttr = set_attr_v11};

EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = CT_PLUGIN_NAME, .init = init_v10, .devices = devices, .getProperties = props_v9, .listen = listen_v5,
    .connect = connect_v10, .accept = accept_v7, .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .isend = isend_v10, .irecv = irecv_v10, COMMON_TAIL, .getDeviceMr = NULL, .irecvConsumed = NULL,
    .makeVDevice = NULL};

EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = CT_PLUGIN_NAME, .init = init_v5, .devices = devices, .getProperties = props_v9, .listen = listen_v5,
    .connect = connect_v7, .accept = accept_v7, .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .isend = isend_v9, .irecv = irecv_v9, COMMON_TAIL, .getDeviceMr = NULL, .irecvConsumed = NULL,
    .makeVDevice = NULL};

EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = CT_PLUGIN_NAME, .init = init_v5, .devices = devices, .getProperties = props_v8, .listen = listen_v5,
    .connect = connect_v7, .accept = accept_v7, .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .isend = isend_int, .irecv = irecv_int, COMMON_TAIL, .getDeviceMr = NULL, .irecvConsumed = NULL};

EXPORT ncclNet_v7_t ncclNetPlugin_v7 = {
    .name = CT_PLUGIN_NAME, .init = init_v5, .devices = devices, .getProperties = props_v7, .listen = listen_v5,
    .connect = connect_v7, .accept = accept_v7, .regMr = regmr_int, .regMrDmaBuf = regmr_dmabuf,
    .deregMr = deregmr, .isend = isend_int, .irecv = irecv_int, COMMON_TAIL, .getDeviceMr = NULL,
    .irecvConsumed = NULL};

EXPORT ncclNet_v6_t ncclNetPlugin_v6 = {
    .name = CT_PLUGIN_NAME, .init = init_v5, .devices = devices, .getProperties = props_v6, .listen = listen_v5,
    .connect = connect_v5, .accept = accept_v5, .regMr = regmr_int, .regMrDmaBuf = regmr_dmabuf,
    .deregMr = deregmr, .isend = isend_int, .irecv = irecv_int, COMMON_TAIL};

EXPORT ncclNet_v5_t ncclNetPlugin_v5 = {
    .name = CT_PLUGIN_NAME, .init = init_v5, .devices = devices, .getProperties = props_v6, .listen = listen_v5,
    .connect = connect_v5, .accept = accept_v5, .regMr = regmr_int, .deregMr = deregmr, .isend = isend_int,
    .irecv = irecv_int, COMMON_TAIL};

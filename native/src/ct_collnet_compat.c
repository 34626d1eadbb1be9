/* ncclCollNetPlugin_v5 .. v11: thin adapters over the one implementation,
 * ncclCollNetPlugin_v12 (ct_collnet.c). NCCL looks the CollNet symbol up in the
 * same library as the net one, newest version first. What changes:
 *   v5 -> v6  regMrDmaBuf added
 *   v6 -> v7  properties gain netDeviceType/Version
 *   v7 -> v8  regMr takes size_t; iallgather/ireducescatter (32-bit SGE sizes)
 *   v8 -> v9  iallreduce count is size_t, SGE sizes size_t, makeVDevice
 *   v9 -> v10 (no change to the CollNet table)
 *   v10 -> v11 per-communicator context (init/listen/finalize)
 *   v11 -> v12 properties with 8-entry vProps and rail/plane ids */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "ct_compat.h"
#include "ct_plugin.h"

#define I ncclCollNetPlugin_v12
#define EXPORT __attribute__((visibility("default")))

CT_DEFINE_PROPS_ADAPTER(props_v6, I, v6)
CT_DEFINE_PROPS_ADAPTER(props_v7, I, v7)
CT_DEFINE_PROPS_ADAPTER(props_v8, I, v8)
CT_DEFINE_PROPS_ADAPTER(props_v9, I, v9)
CT_DEFINE_PROPS_ADAPTER(props_v11, I, v11)

static void* g_ctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t init_v5(ncclDebugLogger_t log) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&g_mu);
  if (!g_ctx) r = I.init(&g_ctx, 0, log);
  else if (log) ct_logger = log;
  pthread_mutex_unlock(&g_mu);
  return r;
}
static ncclResult_t listen_v5(int dev, void* h, void** lc) { return I.listen(g_ctx, dev, h, lc); }
static ncclResult_t devices(int* n) { return I.devices(n); }
static ncclResult_t coll_connect(void* hs[], int n, int rank, void* lc, void** cc) { return I.connect(hs, n, rank, lc, cc); }
static ncclResult_t reduce_support(ncclDataType_t t, ncclRedOp_t op, int* s) { return I.reduceSupport(t, op, s); }
static ncclResult_t regmr_int(void* c, void* d, int size, int type, void** mh) {
  if (size < 0) return ncclInvalidArgument;
  return I.regMr(c, d, (size_t)size, type, mh);
}
static ncclResult_t regmr(void* c, void* d, size_t size, int type, void** mh) { return I.regMr(c, d, size, type, mh); }
static ncclResult_t regmr_dmabuf(void* c, void* d, size_t size, int type, uint64_t off, int fd, void** mh) {
  return I.regMrDmaBuf(c, d, size, type, off, fd, mh);
}
static ncclResult_t deregmr(void* c, void* mh) { return I.deregMr(c, mh); }
static ncclResult_t iallreduce_int(void* c, void* s, void* r, int count, ncclDataType_t t, ncclRedOp_t op, void* smh,
                                   void* rmh, void** req) {
  if (count < 0) return ncclInvalidArgument;
  return I.iallreduce(c, s, r, (size_t)count, t, op, smh, rmh, req);
}
static ncclResult_t iallreduce(void* c, void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t op, void* smh,
                               void* rmh, void** req) {
  return I.iallreduce(c, s, r, count, t, op, smh, rmh, req);
}

/* v8's SGE has a 32-bit size; the engine copies what it needs while posting, so a
 * temporary v12 copy of the list is enough. */
static ncclNetSGE_v12_t* sge_from_v8(int n, const ncclNetSGE_v8_t* in) {
  if (n < 1) return NULL;
  ncclNetSGE_v12_t* out = malloc(sizeof *out * (size_t)n);
  if (!out) return NULL;
  for (int i = 0; i < n; i++) out[i] = (ncclNetSGE_v12_t){in[i].mhandle, in[i].address, in[i].size};
  return out;
}
static ncclResult_t iallgather_v8(void* c, void* send, int n, ncclNetSGE_v8_t* parts, size_t bpr, size_t woff,
                                  size_t wb, void* smh, void** req) {
  ncclNetSGE_v12_t* p = sge_from_v8(n, parts);
  if (!p) return n < 1 ? ncclInvalidArgument : ncclSystemError;
  ncclResult_t r = I.iallgather(c, send, n, p, bpr, woff, wb, smh, req);
  free(p);
  return r;
}
static ncclResult_t ireducescatter_v8(void* c, int n, ncclNetSGE_v8_t* parts, void* recv, size_t bpr, size_t woff,
                                      size_t wb, ncclDataType_t t, ncclRedOp_t op, void* rmh, void** req) {
  ncclNetSGE_v12_t* p = sge_from_v8(n, parts);
  if (!p) return n < 1 ? ncclInvalidArgument : ncclSystemError;
  ncclResult_t r = I.ireducescatter(c, n, p, recv, bpr, woff, wb, t, op, rmh, req);
  free(p);
  return r;
}
static ncclResult_t iallgather(void* c, void* send, int n, ncclNetSGE_v12_t* parts, size_t bpr, size_t woff,
                               size_t wb, void* smh, void** req) {
  return I.iallgather(c, send, n, parts, bpr, woff, wb, smh, req);
}
static ncclResult_t ireducescatter(void* c, int n, ncclNetSGE_v12_t* parts, void* recv, size_t bpr, size_t woff,
                                   size_t wb, ncclDataType_t t, ncclRedOp_t op, void* rmh, void** req) {
  return I.ireducescatter(c, n, parts, recv, bpr, woff, wb, t, op, rmh, req);
}
static ncclResult_t iflush(void* c, void* d, int size, void* mh, void** req) { return I.iflush(c, d, size, mh, req); }
static ncclResult_t test(void* req, int* done, int* size) { return I.test(req, done, size); }
static ncclResult_t close_coll(void* c) { return I.closeColl(c); }
static ncclResult_t close_listen(void* c) { return I.closeListen(c); }

static ncclResult_t init_v11(void** ctx, uint64_t id, ncclDebugLogger_t log) { return I.init(ctx, id, log); }
static ncclResult_t listen_v11(void* ctx, int dev, void* h, void** lc) { return I.listen(ctx, dev, h, lc); }
static ncclResult_t finalize_v11(void* ctx) { return I.finalize(ctx); }

#define HEAD(INIT, PROPS, LISTEN) .name = CT_PLUGIN_NAME, .init = INIT, .devices = devices, \
    .getProperties = PROPS, .listen = LISTEN, .connect = coll_connect, .reduceSupport = reduce_support
#define TAIL .iflush = iflush, .test = test, .closeColl = close_coll, .closeListen = close_listen

EXPORT ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    HEAD(init_v11, props_v11, listen_v11), .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce, .iallgather = iallgather, .ireducescatter = ireducescatter, TAIL,
    .makeVDevice = NULL, .finalize = finalize_v11};

EXPORT ncclCollNet_v10_t ncclCollNetPlugin_v10 = {
    HEAD(init_v5, props_v9, listen_v5), .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce, .iallgather = iallgather, .ireducescatter = ireducescatter, TAIL,
    .makeVDevice = NULL};

EXPORT ncclCollNet_v9_t ncclCollNetPlugin_v9 = {
    HEAD(init_v5, props_v9, listen_v5), .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce, .iallgather = iallgather, .ireducescatter = ireducescatter, TAIL,
    .makeVDevice = NULL};

EXPORT ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    HEAD(init_v5, props_v8, listen_v5), .regMr = regmr, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce_int, .iallgather = iallgather_v8, .ireducescatter = ireducescatter_v8, TAIL};

EXPORT ncclCollNet_v7_t ncclCollNetPlugin_v7 = {
    HEAD(init_v5, props_v7, listen_v5), .regMr = regmr_int, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce_int, TAIL};

EXPORT ncclCollNet_v6_t ncclCollNetPlugin_v6 = {
    HEAD(init_v5, props_v6, listen_v5), .regMr = regmr_int, .regMrDmaBuf = regmr_dmabuf, .deregMr = deregmr,
    .iallreduce = iallreduce_int, TAIL};

EXPORT ncclCollNet_v5_t ncclCollNetPlugin_v5 = {
    HEAD(init_v5, props_v6, listen_v5), .regMr = regmr_int, .deregMr = deregmr, .iallreduce = iallreduce_int,
    TAIL};

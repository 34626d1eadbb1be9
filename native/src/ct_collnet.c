/* ncclCollNetPlugin_v12 over the CollNet engine (ct_coll.c). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_plugin.h"
#include "ct_reduce.h"

typedef struct { int fd; ct_handle_t h; } ct_clisten_t;

/* Settings taken from the environment at listen time; rank 0's reach everyone.
 * The default algorithm is servers when CLUSTERTOOL_REDUCERS names any, else sharded. */
static const char* default_algo_name(void) {
  return *ct_env_str("CLUSTERTOOL_REDUCERS", "") ? "servers" : "sharded";
}

static int algo_from(const char* a) {
  if (!a || !*a) a = ct_env_str("CLUSTERTOOL_COLLNET_ALGO", default_algo_name());
  int algo = ct_algo_parse(a);
  if (algo < 0) {
    CT_WARN("CLUSTERTOOL_COLLNET_ALGO=%s unknown (sharded, ring or servers); using sharded", a);
    algo = CT_ALGO_SHARDED;
  }
  return algo;
}

static int cn_ndevs(void) { return ct_env_long("CLUSTERTOOL_COLLNET_DISABLE", 0, 0, 1) ? 0 : ct_net_ndevs(); }

static ncclResult_t cn_init(void** ctx, uint64_t commId, ncclDebugLogger_t log) {
  static int said;
  (void)commId;
  if (log) ct_logger = log;
  struct sockaddr_in a;
  if (ct_plugin_addr(&a)) return ncclSystemError;
  *ctx = calloc(1, 1);
  if (!*ctx) return ncclSystemError;
  if (!said++) {
    ncclNetProperties_v12_t p;
    int n = cn_ndevs();
    const char* dev0 = n > 0 && ct_collnet_dev_props(0, &p) == ncclSuccess ? p.name : "-";
    CT_INFO("CollNet plugin %s: %d device(s) paired with the net devices of the same index (device 0 '%s'), "
            "reductions on the host over TCP on %s, algorithm %s", CT_VERSION, n, dev0 ? dev0 : "?",
            ct_plugin_ifname(), ct_env_str("CLUSTERTOOL_COLLNET_ALGO", default_algo_name()));
  }
  return ncclSuccess;
}

static ncclResult_t cn_devices(int* n) {
  *n = cn_ndevs();
  return ncclSuccess;
}

static ncclResult_t cn_props(int dev, ncclNetProperties_v12_t* p) {
  if (dev < 0 || dev >= cn_ndevs()) return ncclInvalidArgument;
  return ct_collnet_dev_props(dev, p);
}

ncclResult_t ct_collnet_listen_algo(int dev, const char* algo, void* handle, void** lc) {
  ct_clisten_t* l = calloc(1, sizeof *l);
  if (!l) return ncclSystemError;
  ncclResult_t r = ct_plugin_listen(dev, handle, &l->fd, &l->h);
  if (r != ncclSuccess) { free(l); return r; }
  l->h.algo = (uint32_t)algo_from(algo);
  l->h.nsocks = (uint32_t)ct_env_long("CLUSTERTOOL_SOCKS_PER_PEER", 1, 1, 16);
  const char* sched = ct_env_str("CLUSTERTOOL_SHARDED_SCHED", "lockstep");
  l->h.sched = strcasecmp(sched, "free") == 0;
  l->h.threads = ct_coll_threads_word();
  /* servers: finer chunks interleave the K streams better (about 1.3-1.4 B busbw at 128K or 64K, 1.1 B at
   * 256K, n = K = 4 on 200 Mbit namespaces; 64K costs too much per message where the CPU limits) */
  long dflt = l->h.algo == CT_ALGO_SERVERS ? 128 * 1024 : 256 * 1024;
  l->h.chunk_bytes = (uint64_t)ct_env_long("CLUSTERTOOL_CHUNK_BYTES", dflt, 4096, 256L << 20);
  memcpy(handle, &l->h, sizeof l->h);
  *lc = l;
  return ncclSuccess;
}

static ncclResult_t cn_listen(void* ctx, int dev, void* handle, void** lc) {
  (void)ctx;
  return ct_collnet_listen_algo(dev, NULL, handle, lc);
}

/* Exported for collnet_bench and tests: what a connected comm really runs. */
__attribute__((visibility("default"))) const char* ct_collnet_comm_algo(void* cc) { return cc ? ct_algo_name(((ct_coll_t*)cc)->algo) : "?"; }
__attribute__((visibility("default"))) int ct_collnet_comm_servers(void* cc) { return cc ? ((ct_coll_t*)cc)->nserv : 0; }
/* For tests: the window; stop (1) or resume (0) the progress thread between passes, as a
 * progress thread busy for a long time would be; bytes this comm moved through ct_pace. */
/* The window is every lane's together (requests go to the lanes in turn); freeze holds every lane. */
__attribute__((visibility("default"))) int ct_collnet_comm_window(void* cc) {
  return cc ? ((ct_coll_t*)cc)->W * ((ct_coll_t*)cc)->nlanes : 0;
}
__attribute__((visibility("default"))) int ct_collnet_comm_threads(void* cc) { return cc ? ((ct_coll_t*)cc)->nlanes : 0; }
__attribute__((visibility("default"))) void ct_collnet_debug_freeze(void* cc, int on) {
  ct_coll_t* root = cc;
  if (!root) return;
  for (int l = 0; l < root->nlanes; l++) {
    ct_coll_t* c = root->lanes[l];
    if (!c->thread_started) continue;
    atomic_store(&c->freeze, on);
    if (!on) continue;
    ct_engine_wake(c);
    for (int i = 0; i < 10000 && !atomic_load(&c->frozen); i++) usleep(1000);   /* held at the top of a pass */
  }
}
__attribute__((visibility("default"))) void ct_collnet_comm_paced(void* cc, uint64_t* tx, uint64_t* rx) {
  ct_coll_t* root = cc;
  *tx = *rx = 0;
  for (int l = 0; root && l < root->nlanes; l++) {
    *tx += atomic_load(&root->lanes[l]->paced_tx);
    *rx += atomic_load(&root->lanes[l]->paced_rx);
  }
}

/* Unlike the net connect, NCCL calls CollNet connect once per group and takes a NULL
 * comm as "CollNet setup failed" (src/transport/coll_net.cc sharedConnect, then
 * ncclTransportCollNetCheck turns CollNet off for the communicator). So this call
 * blocks until the mesh is up, bounded by CLUSTERTOOL_CONNECT_TIMEOUT_MS; lower
 * ranks connect into higher ranks' listen backlogs, so no rank waits on another's
 * accept order. */
static ncclResult_t cn_connect(void* handles[], int nranks, int rank, void* lc, void** cc) {
  ct_clisten_t* l = lc;
  *cc = NULL;
  if (nranks < 1) return ncclInvalidArgument;
  ct_handle_t* copies = malloc(sizeof(ct_handle_t) * (size_t)nranks);   /* aligned copies */
  ct_handle_t** hs = malloc(sizeof(ct_handle_t*) * (size_t)nranks);
  if (!hs || !copies) { free(hs); free(copies); return ncclSystemError; }
  for (int r = 0; r < nranks; r++) {
    memcpy(&copies[r], handles[r], sizeof copies[r]);
    hs[r] = &copies[r];
  }
  *cc = ct_coll_connect(hs, nranks, rank, l->fd);
  free(hs);
  free(copies);
  return *cc ? ncclSuccess : ncclSystemError;
}

static ncclResult_t cn_reduce_support(ncclDataType_t t, ncclRedOp_t op, int* supported) {
  *supported = ct_reduce_supported(t, op);
  return ncclSuccess;
}

static int g_mr_token;
static ncclResult_t cn_regmr(void* cc, void* data, size_t size, int type, void** mh) {
  (void)cc; (void)data; (void)size;
  if (type != NCCL_PTR_HOST) return ncclInvalidArgument;
  *mh = &g_mr_token;
  return ncclSuccess;
}
static ncclResult_t cn_regmr_dmabuf(void* cc, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  (void)off; (void)fd;
  return cn_regmr(cc, data, size, type, mh);
}
static ncclResult_t cn_deregmr(void* cc, void* mh) { (void)cc; (void)mh; return ncclSuccess; }

/* A post beyond the window (CLUSTERTOOL_COLLNET_WINDOW collectives in flight) returns
 * ncclSuccess with a NULL request: every NCCL release's CollNet proxy then calls again on
 * its next progress pass (src/transport/coll_net.cc), by which time the progress thread
 * has completed some. Requests that finished but were not tested yet do not count. */
static ncclResult_t wrap(ct_coll_t* c, int rc, ct_req_t* req, void** request) {
  *request = rc == 0 ? req : NULL;
  if (rc < 0) return ct_coll_failed(c) ? ncclSystemError : ncclInvalidArgument;
  return ncclSuccess;
}

static void count_op(ct_coll_t* c, const char* what, size_t bytes) {
  if (c->nops == 0)
    CT_INFO("CollNet rank %d/%d: first %s (%zu bytes) running, algorithm %s%s", c->rank, c->nranks, what, bytes,
            ct_algo_name(c->algo), c->nrules ? " (collnet_algo rules may pick another per size)" : "");
}

static ncclResult_t cn_iallreduce(void* cc, void* send, void* recv, size_t count, ncclDataType_t t,
                                  ncclRedOp_t op, void* smh, void* rmh, void** request) {
  (void)smh; (void)rmh;
  count_op(cc, "iallreduce", count * ct_dtype_size(t));
  ct_req_t* r = NULL;
  int rc = ct_coll_allreduce(cc, send, recv, count, t, op, &r);
  return wrap(cc, rc, r, request);
}

static ncclResult_t cn_iallgather(void* cc, void* send, int nparts, ncclNetSGE_v12_t* parts, size_t bpr,
                                  size_t woff, size_t wbytes, void* smh, void** request) {
  (void)smh;
  count_op(cc, "iallgather", wbytes);
  ct_req_t* r = NULL;
  int rc = ct_coll_allgather(cc, send, nparts, parts, bpr, woff, wbytes, &r);
  return wrap(cc, rc, r, request);
}

static ncclResult_t cn_ireducescatter(void* cc, int nparts, ncclNetSGE_v12_t* parts, void* recv, size_t bpr,
                                      size_t woff, size_t wbytes, ncclDataType_t t, ncclRedOp_t op, void* rmh,
                                      void** request) {
  (void)rmh;
  count_op(cc, "ireducescatter", wbytes);
  ct_req_t* r = NULL;
  int rc = ct_coll_reducescatter(cc, nparts, parts, recv, bpr, woff, wbytes, t, op, &r);
  return wrap(cc, rc, r, request);
}

static ncclResult_t cn_iflush(void* cc, void* data, int size, void* mh, void** request) {
  (void)cc; (void)data; (void)size; (void)mh;
  *request = NULL;
  return ncclSuccess;
}

/* Never blocks: an atomic load, and for a finished request its release. */
static ncclResult_t cn_test(void* request, int* done, int* size) {
  size_t bytes = 0;
  int s = ct_coll_test(request, &bytes);
  *done = s != 0;
  if (s < 0) return ncclSystemError;
  if (s > 0 && size) *size = bytes > (size_t)0x7fffffff ? 0x7fffffff : (int)bytes;
  return ncclSuccess;
}

static ncclResult_t cn_close_coll(void* cc) {
  ct_coll_t* c = cc;
  if (c) CT_INFO("CollNet rank %d/%d closed after %llu collectives, %llu bytes", c->rank, c->nranks,
                 (unsigned long long)c->nops, (unsigned long long)c->nbytes);
  ct_coll_close(cc);
  return ncclSuccess;
}
static ncclResult_t cn_close_listen(void* lc) {
  ct_clisten_t* l = lc;
  if (l) { close(l->fd); free(l); }
  return ncclSuccess;
}
static ncclResult_t cn_finalize(void* ctx) { free(ctx); return ncclSuccess; }

__attribute__((visibility("default"))) ncclCollNet_v12_t ncclCollNetPlugin_v12 = {
    .name = CT_PLUGIN_NAME,
    .init = cn_init,
    .devices = cn_devices,
    .getProperties = cn_props,
    .listen = cn_listen,
    .connect = cn_connect,
    .reduceSupport = cn_reduce_support,
    .regMr = cn_regmr,
    .regMrDmaBuf = cn_regmr_dmabuf,
    .deregMr = cn_deregmr,
    .iallreduce = cn_iallreduce,
    .iallgather = cn_iallgather,
    .ireducescatter = cn_ireducescatter,
    .iflush = cn_iflush,
    .test = cn_test,
    .closeColl = cn_close_coll,
    .closeListen = cn_close_listen,
    .makeVDevice = NULL,
    .finalize = cn_finalize,
};

/* Version string readable with dlsym or `strings` (clustertool plugin status). */
__attribute__((visibility("default"))) const char clustertool_plugin_version[] = "clustertool-nccl-plugin " CT_VERSION;

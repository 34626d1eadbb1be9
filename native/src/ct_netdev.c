/* Network devices as NCCL sees them, shared by the net and CollNet halves.
 *
 * NCCL pairs a CollNet device with a net device by name (src/graph/xml.cc
 * ncclTopoFillNet finds the NIC node by "name"; the CollNet pass sets coll=1 on
 * it). So CollNet device i is net device i: same name, pciPath, guid, speed,
 * port, latency and maxComms; only what the CollNet itself supports (host
 * memory, its own transfer limits) is its own. When point-to-point goes to the
 * OFI plugin, the devices (and their names) are OFI's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ct_plugin.h"

/* ---------------- our TCP device ---------------- */
static char g_ifname[64];
static struct sockaddr_in g_addr;
static int g_addr_ok = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

int ct_plugin_addr(struct sockaddr_in* out) {
  pthread_mutex_lock(&g_mu);
  if (g_addr_ok < 0) g_addr_ok = ct_local_addr(&g_addr, g_ifname, sizeof g_ifname) == 0;
  int ok = g_addr_ok;
  if (ok) *out = g_addr;
  pthread_mutex_unlock(&g_mu);
  return ok ? 0 : -1;
}

const char* ct_plugin_ifname(void) {
  struct sockaddr_in a;
  return ct_plugin_addr(&a) ? "?" : g_ifname;
}

static ncclResult_t tcp_props(int dev, ncclNetProperties_v12_t* p) {
  static char pci[PATH_MAX];
  struct sockaddr_in a;
  if (dev != 0 || ct_plugin_addr(&a)) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  char path[128];
  snprintf(path, sizeof path, "/sys/class/net/%s/device", g_ifname);
  p->name = (char*)CT_TCP_DEV_NAME;
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

/* ---------------- forwarding to the OFI plugin ---------------- */
static ncclNet_v12_t* g_fwd;
static void* g_fwd_lib;
static void* g_fwd_ctx0;           /* context of the first init, kept for device queries */
static int g_fwd_tried, g_fwd_inited;

static void try_forward_locked(void) {
  if (g_fwd_tried) return;
  g_fwd_tried = 1;
  if (ct_env_long("CLUSTERTOOL_NET_FORWARD", 1, 0, 1) == 0) return;
  const char* lib = ct_env_str("CLUSTERTOOL_OFI_LIB", "libnccl-net-ofi.so");
  g_fwd_lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!g_fwd_lib) return;  /* absent: plain TCP */
  int version = 0;
  g_fwd = ct_fwd_table(g_fwd_lib, &version);
  if (!g_fwd) {
    CT_WARN("%s exports no ncclNetPlugin_v12 .. v9; using TCP for point-to-point", lib);
    dlclose(g_fwd_lib);
    g_fwd_lib = NULL;
  } else {
    CT_INFO("forwarding point-to-point to %s (%s, net ABI v%d)", lib, g_fwd->name, version);
  }
}

ncclNet_v12_t* ct_fwd(void) {
  pthread_mutex_lock(&g_mu);
  try_forward_locked();
  ncclNet_v12_t* f = g_fwd;
  pthread_mutex_unlock(&g_mu);
  return f;
}

const char* ct_net_forward_name(void) {
  ncclNet_v12_t* f = ct_fwd();
  return f ? f->name : NULL;
}

ncclResult_t ct_fwd_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                         ncclProfilerCallback_t prof) {
  ncclNet_v12_t* f = ct_fwd();
  ncclNetCommConfig_v12_t dflt = {-1};
  ncclResult_t r = f->init(ctx, commId, cfg ? cfg : &dflt, log, prof);
  pthread_mutex_lock(&g_mu);
  if (r == ncclSuccess && !g_fwd_inited) { g_fwd_inited = 1; g_fwd_ctx0 = *ctx; }
  if (r != ncclSuccess && !g_fwd_inited) g_fwd = NULL;   /* never worked: TCP from now on */
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* The forwarded plugin must be initialized before it can list devices; CollNet can
 * be asked first (our tests do), so it initializes it once here if needed. */
static ncclNet_v12_t* fwd_ready(void) {
  ncclNet_v12_t* f = ct_fwd();
  if (!f) return NULL;
  pthread_mutex_lock(&g_mu);
  int inited = g_fwd_inited;
  pthread_mutex_unlock(&g_mu);
  if (!inited) {
    void* ctx = NULL;
    if (ct_fwd_init(&ctx, 0, NULL, ct_logger, NULL) != ncclSuccess) return NULL;
  }
  return ct_fwd();
}

int ct_net_ndevs(void) {
  ncclNet_v12_t* f = fwd_ready();
  if (f) {
    int n = 0;
    return f->devices(&n) == ncclSuccess ? n : 0;
  }
  struct sockaddr_in a;
  return ct_plugin_addr(&a) == 0 ? 1 : 0;
}

ncclResult_t ct_net_dev_props(int dev, ncclNetProperties_v12_t* p) {
  ncclNet_v12_t* f = fwd_ready();
  if (f) return f->getProperties(dev, p);
  return tcp_props(dev, p);
}

ncclResult_t ct_collnet_dev_props(int dev, ncclNetProperties_v12_t* p) {
  ncclNetProperties_v12_t net;
  ncclResult_t r = ct_net_dev_props(dev, &net);
  if (r != ncclSuccess) return r;
  struct sockaddr_in a;
  if (ct_plugin_addr(&a)) return ncclSystemError;
  memset(p, 0, sizeof *p);
  /* what pairs the two and what NCCL's topology keeps from whichever pass comes first */
  p->name = net.name;
  p->pciPath = net.pciPath;
  p->guid = net.guid;
  p->speed = net.speed;
  p->port = net.port;
  p->latency = net.latency;
  p->maxComms = net.maxComms;
  /* what our CollNet does: TCP from host memory */
  p->ptrSupport = NCCL_PTR_HOST;
  p->maxRecvs = 1;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = (size_t)NCCL_MAX_NET_SIZE_BYTES;
  p->maxCollBytes = (size_t)NCCL_MAX_NET_SIZE_BYTES;
  p->maxMultiRequestSize = 1;
  p->railId = net.railId;
  p->planeId = net.planeId;
  return ncclSuccess;
}

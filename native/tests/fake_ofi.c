/* Stand-in for libnccl-net-ofi.so: a net table whose answers are easy to recognise,
 * to test that point-to-point calls are forwarded and that CollNet device i then
 * carries OFI device i's identity. Device i is "fake-ofi-dev<i>" on
 * /sys/devices/fake/0000:0<i>:00.0 with guid 0xf0f0+i and speed 100000*(i+1).
 * Built once per ABI version real OFI plugins export (FAKE_OFI_VERSION 9 .. 12):
 * only that version's symbol is exported. */
#include <stdio.h>
#include <string.h>
#include "ct_nccl_abi_compat.h"
#ifndef FAKE_OFI_VERSION
#define FAKE_OFI_VERSION 12
#endif

#define NDEV 7
static char names[NDEV][32], paths[NDEV][64];

static ncclResult_t f_init(void** ctx, uint64_t id, ncclNetCommConfig_v12_t* c, ncclDebugLogger_t l,
                           ncclProfilerCallback_t p) {
  (void)id; (void)c; (void)l; (void)p;
  static int token;
  for (int i = 0; i < NDEV; i++) {
    snprintf(names[i], sizeof names[i], "fake-ofi-dev%d", i);
    snprintf(paths[i], sizeof paths[i], "/sys/devices/fake/0000:0%d:00.0", i);
  }
  *ctx = &token;
  return ncclSuccess;
}
static ncclResult_t f_devices(int* n) { *n = NDEV; return ncclSuccess; }
static ncclResult_t f_props(int dev, ncclNetProperties_v12_t* p) {
  if (dev < 0 || dev >= NDEV) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  p->name = names[dev];
  p->pciPath = paths[dev];
  p->guid = 0xf0f0 + (uint64_t)dev;
  p->ptrSupport = NCCL_PTR_HOST | NCCL_PTR_CUDA;
  p->speed = 100000 * (dev + 1);
  p->port = 1;
  p->latency = 2.5f;
  p->maxComms = 1024;
  p->maxRecvs = 8;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = 1u << 30;
  p->maxCollBytes = 1u << 30;
  p->maxMultiRequestSize = 1;
  p->railId = -1;
  p->planeId = -1;
  return ncclSuccess;
}
static ncclResult_t f_finalize(void* ctx) { (void)ctx; return ncclSuccess; }
#define EXPORT __attribute__((visibility("default")))

#if FAKE_OFI_VERSION == 12
EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = "fake-ofi", .init = f_init, .devices = f_devices, .getProperties = f_props, .finalize = f_finalize};
#elif FAKE_OFI_VERSION == 11
static ncclResult_t f_props11(int dev, ncclNetProperties_v11_t* p) {
  ncclNetProperties_v12_t q;
  ncclResult_t r = f_props(dev, &q);
  if (r == ncclSuccess) { memset(p, 0, sizeof *p); memcpy(p, &q, offsetof(ncclNetProperties_v11_t, vProps));
    p->vProps.ndevs = 1; p->vProps.devs[0] = dev; p->maxP2pBytes = q.maxP2pBytes; p->maxCollBytes = q.maxCollBytes;
    p->maxMultiRequestSize = 1; }
  return r;
}
EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "fake-ofi", .init = f_init, .devices = f_devices, .getProperties = f_props11, .finalize = f_finalize};
#else
static ncclResult_t f_props9(int dev, ncclNetProperties_v9_t* p) {
  ncclNetProperties_v12_t q;
  ncclResult_t r = f_props(dev, &q);
  if (r == ncclSuccess) { memset(p, 0, sizeof *p); memcpy(p, &q, offsetof(ncclNetProperties_v9_t, vProps));
    p->vProps.ndevs = 1; p->vProps.devs[0] = dev; p->maxP2pBytes = q.maxP2pBytes; p->maxCollBytes = q.maxCollBytes; }
  return r;
}
static void* g_ctx;
#if FAKE_OFI_VERSION == 10
static ncclResult_t f_init10(ncclDebugLogger_t l, ncclProfilerCallback_t p) { return f_init(&g_ctx, 0, NULL, l, p); }
EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {.name = "fake-ofi", .init = f_init10, .devices = f_devices,
                                          .getProperties = f_props9};
#else
static ncclResult_t f_init9(ncclDebugLogger_t l) { return f_init(&g_ctx, 0, NULL, l, NULL); }
EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {.name = "fake-ofi", .init = f_init9, .devices = f_devices,
                                        .getProperties = f_props9};
#endif
#endif

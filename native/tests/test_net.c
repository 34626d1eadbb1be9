#define _GNU_SOURCE
/* Net plugin point-to-point over loopback TCP, and forwarding to an OFI plugin.
 *   test_net BUILD_DIR            plain TCP checks
 *   test_net BUILD_DIR FAKE_OFI   forwarding checks against a fake libnccl-net-ofi.so
 *   test_net BUILD_DIR paced      the TCP checks again under CLUSTERTOOL_LINK_RATE=80mbit */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ct_nccl_abi.h"
#include "ct_test.h"

static ncclNet_v12_t* load(const char* dir) {
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", dir);
  void* h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  return h ? dlsym(h, "ncclNetPlugin_v12") : NULL;
}

/* Drives both requests to completion in one thread (the sockets are non-blocking). */
static int finish(ncclNet_v12_t* n, void* a, void* b, int* sa, int* sb) {
  int da = a == NULL, db = b == NULL;
  for (long spin = 0; (!da || !db) && spin < 50000000; spin++) {
    if (!da && n->test(a, &da, sa) != ncclSuccess) return -1;
    if (!db && n->test(b, &db, sb) != ncclSuccess) return -1;
  }
  return da && db ? 0 : -1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* CLUSTERTOOL_LINK_RATE=80mbit: 10 MB/s per direction, a bucket of 64 KiB (ct_pace.h). */
#define PACED_BYTES_PER_S 10e6
#define PACED_BURST 65536.0

static void test_tcp(ncclNet_v12_t* n, int paced) {
  void* ctx = NULL;
  ncclNetCommConfig_v12_t cfg = {-1};
  CHECK(n->init(&ctx, 1, &cfg, NULL, NULL) == ncclSuccess, "init");
  int nd = 0;
  n->devices(&nd);
  CHECK(nd == 1, "one TCP device");
  ncclNetProperties_v12_t p;
  CHECK(n->getProperties(0, &p) == ncclSuccess && !strcmp(p.name, "clustertool-tcp"), "TCP properties");
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void *lc = NULL, *sc = NULL, *rc = NULL;
  CHECK(n->listen(ctx, 0, handle, &lc) == ncclSuccess, "listen");
  CHECK(n->accept(lc, &rc, NULL) == ncclSuccess && rc == NULL, "accept without a peer returns NULL, not blocks");
  CHECK(n->connect(ctx, 0, handle, &sc, NULL) == ncclSuccess && sc, "connect");
  for (int i = 0; i < 1000 && !rc; i++) n->accept(lc, &rc, NULL);
  CHECK(rc != NULL, "accept after connect");
  if (!sc || !rc) return;
  size_t big = 3 * 1024 * 1024 + 7;
  char *src = malloc(big), *dst = malloc(big);
  for (size_t i = 0; i < big; i++) src[i] = (char)(i * 31 + 7);
  void *smh, *rmh;
  CHECK(n->regMr(sc, src, big, NCCL_PTR_HOST, &smh) == ncclSuccess, "regMr host");
  CHECK(n->regMr(rc, dst, big, NCCL_PTR_HOST, &rmh) == ncclSuccess, "regMr host (recv)");
  void* rreq = NULL;
  void* sreq = NULL;
  size_t rsize = big;
  int tag = 0;
  void* d = dst;
  CHECK(n->irecv(rc, 1, &d, &rsize, &tag, &rmh, NULL, &rreq) == ncclSuccess && rreq, "irecv posted");
  CHECK(n->isend(sc, src, big, 0, smh, NULL, &sreq) == ncclSuccess && sreq, "isend posted");
  int ss = -1, rs = -1;
  double t0 = now_s();
  CHECK(finish(n, sreq, rreq, &ss, &rs) == 0, "3 MiB transfer completes");
  double took = now_s() - t0, floor_s = ((double)big - PACED_BURST) / PACED_BYTES_PER_S;
  CHECK(rs == (int)big && memcmp(src, dst, big) == 0, "data and size arrive intact");
  if (paced) {
    /* a lower bound only: a busy box makes it slower, never faster than the rate */
    CHECK(took >= floor_s, "paced at 80 Mbit/s, 3 MiB take at least %.3f s (%.3f s)", floor_s, took);
    /* the bucket is drained now: one test() call cannot finish 1 MiB, since it never waits for
     * tokens (it would stall NCCL's proxy thread); it answers not-done and the rest follows */
    size_t mib = 1 << 20;
    CHECK(n->irecv(rc, 1, &d, &mib, &tag, &rmh, NULL, &rreq) == ncclSuccess &&
          n->isend(sc, src, 1 << 20, 0, smh, NULL, &sreq) == ncclSuccess, "1 MiB posted");
    int sdone = -1;
    CHECK(n->test(sreq, &sdone, NULL) == ncclSuccess && sdone == 0, "paced test() without tokens answers not-done");
    CHECK(finish(n, sreq, rreq, &ss, &rs) == 0 && rs == 1 << 20 && memcmp(src, dst, 1 << 20) == 0,
          "...and the message completes over later calls");
  }
  /* several in flight, including an empty message and a short one into a big buffer */
  size_t sizes[5] = {0, 1, 4096, 100000, 17};
  void *sr[5], *rr[5];
  size_t off = 0;
  for (int i = 0; i < 5; i++) {
    void* dp = dst + off;
    size_t cap = sizes[i] + 1000;
    n->irecv(rc, 1, &dp, &cap, &tag, &rmh, NULL, &rr[i]);
    n->isend(sc, src + off, sizes[i], 0, smh, NULL, &sr[i]);
    off += sizes[i] + 1000;
  }
  int ok = 1;
  off = 0;
  for (int i = 4; i >= 0; i--) {   /* test out of order on purpose */
    int a = -1, b = -1;
    ok &= finish(n, sr[i], rr[i], &a, &b) == 0 && b == (int)sizes[i];
  }
  for (int i = 0; i < 5; i++) {
    ok &= memcmp(src + off, dst + off, sizes[i]) == 0;
    off += sizes[i] + 1000;
  }
  CHECK(ok, "five queued messages complete in order with their own sizes");
  /* a message larger than the posted receive is an error, not an overflow */
  size_t small = 10;
  n->irecv(rc, 1, &d, &small, &tag, &rmh, NULL, &rreq);
  n->isend(sc, src, 4096, 0, smh, NULL, &sreq);
  int a, b, done = 0;
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < 100000 && r == ncclSuccess && !done; i++) {
    n->test(sreq, &a, NULL);
    r = n->test(rreq, &done, &b);
  }
  CHECK(r != ncclSuccess, "oversized message reported as an error");
  n->deregMr(sc, smh);
  n->deregMr(rc, rmh);
  n->closeSend(sc);
  n->closeRecv(rc);
  n->closeListen(lc);
  n->finalize(ctx);
  free(src);
  free(dst);
}

static void test_forward(ncclNet_v12_t* n) {
  void* ctx = NULL;
  CHECK(n->init(&ctx, 1, NULL, NULL, NULL) == ncclSuccess, "init with OFI present");
  int nd = 0;
  n->devices(&nd);
  CHECK(nd == 7, "devices answered by the OFI plugin (got %d)", nd);
  ncclNetProperties_v12_t p;
  n->getProperties(0, &p);
  CHECK(p.name && !strcmp(p.name, "fake-ofi-dev0"), "properties answered by the OFI plugin");
  n->finalize(ctx);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "build";
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  int paced = argc > 2 && !strcmp(argv[2], "paced");
  if (argc > 2 && !paced) setenv("CLUSTERTOOL_OFI_LIB", argv[2], 1);
  else setenv("CLUSTERTOOL_OFI_LIB", "/nonexistent/libnccl-net-ofi.so", 1);
  if (paced) setenv("CLUSTERTOOL_LINK_RATE", "80mbit", 1);
  ncclNet_v12_t* n = load(dir);
  CHECK(n != NULL, "load net plugin");
  if (n && argc > 2 && !paced) test_forward(n);
  else if (n) test_tcp(n, paced);
  return CT_SUMMARY();
}

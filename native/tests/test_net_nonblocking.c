#define _GNU_SOURCE
/* connect and accept never block NCCL's proxy thread: they return ncclSuccess with
 * a NULL comm until the connection is ready, and the handshake completes over
 * repeated calls (NCCL's contract; its proxy calls again while the comm is NULL,
 * src/transport/net.cc sendProxyConnect/recvProxyConnect).
 *   test_net_nonblocking BUILD_DIR */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "ct_common.h"
#include "ct_nccl_abi_compat.h"
#include "ct_test.h"

static ncclNet_v12_t* net;
static void* ctx;
#define FAST_MS 50.0   /* "at once": far below a TCP SYN retry (1 s) or the old blocking wait */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A listener whose accept queue is full: the kernel drops further SYNs, so a
 * connect to it stays in progress until someone accepts (a peer not accepting yet). */
static int full_listener(struct sockaddr_in* a, int* filler) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a->sin_port = 0;
  socklen_t len = sizeof *a;
  if (bind(l, (struct sockaddr*)a, sizeof *a) || listen(l, 0) || getsockname(l, (struct sockaddr*)a, &len)) return -1;
  *filler = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(*filler, (struct sockaddr*)a, sizeof *a)) return -1;   /* fills the queue of one */
  return l;
}

static void forge(char* handle, const struct sockaddr_in* a, uint64_t nonce) {
  ct_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = CT_HANDLE_MAGIC;
  h.addr = *a;
  h.nonce = nonce;
  h.stage.fd = -1;
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof h);
}

static void test_connect_to_a_peer_not_accepting(void) {
  struct sockaddr_in a;
  int filler = -1, l = full_listener(&a, &filler);
  CHECK(l >= 0, "full listener");
  if (l < 0) return;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  forge(handle, &a, 0x1122334455667788ull);
  void* sc = (void*)1;
  double worst = 0;
  int ok = 1;
  for (int i = 0; i < 20; i++) {
    double t = now_ms();
    ok &= net->connect(ctx, 0, handle, &sc, NULL) == ncclSuccess && sc == NULL;
    double dt = now_ms() - t;
    worst = dt > worst ? dt : worst;
    usleep(5000);
  }
  CHECK(ok, "connect returns ncclSuccess with a NULL comm while the peer is not accepting");
  CHECK(worst < FAST_MS, "every connect call returns within %.0f ms (slowest %.2f ms)", FAST_MS, worst);
  /* the peer starts accepting: repeated calls finish the handshake (SYN retried by the kernel) */
  int drained = accept(l, NULL, NULL);
  double t0 = now_ms();
  while (!sc && now_ms() - t0 < 10000) {
    if (net->connect(ctx, 0, handle, &sc, NULL) != ncclSuccess) break;
    usleep(2000);
  }
  CHECK(sc != NULL, "the handshake completes by repeated calls once the peer accepts (%.0f ms)", now_ms() - t0);
  int fd = accept(l, NULL, NULL);
  uint64_t nonce = 0;
  CHECK(fd >= 0 && recv(fd, &nonce, sizeof nonce, MSG_WAITALL) == sizeof nonce && nonce == 0x1122334455667788ull,
        "the connection carries the handle's nonce");
  if (sc) net->closeSend(sc);
  close(fd);
  close(drained);
  close(filler);
  close(l);
}

static void test_interleaved_handshake_in_one_thread(void) {
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void *lc = NULL, *sc = NULL, *rc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclSuccess, "listen");
  double t = now_ms();
  CHECK(net->accept(lc, &rc, NULL) == ncclSuccess && rc == NULL, "accept with no peer returns NULL");
  CHECK(now_ms() - t < FAST_MS, "... at once");
  /* a stray that never speaks and one with a wrong nonce must not be taken for the peer */
  ct_handle_t h;
  memcpy(&h, handle, sizeof h);
  int mute = socket(AF_INET, SOCK_STREAM, 0), liar = socket(AF_INET, SOCK_STREAM, 0);
  uint64_t wrong = h.nonce ^ 1;
  CHECK(connect(mute, (struct sockaddr*)&h.addr, sizeof h.addr) == 0 &&
            connect(liar, (struct sockaddr*)&h.addr, sizeof h.addr) == 0 &&
            send(liar, &wrong, sizeof wrong, 0) == sizeof wrong,
        "strays connected");
  double worst = 0;
  for (int i = 0; i < 100000 && (!sc || !rc); i++) {
    double t1 = now_ms();
    if (!sc && net->connect(ctx, 0, handle, &sc, NULL) != ncclSuccess) break;
    if (!rc && net->accept(lc, &rc, NULL) != ncclSuccess) break;
    double dt = now_ms() - t1;
    worst = dt > worst ? dt : worst;
  }
  CHECK(sc && rc, "connect and accept called in turn from one thread complete the connection");
  CHECK(worst < FAST_MS, "no call blocked (slowest pair %.2f ms)", worst);
  char byte = 0;
  struct pollfd p = {.fd = liar, .events = POLLIN};
  CHECK(poll(&p, 1, 2000) == 1 && recv(liar, &byte, 1, 0) == 0, "the stray with a wrong nonce is closed");
  if (sc && rc) {
    char msg[] = "hello", got[16] = {0};
    void *sreq = NULL, *rreq = NULL, *d = got, *mh = NULL;
    size_t cap = sizeof got;
    int tag = 0, sdone = 0, rdone = 0, size = 0;
    net->regMr(sc, msg, sizeof msg, NCCL_PTR_HOST, &mh);
    net->irecv(rc, 1, &d, &cap, &tag, &mh, NULL, &rreq);
    net->isend(sc, msg, sizeof msg, 0, mh, NULL, &sreq);
    for (int i = 0; i < 1000000 && (!sdone || !rdone); i++) {
      if (!sdone) net->test(sreq, &sdone, NULL);
      if (!rdone) net->test(rreq, &rdone, &size);
    }
    CHECK(rdone && size == (int)sizeof msg && !strcmp(got, "hello"), "the accepted comm is the real peer's");
    net->closeSend(sc);
    net->closeRecv(rc);
  }
  net->closeListen(lc);
  close(mute);
  close(liar);
}

static void test_refused_then_timeout(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int s = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t len = sizeof a;
  bind(s, (struct sockaddr*)&a, sizeof a);
  getsockname(s, (struct sockaddr*)&a, &len);
  close(s);   /* nobody listens there: connections are refused */
  setenv("CLUSTERTOOL_CONNECT_TIMEOUT_MS", "300", 1);
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  forge(handle, &a, 7);
  void* sc = NULL;
  ncclResult_t r = ncclSuccess;
  double t0 = now_ms(), worst = 0;
  int calls = 0;
  while (r == ncclSuccess && now_ms() - t0 < 5000) {
    double t = now_ms();
    r = net->connect(ctx, 0, handle, &sc, NULL);
    worst = now_ms() - t > worst ? now_ms() - t : worst;
    calls++;
    usleep(1000);
  }
  double total = now_ms() - t0;
  CHECK(r != ncclSuccess && sc == NULL, "a peer that keeps refusing is an error in the end");
  CHECK(total >= 250 && total < 2000, "... after CLUSTERTOOL_CONNECT_TIMEOUT_MS (%.0f ms)", total);
  CHECK(calls > 10 && worst < FAST_MS, "... reached over %d quick calls (slowest %.2f ms), not one long wait", calls,
        worst);
  unsetenv("CLUSTERTOOL_CONNECT_TIMEOUT_MS");
}

/* The older ABI versions share the implementation: v6 (no device handle) too. */
static void test_old_version_connect(void* lib) {
  const ncclNet_v6_t* v6 = dlsym(lib, "ncclNetPlugin_v6");
  CHECK(v6 && v6->init(NULL) == ncclSuccess, "v6 init");
  if (!v6) return;
  struct sockaddr_in a;
  int filler = -1, l = full_listener(&a, &filler);
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  forge(handle, &a, 9);
  void* sc = (void*)1;
  double t = now_ms();
  CHECK(v6->connect(0, handle, &sc) == ncclSuccess && sc == NULL && now_ms() - t < FAST_MS,
        "v6 connect to a peer not accepting returns NULL at once");
  close(filler);
  close(l);
}

int main(int argc, char** argv) {
  char p[512];
  snprintf(p, sizeof p, "%s/libnccl-net-clustertool.so", argc > 1 ? argv[1] : "build");
  setenv("CLUSTERTOOL_SOCKET_ADDR", "127.0.0.1", 1);
  setenv("CLUSTERTOOL_OFI_LIB", "/nonexistent/libnccl-net-ofi.so", 1);
  void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  net = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
  CHECK(net && net->init(&ctx, 1, NULL, NULL, NULL) == ncclSuccess, "load and init %s", p);
  if (!net) return CT_SUMMARY();
  test_connect_to_a_peer_not_accepting();
  test_interleaved_handshake_in_one_thread();
  test_refused_then_timeout();
  test_old_version_connect(lib);
  net->finalize(ctx);
  return CT_SUMMARY();
}

/* CollNet engine, the API side: mesh setup, posting collectives into the window,
 * test() (atomics only) and close. The progress thread is in ct_coll_engine.c. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_reduce.h"
#include "ct_reducer_proto.h"

typedef struct { uint32_t magic, rank, sock, pad; uint64_t nonce; } ct_hello_t;

/* ns sockets per peer pair into fds[peer * ns + s] (every lane's: lane l has s in [l*nsocks, (l+1)*nsocks)). */
static int mesh(ct_coll_t* c, int* fds, int ns, ct_handle_t* const* handles, int lfd, int tmo) {
  int rank = c->rank, nranks = c->nranks;
  /* Lower rank connects to higher; the kernel completes these against the
   * listen backlog, so accepting afterwards cannot deadlock. */
  for (int p = rank + 1; p < nranks; p++) {
    for (int s = 0; s < ns; s++) {
      int fd = ct_connect_socket(&handles[p]->addr, tmo);
      ct_hello_t h = {CT_HANDLE_MAGIC, (uint32_t)rank, (uint32_t)s, 0, handles[p]->nonce};
      if (fd < 0 || ct_send_all(fd, &h, sizeof h)) { if (fd >= 0) close(fd); return -1; }
      fds[p * ns + s] = fd;
    }
  }
  for (int need = rank * ns; need > 0;) {
    int fd = ct_accept_timeout(lfd, tmo);
    ct_hello_t h;
    if (fd < 0) { CT_WARN("rank %d: timed out waiting for %d connections", rank, need); return -1; }
    if (ct_recv_all(fd, &h, sizeof h) || h.magic != CT_HANDLE_MAGIC || h.nonce != handles[rank]->nonce ||
        h.rank >= (uint32_t)rank || h.sock >= (uint32_t)ns || fds[h.rank * (uint32_t)ns + h.sock] >= 0) {
      close(fd);  /* a stray or stale connection: ignore it */
      continue;
    }
    fds[h.rank * (uint32_t)ns + h.sock] = fd;
    need--;
  }
  return 0;
}

uint32_t ct_coll_threads_word(void) {
  long want = ct_env_long("CLUSTERTOOL_COLLNET_THREADS", 0, 0, CT_MAX_LANES);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cpus = CPU_COUNT(&set);
#endif
  if (cpus < 1) cpus = 1;
  if (cpus > 0xffffff) cpus = 0xffffff;
  return (uint32_t)want | (uint32_t)cpus << 8;
}

int ct_coll_lanes(ct_handle_t* const* handles, int nranks) {
  if (nranks < 2) return 1;
  int want = (int)(handles[0]->threads & 0xff), cpus = (int)(handles[0]->threads >> 8);
  if (want == 0) {   /* auto: half of rank 0's CPUs among the ranks that share its address (NCCL's proxy needs its own), */
    int local = 0;     /* at most 2 (each lane has its own sockets and staging; more is the setting's to ask) */
    for (int r = 0; r < nranks; r++) local += handles[r]->addr.sin_addr.s_addr == handles[0]->addr.sin_addr.s_addr;
    want = cpus / (2 * (local ? local : 1));
    if (want > 2) want = 2;
  }
  return want < 1 ? 1 : want > CT_MAX_LANES ? CT_MAX_LANES : want;
}

static ct_coll_t* coll_new(int rank, int nranks, ct_handle_t* h0, ct_coll_t* root, int lane) {
  ct_coll_t* c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rank = rank;
  c->nranks = nranks;
  c->algo = (int)h0->algo;              /* rank 0's settings win, so all agree */
  c->nsocks = (int)h0->nsocks;
  if (c->nsocks < 1 || c->nsocks > CT_MAX_SOCKS) c->nsocks = 1;
  c->chunk_cfg = h0->chunk_bytes;
  c->lockstep = h0->sched == 0;
  c->epfd = c->evfd = -1;
  c->root = root ? root : c;
  c->lane = lane;
  c->nlanes = 1;
  c->lanes[0] = c;
  pthread_mutex_init(&c->req_mu, NULL);
  c->fds = malloc((size_t)nranks * (size_t)c->nsocks * sizeof(int));
  if (!c->fds) { pthread_mutex_destroy(&c->req_mu); free(c); return NULL; }
  for (int i = 0; i < nranks * c->nsocks; i++) c->fds[i] = -1;
  return c;
}

ct_coll_t* ct_coll_connect(ct_handle_t* const* handles, int nranks, int rank, int lfd) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return NULL;
  for (int r = 0; r < nranks; r++)
    if (handles[r]->magic != CT_HANDLE_MAGIC) { CT_WARN("bad collnet handle from rank %d", r); return NULL; }
  ct_coll_t* c = coll_new(rank, nranks, handles[0], NULL, 0);
  if (!c) return NULL;
  int K = ct_coll_lanes(handles, nranks), ns = c->nsocks, tot = ns * K;
  int* all = malloc((size_t)nranks * (size_t)tot * sizeof(int));
  if (!all) { ct_coll_close(c); return NULL; }
  for (int i = 0; i < nranks * tot; i++) all[i] = -1;
  for (int l = 1; l < K; l++) {
    if (!(c->lanes[l] = coll_new(rank, nranks, handles[0], c, l))) { free(all); ct_coll_close(c); return NULL; }
    c->nlanes = l + 1;
  }
  int tmo = (int)ct_env_long("CLUSTERTOOL_CONNECT_TIMEOUT_MS", 120000, 100, 3600000);
  int mrc = mesh(c, all, tot, handles, lfd, tmo);
  for (int p = 0; p < nranks; p++)   /* each lane owns its sockets (closed with it), even after a failed mesh */
    for (int l = 0; l < K; l++)
      for (int s = 0; s < ns; s++) c->lanes[l]->fds[p * ns + s] = all[p * tot + l * ns + s];
  free(all);
  if (mrc) goto fail;
  /* A small send buffer makes the lock-step order of phase-1 chunks (peer me+1, me+2, ...)
   * the order on the wire: every node talks to one peer at a time. */
  long sndbuf = ct_env_long("CLUSTERTOOL_SNDBUF", 128 * 1024, 0, 1L << 30);
  if (sndbuf > 0 && !getenv("CLUSTERTOOL_SOCKBUF")) {
    int b = (int)sndbuf;
    for (int l = 0; l < K; l++)
      for (int i = 0; i < nranks * ns; i++)
        if (c->lanes[l]->fds[i] >= 0) setsockopt(c->lanes[l]->fds[i], SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
  }
  if (ct_coll_settings(c, tmo)) {
    CT_WARN("rank %d: CollNet setup with rank 0 failed (%s)", rank, strerror(errno));
    goto fail;
  }
  for (int l = 1; l < K; l++) {   /* rank 0's settings, as lane 0 got them; no servers (they serve lane 0) */
    ct_coll_t* x = c->lanes[l];
    x->algo = c->algo == CT_ALGO_SERVERS ? CT_ALGO_SHARDED : c->algo;
    x->io_timeout_ms = c->io_timeout_ms;
    x->stage_slots = c->stage_slots;
    x->session = c->session;
  }
  for (int l = 0; l < K; l++)
    if (ct_engine_start(c->lanes[l])) { CT_WARN("rank %d: cannot start the CollNet progress thread", rank); goto fail; }
  CT_INFO("collnet rank %d/%d connected: algo=%s%s%s socks/peer=%d chunk=%zu window=%d stage=%d threads=%d%s", rank,
          nranks, ct_algo_name(c->algo), c->nserv ? " reducers=" : "",
          c->nserv ? ct_env_str("CLUSTERTOOL_REDUCERS", "(rank 0's)") : "", c->nsocks, c->chunk_cfg, c->W,
          c->stage_slots, K, c->nrules ? " (per-size collnet_algo rules from rank 0's tuner table)" : "");
  return c;
fail:
  ct_coll_close(c);
  return NULL;
}

static void lane_close(ct_coll_t* c) {
  size_t nfd = (size_t)c->nranks * (size_t)c->nsocks;
  for (size_t i = 0; i < nfd; i++)
    if (c->fds[i] >= 0) close(c->fds[i]);
  for (int i = 0; i < c->nreq_blocks; i++) free(c->req_blocks[i]);
  free(c->req_blocks);
  free(c->fds);
  pthread_mutex_destroy(&c->req_mu);
  free(c);
}

void ct_coll_close(ct_coll_t* c) {
  if (!c) return;
  for (int l = 0; l < c->nlanes; l++) ct_engine_join(c->lanes[l]);   /* every thread ends before any lane is freed */
  for (int l = 0; l < c->nlanes; l++) ct_engine_stop(c->lanes[l]);   /* frees the engines' memory */
  ct_stats_report(c);
  ct_servers_close(c);
  for (int l = 1; l < c->nlanes; l++) lane_close(c->lanes[l]);
  lane_close(c);
}

/* ---------------- requests (API threads only) ---------------- */
static ct_req_t* req_alloc(ct_coll_t* c) {
  pthread_mutex_lock(&c->req_mu);
  if (!c->req_free) {
    enum { N = 64 };
    ct_req_t* blk = calloc(N, sizeof *blk);
    void** blocks = blk ? realloc(c->req_blocks, sizeof(void*) * (size_t)(c->nreq_blocks + 1)) : NULL;
    if (!blocks) { free(blk); pthread_mutex_unlock(&c->req_mu); return NULL; }
    c->req_blocks = blocks;
    c->req_blocks[c->nreq_blocks++] = blk;
    for (int i = 0; i < N; i++) { blk[i].c = c; blk[i].next_free = c->req_free; c->req_free = &blk[i]; }
  }
  ct_req_t* r = c->req_free;
  c->req_free = r->next_free;
  pthread_mutex_unlock(&c->req_mu);
  return r;
}

static void req_release(ct_req_t* r) {
  ct_coll_t* c = r->c;
  pthread_mutex_lock(&c->req_mu);
  r->next_free = c->req_free;
  c->req_free = r;
  pthread_mutex_unlock(&c->req_mu);
}

int ct_coll_test(ct_req_t* r, size_t* bytes) {
  long long t0 = ct_now_ns();
  ct_coll_t* c = r->c->root;
  int st = atomic_load_explicit(&r->state, memory_order_acquire);
  if (st == CT_REQ_PENDING) {   /* no yield, no lock: NCCL's proxy yields by itself when a pass is idle */
    ct_hist_add(&c->stats.test, (uint64_t)(ct_now_ns() - t0));
    return 0;
  }
  if (bytes) *bytes = r->bytes;
  req_release(r);
  ct_hist_add(&c->stats.test, (uint64_t)(ct_now_ns() - t0));
  return st == CT_REQ_DONE ? 1 : -1;
}

/* A blocking caller (ct_allreduce: a training step's one allreduce at a time) sleeps until the progress
 * thread stores the request's final state, rather than waking every few microseconds to look: on a box
 * with few cores such polling took CPU from the progress threads and the reducers (make demo's training
 * ran 3-5 % slower than with the old engine, whose wait was a condition variable). waiters is set before
 * state is read again, and the progress thread reads waiters after storing state (both seq_cst), so one
 * of the two sees the other; FUTEX_WAIT sleeps only while state is still PENDING. The 50 ms bound is a
 * guard, not the mechanism. Elsewhere than Linux: short sleeps, as before. */
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
void ct_req_wake(ct_req_t* r) {
  syscall(SYS_futex, (int*)&r->state, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
static void req_sleep(ct_req_t* r) {
  atomic_store(&r->waiters, 1);
  if (atomic_load(&r->state) != CT_REQ_PENDING) return;
  struct timespec ts = {0, 50 * 1000 * 1000};
  syscall(SYS_futex, (int*)&r->state, FUTEX_WAIT_PRIVATE, CT_REQ_PENDING, &ts, NULL, 0);
}
#else
void ct_req_wake(ct_req_t* r) { (void)r; }
static void req_sleep(ct_req_t* r) {
  (void)r;
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}
#endif

int ct_coll_wait(ct_req_t* r, size_t* bytes) {
  for (int i = 0;; i++) {
    int s = ct_coll_test(r, bytes);
    if (s) return s > 0 ? 0 : -1;
    if (i < 64) { sched_yield(); continue; }
    req_sleep(r);
  }
}

/* ---------------- posting ---------------- */
/* Chunk size for an op: the configured chunk, smaller for large shards' pipelining
 * (at least 16 chunks per socket, not below 64 KiB); a multiple of the element size. */
static size_t op_chunk(const ct_coll_t* c, size_t maxlen, size_t esz) {
  size_t want = maxlen / (size_t)(16 * c->nsocks);
  if (want < 65536) want = 65536;
  size_t ch = c->chunk_cfg < want ? c->chunk_cfg : want;
  ch -= ch % esz;
  return ch ? ch : esz;
}

/* rank 0's collnet_algo rules by size, else the communicator's default */
static int pick_algo(const ct_coll_t* c, size_t bytes) {
  for (int i = 0; i < c->nrules; i++)
    if (bytes >= c->rules[i].min && bytes <= c->rules[i].max) return (int)c->rules[i].algo;
  return c->algo;
}

/* A free slot for the next collective in the lane it goes to, reset; NULL with *rc = 1
 * (window full) or -1. Requests go to the lanes in turn (every rank posts the same sequence,
 * so every rank picks the same lane); servers collectives to lane 0, which has the servers. */
static ct_op_t* op_claim(ct_coll_t* root, int kind, size_t esz, int algo, int* rc, ct_coll_t** lane) {
  if (ct_coll_failed(root)) { *rc = -1; return NULL; }
  algo = algo == CT_ALGO_SERVERS && (!root->nserv || kind != CT_KIND_ALLREDUCE) ? CT_ALGO_SHARDED : algo;
  ct_coll_t* c = *lane = algo == CT_ALGO_SERVERS ? root : root->lanes[root->rr % (uint64_t)root->nlanes];
  ct_op_t* op = &c->ops[c->next_seq & (uint64_t)(c->W - 1)];   /* nranks == 1: never leaves FREE */
  if (atomic_load_explicit(&op->state, memory_order_acquire) != CT_OP_FREE) { *rc = 1; return NULL; }
  size_t *off = op->off, *len = op->len;
  long* need = op->need;
  memset((char*)op + sizeof op->state, 0, sizeof *op - sizeof op->state);
  op->off = off;
  op->len = len;
  op->need = need;
  op->kind = kind;
  op->algo = algo;
  op->esz = esz;
  op->nparts = op->algo == CT_ALGO_SERVERS ? root->nserv : root->nranks;
  return op;
}

static void op_drop(ct_op_t* op) {
  for (int i = 0; i < 2; i++) { free(op->owned[i]); op->owned[i] = NULL; }
  free(op->scatter.addr);
  free(op->scatter.size);
  op->scatter.addr = NULL;
  op->scatter.size = NULL;
}

/* Layout done: chunk size, then hand the slot to the progress thread. */
static int op_publish(ct_coll_t* c, ct_op_t* op, ct_req_t** out) {
  size_t maxlen = 0;
  for (int r = 0; r < op->nparts; r++) maxlen = op->len[r] > maxlen ? op->len[r] : maxlen;
  op->chunk = op_chunk(c, maxlen, op->esz);
  if (op->algo == CT_ALGO_SERVERS && op->chunk > CT_RMAX_CHUNK) op->chunk = CT_RMAX_CHUNK - CT_RMAX_CHUNK % op->esz;
  op->maxch = (maxlen + op->chunk - 1) / op->chunk;
  if (op->algo == CT_ALGO_RING && op->kind == CT_KIND_REDUCESCATTER) {
    size_t tot = op->off[c->nranks - 1] + op->len[c->nranks - 1];
    if (!(op->acc = op->owned[1] = malloc(tot ? tot : 1))) { op_drop(op); return -1; }
  }
  ct_req_t* r = req_alloc(c);
  if (!r) { op_drop(op); return -1; }
  atomic_store_explicit(&r->state, CT_REQ_PENDING, memory_order_relaxed);
  atomic_store_explicit(&r->waiters, 0, memory_order_relaxed);
  r->bytes = op->total;
  ct_coll_t* root = c->root;
  atomic_fetch_add_explicit(&root->stats.requests, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&root->stats.bytes, op->total, memory_order_relaxed);
  root->nops++;
  root->nbytes += op->total;
  if (op->algo != CT_ALGO_SERVERS) root->rr++;   /* the next request goes to the next lane */
  *out = r;
  if (c->nranks == 1) {    /* done at once: the data was placed while building the op */
    for (int i = 0; i < op->scatter.n; i++) {
      memcpy(op->scatter.addr[i], op->p2_dst, op->scatter.size[i]);
      op->p2_dst += op->scatter.size[i];
    }
    op_drop(op);
    atomic_fetch_add_explicit(&root->stats.inflight_sum, 1, memory_order_relaxed);
    if (atomic_load(&root->stats.inflight_max) < 1) atomic_store(&root->stats.inflight_max, 1);
    ct_hist_add(&root->stats.post_to_done, 0);
    atomic_store_explicit(&r->state, CT_REQ_DONE, memory_order_release);
    return 0;
  }
  op->req = r;
  op->seq = c->next_seq++;
  op->t_post_ns = ct_now_ns();
  uint64_t inflight = atomic_fetch_add(&root->lanes_posted, 1) + 1 - atomic_load(&root->lanes_done);   /* every lane's */
  atomic_fetch_add_explicit(&root->stats.inflight_sum, inflight, memory_order_relaxed);
  if (inflight > atomic_load_explicit(&root->stats.inflight_max, memory_order_relaxed))
    atomic_store_explicit(&root->stats.inflight_max, inflight, memory_order_relaxed);
  atomic_store(&op->state, CT_OP_POSTED);       /* seq_cst: pairs with the thread's `sleeping` */
  if (atomic_load(&c->sleeping)) ct_engine_wake(c);
  return 0;
}

static void split_even(ct_op_t* op, int n, size_t count) {
  for (int r = 0; r < n; r++) {
    size_t lo = count * (size_t)r / (size_t)n, hi = count * (size_t)(r + 1) / (size_t)n;
    op->off[r] = lo * op->esz;
    op->len[r] = (hi - lo) * op->esz;
  }
}

int ct_coll_allreduce(ct_coll_t* c, const void* src, void* dst, size_t count, ncclDataType_t dt, ncclRedOp_t rop,
                      ct_req_t** req) {
  *req = NULL;
  if (!ct_reduce_supported(dt, rop)) return -1;
  size_t esz = ct_dtype_size(dt);
  int rc = 0;
  ct_coll_t* lane = NULL;
  ct_op_t* op = op_claim(c, CT_KIND_ALLREDUCE, esz, pick_algo(c, count * esz), &rc, &lane);
  if (!op) return rc;
  op->dt = dt;
  op->rop = rop;
  op->total = count * esz;
  split_even(op, op->nparts, count);
  op->has_p1 = op->has_p2 = 1;
  op->p1_src = src;
  op->p1_out = op->algo == CT_ALGO_SERVERS ? NULL : (char*)dst + op->off[c->rank];
  op->acc = dst;
  op->p2_src = op->p1_out;
  op->p2_dst = dst;
  if (c->nranks == 1 && src != dst) memcpy(dst, src, op->total);
  return op_publish(lane, op, req);
}

/* Window layout shared by reduce-scatter and allgather: rank r's block is
 * [r*bpr, (r+1)*bpr) of the global buffer; only [woff, woff+wbytes) moves. */
static void split_window(ct_op_t* op, int n, size_t bpr, size_t woff, size_t wbytes) {
  for (int r = 0; r < n; r++) {
    size_t lo = (size_t)r * bpr, hi = lo + bpr;
    if (lo < woff) lo = woff;
    if (hi > woff + wbytes) hi = woff + wbytes;
    op->off[r] = lo - woff < wbytes ? lo - woff : wbytes;
    op->len[r] = hi > lo ? hi - lo : 0;
  }
}

static const char* gather_parts(ct_op_t* op, int n, ncclNetSGE_v12_t* parts, size_t total) {
  if (n == 1) return parts[0].address;
  char* buf = op->owned[0] = malloc(total ? total : 1);
  if (!buf) return NULL;
  for (int i = 0, o = 0; i < n; o += (int)parts[i].size, i++) memcpy(buf + o, parts[i].address, parts[i].size);
  return buf;
}

int ct_coll_reducescatter(ct_coll_t* c, int nparts, ncclNetSGE_v12_t* parts, void* dst, size_t bpr, size_t woff,
                          size_t wbytes, ncclDataType_t dt, ncclRedOp_t rop, ct_req_t** req) {
  *req = NULL;
  if (!ct_reduce_supported(dt, rop) || nparts < 1) return -1;
  int rc = 0;
  ct_coll_t* lane = NULL;
  ct_op_t* op = op_claim(c, CT_KIND_REDUCESCATTER, ct_dtype_size(dt), c->algo, &rc, &lane);
  if (!op) return rc;
  op->dt = dt;
  op->rop = rop;
  op->total = wbytes;
  split_window(op, c->nranks, bpr, woff, wbytes);
  op->has_p1 = 1;
  op->p1_src = gather_parts(op, nparts, parts, wbytes);
  op->p1_out = dst;
  if (!op->p1_src) { op_drop(op); return -1; }
  if (c->nranks == 1) memcpy(dst, op->p1_src + op->off[0], op->len[0]);
  return op_publish(lane, op, req);
}

int ct_coll_allgather(ct_coll_t* c, const void* src, int nparts, ncclNetSGE_v12_t* parts, size_t bpr, size_t woff,
                      size_t wbytes, ct_req_t** req) {
  *req = NULL;
  if (nparts < 1) return -1;
  int rc = 0;
  ct_coll_t* lane = NULL;
  ct_op_t* op = op_claim(c, CT_KIND_ALLGATHER, 1, c->algo, &rc, &lane);
  if (!op) return rc;
  op->dt = ncclUint8;
  op->total = wbytes;
  split_window(op, c->nranks, bpr, woff, wbytes);
  op->has_p2 = 1;
  op->p2_src = src;
  if (nparts == 1) {
    op->p2_dst = parts[0].address;
  } else {
    op->p2_dst = op->owned[0] = malloc(wbytes ? wbytes : 1);
    op->scatter.addr = malloc(sizeof(void*) * (size_t)nparts);
    op->scatter.size = malloc(sizeof(size_t) * (size_t)nparts);
    if (!op->p2_dst || !op->scatter.addr || !op->scatter.size) { op_drop(op); return -1; }
    op->scatter.n = nparts;
    for (int i = 0; i < nparts; i++) { op->scatter.addr[i] = parts[i].address; op->scatter.size[i] = parts[i].size; }
  }
  int me = c->rank;
  if (op->p2_dst + op->off[me] != (const char*)src) memcpy(op->p2_dst + op->off[me], src, op->len[me]);
  op->p2_src = op->p2_dst + op->off[me];
  return op_publish(lane, op, req);
}

/* CollNet engine: mesh setup, op construction, completion. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_reduce.h"
#include "ct_reducer_proto.h"

typedef struct { uint32_t magic, rank, sock, pad; uint64_t nonce; } ct_hello_t;

static int start_threads(ct_coll_t* c) {
  int n = c->nranks, ns = c->nsocks, k = c->nserv;
  if (n == 1) return 0; /* single rank: ops complete when posted */
  c->nthreads = 2 * (n - 1) * ns + 1 + (k ? 1 + k : 0);
  c->threads = calloc((size_t)c->nthreads, sizeof(pthread_t));
  c->workers = calloc((size_t)c->nthreads, sizeof(ct_worker_t));
  if (!c->threads || !c->workers) return -1;
  int i = 0;
  for (int p = 0; p < n; p++) {
    if (p == c->rank) continue;
    for (int s = 0; s < ns; s++)
      for (int role = 0; role < 2; role++) c->workers[i++] = (ct_worker_t){c, role, p, s, NULL, ""};
  }
  c->workers[i++] = (ct_worker_t){c, CT_ROLE_REDUCE, c->rank, 0, NULL, ""};
  if (k) {
    c->workers[i++] = (ct_worker_t){c, CT_ROLE_SSEND, 0, 0, NULL, ""};
    for (int s = 0; s < k; s++) c->workers[i++] = (ct_worker_t){c, CT_ROLE_SRECV, s, 0, NULL, ""};
  }
  int started = 0;
  for (i = 0; i < c->nthreads; i++) {
    int role = c->workers[i].role;
    if ((role == CT_ROLE_RECV || role == CT_ROLE_REDUCE) && !(c->workers[i].tmp = malloc(c->chunk_cfg))) break;
    if (pthread_create(&c->threads[i], NULL, ct_worker_main, &c->workers[i])) break;
    started++;
  }
  if (started < c->nthreads) {
    /* threads already running wait for ops; close() stops and joins them */
    for (int j = started; j < c->nthreads; j++) free(c->workers[j].tmp), c->workers[j].tmp = NULL;
    c->nthreads = started;
    return -1;
  }
  return 0;
}

ct_coll_t* ct_coll_connect(ct_handle_t* const* handles, int nranks, int rank, int lfd) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return NULL;
  for (int r = 0; r < nranks; r++)
    if (handles[r]->magic != CT_HANDLE_MAGIC) { CT_WARN("bad collnet handle from rank %d", r); return NULL; }
  ct_coll_t* c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rank = rank;
  c->nranks = nranks;
  c->algo = (int)handles[0]->algo;              /* rank 0's settings win, so all agree */
  c->nsocks = (int)handles[0]->nsocks;
  c->chunk_cfg = handles[0]->chunk_bytes;
  c->lockstep = handles[0]->sched == 0;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  size_t nfd = (size_t)nranks * (size_t)c->nsocks;
  c->fds = malloc(nfd * sizeof(int));
  if (!c->fds) { free(c); return NULL; }
  for (size_t i = 0; i < nfd; i++) c->fds[i] = -1;
  int tmo = (int)ct_env_long("CLUSTERTOOL_CONNECT_TIMEOUT_MS", 120000, 100, 3600000);
  /* Lower rank connects to higher; the kernel completes these against the
   * listen backlog, so accepting afterwards cannot deadlock. */
  for (int p = rank + 1; p < nranks; p++) {
    for (int s = 0; s < c->nsocks; s++) {
      int fd = ct_connect_socket(&handles[p]->addr, tmo);
      ct_hello_t h = {CT_HANDLE_MAGIC, (uint32_t)rank, (uint32_t)s, 0, handles[p]->nonce};
      if (fd < 0 || ct_send_all(fd, &h, sizeof h)) { if (fd >= 0) close(fd); goto fail; }
      c->fds[p * c->nsocks + s] = fd;
    }
  }
  for (int need = rank * c->nsocks; need > 0;) {
    int fd = ct_accept_timeout(lfd, tmo);
    ct_hello_t h;
    if (fd < 0) { CT_WARN("rank %d: timed out waiting for %d connections", rank, need); goto fail; }
    if (ct_recv_all(fd, &h, sizeof h) || h.magic != CT_HANDLE_MAGIC || h.nonce != handles[rank]->nonce ||
        h.rank >= (uint32_t)rank || h.sock >= (uint32_t)c->nsocks || c->fds[h.rank * (uint32_t)c->nsocks + h.sock] >= 0) {
      close(fd);  /* a stray or stale connection: ignore it */
      continue;
    }
    c->fds[h.rank * (uint32_t)c->nsocks + h.sock] = fd;
    need--;
  }
  /* A small send buffer makes send() return only as the data leaves, so the
   * lock-step order (peer me+1, me+2, ...) is the order on the wire: every node
   * talks to one peer at a time and no receiver is flooded by all at once. */
  long sndbuf = ct_env_long("CLUSTERTOOL_SNDBUF", 128 * 1024, 0, 1L << 30);
  if (sndbuf > 0 && !getenv("CLUSTERTOOL_SOCKBUF")) {
    int b = (int)sndbuf;
    for (size_t i = 0; i < nfd; i++)
      if (c->fds[i] >= 0) setsockopt(c->fds[i], SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
  }
  if (ct_coll_settings(c, tmo)) {
    CT_WARN("rank %d: CollNet setup with rank 0 failed (%s)", rank, strerror(errno));
    goto fail;
  }
  if (start_threads(c)) goto fail;
  CT_INFO("collnet rank %d/%d connected: algo=%s%s%s socks/peer=%d chunk=%zu%s", rank, nranks, ct_algo_name(c->algo),
          c->nserv ? " reducers=" : "", c->nserv ? ct_env_str("CLUSTERTOOL_REDUCERS", "(rank 0's)") : "", c->nsocks,
          c->chunk_cfg, c->nrules ? " (per-size collnet_algo rules from rank 0's tuner table)" : "");
  return c;
fail:
  ct_coll_close(c);
  return NULL;
}

void ct_coll_close(ct_coll_t* c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->shutdown = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  size_t nfd = (size_t)c->nranks * (size_t)c->nsocks;
  for (size_t i = 0; i < nfd; i++)
    if (c->fds[i] >= 0) shutdown(c->fds[i], SHUT_RDWR);
  for (int s = 0; s < c->nserv; s++)
    if (c->sfds[s] >= 0) shutdown(c->sfds[s], SHUT_RDWR);
  for (int i = 0; i < c->nthreads; i++) pthread_join(c->threads[i], NULL);
  for (size_t i = 0; i < nfd; i++)
    if (c->fds[i] >= 0) close(c->fds[i]);
  ct_servers_close(c);
  if (c->workers)
    for (int i = 0; i < c->nthreads; i++) free(c->workers[i].tmp);
  while (c->head) {
    ct_op_t* op = c->head;
    c->head = op->next;
    ct_op_free(op);
  }
  free(c->workers);
  free(c->threads);
  free(c->fds);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

/* Chunk size for an op: the configured chunk, smaller for small shards so each
 * socket still sees a few chunks to pipeline; a multiple of the element size. */
static size_t op_chunk(const ct_coll_t* c, size_t maxlen, size_t esz) {
  size_t want = maxlen / (size_t)(16 * c->nsocks);
  if (want < 65536) want = 65536;
  size_t ch = c->chunk_cfg < want ? c->chunk_cfg : want;
  ch -= ch % esz;
  return ch ? ch : esz;
}

/* Common part: layout arrays, progress arrays, queueing. The algorithm: servers only
 * for allreduce (and only while the servers are up), the default otherwise. */
static ct_op_t* op_new(ct_coll_t* c, int kind, size_t esz, int algo) {
  ct_op_t* op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->kind = kind;
  op->algo = algo == CT_ALGO_SERVERS && (!c->nserv || kind != CT_KIND_ALLREDUCE) ? CT_ALGO_SHARDED : algo;
  op->esz = esz;
  op->nparts = op->algo == CT_ALGO_SERVERS ? c->nserv : c->nranks;
  op->off = calloc((size_t)op->nparts, sizeof(size_t));
  op->len = calloc((size_t)op->nparts, sizeof(size_t));
  if (!op->off || !op->len) { ct_op_free(op); return NULL; }
  return op;
}

static int op_prepare(ct_coll_t* c, ct_op_t* op) {
  int n = c->nranks, me = c->rank;
  size_t maxlen = 0;
  for (int r = 0; r < op->nparts; r++) maxlen = op->len[r] > maxlen ? op->len[r] : maxlen;
  op->chunk = op_chunk(c, maxlen, op->esz);
  if (op->algo == CT_ALGO_SERVERS && op->chunk > CT_RMAX_CHUNK) op->chunk = CT_RMAX_CHUNK - CT_RMAX_CHUNK % op->esz;
  op->maxch = (int)((maxlen + op->chunk - 1) / op->chunk) + 1;
  if (op->algo == CT_ALGO_SERVERS) {
    /* nothing staged: chunks go from the source and come back into the result */
  } else if (op->algo == CT_ALGO_RING) {
    op->nsteps = (op->has_p1 ? n - 1 : 0) + (op->has_p2 ? n - 1 : 0);
    op->recvd = calloc((size_t)op->nsteps * (size_t)op->maxch + 1, 1);
    if (!op->recvd) return -1;
    if (op->has_p1 && !op->acc) {
      size_t tot = op->off[n - 1] + op->len[n - 1];
      if (!(op->acc = op->owned[2] = malloc(tot ? tot : 1))) return -1;
    }
  } else if (op->has_p1 && n > 1) {
    op->arrived = calloc((size_t)op->maxch, sizeof(int));
    op->stage = op->owned[2] = malloc((size_t)(n - 1) * op->len[me] + 1);
    if (!op->arrived || !op->stage) return -1;
  }
  return 0;
}

static void op_finish_local(ct_op_t* op) {
  for (int i = 0; i < op->scatter.n; i++) {
    memcpy(op->scatter.addr[i], op->scatter.from, op->scatter.size[i]);
    op->scatter.from += op->scatter.size[i];
  }
}

static ct_op_t* op_queue(ct_coll_t* c, ct_op_t* op) {
  if (op_prepare(c, op)) { ct_op_free(op); return NULL; }
  pthread_mutex_lock(&c->mu);
  op->seq = c->next_seq++;
  op->threads_left = c->nthreads;
  if (c->nranks == 1) op->done = 1;
  if (c->tail) c->tail->next = op; else c->head = op;
  c->tail = op;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return op;
}

static void split_even(ct_op_t* op, int n, size_t count) {
  for (int r = 0; r < n; r++) {
    size_t lo = count * (size_t)r / (size_t)n, hi = count * (size_t)(r + 1) / (size_t)n;
    op->off[r] = lo * op->esz;
    op->len[r] = (hi - lo) * op->esz;
  }
}

/* rank 0's collnet_algo rules by size, else the communicator's default */
static int pick_algo(const ct_coll_t* c, size_t bytes) {
  for (int i = 0; i < c->nrules; i++)
    if (bytes >= c->rules[i].min && bytes <= c->rules[i].max) return (int)c->rules[i].algo;
  return c->algo;
}

ct_op_t* ct_coll_allreduce(ct_coll_t* c, const void* src, void* dst, size_t count, ncclDataType_t dt,
                           ncclRedOp_t rop) {
  if (!ct_reduce_supported(dt, rop)) return NULL;
  size_t esz = ct_dtype_size(dt);
  ct_op_t* op = op_new(c, CT_KIND_ALLREDUCE, esz, pick_algo(c, count * esz));
  if (!op) return NULL;
  op->dt = dt;
  op->rop = rop;
  op->total = count * op->esz;
  split_even(op, op->nparts, count);
  op->has_p1 = op->has_p2 = 1;
  op->p1_src = src;
  op->p1_out = op->algo == CT_ALGO_SERVERS ? NULL : (char*)dst + op->off[c->rank];
  op->acc = dst;
  op->p2_src = op->p1_out;
  op->p2_dst = dst;
  if (c->nranks == 1 && src != dst) memcpy(dst, src, op->total);
  return op_queue(c, op);
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

ct_op_t* ct_coll_reducescatter(ct_coll_t* c, int nparts, ncclNetSGE_v12_t* parts, void* dst, size_t bpr,
                               size_t woff, size_t wbytes, ncclDataType_t dt, ncclRedOp_t rop) {
  if (!ct_reduce_supported(dt, rop) || nparts < 1) return NULL;
  ct_op_t* op = op_new(c, CT_KIND_REDUCESCATTER, ct_dtype_size(dt), c->algo);
  if (!op) return NULL;
  op->dt = dt;
  op->rop = rop;
  op->total = wbytes;
  split_window(op, c->nranks, bpr, woff, wbytes);
  op->has_p1 = 1;
  op->p1_src = gather_parts(op, nparts, parts, wbytes);
  op->p1_out = dst;
  if (!op->p1_src) { ct_op_free(op); return NULL; }
  if (c->nranks == 1) memcpy(dst, op->p1_src + op->off[0], op->len[0]);
  return op_queue(c, op);
}

ct_op_t* ct_coll_allgather(ct_coll_t* c, const void* src, int nparts, ncclNetSGE_v12_t* parts, size_t bpr,
                           size_t woff, size_t wbytes) {
  if (nparts < 1) return NULL;
  ct_op_t* op = op_new(c, CT_KIND_ALLGATHER, 1, c->algo);
  if (!op) return NULL;
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
    if (!op->p2_dst || !op->scatter.addr || !op->scatter.size) { ct_op_free(op); return NULL; }
    op->scatter.n = nparts;
    op->scatter.from = op->p2_dst;
    for (int i = 0; i < nparts; i++) { op->scatter.addr[i] = parts[i].address; op->scatter.size[i] = parts[i].size; }
  }
  int me = c->rank;
  if (op->p2_dst + op->off[me] != (const char*)src) memcpy(op->p2_dst + op->off[me], src, op->len[me]);
  return op_queue(c, op);
}

int ct_coll_test(ct_coll_t* c, ct_op_t* op, size_t* bytes) {
  pthread_mutex_lock(&c->mu);
  if (!op->done && !op->error && !c->error) {
    /* Callers poll test() in a tight loop; sleeping briefly on the progress
     * condition instead of spinning leaves the CPU to the worker threads. */
    static long wait_ns = -1;
    if (wait_ns < 0) wait_ns = 1000L * ct_env_long("CLUSTERTOOL_TEST_WAIT_US", 200, 0, 100000);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += wait_ns;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  }
  int done = op->done, err = op->error || c->error;
  if (done || err) {
    /* ops finish in order; unlink this one only when every thread is past it */
    if (!done) { pthread_mutex_unlock(&c->mu); return -1; }
    ct_op_t** pp = &c->head;
    while (*pp && *pp != op) pp = &(*pp)->next;
    if (*pp) *pp = op->next;
    if (c->tail == op) {
      c->tail = NULL;
      for (ct_op_t* o = c->head; o; o = o->next) c->tail = o;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (!done) return err ? -1 : 0;
  if (!err) op_finish_local(op);
  if (bytes) *bytes = op->total;
  ct_op_free(op);
  return err ? -1 : 1;
}

/* The CollNet progress thread: one per communicator, epoll over non-blocking sockets.
 * A pass: take newly posted collectives, read every readable socket (each message goes
 * straight to its place: the output, a staging slot or a ring buffer), run the sharded
 * reductions that became possible, let the generators queue more messages, write every
 * socket (phase 2 and ring traffic before phase 1), tell peers credits and posted counts,
 * check timeouts; sleep in epoll only when a pass did nothing. Every byte goes through
 * the process's pacer (ct_pace.h); a paced-out pass sleeps exactly the pacer's wait.
 * The first failure WARNs once (naming the peer or server) and fails the communicator. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_pace.h"

size_t ct_nch(const ct_op_t* op, size_t len) { return (len + op->chunk - 1) / op->chunk; }
size_t ct_clen(const ct_op_t* op, size_t len, size_t k) {
  size_t b = k * op->chunk;
  return len - b < op->chunk ? len - b : op->chunk;
}

uint64_t ct_seq_extend(uint64_t near, uint32_t v) { return near + (uint64_t)(int64_t)(int32_t)(v - (uint32_t)near); }

ct_op_t* ct_op_at(ct_coll_t* c, uint64_t seq) {
  if (seq >= c->activated) return NULL;
  ct_op_t* op = &c->ops[seq & (uint64_t)(c->W - 1)];
  return atomic_load_explicit(&op->state, memory_order_relaxed) == CT_OP_ACTIVE && op->seq == seq ? op : NULL;
}

static void op_release(ct_coll_t* c, ct_op_t* op, int state) {
  ct_req_t* r = op->req;
  if (!r) return;   /* released already (the communicator failed meanwhile) */
  if (op->gated == 1) c->gated_ring--;
  if (op->gated == 2) c->gated_all--;
  op->gated = 0;
  if (state == CT_REQ_DONE) {
    ct_hist_add(&c->root->stats.post_to_done, (uint64_t)(ct_now_ns() - op->t_post_ns));
    const char* from = op->p2_dst;
    for (int i = 0; i < op->scatter.n; i++) {
      memcpy(op->scatter.addr[i], from, op->scatter.size[i]);
      from += op->scatter.size[i];
    }
  }
  for (int i = 0; i < 2; i++) { free(op->owned[i]); op->owned[i] = NULL; }
  free(op->scatter.addr);
  free(op->scatter.size);
  op->scatter.addr = NULL;
  op->scatter.size = NULL;
  op->req = NULL;
  atomic_fetch_add_explicit(&c->ncompleted, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->root->lanes_done, 1, memory_order_relaxed);
  atomic_store_explicit(&op->state, CT_OP_FREE, memory_order_release);   /* the slot may be reused now */
  atomic_store(&r->state, state);
  if (atomic_load(&r->waiters)) ct_req_wake(r);   /* a blocking caller asleep on it (ct_coll_wait) */
}

void ct_op_step(ct_coll_t* c, ct_op_t* op) {
  if (!op->req) return;   /* failed and released */
  if (--op->pending == 0) op_release(c, op, CT_REQ_DONE);
}

/* ---------------- failure ---------------- */
static void shut_all(ct_coll_t* c) {
  for (int i = 0; i < c->nranks * c->nsocks; i++)
    if (c->socks[i].fd >= 0) shutdown(c->socks[i].fd, SHUT_RDWR);
  for (int k = 0; k < c->nserv; k++)
    if (c->ssocks[k].fd >= 0) shutdown(c->ssocks[k].fd, SHUT_RDWR);
}

static void fail_lane(ct_coll_t* c, const char* why) {
  if (why && !atomic_load(&c->shutdown)) CT_WARN("%s", why);
  atomic_store(&c->error, 1);
  ct_coll_t* root = c->root;
  /* The other lanes fail too (quietly: this WARN says why); set before any request reads
   * as failed, so a caller that saw one fail cannot post to another lane. */
  if (!atomic_exchange(&root->group_failed, 1))
    for (int l = 0; l < root->nlanes; l++)
      if (root->lanes[l] != c && root->lanes[l]->evfd >= 0) ct_engine_wake(root->lanes[l]);
  shut_all(c);   /* peers and servers see the end at once */
  for (int i = 0; i < c->W; i++)
    if (atomic_load_explicit(&c->ops[i].state, memory_order_relaxed) == CT_OP_ACTIVE)
      op_release(c, &c->ops[i], CT_REQ_ERROR);
}

void ct_fail(ct_coll_t* c, const char* fmt, ...) {
  if (atomic_load(&c->error)) return;
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  fail_lane(c, why);
}

/* ---------------- the loop ---------------- */
static int activate_posted(ct_coll_t* c) {
  int any = 0;
  for (;;) {
    ct_op_t* op = &c->ops[c->activated & (uint64_t)(c->W - 1)];
    if (atomic_load_explicit(&op->state, memory_order_acquire) != CT_OP_POSTED) break;
    atomic_store_explicit(&op->state, CT_OP_ACTIVE, memory_order_relaxed);
    c->activated++;
    any = 1;
    if (atomic_load(&c->error)) { op_release(c, op, CT_REQ_ERROR); continue; }
    op->pending = 0;
    op->gated = op->algo == CT_ALGO_RING ? 1 : op->algo == CT_ALGO_SHARDED && !op->has_p1 ? 2 : 0;
    if (op->gated == 1) c->gated_ring++;
    if (op->gated == 2) c->gated_all++;
    if (op->algo == CT_ALGO_SERVERS) ct_servers_activate(c, op);
    else ct_algo_activate(c, op);
    if (atomic_load(&c->error)) continue;
    if (op->pending == 0) { op_release(c, op, CT_REQ_DONE); continue; }
    for (int i = 0; i < c->nranks * c->nsocks + c->nserv; i++) {
      ct_sock_t* s = i < c->nranks * c->nsocks ? &c->socks[i] : &c->ssocks[i - c->nranks * c->nsocks];
      if (s->dead && ct_still_needed(c, s)) {
        char who[128];
        ct_fail(c, "rank %d: %s closed its connection (a collective still needs it)", c->rank,
                ct_peer_name(c, s, who, sizeof who));
        break;
      }
    }
  }
  return any;
}

static int hb_ms(const ct_coll_t* c) {
  int hb = c->io_timeout_ms / 4;
  return hb < 10 ? 10 : hb > 1000 ? 1000 : hb;
}

/* Credits, posted counts and heartbeats ride on the next header written to a peer; a
 * connection with nothing queued gets a control message. */
static void control(ct_coll_t* c, long now) {
  for (int i = 0; i < c->nranks * c->nsocks; i++) {
    ct_sock_t* s = &c->socks[i];
    if (s->fd < 0 || s->dead || s->hi.head || s->lo.head || s->ncur >= CT_MAX_BATCH) continue;
    int gated = c->gated_all || (c->gated_ring && s->peer == (c->rank + c->nranks - 1) % c->nranks);
    int need = s->s_used != s->credit_told || now - s->last_tx_ms >= hb_ms(c) ||
               (s->sidx == 0 && gated && c->posted_told_any[s->peer] != c->activated);
    if (!need) continue;
    if (ct_io_control(c, s)) return;
    if (s->sidx == 0) c->posted_told_any[s->peer] = c->activated;
  }
}

int ct_still_needed(ct_coll_t* c, ct_sock_t* s) {
  for (int i = 0; i < c->W; i++) {
    ct_op_t* op = &c->ops[i];
    if (atomic_load_explicit(&op->state, memory_order_relaxed) != CT_OP_ACTIVE) continue;
    if ((op->algo == CT_ALGO_SERVERS) == (s->server != 0) && op->need[s->peer] > 0) return 1;
  }
  return 0;
}

static void check_timeouts(ct_coll_t* c, long now) {
  int nm = c->nranks * c->nsocks;
  for (int i = 0; i < nm + c->nserv; i++) {
    ct_sock_t* s = i < nm ? &c->socks[i] : &c->ssocks[i - nm];
    if (s->fd < 0 || s->dead || now - s->last_rx_ms <= c->io_timeout_ms || !ct_still_needed(c, s)) continue;
    char who[128];
    if (s->server)
      ct_fail(c, "rank %d: %s: receive: no data for %d ms (io timeout)", c->rank, ct_peer_name(c, s, who, sizeof who),
              c->io_timeout_ms);
    else
      ct_fail(c, "rank %d: receive with peer %d failed (no data for %d ms: io timeout)", c->rank, s->peer,
              c->io_timeout_ms);
    return;
  }
}

static void* progress_main(void* arg) {
  ct_coll_t* c = arg;
  struct epoll_event evs[64];
  int busy = 1;
  long last_check = ct_now_ms();
  char name[16];
  snprintf(name, sizeof name, "ct-collnet-%d", c->lane);
  prctl(PR_SET_NAME, name, 0, 0, 0);   /* per-thread CPU in top -H / perf */
  while (!atomic_load(&c->shutdown)) {
    if (!atomic_load(&c->error) && atomic_load(&c->root->group_failed)) fail_lane(c, NULL);   /* another lane failed */
    if (atomic_load(&c->freeze)) {   /* test hook: held between passes, as by a long reduction */
      atomic_store(&c->frozen, 1);
      while (atomic_load(&c->freeze) && !atomic_load(&c->shutdown)) usleep(1000);
      atomic_store(&c->frozen, 0);
    }
    int n = 0;
    if (atomic_load(&c->error)) {
      /* failed: only posts to refuse until close */
      struct pollfd pf = {c->evfd, POLLIN, 0};
      atomic_store(&c->sleeping, 1);
      if (!activate_posted(c)) poll(&pf, 1, 100);
      atomic_store(&c->sleeping, 0);
      uint64_t v;
      if (read(c->evfd, &v, sizeof v) < 0) { /* nothing to drain */ }
      activate_posted(c);
      continue;
    }
    if (!busy && c->pace_wait_us > 0) {   /* paced out: sleep what the pacer said (a post wakes us) */
      struct pollfd pf = {c->evfd, POLLIN, 0};
      struct timespec ts = {c->pace_wait_us / 1000000, (c->pace_wait_us % 1000000) * 1000};
      atomic_store(&c->sleeping, 1);
      ct_op_t* next = &c->ops[c->activated & (uint64_t)(c->W - 1)];
      if (atomic_load(&next->state) != CT_OP_POSTED) ppoll(&pf, 1, &ts, NULL);
      atomic_store(&c->sleeping, 0);
      n = epoll_wait(c->epfd, evs, 64, 0);
    } else if (!busy) {
      atomic_store(&c->sleeping, 1);
      ct_op_t* next = &c->ops[c->activated & (uint64_t)(c->W - 1)];
      int tmo = atomic_load(&next->state) == CT_OP_POSTED ? 0 : hb_ms(c);
      n = epoll_wait(c->epfd, evs, 64, tmo);
      atomic_store(&c->sleeping, 0);
    } else {
      n = epoll_wait(c->epfd, evs, 64, 0);
    }
    c->pace_wait_us = 0;
    int progress = 0;
    for (int i = 0; i < n; i++) {
      ct_sock_t* s = evs[i].data.ptr;
      if (!s) { uint64_t v; if (read(c->evfd, &v, sizeof v) < 0) { /* drained */ } continue; }
      if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) s->readable = 1;
      if (evs[i].events & EPOLLOUT) s->blocked = 0;
    }
    progress |= activate_posted(c);
    int nm = c->nranks * c->nsocks;
    for (int i = 0; i < nm + c->nserv && !atomic_load(&c->error); i++) {
      ct_sock_t* s = i < nm ? &c->socks[i] : &c->ssocks[i - nm];
      if (!s->readable || s->fd < 0 || s->dead) continue;
      int r = ct_io_read(c, s);
      if (r > 0) progress = 1;
    }
    if (atomic_load(&c->error)) continue;
    progress |= ct_algo_reduce(c);
    for (int round = 0; round < 64 && !atomic_load(&c->error); round++) {
      int g = ct_io_unpark(c) | ct_algo_generate(c) | ct_servers_generate(c);
      int w = ct_io_write_all(c);
      if (!g && !w) break;
      progress = 1;
      if (c->pace_wait_us) break;
    }
    long now = ct_now_ms();
    if (!atomic_load(&c->error)) {
      control(c, now);
      if (ct_io_write_all(c)) progress = 1;
    }
    if (!progress && now - last_check >= 10) {
      last_check = now;
      check_timeouts(c, now);
    }
    busy = progress;
  }
  struct timespec cpu;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
    atomic_store(&c->cpu_ns, (long long)cpu.tv_sec * 1000000000LL + cpu.tv_nsec);
  return NULL;
}

void ct_engine_wake(ct_coll_t* c) {
  uint64_t one = 1;
  if (write(c->evfd, &one, sizeof one) < 0) { /* the counter is full: the thread is awake anyway */ }
}

static int pow2_at_least(long v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

static int sock_init(ct_coll_t* c, ct_sock_t* s, int fd, int peer, int sidx, int server) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->peer = peer;
  s->sidx = sidx;
  s->server = server;
  s->last_rx_ms = s->last_tx_ms = ct_now_ms();
  if (fd < 0) return 0;
  size_t tmp = server ? CT_RMAX_REASON + 1 : c->chunk_cfg;
  s->tmp = malloc(tmp);
  if (!s->tmp) return -1;
  if (!server) {
    s->stage = malloc((size_t)c->stage_slots * c->chunk_cfg);
    s->shdr = calloc((size_t)c->stage_slots, sizeof *s->shdr);
    if (!s->stage || !s->shdr) return -1;
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)) return -1;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = s};   /* edges only: no re-arming */
  s->readable = 1;
  return epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev);
}

int ct_engine_start(ct_coll_t* c) {
  c->W = pow2_at_least(ct_env_long("CLUSTERTOOL_COLLNET_WINDOW", 16, 1, 1024));
  int nparts = c->nranks > c->nserv ? c->nranks : c->nserv;
  c->ops = calloc((size_t)c->W, sizeof *c->ops);
  if (!c->ops) return -1;
  for (int i = 0; i < c->W; i++) {
    c->ops[i].off = calloc((size_t)nparts, sizeof(size_t));
    c->ops[i].len = calloc((size_t)nparts, sizeof(size_t));
    c->ops[i].need = calloc((size_t)nparts, sizeof(long));
    if (!c->ops[i].off || !c->ops[i].len || !c->ops[i].need) return -1;
  }
  if (c->nranks == 1) return 0;   /* ops complete when posted */
  int n = c->nranks, ns = c->nsocks;
  /* bytes being written at once, in configured chunks. Sharded phase 1 in lock-step order,
   * up to 4 chunks (on shaped links as good as 1; on a busy box more of the window moves
   * while one peer is slow to read); servers one chunk at a time (1 kept the ranks on
   * different servers best: 1.40 B against 1.31 B with 4, n = K = 4 at 200 Mbit/s). */
  c->depth = (size_t)ct_env_long("CLUSTERTOOL_COLLNET_DEPTH", c->lockstep ? 4 : 2L * (n - 1), 1, 1024) * c->chunk_cfg;
  c->sdepth = (size_t)ct_env_long("CLUSTERTOOL_SERVERS_DEPTH", 1, 1, 1024) * c->chunk_cfg;
  c->peer_posted = calloc((size_t)n, sizeof(uint64_t));
  c->posted_told_any = calloc((size_t)n, sizeof(uint64_t));
  c->srcs = calloc((size_t)n, sizeof(char*));
  c->scratch = malloc(CT_SCRATCH_BYTES);
  c->socks = calloc((size_t)n * (size_t)ns, sizeof *c->socks);
  c->ssocks = calloc((size_t)(c->nserv ? c->nserv : 1), sizeof *c->ssocks);
  c->epfd = epoll_create1(EPOLL_CLOEXEC);
  c->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!c->peer_posted || !c->posted_told_any || !c->srcs || !c->scratch || !c->socks || !c->ssocks || c->epfd < 0 ||
      c->evfd < 0)
    return -1;
  for (int p = 0; p < n; p++)
    for (int s = 0; s < ns; s++)
      if (sock_init(c, &c->socks[p * ns + s], p == c->rank ? -1 : c->fds[p * ns + s], p, s, 0)) return -1;
  for (int k = 0; k < c->nserv; k++)
    if (sock_init(c, &c->ssocks[k], c->sfds[k], k, 0, 1)) return -1;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->evfd, &ev)) return -1;
  for (int s = 0; s < ns; s++) c->p1gen[s] = (ct_gen_t){0, (size_t)s, 1, 0};
  if (pthread_create(&c->thread, NULL, progress_main, c)) return -1;
  c->thread_started = 1;
  return 0;
}

static void sock_free(ct_sock_t* s) {
  free(s->tmp);
  free(s->stage);
  free(s->shdr);
}

void ct_engine_join(ct_coll_t* c) {
  if (c->thread_started) {
    atomic_store(&c->shutdown, 1);
    ct_engine_wake(c);
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
  }
}

void ct_engine_stop(ct_coll_t* c) {
  ct_engine_join(c);
  int nm = c->socks ? c->nranks * c->nsocks : 0;
  for (int i = 0; i < nm; i++) sock_free(&c->socks[i]);
  for (int k = 0; c->ssocks && k < c->nserv; k++) sock_free(&c->ssocks[k]);
  for (int i = 0; c->ops && i < c->W; i++) {
    ct_op_t* op = &c->ops[i];
    if (atomic_load(&op->state) != CT_OP_FREE && op->req) op_release(c, op, CT_REQ_ERROR);
    free(op->off);
    free(op->len);
    free(op->need);
  }
  for (int i = 0; i < c->nout_blocks; i++) free(c->out_blocks[i]);
  free(c->out_blocks);
  free(c->ops);
  free(c->socks);
  free(c->ssocks);
  free(c->peer_posted);
  free(c->posted_told_any);
  free(c->srcs);
  free(c->scratch);
  if (c->epfd >= 0) close(c->epfd);
  if (c->evfd >= 0) close(c->evfd);
  c->ops = NULL;
  c->socks = c->ssocks = NULL;
  c->out_blocks = NULL;
  c->nout_blocks = 0;
}

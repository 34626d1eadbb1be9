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
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "ct_coll.h"
#include "ct_pace.h"

enum { READ_BUDGET = 4 << 20 };

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
    ct_hist_add(&c->stats.post_to_done, (uint64_t)(ct_now_ns() - op->t_post_ns));
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
  atomic_store_explicit(&op->state, CT_OP_FREE, memory_order_release);   /* the slot may be reused now */
  atomic_store_explicit(&r->state, state, memory_order_release);
}

void ct_op_step(ct_coll_t* c, ct_op_t* op) {
  if (!op->req) return;   /* failed and released */
  if (--op->pending == 0) op_release(c, op, CT_REQ_DONE);
}

/* ---------------- message descriptors ---------------- */
ct_out_t* ct_out_new(ct_coll_t* c) {
  if (!c->out_free) {
    enum { N = 256 };
    ct_out_t* blk = calloc(N, sizeof *blk);
    void** blocks = blk ? realloc(c->out_blocks, sizeof(void*) * (size_t)(c->nout_blocks + 1)) : NULL;
    if (!blocks) { free(blk); return NULL; }
    c->out_blocks = blocks;
    c->out_blocks[c->nout_blocks++] = blk;
    for (int i = 0; i < N; i++) { blk[i].next = c->out_free; c->out_free = &blk[i]; }
  }
  ct_out_t* o = c->out_free;
  c->out_free = o->next;
  memset(o, 0, sizeof *o);
  return o;
}

static void out_free(ct_coll_t* c, ct_out_t* o) {
  o->next = c->out_free;
  c->out_free = o;
}

static void q_push(ct_outq_t* q, ct_out_t* o) {
  o->next = NULL;
  if (q->tail) q->tail->next = o; else q->head = o;
  q->tail = o;
}

static ct_out_t* q_pop(ct_outq_t* q) {
  ct_out_t* o = q->head;
  if (o) { q->head = o->next; if (!q->head) q->tail = NULL; }
  return o;
}

ct_out_t* ct_msg_out(ct_coll_t* c, ct_op_t* op, int type, int step, size_t chunk, const char* p, size_t len) {
  ct_out_t* o = ct_out_new(c);
  if (!o) { ct_fail(c, "rank %d: out of memory for a message descriptor", c->rank); return NULL; }
  o->h.m = (ct_msg_t){CT_MSG_MAGIC, (uint8_t)type, 0, (uint16_t)step, (uint32_t)op->seq, (uint32_t)chunk,
                      (uint32_t)len, 0, 0, 0};
  o->hlen = sizeof(ct_msg_t);
  o->payload = p;
  o->plen = len;
  o->op = op;
  return o;
}

void ct_emit(ct_coll_t* c, ct_sock_t* s, ct_out_t* o, int lo) {
  if (!o) return;
  if (s->dead) {
    ct_fail(c, "rank %d: %s %d closed its connection (a collective still sends to it)", c->rank,
            s->server ? "reduction server" : "peer", s->server ? s->peer + 1 : s->peer);
    out_free(c, o);
    return;
  }
  if (!lo && !s->server && o->op && c->peer_posted[s->peer] <= o->op->seq) q_push(&s->park, o);
  else q_push(lo ? &s->lo : &s->hi, o);
}

/* Parked messages whose peer has posted their collective move to the hi queue, in order. */
static int unpark(ct_coll_t* c) {
  if (!c->posted_changed) return 0;
  c->posted_changed = 0;
  int moved = 0;
  for (int i = 0; i < c->nranks * c->nsocks; i++) {
    ct_sock_t* s = &c->socks[i];
    if (!s->park.head) continue;
    ct_outq_t keep = {NULL, NULL};
    for (ct_out_t* o; (o = q_pop(&s->park));) {
      if (c->peer_posted[s->peer] > o->op->seq) { q_push(&s->hi, o); moved = 1; }
      else q_push(&keep, o);
    }
    s->park = keep;
  }
  return moved;
}

/* ---------------- failure ---------------- */
static void shut_all(ct_coll_t* c) {
  for (int i = 0; i < c->nranks * c->nsocks; i++)
    if (c->socks[i].fd >= 0) shutdown(c->socks[i].fd, SHUT_RDWR);
  for (int k = 0; k < c->nserv; k++)
    if (c->ssocks[k].fd >= 0) shutdown(c->ssocks[k].fd, SHUT_RDWR);
}

void ct_fail(ct_coll_t* c, const char* fmt, ...) {
  if (atomic_load(&c->error)) return;
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (!atomic_load(&c->shutdown)) CT_WARN("%s", why);
  atomic_store(&c->error, 1);
  shut_all(c);   /* peers and servers see the end at once */
  for (int i = 0; i < c->W; i++)
    if (atomic_load_explicit(&c->ops[i].state, memory_order_relaxed) == CT_OP_ACTIVE)
      op_release(c, &c->ops[i], CT_REQ_ERROR);
}

static const char* peer_name(ct_coll_t* c, ct_sock_t* s, char* buf, size_t len) {
  if (s->server)
    snprintf(buf, len, "reduction server %s (server %d of %d)", c->saddr[s->peer], s->peer + 1, c->nserv);
  else
    snprintf(buf, len, "peer %d", s->peer);
  return buf;
}

static void io_fail(ct_coll_t* c, ct_sock_t* s, const char* what, int err) {
  char who[128];
  const char* why = err == EPIPE || err == ECONNRESET ? "connection closed" : strerror(err);
  if (s->server) ct_fail(c, "rank %d: %s: %s: %s", c->rank, peer_name(c, s, who, sizeof who), what, why);
  else ct_fail(c, "rank %d: %s with peer %d failed (%s)", c->rank, what, s->peer, why);
}

static int still_needed(ct_coll_t* c, ct_sock_t* s);

/* The peer closed its end owing us nothing: forget the connection (its queued control
 * messages go), fail later only if a collective needs it (ct_emit, activate_posted). */
static void sock_dead(ct_coll_t* c, ct_sock_t* s) {
  epoll_ctl(c->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  s->readable = 0;
  s->dead = 1;
  ct_outq_t* qs[3] = {&s->hi, &s->lo, &s->cur};
  for (int i = 0; i < 3; i++)
    for (ct_out_t* o; (o = q_pop(qs[i]));) out_free(c, o);
  s->ncur = 0;
}

/* ---------------- writing ---------------- */
static void out_done(ct_coll_t* c, ct_sock_t* s, ct_out_t* o) {
  if (o->gen) (s->server ? &c->sgen : &c->p1gen[s->sidx])->inflight -= o->plen;
  ct_op_t* op = o->op;
  out_free(c, o);
  if (op) ct_op_step(c, op);
}

enum { MAX_BATCH = 8 };

/* Start up to MAX_BATCH messages (hi before lo): their headers get the current credit
 * and posted count; they are then written in this order. */
static void start_more(ct_coll_t* c, ct_sock_t* s) {
  while (s->ncur < MAX_BATCH) {
    ct_out_t* o = q_pop(&s->hi);
    if (!o) o = q_pop(&s->lo);
    if (!o) return;
    if (!s->server) {
      o->h.m.credit = s->s_used;
      o->h.m.posted = (uint32_t)c->activated;
      s->credit_told = s->s_used;
      if (s->sidx == 0) c->posted_told_any[s->peer] = c->activated;
    }
    q_push(&s->cur, o);
    s->ncur++;
  }
}

/* 1 progress, 0 nothing (empty or blocked), -1 failed, -2 paced out. */
static int sock_write(ct_coll_t* c, ct_sock_t* s) {
  int progress = 0;
  while (!s->blocked) {
    start_more(c, s);
    if (!s->cur.head) break;
    size_t want = 0;
    for (ct_out_t* o = s->cur.head; o; o = o->next) want += o->hlen + o->plen - o->done;
    long wait = 0;
    size_t grant = ct_pace_take(CT_PACE_TX, want, &wait);
    if (!grant) { c->pace_wait_us = wait > 0 ? wait : 1; return progress ? 1 : -2; }
    struct iovec iov[2 * MAX_BATCH];
    int n = 0;
    size_t g = grant;
    for (ct_out_t* o = s->cur.head; o && g; o = o->next) {
      if (o->done < o->hlen) {
        size_t l = o->hlen - o->done < g ? o->hlen - o->done : g;
        iov[n++] = (struct iovec){(char*)&o->h + o->done, l};
        g -= l;
      }
      if (g && o->plen) {
        size_t po = o->done > o->hlen ? o->done - o->hlen : 0, l = o->plen - po < g ? o->plen - po : g;
        iov[n++] = (struct iovec){(char*)o->payload + po, l};
        g -= l;
      }
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r = sendmsg(s->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      int err = errno;
      ct_pace_refund(CT_PACE_TX, grant);
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) { s->blocked = 1; break; }
      int control_only = 1;
      for (ct_out_t* o = s->cur.head; o; o = o->next) control_only &= !o->op;
      if ((err == EPIPE || err == ECONNRESET) && control_only && !still_needed(c, s)) {
        sock_dead(c, s);   /* control messages to a peer that finished and closed */
        return progress;
      }
      io_fail(c, s, "send", err);
      return -1;
    }
    if ((size_t)r < grant) ct_pace_refund(CT_PACE_TX, grant - (size_t)r);
    atomic_fetch_add_explicit(&c->paced_tx, (uint64_t)r, memory_order_relaxed);
    s->last_tx_ms = ct_now_ms();
    progress = 1;
    size_t left = (size_t)r;
    while (left && s->cur.head) {
      ct_out_t* o = s->cur.head;
      size_t rest = o->hlen + o->plen - o->done, take = rest < left ? rest : left;
      o->done += take;
      left -= take;
      if (o->done < o->hlen + o->plen) break;
      q_pop(&s->cur);
      s->ncur--;
      out_done(c, s, o);
      if (atomic_load_explicit(&c->error, memory_order_relaxed)) return -1;
    }
    if ((size_t)r < grant) break;   /* the socket took less: its buffer is full */
  }
  return progress;
}

static int write_all(ct_coll_t* c) {
  int progress = 0, nm = c->nranks * c->nsocks;
  for (int i = 0; i < nm + c->nserv; i++) {
    ct_sock_t* s = i < nm ? &c->socks[i] : &c->ssocks[i - nm];
    if (s->fd < 0 || s->dead || s->blocked || (!s->cur.head && !s->hi.head && !s->lo.head)) continue;
    int r = sock_write(c, s);
    if (r == -1) return 1;
    if (r == -2) return progress;
    progress |= r;
  }
  return progress;
}

/* ---------------- reading ---------------- */
static int mesh_header(ct_coll_t* c, ct_sock_t* s) {
  ct_msg_t* h = &s->ih.m;
  if (h->magic != CT_MSG_MAGIC) {
    ct_fail(c, "rank %d: receive from peer %d failed (protocol error: bad magic)", c->rank, s->peer);
    return -1;
  }
  s->peer_used = h->credit;
  uint64_t posted = ct_seq_extend(c->peer_posted[s->peer], h->posted);
  if (posted > c->peer_posted[s->peer]) { c->peer_posted[s->peer] = posted; c->posted_changed = 1; }
  if (h->type == CT_M_CTRL) {
    if (h->len) { ct_fail(c, "rank %d: peer %d: control message with a payload", c->rank, s->peer); return -1; }
    return 0;
  }
  return ct_algo_header(c, s);
}


static int on_header(ct_coll_t* c, ct_sock_t* s) {
  s->ih_got = 0;
  s->ilen = s->igot = 0;
  s->idst = NULL;
  if ((s->server ? ct_servers_header(c, s) : mesh_header(c, s))) return -1;
  if (s->idst && s->ilen == 0) {   /* an empty payload is complete at once */
    s->idst = NULL;
    if ((s->server ? ct_servers_payload(c, s) : ct_algo_payload(c, s))) return -1;
  }
  return 0;
}

/* Reads until EAGAIN (then clears readable), the budget or the pacer stops it. A payload
 * is read together with the header after it (one recvmsg per message while data flows). */
static int sock_read(ct_coll_t* c, ct_sock_t* s) {
  int progress = 0;
  size_t budget = READ_BUDGET, hlen = s->server ? sizeof(ct_rmsg_t) : sizeof(ct_msg_t);
  while (budget) {
    struct iovec iov[2];
    int n = 0;
    if (s->idst) {
      iov[n++] = (struct iovec){s->idst + s->igot, s->ilen - s->igot};
      iov[n++] = (struct iovec){&s->inext, hlen};
    } else {
      iov[n++] = (struct iovec){(char*)&s->ih + s->ih_got, hlen - s->ih_got};
    }
    size_t want = iov[0].iov_len + (n > 1 ? iov[1].iov_len : 0);
    if (want > budget) want = budget;
    long wait = 0;
    size_t grant = ct_pace_take(CT_PACE_RX, want, &wait);
    if (!grant) { c->pace_wait_us = wait > 0 ? wait : 1; break; }
    if (iov[0].iov_len >= grant) { iov[0].iov_len = grant; n = 1; }
    else if (n > 1) iov[1].iov_len = grant - iov[0].iov_len;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r = recvmsg(s->fd, &m, MSG_DONTWAIT);
    if (r <= 0) {
      int err = r == 0 ? ECONNRESET : errno;
      ct_pace_refund(CT_PACE_RX, grant);
      if (r < 0 && err == EINTR) continue;
      if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK)) { s->readable = 0; break; }
      if ((r == 0 || err == ECONNRESET) && !s->idst && !s->ih_got && !still_needed(c, s)) {
        /* the peer closed at a message boundary and owes nothing: it finished; quiet
         * (ECONNRESET: it closed with our control messages unread) */
        sock_dead(c, s);
        return progress;
      }
      io_fail(c, s, "receive", err);
      return -1;
    }
    if ((size_t)r < grant) ct_pace_refund(CT_PACE_RX, grant - (size_t)r);
    atomic_fetch_add_explicit(&c->paced_rx, (uint64_t)r, memory_order_relaxed);
    budget -= (size_t)r;
    progress = 1;
    s->last_rx_ms = ct_now_ms();
    if (!s->idst) {
      s->ih_got += (size_t)r;
      if (s->ih_got == hlen && on_header(c, s)) return -1;
      continue;
    }
    size_t in_payload = s->ilen - s->igot < (size_t)r ? s->ilen - s->igot : (size_t)r;
    s->igot += in_payload;
    if (s->igot < s->ilen) continue;
    size_t extra = (size_t)r - in_payload;   /* bytes of the next header */
    s->idst = NULL;
    if ((s->server ? ct_servers_payload(c, s) : ct_algo_payload(c, s))) return -1;
    if (!extra) continue;
    memcpy(&s->ih, &s->inext, extra);
    s->ih_got = extra;
    if (extra == hlen && on_header(c, s)) return -1;
  }
  return progress;
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
      if (s->dead && still_needed(c, s)) {
        char who[128];
        ct_fail(c, "rank %d: %s closed its connection (a collective still needs it)", c->rank,
                peer_name(c, s, who, sizeof who));
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
    if (s->fd < 0 || s->dead || s->hi.head || s->lo.head || s->ncur >= MAX_BATCH) continue;
    int gated = c->gated_all || (c->gated_ring && s->peer == (c->rank + c->nranks - 1) % c->nranks);
    int need = s->s_used != s->credit_told || now - s->last_tx_ms >= hb_ms(c) ||
               (s->sidx == 0 && gated && c->posted_told_any[s->peer] != c->activated);
    if (!need) continue;
    ct_out_t* o = ct_out_new(c);
    if (!o) { ct_fail(c, "rank %d: out of memory for a control message", c->rank); return; }
    o->h.m = (ct_msg_t){CT_MSG_MAGIC, CT_M_CTRL, 0, 0, 0, 0, 0, 0, 0, 0};
    o->hlen = sizeof(ct_msg_t);
    q_push(&s->hi, o);
    if (s->sidx == 0) c->posted_told_any[s->peer] = c->activated;
  }
}

static int still_needed(ct_coll_t* c, ct_sock_t* s) {
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
    if (s->fd < 0 || s->dead || now - s->last_rx_ms <= c->io_timeout_ms || !still_needed(c, s)) continue;
    char who[128];
    if (s->server)
      ct_fail(c, "rank %d: %s: receive: no data for %d ms (io timeout)", c->rank, peer_name(c, s, who, sizeof who),
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
  while (!atomic_load(&c->shutdown)) {
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
      int r = sock_read(c, s);
      if (r > 0) progress = 1;
    }
    if (atomic_load(&c->error)) continue;
    progress |= ct_algo_reduce(c);
    for (int round = 0; round < 64 && !atomic_load(&c->error); round++) {
      int g = unpark(c) | ct_algo_generate(c) | ct_servers_generate(c);
      int w = write_all(c);
      if (!g && !w) break;
      progress = 1;
      if (c->pace_wait_us) break;
    }
    long now = ct_now_ms();
    if (!atomic_load(&c->error)) {
      control(c, now);
      if (write_all(c)) progress = 1;
    }
    if (!progress && now - last_check >= 10) {
      last_check = now;
      check_timeouts(c, now);
    }
    busy = progress;
  }
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
  long dflt_depth = c->lockstep ? 1 : 2L * (n - 1);
  /* in chunks of the configured size: lock-step writes one 256K chunk at a time, but batches
   * the small chunks of small requests */
  c->depth = (size_t)ct_env_long("CLUSTERTOOL_COLLNET_DEPTH", dflt_depth, 1, 1024) * c->chunk_cfg;
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

void ct_engine_stop(ct_coll_t* c) {
  if (c->thread_started) {
    atomic_store(&c->shutdown, 1);
    ct_engine_wake(c);
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
  }
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

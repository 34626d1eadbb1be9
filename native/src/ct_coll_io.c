/* The CollNet engine's I/O (ct_coll_engine.c runs it): message descriptors and the
 * per-connection queues, writing (several messages per sendmsg, through the pacer) and
 * reading (a payload together with the next header, through the pacer), and the
 * connection that closed quietly. Only the progress thread calls these. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "ct_coll.h"
#include "ct_pace.h"

enum { READ_BUDGET = 4 << 20 };

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
int ct_io_unpark(ct_coll_t* c) {
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

const char* ct_peer_name(ct_coll_t* c, ct_sock_t* s, char* buf, size_t len) {
  if (s->server)
    snprintf(buf, len, "reduction server %s (server %d of %d)", c->saddr[s->peer], s->peer + 1, c->nserv);
  else
    snprintf(buf, len, "peer %d", s->peer);
  return buf;
}

static void io_fail(ct_coll_t* c, ct_sock_t* s, const char* what, int err) {
  char who[128];
  const char* why = err == EPIPE || err == ECONNRESET ? "connection closed" : strerror(err);
  if (s->server) ct_fail(c, "rank %d: %s: %s: %s", c->rank, ct_peer_name(c, s, who, sizeof who), what, why);
  else ct_fail(c, "rank %d: %s with peer %d failed (%s)", c->rank, what, s->peer, why);
}


/* The peer closed its end owing us nothing: forget the connection (its queued control
 * messages go), fail later only if a collective needs it (ct_emit, activate_posted). */
void ct_sock_dead(ct_coll_t* c, ct_sock_t* s) {
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

/* Start up to CT_MAX_BATCH messages (hi before lo): their headers get the current credit
 * and posted count; they are then written in this order. */
static void start_more(ct_coll_t* c, ct_sock_t* s) {
  while (s->ncur < CT_MAX_BATCH) {
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
    struct iovec iov[2 * CT_MAX_BATCH];
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
      if ((err == EPIPE || err == ECONNRESET) && control_only && !ct_still_needed(c, s)) {
        ct_sock_dead(c, s);   /* control messages to a peer that finished and closed */
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

int ct_io_write_all(ct_coll_t* c) {
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
int ct_io_read(ct_coll_t* c, ct_sock_t* s) {
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
      if ((r == 0 || err == ECONNRESET) && !s->idst && !s->ih_got && !ct_still_needed(c, s)) {
        /* the peer closed at a message boundary and owes nothing: it finished; quiet
         * (ECONNRESET: it closed with our control messages unread) */
        ct_sock_dead(c, s);
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

/* A control message (credit, posted count, heartbeat: the header says it all) at the head of
 * the line. -1 when out of memory (the communicator has failed). */
int ct_io_control(ct_coll_t* c, ct_sock_t* s) {
  ct_out_t* o = ct_out_new(c);
  if (!o) { ct_fail(c, "rank %d: out of memory for a control message", c->rank); return -1; }
  o->h.m = (ct_msg_t){CT_MSG_MAGIC, CT_M_CTRL, 0, 0, 0, 0, 0, 0, 0, 0};
  o->hlen = sizeof(ct_msg_t);
  q_push(&s->hi, o);
  return 0;
}

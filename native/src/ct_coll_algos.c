/* The sharded and ring algorithms on the progress thread (ct_coll_engine.c drives them).
 *
 * sharded: phase 1, chunk k of shard p goes to rank p; a generator per socket index
 *   walks the posted collectives in order, chunk by chunk, peer me+1, me+2, ... (the
 *   lock-step order: with depth 1 every node sends to one peer at a time), each message
 *   only once the peer has posted the collective and has a free staging slot (credit).
 *   The owner reduces chunk k of its shard when every peer's chunk k is staged, in rank
 *   order 0..n-1, straight into the output, frees the slots and sends the result to
 *   everyone (phase 2, which lands directly in each rank's output).
 * ring: reduce-scatter then allgather over next/prev; every chunk moves on as soon as it
 *   arrives (a received partial sum is added to our own copy, then forwarded).
 * Any number of collectives are in flight; each message says (seq, step, chunk). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "ct_coll.h"
#include "ct_reduce.h"

enum { CT_MAX_BLOCK_SRCS = 64 };
static int mod(int a, int n) { return ((a % n) + n) % n; }
static ct_sock_t* sock_of(ct_coll_t* c, int peer, size_t k) { return &c->socks[peer * c->nsocks + (int)(k % (size_t)c->nsocks)]; }

/* ---------------- ring step geometry ----------------
 * Reduce-scatter step t (t < n-1): send segment me-t-1, receive me-t-2 and add our own
 * copy; the last step leaves segment `me` fully reduced. Allgather step j: send segment
 * me-j, receive me-j-1. */
static int ring_is_rs(const ct_op_t* op, int t) { return op->has_p1 && t < op->nsteps - (op->has_p2 ? op->nsteps / 2 : 0); }
static int ring_j(const ct_op_t* op, int t, int n) { return op->has_p1 ? t - (n - 1) : t; }
static int ring_send_seg(const ct_op_t* op, int t, int me, int n) {
  return ring_is_rs(op, t) ? mod(me - t - 1, n) : mod(me - ring_j(op, t, n), n);
}
static int ring_recv_seg(const ct_op_t* op, int t, int me, int n) {
  return ring_is_rs(op, t) ? mod(me - t - 2, n) : mod(me - ring_j(op, t, n) - 1, n);
}

/* The bytes that step t sends of segment seg (chunk k). */
static const char* ring_src(const ct_op_t* op, int t, int seg, size_t k) {
  const char* base;
  if (ring_is_rs(op, t)) base = t == 0 ? op->p1_src + op->off[seg] : op->acc + op->off[seg];
  else base = op->p2_dst + op->off[seg];
  return base + k * op->chunk;
}

static void ring_emit(ct_coll_t* c, ct_op_t* op, int t, int seg, size_t k) {
  int next = mod(c->rank + 1, c->nranks);
  ct_out_t* o = ct_msg_out(c, op, ring_is_rs(op, t) ? CT_M_RS : CT_M_AG, t, k, ring_src(op, t, seg, k),
                           ct_clen(op, op->len[seg], k));
  ct_emit(c, sock_of(c, next, k), o, 0);
}

static void ring_activate(ct_coll_t* c, ct_op_t* op) {
  int n = c->nranks, me = c->rank, prev = mod(me - 1, n);
  op->nsteps = (op->has_p1 ? n - 1 : 0) + (op->has_p2 ? n - 1 : 0);
  for (int t = 0; t < op->nsteps; t++) {
    size_t in = ct_nch(op, op->len[ring_recv_seg(op, t, me, n)]);
    op->pending += (long)(ct_nch(op, op->len[ring_send_seg(op, t, me, n)]) + in);
    op->need[prev] += (long)in;
  }
  if (!op->nsteps) return;
  int seg = ring_send_seg(op, 0, me, n);
  for (size_t k = 0; k < ct_nch(op, op->len[seg]); k++) ring_emit(c, op, 0, seg, k);
}

static void sharded_activate(ct_coll_t* c, ct_op_t* op) {
  int n = c->nranks, me = c->rank;
  size_t mine = ct_nch(op, op->len[me]);
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    size_t theirs = ct_nch(op, op->len[p]);
    if (op->has_p1) { op->pending += (long)(theirs + mine); op->need[p] += (long)mine; }   /* P1 out, reduce, P1 in */
    if (op->has_p2) { op->pending += (long)(mine + theirs); op->need[p] += (long)theirs; } /* P2 out and in */
  }
  if (op->has_p1) op->pending -= (long)(n - 2) * (long)mine;   /* one reduction per chunk, not per peer */
  if (op->has_p2 && !op->has_p1)   /* allgather: my shard goes out at once (parked until each peer posted) */
    for (size_t k = 0; k < mine; k++)
      for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        ct_emit(c, sock_of(c, p, k), ct_msg_out(c, op, CT_M_P2, 2, k, op->p2_src + k * op->chunk, ct_clen(op, op->len[me], k)), 0);
      }
}

void ct_algo_activate(ct_coll_t* c, ct_op_t* op) {
  if (op->algo == CT_ALGO_RING) ring_activate(c, op);
  else sharded_activate(c, op);
}

/* Phase-1 generators, one per socket index: in order of collective, chunk, peer. Phase 1
 * does not wait for the peer's post: its staging takes it (credits), and since every
 * connection carries phase-1 chunks in the order the owner reduces them, the earliest
 * chunk not yet reduced anywhere always has its inputs on their way. */
int ct_algo_generate(ct_coll_t* c) {
  int n = c->nranks, me = c->rank, ns = c->nsocks, any = 0;
  for (int sidx = 0; sidx < ns; sidx++) {
    ct_gen_t* g = &c->p1gen[sidx];
    while (g->inflight < c->depth) {   /* bytes: one 256K chunk, or several small ones (a sendmsg each batch) */
      if (g->seq >= c->activated) break;
      ct_op_t* op = ct_op_at(c, g->seq);
      if (!op || op->algo != CT_ALGO_SHARDED || !op->has_p1 || g->c >= op->maxch) {
        g->seq++;
        g->c = (size_t)sidx;
        g->j = 1;
        continue;
      }
      int p = (me + g->j) % n;
      if (g->c < ct_nch(op, op->len[p])) {
        ct_sock_t* s = &c->socks[p * ns + sidx];
        if ((uint32_t)(s->tx_p1 - s->peer_used) >= (uint32_t)c->stage_slots) break;   /* no credit */
        ct_out_t* o = ct_msg_out(c, op, CT_M_P1, 1, g->c, op->p1_src + op->off[p] + g->c * op->chunk,
                                 ct_clen(op, op->len[p], g->c));
        if (!o) return 1;
        o->gen = 1;
        s->tx_p1++;
        g->inflight += o->plen;
        ct_emit(c, s, o, 1);
        any = 1;
      }
      if (++g->j == n) { g->j = 1; g->c += (size_t)ns; }
    }
  }
  return any;
}

/* out = srcs[0] (op) srcs[1] (op) ... in rank order, in one pass (ct_reduce_multi). When
 * out is my own input (in place) and I am not rank 0 or 1, a pass would overwrite it
 * before its turn: go through the scratch buffer a block at a time. */
static void reduce_chunk(ct_coll_t* c, const ct_op_t* op, char* out, size_t bytes) {
  int n = c->nranks, me = c->rank;
  const char** s = c->srcs;
  int alias = me >= 2 && out < s[me] + bytes && s[me] < out + bytes;
  if (!alias) {
    ct_reduce_multi(out, (const void* const*)s, n, bytes / op->esz, op->dt, op->rop);
    return;
  }
  size_t blk = CT_SCRATCH_BYTES - CT_SCRATCH_BYTES % op->esz;
  const void* bs[CT_MAX_BLOCK_SRCS];
  for (size_t o = 0; o < bytes; o += blk) {
    size_t l = bytes - o < blk ? bytes - o : blk;
    if (n <= CT_MAX_BLOCK_SRCS) {
      for (int r = 0; r < n; r++) bs[r] = s[r] + o;
      ct_reduce_multi(c->scratch, bs, n, l / op->esz, op->dt, op->rop);
    } else {
      ct_reduce(c->scratch, s[0] + o, s[1] + o, l / op->esz, op->dt, op->rop);
      for (int r = 2; r < n; r++) ct_reduce(c->scratch, c->scratch, s[r] + o, l / op->esz, op->dt, op->rop);
    }
    memcpy(out + o, c->scratch, l);
  }
}

int ct_algo_reduce(ct_coll_t* c) {
  int n = c->nranks, me = c->rank, ns = c->nsocks, any = 0;
  uint32_t T = (uint32_t)c->stage_slots;
  for (;;) {
    if (c->red_seq >= c->activated) return any;
    ct_op_t* op = ct_op_at(c, c->red_seq);
    if (!op || op->algo != CT_ALGO_SHARDED || !op->has_p1 || c->red_c >= ct_nch(op, op->len[me])) {
      c->red_seq++;
      c->red_c = 0;
      continue;
    }
    size_t k = c->red_c, b = k * op->chunk, l = ct_clen(op, op->len[me], k);
    for (int p = 0; p < n; p++) {
      if (p == me) { c->srcs[p] = op->p1_src + op->off[me] + b; continue; }
      ct_sock_t* s = sock_of(c, p, k);
      if (s->s_recvd == s->s_used) return any;   /* not here yet */
      const ct_msg_t* h = &s->shdr[s->s_used % T];
      if (h->seq != (uint32_t)op->seq || h->chunk != (uint32_t)k || h->len != l) {
        ct_fail(c, "rank %d: receive from peer %d failed (protocol error: phase-1 chunk %u of collective %u, "
                "expected %zu of %u)", me, p, h->chunk, h->seq, k, (uint32_t)op->seq);
        return 1;
      }
      c->srcs[p] = s->stage + (size_t)(s->s_used % T) * c->chunk_cfg;
    }
    reduce_chunk(c, op, op->p1_out + b, l);
    for (int p = 0; p < n; p++)
      if (p != me) { sock_of(c, p, k)->s_used++; op->need[p]--; }
    if (op->has_p2)
      for (int j = 1; j < n; j++) {
        int p = (me + j) % n;
        ct_emit(c, sock_of(c, p, k), ct_msg_out(c, op, CT_M_P2, 2, k, op->p2_src + b, l), 0);
      }
    c->red_c++;
    any = 1;
    ct_op_step(c, op);   /* last: may complete the op */
    (void)ns;
  }
}

static int proto(ct_coll_t* c, ct_sock_t* s, const char* what) {
  const ct_msg_t* h = &s->ih.m;
  ct_fail(c, "rank %d: receive from peer %d failed (protocol error: %s; type %u step %u seq %u chunk %u len %u)",
          c->rank, s->peer, what, h->type, h->step, h->seq, h->chunk, h->len);
  return -1;
}

int ct_algo_header(ct_coll_t* c, ct_sock_t* s) {
  const ct_msg_t* h = &s->ih.m;
  int n = c->nranks, me = c->rank;
  size_t k = h->chunk;
  if (k % (size_t)c->nsocks != (size_t)s->sidx) return proto(c, s, "chunk on the wrong socket");
  if (h->type == CT_M_P1) {   /* maybe for a collective not posted here yet: checked when reduced */
    if (h->step != 1 || h->len == 0 || h->len > c->chunk_cfg) return proto(c, s, "bad phase-1 chunk");
    if (s->s_in - s->s_used >= (uint32_t)c->stage_slots) return proto(c, s, "phase-1 chunk without credit");
    uint32_t slot = s->s_in++ % (uint32_t)c->stage_slots;
    s->shdr[slot] = *h;
    s->idst = s->stage + (size_t)slot * c->chunk_cfg;
    s->ilen = h->len;
    return 0;
  }
  ct_op_t* op = ct_op_at(c, ct_seq_extend(c->activated, h->seq));
  if (!op) return proto(c, s, "a collective this rank has not posted");
  s->iop = op;
  if (h->type == CT_M_P2) {
    size_t len = op->len[s->peer];
    if (op->algo != CT_ALGO_SHARDED || !op->has_p2 || k >= ct_nch(op, len) || h->len != ct_clen(op, len, k))
      return proto(c, s, "unexpected sharded chunk");
    s->idst = op->p2_dst + op->off[s->peer] + k * op->chunk;
    s->ilen = h->len;
    return 0;
  }
  if (h->type == CT_M_RS || h->type == CT_M_AG) {
    int t = h->step;
    if (op->algo != CT_ALGO_RING || t >= op->nsteps || (h->type == CT_M_RS) != ring_is_rs(op, t) ||
        s->peer != mod(me - 1, n))
      return proto(c, s, "unexpected ring chunk");
    int seg = ring_recv_seg(op, t, me, n);
    if (k >= ct_nch(op, op->len[seg]) || h->len != ct_clen(op, op->len[seg], k)) return proto(c, s, "bad ring chunk");
    s->idst = h->type == CT_M_RS ? s->tmp : op->p2_dst + op->off[seg] + k * op->chunk;
    s->ilen = h->len;
    return 0;
  }
  return proto(c, s, "unknown message type");
}

int ct_algo_payload(ct_coll_t* c, ct_sock_t* s) {
  const ct_msg_t* h = &s->ih.m;
  ct_op_t* op = s->iop;
  int n = c->nranks, me = c->rank;
  size_t k = h->chunk;
  if (h->type == CT_M_P1) {
    s->s_recvd++;   /* the reduction runs later in this pass */
    return 0;
  }
  op->need[s->peer]--;
  switch (h->type) {
    case CT_M_P2:
      ct_op_step(c, op);
      return 0;
    case CT_M_RS: {
      int t = h->step, seg = ring_recv_seg(op, t, me, n);
      size_t b = k * op->chunk;
      char* dst = seg == me ? op->p1_out + b : op->acc + op->off[seg] + b;   /* the last step: my segment */
      ct_reduce(dst, s->tmp, op->p1_src + op->off[seg] + b, h->len / op->esz, op->dt, op->rop);
      if (t + 1 < op->nsteps) ring_emit(c, op, t + 1, seg, k);
      ct_op_step(c, op);
      return 0;
    }
    default: {  /* CT_M_AG */
      int t = h->step, seg = ring_recv_seg(op, t, me, n);
      if (t + 1 < op->nsteps) ring_emit(c, op, t + 1, seg, k);
      ct_op_step(c, op);
      return 0;
    }
  }
}

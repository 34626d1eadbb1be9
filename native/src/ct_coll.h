/* CollNet engine: a full mesh of TCP sockets between the ranks of a collective
 * group, with one sender and one receiver thread per (peer, socket) and one
 * reduction thread. Two algorithms run over it:
 *   sharded: shard k of every buffer goes to rank k, whose reduction thread
 *            combines all ranks' copies and sends the result back to everyone;
 *   ring:    classic reduce-scatter + allgather ring over next/prev sockets.
 * Both are pipelined in chunks. */
#ifndef CT_COLL_H
#define CT_COLL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "ct_common.h"

enum { CT_ALGO_SHARDED = 0, CT_ALGO_RING = 1 };
enum { CT_KIND_ALLREDUCE = 0, CT_KIND_REDUCESCATTER = 1, CT_KIND_ALLGATHER = 2 };

typedef struct ct_op {
  uint64_t seq;
  int kind, algo;
  ncclDataType_t dt;
  ncclRedOp_t rop;
  size_t esz, chunk, total;
  size_t *off, *len;           /* per rank: shard/segment range in bytes */
  int has_p1, has_p2;          /* reduce part, gather part */
  const char* p1_src;          /* my contribution; shard r at p1_src + off[r] */
  char* p1_out;                /* my reduced shard (len[me] bytes) */
  char* acc;                   /* ring: partial sums, segment r at acc + off[r] */
  char* stage;                 /* sharded: (n-1) slots of len[me] */
  const char* p2_src;          /* my shard to hand to everyone */
  char* p2_dst;                /* shard r lands at p2_dst + off[r] */
  int* arrived;                /* sharded: per chunk of my shard, peers arrived */
  int reduced;                 /* sharded: chunks of my shard reduced, in order */
  unsigned char* recvd;        /* ring: [step * maxch + chunk] */
  int nsteps, maxch;
  int threads_left, done, error;
  void* owned[3];              /* temporaries freed with the op */
  struct {                     /* scatter-out after completion (multi-part SGE) */
    int n; void** addr; size_t* size; const char* from;
  } scatter;
  struct ct_op* next;
} ct_op_t;

typedef struct ct_coll {
  int rank, nranks, nsocks, algo, lockstep;
  size_t chunk_cfg;
  int* fds;                    /* [peer * nsocks + s] */
  int nthreads;
  pthread_t* threads;
  struct ct_worker* workers;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ct_op_t *head, *tail;
  uint64_t next_seq;
  int shutdown, error;
  uint64_t nops, nbytes;       /* collectives posted and their bytes (ct_collnet.c logs them) */
} ct_coll_t;

typedef struct ct_worker {
  ct_coll_t* c;
  int role, peer, sock;        /* role: 0 send, 1 recv, 2 reduce */
  char* tmp;
} ct_worker_t;

/* Mesh setup: handles[] are ct_handle_t from every rank's listen. Blocks. */
ct_coll_t* ct_coll_connect(ct_handle_t* const* handles, int nranks, int rank, int lfd);
void ct_coll_close(ct_coll_t* c);

/* Builds and queues an op (n == 1 completes at once). Returns NULL on bad args. */
ct_op_t* ct_coll_allreduce(ct_coll_t* c, const void* src, void* dst, size_t count,
                           ncclDataType_t dt, ncclRedOp_t op);
ct_op_t* ct_coll_reducescatter(ct_coll_t* c, int nparts, ncclNetSGE_v12_t* parts, void* dst,
                               size_t bpr, size_t woff, size_t wbytes, ncclDataType_t dt,
                               ncclRedOp_t op);
ct_op_t* ct_coll_allgather(ct_coll_t* c, const void* src, int nparts, ncclNetSGE_v12_t* parts,
                           size_t bpr, size_t woff, size_t wbytes);
/* 1 done (op freed), 0 pending, -1 error (op freed). */
int ct_coll_test(ct_coll_t* c, ct_op_t* op, size_t* bytes);

/* Threads (ct_coll_engine.c). */
void* ct_worker_main(void* arg);
void ct_op_free(ct_op_t* op);
#endif

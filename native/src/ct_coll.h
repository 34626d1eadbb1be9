/* CollNet engine: a full mesh of TCP sockets between the ranks of a collective
 * group, with one sender and one receiver thread per (peer, socket) and one
 * reduction thread; with reduction servers, one connection per server, one sender
 * thread for all of them and one receiver thread per server. Three algorithms:
 *   sharded: shard k of every buffer goes to rank k, whose reduction thread
 *            combines all ranks' copies and sends the result back to everyone;
 *   ring:    classic reduce-scatter + allgather ring over next/prev sockets;
 *   servers: shard k goes to reduction server k (clustertool-reducer), which
 *            combines all ranks' copies and sends the result back (allreduce only;
 *            reduce-scatter and allgather use sharded).
 * All are pipelined in chunks. The algorithm is chosen per collective (rules from
 * rank 0's tuner table, else the communicator's default). */
#ifndef CT_COLL_H
#define CT_COLL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "ct_common.h"

enum { CT_ALGO_SHARDED = 0, CT_ALGO_RING = 1, CT_ALGO_SERVERS = 2 };
#define CT_MAX_ALGO_RULES 32
#define CT_MAX_SERVERS 256
enum { CT_KIND_ALLREDUCE = 0, CT_KIND_REDUCESCATTER = 1, CT_KIND_ALLGATHER = 2 };

typedef struct ct_op {
  uint64_t seq;
  int kind, algo;
  ncclDataType_t dt;
  ncclRedOp_t rop;
  size_t esz, chunk, total;
  int nparts;                  /* shards: nranks, or the server count for servers */
  size_t *off, *len;           /* per shard: range in bytes */
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

/* collnet_algo rule of the tuner table: collectives of [min, max] bytes use algo. */
typedef struct { uint64_t min, max; uint32_t algo, pad; } ct_algo_rule_t;

typedef struct ct_coll {
  int rank, nranks, nsocks, algo, lockstep;   /* algo: the default, after any fallback */
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
  int nrules;                  /* rank 0's collnet_algo rules */
  ct_algo_rule_t rules[CT_MAX_ALGO_RULES];
  /* reduction servers (ct_coll_servers.c); nserv 0: not in use */
  int nserv, io_timeout_ms;
  int* sfds;                   /* [nserv] */
  char (*saddr)[48];           /* [nserv] "addr:port", for messages */
  uint64_t session;            /* id the servers know this communicator by (rank 0's) */
} ct_coll_t;

typedef struct ct_worker {
  ct_coll_t* c;
  int role, peer, sock;        /* role: 0 send, 1 recv, 2 reduce, 3 server send, 4 server recv (peer = server) */
  char* tmp;
  char why[384];               /* reason of a failure, for the WARN */
} ct_worker_t;
enum { CT_ROLE_SEND = 0, CT_ROLE_RECV = 1, CT_ROLE_REDUCE = 2, CT_ROLE_SSEND = 3, CT_ROLE_SRECV = 4 };

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
const char* ct_algo_name(int algo);
/* "sharded"/"ring"/"servers" -> CT_ALGO_*, -1 when unknown. */
int ct_algo_parse(const char* s);

/* Settings every rank takes from rank 0, and the servers' setup (ct_coll_settings.c):
 * after the mesh is up, rank 0 sends its rules, reducer list and timeout to all; every
 * rank connects to the servers; all ranks agree (through rank 0) whether every rank
 * reached every server; if not, a WARN on every rank and the servers are not used.
 * Returns -1 only when the mesh itself fails. */
int ct_coll_settings(ct_coll_t* c, int tmo_ms);
/* collnet_algo rules from a tuner table file; malformed lines are WARNed and skipped. */
int ct_algo_rules_load(const char* path, ct_algo_rule_t* rules, int max);
/* "addr:port,addr:port" -> addresses; -1 (with a WARN) on a malformed list. */
int ct_reducers_parse(const char* list, struct sockaddr_in* out, int max);

/* The servers algorithm (ct_coll_servers.c). */
int ct_servers_send(ct_worker_t* w, ct_op_t* op);
int ct_servers_recv(ct_worker_t* w, ct_op_t* op);
/* Connect + hello to every server: 0, or -1 with *bad = index of the first failing one. */
int ct_servers_connect(ct_coll_t* c, const struct sockaddr_in* addrs, int k, int* bad);
int ct_servers_wait_acks(ct_coll_t* c, int* bad);
void ct_servers_close(ct_coll_t* c);
#endif

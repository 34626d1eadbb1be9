/* CollNet engine: a full mesh of TCP sockets between the ranks of a collective group
 * (and, with reduction servers, one connection per server), driven by ONE progress
 * thread per communicator on epoll over non-blocking sockets. Reductions run inline on
 * that thread. NCCL's proxy posts a stream of requests; every posted request progresses
 * at once, up to a window of W in flight (CLUSTERTOOL_COLLNET_WINDOW, default 16): a
 * post beyond the window returns no request (NCCL calls again later), and test() only
 * reads an atomic (it never waits on the progress thread).
 *
 * Three algorithms, chosen per collective (rank 0's tuner rules, else the default):
 *   sharded: shard k of every buffer goes to rank k (phase 1), which reduces it in rank
 *            order 0..n-1 and sends the result to everyone (phase 2);
 *   ring:    reduce-scatter + allgather ring over the next/prev sockets;
 *   servers: shard k goes to reduction server k (clustertool-reducer), which reduces all
 *            ranks' copies and sends the result back (allreduce only).
 * Messages carry (seq, step, chunk) and are routed by them; phase-2 traffic is written
 * before phase 1. Every data message for collective s goes to a peer only once that peer
 * has posted s (each header carries the sender's posted count), so whatever arrives has a
 * place; except sharded phase 1, whose chunks land in a staging ring per connection of T
 * slots (credits in every header), sent in order, reduced in order straight into the output. Op slots, staging and message
 * descriptors are allocated at connect. */
#ifndef CT_COLL_H
#define CT_COLL_H
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "ct_common.h"
#include "ct_reducer_proto.h"

enum { CT_ALGO_SHARDED = 0, CT_ALGO_RING = 1, CT_ALGO_SERVERS = 2 };
#define CT_MAX_ALGO_RULES 32
#define CT_MAX_SERVERS 256
#define CT_MAX_SOCKS 16
#define CT_MAX_LANES 8   /* CLUSTERTOOL_COLLNET_THREADS: progress threads (lanes) per communicator */
enum { CT_KIND_ALLREDUCE = 0, CT_KIND_REDUCESCATTER = 1, CT_KIND_ALLGATHER = 2 };

/* Rank-to-rank message header. credit and posted are cumulative (mod 2^32). */
#define CT_MSG_MAGIC 0x43544d32u /* "CTM2" */
enum { CT_M_CTRL = 0, CT_M_P1 = 1, CT_M_P2 = 2, CT_M_RS = 3, CT_M_AG = 4 };
typedef struct {
  uint32_t magic;
  uint8_t type, pad;
  uint16_t step;     /* ring: the step; sharded: 1 or 2 */
  uint32_t seq;      /* the collective */
  uint32_t chunk;    /* chunk index within the segment or shard */
  uint32_t len;      /* payload bytes that follow */
  uint32_t credit;   /* phase-1 messages the sender has consumed from this connection */
  uint32_t posted;   /* collectives the sender has posted (it accepts data for seq < posted) */
  uint32_t pad2;
} ct_msg_t;
_Static_assert(sizeof(ct_msg_t) == 32, "message header layout");

/* What NCCL holds between iallreduce and test: only atomics are shared with the
 * progress thread. */
enum { CT_REQ_PENDING = 0, CT_REQ_DONE = 1, CT_REQ_ERROR = 2 };
typedef struct ct_req {
  _Atomic int state;
  _Atomic int waiters;         /* 1: a blocking caller (ct_coll_wait) sleeps on state: wake it when it changes */
  size_t bytes;
  struct ct_coll* c;
  struct ct_req* next_free;
} ct_req_t;

enum { CT_OP_FREE = 0, CT_OP_POSTED = 1, CT_OP_ACTIVE = 2 };
typedef struct ct_op {
  _Atomic int state;           /* FREE -> POSTED (API thread) -> ACTIVE -> FREE (progress thread) */
  uint64_t seq;
  int kind, algo;
  ncclDataType_t dt;
  ncclRedOp_t rop;
  size_t esz, chunk, total;
  int nparts;                  /* shards: nranks, or the server count for servers */
  size_t *off, *len;           /* per shard: range in bytes (allocated at connect) */
  int has_p1, has_p2;          /* reduce part, gather part */
  const char* p1_src;          /* my contribution; shard r at p1_src + off[r] */
  char* p1_out;                /* my reduced shard */
  char* acc;                   /* ring: partial sums, segment r at acc + off[r] */
  const char* p2_src;          /* my shard to hand to everyone */
  char* p2_dst;                /* shard r lands at p2_dst + off[r] */
  int nsteps;                  /* ring */
  size_t maxch;                /* chunks of the longest shard */
  long* need;                  /* [peer or server] messages still to receive from it (allocated at connect) */
  long pending;                /* messages to write and receive, chunks to reduce */
  int gated;                   /* 1 ring, 2 allgather: its data waits for the peer's post */
  ct_req_t* req;
  long long t_post_ns;
  void* owned[2];              /* temporaries freed with the op (multi-part SGE, ring reduce-scatter) */
  struct { int n; void** addr; size_t* size; } scatter;  /* multi-part allgather output */
} ct_op_t;

/* An outgoing message: header, payload pointer (never copied), progress. */
typedef struct ct_out {
  union { ct_msg_t m; ct_rmsg_t r; } h;
  uint32_t hlen;
  int gen;                     /* 1: counted against a generator's depth */
  const char* payload;
  size_t plen, done;           /* done: bytes of header + payload written */
  ct_op_t* op;                 /* pending-- when written; NULL for control */
  struct ct_out* next;
} ct_out_t;

typedef struct { ct_out_t *head, *tail; } ct_outq_t;

/* One TCP connection: to a rank (server = 0) or a reduction server (server = 1). */
typedef struct ct_sock {
  int fd, peer, sidx, server;
  ct_outq_t hi, lo, park;      /* hi: control, phase 2, ring; lo: phase 1, server data; park: peer not posted yet */
  ct_outq_t cur;               /* started (header fields filled), written in order, several per sendmsg */
  int ncur;
  int blocked;                 /* EAGAIN seen; cleared by EPOLLOUT (edge-triggered) */
  int readable, dead;          /* readable: until recv says EAGAIN; dead: the peer closed owing nothing */
  /* input side */
  union { ct_msg_t m; ct_rmsg_t r; } ih, inext;   /* inext: the next header, read with a payload */
  size_t ih_got;
  char* idst;                  /* payload destination, NULL while reading a header */
  size_t ilen, igot;
  ct_op_t* iop;
  char* tmp;                   /* ring: a received partial sum; servers: an ABORT reason */
  /* staging of phase-1 chunks sent to this rank (the owner) on this connection */
  char* stage;                 /* [T][chunk_cfg] */
  ct_msg_t* shdr;              /* [T] */
  uint32_t s_in, s_recvd, s_used;   /* headers read, payloads complete, consumed */
  uint32_t credit_told;        /* s_used last written in a header */
  uint32_t tx_p1, peer_used;   /* phase-1 messages sent here; how many the peer consumed */
  long last_rx_ms, last_tx_ms;
} ct_sock_t;

/* collnet_algo rule of the tuner table: collectives of [min, max] bytes use algo. */
typedef struct { uint64_t min, max; uint32_t algo, pad; } ct_algo_rule_t;

/* Log-linear histogram of nanoseconds (about 12% resolution). */
#define CT_HIST_BUCKETS 512
typedef struct { _Atomic uint64_t n[CT_HIST_BUCKETS]; _Atomic uint64_t count; } ct_hist_t;
typedef struct {
  _Atomic uint64_t requests, bytes, inflight_sum, inflight_max;
  ct_hist_t post_to_done, test;
} ct_stats_t;

typedef struct { uint64_t seq; size_t c; int j; size_t inflight; } ct_gen_t;   /* inflight: payload bytes */
#define CT_SCRATCH_BYTES (64 * 1024)

typedef struct ct_coll {
  int rank, nranks, nsocks, algo, lockstep;   /* algo: the default, after any fallback */
  /* Lanes: K independent engines (progress thread, sockets, window) of one communicator.
   * The communicator NCCL holds is lane 0 (root == itself); it posts whole requests to the
   * lanes in turn (the k-th to lane k mod K; servers collectives to lane 0, the only one
   * with server connections). Statistics live in the root; a lane that fails fails all. */
  int nlanes, lane;
  struct ct_coll* lanes[CT_MAX_LANES];   /* root only: lanes[0] == root */
  struct ct_coll* root;
  uint64_t rr;                 /* root, API side: requests posted to the lanes so far */
  _Atomic uint64_t lanes_posted, lanes_done;   /* root: for the in-flight figure across lanes */
  _Atomic int group_failed;    /* root: a lane failed; every lane fails */
  _Atomic long long cpu_ns;    /* the lane's progress thread's CPU time, written when it ends */
  size_t chunk_cfg;
  int* fds;                    /* [peer * nsocks + s] */
  int nrules;                  /* rank 0's collnet_algo rules */
  ct_algo_rule_t rules[CT_MAX_ALGO_RULES];
  /* reduction servers (ct_coll_servers.c); nserv 0: not in use */
  int nserv, io_timeout_ms;
  int* sfds;                   /* [nserv] */
  char (*saddr)[48];           /* [nserv] "addr:port", for messages */
  uint64_t session;            /* id the servers know this communicator by (rank 0's) */
  int stage_slots;             /* T, rank 0's */
  /* window of op slots (W a power of two) */
  int W;
  ct_op_t* ops;
  uint64_t next_seq;           /* API side */
  _Atomic uint64_t ncompleted;
  /* the progress thread */
  pthread_t thread;
  int thread_started, epfd, evfd;
  _Atomic int shutdown, error, sleeping, freeze, frozen;   /* freeze/frozen: a test hook */
  ct_sock_t* socks;            /* [nranks * nsocks] (own rank's unused) */
  ct_sock_t* ssocks;           /* [nserv] */
  uint64_t activated;          /* ops seq < activated are ACTIVE or done */
  uint64_t* peer_posted;       /* [nranks] */
  uint64_t* posted_told_any;   /* [nranks] our posted count last written to that peer */
  int posted_changed;
  int gated_ring, gated_all;   /* active ops whose data waits for the peer's post: ring (prev must know), allgather (all) */
  ct_gen_t p1gen[CT_MAX_SOCKS], sgen;
  size_t depth, sdepth;        /* phase-1 / server-data bytes being written at once per generator, in chunks */
  uint64_t red_seq;            /* sharded: next chunk of my shard to reduce */
  size_t red_c;
  char* scratch;               /* in-place reductions */
  const char** srcs;           /* [nranks] */
  ct_out_t* out_free;
  void** out_blocks;
  int nout_blocks;
  long pace_wait_us;           /* > 0: the pacer holds the next byte back this long */
  _Atomic uint64_t paced_tx, paced_rx;   /* bytes granted by ct_pace and moved */
  /* API side */
  pthread_mutex_t req_mu;      /* request free list: taken by API threads only, never by the progress thread */
  ct_req_t* req_free;
  void** req_blocks;
  int nreq_blocks;
  ct_stats_t stats;
  uint64_t nops, nbytes;       /* collectives posted and their bytes (ct_collnet.c logs them) */
} ct_coll_t;

/* The handle's `threads` word at listen: CLUSTERTOOL_COLLNET_THREADS (0 = auto) and the online CPUs. */
uint32_t ct_coll_threads_word(void);
/* Lanes for a communicator from rank 0's word: the setting (1 to CT_MAX_LANES), else auto =
 * CPUs / (2 x ranks on rank 0's address), 1 or 2 (every rank computes the same from the same handles). */
int ct_coll_lanes(ct_handle_t* const* handles, int nranks);
/* Mesh setup: handles[] are ct_handle_t from every rank's listen. Blocks. */
ct_coll_t* ct_coll_connect(ct_handle_t* const* handles, int nranks, int rank, int lfd);
void ct_coll_close(ct_coll_t* c);

/* Post a collective. 0: *req set; 1: window full (no request, call again later);
 * -1: bad arguments or the communicator failed. */
int ct_coll_allreduce(ct_coll_t* c, const void* src, void* dst, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                      ct_req_t** req);
int ct_coll_reducescatter(ct_coll_t* c, int nparts, ncclNetSGE_v12_t* parts, void* dst, size_t bpr, size_t woff,
                          size_t wbytes, ncclDataType_t dt, ncclRedOp_t op, ct_req_t** req);
int ct_coll_allgather(ct_coll_t* c, const void* src, int nparts, ncclNetSGE_v12_t* parts, size_t bpr, size_t woff,
                      size_t wbytes, ct_req_t** req);
/* Never blocks. 1 done (req released), 0 pending, -1 error (req released). */
int ct_coll_test(ct_req_t* req, size_t* bytes);
/* Blocking wait for callers that are not NCCL (spins briefly, then sleeps until the progress thread wakes it). */
int ct_coll_wait(ct_req_t* req, size_t* bytes);
/* The progress thread, once it stored a request's final state: wakes a caller asleep in ct_coll_wait. */
void ct_req_wake(ct_req_t* r);

const char* ct_algo_name(int algo);
/* "sharded"/"ring"/"servers" -> CT_ALGO_*, -1 when unknown. */
int ct_algo_parse(const char* s);

/* The progress thread (ct_coll_engine.c). */
int ct_engine_start(ct_coll_t* c);
void ct_engine_join(ct_coll_t* c);   /* ends the thread (shutdown), frees nothing */
void ct_engine_stop(ct_coll_t* c);
void ct_engine_wake(ct_coll_t* c);
/* Engine internals shared by the algorithm files. */
size_t ct_nch(const ct_op_t* op, size_t len);
size_t ct_clen(const ct_op_t* op, size_t len, size_t k);
ct_op_t* ct_op_at(ct_coll_t* c, uint64_t seq);          /* the ACTIVE op of seq, or NULL */
void ct_op_step(ct_coll_t* c, ct_op_t* op);              /* pending--, completes at 0 */
ct_out_t* ct_out_new(ct_coll_t* c);
void ct_emit(ct_coll_t* c, ct_sock_t* s, ct_out_t* o, int lo);   /* queue (or park until the peer posted) */
ct_out_t* ct_msg_out(ct_coll_t* c, ct_op_t* op, int type, int step, size_t chunk, const char* p, size_t len);
void ct_fail(ct_coll_t* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when the communicator (any of its lanes) has failed. */
static inline int ct_coll_failed(ct_coll_t* c) { return atomic_load(&c->error) || atomic_load(&c->root->group_failed); }
uint64_t ct_seq_extend(uint64_t near, uint32_t v);

/* I/O (ct_coll_io.c), progress thread only. */
#define CT_MAX_BATCH 8                                   /* messages started (and written) per sendmsg */
int ct_io_read(ct_coll_t* c, ct_sock_t* s);             /* 1 progress, 0 none, -1 failed */
int ct_io_write_all(ct_coll_t* c);                       /* 1 when anything was written */
int ct_io_unpark(ct_coll_t* c);                          /* parked messages whose peer posted: queued */
int ct_io_control(ct_coll_t* c, ct_sock_t* s);           /* queue a control message first */
void ct_sock_dead(ct_coll_t* c, ct_sock_t* s);
const char* ct_peer_name(ct_coll_t* c, ct_sock_t* s, char* buf, size_t len);
int ct_still_needed(ct_coll_t* c, ct_sock_t* s);         /* a collective in progress waits for data from it */

/* Algorithms (ct_coll_algos.c, ct_coll_servers.c): activation, generators, input. */
void ct_algo_activate(ct_coll_t* c, ct_op_t* op);
int ct_algo_generate(ct_coll_t* c);                /* 1 when something was queued */
int ct_algo_reduce(ct_coll_t* c);                  /* sharded reductions now possible; 1 when any ran */
/* A rank header was read: set s->idst/ilen (or fail). 0 ok, -1 failed. */
int ct_algo_header(ct_coll_t* c, ct_sock_t* s);
int ct_algo_payload(ct_coll_t* c, ct_sock_t* s);   /* its payload is complete */
void ct_servers_activate(ct_coll_t* c, ct_op_t* op);
int ct_servers_generate(ct_coll_t* c);
int ct_servers_header(ct_coll_t* c, ct_sock_t* s);
int ct_servers_payload(ct_coll_t* c, ct_sock_t* s);

/* Statistics (ct_coll_stats.c). */
long long ct_now_ns(void);
void ct_hist_add(ct_hist_t* h, uint64_t ns);
double ct_hist_pct_us(const ct_hist_t* h, double pct);
void ct_stats_report(ct_coll_t* c);

/* Settings every rank takes from rank 0, and the servers' setup (ct_coll_settings.c):
 * after the mesh is up, rank 0 sends its rules, reducer list, timeout and staging slots to
 * all; every rank connects to the servers; all ranks agree (through rank 0) whether every
 * rank reached every server; if not, a WARN on every rank and the servers are not used.
 * Returns -1 only when the mesh itself fails. */
int ct_coll_settings(ct_coll_t* c, int tmo_ms);
/* collnet_algo rules from a tuner table file; malformed lines are WARNed and skipped. */
int ct_algo_rules_load(const char* path, ct_algo_rule_t* rules, int max);
/* "addr:port,addr:port" -> addresses; -1 (with a WARN) on a malformed list. */
int ct_reducers_parse(const char* list, struct sockaddr_in* out, int max);

/* Connect + hello to every server: 0, or -1 with *bad = index of the first failing one. */
int ct_servers_connect(ct_coll_t* c, const struct sockaddr_in* addrs, int k, int* bad);
int ct_servers_wait_acks(ct_coll_t* c, int* bad);
void ct_servers_close(ct_coll_t* c);
#endif

/* clustertool-reducer internals: sessions (ct_reducer_session.c) and the listener
 * with its command line (ct_reducer_main.c). */
#ifndef CT_REDUCER_H
#define CT_REDUCER_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "ct_reducer_proto.h"

typedef struct {
  int io_timeout_ms;     /* a worker stalled mid-message or not reading results this long: session dropped */
  int threads;           /* reduction threads per session */
  int window;            /* chunks buffered per worker */
  int sndbuf;            /* SO_SNDBUF for worker connections, 0 = kernel default */
} ct_rconfig_t;

typedef struct ct_rsession ct_rsession_t;

typedef struct {
  ct_rsession_t* s;
  int fd, rank;
  char peer[48];         /* "a.b.c.d:port" */
} ct_rconn_t;

enum { CT_RS_ASSEMBLING = 0, CT_RS_RUNNING = 1, CT_RS_FINISHED = 2 };

struct ct_rsession {
  uint64_t id;
  uint32_t n, chunk, hb_ms, server_index, nservers;
  int joined, state;
  long created_ms;
  ct_rconn_t* conns;     /* [n]; fd -1 until that rank joined */
  const ct_rconfig_t* cfg;
  pthread_t master;
  int wake_fd;           /* written when the session finished (main loop joins it) */
  /* running state, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int W;
  char* in;              /* [n][W][chunk] */
  ct_rmsg_t* ihdr;       /* [n][W] */
  char* out;             /* [W][chunk] */
  ct_rmsg_t* ohdr;       /* [W] */
  uint64_t* recvd;       /* [n] DATA messages received from each rank */
  int* eof;              /* [n] rank closed its connection at a message boundary */
  int* sending;          /* [n] its sender is inside a message */
  int recv_left;         /* receiver threads still running */
  uint64_t* done_g;      /* [W] reduction g+1 finished in that slot (0: none) */
  uint64_t reduced;      /* reductions 0..reduced-1 all finished */
  uint64_t* sent;        /* [n] RESULT messages sent to each rank */
  int stop;
  char err[256];         /* first error; empty: clean end */
  uint64_t bytes;        /* payload bytes reduced (one rank's share) */
  struct ct_rlate* late; /* the lateness record (CT_RLATE_ENV set), or NULL; its counters under mu */
  ct_rsession_t* next;
};

/* Session lifecycle (ct_reducer_session.c). */
ct_rsession_t* ct_rsession_new(const ct_rhello_t* h, const ct_rconfig_t* cfg, int wake_fd);
/* All ranks joined: send the acks and start the threads (a master thread joins them). */
int ct_rsession_start(ct_rsession_t* s);
/* Ask a running session to stop (SIGTERM): its sockets are shut down. */
void ct_rsession_abort(ct_rsession_t* s, const char* why);
/* After the master thread ended (or for a session that never started). */
void ct_rsession_free(ct_rsession_t* s);
void ct_rlog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* The session's lateness record (ct_reducer_late.c), where CT_RLATE_ENV names a folder: opened once the session
 * starts (s->late stays NULL without it, or when it cannot be opened), its writer thread started and stopped with
 * the session's threads; ct_rlate_arrival is called with the session's lock held. */
void ct_rlate_open(ct_rsession_t* s);
void ct_rlate_start(ct_rsession_t* s);
void ct_rlate_arrival(ct_rsession_t* s, uint32_t rank, size_t slot, uint64_t t_us);
void ct_rlate_close(ct_rsession_t* s);
uint64_t ct_rlate_now_us(void);
#endif

/* Wire protocol between the CollNet plugin's `servers` algorithm (ct_coll_servers.c)
 * and the reduction server (clustertool-reducer, ct_reducer*.c). All fields are in the
 * host byte order of the sender; both ends check the magic, so a byte-order mismatch
 * (not a case on the x86-64/aarch64 nodes this runs on) is refused, never misread.
 *
 * A session is one CollNet communicator: n workers (ranks), each with one TCP
 * connection to this server. Per connection:
 *   worker -> server  ct_rhello_t                          once
 *   server -> worker  ct_rack_t                            once all n ranks joined
 *   worker -> server  ct_rmsg_t(DATA) + len bytes          a stream of chunks
 *   server -> worker  ct_rmsg_t(RESULT) + len bytes        the reduced chunks, same order
 *                     ct_rmsg_t(HEARTBEAT), no payload     while the server waits
 *                     ct_rmsg_t(ABORT) + reason text       best effort, before it drops a session
 * The server treats each connection's chunks as one stream: the g-th DATA message of
 * every rank forms reduction g (they must agree on seq, chunk, len, dtype and op),
 * reduced in rank order 0, 1, ..., n-1 and sent back as the g-th RESULT to every rank.
 * A worker closing its connection ends the session for all. */
#ifndef CT_REDUCER_PROTO_H
#define CT_REDUCER_PROTO_H
#include <stdint.h>

#define CT_RHELLO_MAGIC 0x43545248u /* "CTRH" */
#define CT_RACK_MAGIC 0x43545241u   /* "CTRA" */
#define CT_RMSG_MAGIC 0x4354524du   /* "CTRM" */
#define CT_RPROTO_VERSION 1u
#define CT_RMAX_RANKS 4096u
#define CT_RMAX_CHUNK (16u << 20)   /* largest chunk a server accepts (slot size) */

typedef struct {
  uint32_t magic, version;
  uint64_t session;       /* communicator id: random, chosen by rank 0, same for all ranks */
  uint32_t rank, nranks;
  uint32_t chunk_bytes;   /* largest payload this communicator sends (server slot size) */
  uint32_t timeout_ms;    /* the worker's IO timeout: the server's heartbeats come 4x as often */
  uint32_t server_index, nservers;  /* which of the communicator's servers this is (for logs) */
} ct_rhello_t;

enum { CT_RACK_OK = 0, CT_RACK_REFUSED = 1 };
typedef struct {
  uint32_t magic, status;
  uint32_t nranks, pad;
} ct_rack_t;

enum { CT_RMSG_DATA = 1, CT_RMSG_RESULT = 2, CT_RMSG_HEARTBEAT = 3, CT_RMSG_ABORT = 4 };
#define CT_RMAX_REASON 200
typedef struct {
  uint32_t magic;
  uint8_t type, dtype, redop, pad;
  uint32_t seq;      /* the worker's collective number (consistency check) */
  uint32_t chunk;    /* chunk index within this server's shard of the collective */
  uint32_t len;      /* payload bytes that follow */
  uint32_t pad2;
} ct_rmsg_t;
/* Lateness records, beside the protocol: with CLUSTERTOOL_STRAGGLERS_DIR set in the reducer's environment, each
 * session appends one JSON line a second (while requests come) and one when it ends to
 * $CLUSTERTOOL_STRAGGLERS_DIR/<host>.<session hex>.<server index>.jsonl, its counters cumulative since the
 * session started. Per worker (rank): "late" of a request = its arrival minus the first worker's (µs), counted in
 * late_hist[k] (late <= 2^k µs for k < CT_RLATE_BUCKETS - 1; the last count is everything above); "last": the
 * requests it arrived last in; "waited_for_us": over those, its arrival minus the second-to-last arrival.
 * clustertool reads them (clustertool/nodeprogs/watchlate.py); "v" is the format's version. */
#define CT_RLATE_VERSION 1
#define CT_RLATE_BUCKETS 24
#define CT_RLATE_ENV "CLUSTERTOOL_STRAGGLERS_DIR"

_Static_assert(sizeof(ct_rhello_t) == 40, "hello layout");
_Static_assert(sizeof(ct_rmsg_t) == 24, "message layout");
#endif

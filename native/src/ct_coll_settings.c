/* What every rank of a CollNet communicator takes from rank 0, and the reduction
 * servers' setup with its cross-rank agreement.
 *
 * Rank 0's handle already carries the algorithm, sockets per peer and chunk. What does
 * not fit there travels over the mesh once it is up: the collnet_algo rules of rank 0's
 * tuner table, rank 0's CLUSTERTOOL_REDUCERS, its CLUSTERTOOL_REDUCER_TIMEOUT_MS (the io
 * timeout for peers and servers), its CLUSTERTOOL_COLLNET_STAGE (staging slots per
 * connection: the credits every sender counts on) and a random session id. Then, when servers are wanted, every rank connects to every
 * server and sends its hello; each rank tells rank 0 whether that worked, rank 0 tells
 * everyone the outcome (and who failed), and only then do ranks wait for the servers'
 * acks, followed by a second such round. So either every rank uses the servers or
 * none does, and every rank's WARN names the server that failed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ct_coll.h"

#define SET_MAGIC 0x43545331u  /* "CTS1" */
#define STA_MAGIC 0x43545332u  /* "CTS2" */

typedef struct {
  uint32_t magic, nrules;
  uint64_t session;
  uint32_t io_timeout_ms, want_servers;
  uint32_t list_len, stage_slots;   /* phase-1 staging slots per connection (credits) */
} set_hdr_t;

typedef struct { uint32_t magic; int32_t ok, rank, server, err, pad; } status_t;

int ct_algo_parse(const char* s) {
  if (!strcasecmp(s, "sharded")) return CT_ALGO_SHARDED;
  if (!strcasecmp(s, "ring")) return CT_ALGO_RING;
  if (!strcasecmp(s, "servers")) return CT_ALGO_SERVERS;
  return -1;
}

const char* ct_algo_name(int algo) {
  return algo == CT_ALGO_RING ? "ring" : algo == CT_ALGO_SERVERS ? "servers" : "sharded";
}

/* Rows "collnet_algo,MIN_BYTES,MAX_BYTES,ALGORITHM" of the tuner table (the tuner
 * skips them); the first row whose inclusive range holds a collective's size wins. */
int ct_algo_rules_load(const char* path, ct_algo_rule_t* rules, int max) {
  FILE* f = fopen(path, "r");
  if (!f) return 0;   /* the tuner WARNs about a missing table */
  char line[512];
  int n = 0;
  for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
    char* hash = strchr(line, '#');
    if (hash) *hash = 0;
    char* s = ct_trim(line);
    if (strncasecmp(s, "collnet_algo", 12) || (s[12] != ',' && !isspace((unsigned char)s[12]))) continue;
    char* fld[5];
    int k = 0;
    for (char* p = s; p && k < 5; k++) {
      fld[k] = p;
      p = strchr(p, ',');
      if (p) *p++ = 0;
    }
    for (int i = 0; i < k; i++) fld[i] = ct_trim(fld[i]);
    ct_algo_rule_t r = {0, 0, 0, 0};
    int algo = k == 4 ? ct_algo_parse(fld[3]) : -1;
    const char* bad = k != 4 ? "want 4 fields: collnet_algo,min_bytes,max_bytes,sharded|ring|servers"
                      : ct_parse_size(fld[1], &r.min) || ct_parse_size(fld[2], &r.max) || r.min > r.max ? "bad size range"
                      : algo < 0 ? "unknown algorithm (sharded, ring or servers)"
                      : n == max ? "too many collnet_algo rules" : NULL;
    if (bad) { CT_WARN("tuner table %s:%d: %s; line skipped", path, lineno, bad); continue; }
    r.algo = (uint32_t)algo;
    rules[n++] = r;
  }
  fclose(f);
  return n;
}

int ct_reducers_parse(const char* list, struct sockaddr_in* out, int max) {
  char buf[4096];
  if (strlen(list) >= sizeof buf) { CT_WARN("CLUSTERTOOL_REDUCERS is too long"); return -1; }
  strcpy(buf, list);
  int n = 0;
  for (char *save = NULL, *item = strtok_r(buf, ", ", &save); item; item = strtok_r(NULL, ", ", &save)) {
    char* colon = strrchr(item, ':');
    char* end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == item || !end || *end || port < 1 || port > 65535 || n == max) {
      CT_WARN("CLUSTERTOOL_REDUCERS: '%s' is not host:port (or more than %d servers)", item, max);
      return -1;
    }
    *colon = 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(item, NULL, &hints, &res);
    if (rc || !res) {
      CT_WARN("CLUSTERTOOL_REDUCERS: cannot resolve '%s': %s", item, gai_strerror(rc));
      return -1;
    }
    memcpy(&out[n], res->ai_addr, sizeof out[n]);
    out[n].sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    n++;
  }
  return n;
}

/* Blocking transfers on a mesh socket, bounded by tmo_ms of no progress. */
static int xfer(int fd, void* buf, size_t len, int tmo_ms, int sending) {
  char* p = buf;
  while (len) {
    struct pollfd pf = {fd, sending ? POLLOUT : POLLIN, 0};
    int r = poll(&pf, 1, tmo_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t k = sending ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return -1;
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* 8 random bytes for the session id. The system call, not getrandom(): that function
 * needs glibc 2.25, and the libraries load on 2.17 (ct_glibc_compat.h). */
static int random_u64(uint64_t* v) {
#ifdef SYS_getrandom
  if (syscall(SYS_getrandom, v, sizeof *v, 0) == (long)sizeof *v) return 0;
#endif
  /* kernels before 3.17 have no getrandom */
  FILE* f = fopen("/dev/urandom", "rb");
  if (!f) return -1;
  size_t n = fread(v, 1, sizeof *v, f);
  fclose(f);
  return n == sizeof *v ? 0 : -1;
}

static int peer_fd(const ct_coll_t* c, int p) { return c->fds[p * c->nsocks]; }

/* Every rank's status reaches rank 0; rank 0's verdict (the first failure) reaches all. */
static int agree(ct_coll_t* c, status_t* st, int tmo) {
  st->magic = STA_MAGIC;
  if (c->rank != 0) {
    if (xfer(peer_fd(c, 0), st, sizeof *st, tmo, 1) || xfer(peer_fd(c, 0), st, sizeof *st, tmo, 0)) return -1;
    return st->magic == STA_MAGIC ? 0 : -1;
  }
  for (int p = 1; p < c->nranks; p++) {
    status_t o;
    if (xfer(peer_fd(c, p), &o, sizeof o, tmo, 0) || o.magic != STA_MAGIC) return -1;
    if (st->ok && !o.ok) *st = o;
  }
  for (int p = 1; p < c->nranks; p++)
    if (xfer(peer_fd(c, p), st, sizeof *st, tmo, 1)) return -1;
  return 0;
}

static void warn_fallback(ct_coll_t* c, const status_t* st, const char* stage) {
  const char* to = st->server >= 0 && st->server < c->nserv ? c->saddr[st->server] : "?";
  CT_WARN("rank %d/%d: reduction server %s (server %d of %d) %s from rank %d (%s); CollNet uses sharded instead "
          "of servers on every rank", c->rank, c->nranks, to, st->server + 1, c->nserv, stage, st->rank,
          st->err ? strerror(st->err) : "refused");
}

/* Staging slots: CLUSTERTOOL_COLLNET_STAGE, at most 64 MiB of them per connection. */
static uint32_t stage_slots(size_t chunk) {
  long t = ct_env_long("CLUSTERTOOL_COLLNET_STAGE", 16, 1, 1024);
  long cap = (long)((64UL << 20) / (chunk ? chunk : 1));
  if (t > cap) t = cap < 2 ? 2 : cap;
  return (uint32_t)t;
}

int ct_coll_settings(ct_coll_t* c, int tmo) {
  c->io_timeout_ms = (int)ct_env_long("CLUSTERTOOL_REDUCER_TIMEOUT_MS", 30000, 100, 3600000);
  c->stage_slots = (int)stage_slots(c->chunk_cfg);
  if (c->nranks < 2) { if (c->algo == CT_ALGO_SERVERS) c->algo = CT_ALGO_SHARDED; return 0; }
  set_hdr_t h = {SET_MAGIC, 0, 0, 30000, 0, 0, 0};
  char list[4096] = "";
  if (c->rank == 0) {
    const char* table = ct_env_str("CLUSTERTOOL_TUNER_CONFIG", NULL);
    c->nrules = table ? ct_algo_rules_load(table, c->rules, CT_MAX_ALGO_RULES) : 0;
    snprintf(list, sizeof list, "%s", ct_env_str("CLUSTERTOOL_REDUCERS", ""));
    h.nrules = (uint32_t)c->nrules;
    h.io_timeout_ms = (uint32_t)ct_env_long("CLUSTERTOOL_REDUCER_TIMEOUT_MS", 30000, 100, 3600000);
    h.list_len = (uint32_t)strlen(list);
    h.stage_slots = (uint32_t)c->stage_slots;
    int want = c->algo == CT_ALGO_SERVERS;
    for (int i = 0; i < c->nrules; i++) want |= c->rules[i].algo == CT_ALGO_SERVERS;
    h.want_servers = (uint32_t)(want && *list);
    if (random_u64(&h.session))
      h.session = ((uint64_t)getpid() << 32) ^ (uint64_t)ct_now_ms() ^ (uint64_t)(uintptr_t)c;
    for (int p = 1; p < c->nranks; p++)
      if (xfer(peer_fd(c, p), &h, sizeof h, tmo, 1) ||
          (h.nrules && xfer(peer_fd(c, p), c->rules, sizeof(ct_algo_rule_t) * h.nrules, tmo, 1)) ||
          (h.list_len && xfer(peer_fd(c, p), list, h.list_len, tmo, 1)))
        return -1;
  } else {
    if (xfer(peer_fd(c, 0), &h, sizeof h, tmo, 0) || h.magic != SET_MAGIC || h.nrules > CT_MAX_ALGO_RULES ||
        h.list_len >= sizeof list || h.stage_slots < 1 || h.stage_slots > 1024)
      return -1;
    c->nrules = (int)h.nrules;
    if ((h.nrules && xfer(peer_fd(c, 0), c->rules, sizeof(ct_algo_rule_t) * h.nrules, tmo, 0)) ||
        (h.list_len && xfer(peer_fd(c, 0), list, h.list_len, tmo, 0)))
      return -1;
    list[h.list_len] = 0;
  }
  c->session = h.session;
  c->io_timeout_ms = (int)h.io_timeout_ms;
  c->stage_slots = (int)h.stage_slots;
  if (!h.want_servers) {
    if (c->algo == CT_ALGO_SERVERS) {
      if (c->rank == 0) CT_WARN("CLUSTERTOOL_COLLNET_ALGO=servers but CLUSTERTOOL_REDUCERS is empty; using sharded");
      c->algo = CT_ALGO_SHARDED;
    }
    return 0;
  }
  struct sockaddr_in addrs[CT_MAX_SERVERS];
  int k = ct_reducers_parse(list, addrs, CT_MAX_SERVERS);
  status_t st = {STA_MAGIC, 1, c->rank, -1, 0, 0};
  if (k <= 0) { st.ok = 0; st.err = EINVAL; k = 0; }
  c->nserv = k;
  c->sfds = calloc((size_t)(k ? k : 1), sizeof(int));
  c->saddr = calloc((size_t)(k ? k : 1), sizeof *c->saddr);
  if (!c->sfds || !c->saddr) return -1;
  for (int i = 0; i < k; i++) {
    c->sfds[i] = -1;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addrs[i].sin_addr, ip, sizeof ip);
    snprintf(c->saddr[i], sizeof c->saddr[i], "%s:%d", ip, ntohs(addrs[i].sin_port));
  }
  int bad = -1;
  if (st.ok && ct_servers_connect(c, addrs, k, &bad)) { st.ok = 0; st.server = bad; st.err = errno ? errno : EIO; }
  if (agree(c, &st, tmo)) return -1;
  if (st.ok) {
    bad = -1;
    if (ct_servers_wait_acks(c, &bad)) { st = (status_t){STA_MAGIC, 0, c->rank, bad, errno ? errno : EIO, 0}; }
    if (agree(c, &st, tmo)) return -1;
    if (!st.ok) warn_fallback(c, &st, "did not start the session");
  } else if (st.server >= 0) {
    warn_fallback(c, &st, "cannot be reached");
  } else {
    CT_WARN("rank %d/%d: CLUSTERTOOL_REDUCERS of rank 0 is unusable; CollNet uses sharded instead of servers",
            c->rank, c->nranks);
  }
  if (!st.ok) {
    ct_servers_close(c);
    c->nserv = 0;
    if (c->algo == CT_ALGO_SERVERS) c->algo = CT_ALGO_SHARDED;
  }
  return 0;
}

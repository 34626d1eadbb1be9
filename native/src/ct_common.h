/* Shared helpers: logging through NCCL's logger, environment knobs, TCP sockets. */
#ifndef CT_COMMON_H
#define CT_COMMON_H
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include "ct_nccl_abi.h"

#define CT_VERSION "0.1.0"

/* NCCL prints a message only when its flags meet NCCL_DEBUG_SUBSYS (default
 * INIT,BOOTSTRAP,ENV), WARN included (src/debug.cc). So WARN goes out with NCCL_ALL,
 * as NCCL's own WARN does, and INFO with NCCL_INIT|NCCL_NET (the tuner library is
 * built with CT_LOG_INFO_FLAGS=NCCL_TUNING, the subsystem NCCL's tuner uses). */
#ifndef CT_LOG_INFO_FLAGS
#define CT_LOG_INFO_FLAGS (NCCL_INIT | NCCL_NET)
#endif
#define CT_LOG_WARN_FLAGS (~0UL)
extern ncclDebugLogger_t ct_logger;
void ct_log(ncclDebugLogLevel lvl, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define CT_WARN(...) ct_log(NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define CT_INFO(...) ct_log(NCCL_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)

long ct_env_long(const char* name, long dflt, long lo, long hi);
const char* ct_env_str(const char* name, const char* dflt);
/* Strip leading and trailing white space in place. */
char* ct_trim(char* s);
/* Integer with an optional K/M/G suffix (powers of 1024); 0 or -1 (bad or overflowing). */
int ct_parse_size(const char* s, uint64_t* out);

/* Address this process binds to: CLUSTERTOOL_SOCKET_ADDR, else the IPv4 address of
 * CLUSTERTOOL_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME), else the first non-loopback
 * IPv4 interface that is up, else 127.0.0.1. Returns 0 on success. */
int ct_local_addr(struct sockaddr_in* out, char* ifname_out, size_t ifname_len);

/* Listening socket on addr (port 0 = any); fills *bound with the real port. */
int ct_listen_socket(const struct sockaddr_in* addr, struct sockaddr_in* bound);
/* Blocking connect with retries for up to timeout_ms; returns fd or -1. */
int ct_connect_socket(const struct sockaddr_in* addr, int timeout_ms);
/* Non-blocking connect started: returns the fd (connection may be in progress) or -1. */
int ct_connect_start(const struct sockaddr_in* addr);
/* Progress of a started connect: 1 connected, 0 in progress, -1 failed (errno set). */
int ct_connect_check(int fd);
long ct_now_ms(void);
/* TCP_NODELAY and optional buffer sizes (CLUSTERTOOL_SOCKBUF bytes, 0 = kernel autotune). */
void ct_tune_socket(int fd);
/* Blocking full transfers; return 0 or -1 (peer closed / error). */
int ct_send_all(int fd, const void* buf, size_t len);
int ct_recv_all(int fd, void* buf, size_t len);
/* Accept with timeout; returns fd or -1. */
int ct_accept_timeout(int lfd, int timeout_ms);

/* What we put in the opaque 128-byte NCCL handle. */
typedef struct {
  uint32_t magic;
  uint32_t flags;
  struct sockaddr_in addr;   /* 16 bytes */
  uint32_t algo;             /* collnet: CT_ALGO_* of the listener (rank 0's wins) */
  uint32_t nsocks;           /* collnet: sockets per peer */
  uint64_t chunk_bytes;      /* collnet: pipeline chunk */
  uint64_t nonce;
  uint32_t sched;            /* collnet sharded: 0 lock-step, 1 free-running */
  uint32_t threads;          /* collnet: CLUSTERTOOL_COLLNET_THREADS (bits 0-7, 0 = auto) | online CPUs << 8 */
  struct {                   /* net connect side's progress: NCCL keeps the handle between the */
    int32_t state;           /* connect calls of one connection (as its own socket transport */
    int32_t fd;              /* relies on), so a non-blocking connect resumes where it was. */
    uint32_t sent;           /* The listener publishes zeros here. */
    uint32_t tries;
    int64_t t0_ms;
  } stage;
} ct_handle_t;
_Static_assert(sizeof(ct_handle_t) <= NCCL_NET_HANDLE_MAXSIZE, "handle fits NCCL's");
#define CT_HANDLE_MAGIC 0x43544e31u /* "CTN1" */
#endif

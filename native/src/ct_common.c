#define _GNU_SOURCE
#include "ct_common.h"
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

ncclDebugLogger_t ct_logger = NULL;

void ct_log(ncclDebugLogLevel lvl, const char* file, int line, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ct_logger) {
    unsigned long flags = lvl == NCCL_LOG_WARN ? CT_LOG_WARN_FLAGS : (unsigned long)(CT_LOG_INFO_FLAGS);
    ct_logger(lvl, flags, file, line, "clustertool: %s", msg);
  } else if (lvl == NCCL_LOG_WARN || getenv("CLUSTERTOOL_DEBUG")) {
    fprintf(stderr, "clustertool %s: %s\n", lvl == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
  }
}

long ct_env_long(const char* name, long dflt, long lo, long hi) {
  const char* s = getenv(name);
  if (!s || !*s) return dflt;
  char* end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (*end == 'k' || *end == 'K') { v <<= 10; end++; }
  else if (*end == 'm' || *end == 'M') { v <<= 20; end++; }
  if (errno || *end || v < lo || v > hi) {
    CT_WARN("ignoring %s=%s (want %ld..%ld)", name, s, lo, hi);
    return dflt;
  }
  return v;
}

const char* ct_env_str(const char* name, const char* dflt) {
  const char* s = getenv(name);
  return (s && *s) ? s : dflt;
}

int ct_local_addr(struct sockaddr_in* out, char* ifname_out, size_t ifname_len) {
  memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  const char* addr = ct_env_str("CLUSTERTOOL_SOCKET_ADDR", NULL);
  if (addr) {
    if (inet_pton(AF_INET, addr, &out->sin_addr) != 1) {
      CT_WARN("CLUSTERTOOL_SOCKET_ADDR=%s is not an IPv4 address", addr);
      return -1;
    }
    if (ifname_out) snprintf(ifname_out, ifname_len, "%s", addr);
    return 0;
  }
  const char* want = ct_env_str("CLUSTERTOOL_SOCKET_IFNAME", ct_env_str("NCCL_SOCKET_IFNAME", NULL));
  if (want && *want == '=') want++;  /* NCCL's exact-match prefix */
  struct ifaddrs *ifs, *it;
  int found = 0;
  if (getifaddrs(&ifs) == 0) {
    for (it = ifs; it && !found; it = it->ifa_next) {
      if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET || !(it->ifa_flags & IFF_UP)) continue;
      if (want ? strncmp(it->ifa_name, want, strlen(want)) != 0 : (it->ifa_flags & IFF_LOOPBACK))
        continue;
      memcpy(out, it->ifa_addr, sizeof *out);
      if (ifname_out) snprintf(ifname_out, ifname_len, "%s", it->ifa_name);
      found = 1;
    }
    freeifaddrs(ifs);
  }
  if (!found) {
    if (want) { CT_WARN("no IPv4 interface matches %s", want); return -1; }
    out->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ifname_out) snprintf(ifname_out, ifname_len, "lo");
  }
  out->sin_port = 0;
  return 0;
}

void ct_tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  long buf = ct_env_long("CLUSTERTOOL_SOCKBUF", 0, 0, 1L << 30);
  if (buf > 0) {
    int b = (int)buf;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
  }
}

int ct_listen_socket(const struct sockaddr_in* addr, struct sockaddr_in* bound) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ct_tune_socket(fd); /* buffer sizes are inherited by accepted sockets */
  socklen_t len = sizeof *bound;
  if (bind(fd, (const struct sockaddr*)addr, sizeof *addr) || listen(fd, 1024) ||
      getsockname(fd, (struct sockaddr*)bound, &len)) {
    CT_WARN("listen on %s failed: %s", inet_ntoa(addr->sin_addr), strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

long ct_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int ct_connect_start(const struct sockaddr_in* addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  ct_tune_socket(fd);
  if (connect(fd, (const struct sockaddr*)addr, sizeof *addr) == 0 || errno == EINPROGRESS) return fd;
  int err = errno;
  close(fd);
  errno = err;
  return -1;
}

int ct_connect_check(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int r = poll(&p, 1, 0);
  if (r < 0) return errno == EINTR ? 0 : -1;
  if (r == 0) return 0;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)) return -1;
  if (err) { errno = err; return -1; }
  return 1;
}

int ct_connect_socket(const struct sockaddr_in* addr, int timeout_ms) {
  long deadline = ct_now_ms() + timeout_ms;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ct_tune_socket(fd);
    if (connect(fd, (const struct sockaddr*)addr, sizeof *addr) == 0) return fd;
    int err = errno;
    close(fd);
    if ((err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN) || ct_now_ms() > deadline) {
      CT_WARN("connect to %s:%d failed: %s", inet_ntoa(addr->sin_addr), ntohs(addr->sin_port),
              strerror(err));
      return -1;
    }
    usleep(20000);
  }
}

int ct_accept_timeout(int lfd, int timeout_ms) {
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  int r = poll(&p, 1, timeout_ms);
  if (r <= 0) return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) ct_tune_socket(fd);
  return fd;
}

int ct_send_all(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t r = send(fd, p, len, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

int ct_recv_all(int fd, void* buf, size_t len) {
  char* p = buf;
  while (len) {
    ssize_t r = recv(fd, p, len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

char* ct_trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  char* e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

int ct_parse_size(const char* s, uint64_t* out) {
  if (!*s || *s == '-') return -1;
  char* end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  unsigned long long mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1ull << 10;
  else if (*end == 'm' || *end == 'M') mul = 1ull << 20;
  else if (*end == 'g' || *end == 'G') mul = 1ull << 30;
  if (mul != 1) end++;
  if (*end || (v && mul > ~0ull / v)) return -1;
  *out = v * mul;
  return 0;
}

/* Per-process token buckets for CLUSTERTOOL_LINK_RATE (ct_pace.h). */
#define _GNU_SOURCE
#include "ct_pace.h"
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef struct {
  pthread_mutex_t mu;
  double tokens;   /* bytes that may move now (negative: owed) */
  long long last_ns;
} bucket_t;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_rate_bits;      /* 0: unpaced */
static double g_bytes_per_ns, g_burst;
static bucket_t g_b[2] = {{PTHREAD_MUTEX_INITIALIZER, 0, 0}, {PTHREAD_MUTEX_INITIALIZER, 0, 0}};

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t ct_pace_parse_rate(const char* s) {
  if (!s) return 0;
  while (isspace((unsigned char)*s)) s++;
  if (!*s || !strcasecmp(s, "none") || !strcmp(s, "0")) return 0;
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mult;
  if (!strcasecmp(end, "") ) mult = 8;                                   /* bytes/s */
  else if (!strcasecmp(end, "bit") || !strcasecmp(end, "bps")) mult = 1;
  else if (!strcasecmp(end, "kbit")) mult = 1e3;
  else if (!strcasecmp(end, "mbit")) mult = 1e6;
  else if (!strcasecmp(end, "gbit")) mult = 1e9;
  else if (!strcasecmp(end, "k")) mult = 8.0 * 1024;
  else if (!strcasecmp(end, "m")) mult = 8.0 * 1024 * 1024;
  else if (!strcasecmp(end, "g")) mult = 8.0 * 1024 * 1024 * 1024;
  else return -1;
  double bits = v * mult;
  if (bits >= 9.2e18) return -1;
  return (int64_t)bits;
}

static void init_once(void) {
  int64_t r = ct_pace_parse_rate(getenv("CLUSTERTOOL_LINK_RATE"));
  g_rate_bits = r > 0 ? (uint64_t)r : 0;
  if (!g_rate_bits) return;
  g_bytes_per_ns = (double)g_rate_bits / 8.0 / 1e9;
  /* a burst of 2 ms at the rate, at least 64 KiB: small enough to hold the rate over short windows */
  g_burst = g_bytes_per_ns * 2e6;
  if (g_burst < 65536) g_burst = 65536;
  long long t = now_ns();
  for (int d = 0; d < 2; d++) { g_b[d].tokens = g_burst; g_b[d].last_ns = t; }
}

uint64_t ct_pace_rate_bits(void) {
  pthread_once(&g_once, init_once);
  return g_rate_bits;
}

static void refill(bucket_t* b, long long t) {
  b->tokens += (double)(t - b->last_ns) * g_bytes_per_ns;
  if (b->tokens > g_burst) b->tokens = g_burst;
  b->last_ns = t;
}

size_t ct_pace_take(int dir, size_t want, long* wait_us) {
  if (!ct_pace_rate_bits() || want == 0) { if (wait_us) *wait_us = 0; return want; }
  bucket_t* b = &g_b[dir ? 1 : 0];
  pthread_mutex_lock(&b->mu);
  refill(b, now_ns());
  size_t grant = 0;
  if (b->tokens >= 1) {
    grant = b->tokens < (double)want ? (size_t)b->tokens : want;
    b->tokens -= (double)grant;
  }
  if (wait_us) {
    double need = (grant ? 0 : 1) * ((double)(want < 65536 ? want : 65536) - b->tokens);
    *wait_us = need > 0 ? (long)(need / g_bytes_per_ns / 1000.0) + 1 : 0;
  }
  pthread_mutex_unlock(&b->mu);
  return grant;
}

void ct_pace_refund(int dir, size_t unused) {
  if (!ct_pace_rate_bits() || !unused) return;
  bucket_t* b = &g_b[dir ? 1 : 0];
  pthread_mutex_lock(&b->mu);
  b->tokens += (double)unused;
  if (b->tokens > g_burst) b->tokens = g_burst;
  pthread_mutex_unlock(&b->mu);
}

void ct_pace_wait(int dir, size_t len) {
  if (!ct_pace_rate_bits() || !len) return;
  bucket_t* b = &g_b[dir ? 1 : 0];
  /* take the whole length now (the bucket may go negative) and sleep off the debt: FIFO-fair
   * between threads and exact over time */
  pthread_mutex_lock(&b->mu);
  refill(b, now_ns());
  b->tokens -= (double)len;
  double debt = -b->tokens;
  pthread_mutex_unlock(&b->mu);
  if (debt <= 0) return;
  long long ns = (long long)(debt / g_bytes_per_ns);
  struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
  while (nanosleep(&ts, &ts) != 0) {}
}

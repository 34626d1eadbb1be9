/* Per-process token buckets for CLUSTERTOOL_LINK_RATE (ct_pace.h). */
#define _GNU_SOURCE
#include "ct_pace.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "ct_common.h"

typedef struct {
  pthread_mutex_t mu;
  double tokens;   /* bytes that may move now (negative: owed by ct_pace_wait callers) */
  long long last_ns;
  int short_;      /* the last take granted less than it wanted: a sender is waiting on the bucket */
} bucket_t;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_rate_bits;                /* 0: unpaced */
static double g_bytes_per_ns, g_burst, g_catchup, g_grain, g_quantum;
static bucket_t g_b[2] = {{PTHREAD_MUTEX_INITIALIZER, 0, 0, 0}, {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0}};

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* tc's units (iproute2 lib/utils.c get_rate): bits per second, SI or IEC, or bytes per second. */
static const struct { const char* unit; double bits; } UNITS[] = {
    {"bit", 1},      {"kbit", 1e3},           {"mbit", 1e6},           {"gbit", 1e9},
    {"tbit", 1e12},  {"kibit", 1024.0},       {"mibit", 1048576.0},    {"gibit", 1073741824.0},
    {"tibit", 1099511627776.0},               {"bps", 8},              {"kbps", 8e3},
    {"mbps", 8e6},   {"gbps", 8e9},           {"tbps", 8e12},          {"kibps", 8 * 1024.0},
    {"mibps", 8 * 1048576.0},                 {"gibps", 8 * 1073741824.0},
    {"tibps", 8 * 1099511627776.0},
};

int64_t ct_pace_parse_rate(const char* s) {
  if (!s) return 0;
  char buf[64];
  if (strlen(s) >= sizeof buf) return -1;
  char* t = ct_trim(strcpy(buf, s));
  if (!*t || !strcasecmp(t, "none") || !strcmp(t, "0")) return 0;
  if (!isdigit((unsigned char)*t) && *t != '.') return -1;   /* no sign, no inf/nan */
  char* end = NULL;
  errno = 0;
  double v = strtod(t, &end);
  if (end == t || errno || !isfinite(v) || v < 0 || !strncasecmp(t, "0x", 2)) return -1;
  double mult = 0;
  if (!*end) mult = 1;   /* a bare number: bits per second, as in tc */
  for (size_t i = 0; !mult && i < sizeof UNITS / sizeof UNITS[0]; i++)
    if (!strcasecmp(end, UNITS[i].unit)) mult = UNITS[i].bits;
  if (!mult) return -1;
  double bits = v * mult;
  if (bits == 0) return 0;   /* "0gbit": unpaced, like "0" */
  if (bits < 1 || bits >= 9.2e18) return -1;
  return (int64_t)llround(bits);
}

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static void init_once(void) {
  const char* env = getenv("CLUSTERTOOL_LINK_RATE");
  int64_t r = ct_pace_parse_rate(env);
  if (r < 0) CT_WARN("CLUSTERTOOL_LINK_RATE=%s is not a rate (want e.g. 1gbit, 400mbit, 125mbps); not pacing", env);
  g_rate_bits = r > 0 ? (uint64_t)r : 0;
  if (!g_rate_bits) return;
  g_bytes_per_ns = (double)g_rate_bits / 8.0 / 1e9;
  double per_us = g_bytes_per_ns * 1e3;
  g_grain = clampd(250 * per_us, 4096, 65536);
  /* 2 ms at the rate: holds the rate over short windows, and absorbs a caller's late wake-up
   * (timer slack, a loaded box) without losing tokens; at least 4 grains */
  g_burst = 2000 * per_us;
  if (g_burst < 65536) g_burst = 65536;
  if (g_burst < 4 * g_grain) g_burst = 4 * g_grain;
  g_quantum = g_burst / 4 > g_grain ? g_burst / 4 : g_grain;
  /* A taker that wanted more than it got and then runs late (its sleep overshot, the box was
   * busy) finds up to 20 ms at the rate (at least 4 bursts): a NIC drains its queue while the
   * host's threads are elsewhere, a user-space pacer only when its thread runs. An idle bucket
   * still holds only a burst. */
  g_catchup = 20000 * per_us;
  if (g_catchup < 4 * g_burst) g_catchup = 4 * g_burst;
  long long t = now_ns();
  for (int d = 0; d < 2; d++) { g_b[d].tokens = g_burst; g_b[d].last_ns = t; }
  CT_INFO("pacing every socket of this process at %.6g Mbit/s per direction (CLUSTERTOOL_LINK_RATE=%s)",
          (double)g_rate_bits / 1e6, env);
}

uint64_t ct_pace_rate_bits(void) {
  pthread_once(&g_once, init_once);
  return g_rate_bits;
}

size_t ct_pace_burst(void) { return ct_pace_rate_bits() ? (size_t)g_burst : 0; }

static bucket_t* bucket(int dir) { return &g_b[dir == CT_PACE_RX ? 1 : 0]; }

/* Called with b->mu held. The clock is read under the lock, so it never runs backwards here. */
static void refill(bucket_t* b) {
  long long t = now_ns();
  double cap = b->short_ ? g_catchup : g_burst;
  /* untouched for the catch-up span with nobody short: idle; what is left of a catch-up goes */
  if (!b->short_ && b->tokens > g_burst && (double)(t - b->last_ns) * g_bytes_per_ns > g_catchup) b->tokens = g_burst;
  if (t > b->last_ns && b->tokens < cap) {
    b->tokens += (double)(t - b->last_ns) * g_bytes_per_ns;
    if (b->tokens > cap) b->tokens = cap;
  }
  b->last_ns = t;
}

size_t ct_pace_take(int dir, size_t want, long* wait_us) {
  if (wait_us) *wait_us = 0;
  if (!ct_pace_rate_bits() || want == 0) return want;
  bucket_t* b = bucket(dir);
  double w = (double)want, floor_ = w < g_grain ? w : g_grain;
  size_t grant = 0;
  pthread_mutex_lock(&b->mu);
  refill(b);
  if (b->tokens >= floor_) {
    double g = b->tokens < w ? b->tokens : w;
    if (g > g_quantum) g = g_quantum;
    grant = (size_t)g;   /* whole bytes; the fraction stays in the bucket */
    b->tokens -= (double)grant;
  }
  b->short_ = grant < want;
  if (!grant && wait_us) {
    double us = ceil((floor_ - b->tokens) / g_bytes_per_ns / 1e3);
    *wait_us = us < 1 ? 1 : us > 1e6 ? 1000000 : (long)us;
  }
  pthread_mutex_unlock(&b->mu);
  return grant;
}

void ct_pace_refund(int dir, size_t unused) {
  if (!ct_pace_rate_bits() || !unused) return;
  bucket_t* b = bucket(dir);
  pthread_mutex_lock(&b->mu);
  refill(b);   /* so the cap below applies to the tokens of now, not of the last call */
  b->tokens += (double)unused;
  if (b->tokens > g_catchup) b->tokens = g_catchup;   /* only a refund of more than was taken gets here */
  b->short_ = 0;   /* the socket, not the bucket, held the taker back: no catch-up while it is full */
  pthread_mutex_unlock(&b->mu);
}

void ct_pace_wait(int dir, size_t len) {
  if (!ct_pace_rate_bits() || !len) return;
  bucket_t* b = bucket(dir);
  /* take the whole length now (the bucket may go negative) and sleep off the debt: callers are
   * served in the order they came, and the rate holds exactly over time however late a sleep
   * ends (the debt is the bucket's, not the sleeper's) */
  pthread_mutex_lock(&b->mu);
  refill(b);
  b->tokens -= (double)len;
  double debt = -b->tokens;
  b->short_ = debt > 0;   /* a caller sleeping on the bucket is one waiting for it */
  pthread_mutex_unlock(&b->mu);
  if (debt <= 0) return;
  double ns = ceil(debt / g_bytes_per_ns);
  if (ns > 3600e9) ns = 3600e9;
  struct timespec ts = {(time_t)(ns / 1e9), (long)fmod(ns, 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

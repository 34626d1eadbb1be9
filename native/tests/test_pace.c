#define _GNU_SOURCE
/* ct_pace: the CLUSTERTOOL_LINK_RATE parser (tc's units), the unpaced default, a malformed rate
 * left unpaced, grants that never exceed the bucket, refunds, the two directions apart, many
 * threads taking and refunding without a token lost or made, and ct_pace_wait never faster than
 * the rate. Structural checks only: a loaded box makes every bound here looser, never false (the
 * throughput figures are bench/pace_bench.sh's). Each case runs in a child process, because the
 * rate is read once per process. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ct_common.h"
#include "ct_pace.h"
#include "ct_test.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_parse(void) {
  static const struct { const char* s; int64_t bits; } ok[] = {
      {"1gbit", 1000000000LL},   {"400mbit", 400000000LL},   {"10Gbit", 10000000000LL},  {"2.5gbit", 2500000000LL},
      {"200kbit", 200000LL},     {"1tbit", 1000000000000LL}, {"1kibit", 1024},           {"1Mibit", 1048576},
      {"1gibit", 1073741824LL},  {"125mbps", 1000000000LL},  {"1kbps", 8000},            {"1KiBps", 8192},
      {"1mibps", 8388608},       {"100bps", 800},            {"1000", 1000},             {"1000bit", 1000},
      {" 1gbit\n", 1000000000LL}, {"1e9bit", 1000000000LL},  {"none", 0},                {"NONE", 0},
      {"0", 0},                  {"", 0},                    {"   ", 0},                  {"0gbit", 0},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int64_t got = ct_pace_parse_rate(ok[i].s);
    CHECK(got == ok[i].bits, "parse '%s' = %lld (got %lld)", ok[i].s, (long long)ok[i].bits, (long long)got);
  }
  CHECK(ct_pace_parse_rate(NULL) == 0, "parse NULL = unpaced");
  static const char* bad[] = {"fast", "1 gbit", "-1gbit", "+1gbit", "1gbitx", "1M", "125M", "1g", "gbit",
                              "nan", "inf", "infgbit", "0x10", "0.1bit", "1e30gbit", "1gbit/s", "1,5gbit"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK(ct_pace_parse_rate(bad[i]) == -1, "parse '%s' is malformed (got %lld)", bad[i],
          (long long)ct_pace_parse_rate(bad[i]));
}

/* ---- cases in a child with CLUSTERTOOL_LINK_RATE set ---- */

static void case_unpaced(void) {
  CHECK(ct_pace_rate_bits() == 0 && ct_pace_burst() == 0, "no rate: unpaced");
  long w = -1;
  CHECK(ct_pace_take(CT_PACE_TX, 123456789, &w) == 123456789 && w == 0, "unpaced: every take granted in full");
  ct_pace_refund(CT_PACE_TX, 5);
  double t0 = now_s();
  ct_pace_wait(CT_PACE_RX, (size_t)1 << 40);
  CHECK(now_s() - t0 < 1.0, "unpaced: wait returns at once");
}

static char g_warned[512];
static void capture(ncclDebugLogLevel lvl, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (lvl != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_warned, sizeof g_warned, fmt, ap);
  va_end(ap);
}

static void case_malformed(void) {
  ct_logger = capture;
  CHECK(ct_pace_rate_bits() == 0, "a malformed CLUSTERTOOL_LINK_RATE leaves the process unpaced");
  CHECK(strstr(g_warned, "CLUSTERTOOL_LINK_RATE=12 furlongs is not a rate") != NULL, "...and says so: %s", g_warned);
  CHECK(ct_pace_take(CT_PACE_RX, 1000, NULL) == 1000, "malformed rate: takes granted in full");
}

/* CLUSTERTOOL_LINK_RATE=80kbit: 10 KB/s, so the bucket barely refills while the case runs. */
static void case_grants(void) {
  double rate = 10000.0;   /* bytes/s */
  CHECK(ct_pace_rate_bits() == 80000, "rate read from the environment (%llu)", (unsigned long long)ct_pace_rate_bits());
  size_t burst = ct_pace_burst();
  CHECK(burst == 65536, "burst at a low rate: 64 KiB (%zu)", burst);
  double t0 = now_s();
  size_t total = 0, g, biggest = 0, smallest = (size_t)-1;
  long w = 0;
  int calls = 0;
  while ((g = ct_pace_take(CT_PACE_TX, 1 << 20, &w)) > 0 && calls++ < 1000) {
    total += g;
    if (g > biggest) biggest = g;
    if (g < smallest) smallest = g;
  }
  double slack = (now_s() - t0) * rate + 1;
  CHECK(total <= burst + slack && total + 4096 >= burst, "a full bucket gives out its burst and no more (%zu of %zu)",
        total, burst);
  CHECK(biggest <= burst / 4, "no grant above a quarter of the burst (%zu)", biggest);
  CHECK(smallest >= 4096, "no sliver grants: each at least a grain (%zu)", smallest);
  CHECK(g == 0 && w >= 1 && w <= 1000000, "an empty bucket grants 0 and says when to come back (%ld us)", w);
  size_t small = ct_pace_take(CT_PACE_TX, 1, NULL);
  CHECK(small <= 1, "a grant never exceeds want");
  /* the other direction is a bucket of its own */
  CHECK(ct_pace_take(CT_PACE_RX, 10000, NULL) == 10000, "RX untouched by TX's draining");
  /* a refund comes back in full */
  ct_pace_refund(CT_PACE_TX, 5000);
  t0 = now_s();
  g = ct_pace_take(CT_PACE_TX, 1 << 20, NULL);
  slack = (now_s() - t0) * rate + 1;
  CHECK(g >= 5000 && g <= 5000 + 4096 + slack, "refunded tokens are granted again (%zu)", g);
  /* a refund never fills the bucket past its burst */
  ct_pace_refund(CT_PACE_TX, 10u << 20);
  t0 = now_s();
  total = 0;
  for (calls = 0; (g = ct_pace_take(CT_PACE_TX, 1 << 20, NULL)) > 0 && calls < 1000; calls++) total += g;
  slack = (now_s() - t0) * rate + 1;
  CHECK(total <= 4 * burst + slack, "a refund of 10 MiB leaves at most the catch-up of 4 bursts (%zu)", total);
}

/* CLUSTERTOOL_LINK_RATE=80mbit (10 MB/s; burst 64 KiB; catch-up 256 KiB): a taker left short
 * that comes back late finds more than a burst, at most the catch-up; an idle bucket a burst. */
static size_t drain(int dir, double* slack) {
  double t0 = now_s();
  size_t total = 0, g;
  for (int calls = 0; (g = ct_pace_take(dir, 1 << 20, NULL)) > 0 && calls < 100000; calls++) total += g;
  *slack = (now_s() - t0) * 10e6 + 1;
  return total;
}

static void nap_ms(long ms) {
  struct timespec ts = {0, ms * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
}

static void case_catchup(void) {
  size_t burst = ct_pace_burst();
  double slack;
  drain(CT_PACE_TX, &slack);   /* the last take fell short: a sender waits on the bucket */
  nap_ms(60);                  /* 600 KB at the rate: more than the catch-up holds */
  size_t got = drain(CT_PACE_TX, &slack);
  CHECK(got > burst && got <= 4 * burst + slack, "short and late: more than a burst, at most the catch-up (%zu)", got);
  drain(CT_PACE_RX, &slack);
  while (ct_pace_take(CT_PACE_RX, 1, NULL) == 0) {}   /* a take satisfied in full: nobody waits now */
  nap_ms(60);
  got = drain(CT_PACE_RX, &slack);
  CHECK(got <= burst + slack, "idle: a burst at most (%zu)", got);
}

/* CLUSTERTOOL_LINK_RATE=8bit: 1 byte/s, so the bucket holds its burst for the whole case. */
enum { NTHREADS = 8, ROUNDS = 20000 };
static atomic_llong g_net;   /* granted minus refunded, all threads */

static void* churn(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  long long net = 0;
  for (int i = 0; i < ROUNDS; i++) {
    size_t want = 1 + (size_t)(rand_r(&seed) % 20000);
    size_t g = ct_pace_take(CT_PACE_TX, want, NULL);
    if (g > want) net += 1LL << 40;   /* poisons the sum: a grant above want */
    size_t back = g ? (size_t)(rand_r(&seed) % (g + 1)) : 0;
    if (back) ct_pace_refund(CT_PACE_TX, back);
    net += (long long)(g - back);
    if (net > 60000 || (i % 64) == 0) {   /* give some back at random so the bucket keeps moving */
      size_t r = (size_t)(net > 0 ? rand_r(&seed) % (unsigned long long)(net + 1) : 0);
      if (r) { ct_pace_refund(CT_PACE_TX, r); net -= (long long)r; }
    }
  }
  atomic_fetch_add(&g_net, net);
  return NULL;
}

static void case_threads(void) {
  size_t burst = ct_pace_burst();
  double t0 = now_s();
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, churn, (void*)(uintptr_t)(i + 1));
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  long long left = 0;   /* drain what the bucket still holds: whole grains, then byte by byte */
  for (size_t g; (g = ct_pace_take(CT_PACE_TX, 1 << 20, NULL)) > 0;) left += (long long)g;
  for (size_t g; (g = ct_pace_take(CT_PACE_TX, 1, NULL)) > 0;) left += (long long)g;
  double refilled = (now_s() - t0) * 1.0 + 1;   /* 1 byte/s */
  long long kept = atomic_load(&g_net) + left;
  CHECK(kept >= (long long)burst - 1 && kept <= (long long)burst + (long long)refilled,
        "%d threads x %d take/refund: kept + still in the bucket = the burst (%lld of %zu): no token lost or made",
        NTHREADS, ROUNDS, kept, burst);
}

/* CLUSTERTOOL_LINK_RATE=80mbit: 10 MB/s; 4 threads wait for 4 MiB in 64 KiB pieces. */
static void* waiter(void* arg) {
  (void)arg;
  for (int i = 0; i < 16; i++) ct_pace_wait(CT_PACE_RX, 65536);
  return NULL;
}

static void case_wait(void) {
  size_t burst = ct_pace_burst();
  double t0 = now_s();
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, waiter, NULL);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  double took = now_s() - t0, floor_s = (4.0 * 16 * 65536 - (double)burst) / 10e6;
  CHECK(took >= floor_s * 0.999, "4 threads waiting for 4 MiB at 80 Mbit/s take at least %.3f s (%.3f s)", floor_s,
        took);
}

static void in_child(const char* rate, void (*fn)(void), const char* name) {
  int p[2];
  if (pipe(p)) { CHECK(0, "pipe"); return; }
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    if (rate) setenv("CLUSTERTOOL_LINK_RATE", rate, 1);
    else unsetenv("CLUSTERTOOL_LINK_RATE");
    ct_pass = ct_fail = 0;   /* the parent's counts came along with fork */
    fn();
    int counts[2] = {ct_pass, ct_fail};
    ssize_t k = write(p[1], counts, sizeof counts);
    fflush(stderr);
    _exit(k == (ssize_t)sizeof counts ? 0 : 3);
  }
  close(p[1]);
  int counts[2] = {0, 0}, st = 0;
  ssize_t k = read(p[0], counts, sizeof counts);
  close(p[0]);
  waitpid(pid, &st, 0);
  CHECK(k == (ssize_t)sizeof counts && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: the case ran to its end", name);
  ct_pass += counts[0];
  ct_fail += counts[1];
}

int main(void) {
  test_parse();
  in_child(NULL, case_unpaced, "unpaced");
  in_child("12 furlongs", case_malformed, "malformed rate");
  in_child("80kbit", case_grants, "grants");
  in_child("8bit", case_threads, "threads");
  in_child("80mbit", case_catchup, "catch-up");
  in_child("80mbit", case_wait, "wait");
  return CT_SUMMARY();
}

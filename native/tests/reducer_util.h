/* Test helper: start the real clustertool-reducer (build/clustertool-reducer) on
 * 127.0.0.1 with a port file and a log file, wait for the port file, stop it. */
#ifndef REDUCER_UTIL_H
#define REDUCER_UTIL_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

typedef struct {
  pid_t pid;
  char addr[64];        /* "127.0.0.1:PORT" from the port file */
  char port_file[256];
  char log[256];
  int status;           /* wait status once stopped */
} reducer_t;

static long ru_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* dir: a private temporary folder; name: file stem; extra: more arguments (NULL-ended). */
static int reducer_start(reducer_t* r, const char* build, const char* dir, const char* name, const char* const* extra) {
  memset(r, 0, sizeof *r);
  char exe[512];
  snprintf(exe, sizeof exe, "%s/clustertool-reducer", build);
  if (snprintf(r->port_file, sizeof r->port_file, "%s/%s.port", dir, name) >= (int)sizeof r->port_file ||
      snprintf(r->log, sizeof r->log, "%s/%s.log", dir, name) >= (int)sizeof r->log)
    return -1;
  const char* argv[32] = {exe, "--bind", "127.0.0.1", "--port", "0", "--port-file", r->port_file};
  int n = 7;
  for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, r->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  int rc = posix_spawn(&r->pid, exe, &fa, NULL, (char* const*)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) return -1;
  for (long end = ru_now_ms() + 10000; ru_now_ms() < end; usleep(10000)) {
    FILE* f = fopen(r->port_file, "r");
    if (!f) continue;
    char line[128] = "";
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    size_t l = strlen(line);
    if (ok && l > 1 && line[l - 1] == '\n') {
      line[l - 1] = 0;
      snprintf(r->addr, sizeof r->addr, "%s", line);
      return 0;
    }
  }
  kill(r->pid, SIGKILL);
  waitpid(r->pid, NULL, 0);
  r->pid = 0;
  return -1;
}

/* Signal and reap within timeout_ms (SIGKILL after that); returns the wait status or -1. */
static int reducer_stop(reducer_t* r, int sig, int timeout_ms) {
  if (r->pid <= 0) return -1;
  kill(r->pid, sig);
  for (long end = ru_now_ms() + timeout_ms; ru_now_ms() < end; usleep(5000)) {
    if (waitpid(r->pid, &r->status, WNOHANG) == r->pid) { r->pid = 0; return r->status; }
  }
  kill(r->pid, SIGKILL);
  waitpid(r->pid, &r->status, 0);
  r->pid = 0;
  return -1;
}

/* 1 when the reducer's log has a line containing every given piece (NULL-ended). */
__attribute__((unused)) static int reducer_log_has(const reducer_t* r, const char* const* pieces) {
  FILE* f = fopen(r->log, "r");
  if (!f) return 0;
  char line[2048];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    found = 1;
    for (int i = 0; pieces[i]; i++)
      if (!strstr(line, pieces[i])) { found = 0; break; }
  }
  fclose(f);
  return found;
}

/* Waits up to timeout_ms for such a line (the reducer writes it when a session ends). */
__attribute__((unused)) static int reducer_log_wait(const reducer_t* r, const char* const* pieces, int timeout_ms) {
  for (long end = ru_now_ms() + timeout_ms;; usleep(10000)) {
    if (reducer_log_has(r, pieces)) return 1;
    if (ru_now_ms() > end) return 0;
  }
}
#endif

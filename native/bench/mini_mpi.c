/* mini_mpi: see mini_mpi.h. The control file holds a sense-counting barrier; the data
 * file holds one slot per rank for the collective in progress and only ever grows.
 * Every collective is: write my slot, barrier, read (every rank reduces the slots in
 * rank order, so all get the same bits), barrier. Waiters spin a little, then sleep
 * 20 us a pass, so a waiting rank leaves the cores to the ones still working. */
#define _GNU_SOURCE
#include "mini_mpi.h"
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  _Atomic unsigned arrived;
  _Atomic unsigned generation;
  _Atomic int aborted;
} ctl_t;

static int g_rank = -1, g_size = 0, g_data_fd = -1;
static ctl_t* g_ctl;
static unsigned char* g_data;
static size_t g_data_len;

static void die(const char* what) {
  fprintf(stderr, "mini_mpi: %s: %s\n", what, strerror(errno));
  _exit(1);
}

static int env_int(const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) {
    fprintf(stderr, "mini_mpi: %s is not set (start the ranks with bench/minirun.py)\n", name);
    _exit(2);
  }
  return atoi(v);
}

int MPI_Init(int* argc, char*** argv) {
  (void)argc; (void)argv;
  g_rank = env_int("CT_MINI_MPI_RANK");
  g_size = env_int("CT_MINI_MPI_SIZE");
  const char* dir = getenv("CT_MINI_MPI_DIR");
  if (!dir || !*dir || g_size < 1 || g_rank < 0 || g_rank >= g_size) {
    fprintf(stderr, "mini_mpi: CT_MINI_MPI_DIR/RANK/SIZE are not a rank of a run\n");
    _exit(2);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/ctl", dir);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) die(path);
  g_ctl = mmap(NULL, sizeof(ctl_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (g_ctl == MAP_FAILED) die("mmap ctl");
  close(fd);
  snprintf(path, sizeof path, "%s/data", dir);
  g_data_fd = open(path, O_RDWR | O_CLOEXEC);
  if (g_data_fd < 0) die(path);
  return MPI_Barrier(MPI_COMM_WORLD);
}

int MPI_Comm_rank(MPI_Comm c, int* rank) { (void)c; *rank = g_rank; return 0; }
int MPI_Comm_size(MPI_Comm c, int* size) { (void)c; *size = g_size; return 0; }

double MPI_Wtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int MPI_Barrier(MPI_Comm c) {
  (void)c;
  unsigned gen = atomic_load(&g_ctl->generation);
  if (atomic_fetch_add(&g_ctl->arrived, 1) + 1 == (unsigned)g_size) {
    atomic_store(&g_ctl->arrived, 0);
    atomic_fetch_add(&g_ctl->generation, 1);
    return 0;
  }
  for (unsigned spins = 0; atomic_load(&g_ctl->generation) == gen; spins++) {
    if (atomic_load(&g_ctl->aborted)) _exit(1);
    if (spins > 1000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}

/* My slot in the data file, the file grown (never shrunk) to hold every rank's. */
static unsigned char* slots(size_t per_rank) {
  size_t need = per_rank * (size_t)g_size;
  if (need > g_data_len) {
    off_t have = lseek(g_data_fd, 0, SEEK_END);   /* not fstat: GLIBC_2.33 */
    if (have < 0) die("size of data");
    if ((size_t)have < need && ftruncate(g_data_fd, (off_t)need)) die("grow data");
    if (g_data) munmap(g_data, g_data_len);
    g_data = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, g_data_fd, 0);
    if (g_data == MAP_FAILED) die("mmap data");
    g_data_len = need;
  }
  return g_data;
}

static size_t type_size(MPI_Datatype t) {
  switch (t) {
    case MPI_BYTE: case MPI_INT8_T: case MPI_UINT8_T: return 1;
    case MPI_INT: case MPI_INT32_T: case MPI_UINT32_T: case MPI_FLOAT: return 4;
    case MPI_LONG: case MPI_INT64_T: case MPI_UINT64_T: case MPI_DOUBLE: return 8;
    default: return 0;
  }
}

int MPI_Allgather(const void* sbuf, int scount, MPI_Datatype st, void* rbuf, int rcount, MPI_Datatype rt, MPI_Comm c) {
  (void)rcount; (void)rt;
  size_t n = (size_t)scount * type_size(st);
  unsigned char* d = slots(n);
  memcpy(d + (size_t)g_rank * n, sbuf, n);
  MPI_Barrier(c);
  memcpy(rbuf, d, n * (size_t)g_size);
  MPI_Barrier(c);
  return 0;
}

#define REDUCE(T)                                                              \
  do {                                                                         \
    T* out = (T*)rbuf;                                                         \
    for (int r = 1; r < g_size; r++) {                                         \
      const T* in = (const T*)(d + (size_t)r * n);                             \
      for (size_t i = 0; i < (size_t)count; i++)                               \
        out[i] = op == MPI_SUM ? out[i] + in[i] : op == MPI_PROD ? out[i] * in[i] \
               : op == MPI_MAX ? (in[i] > out[i] ? in[i] : out[i])             \
                               : (in[i] < out[i] ? in[i] : out[i]);            \
    }                                                                          \
  } while (0)

int MPI_Allreduce(const void* sbuf, void* rbuf, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  size_t n = (size_t)count * type_size(t);
  if (!type_size(t) || op < MPI_SUM || op > MPI_MIN) {
    fprintf(stderr, "mini_mpi: MPI_Allreduce of type %d op %d is not supported\n", t, op);
    MPI_Abort(c, 1);
  }
  unsigned char* d = slots(n);
  memcpy(d + (size_t)g_rank * n, sbuf, n);
  MPI_Barrier(c);
  memcpy(rbuf, d, n);   /* rank 0's, then the others in rank order */
  switch (t) {
    case MPI_BYTE: case MPI_UINT8_T: REDUCE(uint8_t); break;
    case MPI_INT8_T: REDUCE(int8_t); break;
    case MPI_INT: case MPI_INT32_T: REDUCE(int32_t); break;
    case MPI_UINT32_T: REDUCE(uint32_t); break;
    case MPI_LONG: case MPI_INT64_T: REDUCE(int64_t); break;
    case MPI_UINT64_T: REDUCE(uint64_t); break;
    case MPI_FLOAT: REDUCE(float); break;
    default: REDUCE(double); break;
  }
  MPI_Barrier(c);
  return 0;
}

int MPI_Abort(MPI_Comm c, int code) {
  (void)c;
  if (g_ctl) atomic_store(&g_ctl->aborted, 1);   /* ranks in a barrier leave it */
  _exit(code ? code : 1);
}

int MPI_Finalize(void) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_data) munmap(g_data, g_data_len);
  if (g_data_fd >= 0) close(g_data_fd);
  munmap(g_ctl, sizeof(ctl_t));
  g_data = NULL; g_ctl = NULL; g_data_fd = -1;
  return 0;
}

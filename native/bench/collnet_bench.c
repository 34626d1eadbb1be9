/* collnet_bench: drives the CollNet plugin the way NCCL's proxy does (dlopen,
 * listen, handles swapped with MPI_Allgather, connect, regMr, iallreduce/test)
 * and prints an all_reduce_perf-style table. -a mpi times MPI_Allreduce instead.
 *   mpirun -np 4 collnet_bench -b 1M -e 64M -f 2 -d float -o sum -a servers,sharded,ring,mpi -r 256K -q 8
 * -r BYTES -q N: NCCL's shape. Each allreduce is cut into requests of BYTES, at most N
 * outstanding, posted and tested from one thread: post while fewer than N are out (a
 * NULL request from the plugin: its window is full, try again on the next pass), test
 * only the oldest, sched_yield() when a pass moved nothing (src/transport/coll_net.cc
 * and src/proxy.cc). Without -r: one request per allreduce, waited for (the old form).
 * -a servers needs CLUSTERTOOL_REDUCERS (addr:port of running clustertool-reducers). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#ifdef CT_MINI_MPI
#include "mini_mpi.h"   /* make lite: no MPI library, ranks started by bench/minirun.py */
#else
#include <mpi.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "ct_nccl_abi.h"
#include "ct_reduce.h"

typedef struct {
  size_t minb, maxb;
  double factor;
  int iters, warmup, check;
  size_t request;      /* -r: bytes per request, 0 = one request per allreduce */
  int depth;           /* -q: requests outstanding at most */
  int idle_us;         /* -i: sleep this long when a pass moved nothing, 0 = sched_yield() (NCCL's proxy) */
  ncclDataType_t dt;
  ncclRedOp_t op;
  char algos[128];
  char plugin[PATH_MAX];
} opts_t;

static int rank, nranks;

static size_t parse_bytes(const char* s) {
  char* e;
  double v = strtod(s, &e);
  switch (*e) { case 'G': case 'g': v *= 1 << 30; break; case 'M': case 'm': v *= 1 << 20; break;
                case 'K': case 'k': v *= 1 << 10; break; default: break; }
  return (size_t)v;
}

static int parse_dtype(const char* s, ncclDataType_t* t) {
  static const struct { const char* n; ncclDataType_t t; } m[] = {
      {"float", ncclFloat32}, {"float32", ncclFloat32}, {"half", ncclFloat16}, {"float16", ncclFloat16},
      {"bfloat16", ncclBfloat16}, {"bf16", ncclBfloat16}, {"double", ncclFloat64}, {"int32", ncclInt32},
      {"int", ncclInt32}, {"uint32", ncclUint32}, {"int64", ncclInt64}, {"uint64", ncclUint64},
      {"int8", ncclInt8}, {"uint8", ncclUint8}};
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (!strcasecmp(s, m[i].n)) { *t = m[i].t; return 0; }
  return -1;
}

static int parse_op(const char* s, ncclRedOp_t* op) {
  const char* n[] = {"sum", "prod", "max", "min"};
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(s, n[i])) { *op = (ncclRedOp_t)i; return 0; }
  return -1;
}

static void usage(void) {
  if (rank == 0)
    fprintf(stderr, "usage: collnet_bench [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup]\n"
                    "  [-c 0|1 check] [-d float|half|bfloat16|double|int32|uint32|int64|uint64|int8|uint8]\n"
                    "  [-o sum|prod|min|max] [-a servers,sharded,ring,mpi] [-p plugin.so] [-r request_bytes] [-q depth]\n"
                    "  [-i idle_us]\n"
                    "  -r/-q: requests of that size, at most depth outstanding, tested oldest first (NCCL's proxy)\n"
                    "  -i: sleep that long when a pass moved nothing (default 0: sched_yield, as NCCL's proxy)\n"
                    "  -a servers needs CLUSTERTOOL_REDUCERS=addr:port,... (running clustertool-reducers)\n");
  MPI_Finalize();
  exit(2);
}

static void parse(int argc, char** argv, opts_t* o) {
  *o = (opts_t){.minb = 1 << 20, .maxb = 64 << 20, .factor = 2, .iters = 5, .warmup = 1, .check = 1,
                .dt = ncclFloat32, .op = ncclSum, .request = 0, .depth = 8};
  snprintf(o->algos, sizeof o->algos, "sharded");
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  self[k > 0 ? k : 0] = 0;
  snprintf(o->plugin, sizeof o->plugin, "%s/libnccl-net-clustertool.so", dirname(self));
  const char* env = getenv("CLUSTERTOOL_PLUGIN");
  if (env) snprintf(o->plugin, sizeof o->plugin, "%s", env);
  int c;
  while ((c = getopt(argc, argv, "b:e:f:n:w:c:d:o:a:p:r:q:i:h")) != -1) {
    switch (c) {
      case 'b': o->minb = parse_bytes(optarg); break;
      case 'e': o->maxb = parse_bytes(optarg); break;
      case 'f': o->factor = atof(optarg); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'c': o->check = atoi(optarg); break;
      case 'd': if (parse_dtype(optarg, &o->dt)) usage(); break;
      case 'o': if (parse_op(optarg, &o->op)) usage(); break;
      case 'a': snprintf(o->algos, sizeof o->algos, "%s", optarg); break;
      case 'p': snprintf(o->plugin, sizeof o->plugin, "%s", optarg); break;
      case 'r': o->request = parse_bytes(optarg); break;
      case 'q': o->depth = atoi(optarg); break;
      case 'i': o->idle_us = atoi(optarg); break;
      default: usage();
    }
  }
  if (o->factor <= 1 || o->iters < 1 || o->minb > o->maxb || o->depth < 1 || o->depth > 1024 || o->idle_us < 0 ||
      o->idle_us > 100000)
    usage();
}

/* Small integers: every dtype sums them exactly for up to 8 ranks. */
static double input_value(int r, size_t i, ncclDataType_t t) {
  double v = (double)((int)((i * 7 + (size_t)r * 13) % 9) - 4 + (r % 3));
  int is_unsigned = t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
  return is_unsigned ? v + 4 : v;
}

static void store(void* buf, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = ct_float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = ct_float_to_bf16((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    default: ((double*)buf)[i] = v; break;
  }
}

static double load(const void* buf, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return ct_half_to_float(((const uint16_t*)buf)[i]);
    case ncclBfloat16: return ct_bf16_to_float(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    default: return ((const double*)buf)[i];
  }
}

/* MPI types for timing -a mpi; 16-bit floats have none. */
static MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T; case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T; case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T; case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT; case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}
static MPI_Op mpi_op(ncclRedOp_t op) {
  return op == ncclSum ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : MPI_MIN;
}

/* Reference: MPI_Allreduce of the same inputs, carried as doubles (exact here). */
static long count_wrong(const opts_t* o, const void* got, size_t count) {
  double* in = malloc(count * sizeof(double) + 8);
  double* ref = malloc(count * sizeof(double) + 8);
  unsigned char* tmp = malloc(count * 8 + 8);
  for (size_t i = 0; i < count; i++) {
    store(tmp, i, o->dt, input_value(rank, i, o->dt));
    in[i] = load(tmp, i, o->dt);  /* the value as the dtype holds it */
  }
  MPI_Allreduce(in, ref, (int)count, MPI_DOUBLE, mpi_op(o->op), MPI_COMM_WORLD);
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    store(tmp, i, o->dt, ref[i]);  /* wrap/round the reference like the dtype */
    if (load(tmp, i, o->dt) != load(got, i, o->dt)) wrong++;
  }
  free(in); free(ref); free(tmp);
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

typedef struct {
  ncclCollNet_v12_t* cn;
  void* ctx;
  void* comm;
  void* listen;
  const char* (*comm_algo)(void*);   /* the plugin's ct_collnet_comm_algo: what the comm really runs */
} coll_t;

static int coll_open(coll_t* c, const char* algo) {
  setenv("CLUSTERTOOL_COLLNET_ALGO", algo, 1);
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  if (c->cn->listen(c->ctx, 0, handle, &c->listen) != ncclSuccess) return -1;
  char* all = malloc((size_t)nranks * NCCL_NET_HANDLE_MAXSIZE);
  void** ptrs = malloc(sizeof(void*) * (size_t)nranks);
  MPI_Allgather(handle, NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, all, NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 0; r < nranks; r++) ptrs[r] = all + (size_t)r * NCCL_NET_HANDLE_MAXSIZE;
  int rc = c->cn->connect(ptrs, nranks, rank, c->listen, &c->comm) == ncclSuccess ? 0 : -1;
  free(all); free(ptrs);
  /* a servers comm whose servers did not answer falls back to sharded (with a WARN):
   * its rows would be sharded's, so the run stops instead of mislabelling them */
  if (rc == 0 && c->comm_algo && strcmp(c->comm_algo(c->comm), algo)) {
    if (rank == 0)
      fprintf(stderr, "collnet_bench: asked for %s, the plugin runs %s (see the WARN above)\n", algo,
              c->comm_algo(c->comm));
    return -1;
  }
  return rc;
}

/* A pass that moved nothing: give the CPU away, as NCCL's proxy does (sched_yield), or with
 * -i sleep that long (on a box with fewer cores than threads, a thread that keeps yielding
 * takes turns from the plugin's progress threads; NCCL's proxy has a core of its own). */
static void idle(const opts_t* o) {
  if (o->idle_us) usleep((useconds_t)o->idle_us);
  else sched_yield();
}

static int run_plugin_once(coll_t* c, const opts_t* o, void* sb, void* rb, size_t count, void* smh, void* rmh) {
  void* req = NULL;
  while (!req) {
    if (c->cn->iallreduce(c->comm, sb, rb, count, o->dt, o->op, smh, rmh, &req) != ncclSuccess) return -1;
    if (!req) idle(o);
  }
  int done = 0, size = 0;
  for (;;) {
    if (c->cn->test(req, &done, &size) != ncclSuccess) return -1;
    if (done) return 0;
    idle(o);
  }
}

/* NCCL's proxy loop for one allreduce cut into requests of o->request bytes. */
static int run_plugin_stream(coll_t* c, const opts_t* o, char* sb, char* rb, size_t count, void* smh, void* rmh) {
  size_t esz = ct_dtype_size(o->dt), per = o->request / esz ? o->request / esz : 1;
  size_t nreq = (count + per - 1) / per, posted = 0, done_n = 0;
  void* fifo[1024];
  while (done_n < nreq) {
    int moved = 0;
    while (posted < nreq && posted - done_n < (size_t)o->depth) {
      size_t first = posted * per, n = count - first < per ? count - first : per;
      void* req = NULL;
      if (c->cn->iallreduce(c->comm, sb + first * esz, rb + first * esz, n, o->dt, o->op, smh, rmh, &req) != ncclSuccess)
        return -1;
      if (!req) break;   /* the plugin's window is full: again on the next pass */
      fifo[posted++ % 1024] = req;
      moved = 1;
    }
    if (done_n < posted) {
      int done = 0, size = 0;
      if (c->cn->test(fifo[done_n % 1024], &done, &size) != ncclSuccess) return -1;
      if (done) { done_n++; moved = 1; }
    }
    if (!moved) idle(o);   /* no request progressed: let others run */
  }
  return 0;
}

static int run_plugin(coll_t* c, const opts_t* o, void* sb, void* rb, size_t count, void* smh, void* rmh) {
  if (o->request && count) return run_plugin_stream(c, o, sb, rb, count, smh, rmh);
  return run_plugin_once(c, o, sb, rb, count, smh, rmh);
}

static int bench_algo(const opts_t* o, coll_t* c, const char* algo, double* busbw_sum, int* nsizes) {
  int is_mpi = !strcmp(algo, "mpi");
#ifdef CT_MINI_MPI
  if (is_mpi) {   /* mini_mpi's allreduce goes through files: timing it would mislead */
    if (rank == 0) printf("# mpi: not in the lite build (no MPI library), skipped\n");
    return 0;
  }
#endif
  if (is_mpi && mpi_type(o->dt) == MPI_DATATYPE_NULL) {
    if (rank == 0) printf("# mpi: no MPI datatype for %s, skipped\n", ct_dtype_name(o->dt));
    return 0;
  }
  if (!is_mpi && coll_open(c, algo)) {
    if (rank == 0) fprintf(stderr, "collnet_bench: %s: collnet connect failed\n", algo);
    return -1;
  }
  size_t esz = ct_dtype_size(o->dt);
  void* sb = malloc(o->maxb + esz);
  void* rb = malloc(o->maxb + esz);
  void *smh = NULL, *rmh = NULL;
  if (!is_mpi) {
    c->cn->regMr(c->comm, sb, o->maxb, NCCL_PTR_HOST, &smh);
    c->cn->regMr(c->comm, rb, o->maxb, NCCL_PTR_HOST, &rmh);
  }
  for (size_t i = 0; i < o->maxb / esz; i++) store(sb, i, o->dt, input_value(rank, i, o->dt));
  for (size_t bytes = o->minb; bytes <= o->maxb; bytes = (size_t)((double)bytes * o->factor) > bytes ? (size_t)((double)bytes * o->factor) : bytes + 1) {
    size_t count = bytes / esz;
    int err = 0;
    for (int it = 0; it < o->warmup && !err; it++) {
      if (is_mpi) MPI_Allreduce(sb, rb, (int)count, mpi_type(o->dt), mpi_op(o->op), MPI_COMM_WORLD);
      else err = run_plugin(c, o, sb, rb, count, smh, rmh);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < o->iters && !err; it++) {
      if (is_mpi) MPI_Allreduce(sb, rb, (int)count, mpi_type(o->dt), mpi_op(o->op), MPI_COMM_WORLD);
      else err = run_plugin(c, o, sb, rb, count, smh, rmh);
    }
    double el = (MPI_Wtime() - t0) / o->iters, elmax = 0;
    int anyerr = 0;
    MPI_Allreduce(&err, &anyerr, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anyerr) { if (rank == 0) fprintf(stderr, "collnet operation failed\n"); return -1; }
    MPI_Allreduce(&el, &elmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long wrong = o->check ? count_wrong(o, rb, count) : -1;
    double algbw = (double)(count * esz) / elmax / 1e9, busbw = algbw * 2.0 * (nranks - 1) / nranks;
    *busbw_sum += busbw;
    (*nsizes)++;
    if (rank == 0)
      printf("%12zu  %12zu  %8s  %6s  %8s  %10.1f  %8.4f  %8.4f  %6ld\n", count * esz, count, ct_dtype_name(o->dt),
             ct_op_name(o->op), algo, elmax * 1e6, algbw, busbw, wrong);
    fflush(stdout);
  }
  if (!is_mpi) {
    c->cn->deregMr(c->comm, smh);
    c->cn->deregMr(c->comm, rmh);
    c->cn->closeColl(c->comm);
    c->cn->closeListen(c->listen);
  }
  free(sb); free(rb);
  return 0;
}

/* Developer aid: CLUSTERTOOL_BENCH_NETNS=name%d moves this rank's later sockets
 * (the plugin's) into network namespace name<rank> after MPI is up, so plugin
 * traffic crosses shaped links while MPI's own bootstrap stays where it started. */
static void enter_netns(void) {
  const char* fmt = getenv("CLUSTERTOOL_BENCH_NETNS");
  if (!fmt || !*fmt) return;
  char name[256], path[300];
  snprintf(name, sizeof name, fmt, rank);
  snprintf(path, sizeof path, "/var/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET)) {
    fprintf(stderr, "rank %d: cannot enter netns %s\n", rank, name);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  close(fd);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  enter_netns();
  opts_t o;
  parse(argc, argv, &o);
  coll_t c = {0};
  int need_plugin = strcmp(o.algos, "mpi") != 0;
  if (need_plugin) {
    void* lib = dlopen(o.plugin, RTLD_NOW | RTLD_LOCAL);
    c.cn = lib ? dlsym(lib, "ncclCollNetPlugin_v12") : NULL;
    c.comm_algo = lib ? (const char* (*)(void*))dlsym(lib, "ct_collnet_comm_algo") : NULL;
    if (!c.cn || c.cn->init(&c.ctx, 0, NULL) != ncclSuccess) {
      fprintf(stderr, "rank %d: cannot load CollNet plugin %s: %s\n", rank, o.plugin, lib ? "init failed" : dlerror());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (rank == 0) {
    printf("# collnet_bench: %d ranks, plugin %s\n", nranks, need_plugin ? o.plugin : "(none)");
    const char* red = getenv("CLUSTERTOOL_REDUCERS");
    if (red && *red && strstr(o.algos, "servers")) printf("# reduction servers: %s\n", red);
    if (need_plugin && o.request)
      printf("# requests of %zu bytes, at most %d outstanding, oldest tested first (NCCL's proxy)", o.request, o.depth);
    else if (need_plugin)
      printf("# one request per allreduce");
    if (need_plugin) printf(o.idle_us ? "; idle passes sleep %d us\n" : "; idle passes sched_yield()%.0d\n", o.idle_us);
    if (need_plugin) {
      ncclNetProperties_v12_t p;
      if (c.cn->getProperties(0, &p) == ncclSuccess) printf("# device %s speed %d Mbps\n", p.name, p.speed);
    }
    printf("#%11s  %12s  %8s  %6s  %8s  %10s  %8s  %8s  %6s\n", "size", "count", "type", "redop", "algo", "time",
           "algbw", "busbw", "#wrong");
    printf("#%11s  %12s  %8s  %6s  %8s  %10s  %8s  %8s  %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
           "(GB/s)", "");
  }
  int rc = 0;
  char algos[128];
  snprintf(algos, sizeof algos, "%s", o.algos);
  double bus = 0;
  int nsz = 0;
  for (char *save = NULL, *a = strtok_r(algos, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save)) {
    if (strcmp(a, "servers") && strcmp(a, "sharded") && strcmp(a, "ring") && strcmp(a, "mpi")) {
      if (rank == 0) fprintf(stderr, "unknown algorithm %s (servers|sharded|ring|mpi)\n", a);
      rc = 2;
      break;
    }
    if (!strcmp(a, "servers") && !*(getenv("CLUSTERTOOL_REDUCERS") ? getenv("CLUSTERTOOL_REDUCERS") : "")) {
      if (rank == 0) fprintf(stderr, "collnet_bench: -a servers needs CLUSTERTOOL_REDUCERS=addr:port,...\n");
      rc = 2;
      break;
    }
    rc = bench_algo(&o, &c, a, &bus, &nsz);
  }
  if (rank == 0 && nsz) printf("# Avg bus bandwidth    : %g\n", bus / nsz);
  if (need_plugin && c.cn) c.cn->finalize(c.ctx);
  MPI_Finalize();
  return rc;
}

/* mini_mpi: the few MPI calls collnet_bench makes, for machines without an MPI library
 * (a GPU host whose image has none). Ranks are processes on one host, started by
 * bench/minirun.py, which sets CT_MINI_MPI_DIR (a folder holding the shared files),
 * CT_MINI_MPI_RANK and CT_MINI_MPI_SIZE. Collectives go through files mapped by every
 * rank: a barrier on atomics and one slot per rank. Only MPI_COMM_WORLD; no
 * MPI_IN_PLACE. Built in with -DCT_MINI_MPI (make lite); never a stand-in for
 * MPI_Allreduce in a table: collnet_bench refuses -a mpi in this build. */
#ifndef CT_MINI_MPI_H
#define CT_MINI_MPI_H
#include <stddef.h>

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
#define MPI_COMM_WORLD 0
enum {
  MPI_DATATYPE_NULL = 0, MPI_BYTE, MPI_INT, MPI_LONG, MPI_FLOAT, MPI_DOUBLE, MPI_INT8_T, MPI_UINT8_T,
  MPI_INT32_T, MPI_UINT32_T, MPI_INT64_T, MPI_UINT64_T
};
enum { MPI_SUM = 1, MPI_PROD, MPI_MAX, MPI_MIN };

int MPI_Init(int* argc, char*** argv);
int MPI_Comm_rank(MPI_Comm c, int* rank);
int MPI_Comm_size(MPI_Comm c, int* size);
int MPI_Barrier(MPI_Comm c);
int MPI_Allgather(const void* sbuf, int scount, MPI_Datatype st, void* rbuf, int rcount, MPI_Datatype rt, MPI_Comm c);
int MPI_Allreduce(const void* sbuf, void* rbuf, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c);
double MPI_Wtime(void);
int MPI_Abort(MPI_Comm c, int code);
int MPI_Finalize(void);
#endif

/* clustertool: the plugin ABI versions older NCCL releases look for.
 *
 * Facts used (layouts and values only; the declarations are our own):
 *   NCCL 2.19.3 - 2.25.1 src/include/nccl_net.h      ncclNet/ncclCollNet v5 .. v9, properties v6 .. v9
 *   NCCL 2.26.2 - 2.30.7 src/include/plugin/net/net_v10.h, net_v11.h
 *   NCCL 2.19.3 src/include/nccl_tuner.h (v1), 2.21.5 (v2), 2.30.7 src/include/plugin/tuner/tuner_v2..v4.h
 *   net_device.h: ncclNetDeviceHandle_v7 .. v11 share the v12 layout.
 * Which release asks for which symbol is in native/README.md ("ABI versions").
 * Every struct is pinned with static assertions at the bottom (LP64 Linux).
 */
#ifndef CT_NCCL_ABI_COMPAT_H
#define CT_NCCL_ABI_COMPAT_H
#include "ct_nccl_abi.h"

#define NCCL_ALL (~0UL)
typedef ncclNetDeviceHandle_v12_t ncclNetDeviceHandle_old_t;   /* v7 .. v11: same fields */

/* ---- properties ---- */
typedef struct {            /* v5 and v6 */
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
} ncclNetProperties_v6_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v7_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

#define NCCL_NET_MAX_DEVS_PER_NIC_V9 4
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;

typedef struct {            /* v9 and v10 */
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct { void* mhandle; void* address; uint32_t size; } ncclNetSGE_v8_t;
typedef ncclNetSGE_v12_t ncclNetSGE_v9_t;    /* size_t size from v9 on */

/* ---- net tables ---- */
#define CT_NET_COMMON_TAIL                                                                        \
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request); \
  ncclResult_t (*test)(void* request, int* done, int* sizes);                                     \
  ncclResult_t (*closeSend)(void* sendComm);                                                      \
  ncclResult_t (*closeRecv)(void* recvComm);                                                      \
  ncclResult_t (*closeListen)(void* listenComm);

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  CT_NET_COMMON_TAIL
} ncclNet_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  CT_NET_COMMON_TAIL
} ncclNet_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_old_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_old_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  CT_NET_COMMON_TAIL
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_old_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_old_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  CT_NET_COMMON_TAIL
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_old_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_old_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  CT_NET_COMMON_TAIL
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

typedef ncclNetCommConfig_v12_t ncclNetCommConfig_v10_t;
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_old_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_old_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  CT_NET_COMMON_TAIL
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v10_t;

/* v11 is v12 with the v11 properties (and 4-entry vProps). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_old_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_old_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  CT_NET_COMMON_TAIL
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v11_t;

/* ---- CollNet tables ---- */
#define CT_COLL_HEAD(PROPS)                                                                        \
  const char* name;                                                                                \
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);                                             \
  ncclResult_t (*devices)(int* ndev);                                                              \
  ncclResult_t (*getProperties)(int dev, PROPS* props);                                            \
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);                                \
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm); \
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
#define CT_COLL_TAIL                                                                               \
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);     \
  ncclResult_t (*test)(void* request, int* done, int* size);                                       \
  ncclResult_t (*closeColl)(void* collComm);                                                       \
  ncclResult_t (*closeListen)(void* listenComm);
#define CT_COLL_IALLREDUCE(COUNT_T)                                                                \
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, COUNT_T count,        \
                             ncclDataType_t dataType, ncclRedOp_t redOp, void* sendMhandle,        \
                             void* recvMhandle, void** request);
#define CT_COLL_GATHER_SCATTER(SGE)                                                                \
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, SGE* recvParts,       \
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes,         \
                             void* sendMhandle, void** request);                                   \
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, SGE* sendParts, void* recvData,   \
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes,     \
                                 ncclDataType_t dataType, ncclRedOp_t redOp, void* recvMhandle,    \
                                 void** request);
#define CT_COLL_REGMR(SIZE_T)                                                                      \
  ncclResult_t (*regMr)(void* collComm, void* data, SIZE_T size, int type, void** mhandle);
#define CT_COLL_DMABUF                                                                             \
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, \
                              int fd, void** mhandle);
#define CT_COLL_DEREG ncclResult_t (*deregMr)(void* collComm, void* mhandle);

typedef struct { CT_COLL_HEAD(ncclNetProperties_v6_t) CT_COLL_REGMR(int) CT_COLL_DEREG
                 CT_COLL_IALLREDUCE(int) CT_COLL_TAIL } ncclCollNet_v5_t;
typedef struct { CT_COLL_HEAD(ncclNetProperties_v6_t) CT_COLL_REGMR(int) CT_COLL_DMABUF CT_COLL_DEREG
                 CT_COLL_IALLREDUCE(int) CT_COLL_TAIL } ncclCollNet_v6_t;
typedef struct { CT_COLL_HEAD(ncclNetProperties_v7_t) CT_COLL_REGMR(int) CT_COLL_DMABUF CT_COLL_DEREG
                 CT_COLL_IALLREDUCE(int) CT_COLL_TAIL } ncclCollNet_v7_t;
typedef struct { CT_COLL_HEAD(ncclNetProperties_v8_t) CT_COLL_REGMR(size_t) CT_COLL_DMABUF CT_COLL_DEREG
                 CT_COLL_IALLREDUCE(int) CT_COLL_GATHER_SCATTER(ncclNetSGE_v8_t) CT_COLL_TAIL } ncclCollNet_v8_t;
typedef struct { CT_COLL_HEAD(ncclNetProperties_v9_t) CT_COLL_REGMR(size_t) CT_COLL_DMABUF CT_COLL_DEREG
                 CT_COLL_IALLREDUCE(size_t) CT_COLL_GATHER_SCATTER(ncclNetSGE_v9_t) CT_COLL_TAIL
                 ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props); } ncclCollNet_v9_t;
typedef ncclCollNet_v9_t ncclCollNet_v10_t;   /* v10 differs from v9 only in the header it lives in */

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  CT_COLL_REGMR(size_t) CT_COLL_DMABUF CT_COLL_DEREG CT_COLL_IALLREDUCE(size_t)
  CT_COLL_GATHER_SCATTER(ncclNetSGE_v12_t) CT_COLL_TAIL
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
  ncclResult_t (*finalize)(void* ctx);
} ncclCollNet_v11_t;

/* ---- tuner ---- */
typedef struct {            /* NCCL 2.19, 2.20 */
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction);
  ncclResult_t (*getCollInfo)(ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void);
} ncclTuner_v1_t;

typedef struct {            /* NCCL 2.21 */
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v2_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v3_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

/* ---- layout checks ---- */
_Static_assert(sizeof(ncclNetProperties_v6_t) == 48, "props v6 size");
_Static_assert(offsetof(ncclNetProperties_v6_t, latency) == 36, "props v6.latency");
_Static_assert(offsetof(ncclNetProperties_v6_t, maxRecvs) == 44, "props v6.maxRecvs");
_Static_assert(sizeof(ncclNetProperties_v7_t) == 56, "props v7 size");
_Static_assert(offsetof(ncclNetProperties_v7_t, netDeviceType) == 48, "props v7.netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v7_t, netDeviceVersion) == 52, "props v7.netDeviceVersion");
_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "props v8 size");
_Static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28, "props v8.regIsGlobal");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "props v8.netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "props v9.forceFlush");
_Static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "props v9.vProps");
_Static_assert(sizeof(ncclNetVDeviceProps_v9_t) == 20, "vProps v9 size");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "props v9.maxP2pBytes");
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "props v9 size");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "props v11.maxMultiRequestSize");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "props v11 size");
_Static_assert(sizeof(ncclNetSGE_v8_t) == 24, "SGE v8 size (uint32 size, padded)");
_Static_assert(offsetof(ncclNetSGE_v8_t, size) == 16, "SGE v8.size");
_Static_assert(sizeof(ncclNet_v5_t) == 16 * CT_PTR, "net v5 table");
_Static_assert(offsetof(ncclNet_v5_t, deregMr) == 8 * CT_PTR, "net v5.deregMr");
_Static_assert(sizeof(ncclNet_v6_t) == 17 * CT_PTR, "net v6 table");
_Static_assert(offsetof(ncclNet_v6_t, isend) == 10 * CT_PTR, "net v6.isend");
_Static_assert(sizeof(ncclNet_v7_t) == 19 * CT_PTR, "net v7 table");
_Static_assert(sizeof(ncclNet_v8_t) == 19 * CT_PTR, "net v8 table");
_Static_assert(offsetof(ncclNet_v8_t, getDeviceMr) == 17 * CT_PTR, "net v8.getDeviceMr");
_Static_assert(sizeof(ncclNet_v9_t) == 20 * CT_PTR, "net v9 table");
_Static_assert(sizeof(ncclNet_v10_t) == 20 * CT_PTR, "net v10 table");
_Static_assert(offsetof(ncclNet_v10_t, makeVDevice) == 19 * CT_PTR, "net v10.makeVDevice");
_Static_assert(sizeof(ncclNet_v11_t) == 22 * CT_PTR, "net v11 table");
_Static_assert(offsetof(ncclNet_v11_t, setNetAttr) == 21 * CT_PTR, "net v11.setNetAttr");
_Static_assert(sizeof(ncclCollNet_v5_t) == 14 * CT_PTR, "collnet v5 table");
_Static_assert(offsetof(ncclCollNet_v5_t, iallreduce) == 9 * CT_PTR, "collnet v5.iallreduce");
_Static_assert(sizeof(ncclCollNet_v6_t) == 15 * CT_PTR, "collnet v6 table");
_Static_assert(sizeof(ncclCollNet_v7_t) == 15 * CT_PTR, "collnet v7 table");
_Static_assert(offsetof(ncclCollNet_v7_t, iflush) == 11 * CT_PTR, "collnet v7.iflush");
_Static_assert(sizeof(ncclCollNet_v8_t) == 17 * CT_PTR, "collnet v8 table");
_Static_assert(offsetof(ncclCollNet_v8_t, ireducescatter) == 12 * CT_PTR, "collnet v8.ireducescatter");
_Static_assert(sizeof(ncclCollNet_v9_t) == 18 * CT_PTR, "collnet v9 table");
_Static_assert(offsetof(ncclCollNet_v9_t, makeVDevice) == 17 * CT_PTR, "collnet v9.makeVDevice");
_Static_assert(sizeof(ncclCollNet_v11_t) == 19 * CT_PTR, "collnet v11 table");
_Static_assert(offsetof(ncclCollNet_v11_t, finalize) == 18 * CT_PTR, "collnet v11.finalize");
_Static_assert(sizeof(ncclTuner_v1_t) == 4 * CT_PTR, "tuner v1 table");
_Static_assert(sizeof(ncclTuner_v2_t) == 4 * CT_PTR, "tuner v2 table");
_Static_assert(sizeof(ncclTuner_v3_t) == 4 * CT_PTR, "tuner v3 table");
_Static_assert(sizeof(ncclTuner_v4_t) == 4 * CT_PTR, "tuner v4 table");
#endif

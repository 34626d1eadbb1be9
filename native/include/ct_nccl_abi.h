/* clustertool: NCCL plugin ABI, written from NCCL's published plugin interface.
 *
 * Facts used (NVIDIA/nccl master, NCCL 2.30.x):
 *   src/nccl.h.in                      ncclResult_t, ncclDataType_t, ncclRedOp_t values
 *   src/include/nccl_common.h          ncclDebugLogger_t, ncclFunc_t values
 *   src/include/nccl_device/net_device.h  ncclNetDeviceType, ncclNetDeviceHandle_v12_t
 *   src/include/plugin/nccl_net.h      NCCL_PTR_*, NCCL_NET_HANDLE_MAXSIZE, symbol names
 *   src/include/plugin/net/net_v12.h   ncclNet_v12_t, ncclCollNet_v12_t, properties
 *   src/include/plugin/tuner/tuner_v5.h, tuner_v6.h, nccl_tuner.h
 * Only layouts and values are taken; the declarations below are our own.
 * The layout checks live at the bottom of this file (static assertions).
 */
#ifndef CT_NCCL_ABI_H
#define CT_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ---- core enums (nccl.h) ---- */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

typedef enum {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3,
  ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7,
  ncclFloat64 = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* NCCL keeps ncclRedOp_t int-sized; its largest value is 0x7fffffff. */
typedef enum {
  ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4,
  ncclNumOps = 5, ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* ---- nccl_common.h ---- */
typedef enum {
  NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3, NCCL_LOG_ABORT = 4, NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

#define NCCL_INIT 0x1
#define NCCL_COLL 0x2
#define NCCL_NET 0x10
#define NCCL_TUNING 0x40

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char* file, int line, const char* fmt, ...);
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

typedef enum {
  ncclFuncBroadcast = 0, ncclFuncReduce = 1, ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3, ncclFuncAllReduce = 4, ncclFuncSendRecv = 5,
  ncclFuncSend = 6, ncclFuncRecv = 7, ncclFuncAlltoAll = 8, ncclFuncScatter = 9,
  ncclFuncGather = 10, ncclFuncAllGatherV = 11, ncclFuncPutSignal = 12,
  ncclFuncSignal = 13, ncclFuncWaitSignal = 14, ncclNumFuncs = 15
} ncclFunc_t;

/* ---- nccl_net.h / net_device.h ---- */
#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_MAX_NET_SIZE_BYTES (1024LL * 1024 * 1024 * 1024)

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
  NCCL_NET_DEVICE_GIN_GPI = 4
} ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v12_t;

#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
  int trafficClass;
} ncclNetCommConfig_v12_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;            /* Mbps */
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v12_t;

typedef struct {
  ncclNetCommAttr_v12_t sendCommAttr;
  ncclNetCommAttr_v12_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v12_t;

typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} ncclNetSGE_v12_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count,
                             ncclDataType_t dataType, ncclRedOp_t redOp, void* sendMhandle,
                             void* recvMhandle, void** request);
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts,
                             ncclNetSGE_v12_t* recvParts, size_t bytesPerRank, size_t windowOffset,
                             size_t windowBytes, void* sendMhandle, void** request);
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, ncclNetSGE_v12_t* sendParts,
                                 void* recvData, size_t bytesPerRank, size_t windowOffset,
                                 size_t windowBytes, ncclDataType_t dataType, ncclRedOp_t redOp,
                                 void* recvMhandle, void** request);
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
} ncclCollNet_v12_t;

/* ---- tuner (nccl_tuner.h, tuner_v5.h, tuner_v6.h) ---- */
#define NCCL_ALGO_UNDEF -1
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_PROTO_UNDEF -1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE -1.0

#define NCCL_NUM_ALGORITHMS_V5 7
#define NCCL_NUM_PROTOCOLS_V5 3
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;

typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t* nvlDomainInfo,
                       ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

/* ---- layout checks (LP64 Linux, the only target NCCL supports) ---- */
#define CT_PTR sizeof(void*)
_Static_assert(sizeof(ncclResult_t) == 4, "ncclResult_t is int-sized");
_Static_assert(sizeof(ncclDataType_t) == 4, "ncclDataType_t is int-sized");
_Static_assert(sizeof(ncclRedOp_t) == 4, "ncclRedOp_t is int-sized");
_Static_assert(sizeof(ncclFunc_t) == 4, "ncclFunc_t is int-sized");
_Static_assert(offsetof(ncclNetProperties_v12_t, guid) == 16, "props.guid");
_Static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44, "props.latency");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56, "props.netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "props.vProps");
_Static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36, "vProps size");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "props.maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "props.maxCollBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "props.maxMultiRequestSize");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "props.railId");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "props.planeId");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "props size");
_Static_assert(sizeof(ncclNetSGE_v12_t) == 24, "SGE size");
_Static_assert(sizeof(ncclNetAttr_v12_t) == 44, "netAttr size");
_Static_assert(sizeof(ncclNetDeviceHandle_v12_t) == 32, "device handle size");
_Static_assert(offsetof(ncclNet_v12_t, init) == 1 * CT_PTR, "net.init");
_Static_assert(offsetof(ncclNet_v12_t, listen) == 4 * CT_PTR, "net.listen");
_Static_assert(offsetof(ncclNet_v12_t, regMr) == 7 * CT_PTR, "net.regMr");
_Static_assert(offsetof(ncclNet_v12_t, isend) == 10 * CT_PTR, "net.isend");
_Static_assert(offsetof(ncclNet_v12_t, test) == 13 * CT_PTR, "net.test");
_Static_assert(offsetof(ncclNet_v12_t, getDeviceMr) == 17 * CT_PTR, "net.getDeviceMr");
_Static_assert(offsetof(ncclNet_v12_t, finalize) == 20 * CT_PTR, "net.finalize");
_Static_assert(sizeof(ncclNet_v12_t) == 22 * CT_PTR, "net table size");
_Static_assert(offsetof(ncclCollNet_v12_t, connect) == 5 * CT_PTR, "collnet.connect");
_Static_assert(offsetof(ncclCollNet_v12_t, reduceSupport) == 6 * CT_PTR, "collnet.reduceSupport");
_Static_assert(offsetof(ncclCollNet_v12_t, iallreduce) == 10 * CT_PTR, "collnet.iallreduce");
_Static_assert(offsetof(ncclCollNet_v12_t, ireducescatter) == 12 * CT_PTR, "collnet.ireducescatter");
_Static_assert(offsetof(ncclCollNet_v12_t, test) == 14 * CT_PTR, "collnet.test");
_Static_assert(offsetof(ncclCollNet_v12_t, finalize) == 18 * CT_PTR, "collnet.finalize");
_Static_assert(sizeof(ncclCollNet_v12_t) == 19 * CT_PTR, "collnet table size");
_Static_assert(sizeof(ncclTunerConstants_v5_t) == 144 * sizeof(double), "tuner constants size");
_Static_assert(sizeof(ncclTuner_v5_t) == 4 * CT_PTR, "tuner v5 table size");
_Static_assert(offsetof(ncclTuner_v6_t, getChunkSize) == 4 * CT_PTR, "tuner v6.getChunkSize");
_Static_assert(sizeof(ncclTuner_v6_t) == 5 * CT_PTR, "tuner v6 table size");

#endif

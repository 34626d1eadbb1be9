/* Pieces the net and CollNet tables share (ct_netdev.c, ct_net.c). */
#ifndef CT_PLUGIN_H
#define CT_PLUGIN_H
#include "ct_common.h"

#define CT_PLUGIN_NAME "clustertool"
#define CT_TCP_DEV_NAME "clustertool-tcp"

int ct_plugin_addr(struct sockaddr_in* out);
const char* ct_plugin_ifname(void);

/* Net devices: the forwarded OFI plugin's when p2p is forwarded, else our one TCP
 * device. CollNet device i reports net device i's name, pciPath, guid, speed, port. */
int ct_net_ndevs(void);
ncclResult_t ct_net_dev_props(int dev, ncclNetProperties_v12_t* p);
ncclResult_t ct_collnet_dev_props(int dev, ncclNetProperties_v12_t* p);

/* The OFI plugin p2p calls are forwarded to (NULL: plain TCP) and its init. */
ncclNet_v12_t* ct_fwd(void);
ncclResult_t ct_fwd_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t log,
                         ncclProfilerCallback_t prof);
const char* ct_net_forward_name(void);
/* The forwarded library's newest net table among v12 .. v9, as v12 (ct_fwd.c); NULL if none. */
ncclNet_v12_t* ct_fwd_table(void* lib, int* version);

/* Listening TCP socket for device dev (any index below ct_net_ndevs(): they all ride
 * the same interface) + a filled ct_handle_t; the NCCL handle buffer is zeroed. */
ncclResult_t ct_plugin_listen(int dev, void* handle, int* fd_out, ct_handle_t* h);

/* CollNet listen with an explicit algorithm ("sharded", "ring", "servers"; NULL or ""
 * for the environment's), for the ctypes entry point (ct_allreduce_api.c). */
ncclResult_t ct_collnet_listen_algo(int dev, const char* algo, void* handle, void** lc);
/* A connected CollNet comm's default algorithm after any fallback, and its server count. */
const char* ct_collnet_comm_algo(void* cc);
int ct_collnet_comm_servers(void* cc);

/* The one implementation every exported ABI version adapts. */
extern ncclNet_v12_t ncclNetPlugin_v12;
extern ncclCollNet_v12_t ncclCollNetPlugin_v12;
#endif

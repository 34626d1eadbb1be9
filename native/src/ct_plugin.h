/* Pieces the net and CollNet tables share. */
#ifndef CT_PLUGIN_H
#define CT_PLUGIN_H
#include "ct_common.h"
int ct_plugin_addr(struct sockaddr_in* out);
ncclResult_t ct_plugin_props(int dev, ncclNetProperties_v12_t* p, const char* name);
/* Listening socket + a filled ct_handle_t (handle is zeroed; caller copies h in). */
ncclResult_t ct_plugin_listen(int dev, void* handle, int* fd_out, ct_handle_t* h);
/* Name of the plugin p2p calls are forwarded to, or NULL for plain TCP. */
const char* ct_net_forward_name(void);
#endif

/* Helpers the older-ABI adapters share (ct_net_compat.c, ct_collnet_compat.c). */
#ifndef CT_COMPAT_H
#define CT_COMPAT_H
#include "ct_nccl_abi_compat.h"

/* Properties in each version's layout, from the one v12 answer. */
void ct_props_v6(const ncclNetProperties_v12_t* p, ncclNetProperties_v6_t* o);
void ct_props_v7(const ncclNetProperties_v12_t* p, ncclNetProperties_v7_t* o);
void ct_props_v8(const ncclNetProperties_v12_t* p, ncclNetProperties_v8_t* o);
void ct_props_v9(const ncclNetProperties_v12_t* p, ncclNetProperties_v9_t* o);
void ct_props_v11(const ncclNetProperties_v12_t* p, ncclNetProperties_v11_t* o);

/* Before v11 NCCL keeps no per-communicator context: the adapters hold one. */
#define CT_DEFINE_PROPS_ADAPTER(FN, IMPL, V)                                   \
  static ncclResult_t FN(int dev, ncclNetProperties_##V##_t* o) {              \
    ncclNetProperties_v12_t p;                                                 \
    ncclResult_t r = (IMPL).getProperties(dev, &p);                            \
    if (r == ncclSuccess) ct_props_##V(&p, o);                                 \
    return r;                                                                  \
  }
#endif

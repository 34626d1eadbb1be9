#!/bin/sh
# EFA devices of this node, for `doctor --check efa` (read by doctor/efa.py):
#   host NAME            this node's host name (NCCL's log lines start with it)
#   sysfs DEV...         RDMA devices the kernel's efa driver made (/sys/class/infiniband)
#   ofi_nccl PATH        an aws-ofi-nccl library found in its usual places (one line each)
#   MARK fi_info rc=RC   then what `fi_info -p efa` printed (rc 127: no fi_info; 124/137: timed out)
# Inputs: MARK, BOX (seconds fi_info may take).
echo "host $(uname -n)"
devs=
for d in /sys/class/infiniband/*; do
  [ -e "$d" ] || continue
  drv=$(readlink -f "$d/device/driver" 2>/dev/null)
  [ "${drv##*/}" = efa ] && devs="$devs ${d##*/}"
done
echo "sysfs$devs"
for p in /opt/amazon/ofi-nccl/lib/libnccl-net*.so /opt/amazon/ofi-nccl/lib/*/libnccl-net*.so \
  /opt/aws-ofi-nccl/lib/libnccl-net*.so /usr/local/lib/libnccl-net-ofi.so; do
  [ -e "$p" ] && echo "ofi_nccl $p"
done
# the EFA installer puts libfabric's tools in /opt/amazon/efa/bin, often not on a non-login PATH
fi=$(command -v fi_info 2>/dev/null)
[ -z "$fi" ] && [ -x /opt/amazon/efa/bin/fi_info ] && fi=/opt/amazon/efa/bin/fi_info
if [ -n "$fi" ]; then
  out=$(timeout -k 3 "$BOX" "$fi" -p efa 2>&1 </dev/null)
  rc=$?
else
  out=
  rc=127
fi
echo "$MARK fi_info rc=$rc"
[ -z "$out" ] || printf '%s\n' "$out"
exit 0

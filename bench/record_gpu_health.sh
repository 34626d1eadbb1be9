#!/bin/sh
# Records what a GPU node's health tools print, for the parsers of `doctor --check gpu|efa`
# (tests read these recordings; this machine has no GPU). Run on a GPU machine:
#   OUT=dir sh bench/record_gpu_health.sh
# Every command is time-boxed; a missing tool is recorded as missing, not an error.
OUT=${OUT:-gpu-health}
mkdir -p "$OUT/rec"
r() {  # r NAME SECONDS CMD...: stdout, stderr and exit code of CMD into rec/NAME.*
  n=$1; t=$2; shift 2
  timeout "$t" "$@" > "$OUT/rec/$n.out" 2> "$OUT/rec/$n.err"; echo "$? $*" > "$OUT/rec/$n.rc"
}
FIELDS=index,name,pci.bus_id,serial,uuid,persistence_mode,pstate,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,clocks.mem,memory.used,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,ecc.mode.current,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active,clocks_event_reasons.gpu_idle,clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.sw_power_cap,clocks_event_reasons.sync_boost
r uname 10 uname -a
r smi-version 20 nvidia-smi --version
r smi-L 20 nvidia-smi -L
r smi-q 60 nvidia-smi -q
r smi-q-d 60 nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE,CLOCK,PCIE
r smi-help-query 20 nvidia-smi --help-query-gpu
r smi-query 30 nvidia-smi --query-gpu=$FIELDS --format=csv
r smi-query-nounits 30 nvidia-smi --query-gpu=$FIELDS --format=csv,noheader,nounits
r smi-apps 20 nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
r smi-topo 20 nvidia-smi topo -m
r smi-xml 60 nvidia-smi -q -x
r dcgmi-version 20 dcgmi --version
r dcgmi-discovery 30 dcgmi discovery -l
r dcgmi-diag-r1 150 dcgmi diag -r 1 -j
r fi-info 20 fi_info -p efa
r ib 10 ls -l /sys/class/infiniband /sys/class/net
r dmesg-xid 20 sh -c 'dmesg 2>&1 | grep -i -E "xid|nvrm" | tail -n 200'
r journal-k 30 sh -c 'journalctl -k --no-pager -n 300 2>&1 | grep -i -E "xid|nvrm|nvidia" | tail -n 200'
r which 10 sh -c 'for t in nvidia-smi dcgmi fi_info journalctl dmesg py-spy nv-hostengine; do printf "%s=%s\n" $t "$(command -v $t)"; done'
tar -C "$OUT" -czf "$OUT/recordings.tar.gz" rec && rm -rf "$OUT/rec"
echo "recorded: $OUT/recordings.tar.gz"

#!/bin/sh
# collnet_bench_lite (no MPI library; bench/mini_mpi.c) under bench/minirun.py, as the GPU
# host runs it: 3 ranks, sharded and ring in NCCL's request stream, every row #wrong 0;
# the one-request form; and a rank that fails stops the run with its status (no hang).
# Usage: check_lite.sh BUILD_DIR. Ends with "N passed, N failed" like the C tests.
B=${1:-build}
HERE=$(cd "$(dirname "$0")/.." && pwd)
RUN="python3 $HERE/bench/minirun.py --timeout 120"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
rows() {   # rows ALGO OUTPUT: data rows of that algorithm with #wrong 0
  printf '%s\n' "$2" | awk -v a="$1" '$5 == a && $9 == "0"' | wc -l
}
out=$($RUN -np 3 "$B/collnet_bench_lite" -p "$B/libnccl-net-clustertool.so" -b 64K -e 1M -n 3 -w 1 \
      -a sharded,ring,mpi -r 64K -q 8 2>&1); rc=$?
[ "$rc" -eq 0 ] || bad "stream run exited $rc"
for a in sharded ring; do
  n=$(rows $a "$out")
  [ "$n" -eq 5 ] && ok || bad "stream: $a has $n of 5 rows with #wrong 0"
done
printf '%s\n' "$out" | grep -q "^# collnet_bench: 3 ranks" && ok || bad "stream: no header for 3 ranks"
printf '%s\n' "$out" | grep -q "^# mpi: not in the lite build" && ok || bad "stream: -a mpi was not refused"
out=$($RUN -np 2 "$B/collnet_bench_lite" -p "$B/libnccl-net-clustertool.so" -b 256K -e 256K -n 2 -w 1 \
      -a sharded -d int32 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ "$(rows sharded "$out")" -eq 1 ] && ok || { printf '%s\n' "$out"; bad "one-request run (exit $rc)"; }
out=$($RUN -np 3 "$B/collnet_bench_lite" -p "$B/no-such-plugin.so" -b 64K -e 64K 2>&1); rc=$?
[ "$rc" -ne 0 ] && printf '%s\n' "$out" | grep -q "cannot load CollNet plugin" && ok || bad "a missing plugin: exit $rc"
out=$(env -u CT_MINI_MPI_DIR "$B/collnet_bench_lite" 2>&1); rc=$?
[ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -q "minirun.py" && ok || bad "started by hand: exit $rc: $out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

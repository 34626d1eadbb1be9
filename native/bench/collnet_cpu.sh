#!/bin/sh
# CPU time of the CollNet engine's progress threads per byte NCCL hands it, which a
# shared machine's load does not bend the way it bends wall time: 4 ranks on loopback,
# NCCL's request shape (-r 512K -q 8, near the 428 KB mean requests NCCL 2.28.9 posted on
# the H200), sharded and ring, from the stats line (progress_cpu_ns_per_byte, every lane
# together). Prints, per setting, the median over ranks and rounds.
#   sh bench/collnet_cpu.sh [ROUNDS] [THREADS...]      (from native/, after make)
#   BUILD=/other/build sh bench/collnet_cpu.sh 3 1      (another build, e.g. an older commit)
ROUNDS=${1:-3}; shift 2>/dev/null
THREADS=${*:-1 2}
B=${BUILD:-build}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$ROUNDS"); do
  for t in $THREADS; do
    CLUSTERTOOL_COLLNET_STATS="$tmp/t$t.jsonl" CLUSTERTOOL_COLLNET_THREADS=$t CLUSTERTOOL_SOCKET_ADDR=127.0.0.1 \
      $MPIRUN -x CLUSTERTOOL_COLLNET_STATS -x CLUSTERTOOL_COLLNET_THREADS -x CLUSTERTOOL_SOCKET_ADDR -np 4 \
      "$B/collnet_bench" -b 64M -e 64M -n 10 -w 1 -a sharded,ring -r 512K -q 8 >>"$tmp/t$t.out" 2>&1 ||
      { cat "$tmp/t$t.out"; exit 1; }
  done
done
for t in $THREADS; do
  for a in sharded ring; do
    grep "\"algo\": \"$a\"" "$tmp/t$t.jsonl" | sed 's/.*"progress_cpu_ns_per_byte": \([0-9.]*\).*/\1/' | sort -n |
      awk -v t="$t" -v a="$a" '{v[NR]=$1} END {printf "threads=%s %-8s progress CPU %.3f ns/byte (median of %d rank-runs, %.3f-%.3f)\n", t, a, v[int((NR+1)/2)], NR, v[1], v[NR]}'
  done
  grep -E "^ +[0-9]+ " "$tmp/t$t.out" | awk -v t="$t" '$NF != 0 {bad=1} END {if (bad) print "threads=" t ": #wrong not 0"; else print "threads=" t ": #wrong 0 in every run"}'
done

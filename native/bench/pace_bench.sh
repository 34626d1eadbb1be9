#!/bin/sh
# The pacer's figures: throughput of 1 and 4 loopback TCP connections in one process, paced by
# CLUSTERTOOL_LINK_RATE, as a ratio of the set rate (issue 31's target: 0.97-1.02), the median of
# RUNS runs per row. No root, no MPI. Timing figures: on a busy box, note the load with them.
#   sh bench/pace_bench.sh                      # rates 1gbit 10gbit, modes take wait, paced both
#   RATES="400mbit 1gbit" MODES=take RUNS=5 SECS=3 DIR=tx sh bench/pace_bench.sh
set -eu
HERE=$(cd "$(dirname "$0")/.." && pwd)
B=${BUILD:-$HERE/build}
RATES=${RATES:-1gbit 10gbit}
MODES=${MODES:-take wait}
RUNS=${RUNS:-3}
SECS=${SECS:-3}
DIR=${DIR:-both}
make -s -C "$HERE" BUILD="$B" "$B/pace_bench" >/dev/null
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; ${SECS} s per run, median of $RUNS; paced: $DIR"
# what the box moves now with the same code path and no real limit: a set rate near it cannot be held
cap=$("$B/pace_bench" -r 1000gbit -c 4 -t 1 -m take -d "$DIR" | sed 's/.*measured=//; s/Mbit.*//')
echo "# take's 2 threads move ${cap} Mbit/s now with no real limit (4 connections): rates near it measure the box"
printf '%-8s %-5s %-6s %-10s %s\n' rate mode conns ratio "runs"
for rate in $RATES; do
  for mode in $MODES; do
    for c in 1 4; do
      runs=""
      i=0
      while [ "$i" -lt "$RUNS" ]; do
        r=$("$B/pace_bench" -r "$rate" -c "$c" -t "$SECS" -m "$mode" -d "$DIR" | sed 's/.*ratio=//')
        runs="$runs $r"
        i=$((i + 1))
      done
      med=$(printf '%s\n' $runs | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
      printf '%-8s %-5s %-6s %-10s %s\n' "$rate" "$mode" "$c" "$med" "$runs"
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

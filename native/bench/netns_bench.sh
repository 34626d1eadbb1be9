#!/bin/sh
# Developer harness: N network namespaces on a private bridge, every link shaped
# to RATE in both directions (tbf, as clustertool's local provider does), one MPI
# rank per namespace, collnet_bench across them. Needs root. Leaves nothing behind.
#   sh bench/netns_bench.sh 4 200mbit -b 64M -e 64M -n 3 -a sharded,ring,mpi
# SERVERS=K adds K more shaped namespaces, each running build/clustertool-reducer, and
# passes their addresses as CLUSTERTOOL_REDUCERS (for -a servers; REDUCER_ARGS: more reducer options):
#   SERVERS=4 sh bench/netns_bench.sh 4 200mbit -b 64M -e 64M -n 3 -a servers,sharded,ring
# Extra mpirun args via MPI_EXTRA (e.g. the Open MPI ring: "--mca coll_tuned_use_dynamic_rules 1
# --mca coll_tuned_allreduce_algorithm 4").
set -eu
N=$1; RATE=$2; shift 2
K=${SERVERS:-0}
RPIDS=""
HERE=$(cd "$(dirname "$0")/.." && pwd)
TAG=ctnb$$
SW=${TAG}sw
BITS=$(python3 -c "import re,sys; m=re.match(r'(\d+)(k|m|g)?bit',sys.argv[1]); print(int(m.group(1))*{None:1,'k':10**3,'m':10**6,'g':10**9}[m.group(2)])" "$RATE")
BURST=$(( BITS / 800 > 196608 ? BITS / 800 : 196608 ))
TBF="tbf rate ${BITS}bit burst $BURST latency 100ms"
cleanup() {
  for p in $RPIDS; do kill "$p" 2>/dev/null || true; done
  for p in $RPIDS; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  if [ -n "${SHOW_TCP:-}" ]; then
    for i in $(seq 0 $((N - 1))); do
      echo "n$i: $(ip netns exec ${TAG}n$i nstat -az TcpRetransSegs TcpOutSegs 2>/dev/null | awk 'NR>1{printf "%s=%s ", $1, $2}')"
      tc -n ${TAG}n$i -s qdisc show dev eth0 | grep -o 'dropped [0-9]*' | sed "s/^/  egress /"
      tc -n $SW -s qdisc show dev v$i | grep -o 'dropped [0-9]*' | sed "s/^/  ingress /"
    done
  fi
  for i in $(seq 0 $((N - 1))); do ip netns del ${TAG}n$i 2>/dev/null || true; done
  for k in $(seq 0 $((K - 1))); do ip netns del ${TAG}s$k 2>/dev/null || true; done
  [ -n "${RDIR:-}" ] && rm -rf "$RDIR"
  ip netns del $SW 2>/dev/null || true
  }
trap cleanup EXIT INT TERM
ip netns add $SW
ip -n $SW link add br0 type bridge
ip -n $SW link set br0 up
node() {   # node NAMESPACE PORT ADDRESS: a namespace on the bridge, shaped both ways
  ip netns add $1
  ip -n $SW link add $2 type veth peer name eth0 netns $1
  ip -n $SW link set $2 master br0
  ip -n $SW link set $2 up
  ip -n $1 link set lo up
  ip -n $1 addr add $3/24 dev eth0
  ip -n $1 link set eth0 up
  tc -n $1 qdisc replace dev eth0 root handle 1: $TBF
  tc -n $SW qdisc replace dev $2 root handle 1: $TBF
}
for i in $(seq 0 $((N - 1))); do node ${TAG}n$i v$i 10.213.251.$((i + 10)); done
REDUCERS=""
if [ "$K" -gt 0 ]; then
  RDIR=$(mktemp -d)
  for k in $(seq 0 $((K - 1))); do
    node ${TAG}s$k s$k 10.213.251.$((k + 100))
    ip netns exec ${TAG}s$k "$HERE/build/clustertool-reducer" --bind 10.213.251.$((k + 100)) \
      --port-file "$RDIR/s$k.port" ${REDUCER_ARGS:-} 2>"$RDIR/s$k.log" &
    RPIDS="$RPIDS $!"
  done
  for k in $(seq 0 $((K - 1))); do
    t=0; while [ ! -s "$RDIR/s$k.port" ] && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    REDUCERS="$REDUCERS${REDUCERS:+,}$(cat "$RDIR/s$k.port")"
  done
fi
export CLUSTERTOOL_REDUCERS="${CLUSTERTOOL_REDUCERS:-$REDUCERS}"
if [ -n "${SINGLE_STREAM:-}" ] && command -v iperf3 >/dev/null; then
  ip netns exec ${TAG}n1 iperf3 -s -1 -D >/dev/null; sleep 0.5
  ip netns exec ${TAG}n0 iperf3 -c 10.213.251.11 -t 5 | tail -4
fi
# Open MPI's launcher cannot reach ranks inside namespaces here, so ranks start in
# this namespace and collnet_bench moves into ${TAG}n<rank> after MPI_Init: the
# plugin's traffic is shaped, MPI's own is not (use -a mpi only via clustertool's
# local provider, where mpirun runs over ssh inside the namespaces).
mpirun --allow-run-as-root --oversubscribe -np "$N" ${MPI_EXTRA:-} -x CLUSTERTOOL_SOCKET_IFNAME=eth0 \
  -x CLUSTERTOOL_BENCH_NETNS=${TAG}n%d -x CLUSTERTOOL_SOCKS_PER_PEER -x CLUSTERTOOL_CHUNK_BYTES \
  -x CLUSTERTOOL_REDUCERS -x CLUSTERTOOL_SOCKBUF -x CLUSTERTOOL_SNDBUF -x CLUSTERTOOL_SHARDED_SCHED \
  -x CLUSTERTOOL_COLLNET_DEPTH -x CLUSTERTOOL_COLLNET_WINDOW -x CLUSTERTOOL_COLLNET_STAGE -x CLUSTERTOOL_COLLNET_STATS \
  -x CLUSTERTOOL_LINK_RATE "$HERE/build/collnet_bench" "$@"

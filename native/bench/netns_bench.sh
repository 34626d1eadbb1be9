#!/bin/sh
# Developer harness: N network namespaces on a private bridge, every link shaped
# to RATE in both directions (tbf, as clustertool's local provider does), one MPI
# rank per namespace, collnet_bench across them. Needs root. Leaves nothing behind.
#   sh bench/netns_bench.sh 4 200mbit -b 64M -e 64M -n 3 -a sharded,ring,mpi
# Extra mpirun args via MPI_EXTRA (e.g. the Open MPI ring: "--mca coll_tuned_use_dynamic_rules 1
# --mca coll_tuned_allreduce_algorithm 4").
set -eu
N=$1; RATE=$2; shift 2
HERE=$(cd "$(dirname "$0")/.." && pwd)
TAG=ctnb$$
SW=${TAG}sw
BITS=$(python3 -c "import re,sys; m=re.match(r'(\d+)(k|m|g)?bit',sys.argv[1]); print(int(m.group(1))*{None:1,'k':10**3,'m':10**6,'g':10**9}[m.group(2)])" "$RATE")
BURST=$(( BITS / 800 > 196608 ? BITS / 800 : 196608 ))
TBF="tbf rate ${BITS}bit burst $BURST latency 100ms"
cleanup() {
  if [ -n "${SHOW_TCP:-}" ]; then
    for i in $(seq 0 $((N - 1))); do
      echo "n$i: $(ip netns exec ${TAG}n$i nstat -az TcpRetransSegs TcpOutSegs 2>/dev/null | awk 'NR>1{printf "%s=%s ", $1, $2}')"
      tc -n ${TAG}n$i -s qdisc show dev eth0 | grep -o 'dropped [0-9]*' | sed "s/^/  egress /"
      tc -n $SW -s qdisc show dev v$i | grep -o 'dropped [0-9]*' | sed "s/^/  ingress /"
    done
  fi
  for i in $(seq 0 $((N - 1))); do ip netns del ${TAG}n$i 2>/dev/null || true; done
  ip netns del $SW 2>/dev/null || true
  }
trap cleanup EXIT INT TERM
ip netns add $SW
ip -n $SW link add br0 type bridge
ip -n $SW link set br0 up
for i in $(seq 0 $((N - 1))); do
  ns=${TAG}n$i
  ip netns add $ns
  ip -n $SW link add v$i type veth peer name eth0 netns $ns
  ip -n $SW link set v$i master br0
  ip -n $SW link set v$i up
  ip -n $ns link set lo up
  ip -n $ns addr add 10.213.251.$((i + 10))/24 dev eth0
  ip -n $ns link set eth0 up
  tc -n $ns qdisc replace dev eth0 root handle 1: $TBF
  tc -n $SW qdisc replace dev v$i root handle 1: $TBF
done
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
  -x CLUSTERTOOL_SOCKBUF -x CLUSTERTOOL_SNDBUF -x CLUSTERTOOL_SHARDED_SCHED -x CLUSTERTOOL_TEST_WAIT_US "$HERE/build/collnet_bench" "$@"

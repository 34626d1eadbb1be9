#!/bin/sh
# Runs every native test binary, then the MPI tests at 2, 3 and 4 ranks, and
# prints one total line "N passed, N failed" at the end.
B=${BUILD:-build}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
NPS=${NPS:-2 3 4}   # rank counts of the MPI tests (the sanitizer build runs 2 and 3: same paths, less time)
pass=0; fail=0
run() {
  name=$1; shift
  out=$("$@" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -z "$line" ]; then
    printf '%s\n' "$out"
    echo "== $name: no summary (exit $rc)"; fail=$((fail + 1)); return
  fi
  p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
  printf '%s\n' "$out" | grep -E '^FAIL|^SKIP|WARN|ERROR|runtime error' | head -20
  echo "== $name: $line"
  pass=$((pass + p)); fail=$((fail + f))
}
run glibc_versions sh "$(dirname "$0")/check_glibc.sh" "$B"   # the libraries and the reducer load on glibc 2.17+ (x86-64)
run test_abi "$B/test_abi" "$B"
run test_reduce "$B/test_reduce"
run test_tuner "$B/test_tuner" "$B"
run test_net "$B/test_net" "$B"
run test_net_forward "$B/test_net" "$B" "$B/fake/libnccl-net-ofi.so"
run test_net_paced "$B/test_net" "$B" paced   # every byte through CLUSTERTOOL_LINK_RATE's pacer, test() never waits
run test_net_nonblocking "$B/test_net_nonblocking" "$B"
run test_collnet_pairing "$B/test_collnet_pairing" "$B"
run test_collnet_pairing_forward "$B/test_collnet_pairing" "$B" "$B/fake/libnccl-net-ofi.so"
for v in 11 10 9; do   # OFI plugins exporting only an older net ABI are forwarded to as well
  run "test_collnet_pairing_forward_ofi_v$v" "$B/test_collnet_pairing" "$B" "$B/fake/v$v/libnccl-net-ofi.so"
  run "test_net_forward_ofi_v$v" "$B/test_net" "$B" "$B/fake/v$v/libnccl-net-ofi.so"
done
run test_abi_versions "$B/test_abi_versions" "$B"
run test_reducer "$B/test_reducer" "$B"
run test_pace "$B/test_pace"   # CLUSTERTOOL_LINK_RATE's token buckets
run collnet_bench_lite sh "$(dirname "$0")/check_lite.sh" "$B"   # no MPI library: bench/mini_mpi.c, bench/minirun.py
for np in $NPS; do
  run "test_coll_mpi np=$np" env ASAN_OPTIONS=detect_leaks=0 timeout 600 $MPIRUN -x ASAN_OPTIONS -np $np "$B/test_coll_mpi" "$B"
done
for np in $NPS; do   # K = 1, 2, n, n+1 reduction servers (real clustertool-reducers), fallback, a server dying
  run "test_servers_mpi np=$np" env ASAN_OPTIONS=detect_leaks=0 timeout 600 $MPIRUN -x ASAN_OPTIONS -np $np "$B/test_servers_mpi" "$B"
done
for np in $NPS; do   # the pipelined engine: requests out of order, the window full, credits, stats
  run "test_pipeline_mpi np=$np" env ASAN_OPTIONS=detect_leaks=0 timeout 600 $MPIRUN -x ASAN_OPTIONS -np $np "$B/test_pipeline_mpi" "$B"
done
# several progress threads per communicator (lanes: requests dealt to them in turn; a window per lane)
run "test_pipeline_mpi np=4 threads=2" env ASAN_OPTIONS=detect_leaks=0 CLUSTERTOOL_COLLNET_THREADS=2 timeout 600 \
  $MPIRUN -x ASAN_OPTIONS -x CLUSTERTOOL_COLLNET_THREADS -np 4 "$B/test_pipeline_mpi" "$B"
run "test_pipeline_mpi np=3 threads=3" env ASAN_OPTIONS=detect_leaks=0 CLUSTERTOOL_COLLNET_THREADS=3 timeout 600 \
  $MPIRUN -x ASAN_OPTIONS -x CLUSTERTOOL_COLLNET_THREADS -np 3 "$B/test_pipeline_mpi" "$B"
run "test_coll_mpi np=3 threads=2" env ASAN_OPTIONS=detect_leaks=0 CLUSTERTOOL_COLLNET_THREADS=2 timeout 600 \
  $MPIRUN -x ASAN_OPTIONS -x CLUSTERTOOL_COLLNET_THREADS -np 3 "$B/test_coll_mpi" "$B"
run "test_servers_mpi np=3 threads=2" env ASAN_OPTIONS=detect_leaks=0 CLUSTERTOOL_COLLNET_THREADS=2 timeout 600 \
  $MPIRUN -x ASAN_OPTIONS -x CLUSTERTOOL_COLLNET_THREADS -np 3 "$B/test_servers_mpi" "$B"
# the engine paced by CLUSTERTOOL_LINK_RATE (80 Mbit/s = 10^7 bytes/s)
run "test_pipeline_mpi paced" env ASAN_OPTIONS=detect_leaks=0 CLUSTERTOOL_LINK_RATE=80mbit CT_TEST_RATE_BYTES=10000000 \
  timeout 600 $MPIRUN -x ASAN_OPTIONS -x CLUSTERTOOL_LINK_RATE -x CT_TEST_RATE_BYTES -np 2 "$B/test_pipeline_mpi" "$B" paced
for np in 2 3; do
  run "test_coll_versions_mpi np=$np" env ASAN_OPTIONS=detect_leaks=0 timeout 600 $MPIRUN -x ASAN_OPTIONS -np $np \
    "$B/test_coll_versions_mpi" "$B"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

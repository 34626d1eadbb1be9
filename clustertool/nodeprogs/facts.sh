#!/bin/sh
# What doctor learns from a node in one round: `key=value` lines, `df PATH TOTAL_KB AVAIL_KB MOUNT`
# per folder, and `proc PID COMM JOB ARGS` per python/MPI process or process a job marked (JOB: the
# clustertool job in its environment or its children's, else -).
# Inputs: PLUGIN (the NCCL plugin's path), JOBS_DIR (jobs' folder under $HOME), JOB_ENV (the
# variable that marks a job's processes), STRAY_RE (command names that count, an ERE);
# positional parameters: more folders whose free space counts (besides $HOME and the jobs').
echo "nproc=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)"
  echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
else
  echo 'gpus=none'
fi
echo "mpi=$(mpirun --version 2>/dev/null | head -1)"
n=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so/ {print $NF; exit}')
if [ -n "$n" ]; then echo "nccl=$(basename "$(readlink -f "$n")")"; else echo "nccl=none"; fi
if [ -f "$PLUGIN" ]; then echo "plugin=$(sha256sum "$PLUGIN" | cut -c1-64)"; else echo "plugin=absent"; fi
if command -v iperf3 >/dev/null 2>&1; then echo "iperf3=yes"; else echo "iperf3=no"; fi
for p in "$HOME" "$HOME/$JOBS_DIR" "$@"; do
  [ -d "$p" ] && df -Pk "$p" 2>/dev/null | awk -v p="$p" 'NR==2 {print "df", p, $2, $4, $6}'
done

# the job a process belongs to: its own marker, else one of its children's
jobof() {
  j=$(grep -a -z -o "^$JOB_ENV=[a-z0-9-]*" "/proc/$1/environ" 2>/dev/null | tr -d '\0' | cut -d= -f2)
  if [ -z "$j" ]; then
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
      j=$(grep -a -z -o "^$JOB_ENV=[a-z0-9-]*" "/proc/$c/environ" 2>/dev/null | tr -d '\0' | cut -d= -f2)
      [ -n "$j" ] && break
    done
  fi
  echo "${j:--}"
}

# python/MPI processes by name, and any process a job marked whatever its name (torchrun, accelerate, a shell)
marked=$(grep -l -a -z "^$JOB_ENV=" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' ')
ps -e -o pid=,comm= | awk -v re="^($STRAY_RE)\$" -v marked=" $marked" \
    '$2 ~ re || index(marked, " " $1 " ") {print $1, $2}' | while read -r pid comm; do
  [ "$pid" = "$$" ] && continue
  # a warm node launcher (nodeprogs/warmlaunch.py) waiting for the next job is no stray
  grep -q -a -z '^CLUSTERTOOL_WARM_KEY=' "/proc/$pid/environ" 2>/dev/null && continue
  echo "proc $pid $comm $(jobof "$pid") $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)"
done
true

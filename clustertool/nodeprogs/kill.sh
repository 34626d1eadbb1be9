#!/bin/sh
# One job's processes on this node: stop them and say what is left (ACTION=kill), or list them
# (ACTION=list: `PID COMM` lines).  A process belongs to the job when it carries JOB_ENV=JOB in
# its environment, shares a session that launch.sh or a rank wrapper recorded on this node, or
# is the orted/prted parent a rank wrapper recorded.
# kill signals them with SIGNAL, waits up to TENTHS tenths of a second, KILLs what is left, and
# prints `signaled PIDS`, `forced PIDS`, `remaining PID:COMM ...` and, where nvidia-smi exists,
# `gpu checked PID:MiB ...` (killed pids still holding GPU memory), else `gpu none`.
# Inputs: ACTION, JOB, JOBS_DIR (jobs' folder under $HOME), JOB_ENV, MPI_RE (the MPI daemons'
# command names, an ERE), SIGNAL, TENTHS, MARK (1: leave a `killed` mark in the job's folder).
d="$HOME/$JOBS_DIR/$JOB"
host=$(uname -n)
read -r _ _ _ _ _ mysid _ < /proc/$$/stat
sids=
parents=
for f in "$d/launch.pid" "$d/ranks/$host".*; do
  [ -f "$f" ] || continue
  read -r _ pp _ s < "$f"
  [ "${s:-0}" -gt 1 ] && [ "$s" != "$mysid" ] && sids="$sids $s"
  grep -qxE "$MPI_RE" "/proc/$pp/comm" 2>/dev/null && parents="$parents $pp"
done

procs() {
  { grep -l -a -z -x "$JOB_ENV=$JOB" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
    [ -n "$sids" ] && ps -e -o pid=,sid=,stat= \
      | awk -v s="$sids" 'BEGIN{n=split(s,a);for(i=1;i<=n;i++)w[a[i]]=1} ($2 in w) && $3 !~ /^Z/ {print $1}'
    for p in $parents; do [ -d "/proc/$p" ] && echo "$p"; done
  } | sort -un | while read -r p; do
    [ "$p" = "$$" ] && continue
    case "$(cut -d" " -f3 "/proc/$p/stat" 2>/dev/null)" in Z|"") continue;; esac
    echo "$p"
  done
}

if [ "$ACTION" = list ]; then
  for p in $(procs); do echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"; done
  exit 0
fi

# the mark comes first: a rank wrapper or node agent that starts after it sees it and does not run
# (one that started before it is among the processes found below)
[ "$MARK" = 1 ] && mkdir -p "$d" && touch "$d/killed"
first=$(procs | tr '\n' ' ')
# shellcheck disable=SC2086  # a list of pids
[ -n "$first" ] && kill "-$SIGNAL" $first 2>/dev/null
echo "signaled $first"
i=0
while [ $i -lt "$TENTHS" ] && [ -n "$(procs)" ]; do sleep 0.1; i=$((i+1)); done
left=$(procs | tr '\n' ' ')
# shellcheck disable=SC2086  # a list of pids
[ -n "$left" ] && kill -KILL $left 2>/dev/null
echo "forced $left"
# a job that was still starting can spawn a process after the lists above: KILL those too
i=0
while [ $i -lt 30 ]; do
  late=$(procs | tr '\n' ' ')
  [ -z "$late" ] && break
  # shellcheck disable=SC2086  # a list of pids
  kill -KILL $late 2>/dev/null
  sleep 0.1
  i=$((i+1))
done
echo "remaining $(for p in $(procs); do printf "%s:%s " "$p" "$(cat "/proc/$p/comm" 2>/dev/null)"; done)"
if command -v nvidia-smi >/dev/null 2>&1; then
  held=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
    | awk -F', *' -v k=" $first $left " 'index(k, " " $1 " ") {printf "%s:%s ", $1, $2}')
  echo "gpu checked $held"
else
  echo 'gpu none'
fi

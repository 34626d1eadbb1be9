#!/bin/sh
# Slurm on this node, for clustertool (slurm/bringup.py).
# MODE=probe: with STANDIN set, first run it (the stand-in GPU script's text, base64; local nodes
#   only); where cloud-init runs, wait until it is done (it installs the packages); then print `size <slurmd -C's first line>`, `version <slurmd -V>` and `gpus <N>` (the
#   character devices /dev/nvidia<k>).
# MODE=install: make DIRS (0755) and SECRET_DIR (0700); write every file the arguments name, as
#   PATH MODE BASE64 triples; write the munge key KEY_B64 (base64) to KEY_FILE, 0400; then, with
#   START=1, run START_SCRIPT.
# MODE=start: run START_SCRIPT (what the node runs at boot too).
# MODE=stop: stop slurmd, slurmctld and munged by their pid files in RUN_DIR (TERM, then KILL after
#   TENTHS tenths of a second); prints `stopped NAME PID` or `left NAME PID` lines.
# Inputs: MODE, TOOLS_DIR, and per mode STANDIN, DIRS, SECRET_DIR, KEY_FILE, KEY_B64, START,
# START_SCRIPT, RUN_DIR, TENTHS.
umask 022
case "$MODE" in
probe)
  if [ -n "$STANDIN" ]; then
    mkdir -p "$TOOLS_DIR" || exit 1
    printf %s "$STANDIN" | base64 -d > "$TOOLS_DIR/gpu-standin.sh" || exit 1
    sh "$TOOLS_DIR/gpu-standin.sh" || exit 3
  fi
  # a machine of its own installs the packages at its first boot (cloud-init): wait for that to end
  if [ -d /run/cloud-init ] && command -v cloud-init >/dev/null 2>&1; then
    cloud-init status --wait >/dev/null 2>&1 || true
  fi
  command -v slurmd >/dev/null 2>&1 || { echo "error: slurmd is not installed on $(uname -n)"; exit 4; }
  echo "size $(slurmd -C | head -n 1)"
  echo "version $(slurmd -V)"
  n=0
  for dev in /dev/nvidia[0-9]*; do
    case "${dev#/dev/nvidia}" in *[!0-9]*) continue ;; esac
    [ -c "$dev" ] && n=$((n + 1))
  done
  echo "gpus $n"
  ;;
install)
  for d in $DIRS; do mkdir -p "$d" && chmod 0755 "$d" || exit 1; done
  mkdir -p "$SECRET_DIR" && chmod 0700 "$SECRET_DIR" || exit 1
  while [ "$#" -ge 3 ]; do
    printf %s "$3" | base64 -d > "$1.new" && chmod "$2" "$1.new" && mv "$1.new" "$1" || exit 1
    shift 3
  done
  rm -f "$KEY_FILE.new"
  (umask 077 && printf %s "$KEY_B64" | base64 -d > "$KEY_FILE.new") && chmod 0400 "$KEY_FILE.new" \
    && mv -f "$KEY_FILE.new" "$KEY_FILE" || exit 1
  if [ "$START" = 1 ]; then exec sh "$START_SCRIPT"; fi
  echo installed
  ;;
start)
  exec sh "$START_SCRIPT"
  ;;
stop)
  for name in slurmd slurmctld munged; do
    f="$RUN_DIR/$name.pid"
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
      kill -TERM "$pid"
      t=0
      while [ -d "/proc/$pid" ] && [ "$t" -lt "$TENTHS" ]; do sleep 0.1; t=$((t + 1)); done
      [ -d "/proc/$pid" ] && kill -KILL "$pid"
      sleep 0.1
      if [ -d "/proc/$pid" ]; then echo "left $name $pid"; else echo "stopped $name $pid"; fi
    fi
    rm -f "$f"
  done
  ;;
*)
  echo "error: unknown MODE $MODE"
  exit 2
  ;;
esac

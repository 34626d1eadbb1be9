#!/bin/sh
# GPU health of this node, for `doctor --check gpu` (read by doctor/gpu.py).  Each step's output
# follows a line `MARK NAME rc=RC [words]`; RC is its exit status, 124 or 137 when it ran past its
# time box and was stopped (timeout(1) stops the step's whole process group, so nothing waits on it).
# Without nvidia-smi it prints `MARK none rc=0` only.
# Steps: smi-xml (nvidia-smi -q -x), smi-csv (--query-gpu, only when the XML failed), smi-apps
# (compute processes), xid (Xid lines of the kernel log: journalctl -k, else dmesg; words: the source),
# dcgm (dcgmi diag -r DEEP -j; rc 127 where DCGM is not installed).
# Inputs: MARK, BOX (seconds per step), SINCE (journalctl --since; empty: this boot), CSV_FIELDS,
# DEEP (0: no DCGM, else the diag level), DEEP_BOX (seconds for the diag).
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "$MARK none rc=0"
  exit 0
fi
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp" "$tmp.err"' EXIT

boxed() {  # boxed SECONDS CMD...: CMD's output in $tmp, its exit status returned
  secs=$1
  shift
  timeout -k 3 "$secs" "$@" >"$tmp" 2>&1 </dev/null
}

step() {  # step NAME SECONDS CMD...
  name=$1
  secs=$2
  shift 2
  boxed "$secs" "$@"
  rc=$?
  echo "$MARK $name rc=$rc"
  cat "$tmp"
  return $rc
}

step smi-xml "$BOX" nvidia-smi -q -x
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ]; then
  step smi-csv "$BOX" nvidia-smi --query-gpu="$CSV_FIELDS" --format=csv
fi
step smi-apps "$BOX" nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits

# the kernel log: journalctl (this boot, or since SINCE), else dmesg (the ring buffer since boot)
src=
if command -v journalctl >/dev/null 2>&1; then
  if [ -n "$SINCE" ]; then
    timeout -k 3 "$BOX" journalctl -k --no-pager -o short-iso --since "$SINCE" >"$tmp" 2>"$tmp.err" </dev/null
  else
    timeout -k 3 "$BOX" journalctl -k --no-pager -o short-iso -b >"$tmp" 2>"$tmp.err" </dev/null
  fi
  rc=$?
  # no journal at all (a container, no journald): "No journal files were found." and "-- No entries --"
  if [ $rc = 124 ] || [ $rc = 137 ] || { [ $rc = 0 ] && ! grep -q -i 'no journal files' "$tmp.err" &&
    { [ -n "$SINCE" ] || grep -q -v -e '^-- ' "$tmp"; }; }; then
    src=journalctl
  fi
  rm -f "$tmp.err"
fi
if [ -z "$src" ]; then
  boxed "$BOX" dmesg
  rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] && command -v sudo >/dev/null 2>&1; then
    boxed "$BOX" sudo -n dmesg
    rc=$?
  fi
  src=dmesg
  [ -z "$SINCE" ] || src="dmesg (this boot: --since applies to journalctl only)"
  [ $rc = 0 ] || src="dmesg: $(head -n 1 "$tmp" | cut -c1-200)"
fi
echo "$MARK xid rc=$rc $src"
[ $rc = 0 ] && grep -a -e 'NVRM: Xid' "$tmp" | tail -n 500

if [ "$DEEP" != 0 ]; then
  if command -v dcgmi >/dev/null 2>&1; then
    step dcgm "$DEEP_BOX" dcgmi diag -r "$DEEP" -j
  else
    echo "$MARK dcgm rc=127"
  fi
fi
exit 0

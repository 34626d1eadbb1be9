#!/bin/sh
# The monitoring stack on one node (`clustertool monitoring enable|disable|status`).
# Inputs: MODE (enable | disable | status), MARK (CLUSTERTOOL_MONITORING=<cluster>: every process this
# starts carries it, so disable finds them all), ADDR (the node's private address: its node exporter
# listens there, reachable within the cluster only), NODE_PORT, ROLE (leader: Prometheus and clustertool's
# exporter too), PROM_PORT (Prometheus on the leader's loopback), RETENTION_TIME, RETENTION_SIZE,
# PROM_CONFIG_B64, HUB_B64 (the exporter: nodeprogs/watchhub in serve mode), GPU_B64 (nodeprogs/gputext),
# DCGM_PORT, DCGM_MS (NVIDIA's dcgm-exporter, on ADDR, where installed: then it, not gputext, is the GPU exporter).
# Everything lives in ~/.clustertool/monitoring: NAME.pid, NAME.log, textfile/, data/ (Prometheus's TSDB),
# dcgm-targets.json on the leader (the nodes whose dcgm-exporter Prometheus scrapes: written after every node ran).
# Prints one line per process: `running NAME PID`, `stopped NAME`, `skipped NAME why`, `missing NAME what`.
d="$HOME/.clustertool/monitoring"
export PATH="$HOME/.local/bin:$PATH:/usr/sbin:/usr/local/nvidia/bin"
py=$(command -v python3 || command -v python)

ours() {  # ours PID: the process is alive and carries MARK
  [ -n "$1" ] && grep -q -a -z -x "$MARK" "/proc/$1/environ" 2>/dev/null
}

pid_of() {
  p=$(cat "$d/$1.pid" 2>/dev/null)
  ours "$p" && echo "$p"
}

marked() {  # the pids that carry MARK, this shell left out
  grep -l -a -z -x "$MARK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -v -x "$$"
}

stop_all() {  # TERM what carries MARK (the exporter first: it closes its samplers), then KILL what is left
  for name in hub gputext dcgm node-exporter prometheus; do
    p=$(pid_of "$name") && kill -TERM "$p" 2>/dev/null
  done
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    [ -z "$(marked)" ] && break
    marked | while read -r p; do kill -TERM "$p" 2>/dev/null; done
    sleep 0.25
  done
  marked | while read -r p; do kill -KILL "$p" 2>/dev/null; done
  rm -f "$d"/*.pid
}

start() {  # start NAME CMD...: in its own session, detached, carrying MARK
  name=$1
  shift
  env "$MARK" setsid "$@" < /dev/null > "$d/$name.log" 2>&1 &
  echo $! > "$d/$name.pid"
}

gpu_exporter() {  # the GPU exporter this node runs: NVIDIA's dcgm-exporter where installed, else gputext
  if command -v dcgm-exporter > /dev/null 2>&1; then echo dcgm; else echo gputext; fi
}

status() {  # the leader's four processes, a member's two
  names="node-exporter $(gpu_exporter)"
  [ "$ROLE" = leader ] && names="$names hub prometheus"
  for name in $names; do
    if p=$(pid_of "$name"); then echo "running $name $p"; else echo "stopped $name"; fi
  done
}

case "$MODE" in
  status) status; exit 0 ;;
  disable) stop_all; status; exit 0 ;;
esac

exporter=$(command -v prometheus-node-exporter || command -v node_exporter)
[ -n "$exporter" ] || { echo "missing node-exporter prometheus-node-exporter (or node_exporter) on PATH"; exit 3; }
if [ "$ROLE" = leader ]; then
  command -v prometheus > /dev/null || { echo "missing prometheus prometheus (the server) on the leader"; exit 3; }
  [ -n "$py" ] || { echo "missing hub python3 on the leader"; exit 3; }
fi
stop_all
umask 022
mkdir -p "$d/textfile" "$d/data" || exit 1
rm -f "$d/textfile/clustertool_gpu.prom"
start node-exporter "$exporter" "--web.listen-address=$ADDR:$NODE_PORT" \
  "--collector.textfile.directory=$d/textfile"
if [ "$(gpu_exporter)" = dcgm ]; then
  start dcgm dcgm-exporter "--address=$ADDR:$DCGM_PORT" "--collect-interval=$DCGM_MS"
elif [ -n "$py" ] && command -v nvidia-smi > /dev/null 2>&1; then
  printf %s "$GPU_B64" | base64 -d > "$d/gputext.py" || exit 1
  start gputext "$py" "$d/gputext.py"
else
  echo "skipped gputext no nvidia-smi"
fi
if [ "$ROLE" = leader ]; then
  printf %s "$HUB_B64" | base64 -d > "$d/hub.py" || exit 1
  printf %s "$PROM_CONFIG_B64" | base64 -d > "$d/prometheus.yml" || exit 1
  echo '[]' > "$d/dcgm-targets.json" || exit 1
  start hub "$py" "$d/hub.py"
  start prometheus prometheus "--config.file=$d/prometheus.yml" "--storage.tsdb.path=$d/data" \
    "--storage.tsdb.retention.time=$RETENTION_TIME" "--storage.tsdb.retention.size=$RETENTION_SIZE" \
    "--web.listen-address=127.0.0.1:$PROM_PORT"
fi
sleep 1
status
for name in node-exporter gputext dcgm hub prometheus; do  # one that died at once says why
  [ -f "$d/$name.pid" ] && ! pid_of "$name" > /dev/null && echo "failed $name $(tail -n 2 "$d/$name.log" | tr '\n' ' ')"
done
exit 0

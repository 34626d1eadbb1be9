#!/bin/sh
# Install, reconfigure or read the autostop watcher on the leader (nodeprogs/autostop.py).
# Inputs: MODE (install: write the program and config, start the watcher if it is not running;
# show: print config, state and the log's tail), PROGRAM_B64, CONFIG_B64.
# The watcher runs from a systemd timer where systemd is PID 1 (a service per tick), else as a
# supervised loop (run.sh restarts it) started now and at every boot: by ~/.clustertool/boot.sh
# (run by the local provider's node init) and an @reboot crontab line where crontab exists.
d="$HOME/.clustertool/autostop"
if [ "$MODE" = show ]; then
  for f in config state poweroff blockend; do
    printf '%s ' "$f"
    if [ -f "$d/$f.json" ]; then tr -d '\n' < "$d/$f.json"; else printf '{}'; fi
    echo
  done
  tail -n 5 "$d/autostop.log" 2>/dev/null | sed 's/^/log /'
  exit 0
fi
umask 022
mkdir -p "$d" || exit 1
py=$(command -v python3 || command -v python) || { echo "error: no python3 on the leader"; exit 3; }
printf %s "$PROGRAM_B64" | base64 -d > "$d/autostop.py.new" && mv "$d/autostop.py.new" "$d/autostop.py" || exit 1
printf %s "$CONFIG_B64" | base64 -d > "$d/config.json.new" && mv "$d/config.json.new" "$d/config.json" || exit 1
rm -f "$d/state.json"  # a new setting starts the idle count again

sudo=
[ "$(id -u)" = 0 ] || sudo="sudo -n"
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && command -v systemctl >/dev/null 2>&1 \
    && { [ -z "$sudo" ] || sudo -n true 2>/dev/null; }; then
  interval=$("$py" -c 'import json,sys; print(int(json.load(open(sys.argv[1])).get("interval_s") or 60))' \
    "$d/config.json")
  unit=/etc/systemd/system/clustertool-autostop
  printf '%s\n' "[Unit]" "Description=clustertool autostop: one sample of the cluster's idleness" \
    "[Service]" "Type=oneshot" "User=$(id -un)" "Environment=HOME=$HOME" \
    "ExecStart=$py $d/autostop.py tick" | $sudo tee "$unit.service" > /dev/null || exit 1
  printf '%s\n' "[Unit]" "Description=clustertool autostop, every ${interval}s" "[Timer]" \
    "OnBootSec=${interval}s" "OnUnitActiveSec=${interval}s" "AccuracySec=1s" \
    "[Install]" "WantedBy=timers.target" | $sudo tee "$unit.timer" > /dev/null || exit 1
  if ! { $sudo systemctl daemon-reload && $sudo systemctl enable --now clustertool-autostop.timer; } \
      >/dev/null 2>&1; then
    echo "error: systemctl could not enable clustertool-autostop.timer"
    exit 1
  fi
  echo "watcher systemd"
  exit 0
fi

printf '%s\n' "#!/bin/sh" "# clustertool autostop: keep the watcher running" \
  "echo \$\$ > $d/supervisor.pid" \
  "while :; do $py $d/autostop.py loop >> $d/watcher.out 2>&1; sleep 1; done" > "$d/run.sh"
boot="$HOME/.clustertool/boot.sh"
printf '%s\n' "#!/bin/sh" "# started at every boot of this node (clustertool)" \
  "exec setsid sh $d/run.sh < /dev/null > /dev/null 2>&1" > "$boot"
chmod 755 "$d/run.sh" "$boot"
# a local-provider node (its PID 1 is ct-init) runs boot.sh itself and shares the host's crontab
if [ "$(cat /proc/1/comm 2>/dev/null)" != ct-init ] && command -v crontab >/dev/null 2>&1; then
  { crontab -l 2>/dev/null | grep -v 'clustertool/boot.sh'; echo "@reboot sh $boot"; } | crontab - 2>/dev/null
fi
if [ -f "$d/supervisor.pid" ] && pid=$(cat "$d/supervisor.pid") \
    && grep -q -a "autostop/run.sh" "/proc/$pid/cmdline" 2>/dev/null; then
  # the running loop samples a new config at once, and ends after a sample when its program
  # changed (run.sh then starts the new one)
  echo "watcher loop (running, pid $pid)"
  exit 0
fi
setsid sh "$d/run.sh" < /dev/null > /dev/null 2>&1 &
echo "watcher loop (started)"

#!/bin/sh
# The leader's jobs, one line per job folder:
#   J ID EXIT|- ALIVE(0/1) KILLED(0/1) LAUNCHED(0/1) ENDED_EPOCH BASE64(job.json)
# and, for a job whose reduction servers died before it ended: S ID NAME,NAME;
# for a job its supervisor found hung: H ID BASE64(hung);
# for a job run with --restarts: R ID BASE64(attempts.json);
# for a job the autostop watcher warned of the block's end: B ID BASE64(blockend);
# for a job run through Slurm: L ID BASE64(slurm.json) (its waiter's view of Slurm's state)
# Inputs: JOBS_DIR (jobs' folder under $HOME), JOB_ENV (the variable that marks a job's processes).
for d in "$HOME/$JOBS_DIR"/*/; do
  [ -f "$d/job.json" ] || continue
  j=$(basename "$d")
  code=-
  alive=0
  killed=0
  started=0
  [ -f "$d/exit" ] && code=$(cat "$d/exit")
  [ -f "$d/killed" ] && killed=1
  if [ -f "$d/launch.pid" ]; then
    started=1
    read -r p _ < "$d/launch.pid"
    grep -q -a -z -x "$JOB_ENV=$j" "/proc/$p/environ" 2>/dev/null && alive=1
  fi
  ended=$(stat -c %Y "$d/exit" 2>/dev/null || echo 0)
  echo "J $j ${code:--} $alive $killed $started $ended $(base64 -w0 < "$d/job.json")"
  [ -s "$d/servers_lost" ] && echo "S $j $(sort -u "$d/servers_lost" | tr '\n' ',' | sed 's/,$//')"
  [ -s "$d/hung" ] && echo "H $j $(base64 -w0 < "$d/hung")"
  [ -s "$d/attempts.json" ] && echo "R $j $(base64 -w0 < "$d/attempts.json")"
  [ -s "$d/blockend" ] && echo "B $j $(base64 -w0 < "$d/blockend")"
  [ -s "$d/slurm.json" ] && echo "L $j $(base64 -w0 < "$d/slurm.json")"
done
true

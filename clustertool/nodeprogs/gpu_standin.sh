#!/bin/sh
# Stand-in GPUs for a local-provider node (there is no GPU on the machine that runs local clusters):
# COUNT character devices /dev/nvidia0 .. /dev/nvidia<COUNT-1>, numbered as NVIDIA's driver numbers its
# devices (major 195).  No driver answers them (opening one fails); they exist so that Slurm's GRES
# (gres.conf File=/dev/nvidia[0-K]) and clustertool count GPUs on local nodes as on real machines.
# They live in the node's own /dev: an overlay whose lower layer is the machine's /dev and whose
# upper layer is a tmpfs named ct-gpu-standin, in the node's mount namespace, so neither this
# machine nor another node sees them; they are gone when the node stops, and this script (run by the
# node's Slurm start script at every boot) makes them again.  Idempotent.
# Input: COUNT.
if [ "$(cat /proc/1/comm 2>/dev/null)" != ct-init ]; then
  echo "error: stand-in GPUs are made only on local-provider nodes (this node's PID 1 is not ct-init)"
  exit 3
fi
if ! grep -q '^ct-gpu-standin /dev overlay ' /proc/self/mounts; then
  for dev in /dev/nvidia[0-9]*; do
    if [ -e "$dev" ]; then echo "error: this node has GPU devices of its own ($dev): no stand-ins made"; exit 3; fi
  done
  s=$(mktemp -d) || exit 1
  mount -t tmpfs -o mode=755 ct-gpu-standin "$s" && mkdir "$s/u" "$s/w" "$s/m" \
    && mount -t overlay ct-gpu-standin -o "lowerdir=/dev,upperdir=$s/u,workdir=$s/w" "$s/m" || exit 1
  # what is mounted inside /dev (pts, shm ...) moves along into the new /dev
  awk '$2 ~ "^/dev/[^/]+$" { print $2 }' /proc/self/mounts | sort -u > "$s/moved" || exit 1
  while read -r sub; do
    mount --move "$sub" "$s/m/${sub#/dev/}" || exit 1
  done < "$s/moved"
  mount --move "$s/m" /dev && umount -l "$s" && rmdir "$s" || exit 1
fi
k=0
while [ "$k" -lt "$COUNT" ]; do
  [ -c "/dev/nvidia$k" ] || mknod -m 666 "/dev/nvidia$k" c 195 "$k" || exit 1
  k=$((k + 1))
done
echo "stand-in gpus $COUNT"

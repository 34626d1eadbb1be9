#!/bin/sh
# Give this machine the cluster's key, the pinned host keys of every node and an ssh config block
# (MODE=wire), or take exactly those away again (MODE=unwire: machines clustertool does not own).
# Inputs: MODE, NAME (the cluster), PUBLIC (its public key line); for wire also PRIVATE_B64,
# PUBLIC_B64, KNOWN_HOSTS_B64, BLOCK_B64 (the config block; @CT_KEX@ in it becomes the key
# exchanges this node's ssh has, from KEX: fastest first) and HOSTFILE_B64 (the leader's
# ~/hostfile; empty: none).  The key travels base64 in this program, on ssh's stdin: never on
# a command line.
umask 077
ssh_dir="$HOME/.ssh"
key="$ssh_dir/clustertool-$NAME"
begin="# >>> clustertool $NAME >>>"
end="# <<< clustertool $NAME <<<"

# ~/.ssh/config without our marked block, with the file $1 in front
edit_config() {
  touch "$ssh_dir/config" && chmod 600 "$ssh_dir/config"
  awk -v b="$begin" -v e="$end" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' "$ssh_dir/config" \
    > "$ssh_dir/config.ct.tmp"
  cat "$1" "$ssh_dir/config.ct.tmp" > "$ssh_dir/config.ct.new"
  mv "$ssh_dir/config.ct.new" "$ssh_dir/config" && rm -f "$ssh_dir/config.ct.tmp"
}

if [ "$MODE" = unwire ]; then
  rm -f "$key" "$key.pub" "$key.known_hosts"
  if [ -f "$ssh_dir/authorized_keys" ]; then
    grep -vxF "$PUBLIC" "$ssh_dir/authorized_keys" > "$ssh_dir/ak.ct.tmp"
    cat "$ssh_dir/ak.ct.tmp" > "$ssh_dir/authorized_keys"
    rm -f "$ssh_dir/ak.ct.tmp"
  fi
  if [ -f "$ssh_dir/config" ]; then edit_config /dev/null; fi
  # the warm node launchers (nodeprogs/warmlaunch.py) end within seconds of their sockets' removal
  rm -f "$HOME/.clustertool/warm/"*.sock
  exit 0
fi

set -e
mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
printf %s "$PRIVATE_B64" | base64 -d > "$key"
chmod 600 "$key"
printf %s "$PUBLIC_B64" | base64 -d > "$key.pub"
printf %s "$KNOWN_HOSTS_B64" | base64 -d > "$key.known_hosts"
touch "$ssh_dir/authorized_keys" && chmod 600 "$ssh_dir/authorized_keys"
grep -qxF "$PUBLIC" "$ssh_dir/authorized_keys" || printf '%s\n' "$PUBLIC" >> "$ssh_dir/authorized_keys"
have=$(ssh -Q kex 2>/dev/null || true)
kex=
for k in $KEX; do
  if printf '%s\n' "$have" | grep -qxF "$k"; then kex=${kex:+$kex,}$k; fi
done
[ -n "$kex" ] || kex=curve25519-sha256@libssh.org
{ echo "$begin"; printf %s "$BLOCK_B64" | base64 -d | sed "s/@CT_KEX@/$kex/"; echo "$end"; } > "$ssh_dir/config.ct.block"
edit_config "$ssh_dir/config.ct.block"
rm -f "$ssh_dir/config.ct.block"
if [ -n "$HOSTFILE_B64" ]; then
  umask 022
  printf %s "$HOSTFILE_B64" | base64 -d > "$HOME/hostfile"
fi

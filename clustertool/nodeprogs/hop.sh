#!/bin/bash
# One hop of the copy relay (clustertool/transfer/chain.py): extract the tar stream on stdin into
# DEST and, when there is a next hop, forward the same stream to it at the same time.
# Inputs: SDIR (this run's status folder, relative to $HOME), DEST, EXTRACT (1: extract here,
# 0: relay only), TAR_EXTRACT (tar reading the stream, as words), FORWARD (the command that
# carries the stream to the next hop, as words; empty for the last hop).
# Leaves in $SDIR: pgid (so an aborted copy can stop this hop), rc (tar's exit code), next_rc,
# err (tar's complaints).  `tee -p` keeps forwarding when the extraction fails (disk full) and
# keeps extracting when the next hop dies.
set -u
S="$HOME/$SDIR"
ps -o pgid= $$ | tr -d ' ' > "$S/pgid"
exec 3>&2  # tar's checkpoint lines (progress) go to the chain's stderr

finish() {
  echo "$1" > "$S/rc.tmp"
  mv "$S/rc.tmp" "$S/rc"
}

extract() {
  if ! mkdir -p -- "$DEST" 2>"$S/err" || ! cd -- "$DEST" 2>>"$S/err"; then
    finish 2
    cat > /dev/null
    return
  fi
  "${TAR_EXTRACT[@]}" 2>"$S/err"
  finish $?
}

if [ "${#FORWARD[@]}" -eq 0 ]; then
  if [ "$EXTRACT" = 1 ]; then extract; else cat > /dev/null; fi
elif [ "$EXTRACT" = 1 ]; then
  tee -p >(extract) | "${FORWARD[@]}"
  echo "${PIPESTATUS[1]}" > "$S/next_rc"
  while [ ! -e "$S/rc" ]; do sleep 0.05; done
else
  "${FORWARD[@]}"
  echo $? > "$S/next_rc"
  echo 0 > "$S/rc"
fi

"""Stand-in for nvidia-smi's loop mode, for `top`'s GPU columns on machines with no GPU.

``nvidia-smi --query-gpu=... --loop-ms=N`` (what nodeprogs/watchnode.py runs, once, for its whole life)
prints every GPU's line, then again every N ms.  The stand-in replays a recording made of batches
separated by blank lines, sleeping N ms at each blank line, round and round until it is stopped.  Only
nvidia-smi is a stand-in: the sampler, its parsing, the hub and `top` are the real ones.  Put it first on
the node's PATH (``~/.local/bin``, which the sampler looks in first).
"""

from __future__ import annotations

import shlex
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "unit" / "data"
DERIVED_2GPU = DATA / "watch-gpu-derived" / "smi-loop-2gpu.out"
RECORDED_BUSY = DATA / "watch-gpu-recorded" / "smi-loop-busy.out"  # one H200 under load (real)


def batches(text: str) -> str:
    """A recording as the stand-in replays it: a blank line after each batch (a batch starts at GPU 0);
    lines that are not a GPU's (the recorder's own note) left out."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.split(",")[0].strip().isdigit():
            continue
        if line.startswith("0,") and out and out[-1] != "":
            out.append("")
        out.append(line)
    return "\n".join(out + [""]) + "\n"


def write(folder: Path, recording: Path = DERIVED_2GPU, seen_as: str | None = None) -> Path:
    """``folder/nvidia-smi`` and its recording; ``seen_as``: the folder's path as the node sees it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "smi-loop.rec").write_text(batches(recording.read_text()))
    rec = shlex.quote(f"{seen_as or folder}/smi-loop.rec")
    program = folder / "nvidia-smi"
    program.write_text("\n".join([
        "#!/bin/sh",
        "# stand-in for nvidia-smi's loop mode (clustertool tests): replays a recording",
        "ms=",
        'for a in "$@"; do case "$a" in --loop-ms=*) ms=${a#--loop-ms=} ;; esac; done',
        'case "$*" in *--query-gpu=*clocks_event_reasons.active*) ;; *) ms= ;; esac',
        '[ -n "$ms" ] || { echo "stand-in nvidia-smi: no recording for: $*" >&2; exit 2; }',
        's=$(awk -v ms="$ms" "BEGIN { print ms / 1000 }")',
        "while :; do",
        "  while IFS= read -r line; do",
        '    if [ -z "$line" ]; then sleep "$s"; else printf "%s\\n" "$line" || exit 0; fi',
        f"  done < {rec}",
        "done",
        ""]))
    program.chmod(0o755)
    return program

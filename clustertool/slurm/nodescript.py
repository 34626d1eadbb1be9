"""The shell programs a node runs for Slurm: the probe, the install, its start script, the stop.

Pure: each function returns the text of a remote shell program (sent on stdin with ``sh -s``).
``nodeprogs/slurm_node.sh`` does the work; ``start_script_text`` is the node's own start script
(``start.sh`` in its tools folder), which setup runs now and the node's boot runs again:
stand-in GPUs where asked, then munged, slurmctld on the controller, slurmd on compute nodes --
each only when its pid file does not name a live process of that name.
"""

from __future__ import annotations

import base64
import shlex
from typing import Sequence

from clustertool.nodeprogs import shell_script
from clustertool.slurm import munge, slurmcmd
from clustertool.slurm.layout import Layout

STOP_TENTHS = 100  # 10 s from TERM to KILL: slurmd and slurmctld save state on TERM


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def standin_text(count: int) -> str:
    return shell_script("gpu_standin", COUNT=count)


def probe_script(layout: Layout, standin_gpus: int = 0) -> str:
    """``size ...``, ``version ...`` and ``gpus N`` lines (stand-in GPUs made first when asked)."""
    return shell_script("slurm_node", MODE="probe", TOOLS_DIR=layout.tools_dir,
                        STANDIN=_b64(standin_text(standin_gpus)) if standin_gpus else "")


def _start_line(name: str, argv: Sequence[str], layout: Layout) -> list[str]:
    """Start daemon ``name`` unless its pid file names a live ``name``; say why when it does not start."""
    pid, out = layout.pid_file(name), f"{layout.run_dir}/{name}.out"
    return [
        f"if ! running {shlex.quote(pid)} {name}; then",
        f"  {shlex.join(argv)} < /dev/null > {shlex.quote(out)} 2>&1 \\",
        f"    || {{ echo \"error: {name} did not start on $(uname -n): $(tail -n 3 {shlex.quote(out)})\"; exit 1; }}",
        "fi",
    ]


def start_script_text(layout: Layout, node: str, *, controller: bool, compute: bool, standin: bool,
                      slurm_user: str = "root") -> str:
    """The node's start script: what setup runs, and what the node's boot runs again (a systemd layout:
    the distribution's units, enabled, which systemd starts at boot)."""
    if layout.service == "systemd":
        return _systemd_start_text(layout, node, controller=controller, compute=compute, slurm_user=slurm_user)
    run = shlex.quote(layout.run_dir)
    lines = [
        "#!/bin/sh",
        f"# Slurm on {node}, written by clustertool: started at setup and at every boot of the node",
        "running() { [ -f \"$1\" ] && [ \"$(cat \"/proc/$(cat \"$1\")/comm\" 2>/dev/null)\" = \"$2\" ]; }",
        "umask 022",
        f"mkdir -p {run} && chmod 0755 {run} || exit 1",
        f"[ -O {run} ] || {{ echo \"error: {layout.run_dir} belongs to someone else\"; exit 1; }}",
    ]
    if standin:
        lines.append(f"sh {shlex.quote(layout.standin_script)} > /dev/null || exit 1")
    lines += _start_line("munged", munge.munged_argv(layout), layout)
    if controller:
        lines += _start_line("slurmctld", slurmcmd.slurmctld_argv(layout), layout)
    if compute:
        lines += _start_line("slurmd", slurmcmd.slurmd_argv(layout, node), layout)
    lines.append("echo started")
    return "\n".join(lines) + "\n"


def _systemd_start_text(layout: Layout, node: str, *, controller: bool, compute: bool, slurm_user: str) -> str:
    """Debian's and Ubuntu's units: munge, slurmctld (controller), slurmd (compute, as ``node``), enabled so
    that systemd starts them at every boot; restarted now (they read the new key and config)."""
    key, user = shlex.quote(layout.munge_key), shlex.quote(slurm_user)
    lines = [
        "#!/bin/sh",
        f"# Slurm on {node}, written by clustertool: the distribution's systemd units, enabled (they start at boot)",
        "set -e",
        f"chown munge:munge {key} 2>/dev/null || true",
        "systemctl enable munge >/dev/null 2>&1 && systemctl restart munge",
    ]
    if controller:
        lines += [f"chown -R {user}: {shlex.quote(layout.state_dir)} {shlex.quote(layout.log_dir)}",
                  "systemctl enable slurmctld >/dev/null 2>&1 && systemctl restart slurmctld"]
    if compute:
        lines += [f"echo {shlex.quote('SLURMD_OPTIONS=' + shlex.join(['-N', node]))} > /etc/default/slurmd",
                  "systemctl enable slurmd >/dev/null 2>&1 && systemctl restart slurmd"]
    lines.append("echo started")
    return "\n".join(lines) + "\n"


def boot_hook_text(layout: Layout) -> str:
    """A local node's boot.d entry: its start script again, at every boot (output in the log folder)."""
    log = shlex.quote(f"{layout.log_dir}/start.log")
    return f"#!/bin/sh\n# Slurm's daemons, started again at every boot of the node (clustertool)\n" \
           f"exec sh {shlex.quote(layout.start_script)} >> {log} 2>&1\n"


def install_script(layout: Layout, files: dict[str, str], key: bytes, start_text: str, *, start: bool,
                   standin_gpus: int = 0, boot_hook: str | None = None) -> str:
    """Folders, config files, the start script (and stand-in script, and ``boot_hook``: the file a local
    node's boot runs), the munge key; then start."""
    triples: list[str] = []
    for name, text in files.items():
        triples += [f"{layout.conf_dir}/{name}", "0644", _b64(text)]
    triples += [layout.start_script, "0755", _b64(start_text)]
    if boot_hook:
        triples += [boot_hook, "0755", _b64(boot_hook_text(layout))]
    if standin_gpus:
        triples += [layout.standin_script, "0755", _b64(standin_text(standin_gpus))]
    dirs = [layout.conf_dir, layout.state_dir, layout.spool_dir, layout.log_dir, layout.tools_dir]
    if boot_hook:
        dirs.append(boot_hook.rsplit("/", 1)[0])
    return shell_script("slurm_node", args=triples, MODE="install", TOOLS_DIR=layout.tools_dir,
                        DIRS=" ".join(dirs), SECRET_DIR=layout.munge_dir, KEY_FILE=layout.munge_key,
                        KEY_B64=munge.key_b64(key), START="1" if start else "0", START_SCRIPT=layout.start_script)


def start_script(layout: Layout) -> str:
    return shell_script("slurm_node", MODE="start", TOOLS_DIR=layout.tools_dir, START_SCRIPT=layout.start_script)


def stop_script(layout: Layout, tenths: int = STOP_TENTHS) -> str:
    return shell_script("slurm_node", MODE="stop", TOOLS_DIR=layout.tools_dir, RUN_DIR=layout.run_dir,
                        TENTHS=tenths)

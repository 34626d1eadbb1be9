"""Where Slurm's and munge's files live on a node.

Two layouts.  ``private_layout`` keeps everything under the user's home (config, key, controller
state, slurmd's spool, logs) and puts sockets and pid files in a folder that starts empty at every
boot: a local-provider node shares this machine's /etc, /run and /var, so its Slurm must never
touch them (nor this machine's /etc/munge).  Its clients then need ``SLURM_CONF``.
``system_layout`` is the usual one of a machine of its own (/etc/slurm, /var/spool, /run/munge).
"""

from __future__ import annotations

from dataclasses import dataclass

SLURM_CONF = "slurm.conf"
GRES_CONF = "gres.conf"
CGROUP_CONF = "cgroup.conf"
DEFAULT_CONF = "/etc/slurm/slurm.conf"  # where Slurm's programs look when SLURM_CONF is not set


@dataclass(frozen=True)
class Layout:
    conf_dir: str    # slurm.conf, gres.conf, cgroup.conf (every node holds the same files)
    state_dir: str   # slurmctld's StateSaveLocation (the controller's queue survives a restart)
    spool_dir: str   # slurmd's SlurmdSpoolDir
    log_dir: str     # slurmctld.log, slurmd.log, munged.log
    run_dir: str     # pid files (and munge's socket in the private layout); must start empty at boot
    munge_dir: str   # the key (0400) and munged's seed, in a 0700 folder
    munge_socket: str  # munged's socket; its folder must be 0755 and every parent searchable by all
    tools_dir: str   # clustertool's node scripts: start.sh (what boot runs), gpu-standin.sh
    # what starts the daemons at boot: "script" (start.sh, from the local node's boot hook) or "systemd"
    # (the distribution's units, enabled by start.sh: a machine of its own)
    service: str = "script"

    @property
    def slurm_conf(self) -> str:
        return f"{self.conf_dir}/{SLURM_CONF}"

    @property
    def munge_key(self) -> str:
        return f"{self.munge_dir}/munge.key"

    @property
    def munge_seed(self) -> str:
        return f"{self.munge_dir}/munged.seed"

    @property
    def start_script(self) -> str:
        return f"{self.tools_dir}/start.sh"

    @property
    def standin_script(self) -> str:
        return f"{self.tools_dir}/gpu-standin.sh"

    @property
    def needs_conf_env(self) -> bool:
        """Whether Slurm's clients must be told where slurm.conf is (``SLURM_CONF``)."""
        return self.slurm_conf != DEFAULT_CONF

    def pid_file(self, daemon: str) -> str:
        return f"{self.run_dir}/{daemon}.pid"

    def log_file(self, daemon: str) -> str:
        return f"{self.log_dir}/{daemon}.log"


def private_layout(home: str = "/root") -> Layout:
    """Everything under ``home``/.clustertool/slurm; sockets and pids in /tmp/.clustertool-slurm.

    munged refuses a socket whose parent folders are not searchable by everyone, and a home is
    0700; a local node's /tmp is its own and starts empty at every boot, as /run does."""
    base = f"{home.rstrip('/')}/.clustertool/slurm"
    run = "/tmp/.clustertool-slurm"
    return Layout(conf_dir=f"{base}/etc", state_dir=f"{base}/state", spool_dir=f"{base}/spool",
                  log_dir=f"{base}/log", run_dir=run, munge_dir=f"{base}/munge",
                  munge_socket=f"{run}/munge.socket", tools_dir=base)


def system_layout() -> Layout:
    """The paths Debian's and Ubuntu's packages use (their systemd units start the daemons; pid files in /run,
    where the units look)."""
    return Layout(conf_dir="/etc/slurm", state_dir="/var/spool/slurmctld", spool_dir="/var/spool/slurmd",
                  log_dir="/var/log/slurm", run_dir="/run", munge_dir="/etc/munge",
                  munge_socket="/run/munge/munge.socket.2", tools_dir="/etc/slurm/clustertool", service="systemd")

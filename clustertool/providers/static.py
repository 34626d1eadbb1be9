"""The ``static`` provider: adopt machines that already exist.

The common case of instances launched by hand in a console: the user lists them with
``--hosts a,b,c`` (entries may be ``host:port`` or ranges such as ``10.0.1.[10-13]``) or
``--hostfile FILE`` (any format ``clustertool.core.hostfile`` reads), names a private key that
reaches them with ``--key``, and the leader with ``--leader`` (default: the first).
clustertool never starts, stops or terminates these machines: ``down`` only removes the
tool's own keys from them (done by the lifecycle, not here).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import getpass
import os
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from clustertool.core import hostfile, nodeset
from clustertool.core.errors import ProviderError, UsageError
from clustertool.core.model import LEADER, MEMBER, SERVER, ClusterRecord, Node
from clustertool.providers.base import OptionSpec, Provider, ProvisionRequest

_HINT = "e.g. --hosts 10.0.1.5,10.0.1.6 --key ~/.ssh/mykey.pem, or --hostfile hosts.txt"


def _current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no USER/LOGNAME and no passwd entry (some containers)
        return "root"


@dataclass(frozen=True)
class Target:
    """One adopted machine as listed by the user."""

    host: str
    port: int
    slots: int | None = None

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"


def _port(value: Any, where: str) -> int:
    text = str(value).strip()
    if not text.isdigit() or not text.isascii() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{where}: expected a TCP port 1-65535, got {value!r}", hint=_HINT)
    return int(text)


def _checked_host(host: str, where: str) -> str:
    problem = hostfile.host_problem(host)
    if problem:
        raise UsageError(f"{where}: {problem}", hint=_HINT)
    return host


def parse_hosts(text: str, default_port: int = 22) -> list[Target]:
    """``a,b:2222,10.0.1.[10-13]`` -> targets in written order."""
    targets: list[Target] = []
    try:
        items = nodeset.split_top(text.strip())
    except UsageError as exc:
        raise UsageError(f"--hosts: {exc.message}", hint=_HINT) from None
    for item in items:
        item = item.strip()
        host_part, sep, port_part = item.rpartition(":") if ":" in item else (item, "", "")
        port = _port(port_part, f"--hosts {item!r}") if sep else default_port
        try:
            names = nodeset.expand(host_part) if host_part else [host_part]
        except UsageError as exc:
            raise UsageError(f"--hosts: {exc.message}", hint=_HINT) from None
        targets.extend(Target(_checked_host(n, "--hosts"), port) for n in names)
    return targets


def read_hostfile(path: str, default_port: int = 22) -> list[Target]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise UsageError(f"--hostfile {path}: no such file", hint=_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UsageError(f"--hostfile {path}: cannot read it: {reason}") from None
    entries = hostfile.parse(text, source=path)
    return [Target(e.host, default_port, e.slots) for e in entries]


def check_key(path: str) -> str:
    """The absolute path of a usable private key file, or a one-line error saying why not."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(full):
        raise UsageError(f"--key {path}: no such file", hint="give the private key that reaches the machines")
    if not os.path.isfile(full):
        raise UsageError(f"--key {path}: not a regular file")
    if not os.access(full, os.R_OK):
        raise UsageError(f"--key {path}: not readable by this user")
    mode = stat.S_IMODE(os.stat(full).st_mode)
    if mode & 0o077:
        raise UsageError(f"--key {path}: readable by group or others (mode {mode:04o}); ssh refuses such keys",
                         hint=f"chmod 600 {full}")
    with open(full, "rb") as fh:
        head = fh.read(64)
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        raise UsageError(f"--key {path}: this is a public key; give the private key file")
    return full


class StaticProvider(Provider):
    """Machines that already exist: listed, checked, adopted; never created or destroyed."""

    name: ClassVar[str] = "static"
    owns_machines: ClassVar[bool] = False
    default_user: ClassVar[str] = _current_user()
    count_from_options: ClassVar[bool] = True  # --nodes may be left out: as many as listed
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ("hostfile", "key")  # made absolute by the spec
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "hosts": OptionSpec(str, None, "Existing machines to adopt: a,b,c (host or host:port; ranges like "
                                       "10.0.1.[5-8])."),
        "hostfile": OptionSpec(str, None, "Hostfile listing existing machines (Open MPI, MPICH, Horovod or DeepSpeed "
                                          "format)."),
        "key": OptionSpec(str, None, "Private key that reaches the existing machines (default: your ssh "
                                     "agent/config)."),
        "leader": OptionSpec(str, None, "Which listed host is the leader (default: the first)."),
        "port": OptionSpec(int, 22, "SSH port of the existing machines."),
        "servers": OptionSpec(str, None, "Existing machines to adopt as reduction servers (role server, not ranks): "
                                         "a,b (host or host:port)."),
        "slurm_login": OptionSpec(str, None, "Adopt the Slurm cluster this login node reaches (HOST or HOST:PORT): "
                                             "its nodes come from sinfo, jobs go through sbatch/srun as you; its "
                                             "config and daemons are never changed."),
        "slurm_conf": OptionSpec(str, None, "With --slurm-login: the slurm.conf the login node's Slurm commands "
                                            "read (default: Slurm's own, /etc/slurm/slurm.conf or configless)."),
    }

    def __init__(self, reach_timeout: float = 20.0, **_ignored: Any):
        super().__init__()
        self.reach_timeout = reach_timeout

    # -- validation -------------------------------------------------------------------------

    def targets(self, options: dict[str, Any]) -> list[Target]:
        hosts, hostfile = options.get("hosts"), options.get("hostfile")
        if options.get("slurm_login"):  # the login node first; its Slurm names the others (cluster/slurmadopt.py)
            if hosts or hostfile or options.get("servers"):
                raise UsageError("--slurm-login adopts the nodes sinfo lists: leave out --hosts, --hostfile and "
                                 "--servers")
            return parse_hosts(str(options["slurm_login"]), _port(options.get("port") or 22, "--port"))[:1]
        if options.get("slurm_conf"):
            raise UsageError("--slurm-conf goes with --slurm-login (the login node of the Slurm cluster to adopt)")
        if bool(hosts) == bool(hostfile):
            which = "both" if hosts else "neither"
            raise UsageError(f"static provider: give exactly one of --hosts or --hostfile ({which} given)",
                             hint=_HINT)
        port = _port(options.get("port") or 22, "--port")
        found = parse_hosts(str(hosts), port) if hosts else read_hostfile(str(hostfile), port)
        if not found:
            raise UsageError(f"static provider: {'--hostfile ' + str(hostfile) if hostfile else '--hosts'} "
                             "lists no hosts", hint=_HINT)
        seen: set[tuple[str, int]] = set()
        for target in found:
            if (target.host, target.port) in seen:
                raise UsageError(f"static provider: host {target.label} is listed twice")
            seen.add((target.host, target.port))
        return found

    @staticmethod
    def leader_index(targets: list[Target], leader: str | None) -> int:
        if not leader:
            return 0
        matches = [i for i, t in enumerate(targets)
                   if leader in (t.host, t.label, f"node-{i + 1}")]
        if len(matches) == 1:
            return matches[0]
        listed = ", ".join(t.host if t.port == targets[0].port else t.label for t in targets)
        if matches:
            raise UsageError(f"--leader {leader!r} matches several hosts; name it as host:port",
                             hint=f"hosts: {listed}")
        raise UsageError(f"--leader {leader!r} is not one of the hosts: {listed}")

    def _checked(self, request: ProvisionRequest) -> tuple[list[Target], int, str | None]:
        options = request.cluster.options
        targets = self.targets(options)
        count = request.count
        if count and count != len(targets):
            raise UsageError(f"--nodes {count} does not match the {len(targets)} host(s) listed",
                             hint="leave --nodes out to adopt every listed host")
        leader = self.leader_index(targets, options.get("leader"))
        key = check_key(str(options["key"])) if options.get("key") else None
        return targets, leader, key

    def server_targets(self, options: dict[str, Any], targets: list[Target]) -> list[Target]:
        """--servers a,b: adopted reduction servers; none of them may also be a node."""
        if not options.get("servers"):
            return []
        found = parse_hosts(str(options["servers"]), _port(options.get("port") or 22, "--port"))
        taken = {(t.host, t.port) for t in targets}
        for target in found:
            if (target.host, target.port) in taken:
                raise UsageError(f"static provider: host {target.label} is listed twice (a node and a server, or "
                                 "twice in --servers)")
            taken.add((target.host, target.port))
        return found

    def check(self, request: ProvisionRequest) -> None:
        targets, _, _ = self._checked(request)
        self.server_targets(request.cluster.options, targets)

    def plan(self, request: ProvisionRequest) -> list[str]:
        targets, leader, key = self._checked(request)
        lines = [f"adopt node-{i} = {t.label}{' (leader)' if i - 1 == leader else ''}, "
                 f"slots {request.slots or t.slots or 1}" for i, t in enumerate(targets, 1)]
        servers = self.server_targets(request.cluster.options, targets)
        lines += [f"adopt server-{j} = {t.label} (reduction server, not a rank)" for j, t in enumerate(servers, 1)]
        lines.append(f"reach them as {request.cluster.user} with "
                     f"{'key ' + key if key else 'your ssh agent / default keys'}")
        lines.append("machines are adopted, never created, stopped or terminated by clustertool")
        if request.cluster.options.get("slurm_login"):
            lines.append("then the Slurm cluster node-1 logs into: its nodes (sinfo, scontrol show node) adopted as "
                         "node-2 ...; jobs through sbatch/srun as you; its config and daemons are never changed")
        return lines

    # -- verbs ------------------------------------------------------------------------------

    def run_instances(self, request: ProvisionRequest) -> list[Node]:
        targets, leader, key = self._checked(request)
        cluster = request.cluster
        if key:
            cluster.ssh_key = key
        if cluster.options.get("hostfile"):
            cluster.options["hostfile"] = os.path.abspath(os.path.expanduser(str(cluster.options["hostfile"])))
        servers = self.server_targets(cluster.options, targets)
        cluster.provider_state["adopted"] = [t.label for t in targets + servers]
        request.save()
        nodes = [
            Node(name=f"node-{i}", index=i, address=t.host, role=LEADER if i - 1 == leader else MEMBER,
                 slots=request.slots or t.slots or 1, ssh_host=t.host, ssh_port=t.port,
                 state="running", extra={"adopted": True})
            for i, t in enumerate(targets, 1)
        ]
        return nodes + [Node(name=f"server-{j}", index=len(targets) + j, address=t.host, role=SERVER, slots=0,
                             ssh_host=t.host, ssh_port=t.port, state="running", extra={"adopted": True})
                        for j, t in enumerate(servers, 1)]

    def wait_instances(self, cluster: ClusterRecord, timeout: float = 600.0) -> list[Node]:
        """Every node's SSH port must accept a TCP connection within a bounded time."""
        if cluster.no_ssh:
            return cluster.nodes
        deadline = time.monotonic() + min(timeout, self.reach_timeout)
        failures = {name: why for name, why in _probe_all(cluster.nodes, deadline).items() if why}
        if failures:
            parts = [f"{n.name} {n.reach_host}:{n.ssh_port} ({failures[n.name]})"
                     for n in cluster.nodes if n.name in failures]
            raise ProviderError(
                f"static host{'s' if len(parts) > 1 else ''} not reachable on the SSH port: {'; '.join(parts)}",
                hint="check the address, that sshd runs there, and firewalls / security groups",
            )
        return cluster.nodes

    def query_instances(self, cluster: ClusterRecord) -> list[Node]:
        results = _probe_all(cluster.nodes, time.monotonic() + 3.0, retry=False)
        return [dataclasses.replace(n, state="running" if not results.get(n.name) else "unreachable")
                for n in cluster.nodes]

    def stop_instances(self, cluster: ClusterRecord) -> None:
        raise ProviderError("static machines are not managed by clustertool: it cannot stop them",
                            hint="stop them where you launched them (e.g. the cloud console)")

    def start_instances(self, cluster: ClusterRecord) -> list[Node]:
        raise ProviderError("static machines are not managed by clustertool: it cannot start them",
                            hint="start them where you launched them, then `clustertool status`")

    def terminate_instances(self, cluster: ClusterRecord) -> list[str]:
        return [f"left {n.name} ({n.reach_host}) running: static machines are adopted, never terminated"
                for n in cluster.ordered_nodes()]


def probe(host: str, port: int, deadline: float, retry: bool = True) -> str | None:
    """None once ``host:port`` accepts a TCP connection before ``deadline``; else why not.

    With ``retry`` a refused or failed attempt is repeated until the deadline (a machine
    still booting); without, the first answer counts.
    """
    reason = "timed out"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return reason
        try:
            with socket.create_connection((host, port), timeout=min(3.0, max(remaining, 0.05))):
                return None
        except socket.gaierror:
            return "unknown host name"
        except socket.timeout:
            reason = "timed out"
        except ConnectionRefusedError:
            reason = "connection refused"
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        if not retry:
            return reason
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def _probe_all(nodes: list[Node], deadline: float, retry: bool = True) -> dict[str, str | None]:
    if not nodes:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        futures = {n.name: pool.submit(probe, n.reach_host, n.ssh_port, deadline, retry) for n in nodes}
        return {name: f.result() for name, f in futures.items()}

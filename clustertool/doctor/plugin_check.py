"""`plugin check`: is NCCL using the plugin, and which algorithm did it pick?

1. The deployed files are the same on every node as at deploy time (else: deploy again).
2. GPUs per node from the node facts (nvidia-smi, the probe doctor uses).
3. GPU cluster: a short NCCL allreduce over every slot (one rank per GPU), a `clustertool run`
   job from the leader with the job's plugin environment and NCCL's INFO log on. The program is
   the GPU proof's torch worker (bench/nccl_gpu_worker.py), sent to every node: PyTorch users'
   NCCL is the one their torch wheel brings, which is the NCCL this must judge, and Deep
   Learning AMIs have torch; native/gpu/nccl_plugin_allreduce would need nvcc and NCCL's
   headers on the leader and would link the system NCCL, not torch's.
   No GPU: the collnet_bench stand-in (what `bench allreduce` runs), one rank per node.
   Reduction servers run no rank: ranks are the workers; with servers the job is a `run --plugin`
   job in both modes (its reducers start on the servers), and the stand-in runs `servers` too.
   Cordoned nodes (`clustertool cordon`) take no part, as in every job.
4. The report (plugin_check_report.py): NCCL version, plugin and ABI, CollNet on or why not, algorithm
   and protocol per size, busbw, #wrong, problems with fixes. doctor's `plugin-nccl` reuses it.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Callable

from clustertool.bench.allreduce import bench_argv, parse_sizes
from clustertool.bench.benchjobs import OnLine, jobs_launcher
from clustertool.cluster.facts import facts_script, gpu_count, parse_facts
from clustertool.cluster.session import ClusterSession
from clustertool.core import nodeset
from clustertool.core.errors import MissingPrerequisite, RemoteError, ToolError, UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.doctor.plugin_check_report import RESULT_MARK, CheckReport, nccl_report, standin_report
from clustertool.plugin.build import ARTEFACTS, BENCH, NET_LIB, load_record
from clustertool.plugin.remote import mismatched, parse_sums, status_command
from clustertool.remote.group import run_on_nodes

WORKER = Path(__file__).resolve().parents[2] / "bench" / "nccl_gpu_worker.py"
CHECK_DIR = ".clustertool/plugin-check"     # under each node's home: the worker and each rank's result
# NCCL_DEBUG_SUBSYS: what the issue asks for, plus ENV: NCCL 2.30 logs NCCL_COLLNET_ENABLE under ENV,
# and without that line a CollNet that is off has no reason to give.
DEBUG_SUBSYS = "INIT,NET,GRAPH,TUNING,COLL,ENV"
# Where torch lives: PATH's python3, the DLAMI's venv (/opt/pytorch) and its older conda env.
PYTHONS = ("python3", "/opt/pytorch/bin/python3", "/opt/conda/envs/pytorch/bin/python", "/opt/conda/bin/python3")
STANDIN_ALGOS = ("sharded", "ring", "mpi")

# Each rank: Open MPI's rank numbers for torch.distributed, the worker with the rest of the
# arguments, then its JSON result on one line of the rank's output.
RANK_SCRIPT = (
    'd="$HOME/' + CHECK_DIR + '"; '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK"; '
    'out="$d/result.$RANK.json"; rm -f "$out"; py="$1"; shift; '
    '"$py" "$d/nccl_gpu_worker.py" "$@" --out "$out" || exit $?; '
    'printf "' + RESULT_MARK + '%s\\n" "$(cat "$out")"'
)

# launch(env, argv, plugin, per_node) -> (exit code or None, output, error or None)
Launch = Callable[[list[str], list[str], bool, "int | None"], tuple]


# ---- pure: sizes, argv, environment, remote lines ------------------------------------------

def size_list(text: str) -> list[int]:
    """'1M:64M' -> 1M, 2M, ... 64M; float32 buffers, so multiples of 4 bytes."""
    lo, hi = parse_sizes(text)
    if lo % 4:
        raise UsageError(f"--sizes {text!r}: float32 messages need a multiple of 4 bytes")
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= 2
    return sizes


def worker_argv(python: str, sizes: list[int], iters: int, warmup: int) -> list[str]:
    """What every rank runs (after the jobs' own rank wrapper)."""
    return ["sh", "-c", RANK_SCRIPT, "ct-nccl-check", python, "--sizes", ",".join(map(str, sizes)),
            "--iters", str(iters), "--warmup", str(warmup)]


def gpu_env(leader_address: str, port: int) -> list[str]:
    """-x items besides the plugin's (`run --plugin` adds those): NCCL's log, torch's rendezvous."""
    return ["NCCL_DEBUG=INFO", f"NCCL_DEBUG_SUBSYS={DEBUG_SUBSYS}", f"MASTER_ADDR={leader_address}",
            f"MASTER_PORT={port}"]


def rendezvous_port() -> int:
    """A port for torch's store on the leader, away from torchrun's default 29500."""
    return 20000 + secrets.randbelow(9000)


def python_probe(candidates: tuple[str, ...] | list[str]) -> str:
    """Remote line: save the worker from stdin, then print ``python=PATH`` of the first candidate
    that has torch (found without importing it), else ``python=none``."""
    d = f'"$HOME/{CHECK_DIR}"'
    has_torch = shlex.quote("import importlib.util,sys; sys.exit(importlib.util.find_spec('torch') is None)")
    names = " ".join(shlex.quote(c) for c in candidates)
    return (f"mkdir -p {d} && cat > {d}/nccl_gpu_worker.py && "
            f"for p in {names}; do q=$(command -v \"$p\") && \"$q\" -c {has_torch} 2>/dev/null "
            f"&& {{ echo \"python=$q\"; exit 0; }}; done; echo python=none")


def parse_python(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("python="):
            value = line[len("python="):].strip()
            return None if value in ("", "none") else value
    return None


# ---- on the cluster -------------------------------------------------------------------------

def deployed_record(cluster: ClusterRecord) -> dict:
    deployed = load_record(cluster.name).get("deployed")
    if not deployed:
        raise ToolError(f"the NCCL plugin is not deployed on cluster {cluster.name!r}",
                        hint="clustertool plugin build && clustertool plugin deploy")
    return deployed


def in_use(cluster: ClusterRecord) -> list[Node]:
    """The nodes a check job uses: the workers and reduction servers not cordoned."""
    return cluster.schedulable + cluster.schedulable_servers


def verify_deployed(session: ClusterSession, deployed: dict) -> None:
    """Every node holds the files `plugin deploy` put there (NCCL hangs when nodes differ)."""
    cluster = session.record
    expected = deployed.get("files") or {NET_LIB: deployed["sha256"]}
    files = [a for a in ARTEFACTS if a in expected]
    group = run_on_nodes(session, in_use(cluster), status_command(deployed["dest"], files),
                         timeout=60)
    down = [f"{r.node} ({r.reason})" for r in group.failed()]
    if down:
        raise RemoteError(f"plugin check: {', '.join(down)}", hint="`clustertool doctor` says more")
    bad = []
    for r in group.results:
        sums = parse_sums(r.stdout)
        wrong = [f"{f} {'differs' if f in sums else 'missing'}" for f in mismatched(expected, sums, files)]
        if wrong:
            bad.append(f"{r.node}: {', '.join(wrong)}")
    if bad:
        raise ToolError(f"the plugin on the nodes is not the one deployed: {'; '.join(bad)}",
                        hint="clustertool plugin deploy (then `clustertool plugin status`)")


def probe_gpus(session: ClusterSession, dest: str) -> dict[str, int]:
    """{worker: GPUs} from the node facts doctor reads (reduction servers run no rank)."""
    cluster = session.record
    script = facts_script(f"{dest.rstrip('/')}/{NET_LIB}", []).encode()
    group = run_on_nodes(session, cluster.schedulable, "sh -s", stdin_data=script, timeout=60)
    down = [f"{r.node} ({r.reason})" for r in group.failed()]
    if down:
        raise RemoteError(f"plugin check: {', '.join(down)}", hint="`clustertool doctor` says more")
    return {r.node: gpu_count(parse_facts(r.node, r.stdout)) for r in group.results}


def find_python(session: ClusterSession, python: str | None) -> str:
    """Send the worker to every node and find the python with torch; the same path everywhere
    (mpirun runs one command line on every node)."""
    cluster = session.record
    worker = WORKER.read_bytes() if WORKER.is_file() else None
    if worker is None:
        raise MissingPrerequisite(f"{WORKER} is missing", hint="plugin check runs from the clustertool repository")
    group = run_on_nodes(session, cluster.schedulable, python_probe([python] if python else PYTHONS),
                         stdin_data=worker, timeout=120)
    down = [f"{r.node} ({r.reason})" for r in group.failed()]
    if down:
        raise RemoteError(f"plugin check: {', '.join(down)}")
    found = {r.node: parse_python(r.stdout) for r in group.results}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise MissingPrerequisite(f"no python with torch on {nodeset.fold(missing)} (tried "
                                  f"{python or ', '.join(PYTHONS)})", hint="--python PATH names the interpreter")
    paths = sorted({p for p in found.values() if p is not None})  # all of them: none is missing
    if len(paths) > 1:
        raise ToolError(f"the nodes' python with torch differ: {', '.join(paths)}", hint="--python PATH names one")
    return paths[0]


def _default_launch(session: ClusterSession, timeout: float, on_line: OnLine | None) -> Launch:
    def launch(env, argv, plugin, per_node):
        run = jobs_launcher(session, env=env, timeout=timeout, on_line=on_line, plugin=plugin, name="plugin-check")
        return run(session.record.schedulable, per_node, argv)  # `run --plugin` starts the servers' reducers
    return launch


def check(session: ClusterSession, *, sizes: str = "1M:64M", iters: int = 5, warmup: int = 2,
          python: str | None = None, timeout: float = 600, gpus: dict[str, int] | None = None,
          launch: Launch | None = None) -> CheckReport:
    """Run the check on ``cluster`` (``gpus``: per node, when the caller knows them already)."""
    cluster, report = session.record, session.report
    size_values = size_list(sizes)
    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    deployed = deployed_record(cluster)
    plugin = {k: deployed.get(k) for k in ("dest", "version", "sha256")}
    names = [n.name for n in cluster.schedulable]
    servers = len(cluster.schedulable_servers)
    with_servers = f" and {servers} reduction server(s)" if servers else ""
    report(f"comparing the plugin on {nodeset.fold([n.name for n in in_use(cluster)])} with the deploy")
    verify_deployed(session, deployed)
    gpus = gpus if gpus is not None else probe_gpus(session, deployed["dest"])
    launch = launch or _default_launch(session, timeout, None)
    if not any(gpus.get(n, 0) for n in names):
        note = f"no GPU on {nodeset.fold(names)}: running the collnet_bench stand-in (not NCCL){with_servers}"
        report(f"no GPU: collnet_bench on {len(names)} rank(s){with_servers}, {sizes}, as job plugin-check")
        # with servers: the plugin's default algorithm there, run as `run --plugin` (which starts
        # this job's reducers on the server nodes and stops them after)
        algos = (("servers",) if servers else ()) + STANDIN_ALGOS
        argv = bench_argv(f"{deployed['dest'].rstrip('/')}/{BENCH}", (size_values[0], size_values[-1]),
                          algos, iters=iters, warmup=warmup)
        code, output, error = launch([], argv, bool(servers), 1)
        return standin_report(cluster.name, names, output, code, error, plugin, note, servers=servers)
    _check_slots(cluster, gpus)
    report("finding python with torch on every node")
    py = find_python(session, python)
    ranks = sum(n.slots for n in cluster.schedulable)
    note = f"NCCL allreduce on {ranks} GPU rank(s) over {len(names)} node(s){with_servers} ({py})"
    report(f"{note}, {sizes}, as job plugin-check")
    code, output, error = launch(gpu_env(cluster.leader.address, rendezvous_port()),
                                 worker_argv(py, size_values, iters, warmup), True, None)
    return nccl_report(cluster.name, names, ranks, output, code, error, plugin, note, servers=servers)


def _check_slots(cluster: ClusterRecord, gpus: dict[str, int]) -> None:
    """One rank per slot and one GPU per rank: every worker needs GPUs, at least as many as slots
    (reduction servers run no rank: they need none)."""
    none = [n.name for n in cluster.schedulable if not gpus.get(n.name)]
    if none:
        raise ToolError(f"no GPU on {nodeset.fold(none)} while the other nodes have GPUs",
                        hint="NCCL runs over every node: fix or remove the nodes without GPUs (`clustertool doctor`)")
    over = [f"{n.name} ({n.slots} slots, {gpus[n.name]} GPUs)" for n in cluster.schedulable
            if n.slots > gpus[n.name]]
    if over:
        raise ToolError(f"more slots than GPUs on {', '.join(over)}: NCCL needs one GPU per rank",
                        hint="slots come from `clustertool up --slots N` (or the spec's `slots:`): one per GPU")


def run(session: ClusterSession, **kwargs) -> CheckReport:
    """`clustertool plugin check`: see :func:`check` for the arguments."""
    session.ready()
    return check(session, **kwargs)

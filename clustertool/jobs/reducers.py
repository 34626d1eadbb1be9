"""Reduction servers of a `run --plugin` job: one clustertool-reducer per server node, per job.

Each reducer listens on a port of its own (``--port 0`` and a port file), so jobs that run at
the same time never collide; it carries ``CLUSTERTOOL_JOB=<id>`` in its environment, so `kill`
finds it like any process of the job.  Its files on the server live in the job's folder
(``~/.clustertool/jobs/<id>/``): ``reducer.port`` (``ADDR:PORT``, removed when it exits),
``reducer.pid`` and ``reducer.log``, and ``stragglers/`` (its sessions' lateness records, where the reducer
writes them: ``CLUSTERTOOL_STRAGGLERS_DIR``; `clustertool stragglers` reads them).  The job's launch script on the
leader stops them when mpirun ends (``epilogue_lines``) and names any that died before.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import RemoteError
from clustertool.core.jobpaths import JOB_ENV, JOBS_DIR
from clustertool.core.model import Node
from clustertool.jobs.scripts import check_id, job_dir_sh
from clustertool.plugin.build import REDUCER
from clustertool.remote.group import run_on_nodes

ENV_LIST = "CLUSTERTOOL_REDUCERS"
ENV_TIMEOUT = "CLUSTERTOOL_REDUCER_TIMEOUT_MS"
ENV_STRAGGLERS = "CLUSTERTOOL_STRAGGLERS_DIR"  # the reducer's lateness records (native/src/ct_reducer_proto.h)
ENV_STATS = "CLUSTERTOOL_COLLNET_STATS"  # the plugin's per-rank stats when a communicator closes (ct_coll_stats.c)
STATS_FILE = "collnet-stats.jsonl"  # where a `run --plugin` job's ranks append them, in the job's folder
START_WAIT_TENTHS = 100  # a reducer writes its port file within milliseconds; 10 s is for a loaded machine


@dataclass
class Reducer:
    """One job's reducer on one server node."""

    node: str
    address: str  # the server's private address
    endpoint: str  # ADDR:PORT the ranks connect to
    pid: int


def reducer_argv(binary: str, bind: str, port_file_sh: str, io_timeout_ms: int | None) -> str:
    """The reducer's command line (shell text: the port file is a shell word with $HOME in it)."""
    words = [shlex.quote(binary), "--bind", shlex.quote(bind), "--port", "0", "--port-file", port_file_sh]
    if io_timeout_ms is not None:
        words += ["--io-timeout-ms", str(int(io_timeout_ms))]
    return " ".join(words)


def start_script(job_id: str, binary: str, bind: str, io_timeout_ms: int | None = None) -> str:
    """Server: start the job's reducer detached; print ``reducer ADDR:PORT PID`` once it listens.

    Exits 1 (its log's last lines on stderr) when the reducer is missing, or ends or stays
    silent instead of listening."""
    d = job_dir_sh(job_id)
    cmd = reducer_argv(binary, bind, '"$d/reducer.port"', io_timeout_ms)
    return "\n".join([
        f"d={d}",
        'mkdir -p "$d"; rm -f "$d/reducer.port"',
        f"[ -x {shlex.quote(binary)} ] || {{ echo {shlex.quote(f'{binary} is missing: clustertool plugin deploy')} >&2;"
        " exit 1; }",
        f'{ENV_STRAGGLERS}="$d/stragglers" {JOB_ENV}={check_id(job_id)} setsid nohup {cmd} </dev/null '
        '>"$d/reducer.log" 2>&1 &',
        'p=$!; echo "$p" > "$d/reducer.pid"',
        "i=0",
        f'while [ ! -s "$d/reducer.port" ] && [ $i -lt {START_WAIT_TENTHS} ]; do',
        '  kill -0 "$p" 2>/dev/null || break; sleep 0.1; i=$((i+1))',
        "done",
        'if [ -s "$d/reducer.port" ] && kill -0 "$p" 2>/dev/null; then echo "reducer $(cat "$d/reducer.port") $p"; '
        "exit 0; fi",
        'kill -9 "$p" 2>/dev/null; tail -n 3 "$d/reducer.log" >&2; echo "the reducer did not start listening" >&2',
        "exit 1",
        "",
    ])


def stop_script(job_id: str) -> str:
    """Server: stop the job's reducer (TERM, then KILL after 3 s); prints ``stopped PID`` or ``gone PID``."""
    d = job_dir_sh(job_id)
    return "\n".join([
        f"d={d}",
        'p=$(cat "$d/reducer.pid" 2>/dev/null) || exit 0',
        f'if ! grep -q -a -z -x "{JOB_ENV}={check_id(job_id)}" "/proc/$p/environ" 2>/dev/null; then '
        'echo "gone $p"; exit 0; fi',
        'kill -TERM "$p"; i=0',
        'while kill -0 "$p" 2>/dev/null && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done',
        'kill -KILL "$p" 2>/dev/null; echo "stopped $p"',
        "",
    ])


def parse_started(node: Node, stdout: str) -> Reducer | None:
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "reducer" and ":" in parts[1] and parts[2].isdigit():
            return Reducer(node.name, node.address, parts[1], int(parts[2]))
    return None


def start(session: ClusterSession, job_id: str, dest: str, *, io_timeout_ms: int | None = None) -> list[Reducer]:
    """One reducer per server node, all or none: a server that fails stops the others and raises."""
    cluster = session.record
    servers = cluster.schedulable_servers  # a cordoned server gets no reducer
    binary = f"{dest.rstrip('/')}/{REDUCER}"
    session.report(f"starting {len(servers)} reducer(s) for job {job_id} on {', '.join(n.name for n in servers)}")
    by_node = {n.name: n for n in servers}
    group = run_on_nodes(session, servers, "sh -s", timeout=30,
                         stdin_data=lambda n: start_script(job_id, binary, n.address, io_timeout_ms).encode())
    started, bad = [], []
    for r in group.results:
        reducer = parse_started(by_node[r.node], r.stdout) if r.ok else None
        if reducer is None:
            bad.append(f"{r.node}: {r.reason or 'no port reported'}")
        else:
            started.append(reducer)
    if bad:
        stop(session, job_id, [r.node for r in started])
        raise RemoteError(f"reduction server(s) did not start for job {job_id}: {'; '.join(bad)}",
                          hint="`clustertool doctor` checks the servers; `clustertool plugin deploy` ships the "
                               "reducer")
    order = {n.name: i for i, n in enumerate(servers)}
    return sorted(started, key=lambda r: order[r.node])


def stop(session: ClusterSession, job_id: str, names: list[str]) -> None:
    cluster = session.record
    nodes = [n for n in cluster.servers if n.name in set(names)]
    if nodes:
        run_on_nodes(session, nodes, "sh -s", timeout=30, stdin_data=stop_script(job_id).encode())


def env(reducers: list[Reducer], io_timeout_ms: int | None = None) -> dict[str, str]:
    """What the ranks need: the endpoints in server order (rank 0's value is the one used)."""
    out = {ENV_LIST: ",".join(r.endpoint for r in reducers)}
    if io_timeout_ms is not None:
        out[ENV_TIMEOUT] = str(int(io_timeout_ms))
    return out


def stats_env(home: str, job_id: str, user_env: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """The plugin's CollNet stats of every rank into the job's folder on its node (what `stragglers` reads without
    servers), unless the user set the variable (``-x``)."""
    if any(item.split("=", 1)[0] == ENV_STATS for item in user_env):
        return {}
    return {ENV_STATS: f"{home}/{JOBS_DIR}/{check_id(job_id)}/{STATS_FILE}"}


def epilogue_lines(job_id: str, reducers: list[Reducer]) -> list[str]:
    """Leader, after mpirun: per reducer, note in the log when it died during the job, then stop it.

    The leader reaches the servers with the cluster's own ssh (key and pinned host keys wired
    by `up`).  A dead server is written to ``$d/servers_lost`` too, which `jobs` shows."""
    lines = []
    check = f"grep -q -a -z -x {JOB_ENV}={check_id(job_id)} /proc/$(cat {job_dir_sh(job_id)}/reducer.pid)/environ"
    for r in reducers:
        ssh = f"ssh -o BatchMode=yes -o ConnectTimeout=10 {shlex.quote(r.address)}"
        alive = f"{ssh} {shlex.quote(check)} </dev/null >/dev/null 2>&1"
        note = (f"clustertool: reduction server {r.node} ({r.endpoint}) was not running when the job ended: "
                "it died or was unreachable during the job")
        lines += [
            f"if ! {alive}; then echo {shlex.quote(note)} >> \"$d/log\"; echo {shlex.quote(r.node)} >> "
            '"$d/servers_lost"; fi',
            f"{ssh} sh -s >/dev/null 2>&1 <<'CT_STOP_EOF'",
            stop_script(job_id).rstrip("\n"),
            "CT_STOP_EOF",
        ]
    return lines

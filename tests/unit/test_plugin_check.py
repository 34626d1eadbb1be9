"""`plugin check`: the GPU path's mpirun line and rank wrapper, the report built from NCCL's log, the
stand-in, and the decisions in between (no GPU, mixed nodes, files that differ from the deploy).

NCCL cannot run here (no GPU): its side is recorded log text, in the formats real releases print
(the lines of tests/unit/test_nccl_log.py, each built from NCCL's format string at its tag). The
rank wrapper and the python probe are real shell run here; the nodes' answers come from a
scripted transport; the real stand-in run is tests/local/test_plugin_local.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.core import state
from clustertool.core.errors import ToolError
from clustertool.core.model import SERVER, Node
from clustertool.doctor import plugin_check, plugin_check_report
from clustertool.jobs import launch
from clustertool.plugin.build import ARTEFACTS, save_record
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Reply, ScriptedTransport
from tests.unit.test_nccl_log import LOG_2_19, LOG_2_26, LOG_2_30_MISMATCH, info, warn

pytestmark = pytest.mark.unit

DEST = "/opt/clustertool/lib"
SUMS = {name: f"{i}" * 64 for i, name in enumerate(ARTEFACTS, 1)}
MB = 1 << 20


def deployed(name: str) -> None:
    save_record(name, {"deployed": {"dest": DEST, "sha256": SUMS[ARTEFACTS[0]], "version": "0.1.0",
                                    "files": dict(SUMS), "ld_library_path": "/usr/local/cuda/lib64"}})


def sums_text(files: dict[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in files.items())


def facts(gpus: str) -> Reply:
    return Reply(f"nproc=96\ngpus={gpus}\nmpi=mpirun (Open MPI) 4.1.5\nplugin=absent\niperf3=yes\n")


@pytest.fixture
def gpu_cluster(ct_env):
    c = saved_cluster("gc", 2)
    for n in c.nodes:
        n.slots = 8
    state.save(c)
    deployed("gc")
    return c


@pytest.fixture
def fake(tmp_path):
    """Nodes answer the plugin's sums (``fake.sums[node]`` overrides the deployed ones) and the python probe."""
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.sums = {}
    fake.on(lambda c: "sha256sum" in c.command and DEST in c.command,
            lambda call: Reply(sums_text(fake.sums.get(call.node, SUMS))))
    fake.on("nccl_gpu_worker.py", Reply("python=/opt/pytorch/bin/python3\n"))
    return fake


def tagged(rank: int, text: str) -> str:
    return "\n".join(f"[1,{rank}]<stdout>:{line}" for line in text.splitlines())


def result_line(rank: int, world: int, rows: list[tuple[int, float, int]], nccl: str = "2.26.6") -> str:
    doc = {"rank": rank, "nccl": nccl, "results": [
        {"size": s, "time_us": t, "algbw": s / t / 1e3, "busbw": s / t / 1e3 * 2 * (world - 1) / world, "wrong": w,
         "rank": rank, "world": world} for s, t, w in rows]}
    return plugin_check_report.RESULT_MARK + json.dumps(doc)


def job_output(logs: list[str], rows: list[list[tuple[int, float, int]]]) -> str:
    world = len(logs)
    return "\n".join(tagged(r, log + "\n" + result_line(r, world, rows[r])) for r, log in enumerate(logs))


# ---- the GPU run: argv, environment, rank wrapper ---------------------------------------------

def test_gpu_run_is_one_rank_per_slot_with_the_plugin_env_and_nccls_info_log(gpu_cluster, fake, monkeypatch):
    """The real path down to mpirun's argv: check -> jobs_launcher -> `run --plugin` (dry run)."""
    real_run, seen = launch.run, {}

    def dry(session, request, **kw):
        seen["launch"] = real_run(session, request, dry_run=True, **kw)
        raise ToolError("dry run: nothing started")

    monkeypatch.setattr(launch, "run", dry)
    report = plugin_check.check(ClusterSession(gpu_cluster, fake), sizes="1M:4M", gpus={"node-1": 8, "node-2": 8})
    argv = seen["launch"].argv
    assert argv[argv.index("-np") + 1] == "16" and seen["launch"].job.name == "plugin-check"
    xs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "NCCL_DEBUG=INFO" in xs and "NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,TUNING,COLL,ENV" in xs
    assert {"NCCL_NET_PLUGIN=clustertool", "NCCL_COLLNET_ENABLE=1",
            f"LD_LIBRARY_PATH={DEST}:/usr/local/cuda/lib64"} <= set(xs)
    assert "MASTER_ADDR=10.0.0.1" in xs and any(x.startswith("MASTER_PORT=") for x in xs)
    tail = argv[argv.index("ct-nccl-check") - 3:]
    assert tail == ["sh", "-c", plugin_check.RANK_SCRIPT, "ct-nccl-check", "/opt/pytorch/bin/python3",
                    "--sizes", f"{MB},{2 * MB},{4 * MB}", "--iters", "5", "--warmup", "2"]
    # the worker went to every node with the probe, and the failed start is the report's error
    probes = [c for c in fake.calls if "nccl_gpu_worker.py" in c.command]
    assert {c.node for c in probes} == {"node-1", "node-2"}
    assert all("torch.distributed" in c.stdin for c in probes)
    assert report.exit_code == 1 and "dry run: nothing started" in report.problems[0].message


def _fake_worker(home, body: str) -> None:
    d = home / ".clustertool" / "plugin-check"
    d.mkdir(parents=True)
    (d / "nccl_gpu_worker.py").write_text(body)


def _run_wrapper(home, rank: int, world: int, local: int):
    env = dict(os.environ, HOME=str(home), OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
               OMPI_COMM_WORLD_LOCAL_RANK=str(local))
    argv = plugin_check.worker_argv(sys.executable, [MB, 2 * MB], iters=3, warmup=1)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_rank_wrapper_gives_torch_open_mpis_rank_and_prints_the_result_on_one_line(tmp_path):
    _fake_worker(tmp_path, (
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'env': [os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')], 'argv': sys.argv[1:],\n"
        "           'results': []}, open(out, 'w'))\n"
        "print('NCCL INFO stand-in line')\n"))
    proc = _run_wrapper(tmp_path, rank=5, world=16, local=1)
    assert proc.returncode == 0, proc.stderr
    doc = plugin_check_report.result_doc(proc.stdout)
    assert doc["env"] == ["5", "16", "1"]
    assert doc["argv"][:6] == ["--sizes", f"{MB},{2 * MB}", "--iters", "3", "--warmup", "1"]
    assert doc["argv"][-2] == "--out" and doc["argv"][-1].endswith("/.clustertool/plugin-check/result.5.json")


def test_rank_wrapper_passes_the_workers_failure_and_prints_no_stale_result(tmp_path):
    _fake_worker(tmp_path, "import sys\nsys.exit(3)\n")
    (tmp_path / ".clustertool" / "plugin-check" / "result.0.json").write_text('{"old": true}')
    proc = _run_wrapper(tmp_path, rank=0, world=2, local=0)
    assert proc.returncode == 3 and plugin_check_report.RESULT_MARK not in proc.stdout


def test_python_probe_saves_the_worker_and_finds_the_first_python_with_torch(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    with_torch = tmp_path / "py-with-torch"
    with_torch.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    without = tmp_path / "py-plain"
    without.write_text(f"#!/bin/sh\nPYTHONPATH= exec {sys.executable} -S \"$@\"\n")
    for p in (with_torch, without):
        p.chmod(0o755)
    line = plugin_check.python_probe([str(tmp_path / "missing"), str(without), str(with_torch)])
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.run(["sh", "-c", line], input="WORKER SOURCE", env=env, capture_output=True, text=True)
    assert plugin_check.parse_python(proc.stdout) == str(with_torch)
    assert (tmp_path / ".clustertool" / "plugin-check" / "nccl_gpu_worker.py").read_text() == "WORKER SOURCE"
    proc = subprocess.run(["sh", "-c", plugin_check.python_probe([str(without)])], input="", env=env,
                          capture_output=True, text=True)
    assert plugin_check.parse_python(proc.stdout) is None


# ---- the report from NCCL's log (recorded: NCCL cannot run here) ------------------------------

def report_of(output: str, ranks: int, code: int | None = 0,
              error: str | None = None) -> plugin_check_report.CheckReport:
    return plugin_check_report.nccl_report("gc", ["node-1", "node-2"], ranks, output, code, error, {"dest": DEST},
                                           "note")


def test_plugin_loaded_collnet_on_and_the_algorithm_per_size_from_2_26():
    rows = [[(MB, 400.0, 0), (256 * MB, 90000.0, 0)], [(MB, 500.0, 0), (256 * MB, 80000.0, 0)]]
    r = report_of(job_output([LOG_2_26, LOG_2_26], rows), ranks=2)
    n = r.nccl
    assert (n.version, n.network, n.plugin_loaded, n.net_plugin, n.net_abi, n.collnet_abi) == \
        ("2.26.6", "clustertool", True, "clustertool", 10, 10)
    assert n.collnet_on and "via clustertool/0" in n.collnet_reason
    assert [(x.size, x.algo, x.proto) for x in r.rows] == [(MB, "COLLNET_CHAIN", "SIMPLE"),
                                                           (256 * MB, "COLLNET_CHAIN", "SIMPLE")]
    assert r.rows[0].time_us == 500.0 and r.rows[1].time_us == 90000.0   # the slowest rank
    assert r.rows[0].busbw == pytest.approx(MB / 500.0 / 1e3 * 2 * 1 / 2)
    assert r.wrong == 0 and r.problems == [] and r.exit_code == 0
    assert "NET/Plugin: Loaded net plugin clustertool (v10)" in r.evidence


def test_2_19_prints_no_algorithm_lines_so_the_sizes_say_dash_and_abi_is_inferred():
    r = report_of(job_output([LOG_2_19, LOG_2_19], [[(MB, 300.0, 0)]] * 2), ranks=2)
    assert r.nccl.net_abi == 7 and r.nccl.tuner_plugin == "clustertool"
    assert [(x.algo, x.proto) for x in r.rows] == [("-", "-")] and r.exit_code == 0


@pytest.mark.parametrize("line,fix_words", [
    ("NET/Plugin: Could not find: libnccl-net-clustertool.so libnccl-net-clustertool.so",
     ("NCCL_NET_PLUGIN=clustertool", f"LD_LIBRARY_PATH starting with {DEST}")),
    ("External network plugin libnccl-net-clustertool.so is unsupported",
     ("newest v10", "v5-v12", "plugin deploy")),
])
def test_nccl_on_its_own_net_is_an_error_whose_fix_follows_nccls_reason(line, fix_words):
    log = "\n".join([info("NCCL version 2.27.7+cuda12.9"), info(line), info("Using network Socket")])
    r = report_of(job_output([log, log], [[(MB, 300.0, 0)]] * 2), ranks=2)
    assert not r.nccl.plugin_loaded and r.exit_code == 1
    p = r.problems[0]
    assert p.severity == "error" and "did not load the clustertool plugin on rank 0" in p.message
    assert all(w in p.fix for w in fix_words), p.fix


def test_collnet_off_is_a_warning_with_nccls_reason_and_its_fix():
    below = "\n".join([info("NCCL version 2.27.7+cuda12.9"), info("NET/Plugin: Loaded net plugin clustertool (v10)"),
                       info("Using network clustertool"),
                       info("Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet")])
    r = report_of(job_output([below], [[(MB, 300.0, 0)]]), ranks=1)
    assert not r.nccl.collnet_on and r.exit_code == 0
    assert [(p.severity, "NCCL_COLLNET_NODE_THRESHOLD=2" in p.fix) for p in r.problems] == [("warning", True)]
    mixed = report_of(job_output([LOG_2_30_MISMATCH], [[(MB, 300.0, 0)]]), ranks=1)
    assert "different CollNet device counts" in mixed.problems[0].message
    assert "NCCL_IGNORE_COLLNET_MISMATCH=1" in mixed.problems[0].fix


def test_wrong_elements_and_a_rank_without_result_fail_the_check():
    r = report_of(job_output([LOG_2_26, LOG_2_26], [[(MB, 300.0, 0)], [(MB, 300.0, 7)]]), ranks=2)
    assert r.wrong == 7 and r.exit_code == 1 and "7 element(s) differ" in r.problems[-1].message
    half = tagged(0, LOG_2_26 + "\n" + result_line(0, 2, [(MB, 300.0, 0)])) + "\n" + tagged(1, LOG_2_26)
    r = report_of(half, ranks=2, code=1)
    assert r.exit_code == 1 and "mpirun exit 1" in r.problems[0].message


def test_warn_lines_of_a_failed_run_are_in_the_error():
    log = "\n".join([info("NCCL version 2.30.7+cuda13.0"), info("NET/Plugin: Loaded net plugin clustertool (v12)"),
                     info("Using network clustertool"),
                     "gpu-a:1:1 [0] transport.cc:464 NCCL WARN Cannot initialize CollNet, using point-to-point "
                     "network instead"])
    r = report_of(tagged(0, log), ranks=1, code=1)
    assert "NCCL WARN: Cannot initialize CollNet" in r.problems[0].message


STANDIN_OUT = "\n".join(tagged(0, line) for line in [
    "# collnet_bench: 4 ranks, plugin /root/.clustertool/lib/libnccl-net-clustertool.so",
    "# device clustertool-tcp speed 10000 Mbps",
    "       65536         16384     float     sum   sharded      1000.0    0.0655    0.0983       0",
    "       65536         16384     float     sum       mpi      3000.0    0.0218    0.0328       0",
])


def test_standin_report_reads_collnet_bench_rows_and_its_header():
    r = plugin_check_report.standin_report("lc", ["node-1"], STANDIN_OUT, 0, None, {"dest": DEST}, "no GPU")
    assert r.mode == "standin" and r.ranks == 4 and r.nccl is None and r.exit_code == 0
    assert [(x.algo, x.size, x.wrong) for x in r.rows] == [("sharded", 65536, 0), ("mpi", 65536, 0)]
    assert r.evidence[1] == "# device clustertool-tcp speed 10000 Mbps"
    bad = plugin_check_report.standin_report("lc", ["node-1"],
                                             STANDIN_OUT.replace("0.0983       0", "0.0983       3"), 0,
                                             None, {}, "no GPU")
    assert bad.wrong == 3 and bad.exit_code == 1


# ---- decisions on the cluster -------------------------------------------------------------------

def launch_recorder(output: str = "", code: int | None = 0):
    calls = []

    def launcher(env, argv, plugin, per_node):
        calls.append((env, argv, plugin, per_node))
        return code, output, None
    return launcher, calls


def test_no_gpu_anywhere_runs_the_standin_one_rank_per_node(ct_env, fake):
    c = saved_cluster("cpu", 4)
    deployed("cpu")
    fake.on("nproc=", facts("none"))
    launcher, calls = launch_recorder(STANDIN_OUT)
    r = plugin_check.check(ClusterSession(c, fake), sizes="64K:256K", launch=launcher)
    assert r.note == "no GPU on node-[1-4]: running the collnet_bench stand-in (not NCCL)"
    env, argv, plugin, per_node = calls[0]
    assert argv[:5] == [f"{DEST}/collnet_bench", "-b", "65536", "-e", "262144"]
    assert argv[argv.index("-a") + 1] == "sharded,ring,mpi" and per_node == 1 and not plugin
    assert r.exit_code == 0 and not any("nccl_gpu_worker" in x.command for x in fake.calls)


def test_gpu_cluster_runs_nccl_with_the_plugin_and_reports_it(gpu_cluster, fake):
    fake.on("nproc=", facts("8"))
    out = job_output([LOG_2_26] * 16, [[(MB, 300.0, 0)]] * 16)
    launcher, calls = launch_recorder(out)
    r = plugin_check.check(ClusterSession(gpu_cluster, fake), sizes="1M:1M", launch=launcher)
    env, argv, plugin, per_node = calls[0]
    assert plugin and per_node is None and "NCCL_DEBUG=INFO" in env
    assert r.mode == "nccl" and r.ranks == 16 and r.nccl.plugin_loaded and r.exit_code == 0
    assert r.note.startswith("NCCL allreduce on 16 GPU rank(s) over 2 node(s)")


@pytest.mark.parametrize("gpus,words", [
    ({"node-1": 8, "node-2": 0}, "no GPU on node-2 while the other nodes have GPUs"),
    ({"node-1": 8, "node-2": 4}, "more slots than GPUs on node-2 (8 slots, 4 GPUs)"),
])
def test_nodes_that_cannot_give_every_rank_a_gpu_stop_before_the_run(gpu_cluster, fake, gpus, words):
    launcher, calls = launch_recorder()
    with pytest.raises(ToolError, match=re.escape(words)):
        plugin_check.check(ClusterSession(gpu_cluster, fake), gpus=gpus, launch=launcher)
    assert calls == []


def test_not_deployed_is_one_error_before_any_node_is_asked(ct_env, fake):
    c = saved_cluster("nd", 2)
    with pytest.raises(ToolError, match="not deployed") as exc:
        plugin_check.check(ClusterSession(c, fake), launch=launch_recorder()[0])
    assert "plugin deploy" in exc.value.hint and fake.calls == []


def test_a_node_whose_files_differ_from_the_deploy_stops_the_check(gpu_cluster, fake):
    fake.sums["node-2"] = {k: ("f" * 64 if k == ARTEFACTS[0] else v) for k, v in SUMS.items() if k != ARTEFACTS[2]}
    launcher, calls = launch_recorder()
    with pytest.raises(ToolError) as exc:
        plugin_check.check(ClusterSession(gpu_cluster, fake), gpus={"node-1": 8, "node-2": 8}, launch=launcher)
    assert exc.value.message == ("the plugin on the nodes is not the one deployed: node-2: "
                                 "libnccl-net-clustertool.so differs, collnet_bench missing")
    assert calls == []


# ---- reduction servers: not ranks; their reducers start with the check's job ---------------------

@pytest.fixture
def served(ct_env):
    """2 workers (8 slots each) and 2 reduction servers, the plugin deployed."""
    c = saved_cluster("rs", 2)
    for n in c.nodes:
        n.slots = 8
    c.nodes += [Node(f"server-{i}", 2 + i, f"10.0.0.{10 + i}", SERVER, 0) for i in (1, 2)]
    state.save(c)
    deployed("rs")
    return c


def first_op(algo: str) -> str:
    return info(f"clustertool: CollNet rank 0/16: first iallreduce (1048576 bytes) running, algorithm {algo}")


def test_with_servers_the_standin_runs_servers_too_on_the_workers_only(served, fake):
    """Real path down to mpirun (dry run): ranks are the workers, the job is `run --plugin` (which
    names the servers' reducers to every rank) and collnet_bench runs servers beside the rest."""
    fake.on("nproc=", facts("none"))
    real_run, seen = launch.run, {}

    def dry(session, request, **kw):
        seen["launch"], seen["request"] = real_run(session, request, dry_run=True, **kw), request
        raise ToolError("dry run: nothing started")

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(launch, "run", dry)
    try:
        r = plugin_check.check(ClusterSession(served, fake), sizes="64K:64K")
    finally:
        monkeypatch.undo()
    argv = seen["launch"].argv
    assert seen["request"].nodes == "node-1,node-2" and seen["request"].plugin
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-a") + 1] == "servers,sharded,ring,mpi"
    xs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "CLUSTERTOOL_REDUCERS=10.0.0.11:PORT,10.0.0.12:PORT" in xs, xs
    assert r.servers == 2 and r.note.endswith("(not NCCL) and 2 reduction server(s)")
    # the GPU probe asked the workers only: servers have no GPU and need none
    assert {c.node for c in fake.calls if "nproc=" in (c.stdin or "")} == {"node-1", "node-2"}


def test_a_standin_whose_servers_did_not_answer_says_so_with_the_fix(served, fake):
    fake.on("nproc=", facts("none"))
    out = "\n".join([tagged(0, "# collnet_bench: 2 ranks, plugin /x/libnccl-net-clustertool.so"),
                     "[1,0]<stderr>:collnet_bench: asked for servers, the plugin runs sharded (see the WARN above)"])
    launcher, calls = launch_recorder(out, code=1)
    r = plugin_check.check(ClusterSession(served, fake), sizes="64K:64K", launch=launcher)
    assert calls[0][2] is True  # plugin: the reducers start with the job
    assert r.exit_code == 1 and r.problems[0].message.startswith(
        "the reduction servers did not answer: the plugin ran sharded instead of servers (mpirun exit 1)")
    assert "clustertool doctor" in r.problems[0].fix


def test_gpu_workers_with_cpu_servers_run_nccl_and_name_the_plugins_algorithm(served, fake):
    fake.on("nproc=", facts("8"))  # asked of workers only: a server without GPU stops nothing
    out = job_output([LOG_2_26 + "\n" + first_op("servers")] * 16, [[(MB, 300.0, 0)]] * 16)
    launcher, calls = launch_recorder(out)
    r = plugin_check.check(ClusterSession(served, fake), sizes="1M:1M", launch=launcher)
    assert calls[0][2] is True and r.ranks == 16 and r.servers == 2
    assert r.note.startswith("NCCL allreduce on 16 GPU rank(s) over 2 node(s) and 2 reduction server(s)")
    assert r.nccl.plugin_algorithm == "servers" and r.problems == [] and r.exit_code == 0
    assert {c.node for c in fake.calls if "nccl_gpu_worker.py" in c.command} == {"node-1", "node-2"}


def test_gpu_ranks_that_fell_back_from_servers_are_a_warning_with_the_plugins_reason(served, fake):
    why = ("clustertool: rank 1/16: reduction server 10.0.0.12:4001 (server 2 of 2) unreachable from rank 1 "
           "(Connection refused); CollNet uses sharded instead of servers on every rank")
    log = LOG_2_26 + "\n" + warn(why, "ct_coll_settings.c:149") + "\n" + first_op("sharded")
    r = plugin_check_report.nccl_report("rs", ["node-1", "node-2"], 2, job_output([log] * 2, [[(MB, 300.0, 0)]] * 2),
                                        0, None, {"dest": DEST}, "note", servers=2)
    assert r.nccl.plugin_algorithm == "sharded" and r.exit_code == 0   # right sums, slower: a warning
    assert [(p.severity, p.message) for p in r.problems] == [
        ("warning", f"the cluster has 2 reduction server(s) but the plugin's CollNet ran sharded (rank 0): {why}")]
    plain = plugin_check_report.nccl_report("gc", ["node-1"], 2, job_output([log] * 2, [[(MB, 300.0, 0)]] * 2), 0, None,
                                            {"dest": DEST}, "note")
    assert plain.problems == []   # no servers in the cluster: sharded is the plugin's default

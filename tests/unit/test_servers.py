"""Reduction servers as nodes (role server) and the per-job reducer scripts: pure parts."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from clustertool.core import hostfile, nodeset
from clustertool.core.errors import UsageError
from clustertool.core.model import LEADER, MEMBER, SERVER, ClusterRecord, Node
from clustertool.jobs import launch, records, reducers, scripts

pytestmark = pytest.mark.unit


def _cluster() -> ClusterRecord:
    nodes = [Node("server-1", 3, "10.0.0.3", SERVER, 0), Node("node-2", 2, "10.0.0.2", MEMBER, 2),
             Node("node-1", 1, "10.0.0.1", LEADER, 2), Node("server-2", 4, "10.0.0.4", SERVER, 0)]
    return ClusterRecord("c", "local", nodes=nodes)


def test_servers_come_last_and_are_neither_members_nor_slots():
    c = _cluster()
    assert [n.name for n in c.ordered_nodes()] == ["node-1", "node-2", "server-1", "server-2"]
    assert [n.name for n in c.workers] == ["node-1", "node-2"]
    assert [n.name for n in c.members] == ["node-2"]
    assert [n.name for n in c.servers] == ["server-1", "server-2"]
    assert c.total_slots == 4


def test_hostfile_leaves_servers_out():
    assert hostfile.render_cluster(_cluster()) == "10.0.0.1 slots=2\n10.0.0.2 slots=2\n"


def test_selection_keywords_servers_and_workers():
    c = _cluster()
    assert [n.name for n in nodeset.select(c, "servers")] == ["server-1", "server-2"]
    assert [n.name for n in nodeset.select(c, "workers")] == ["node-1", "node-2"]
    assert [n.name for n in nodeset.select(c, None)][-1] == "server-2"  # exec/doctor default: every node


def test_jobs_run_on_workers_and_refuse_servers_as_ranks():
    c = _cluster()
    assert [n.name for n in launch.rank_nodes(c, None)] == ["node-1", "node-2"]
    with pytest.raises(UsageError, match="server-1 is a reduction server"):
        launch.rank_nodes(c, "node-1,server-1")


def test_start_script_uses_port_zero_a_port_file_and_the_job_marker():
    text = reducers.start_script("j1-abc", "/opt/x y/clustertool-reducer", "10.0.0.3", io_timeout_ms=2000)
    assert "CLUSTERTOOL_JOB=j1-abc setsid nohup '/opt/x y/clustertool-reducer' --bind 10.0.0.3 --port 0 " \
           '--port-file "$d/reducer.port" --io-timeout-ms 2000' in text
    assert 'd="$HOME/.clustertool/jobs/j1-abc"' in text
    assert 'CLUSTERTOOL_STRAGGLERS_DIR="$d/stragglers" CLUSTERTOOL_JOB=j1-abc' in text   # its lateness records


def test_a_plugin_jobs_ranks_append_their_collnet_stats_to_the_jobs_folder_unless_told_otherwise():
    assert reducers.stats_env("/root", "j1-abc") == {
        "CLUSTERTOOL_COLLNET_STATS": "/root/.clustertool/jobs/j1-abc/collnet-stats.jsonl"}
    assert reducers.stats_env("/root", "j1-abc", ("A=1", "CLUSTERTOOL_COLLNET_STATS=1")) == {}


def test_start_script_refuses_a_bad_job_id():
    with pytest.raises(UsageError):
        reducers.start_script("j1; rm -rf /", "/bin/r", "10.0.0.3")


def test_parse_started_reads_the_endpoint_and_pid():
    node = Node("server-2", 4, "10.0.0.4", SERVER)
    got = reducers.parse_started(node, "noise\nreducer 10.0.0.4:41925 67\n")
    assert (got.node, got.endpoint, got.pid) == ("server-2", "10.0.0.4:41925", 67)
    assert reducers.parse_started(node, "reducer nothing\n") is None


def test_env_lists_endpoints_in_server_order():
    rs = [reducers.Reducer("server-1", "a", "10.0.0.3:1", 1), reducers.Reducer("server-2", "b", "10.0.0.4:2", 2)]
    assert reducers.env(rs) == {"CLUSTERTOOL_REDUCERS": "10.0.0.3:1,10.0.0.4:2"}
    assert reducers.env(rs, 500)["CLUSTERTOOL_REDUCER_TIMEOUT_MS"] == "500"


def test_launch_script_stops_reducers_after_mpirun_and_before_the_exit_file():
    rs = [reducers.Reducer("server-1", "10.0.0.3", "10.0.0.3:1", 1)]
    text = scripts.launch_script("j1-abc", ["mpirun", "true"], None, epilogue=reducers.epilogue_lines("j1-abc", rs))
    assert text.index("mpirun") < text.index("ssh -o BatchMode=yes") < text.index('mv "$d/exit.tmp"')
    assert "reduction server server-1 (10.0.0.3:1) was not running when the job ended" in text
    assert "servers_lost" in text and "kill -TERM" in text


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="needs shellcheck")
def test_reducer_scripts_pass_shellcheck(tmp_path):
    rs = [reducers.Reducer("server-1", "10.0.0.3", "10.0.0.3:1", 1)]
    for i, text in enumerate([reducers.start_script("j1-abc", "/r", "10.0.0.3", 100), reducers.stop_script("j1-abc"),
                              scripts.launch_script("j1-abc", ["mpirun", "true"], None,
                                                    epilogue=reducers.epilogue_lines("j1-abc", rs))]):
        path = tmp_path / f"s{i}.sh"
        path.write_text(text if text.startswith("#!") else "#!/bin/sh\n" + text)
        res = subprocess.run(["shellcheck", "-s", "sh", "-e", "SC2016", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_status_lines_name_the_lost_servers():
    out = "J j1 1 0 0 1 100 e30=\nS j1 server-2,server-3\n"
    assert records.parse_lost(out) == {"j1": ["server-2", "server-3"]}
    assert "j1" in records.parse_status(out)


def test_bench_servers_needs_servers_and_ratios_use_the_link_rate():
    from clustertool.bench import allreduce

    with pytest.raises(UsageError, match="cluster 'c' has no reduction servers"):
        allreduce.check_servers(["servers", "ring"], "c", 0)
    allreduce.check_servers(["ring"], "c", 0)
    assert allreduce.parse_algos("servers,ring") == ["servers", "ring"]
    out = "[1,0]<stdout>:    67108864  16777216   float    sum   servers  3540638.8  0.0190  0.0284  0\n"
    rows = allreduce.parse_rows(out)
    assert rows[0].algo == "servers" and rows[0].busbw == 0.0284
    assert allreduce.link_ratios(rows, 200_000_000) == "busbw/B at 64M (B = link rate, 200 Mbit/s): servers 1.14"
    # the rate comes from the cluster's provider: the local one shapes links to --link-rate; others say none
    from clustertool.bench.benchjobs import link_line

    shaped = ClusterRecord(name="c", provider="local", user="root", options={"link_rate": "200mbit"})
    assert link_line(shaped, rows) == allreduce.link_ratios(rows, 200_000_000)
    assert link_line(ClusterRecord(name="c", provider="local", user="root"), rows) is None
    assert link_line(ClusterRecord(name="c", provider="static", user="u", options={"link_rate": "200mbit"}),
                     rows) is None

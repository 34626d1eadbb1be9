"""doctor's orchestration over a scripted transport: which node gets asked what, the findings that
come of the answers, and `--fix` killing a stray then checking again.

The nodes' answers (facts, the leader's job list) are scripted; the real checks run against
sshd in network namespaces in tests/local/test_doctor.py.
"""

from __future__ import annotations

import pytest

from clustertool.cluster.session import ClusterSession
from clustertool.doctor import checkup
from clustertool.doctor.doctorrequests import DoctorRequest
from tests.fakes.cluster import saved_cluster
from tests.fakes.transport import Call, Reply, ScriptedTransport

pytestmark = pytest.mark.unit

CHECKS = ("reach", "disk", "sameness", "strays")


def facts(gpus: int = 1, procs: str = "", avail_kb: int = 80_000_000) -> Reply:
    return Reply(f"nproc=8\ngpus={gpus}\ndriver=550.54\ncuda=12.4\nmpi=mpirun (Open MPI) 4.1.4\n"
                 f"nccl=libnccl.so.2.21.5\nplugin=absent\niperf3=yes\n"
                 f"df \"$HOME\" 100000000 {avail_kb} /\n{procs}")


def asks_facts(call: Call) -> bool:
    return "nproc=" in (call.stdin or "")


def asks_jobs(call: Call) -> bool:
    return 'echo "J $j' in (call.stdin or "")


@pytest.fixture
def fake(tmp_path, ct_env):
    saved_cluster("dr", 4)
    fake = ScriptedTransport(tmp_path / "nodes")
    fake.on(lambda c: c.command == "true", Reply.unreachable("10.0.0.4"), node="node-4")
    fake.on(lambda c: c.command == "true", Reply())
    fake.on(asks_jobs, Reply(""))  # the leader knows no running job
    return fake


def test_findings_name_the_unreachable_node_the_odd_one_out_and_the_stray(fake):
    fake.on(asks_facts, facts(gpus=7), node="node-2")
    fake.on(asks_facts, facts(procs="proc 4242 python3 - python3 train.py --lr 0.1\n", avail_kb=2_000_000),
            node="node-3")
    fake.on(asks_facts, facts())
    result = checkup.run(ClusterSession.load("dr", transport=fake), DoctorRequest(checks=CHECKS))

    found = {(f.check, f.node, f.severity) for f in result.findings}
    assert ("reach", "node-4", "error") in found
    assert ("sameness", "node-2", "error") in found  # GPU count differs from the other nodes
    assert ("strays", "node-3", "warning") in found
    assert ("disk", "node-3", "error") in found  # 2 GB free of 100 GB
    reach = next(f for f in result.findings if f.check == "reach")
    assert reach.message == "not reachable over SSH: unreachable: connection refused"
    stray = next(f for f in result.findings if f.check == "strays")
    assert stray.fixable and stray.data["comms"] == {"4242": "python3"}
    assert [c.command for c in fake.to("node-4")] == ["true"]  # nothing more asked of an unreachable node
    assert result.exit_code == 1 and not result.clean


def test_fix_kills_the_stray_by_pid_and_command_then_checks_again(fake):
    fake.on(asks_facts, facts(procs="proc 4242 python3 - python3 train.py\n"), node="node-3", times=1)
    fake.on(asks_facts, facts())
    fake.on("kill -9", Reply())
    result = checkup.run(ClusterSession.load("dr", transport=fake),
                        DoctorRequest(checks=("disk", "sameness", "strays"), fix=True))

    kills = [c for c in fake.calls if "kill -9" in c.command]
    assert [c.node for c in kills] == ["node-3"]
    assert "/proc/4242/comm" in kills[0].command and "= python3 ] && kill -9 4242" in kills[0].command
    assert result.fixed == ["node-3: killed 1 stray process(es)"]
    assert not [f for f in result.findings if f.check == "strays"]  # the second look finds none
    assert len([c for c in fake.to("node-3") if asks_facts(c)]) == 2

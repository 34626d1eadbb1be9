"""Slurm made by `up` or adopted, without Slurm: the spec's keys, the plan, AWS's user data (packages, never the
key), the systemd start script, the local boot hook, drains for cordons (an adopted cluster's non-operator
told so), doctor's Slurm findings against saved sinfo/scontrol text, and adoption from sinfo's nodes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from clustertool.cluster import slurmadopt, slurmdrain, slurmup
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.spec import load_spec
from clustertool.core.errors import NotSupported, SpecError, UsageError
from clustertool.core.model import ClusterRecord, ClusterState, Node
from clustertool.doctor import slurmcheck
from clustertool.providers.aws import az_launch
from clustertool.providers.base import get_provider
from clustertool.providers.local import init
from clustertool.remote.testing import Reply, ScriptedTransport
from clustertool.slurm import nodescript, slurmtext
from clustertool.slurm.layout import private_layout, system_layout
from clustertool.slurm.slurminfo import SlurmInfo

pytestmark = pytest.mark.unit
DATA = Path(__file__).parent / "data" / "slurm" / "22.05-recorded"


def record(n: int = 3, provider: str = "local", **scheduler) -> ClusterRecord:
    nodes = [Node(f"node-{i}", i, f"10.213.7.{i}", role="leader" if i == 1 else "member", slots=2)
             for i in range(1, n + 1)]
    rec = ClusterRecord("team", provider, nodes=nodes, status=ClusterState.READY)
    if scheduler:
        rec.scheduler = scheduler
    return rec


def made(rec: ClusterRecord, **kw) -> dict:
    return SlurmInfo(private_layout(), "node-1", tuple(n.name for n in rec.nodes), partition="workers",
                     release="22.05.8", gpus=2, **kw).to_dict()


def test_the_spec_takes_a_scheduler_and_whether_the_leader_computes():
    spec = load_spec(None, {"name": "t", "nodes": 3, "scheduler": "slurm", "leader_compute": False})
    assert (spec.scheduler, spec.leader_compute) == ("slurm", False)
    assert load_spec(None, {"name": "t", "nodes": 3}).scheduler == "none"
    with pytest.raises(SpecError, match="--scheduler: expected none or slurm, got 'pbs'"):
        load_spec(None, {"name": "t", "nodes": 3, "scheduler": "pbs"})
    with pytest.raises(SpecError, match="--no-leader-compute goes with --scheduler slurm"):
        load_spec(None, {"name": "t", "nodes": 3, "leader_compute": False})
    with pytest.raises(SpecError, match="give one of them"):
        load_spec(None, {"provider": "static", "slurm_login": "login1", "scheduler": "slurm"})


def test_the_python_api_takes_the_scheduler_as_up_does():
    from clustertool.api import Cluster

    spec = Cluster._spec(None, {"provider": "local", "nodes": 3, "name": "team", "scheduler": "slurm",
                                "leader_compute": False})
    assert (spec.scheduler, spec.leader_compute) == ("slurm", False)


def test_a_spec_file_says_scheduler_slurm(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text("name: team\nnodes: 4\nscheduler: slurm\nleader-compute: false\n")
    spec = load_spec(str(path))
    assert (spec.scheduler, spec.leader_compute, spec.nodes) == ("slurm", False, 4)


def test_the_plan_says_where_slurm_runs_and_the_static_provider_refuses_to_make_one():
    rec = record(scheduler=None)
    slurmup.want(load_spec(None, {"name": "t", "nodes": 3, "scheduler": "slurm"}), rec)
    lines = slurmup.plan_lines(get_provider("local"), rec)
    assert any("slurmctld on the leader, slurmd on every worker, the leader too" in ln for ln in lines)
    assert any("never this machine's /etc/munge" in ln for ln in lines)
    assert any("boot.d/50-slurm.sh" in ln for ln in lines)
    aws = slurmup.plan_lines(get_provider("aws"), rec)
    assert any("Slurm 21.08 on the default Ubuntu 22.04" in ln for ln in aws)
    with pytest.raises(NotSupported, match="cannot set up Slurm"):
        get_provider("static").slurm_placement(rec)
    rec.scheduler = {"kind": "slurm", "made": True, "leader_compute": False}
    with pytest.raises(UsageError, match="--no-leader-compute needs 2 nodes or more"):
        slurmup.check(get_provider("local"), rec, 1)


def test_a_tests_shorter_timers_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(slurmup.TIMERS_ENV, "slurmd_timeout=10,inactive_limit=30")
    timers = slurmup.timers()
    assert (timers.slurmd_timeout, timers.inactive_limit, timers.kill_wait) == (10, 30, 30)
    monkeypatch.setenv(slurmup.TIMERS_ENV, "slurmd_timeout=soon")
    with pytest.raises(UsageError, match="is not NAME=SECONDS"):
        slurmup.timers()


def test_aws_nodes_install_the_packages_at_first_boot_and_never_get_the_key_in_user_data():
    text = az_launch.user_data("", slurm=True)
    assert text.startswith("#cloud-config\n") and "ssh_authorized_keys" not in text
    assert "  - slurmd\n" in text and "  - munge\n" in text
    assert "runcmd:\n  - [systemctl, disable, --now, munge, slurmd, slurmctld]" in text
    assert "munge.key" not in text and "KEY" not in text
    rec = record(provider="aws", kind="slurm", made=True)
    assert az_launch.wants_slurm(rec)
    assert not az_launch.wants_slurm(record(provider="aws", kind="slurm", made=False))  # adopted: the site's


def test_a_machine_of_its_own_enables_the_distributions_units_and_names_its_slurmd(tmp_path):
    text = nodescript.start_script_text(system_layout(), "node-2", controller=False, compute=True, standin=False,
                                        slurm_user="slurm")
    assert "systemctl enable slurmd" in text and "systemctl restart slurmd" in text and "slurmctld" not in text
    assert "SLURMD_OPTIONS=-N node-2" in text and "chown munge:munge /etc/munge/munge.key" in text
    leader = nodescript.start_script_text(system_layout(), "node-1", controller=True, compute=False, standin=False,
                                          slurm_user="slurm")
    assert "chown -R slurm: /var/spool/slurmctld /var/log/slurm" in leader and "slurmd" not in leader.replace(
        "slurmctld", "")
    for name, script in (("compute", text), ("leader", leader)):
        path = tmp_path / f"{name}.sh"
        path.write_text(script)
        if shutil.which("shellcheck"):
            assert subprocess.run(["shellcheck", str(path)]).returncode == 0


def test_a_local_nodes_boot_runs_boot_sh_then_every_boot_d_script_in_order(tmp_path):
    folder = tmp_path / "boot.d"
    folder.mkdir()
    for name in ("50-slurm.sh", "10-first.sh", "notes.txt"):
        (folder / name).write_text("true\n")
    (tmp_path / "boot.sh").write_text("true\n")
    found = init._boot_scripts({"boot": str(tmp_path / "boot.sh"), "boot_dir": str(folder)})
    assert [Path(p).name for p in found] == ["boot.sh", "10-first.sh", "50-slurm.sh"]
    assert init._boot_scripts({"boot": str(tmp_path / "none.sh"), "boot_dir": str(tmp_path / "none")}) == []
    hook = nodescript.boot_hook_text(private_layout())
    assert "exec sh /root/.clustertool/slurm/start.sh >> /root/.clustertool/slurm/log/start.log 2>&1" in hook


def session(tmp_path, rec: ClusterRecord) -> tuple[ClusterSession, ScriptedTransport]:
    fake = ScriptedTransport(tmp_path)
    return ClusterSession(rec, fake), fake


def test_a_cordon_drains_the_node_with_its_reason_and_uncordon_resumes_it(tmp_path):
    rec = record()
    rec.scheduler = made(rec)
    sess, fake = session(tmp_path, rec)
    fake.on("scontrol update", Reply())
    said = slurmdrain.apply(sess, rec, "cordon", ["node-3"], {"node-3": "Xid 79"})
    assert said == "node-3 drained in Slurm"
    [call] = [c for c in fake.calls if "scontrol" in c.command]
    assert call.node == "node-1" and "NodeName=node-3 State=DRAIN 'Reason=clustertool: Xid 79'" in call.command
    assert call.command.startswith("env SLURM_CONF=/root/.clustertool/slurm/etc/slurm.conf scontrol")
    assert slurmdrain.apply(sess, rec, "uncordon", ["node-3"], {}) == "node-3 resumed in Slurm"
    assert "State=RESUME" in fake.calls[-1].command


def test_an_adopted_clusters_user_who_may_not_drain_is_told_and_the_node_stays_out_of_our_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr("clustertool.core.state.save", lambda record: None)
    rec = record()
    rec.scheduler = {**made(rec), "made": False, "layout": system_layout().__dict__}
    sess, fake = session(tmp_path, rec)
    fake.on("scontrol update", Reply(stderr="slurm_update error: Access/permission denied\n", code=1))
    said = slurmdrain.apply(sess, rec, "cordon", ["node-2"], {"node-2": "slow link"})
    assert "not a Slurm operator here, so it is not drained" in said and "--exclude" in said
    assert rec.scheduler["operator"] is False
    before = len(fake.calls)
    assert "Slurm's state unchanged" in slurmdrain.apply(sess, rec, "uncordon", ["node-2"], {})
    assert len(fake.calls) == before  # nothing asked of Slurm: nothing was drained


def sinfo_node(line: str) -> slurmtext.SinfoNode:
    return slurmtext.sinfo_nodes(line)[0]


def test_doctor_names_a_node_slurm_will_not_schedule_that_is_not_cordoned_and_the_reverse():
    rec = record()
    found = SlurmInfo.from_dict(made(rec))
    drained = sinfo_node((DATA / "sinfo-drained.out").read_text().splitlines()[2])
    [f] = slurmcheck._state_finding(found, rec.node("node-3"), drained)
    assert f.severity == "error" and "drained (Xid 79 on GPU 1)" in f.message and "uncordon node-3" in f.fix
    rec.node("node-3").cordon = {"reason": "x"}
    assert slurmcheck._state_finding(found, rec.node("node-3"), drained) == []
    idle = sinfo_node("node-3|workers*|idle|gpu:2|2|24105|none")
    [warn] = slurmcheck._state_finding(found, rec.node("node-3"), idle)
    assert warn.severity == "warning" and "other users' jobs go there" in warn.message
    silent = sinfo_node((DATA / "sinfo-resumed.out").read_text().splitlines()[2])  # idle*: slurmd silent
    rec.node("node-3").cordon = None
    [gone] = slurmcheck._state_finding(found, rec.node("node-3"), silent)
    assert "slurmd does not answer" in gone.message and "reboot --nodes node-3" in gone.fix


def test_doctor_compares_slurms_gpu_count_with_the_nodes():
    rec = record()
    found = SlurmInfo.from_dict(made(rec))
    shown = {i.name: i.gres for i in map(slurmtext.node_info, slurmtext.records(
        (DATA / "scontrol-show-node-drained.out").read_text()))}
    assert slurmcheck._gres(found, "node-3", "2 devices", shown) == []
    [f] = slurmcheck._gres(found, "node-3", "1 nvidia-smi", shown)
    assert "Slurm counts 2 GPU(s) (gpu:2), the node has 1 (nvidia-smi)" in f.message
    assert slurmcheck.slurmtext_gpus("gpu:a100:8(S:0-1),shard:4") == 8


def test_adoption_reads_every_node_from_sinfo_and_names_them_after_the_login_node(tmp_path, monkeypatch):
    monkeypatch.setattr("clustertool.core.state.save", lambda record: None)
    login = Node("node-1", 1, "10.0.0.5", role="leader", slots=1, ssh_host="10.0.0.5")
    rec = ClusterRecord("site", "static", nodes=[login], options={"slurm_login": "10.0.0.5"},
                        status=ClusterState.READY)
    sess, fake = session(tmp_path, rec)
    fake.on("sinfo --noheader", Reply(stdout="gpu-st-1|gpu*|idle|gpu:8|96|1000000|none\n"
                                             "gpu-st-2|gpu*|idle|gpu:8|96|1000000|none\n"
                                             "gpu-st-2|debug|idle|gpu:8|96|1000000|none\n"))
    fake.on("scontrol show node", Reply(stdout="NodeName=gpu-st-1 Arch=x86_64\n   NodeAddr=10.0.1.11 "
                                               "NodeHostName=gpu-st-1\n   Gres=gpu:a100:8\n\n"
                                               "NodeName=gpu-st-2 Arch=x86_64\n   NodeAddr=10.0.1.12 "
                                               "NodeHostName=gpu-st-2\n   Gres=gpu:a100:8\n"))
    fake.on("sinfo -V", Reply(stdout="slurm 23.11.4\n"))
    fake.on("scontrol show config", Reply(stdout="AccountingStorageType = (null)\n"
                                                 "AuthInfo = socket=/var/run/munge/site.socket,ttl=60\n"))
    fake.on("hostname -s", Reply(stdout="login1\n10.0.0.5\n"))
    found = slurmadopt.adopt(sess)
    assert [(n.name, n.address, n.slots) for n in rec.nodes] == [("node-1", "10.0.0.5", 1), ("node-2", "10.0.1.11", 8),
                                                                ("node-3", "10.0.1.12", 8)]
    assert (found.partition, found.release, found.made, found.leader_compute) == ("gpu", "23.11.4", False, False)
    assert found.names == {"node-2": "gpu-st-1", "node-3": "gpu-st-2"} and found.hostlist() == "gpu-st-[1-2]"
    assert found.layout.munge_socket == "/var/run/munge/site.socket"  # the site's munged, for doctor
    assert json.loads(json.dumps(rec.scheduler))["kind"] == "slurm"
    assert not [c for c in fake.calls if "update" in c.command or "slurm.conf" in (c.stdin or "")]  # read only


def test_an_adopted_clusters_config_path_must_be_a_slurm_conf():
    assert slurmadopt.layout_of({}).slurm_conf == "/etc/slurm/slurm.conf"
    assert slurmadopt.layout_of({"slurm_conf": "/opt/slurm/etc/slurm.conf"}).needs_conf_env
    with pytest.raises(UsageError, match="a file named slurm.conf"):
        slurmadopt.layout_of({"slurm_conf": "etc/site.conf"})
    assert slurmadopt.gpus_of("gpu:4,gpu:a100:2(S:0)") == 6 and slurmadopt.gpus_of("(null)") == 0

"""Native plugin core: remote lines quote paths, sums/versions parse, builds are described,
tarballs carry the right files, the job environment comes from the deploy record."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
from types import SimpleNamespace

import pytest

from clustertool.core.errors import ToolError
from clustertool.core.model import LEADER, ClusterRecord, Node
from clustertool.plugin import build, deploy, remote

pytestmark = pytest.mark.unit

SUM_A = "a" * 64
SUM_B = "b" * 64


def test_stage_command_quotes_dest_and_names_every_file():
    line = remote.stage_command("/opt/my dir", "tok1", ["x.so", "y z"])
    assert "'/opt/my dir/.staging-tok1'" in line
    assert "'y z'" in line
    assert shlex.split(line)  # a well-formed shell line


def test_commit_command_moves_each_file_and_reports_ld_path():
    line = remote.commit_command("/opt/lib/", "t", ["a.so", "b.so"])
    assert "mv -f /opt/lib/.staging-t/a.so /opt/lib/a.so" in line
    assert "mv -f /opt/lib/.staging-t/b.so /opt/lib/b.so" in line
    assert "LD_LIBRARY_PATH=" in line and "rmdir /opt/lib/.staging-t" in line


def test_status_command_survives_missing_dest():
    command = remote.status_command("/nonexistent/x", ["a.so"])
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == ""


def test_stage_status_commit_round_trip_in_a_real_shell(tmp_path):
    dest = tmp_path / "lib"
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        for name, data in (("a.so", b"xx clustertool-nccl-plugin 9.9.9\0 yy"), ("b", b"bee")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    staged = subprocess.run(["sh", "-c", remote.stage_command(str(dest), "t1", ["a.so", "b"])],
                            input=payload.getvalue(), capture_output=True)
    sums = remote.parse_sums(staged.stdout.decode())
    assert staged.returncode == 0 and set(sums) == {"a.so", "b"}
    assert not (dest / "a.so").exists(), "staging must not touch DEST's files"
    done = subprocess.run(["sh", "-c", remote.commit_command(str(dest), "t1", ["a.so", "b"])], capture_output=True,
                          text=True)
    assert done.returncode == 0 and remote.parse_sums(done.stdout) == sums
    assert remote.parse_ld_path(done.stdout) is not None
    assert not (dest / ".staging-t1").exists()
    st = subprocess.run(["sh", "-c", remote.status_command(str(dest), ["a.so", "b"])], capture_output=True, text=True)
    assert remote.parse_sums(st.stdout) == sums and remote.parse_version(st.stdout) == "9.9.9"


def test_parse_sums_ignores_noise_and_keeps_basenames():
    text = f"hello\n{SUM_A}  ./dir/a.so\n{SUM_B} *b\nshort 123\n"
    assert remote.parse_sums(text) == {"a.so": SUM_A, "b": SUM_B}


def test_mismatched_names_missing_and_different_files():
    want = {"a": SUM_A, "b": SUM_B, "c": SUM_A}
    assert remote.mismatched(want, {"a": SUM_A, "b": SUM_A}, ["a", "b", "c"]) == ["b", "c"]


def test_read_version_finds_the_compiled_string():
    assert build.read_version(b"\x7fELF...clustertool-nccl-plugin 0.1.0\0more") == "0.1.0"
    assert build.read_version(b"nothing here") is None


def test_describe_names_missing_artefacts(tmp_path):
    (tmp_path / build.NET_LIB).write_bytes(b"x")
    with pytest.raises(ToolError, match="missing libnccl-tuner-clustertool.so, collnet_bench, clustertool-reducer"):
        build.describe(tmp_path)


def test_describe_hashes_every_artefact(tmp_path):
    for a in build.ARTEFACTS:
        (tmp_path / a).write_bytes(a.encode() + b" clustertool-nccl-plugin 1.2.3\0")
    b = build.describe(tmp_path)
    assert b.version == "1.2.3" and b.sha256 == b.files[build.NET_LIB] and len(b.files) == 4
    assert build.REDUCER in b.files  # the reduction server ships with the plugin


def test_build_local_failure_carries_makes_tail(tmp_path):
    def fake_run(argv, **kw):
        assert argv[:2] == ["make", "-C"]
        return SimpleNamespace(returncode=2, stdout="\n".join(f"line {i}" for i in range(20)), stderr="boom: error")

    with pytest.raises(ToolError) as exc:
        build.build_local(tmp_path, run=fake_run)
    assert "make exit 2" in exc.value.message and "boom: error" in exc.value.message
    assert "line 0" not in exc.value.message


def test_source_tar_leaves_build_outputs_out(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.c").write_text("int x;")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "big.so").write_bytes(b"0" * 100)
    with tarfile.open(fileobj=io.BytesIO(build.source_tar(tmp_path)), mode="r:gz") as tar:
        assert tar.getnames() == ["src/a.c"]


def _cluster(provider="local", user="root"):
    nodes = [Node(f"node-{i}", i, f"10.213.9.{i}", role=LEADER if i == 1 else "member") for i in (1, 2)]
    return ClusterRecord(name="pl", provider=provider, user=user, nodes=nodes, status="ready")


def test_default_dest_is_private_home_for_local_and_opt_elsewhere():
    assert deploy.default_dest(_cluster("local")) == "/root/.clustertool/lib"
    assert deploy.default_dest(_cluster("local", "ubuntu")) == "/home/ubuntu/.clustertool/lib"
    assert deploy.default_dest(_cluster("aws")) == "/opt/clustertool/lib"


def test_plugin_env_needs_a_deploy(ct_env):
    with pytest.raises(ToolError, match="not deployed"):
        deploy.plugin_env(_cluster())


def test_plugin_env_points_nccl_at_the_deployed_files(ct_env):
    build.save_record("pl", {"deployed": {"dest": "/opt/ct/lib/", "sha256": SUM_A, "tuner_table": True,
                                           "ld_library_path": "/usr/local/cuda/lib64"}})
    env = deploy.plugin_env(_cluster())
    assert env["NCCL_NET_PLUGIN"] == "clustertool"  # by name: NCCL 2.19/2.20 take no path
    assert env["NCCL_TUNER_PLUGIN"] == "/opt/ct/lib/libnccl-tuner-clustertool.so"
    assert env["NCCL_COLLNET_ENABLE"] == "1"
    assert env["LD_LIBRARY_PATH"] == "/opt/ct/lib:/usr/local/cuda/lib64"
    assert env["CLUSTERTOOL_TUNER_CONFIG"] == "/opt/ct/lib/tuner.csv"

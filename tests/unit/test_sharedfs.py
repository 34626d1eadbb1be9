"""Shared filesystems, the pure parts: what `--shared-fs` / `shared_fs:` parse to, the one-line errors of bad
input, the sshfs argv, the node scripts (valid shell, quoted), their answers, and where a path is shared."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from clustertool.cluster.spec import load_spec
from clustertool.core.errors import NotSupported, SpecError, UsageError
from clustertool.core.model import LEADER, MEMBER, ClusterRecord, Node
from clustertool.doctor import sharedfs
from clustertool.sharedfs import argv, mount
from clustertool.sharedfs.specs import describe, parse_shared_fs

pytestmark = pytest.mark.unit


def fs(kind, fs_id=None, at="/shared"):
    return {"kind": kind, "id": fs_id, "mount": at}


# ---- parsing --------------------------------------------------------------------------------------

def test_flags_parse_kind_id_and_path_and_place_the_rest_at_shared_shared2():
    got = parse_shared_fs(["efs", "fsx:fs-0123456789abcdef0@/data", "efs"])
    assert got == [fs("efs"), fs("fsx", "fs-0123456789abcdef0", "/data"), fs("efs", None, "/shared2")]


def test_shared_mount_places_the_first_one_and_numbers_the_next():
    assert parse_shared_fs(["local", "efs"], "/mnt/data") == [fs("local", None, "/mnt/data"),
                                                             fs("efs", None, "/mnt/data2")]


def test_a_parsed_list_parses_to_itself_and_describes_in_the_flags_form():
    once = parse_shared_fs(["efs:fs-1a@/x", "local"])
    assert parse_shared_fs(once) == once
    assert [describe(f) for f in once] == ["efs:fs-1a@/x", "local@/shared"]


@pytest.mark.parametrize("values, words", [
    ("nfs", "unknown kind 'nfs'"),
    ("local:fs-12", "takes no id"),
    ("efs:bogus", "'bogus' is not a filesystem id"),
    ("efs@shared", "'shared' is relative"),
    ("efs@/etc", "cannot mount over '/etc'"),
    ("efs@/", "cannot mount over '/'"),
    ("efs@/a b", "characters other than"),
    ("efs@/a/../etc", "cannot mount over"),
    (["efs@/x", "fsx@/x"], "/x is the mount point of another"),
    (["efs@/x", "fsx@/x/y"], "/x/y lies inside the shared mount /x"),
    (["efs:fs-1", "efs:fs-1@/y"], "fs-1 is listed twice"),
    ([{"kind": "efs", "size": 5}], "unknown key 'size'"),
    ([{"id": "fs-1"}], "no 'kind'"),
    ([7], "expected KIND[:ID][@PATH]"),
    ("efs:", "nothing after ':'"),
])
def test_bad_input_is_one_usage_line_naming_the_item(values, words):
    with pytest.raises(UsageError) as e:
        parse_shared_fs(values)
    assert words in e.value.message and "\n" not in e.value.message


def test_spec_file_lists_strings_and_mappings_into_the_options(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes: 2\nshared_fs:\n  - local\n  - {kind: local, mount: /ckpt}\n")
    assert load_spec(str(path)).options["shared_fs"] == [fs("local"), fs("local", None, "/ckpt")]


def test_flags_win_over_the_file_and_shared_mount_alone_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes: 2\nshared_fs: [local]\n")
    spec = load_spec(str(path), {"shared_fs": ["local@/data"]})
    assert spec.options["shared_fs"] == [fs("local", None, "/data")]
    with pytest.raises(SpecError, match="--shared-mount: needs --shared-fs"):
        load_spec(None, {"nodes": 2, "shared_mount": "/x"})


def test_a_bad_file_entry_names_the_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes: 2\nshared_fs: [nfs]\n")
    with pytest.raises(SpecError) as e:
        load_spec(str(path))
    assert e.value.message.startswith(f"{path}: shared_fs: shared filesystem 'nfs': unknown kind")


def test_no_shared_fs_leaves_the_options_as_they_were():
    assert "shared_fs" not in load_spec(None, {"nodes": 2}).options


# ---- mount commands -----------------------------------------------------------------------------------

def _cluster(user="root") -> ClusterRecord:
    nodes = [Node("node-1", 1, "10.213.0.1", role=LEADER), Node("node-2", 2, "10.213.0.2", role=MEMBER)]
    c = ClusterRecord(name="demo", provider="local", user=user, nodes=nodes)
    c.provider_state["shared_fs"] = [{"kind": "local", "id": None, "mount": "/shared", "made": True, "dns": None,
                                      "mount_name": None, "source": "/scratch/.clustertool-shared/demo/shared"}]
    return c


def test_sshfs_argv_uses_the_cluster_key_and_pinned_host_keys():
    got = argv.sshfs_argv("10.213.0.1", "/scratch/x", "/shared", "demo")
    assert got[:3] == ["sshfs", "root@10.213.0.1:/scratch/x", "/shared"] and got[3] == "-o"
    options = got[4].split(",")
    assert {"IdentityFile=~/.ssh/clustertool-demo", "UserKnownHostsFile=~/.ssh/clustertool-demo.known_hosts",
            "StrictHostKeyChecking=yes", "BatchMode=yes", "reconnect"} <= set(options)


def test_the_leader_binds_its_export_and_members_mount_it_over_sshfs():
    c = _cluster()
    entry = mount.filesystems(c)[0]
    lead = argv.mount_command(mount.target_for(c, c.node("node-1"), entry))
    member = argv.mount_command(mount.target_for(c, c.node("node-2"), entry))
    assert lead.argv == ["mount", "--bind", entry["source"], "/shared"] and not lead.remote
    assert member.argv[:3] == ["sshfs", f"root@10.213.0.1:{entry['source']}", "/shared"] and member.fstab is None


def test_a_kind_without_a_builder_is_not_supported():
    with pytest.raises(NotSupported, match="no mount command for shared filesystems of kind 'nope'"):
        argv.mount_command(argv.MountTarget(fs("nope"), "c", "node-1", True, "10.0.0.1", "root"))


def test_a_registered_kind_with_an_fstab_line_is_added_once_with_sudo_for_other_users():
    @argv.register("testkind")
    def build(t):
        return argv.MountCommand(["mount", "-t", "nfs4", "dns:/", t.fs["mount"]],
                                 fstab="dns:/ /shared nfs4 _netdev 0 0")
    try:
        c = _cluster(user="ubuntu")
        c.provider_state["shared_fs"][0]["kind"] = "testkind"
        script = mount.mount_script(c, c.node("node-2"), mount.filesystems(c))
        assert "sudo -n mount -t nfs4 dns:/ /shared" in script
        assert "grep -qxF 'dns:/ /shared nfs4 _netdev 0 0' /etc/fstab" in script and "sudo -n tee -a" in script
    finally:
        del argv.BUILDERS["testkind"]


def _scripts():
    c = _cluster()
    entries = mount.filesystems(c)
    return {"mount": mount.mount_script(c, c.node("node-2"), entries), "probe": mount.probe_script(entries),
            "unmount": mount.unmount_script(c, entries), "doctor": sharedfs.rw_script(["/shared"], "ab12")}


@pytest.mark.parametrize("name", ["mount", "probe", "unmount", "doctor"])
def test_node_scripts_are_valid_shell(name):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: `make apt` installs it")
    proc = subprocess.run(["shellcheck", "-s", "sh", "-"], input=_scripts()[name],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_node_answers_parse_into_states():
    got = mount.parse("node-2", "noise\nct-fs mounted /shared fuse.sshfs\nct-fs fail /data mount: denied here\n")
    assert [(g.mount, g.state, g.ok) for g in got] == [("/shared", "mounted", True), ("/data", "fail", False)]
    assert got[1].detail == "mount: denied here"
    rows = sharedfs.parse_rw("node-2", "ct-fsd /shared yes yes 2100 800\nct-fsd /data no no 0 0\n")
    assert rows[0] == {"node": "node-2", "mount": "/shared", "same": True, "writable": True,
                       "write_ms": 2.1, "read_ms": 0.8}
    assert not rows[1]["same"] and not rows[1]["writable"]


def test_summary_and_status_lines_fold_nodes():
    results = [mount.NodeMount(f"node-{i}", "/shared", "mounted") for i in (1, 2, 4)]
    results.append(mount.NodeMount("node-3", "/shared", "fail", "boom"))
    assert mount.summary(results, "mounted") == ["/shared: mounted on node-[1-2,4]", "/shared: FAILED on node-3"]
    rows = [{"mount": "/shared", "kind": "local", "id": None, "made": True,
             "nodes": {"node-1": "mounted", "node-2": "missing", "node-3": "mounted"}}]
    assert mount.status_lines(rows) == ["shared /shared: local; mounted on node-[1,3]; MISSING on node-2"]


def test_a_destination_under_a_shared_mount_is_found():
    c = _cluster()
    assert mount.mount_under(c, "/shared/data/x") == "/shared" and mount.mount_under(c, "/shared") == "/shared"
    assert mount.mount_under(c, "/sharedx/y") is None and mount.mount_under(c, "data") is None
    assert mount.mount_under(c, "//shared/./y") == "/shared"
    assert "written once, from the leader (node-1)" in mount.write_once_line(c, "/shared/x", "/shared")


def test_a_provider_without_the_kind_is_refused_before_anything_is_made():
    from clustertool.providers.base import provider_class

    c = ClusterRecord(name="c", provider="static", user="u", options={"shared_fs": [fs("local")]})
    with pytest.raises(UsageError, match="the static provider has no shared filesystem of kind 'local'"):
        mount.check_kinds(provider_class("static")(), c)
    c.provider = "local"
    mount.check_kinds(provider_class("local")(), c)  # the local provider has it

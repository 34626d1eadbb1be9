"""`copy` on real local clusters: chain and fan-out, incremental, resumable, failures per node."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from tests.conftest import CLI, REPO, run_cli
from tests.local import nodehost

pytestmark = pytest.mark.local

ODD = "odd name 'q' \"dq\" ü"
# A tree with what breaks naive copies: spaces, quotes, unicode, an empty dir, a symlink,
# unusual permissions, and enough bytes to take a moment on a shaped link.
MAKE_TREE = f"""set -e
mkdir -p "$1" && cd "$1"
mkdir -p 'empty dir' sub/deeper {shlex.quote(ODD)}
echo hello > a.txt && chmod 640 a.txt
ln -s a.txt link-to-a
printf 'x%.0s' $(seq 1 100) > {shlex.quote(ODD)}/small
for i in $(seq 1 $2); do head -c $3 /dev/urandom > "sub/deeper/blob $i"; done
chmod 700 sub
"""
# An independent fingerprint of a tree (not our manifest code): types, modes, link targets, sha256.
FINGERPRINT = ("cd \"$1\" && find . -mindepth 1 -printf '%y %m %p -> %l\\n' | LC_ALL=C sort && "
               "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum")


def sh(env, name, node, script, *args):
    """Run a bash script with arguments on one node; returns stdout, asserts success."""
    line = "bash -c " + _q(script) + " _ " + " ".join(_q(a) for a in args)
    proc = run_cli("exec", "-c", name, "-n", node, "--no-live", "--", line, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("\n", 1)[1]  # drop the "---- node (exit 0)" header


def _q(text):
    return shlex.quote(text)


def copy_json(env, *args, timeout=300):
    proc = run_cli("copy", *args, "--json", env=env, timeout=timeout)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (exit {proc.returncode}): {proc.stdout}{proc.stderr}") from None
    return proc.returncode, data, proc.stderr


def nodes_of(data):
    return {n["node"]: n for n in data["nodes"]}


def members(count):
    return [f"node-{i}" for i in range(2, count + 1)]


@pytest.mark.parametrize("strategy", ["chain", "fanout"])
def test_strategy_delivers_identical_trees_to_four_nodes_and_rerun_sends_nothing(ct_env, local_cluster, strategy):
    name = local_cluster(5)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "6", "300000")
    code, data, err = copy_json(ct_env, "-c", name, "--strategy", strategy, "/scratch/src", "/scratch/dst")
    assert code == 0, err
    assert data["strategy"] == strategy and data["verified"] is True
    assert data["bytes_sent"] >= 6 * 300000
    # verified as written (the relay's hashes, rsync's checksums): no file was read a second time
    assert all(n["files_verified_in_stream"] == n["files_checked"] == 8 for n in data["nodes"]), data["nodes"]
    assert all(n["status"] == "ok" for n in data["nodes"]) and len(data["nodes"]) == 4
    want = sh(ct_env, name, "leader", FINGERPRINT, "/scratch/src")
    assert "l 777 ./link-to-a -> a.txt" in want and "d 755 ./empty dir" in want and ODD in want
    for node in members(5):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/dst") == want, node
    code, again, _ = copy_json(ct_env, "-c", name, "--strategy", strategy, "/scratch/src", "/scratch/dst")
    assert code == 0 and again["bytes_sent"] == 0 and again["passes"] == 0


def test_from_local_reaches_every_node_through_the_leader(ct_env, local_cluster, tmp_path):
    name = local_cluster(3)
    src = tmp_path / "here"
    subprocess.run(["bash", "-c", MAKE_TREE, "_", str(src), "3", "100000"], check=True)
    code, data, err = copy_json(ct_env, "-c", name, "--from", "local", "--strategy", "chain",
                                str(src), "/scratch/in")
    assert code == 0, err
    assert sorted(nodes_of(data)) == ["node-1", "node-2", "node-3"] and data["source"] == "local"
    want = subprocess.run(["bash", "-c", FINGERPRINT, "_", str(src)], capture_output=True, text=True).stdout
    for node in ("node-1", "node-2", "node-3"):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/in") == want


def _deeper(ct_env, name, node):
    """The files of the tree's sub/deeper that have landed on ``node`` (read here: no CLI process per look)."""
    folder = nodehost.node_dir(ct_env, name, node) / "scratch" / "dst" / "sub" / "deeper"
    try:
        return sorted(p for p in os.listdir(folder) if not p.startswith("."))  # rsync's temporary files: hidden
    except OSError:
        return []


def _copy_processes(ct_env, name, index):
    """pid -> argv of the processes of a copy on a node: its stations (relay, dialer, source: named by their
    run folder, copy-<run>-...) and rsync."""
    return {pid: argv for pid, argv in nodehost.processes(ct_env, name, index).items()
            if any(".cache/clustertool/copy-" in a for a in argv) or os.path.basename(argv[0]) == "rsync"}


def _run_folders(ct_env, name, node):
    return sorted((nodehost.node_dir(ct_env, name, node) / "home" / ".cache" / "clustertool").glob("copy-*"))


@pytest.mark.parametrize("strategy", ["chain", "fanout"])
def test_interrupted_copy_resumes_sending_only_what_is_missing(ct_env, local_cluster, strategy):
    name = local_cluster(3, "--link-rate", "40mbit")
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "8", "2500000")  # 20 MB: ~4 s per link
    proc = subprocess.Popen(CLI + ["copy", "-c", name, "--strategy", strategy, "--json",
                                   "/scratch/src", "/scratch/dst"],
                            env=ct_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # a whole file has landed on the last node; at that moment what feeds node-3 stops taking data (a stalled
    # disk), so the Ctrl-C comes mid-copy however slowly this test runs: node-3's relay in the chain (the
    # abort stops it), the leader's rsync to node-3 in the fan-out (node-3's rsync then sees its input end)
    nodehost.wait_for(lambda: len(_deeper(ct_env, name, "node-3")) >= 2, "a whole file on node-3")
    if strategy == "chain":
        feeding = [p for p, argv in _copy_processes(ct_env, name, 3).items() if any("relay.py" in a for a in argv)]
    else:
        to_3 = nodehost.address(ct_env, name, "node-3")
        feeding = [p for p, argv in _copy_processes(ct_env, name, 1).items()
                   if os.path.basename(argv[0]) == "rsync" and any(to_3 in a for a in argv)]
    frozen = nodehost.freeze(feeding)
    try:
        assert len(_deeper(ct_env, name, "node-3")) < 8, "the copy ended before the test could stop it"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.communicate(timeout=120)
        assert proc.returncode == 130
        landed = _deeper(ct_env, name, "node-3")
    finally:
        nodehost.thaw(frozen)
    # the relay stopped with us: no process of the copy is left on any node, no run files, and nothing more arrived
    for index in (1, 2, 3):
        nodehost.wait_for(lambda i=index: not _copy_processes(ct_env, name, i), f"the copy's processes on node {index}"
                          f" end: {_copy_processes(ct_env, name, index)}")
    assert [_run_folders(ct_env, name, n) for n in ("node-1", "node-2", "node-3")] == [[], [], []]
    assert _deeper(ct_env, name, "node-3") == landed
    code, data, err = copy_json(ct_env, "-c", name, "--strategy", strategy, "/scratch/src", "/scratch/dst")
    assert code == 0, err
    everything = data["total_bytes"] * (1 if strategy == "chain" else 2)  # fan-out sends once per node
    assert 0 < data["bytes_sent"] < everything, (data["bytes_sent"], everything)
    want = sh(ct_env, name, "leader", FINGERPRINT, "/scratch/src")
    for node in members(3):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/dst") == want


def test_node_killed_mid_chain_is_reported_and_nodes_after_it_get_the_data(ct_env, local_cluster):
    name = local_cluster(5, "--link-rate", "40mbit")
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "10", "2500000")  # 25 MB: ~5 s per link
    proc = subprocess.Popen(CLI + ["copy", "-c", name, "--strategy", "chain", "--json", "/scratch/src", "/scratch/dst"],
                            env=ct_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the chain node-2 -> node-3 -> node-4 -> node-5 streams through node-3: then node-3 hangs (every process
    # of the node stopped, so the chain cannot finish behind the test's back) and dies (SIGKILL)
    nodehost.wait_for(lambda: _deeper(ct_env, name, "node-4"), "data on node-4")
    pids = list(nodehost.processes(ct_env, name, 3))
    nodehost.freeze(pids)
    assert len(_deeper(ct_env, name, "node-3")) < 10, "node-3 had all the data before the test could stop it"
    nodehost.signal_all(pids, signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    data = json.loads(out)
    by = nodes_of(data)
    assert proc.returncode == 255 and by["node-3"]["status"] == "unreachable", err
    assert by["node-3"]["error"].startswith("unreachable")
    assert [by[n]["status"] for n in ("node-2", "node-4", "node-5")] == ["ok"] * 3, by
    assert data["passes"] >= 2  # a repair chain went around node-3
    want = sh(ct_env, name, "leader", FINGERPRINT, "/scratch/src")
    for node in ("node-2", "node-4", "node-5"):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/dst") == want


def test_missing_src_is_one_clear_line(ct_env, local_cluster):
    name = local_cluster(2)
    proc = run_cli("copy", "-c", name, "/scratch/no such dir", "/scratch/dst", env=ct_env)
    assert proc.returncode == 2
    assert "error: SRC '/scratch/no such dir' is neither on the leader (node-1) nor here\nhint: " in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("strategy", ["chain", "fanout"])
def test_unwritable_and_full_dest_fail_only_their_node(ct_env, local_cluster, strategy):
    name = local_cluster(4)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "4", "1000000")
    sh(ct_env, name, "node-2", "mkdir -p /scratch/d && mount -t tmpfs -o ro,size=1m tmpfs /scratch/d")
    sh(ct_env, name, "node-3", "mkdir -p /scratch/d && mount -t tmpfs -o size=1m tmpfs /scratch/d")
    code, data, err = copy_json(ct_env, "-c", name, "--strategy", strategy, "/scratch/src", "/scratch/d/x")
    by = nodes_of(data)
    assert code == 1
    assert by["node-2"]["status"] == "failed" and "Read-only file system" in by["node-2"]["error"]
    assert by["node-3"]["status"] == "failed" and "No space left on device" in by["node-3"]["error"]
    assert by["node-4"]["status"] == "ok" and by["node-4"]["problems"] == []
    proc = run_cli("copy", "-c", name, "--strategy", strategy, "/scratch/src", "/scratch/d/x", env=ct_env)
    assert proc.returncode == 1 and "node-2" in proc.stdout and "node-3" in proc.stdout


def test_silent_corruption_is_a_mismatch_naming_node_and_file(ct_env, local_cluster):
    name = local_cluster(3)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "2", "1000")
    assert copy_json(ct_env, "-c", name, "/scratch/src", "/scratch/dst")[0] == 0
    # same size and mtime, other bytes: the quick check cannot see it, verification must
    sh(ct_env, name, "node-3", "cd /scratch/dst && cp -p a.txt /tmp/ref-$$ && echo HELLO > a.txt && "
       "touch -r /tmp/ref-$$ a.txt && rm /tmp/ref-$$")
    proc = run_cli("copy", "-c", name, "/scratch/src", "/scratch/dst", env=ct_env)
    assert proc.returncode == 1
    assert "node-3: content differs: a.txt" in proc.stderr
    code, data, _ = copy_json(ct_env, "-c", name, "/scratch/src", "/scratch/dst", "--delete")
    assert code == 1 and nodes_of(data)["node-2"]["status"] == "ok"


# A node whose copy stream gets one byte flipped on the way into its relay (as bad memory would):
# its python3 is a wrapper (first on PATH through ~/.bashrc, which bash reads for ssh commands).
FLIP = r"""import os, sys
at, seen = int(sys.argv[1]), 0
while True:
    block = os.read(0, 1 << 16)
    if not block:
        break
    if seen <= at < seen + len(block):
        block = block[:at - seen] + bytes([block[at - seen] ^ 0xFF]) + block[at - seen + 1:]
    seen += len(block)
    os.write(1, block)
"""
FAULTY = r"""set -e
real=$(command -v python3)
mkdir -p /root/faulty
printf '%s' "$1" > /root/faulty/flip.py
cat > /root/faulty/python3 <<EOF
#!/bin/sh
case "\$1" in
  *relay.py) if [ "\$#" = 1 ]; then $real /root/faulty/flip.py 200000 | exec $real "\$@"; exit; fi ;;
esac
exec $real "\$@"
EOF
chmod +x /root/faulty/python3
echo 'export PATH=/root/faulty:$PATH' >> /root/.bashrc
"""


def test_a_hop_that_corrupts_the_stream_is_caught_in_the_stream_and_the_next_copy_repairs_it(ct_env, local_cluster):
    name = local_cluster(5)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "2", "1000000")
    sh(ct_env, name, "node-3", FAULTY, FLIP)
    code, data, err = copy_json(ct_env, "-c", name, "--strategy", "chain", "/scratch/src", "/scratch/dst")
    by = nodes_of(data)
    assert code == 1, err
    assert by["node-2"]["status"] == "ok" and by["node-2"]["files_verified_in_stream"] == 4
    bad = "content differs (written bytes do not hash as sent): sub/deeper/blob 1"
    for node in ("node-3", "node-4", "node-5"):  # node-3 forwarded what it got: the nodes after it too
        assert by[node]["status"] == "mismatch" and bad in by[node]["problems"], by[node]
    sh(ct_env, name, "node-3", "rm -rf /root/faulty /root/.bashrc")
    code, again, err = copy_json(ct_env, "-c", name, "--strategy", "chain", "/scratch/src", "/scratch/dst")
    assert code == 0, (err, again["nodes"])
    assert again["bytes_sent"] == 1000000  # only the bad file, once, through the three nodes
    want = sh(ct_env, name, "leader", FINGERPRINT, "/scratch/src")
    for node in members(5):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/dst") == want


def test_verify_only_rereads_and_names_a_byte_changed_on_a_nodes_disk_after_the_copy(ct_env, local_cluster):
    name = local_cluster(3)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "2", "100000")
    code, first, _ = copy_json(ct_env, "-c", name, "/scratch/src", "/scratch/dst")
    assert code == 0 and all(n["files_verified_in_stream"] == n["files_checked"] == 4 for n in first["nodes"])
    code, clean, _ = copy_json(ct_env, "-c", name, "--verify-only", "/scratch/src", "/scratch/dst")
    assert code == 0 and clean["bytes_sent"] == 0 and clean["verify"] == "reread"
    sh(ct_env, name, "node-3", "cd /scratch/dst/sub/deeper && cp -p 'blob 2' /tmp/ref && "
       # byte 5000 flipped (a fixed letter there was the same as the random one 1 time in 256), mtime kept
       "python3 -c \"f = open('blob 2', 'r+b'); f.seek(5000); b = f.read(1); f.seek(5000); "
       "f.write(bytes([b[0] ^ 0xFF]))\" && touch -r /tmp/ref 'blob 2'")
    proc = run_cli("copy", "-c", name, "--verify-only", "/scratch/src", "/scratch/dst", env=ct_env)
    assert proc.returncode == 1 and "node-3: content differs: sub/deeper/blob 2" in proc.stderr
    code, data, _ = copy_json(ct_env, "-c", name, "--verify-only", "/scratch/src", "/scratch/dst")
    by = nodes_of(data)
    assert code == 1 and data["strategy"] == "none" and data["bytes_sent"] == 0
    assert by["node-2"]["status"] == "ok" and by["node-3"]["problems"] == ["content differs: sub/deeper/blob 2"]


def test_delete_removes_what_src_no_longer_has(ct_env, local_cluster):
    name = local_cluster(3)
    sh(ct_env, name, "leader", MAKE_TREE, "/scratch/src", "2", "1000")
    assert copy_json(ct_env, "-c", name, "/scratch/src", "/scratch/dst")[0] == 0
    sh(ct_env, name, "leader", "rm -rf /scratch/src/sub && echo new > /scratch/src/new.txt")
    sh(ct_env, name, "members", "touch /scratch/dst/stray")
    code, data, err = copy_json(ct_env, "-c", name, "--delete", "/scratch/src", "/scratch/dst")
    assert code == 0, err
    want = sh(ct_env, name, "leader", FINGERPRINT, "/scratch/src")
    for node in members(3):
        assert sh(ct_env, name, node, FINGERPRINT, "/scratch/dst") == want


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

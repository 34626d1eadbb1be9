"""Incremental plans and verification over manifests (pure)."""

import os

import pytest

from clustertool.transfer import manifest, plan

pytestmark = pytest.mark.unit


def man(entries):
    return manifest.Manifest("/r", True, {e["p"]: e for e in entries})


def f(p, s=10, m=100, x=0o644, h=None):
    e = {"p": p, "t": "f", "s": s, "m": m, "x": x}
    if h:
        e["h"] = h
    return e


def d(p, x=0o755):
    return {"p": p, "t": "d", "m": 1, "x": x}


def test_missing_files_and_dirs_are_sent_and_counted():
    src = man([d("a"), f("a/x", s=5), f("y", s=7)])
    p = plan.plan_node("n", src, man([]))
    assert p.send == ["a", "a/x", "y"] and p.send_bytes == 12


def test_identical_size_and_mtime_is_not_sent():
    src = man([f("x"), d("a")])
    p = plan.plan_node("n", src, man([f("x"), d("a")]))
    assert p.empty


def test_other_size_is_sent_other_mtime_needs_hash():
    src = man([f("x", s=1), f("y", m=5)])
    p = plan.plan_node("n", src, man([f("x", s=2), f("y", m=6)]))
    assert p.send == ["x"] and p.hash_check == ["y"]


def test_hash_check_equal_content_only_touches_metadata():
    src = man([f("y", m=5), f("z", m=5)])
    p = plan.plan_node("n", src, man([f("y", m=6), f("z", m=6)]))
    plan.resolve_hashes(p, {"y": "aa", "z": "bb"}, {"y": "aa", "z": "cc"}, src)
    assert p.touch == [["y", 5, 0o644]] and p.send == ["z"] and p.send_bytes == 10


def test_permission_change_only_touches():
    src = man([f("x", x=0o600)])
    p = plan.plan_node("n", src, man([f("x", x=0o644)]))
    assert p.send == [] and p.touch == [["x", 100, 0o600]]


def test_type_change_deletes_then_sends():
    src = man([f("x")])
    p = plan.plan_node("n", src, man([d("x"), f("x/inner")]))
    assert p.delete == ["x"] and p.send == ["x"]


def test_symlink_with_other_target_is_replaced():
    src = man([{"p": "l", "t": "l", "l": "a", "x": 0o777, "m": 1}])
    p = plan.plan_node("n", src, man([{"p": "l", "t": "l", "l": "b", "x": 0o777, "m": 1}]))
    assert p.delete == ["l"] and p.send == ["l"]


def test_delete_lists_only_top_level_extras():
    src = man([f("keep")])
    dest = man([f("keep"), d("old"), f("old/a"), f("old/b"), f("stray")])
    assert plan.plan_node("n", src, dest, delete=True).delete == ["old", "stray"]
    assert plan.plan_node("n", src, dest, delete=False).delete == []


def test_union_includes_parents_and_is_sorted():
    src = man([d("a"), d("a/b"), f("a/b/c"), f("z")])
    p1, p2 = plan.NodePlan("1", send=["a/b/c"]), plan.NodePlan("2", send=["z"])
    assert plan.union_send([p1, p2], src) == ["a", "a/b", "a/b/c", "z"]
    assert plan.union_send([plan.NodePlan("3")], src) == []


def test_archive_estimate_covers_headers_and_padding():
    src = man([f("x", s=1), d("a")])
    assert plan.archive_bytes(["a", "x"], src) == 1024 + 512 + 512 + 512


def test_compare_names_each_kind_of_difference():
    src = man([f("a", h="1"), f("b", h="2"), d("c"), {"p": "l", "t": "l", "l": "a", "m": 1, "x": 0o777},
               f("p", h="3", x=0o600)])
    dest = man([f("a", h="1"), f("b", h="9"), {"p": "l", "t": "l", "l": "zz", "m": 1, "x": 0o777},
                f("p", h="3"), f("extra")])
    problems = manifest.compare(src, dest, extras=True)
    assert problems == ["content differs: b", "missing: c", "link target differs: l",
                        "permissions differ: p (0o644 != 0o600)", "extra: extra"]
    assert manifest.compare(src, src) == []


def test_local_manifest_sees_links_empty_dirs_perms_and_odd_names(tmp_path):
    root = tmp_path / "src"
    (root / "empty").mkdir(parents=True)
    odd = root / "sp ace 'q\" ü"
    odd.write_bytes(b"abc")
    os.chmod(odd, 0o640)
    (root / "ln").symlink_to("sp ace 'q\" ü")
    m = manifest.local(str(root), want_hash=True)
    assert m.entries["empty"]["t"] == "d"
    assert m.entries["ln"] == {"p": "ln", "t": "l", "l": "sp ace 'q\" ü", "x": 0o777,
                               "m": m.entries["ln"]["m"]}
    e = m.entries["sp ace 'q\" ü"]
    assert (e["s"], e["x"], len(e["h"])) == (3, 0o640, 32)
    assert manifest.local(str(tmp_path / "nope")).exists is False


def test_manifest_program_text_runs_standalone(tmp_path):
    import subprocess
    import sys

    (tmp_path / "f").write_bytes(b"x" * 10)
    out = subprocess.run([sys.executable, "-I", "-"], input=manifest.remote_args(str(tmp_path), ["f"]),
                         capture_output=True, check=True).stdout.decode()
    m = manifest.parse(out)
    assert m.entries["f"]["s"] == 10 and "h" in m.entries["f"] and m.is_dir

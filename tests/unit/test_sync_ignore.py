"""`run --sync`'s ignore rules: gitignore(5) semantics for .gitignore and .clustertoolignore."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clustertool.nodeprogs import manifest
from clustertool.transfer import ignore
from clustertool.transfer.manifest import local

pytestmark = pytest.mark.unit


def rules_match(patterns: str, path: str, is_dir: bool = False) -> bool:
    """Whether ``patterns`` (one ignore file at the top) exclude ``path``, parents included."""
    verdict = False
    for rule in ignore.parse(patterns):
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.fullmatch(path):
            verdict = not rule.negate
    return verdict


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def kept(root: Path) -> list[str]:
    """The files (not folders) a sync of ``root`` sends."""
    matcher = ignore.Matcher(str(root))
    entries = manifest.walk(str(root), keep=matcher.keep)
    return sorted(e["p"] for e in entries if e["t"] == "f")


@pytest.mark.parametrize("pattern, path, expected", [
    ("*.log", "a.log", True),
    ("*.log", "deep/er/b.log", True),
    ("*.log", "a.log.txt", False),
    ("/build", "build", True),             # a leading slash anchors at the file's folder
    ("/build", "src/build", False),
    ("doc/frotz", "doc/frotz", True),      # a slash in the middle anchors too
    ("doc/frotz", "a/doc/frotz", False),
    ("frotz", "a/doc/frotz", True),        # no slash: a name at any depth
    ("**/foo", "foo", True),
    ("**/foo", "a/b/foo", True),
    ("**/foo/bar", "x/foo/bar", True),
    ("abc/**", "abc/x", True),             # trailing /**: everything inside ...
    ("abc/**", "abc/x/y", True),
    ("abc/**", "abc", False),              # ... but not the folder itself
    ("a/**/b", "a/b", True),               # /**/: zero or more folders
    ("a/**/b", "a/x/y/b", True),
    ("a/**/b", "a/xb", False),
    ("foo/*", "foo/test.json", True),      # * never crosses a slash
    ("foo/*", "foo/bar/hello.c", False),
    ("?.txt", "a.txt", True),
    ("?.txt", "ab.txt", False),
    ("[ab].txt", "b.txt", True),
    ("[ab].txt", "c.txt", False),
    ("[!ab].txt", "c.txt", True),
    ("[!ab].txt", "a.txt", False),
    ("[a-c]x", "bx", True),
    ("[a-c]x", "dx", False),
    ("\\#notes", "#notes", True),          # escaped comment character
    ("\\!bang", "!bang", True),            # escaped negation
    ("trail\\ ", "trail ", True),          # an escaped trailing space stays
    ("trail   ", "trail", True),           # unescaped trailing spaces go
    ("a**b", "axyb", True),                # other ** are plain stars
    ("a**b", "ax/yb", False),
])
def test_a_pattern_matches_as_gitignore_says(pattern, path, expected):
    assert rules_match(pattern, path) is expected


def test_comments_and_blank_lines_are_not_rules():
    assert ignore.parse("# a comment\n\n   \n") == []


def test_a_directory_pattern_matches_directories_only():
    assert rules_match("build/", "build", is_dir=True)
    assert not rules_match("build/", "build", is_dir=False)
    assert rules_match("build/", "src/build", is_dir=True)


def test_the_last_matching_rule_wins_and_negation_re_includes():
    assert not rules_match("*.log\n!keep.log", "keep.log")
    assert rules_match("*.log\n!keep.log\nkeep.log", "keep.log")


def test_a_tree_keeps_what_the_rules_allow(tmp_path):
    root = tree(tmp_path / "proj", {
        ".gitignore": "*.bin\n/out/\n!small.bin\nlogs/\n",
        "train.py": "print(1)\n", "big.bin": "x", "small.bin": "y",
        "out/model.pt": "w", "src/out/kept.py": "k",   # /out/ is anchored: src/out stays
        "logs/a.txt": "l", "src/logs/b.txt": "l",       # logs/ matches at any depth
        "src/pkg/mod.py": "m",
    })
    assert kept(root) == [".gitignore", "small.bin", "src/out/kept.py", "src/pkg/mod.py", "train.py"]


def test_a_file_below_an_excluded_folder_cannot_be_re_included(tmp_path):
    root = tree(tmp_path / "proj", {".gitignore": "data/\n!data/keep.txt\n", "data/keep.txt": "k", "a.py": ""})
    assert kept(root) == [".gitignore", "a.py"]


def test_the_gitignore_manual_example_keeps_only_foo_bar(tmp_path):
    root = tree(tmp_path / "proj", {".gitignore": "/*\n!/foo\n/foo/*\n!/foo/bar\n",
                                    "foo/bar/x": "", "foo/baz/y": "", "top.txt": ""})
    assert kept(root) == ["foo/bar/x"]


def test_nested_ignore_files_apply_below_their_folder(tmp_path):
    root = tree(tmp_path / "proj", {
        "sub/.gitignore": "*.tmp\n/only-here\n",
        "a.tmp": "", "sub/b.tmp": "", "sub/deep/c.tmp": "", "sub/only-here": "", "only-here": "",
    })
    assert kept(root) == ["a.tmp", "only-here", "sub/.gitignore"]


def test_clustertoolignore_is_read_after_gitignore_and_overrides_it(tmp_path):
    root = tree(tmp_path / "proj", {
        ".gitignore": "*.csv\n", ".clustertoolignore": "!labels.csv\ncheckpoints/\n",
        "labels.csv": "", "raw.csv": "", "checkpoints/e1.pt": "", "train.py": "",
    })
    assert kept(root) == [".clustertoolignore", ".gitignore", "labels.csv", "train.py"]


def test_dot_git_is_never_sent(tmp_path):
    root = tree(tmp_path / "proj", {".git/HEAD": "ref", "sub/.git": "gitdir: x", "a.py": ""})
    assert kept(root) == ["a.py"]


def test_a_folder_inside_a_checkout_obeys_the_ignore_files_above_it(tmp_path):
    top = tree(tmp_path / "repo", {".git/HEAD": "", ".gitignore": "*.pyc\nsvc/cache/\n",
                                   "svc/a.py": "", "svc/a.pyc": "", "svc/cache/x": "", "other/b.pyc": ""})
    assert kept(top / "svc") == ["a.py"]


def test_ignored_folders_are_not_entered(tmp_path, monkeypatch):
    root = tree(tmp_path / "proj", {".gitignore": "node_modules/\n", "node_modules/x/y.js": "", "a.js": ""})
    entered = []
    real_walk = os.walk

    def spy(top, *args, **kwargs):
        for dirpath, dirnames, filenames in real_walk(top, *args, **kwargs):
            entered.append(os.path.relpath(dirpath, root))
            yield dirpath, dirnames, filenames

    monkeypatch.setattr(manifest.os, "walk", spy)
    matcher = ignore.Matcher(str(root))
    names = [e["p"] for e in local(str(root), keep=matcher.keep).entries.values()]
    assert sorted(names) == [".gitignore", "a.js"]
    assert entered == ["."]


def test_the_matcher_agrees_with_git_on_a_checkout(tmp_path):
    """git check-ignore is the reference where git exists: same answers on a mixed tree."""
    git = subprocess.run(["git", "--version"], capture_output=True)
    if git.returncode != 0:
        pytest.skip("git is not installed")
    files = {
        ".gitignore": "*.log\n!important.log\n/build/\ndocs/**/*.tmp\n[Tt]emp*\ncache/\n!cache/keep\n",
        "sub/.gitignore": "*.dat\n!keep.dat\n/local.txt\n",
        "a.log": "", "important.log": "", "build/x.o": "", "src/build/y.o": "", "docs/a/b/c.tmp": "",
        "docs/c.tmp": "", "Temp1": "", "temp2/z": "", "cache/keep": "", "sub/x.dat": "", "sub/keep.dat": "",
        "sub/local.txt": "", "local.txt": "", "sub/deeper/local.txt": "", "main.py": "",
    }
    root = tree(tmp_path / "repo", files)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    paths = [p for p in files if not p.endswith(".gitignore")]
    proc = subprocess.run(["git", "-C", str(root), "check-ignore", "--no-index", *paths],
                          capture_output=True, text=True)
    by_git = set(proc.stdout.split())
    matcher = ignore.Matcher(str(root))
    assert {p for p in paths if matcher.ignored(p)} == by_git

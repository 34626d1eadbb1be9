"""The Include line in ~/.ssh/config (issue 33): added once with a word at `up`, gone with the home's last
cluster, never for a home others could make again, and lines an earlier clustertool left are cleaned."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from clustertool.cluster import sshinclude
from clustertool.core import state
from clustertool.core.model import ClusterRecord

pytestmark = pytest.mark.unit
TMP = Path(tempfile.gettempdir())  # this suite's folders are under it: /tmp, which every user may write


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's HOME and a clustertool home; every folder under ``safe`` counts as one only they can write
    (this suite's own folders are under /tmp, which would make every path unsafe)."""
    home, ct = tmp_path / "user", tmp_path / "safe" / "cthome"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(ct))
    monkeypatch.delenv(sshinclude.OPT_OUT, raising=False)
    real = sshinclude.unsafe
    monkeypatch.setattr(sshinclude, "unsafe", lambda p: None if str(p).startswith(str(tmp_path / "safe"))
                        else real(p))
    return home / ".ssh" / "config"


def test_up_adds_the_include_once_says_so_and_down_of_the_last_cluster_takes_it_out(user):
    user.write_text("Host example\n  User someone\n")
    said: list[str] = []
    state.save(ClusterRecord("a", "local"))
    sshinclude.install(said.append)
    sshinclude.install(said.append)
    text = user.read_text()
    line = f"Include {state.clusters_dir()}/*/ssh_config"
    assert text == f"{sshinclude.COMMENT}\n{line}\n\nHost example\n  User someone\n"
    assert stat.S_IMODE(os.stat(user).st_mode) == 0o600 and sshinclude.active()
    assert len(said) == 1 and "CLUSTERTOOL_NO_SSH_INCLUDE=1" in said[0] and "~/.ssh/config" in said[0]
    state.save(ClusterRecord("b", "local"))
    state.delete("a")
    sshinclude.tidy()
    assert line in user.read_text()  # b is still there
    state.delete("b")
    sshinclude.tidy(said.append)
    assert user.read_text() == "Host example\n  User someone\n" and not sshinclude.active()
    assert said[-1].startswith("~/.ssh/config: took out the Include of ")


def test_a_home_under_a_folder_others_can_write_gets_no_include(user, tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path / "shared" / "cthome"))  # under /tmp: anyone may make it
    state.save(ClusterRecord("a", "local"))
    said: list[str] = []
    sshinclude.install(said.append)
    assert not user.exists() and not sshinclude.active()
    assert said[0].startswith(f"~/.ssh/config not edited: {TMP} is writable by other users, so an Include of ")
    assert "clustertool ssh -c NAME" in said[0]


def test_stale_includes_of_earlier_versions_are_cleaned_and_others_lines_kept(user, tmp_path):
    live = tmp_path / "safe" / "live"
    (live / "clusters").mkdir(parents=True)
    (live / "clusters" / "x.json").write_text("{}")
    gone = tmp_path / "safe" / "gone"  # a home that no longer exists
    under_tmp = tmp_path / "other"  # a home with clusters, in a folder others can write
    (under_tmp / "clusters").mkdir(parents=True)
    (under_tmp / "clusters" / "y.json").write_text("{}")
    blocks = [f"{sshinclude.COMMENT}\nInclude {h}/clusters/*/ssh_config\n\n" for h in (gone, live, under_tmp)]
    user.write_text("".join(blocks) + "Include ~/.ssh/mine\nHost example\n")
    text, removed = sshinclude.tidied(user.read_text())
    assert removed == [str(gone), str(under_tmp)]
    assert text == blocks[1] + "Include ~/.ssh/mine\nHost example\n"


def test_unsafe_names_the_folder_others_can_write_or_own(tmp_path):
    assert sshinclude.unsafe(tmp_path / "not" / "made") == f"{TMP} is writable by other users"
    if os.geteuid() == 0:
        theirs = Path("/run") / f"ct-test-theirs-{os.getpid()}"
        theirs.mkdir(mode=0o755)
        try:
            os.chown(theirs, 65534, 65534)
            assert sshinclude.unsafe(theirs / "home") == f"{theirs} belongs to another user"
        finally:
            theirs.rmdir()
        assert sshinclude.unsafe(Path("/root/.clustertool")) is None

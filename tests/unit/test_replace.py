"""`replace`: the refusals (machines clustertool did not make, adopted AWS instances, unknown node, no --yes without a
terminal) before anything is touched, the host key fingerprints (checked against ssh-keygen itself) and
the status lines a replacement leaves.  The replacement itself is in tests/local/test_replace.py."""

from __future__ import annotations

import subprocess

import pytest

from clustertool.cli.app import run
from clustertool.cluster import replace
from clustertool.cluster.session import ClusterSession
from clustertool.cluster.status import replacements
from clustertool.core import state
from clustertool.core.errors import NotSupported, UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.providers.aws.aws_provider import AwsProvider
from clustertool.remote.keys import fingerprint
from tests.fakes.cluster import saved_cluster

pytestmark = pytest.mark.unit


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_a_static_cluster_is_refused_in_one_line_with_cordon_as_the_hint(ct_env, capsys):
    saved_cluster("st", 3)
    before = state.load("st").to_dict()
    assert run(["replace", "node-3", "--yes", "-c", "st"]) != 0
    err = _errors(capsys)
    assert err[0] == ("error: cluster 'st' is made of machines clustertool did not make (static): "
                      "it cannot replace them")
    assert err[1:] == ["hint: `clustertool cordon node-3` keeps a bad one out of hostfiles and jobs"]
    assert state.load("st").to_dict() == before


def test_an_unknown_node_is_one_line_and_nothing_is_touched(ct_env, capsys):
    saved_cluster("lc", 3, provider="local")
    before = state.load("lc").to_dict()
    assert run(["replace", "node-9", "--yes", "-c", "lc"]) != 0
    err = _errors(capsys)
    assert err[0].startswith("error: ") and "node-9" in err[0] and len(err) <= 2
    assert "Traceback" not in "".join(err)
    assert state.load("lc").to_dict() == before


def test_without_yes_and_no_terminal_it_refuses_and_says_the_disk_is_lost(ct_env, capsys):
    saved_cluster("lc", 3, provider="local")
    assert run(["replace", "node-2", "-c", "lc"]) != 0
    err = _errors(capsys)
    assert err[0] == "error: refusing to replace node-2 without --yes (no terminal to ask on)"
    assert "disk is lost" in err[1]


def test_a_stopped_cluster_is_refused_with_start_as_the_hint(ct_env, capsys):
    c = saved_cluster("lc", 2, provider="local")
    c.status = "stopped"  # type: ignore[assignment]
    state.save(c)
    assert run(["replace", "node-2", "--yes", "-c", "lc"]) != 0
    assert _errors(capsys) == ["error: cluster 'lc' is stopped: replace needs a ready cluster",
                               "hint: `clustertool start -c lc` first"]


def test_aws_refuses_adopted_instances_and_keep_old_on_spot_before_any_aws_call():
    """No endpoint is configured here: a refusal that reached AWS would fail differently."""
    c = ClusterRecord("aw", "aws", status="ready", nodes=[Node("node-2", 2, "10.0.0.2", instance_id="i-1")],
                      provider_state={"adopted": ["i-1"]})
    with pytest.raises(NotSupported) as err:
        AwsProvider().replace_node(c, "node-2")
    assert "adopted instances" in err.value.message and "clustertool cordon node-2" in (err.value.hint or "")
    c.provider_state, c.options = {}, {"spot": True}
    with pytest.raises(UsageError) as usage:
        AwsProvider().replace_node(c, "node-2", keep_old=True)
    assert usage.value.message.startswith("--keep-old: one-time spot instances cannot be stopped")


class _Refusing:
    REPLACE_KEEPS_OLD = False  # like the local provider: the old machine goes first

    def owns_cluster(self, record):
        return True

    def confirm_owner(self, record, force, verb):
        pass

    def replace_node(self, record, node, keep_old=False):
        raise NotSupported("not here")


def test_a_provider_that_refuses_leaves_the_node_unmarked(ct_env, monkeypatch):
    saved_cluster("lc", 2, provider="local")
    session = ClusterSession(state.load("lc"))
    monkeypatch.setattr(ClusterSession, "provider", property(lambda self: _Refusing()))
    with pytest.raises(NotSupported):
        replace.replace(session, "node-2")
    assert "replace_failed" not in state.load("lc").node("node-2").extra


class _Failing(_Refusing):
    def replace_node(self, record, node, keep_old=False):
        raise RuntimeError("bridge gone")


def test_a_failed_replacement_marks_the_node_and_status_says_to_run_it_again(ct_env, monkeypatch):
    saved_cluster("lc", 2, provider="local")
    session = ClusterSession(state.load("lc"))
    monkeypatch.setattr(ClusterSession, "provider", property(lambda self: _Failing()))
    with pytest.raises(RuntimeError):
        replace.replace(session, "node-2")
    record = state.load("lc")
    lines = replacements(record, now=record.node("node-2").extra["replace_failed"]["at"] + 5)
    assert lines == {"node-2 replace": "FAILED 5s ago (RuntimeError: bridge gone); the node is down: "
                                       "`clustertool replace node-2` again"}


class _FailingAfterKeepingOld(_Failing):
    REPLACE_KEEPS_OLD = True  # like AWS: the new machine is made first, so a failure leaves the old one


def test_a_failed_replacement_that_kept_the_old_machine_says_the_node_is_unchanged(ct_env, monkeypatch):
    saved_cluster("lc", 2, provider="local")
    session = ClusterSession(state.load("lc"))
    monkeypatch.setattr(ClusterSession, "provider", property(lambda self: _FailingAfterKeepingOld()))
    with pytest.raises(RuntimeError):
        replace.replace(session, "node-2")
    record = state.load("lc")
    lines = replacements(record, now=record.node("node-2").extra["replace_failed"]["at"] + 5)
    assert lines == {"node-2 replace": "FAILED 5s ago (RuntimeError: bridge gone); the node is unchanged (its old "
                                       "machine runs): `clustertool replace node-2` again"}


def test_fingerprint_is_what_ssh_keygen_prints(tmp_path):
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "256", "-N", "", "-f", str(key)], check=True)
    printed = subprocess.run(["ssh-keygen", "-l", "-f", str(key) + ".pub"], capture_output=True, text=True,
                             check=True).stdout.split()[1]
    kind, blob = (tmp_path / "k.pub").read_text().split()[:2]
    assert fingerprint([f"{kind} {blob}"]) == printed
    assert fingerprint([]) is None and fingerprint(["ssh-ed25519 not*base64"]) is None


def test_status_names_the_new_and_the_old_host_key_of_a_replaced_node():
    c = ClusterRecord("lc", "local", nodes=[Node("node-1", 1, "10.0.0.1", role="leader"),
                                            Node("node-2", 2, "10.0.0.2", host_keys=["ssh-ed25519 AAAA"])])
    c.node("node-2").extra["replaced"] = {"at": 100.0, "old_host_key": "SHA256:old"}
    assert replacements(c, now=130.0) == {
        "node-2 replaced": f"30s ago; host key {fingerprint(['ssh-ed25519 AAAA'])} pinned (was SHA256:old)"}

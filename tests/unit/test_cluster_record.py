"""The cluster record's typed state: its status is a ClusterState, the core's flags are fields
(not keys in the provider's options), and state files written before that still load."""

from __future__ import annotations

import json

import pytest

from clustertool.core.model import ClusterRecord, ClusterState

pytestmark = pytest.mark.unit


def test_a_state_file_with_flags_in_options_loads_them_as_fields():
    old = {"name": "c", "provider": "aws", "status": "autostopped",
           "options": {"instance_type": "p4d.24xlarge", "no_ssh": True, "terminate_adopted": True,
                       "autostop": {"idle_s": 1800, "down": False, "wait_for": "jobs"}}}
    record = ClusterRecord.from_dict(old)
    assert record.status is ClusterState.AUTOSTOPPED
    assert record.no_ssh and record.terminate_adopted and record.autostop == {"idle_s": 1800, "down": False,
                                                                              "wait_for": "jobs"}
    assert record.options == {"instance_type": "p4d.24xlarge"}   # the provider's bag holds provider options only


def test_the_status_reads_and_writes_as_its_plain_value():
    record = ClusterRecord("c", "local", status=ClusterState.READY)
    saved = json.loads(json.dumps(record.to_dict()))
    assert saved["status"] == "ready" and f"{record.status}" == "ready" and str(record.status) == "ready"
    assert record.status == "ready"   # comparisons with the printed value still hold
    assert ClusterRecord.from_dict(saved).status is ClusterState.READY
    with pytest.raises(ValueError):
        ClusterRecord.from_dict(dict(saved, status="sleeping"))

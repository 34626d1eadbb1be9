"""`clustertool cost` through the real CLI: every cluster of the ledger, hours, approximate cost, total."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.cli


def _write(home, events):
    home.mkdir(parents=True, exist_ok=True)
    (home / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_cost_lists_live_and_gone_clusters_with_hours_cost_and_total(ct_env, tmp_path):
    now = time.time()
    h = 3600
    base = {"provider": "aws", "type": "p4d.24xlarge", "nodes": 4, "spot": False}
    _write(tmp_path / "cthome", [
        {**base, "t": now - 10 * h, "event": "up", "id": "train-1a2b3c", "name": "train"},
        {**base, "t": now - 8 * h, "event": "autostop", "id": "train-1a2b3c", "name": "train"},
        {**base, "t": now - 5 * h, "event": "down", "id": "train-1a2b3c", "name": "train"},
        {"t": now - 1 * h, "event": "up", "id": "demo-9f9f9f", "name": "demo", "provider": "local", "type": "local",
         "nodes": 2, "spot": False}])
    proc = run_cli("cost", "--json", env=ct_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rows = {c["name"]: c for c in data["clusters"]}
    assert rows["train"]["hours_up"] == pytest.approx(2.0, abs=0.01)
    assert rows["train"]["hours_stopped"] == pytest.approx(3.0, abs=0.01)
    assert rows["train"]["hours_saved"] == pytest.approx(3.0, abs=0.01)
    assert rows["train"]["cost_usd"] == pytest.approx(2 * 4 * 32.7726, abs=0.05)
    assert rows["demo"]["state"] == "running" and rows["demo"]["cost_usd"] == 0.0
    assert data["total_usd"] == pytest.approx(262.18, abs=0.05) and data["approximate"] is True

    table = run_cli("cost", env=ct_env)
    assert table.returncode == 0, table.stderr
    assert "train" in table.stdout and "demo" in table.stdout and "$262.18" in table.stdout
    assert "approximate" in table.stdout and "…" not in table.stdout

    since = run_cli("cost", "--since", time.strftime("%Y-%m-%d", time.gmtime(now + 86400)), "--json", env=ct_env)
    assert [c["name"] for c in json.loads(since.stdout)["clusters"]] == ["demo"]  # train ended before that date
    bad = run_cli("cost", "--since", "last tuesday", env=ct_env)
    assert bad.returncode != 0 and "invalid --since" in bad.stderr and "Traceback" not in bad.stderr

"""Stragglers end to end: real clustertool-reducer processes, the real plugin's ``servers`` allreduce (ctypes)
under real Open MPI on localhost, one rank slowed on purpose; the reducers' lateness records name it.

The record is written by the reducer (native/src/ct_reducer_session.c, CLUSTERTOOL_STRAGGLERS_DIR); until the
reducer of this checkout writes it, the test is skipped and says so.  CLUSTERTOOL_TEST_REDUCER names another
reducer binary (a build with the record) to test against."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertool.nodeprogs import watchlate
from tests.conftest import REPO
from tests.native.test_plugin_allreduce import _mpirun, built  # noqa: F401  (the fixture)

pytestmark = pytest.mark.native
DRIVER = REPO / "tests" / "native" / "mpi_slow_rank_allreduce.py"
RECORD_ENV = "CLUSTERTOOL_STRAGGLERS_DIR"   # where the reducer writes its sessions' records


@pytest.fixture
def reducer_binary(built) -> Path:  # noqa: F811  (the imported fixture)
    path = Path(os.environ.get("CLUSTERTOOL_TEST_REDUCER") or built / "clustertool-reducer")
    if RECORD_ENV.encode() not in path.read_bytes():
        pytest.skip(f"{path} writes no lateness record yet (CLUSTERTOOL_STRAGGLERS_DIR: the reducer's straggler "
                    "record, not applied to native/ yet)")
    return path


def start_reducer(binary: Path, folder: Path, name: str, records: Path) -> tuple[subprocess.Popen, str]:
    port = folder / f"{name}.port"
    env = dict(os.environ, **{RECORD_ENV: str(records)})
    with open(folder / f"{name}.log", "wb") as log:
        proc = subprocess.Popen([str(binary), "--bind", "127.0.0.1", "--port-file", str(port)], stderr=log, env=env)
    deadline = time.monotonic() + 10
    while not (port.exists() and port.read_text().endswith("\n")):
        assert proc.poll() is None and time.monotonic() < deadline, (folder / f"{name}.log").read_text()
        time.sleep(0.02)
    return proc, port.read_text().strip()


def test_the_reducers_name_the_rank_slowed_on_purpose(reducer_binary, tmp_path):
    records = tmp_path / "stragglers"
    started = [start_reducer(reducer_binary, tmp_path, f"r{i}", records) for i in range(2)]
    try:
        # 120 ms late each time: above the scheduling noise of a 2-core box at load 38, where a 30 ms delay was
        # out-waited by an unslowed rank in half the requests (the signal, not a wait: nothing here sleeps to sync)
        proc = _mpirun(4, [sys.executable, str(DRIVER), "40", "2", "120"],
                       {"CLUSTERTOOL_REDUCERS": ",".join(addr for _, addr in started)})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["servers"] == 2
    finally:
        for reducer, _ in started:
            reducer.send_signal(signal.SIGTERM)
            assert reducer.wait(timeout=30) == 0
    files = sorted(records.glob("*.jsonl"))
    assert len(files) == 2, files   # one session on each reducer
    last = [json.loads(f.read_text().splitlines()[-1]) for f in files]
    assert all(doc["final"] and doc["nranks"] == 4 and doc["requests"] > 60 for doc in last)
    assert sorted(doc["reducer"].rsplit(":", 1)[1] for doc in last) == ["0", "1"]
    workers, bounds = watchlate.merge(last)
    rows = watchlate.summary(workers, bounds)
    assert rows[0]["worker"] == "2" and rows[0]["straggler"], rows   # who made the others wait most
    assert [r["worker"] for r in rows if r["straggler"]] == ["2"], rows
    assert rows[0]["p50_us"] >= 8_000 and rows[0]["last_share"] > 0.5   # ~120 ms late, last nearly always
    assert all(r["peer"].startswith("127.0.0.1:") for r in rows)

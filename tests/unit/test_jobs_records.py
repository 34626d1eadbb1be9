"""Which job a command takes when it is given none: `logs` the latest, `attach` the latest running."""

import pytest

from clustertool.core.errors import UsageError
from clustertool.core.model import JobRecord
from clustertool.jobs import records

pytestmark = pytest.mark.unit


def _job(job_id: str, started: float, state: str) -> JobRecord:
    return JobRecord(id=job_id, cluster="c", command=["python", "t.py"], argv=[], nodes=["node-1"], np=1,
                     started=started, state=state)


JOBS = [_job("j1", 100.0, "succeeded"), _job("j3", 300.0, "failed"), _job("j2", 200.0, "running")]


def test_logs_takes_the_job_started_last_whatever_its_state():
    assert records.latest(JOBS, "c").id == "j3"


def test_attach_takes_the_latest_running_job():
    assert records.latest(JOBS, "c", running=True).id == "j2"


def test_the_pick_is_said_with_how_many_others_there_are():
    line = records.picked_line(JOBS[1], 2)
    assert line.startswith("job j3 (failed, started ") and line.endswith("the latest; 2 others: `clustertool jobs`)")


def test_no_job_at_all_says_how_to_start_one():
    with pytest.raises(UsageError) as err:
        records.latest([], "demo")
    assert err.value.message == "no job on cluster 'demo'"
    assert err.value.hint == "start one: clustertool run -c demo -- python train.py"


def test_no_running_job_points_at_the_list():
    with pytest.raises(UsageError) as err:
        records.latest(JOBS[:2], "demo", running=True)
    assert err.value.message == "no running job on cluster 'demo'"
    assert "clustertool jobs -c demo" in err.value.hint

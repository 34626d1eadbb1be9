"""Why a job failed, from what its nodes kept: the agents' and the supervisor's records, and Open MPI
4.1's own messages (copied from real runs on a local cluster: `mpirun` 4.1.4, Debian)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest

from clustertool import nodeprogs
from clustertool.jobs.failure import first, from_mpirun_log, parse_gathered, text

pytestmark = pytest.mark.unit

NONZERO = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[40166,1],3]
  Exit code:    3
--------------------------------------------------------------------------
"""
SIGNALED = """--------------------------------------------------------------------------
mpirun noticed that process rank 3 with PID 631 on node 10.213.0.2 exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""
LOST = """--------------------------------------------------------------------------
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[37477,0],0] on node node-1
  Remote daemon: [[37477,0],1] on node 10.213.0.2

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""


def test_mpiruns_own_words_name_the_first_rank_and_how():
    assert from_mpirun_log("rank output\n" + NONZERO) == {"rank": 3, "code": 3, "signal": None}
    assert from_mpirun_log(SIGNALED) == {"rank": 3, "code": None, "signal": 9}
    assert from_mpirun_log(LOST) == {"kind": "lost", "address": "10.213.0.2", "rank": None}
    assert from_mpirun_log("all went well\n") is None


def b64(doc) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


def test_the_earliest_failure_across_nodes_is_the_first_not_the_ones_it_caused():
    gathered = {
        "node-1": f"failure {b64({'rank': 1, 'code': 1, 'time': 105.0, 'tail': ['Connection closed by peer']})}\n"
                  "ranks 0 1\nlog " + base64.b64encode(b"mpirun said things").decode(),
        "node-3": f"failure {b64({'rank': 5, 'code': 3, 'time': 100.0, 'tail': ['ValueError: bad batch']})}\n"
                  "ranks 4 5\n",
        "node-2": "ranks 2 3\n",
    }
    found, where, log = parse_gathered(gathered)
    assert where == {0: "node-1", 1: "node-1", 2: "node-2", 3: "node-2", 4: "node-3", 5: "node-3"}
    assert log == "mpirun said things"
    chosen = first(found)
    assert (chosen["rank"], chosen["node"]) == (5, "node-3")
    assert text(chosen) == "rank 5 on node-3 exited 3: ValueError: bad batch"


def test_a_rank_sigkilled_by_nobody_of_ours_is_first_though_a_peer_failing_of_it_was_stamped_earlier():
    """On a starved box rank 5's runner may see its SIGKILL after rank 6 (another node) already failed of
    the closed connection and was stamped: the unprompted SIGKILL is the cause, within 5 s."""
    gathered = {
        "node-4": f"failure {b64({'rank': 6, 'code': 1, 'time': 100.0, 'tail': ['Connection reset by peer']})}\n",
        "node-3": f"failure {b64({'rank': 5, 'code': None, 'signal': 9, 'time': 100.8, 'tail': []})}\n",
    }
    chosen = first(parse_gathered(gathered)[0])
    assert text(chosen) == "rank 5 on node-3 killed by signal 9"
    # a SIGKILL long after the first failure is not what started it; nor is one of ours (stopped)
    gathered["node-3"] = f"failure {b64({'rank': 5, 'code': None, 'signal': 9, 'time': 130.0, 'tail': []})}\n"
    assert first(parse_gathered(gathered)[0])["rank"] == 6
    gathered["node-3"] = f"failure {b64({'rank': 5, 'signal': 9, 'time': 100.5, 'stopped': True})}\n"
    assert first(parse_gathered(gathered)[0])["rank"] == 6
    # and a peer's abort (gloo's teardown) is not preferred: only the earliest stamp counts then
    gathered["node-3"] = f"failure {b64({'rank': 5, 'code': None, 'signal': 6, 'time': 100.5, 'tail': []})}\n"
    assert first(parse_gathered(gathered)[0])["rank"] == 6


def test_the_agent_names_its_nodes_unprompted_sigkill_first_too(tmp_path):
    """The same rule on one node: the agent's own first_failure (what it writes as ``failure``)."""
    shutil.copy(os.path.join(str(nodeprogs.DIR), "jobagent.py"), tmp_path / "jobagent.py")
    exits = tmp_path / "exits"
    exits.mkdir()
    node = os.uname().nodename
    for rank, code, sig, at in ((4, 1, None, 50.0), (5, None, 9, 50.9), (6, 0, None, 49.0)):
        (exits / f"{node}.{rank}").write_text(json.dumps({"rank": rank, "node": node, "code": code, "signal": sig,
                                                          "time": at, "stopped": False}))
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import jobagent; "
             "print(json.dumps(jobagent.first_failure(sys.argv[2], 1)))")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path), str(tmp_path / "out")], capture_output=True,
                         text=True, check=True).stdout
    assert (json.loads(out)["rank"], json.loads(out)["signal"]) == (5, 9)
    (exits / f"{node}.5").write_text(json.dumps({"rank": 5, "node": node, "code": None, "signal": 9, "time": 58.0,
                                                 "stopped": False}))
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path), str(tmp_path / "out")], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out)["rank"] == 4


def test_a_lost_node_and_a_hang_read_as_such():
    found, _, _ = parse_gathered({"node-1": f"lost {b64({'node': 'node-4', 'time': 7.0, 'what': 'x'})}\n"})
    assert text(first(found)) == "node-4 stopped answering"
    both = {"node-1": f"lost {b64({'node': 'node-4', 'time': 9.0})}\n",
            "node-2": f"failure {b64({'rank': 2, 'code': 1, 'time': 8.0, 'tail': ['Connection closed by peer']})}\n"}
    assert text(first(parse_gathered(both)[0])) == "node-4 stopped answering"   # its peers failed of it
    found, _, _ = parse_gathered({"node-1": f"lost {b64({'node': None, 'time': 7.0, 'kind': 'hung'})}\n"})
    assert text(first(found)).startswith("hung:")
    assert text({"rank": 2, "node": "n", "signal": 9, "code": None}) == "rank 2 on n killed by signal 9"
    assert text({"unknown": True}) == "" and text(None) == ""


def test_the_agent_reads_deepspeed_env_files_as_deepspeed_does(tmp_path):
    """Home first, then the working folder (which wins); DS_ENV_FILE renames the file."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\nSHARED=home\n# a comment\n")
    (work / ".deepspeed_env").write_text("SHARED=work\nEQ=a=b\n")
    (work / "other_env").write_text("OTHER=1\n")
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import jobagent; "
             "print(json.dumps([jobagent.deepspeed_env({}), jobagent.deepspeed_env({'DS_ENV_FILE': 'other_env'})]))")
    out = subprocess.run([sys.executable, "-c", probe, str(nodeprogs.DIR)], cwd=work, capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)), check=True).stdout
    plain, renamed = json.loads(out)
    assert plain == {"NCCL_IB_DISABLE": "1", "SHARED": "work", "EQ": "a=b"}
    assert renamed == {"OTHER": "1"}

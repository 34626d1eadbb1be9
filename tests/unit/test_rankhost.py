"""A Python rank that ended well ends its process well (issue 33: a correct DDP script died of signal 6,
"terminate called without an active exception", after its last line, once in tens of runs).

The stand-in for PyTorch's teardown: a C-level exit handler that aborts, which runs where C++'s static
destructors run (exit(3), after the interpreter's own finalisation): what the rank host skips, and the
only thing it skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from clustertool import nodeprogs
from clustertool.jobs.mpirun import RANK_WRAPPER
from clustertool.jobs.scripts import rank_host
from clustertool.nodeprogs import jobagent

pytestmark = pytest.mark.unit
HOST = str(nodeprogs.DIR / "rankhost.py")

ABORTS_AT_EXIT = textwrap.dedent('''
    import atexit, ctypes, sys, threading, time
    libc = ctypes.CDLL(None)  # as a C++ destructor that finds a thread still running: after the interpreter is done
    libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
    print("last line", __name__, sys.argv[1:], sys.path[0] == __import__("os").path.dirname(__file__), flush=True)
''')


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def test_without_the_host_the_teardown_kills_a_script_that_ended_well(tmp_path):
    (tmp_path / "train.py").write_text(ABORTS_AT_EXIT)
    proc = _run([sys.executable, str(tmp_path / "train.py"), "--lr", "1"])
    assert proc.returncode == -6 and "last line" in proc.stdout  # the stand-in does what PyTorch's did


def test_under_the_host_it_ends_well_threads_waited_for_atexit_run(tmp_path):
    (tmp_path / "train.py").write_text(ABORTS_AT_EXIT)
    proc = _run([sys.executable, HOST, str(tmp_path / "train.py"), "--lr", "1"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["last line __main__ ['--lr', '1'] True", "thread done", "atexit ran"]


def test_an_error_reads_as_under_plain_python(tmp_path):
    (tmp_path / "t.py").write_text("def step():\n    raise RuntimeError('bad batch')\n\nstep()\n")
    plain = _run([sys.executable, str(tmp_path / "t.py")])
    hosted = _run([sys.executable, HOST, str(tmp_path / "t.py")])
    assert hosted.returncode == plain.returncode == 1 and hosted.stderr == plain.stderr
    missing = _run([sys.executable, HOST, str(tmp_path / "nope.py")])
    assert missing.returncode == 2 and missing.stderr.endswith("nope.py': [Errno 2] No such file or directory\n")


@pytest.mark.parametrize("ending,code,says", [
    ("raise RuntimeError('bad batch')", 1, "RuntimeError: bad batch"),
    ("import sys; sys.exit(3)", 3, ""),
])
def test_any_other_end_goes_the_usual_way(tmp_path, ending, code, says):
    (tmp_path / "t.py").write_text(ending + "\n")
    proc = _run([sys.executable, HOST, str(tmp_path / "t.py")])
    assert proc.returncode == code and says in proc.stderr


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    proc = _run([sys.executable, HOST, "-m", "pkg.train", "x"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "__main__ ['x']\n", proc.stderr


def test_the_rank_wrapper_runs_a_python_script_rank_under_the_host(tmp_path):
    home = tmp_path / "home"
    host = home / rank_host()
    host.parent.mkdir(parents=True)
    host.write_text(open(HOST).read())
    (tmp_path / "train.py").write_text(ABORTS_AT_EXIT)
    env = {"HOME": str(home), "CLUSTERTOOL_JOB": "j1-abc", "OMPI_COMM_WORLD_RANK": "0", "PATH": os.environ["PATH"],
           "CLUSTERTOOL_RANK_HOST": rank_host()}
    proc = _run(["sh", "-c", RANK_WRAPPER, "ct-rank", sys.executable, str(tmp_path / "train.py")], env=env)
    assert proc.returncode == 0 and "atexit ran" in proc.stdout, proc.stderr
    shell = _run(["sh", "-c", RANK_WRAPPER, "ct-rank", "sh", "-c", 'echo "${CLUSTERTOOL_RANK_HOST:-unset}"'], env=env)
    assert shell.stdout == "unset\n"  # not a Python script: run as it is, and the variable does not leak


def test_the_job_agent_runs_python_ranks_under_the_host(tmp_path):
    assert jobagent.rank_command({"mode": "python", "target": "t.py"}, ["--lr", "1"], "/h/rh.py") == \
        [sys.executable, "-u", "/h/rh.py", "t.py", "--lr", "1"]
    module = jobagent.rank_command({"mode": "module", "target": "pkg.t"}, [], "/h/rh.py")
    assert module[2:] == ["/h/rh.py", "-m", "pkg.t"]
    assert jobagent.rank_command({"mode": "exec", "argv": ["python3", "t.py"]}, [], "/h/rh.py") == \
        ["python3", "/h/rh.py", "t.py"]
    assert jobagent.rank_command({"mode": "exec", "argv": ["./run.sh"]}, [], "/h/rh.py") == ["./run.sh"]
    assert jobagent.rank_command({"mode": "python", "target": "t.py"}, [], None) == [sys.executable, "-u", "t.py"]


MPI_SCRIPT = textwrap.dedent('''
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    open(f"rank.{MPI.COMM_WORLD.Get_rank()}", "w").write("done")
''')


def test_an_mpi4py_rank_under_the_host_finalizes_so_mpirun_succeeds(tmp_path):
    """mpi4py finalises MPI in the interpreter's own teardown, which the host skips: the host calls MPI_Finalize
    itself, else real Open MPI's mpirun fails a job whose every rank ended well (exit 1, "exiting improperly")."""
    pytest.importorskip("mpi4py", reason="needs mpi4py (the dev extra)")
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (`make apt`)")
    (tmp_path / "train.py").write_text(MPI_SCRIPT)
    proc = _run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, HOST,
                 str(tmp_path / "train.py")], cwd=tmp_path)
    assert proc.returncode == 0 and "improperly" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert [(tmp_path / f"rank.{r}").read_text() for r in (0, 1)] == ["done", "done"]   # both ran to the end

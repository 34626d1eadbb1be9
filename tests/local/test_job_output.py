"""A job's output in whole lines, on a real 4-node x 2-slot local cluster with real Open MPI.

Before per-rank files, `run --follow` of 8 ranks that each print one line with
``print(..., flush=True)`` (two writes under PYTHONUNBUFFERED=1) showed lines run together
(``[1,3]<stdout>:rank 3 on node-2[1,0]<stdout>:rank 0 on node-1``) and lone tags; with many
lines, mpirun also dropped some.  These tests pin: every line arrives whole, tagged with its
rank and stream, exactly once, in `run --follow`, `logs -f` and `logs`.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.local.conftest import module_cluster

pytestmark = pytest.mark.local

LINES = 2000

# Each rank: LINES lines, every third on stderr, every 50th longer than 4 KiB, every fifth in
# three writes; each line says what it must contain, so a cut or glued line is caught.
SPAM = r'''
import os, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for i in range(int(sys.argv[1])):
    stream = sys.stderr if i % 3 == 0 else sys.stdout
    size = 5000 + (i % 7) * 1000 if i % 50 == 7 else 20 + (i * 7919 + rank) % 120
    body = (f"{rank}-{i}-" * (size // 4 + 2))[:size]
    head = f"line rank={rank} i={i} n={size} "
    if i % 5 == 1:
        stream.write(head); stream.flush(); stream.write(body[:size // 2]); stream.flush()
        stream.write(body[size // 2:] + "\n"); stream.flush()
    else:
        print(head + body, file=stream, flush=True)
'''
HELLO = """import os, socket
print(f"rank {os.environ['OMPI_COMM_WORLD_RANK']} on {socket.gethostname()}", flush=True)
"""
LINE_RE = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:line rank=(\d+) i=(\d+) n=(\d+) (.*)$")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "out", "--slots", "2")


@pytest.fixture(scope="module")
def programs():
    """The programs where every node sees them (nodes share the host's /var/tmp)."""
    folder = Path("/var/tmp") / f"ct-test-out-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "spam.py").write_text(SPAM)
    (folder / "hello.py").write_text(HELLO)
    yield folder
    shutil.rmtree(folder)


def cli(cluster, *args, timeout=180):
    name, env = cluster
    return run_cli(*args[:1], "-c", name, *args[1:], env=env, timeout=timeout)


def check_whole(stdout: str, ranks=range(8)) -> None:
    """Every rank's LINES lines, each once, whole, tagged with its rank and the right stream."""
    seen: dict[tuple[int, int], int] = {}
    for line in stdout.splitlines():
        m = LINE_RE.match(line)
        if not m:
            assert "line rank=" not in line, f"a cut or glued line: {line[:200]!r}"
            continue  # mpirun's own (untagged) lines
        tag_rank, stream, rank, i, size, body = m.groups()
        rank, i, size = int(rank), int(i), int(size)
        assert int(tag_rank) == rank and stream == ("stderr" if i % 3 == 0 else "stdout"), line[:200]
        assert body == (f"{rank}-{i}-" * (size // 4 + 2))[:size], f"line {i} of rank {rank} is not whole"
        seen[(rank, i)] = seen.get((rank, i), 0) + 1
    assert seen == {(r, i): 1 for r in ranks for i in range(LINES)}


def test_one_line_per_rank_with_print_flush_arrives_whole(cluster, programs):
    for _ in range(2):  # the old way broke some of the 8 lines every time
        proc = cli(cluster, "run", "--follow", "--", "python3", str(programs / "hello.py"))
        assert proc.returncode == 0, proc.stderr
        # (mpirun may add its own untagged warnings, e.g. "[node-1:81] plm:rsh: Warning: setpgid ...")
        lines = [ln for ln in proc.stdout.splitlines() if re.match(r"\[1,\d+\]<", ln) or "rank " in ln]
        assert sorted(lines) == [f"[1,{r}]<stdout>:rank {r} on node-{r // 2 + 1}" for r in range(8)]


def test_eight_ranks_writing_thousands_of_lines_fast_arrive_whole_and_tagged(cluster, programs):
    followed = cli(cluster, "run", "--follow", "--name", "spam", "--", "python3", str(programs / "spam.py"),
                   str(LINES))
    assert followed.returncode == 0, followed.stderr[-2000:]
    check_whole(followed.stdout)
    check_whole(cli(cluster, "logs", "spam").stdout)
    again = cli(cluster, "logs", "-f", "spam")  # a finished job: everything, then its exit code
    assert again.returncode == 0
    check_whole(again.stdout)
    one = cli(cluster, "logs", "spam", "--rank", "3")
    check_whole(one.stdout, ranks=[3])
    assert all(ln.startswith("[1,3]<") for ln in one.stdout.splitlines())
    node = cli(cluster, "logs", "spam", "--node", "node-2")
    check_whole(node.stdout, ranks=[2, 3])
    tail = cli(cluster, "logs", "spam", "--rank", "0", "--tail", "2").stdout.splitlines()
    assert [LINE_RE.match(ln).group(4) for ln in tail] == ["1997", "1999", "1995", "1998"]  # stdout's, stderr's


def test_a_partial_last_line_waits_for_its_newline_then_the_end_of_the_job(cluster):
    prog = ('printf "start-$OMPI_COMM_WORLD_RANK "; sleep 1.5; printf "end\\n"; sleep 1; '
            'printf "no newline $OMPI_COMM_WORLD_RANK"')
    proc = cli(cluster, "run", "--follow", "--np", "4", "--", "sh", "-c", prog)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"\[1,\d+\]<", ln) or "start-" in ln]
    assert sorted(lines) == sorted([f"[1,{r}]<stdout>:start-{r} end" for r in range(4)] +
                                   [f"[1,{r}]<stdout>:no newline {r}" for r in range(4)])


def test_a_job_from_before_per_rank_files_is_read_from_its_log(cluster):
    """Records written before per-rank output have no output_dir: `logs` reads the leader's log."""
    job_id = f"j0101-{uuid.uuid4().hex[:6]}"
    record = {"id": job_id, "cluster": cluster[0], "command": ["hostname"], "nodes": ["node-1", "node-2"], "np": 2,
              "leader": "node-1", "launcher": "tmux", "started": 1.0}
    log = "[1,0]<stdout>:node-1\n[1,1]<stdout>:node-2\nmpirun: a message of its own\n"
    b64 = base64.b64encode(json.dumps(record).encode()).decode()
    setup = (f'd="$HOME/.clustertool/jobs/{job_id}"; mkdir -p "$d"; echo {b64} | base64 -d > "$d/job.json"; '
             f'printf %s {base64.b64encode(log.encode()).decode()} | base64 -d > "$d/log"; echo 0 > "$d/exit"')
    assert cli(cluster, "exec", "-n", "leader", "--", setup).returncode == 0
    assert cli(cluster, "logs", job_id).stdout == log
    assert cli(cluster, "logs", job_id, "--rank", "1").stdout == "[1,1]<stdout>:node-2\n"
    assert cli(cluster, "logs", job_id, "-f").stdout == log


def test_clean_logs_removes_every_nodes_rank_files(cluster, programs):
    proc = cli(cluster, "run", "--follow", "--name", "tidy", "--", "python3", str(programs / "hello.py"))
    assert proc.returncode == 0
    assert cli(cluster, "clean", "--logs").returncode == 0
    gone = cli(cluster, "logs", "tidy")
    assert gone.returncode != 0 and "no output for job" in gone.stderr and "Traceback" not in gone.stderr
    left = cli(cluster, "exec", "--json", "--", "ls -d ~/.clustertool/jobs/*/out 2>/dev/null | wc -l")
    assert [r["stdout"].strip() for r in json.loads(left.stdout)["results"]] == ["0"] * 4

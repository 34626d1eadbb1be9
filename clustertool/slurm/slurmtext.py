"""Parsers of Slurm's fixed text formats (``scontrol --json`` does not exist in 22.05, and the JSON
shapes change between releases; these texts have stayed put from 21.08 to 23.11).

- ``key_values``/``records``: ``scontrol show node|job`` (blocks of ``Key=Value`` words, a blank
  line between records), ``slurmd -C``, ``scontrol -o`` one-liners and jobcomp/filetxt lines.  A
  value may hold spaces (``OS=Linux 6.1 #1 SMP``); the words that take the rest of their line
  (``Reason=``, ``Command=``, ``WorkDir=`` ...) may hold anything, ``=`` included.
- ``sinfo_nodes``, ``squeue_jobs``, ``sacct_jobs``: the ``|``-separated formats of ``slurmcmd``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustertool.slurm import SlurmError
from clustertool.slurm.slurmcmd import SACCT_FIELDS, SEP, SINFO_NODE_FIELDS, SQUEUE_FIELDS
from clustertool.slurm.slurmconf import NodeSize

# Words whose value is the rest of the line in scontrol's multi-line output.
LINE_KEYS = ("Reason", "Comment", "Extra", "Command", "WorkDir", "StdErr", "StdIn", "StdOut", "OS",
             "AdminComment", "SystemComment", "Prefer")
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.()]*)=")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
STATE_FLAGS = "*~#!%$@^-+"  # sinfo's suffixes: * not responding, ~ powered off, # powering up ... (node_state_string)


def key_values(text: str) -> dict[str, str]:
    """One record's ``Key=Value`` words (a later duplicate key keeps the first value).  A line that
    starts with a rest-of-line word (scontrol's multi-line output) is that one value; elsewhere (a
    one-liner, a jobcomp line) a value ends where the next ``Key=`` word starts."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        head = stripped.split("=", 1)[0]
        if head in LINE_KEYS and "=" in stripped:
            values.setdefault(head, stripped.split("=", 1)[1])
            continue
        for key, value in _line_pairs(stripped):
            values.setdefault(key, value)
    return values


def _line_pairs(line: str) -> list[tuple[str, str]]:
    matches = list(_KEY.finditer(line))
    pairs = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        pairs.append((match.group(1), line[match.end():end].strip()))
    return pairs


def records(text: str) -> list[dict[str, str]]:
    """``scontrol show ...``: one dict per record (records are separated by blank lines; with
    ``-o``, one per line)."""
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append("\n".join(current))
            current = []
        elif current and not line[0].isspace() and _starts_record(line):
            blocks.append("\n".join(current))
            current = [line]
        else:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return [key_values(b) for b in blocks if b.strip()]


def _starts_record(line: str) -> bool:
    return line.startswith(("NodeName=", "JobId=", "PartitionName="))


# ---- slurmd -C and versions ----------------------------------------------------------------------

def node_size(text: str) -> NodeSize:
    """``slurmd -C``'s first line: NodeName=... CPUs=... Boards=... RealMemory=..."""
    values = key_values(text)
    try:
        return NodeSize(cpus=int(values["CPUs"]), boards=int(values["Boards"]),
                        sockets_per_board=int(values["SocketsPerBoard"]),
                        cores_per_socket=int(values["CoresPerSocket"]),
                        threads_per_core=int(values["ThreadsPerCore"]), real_memory=int(values["RealMemory"]))
    except (KeyError, ValueError):
        raise SlurmError(f"not what slurmd -C prints: {text.strip()[:200]!r}") from None


def version(text: str) -> tuple[int, int, int]:
    """``slurmd -V`` / ``sinfo -V`` (``slurm 23.11.4``, ``slurm-wlm 22.05.8``) -> (23, 11, 4)."""
    match = _VERSION.search(text)
    if not match:
        raise SlurmError(f"not a Slurm version: {text.strip()[:80]!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def release_text(release: tuple[int, int, int]) -> str:
    """(22, 5, 8) -> ``22.05.8``, as Slurm names its releases."""
    return f"{release[0]}.{release[1]:02d}.{release[2]}"


# ---- states and exit codes -------------------------------------------------------------------------

def split_state(state: str) -> tuple[str, str]:
    """``drained*`` -> (``drained``, ``*``); ``IDLE+DRAIN`` (scontrol's complete state) -> (``idle+drain``, "")."""
    word = state.strip().lower()
    base = word.rstrip(STATE_FLAGS) if "+" not in word else word
    return base, word[len(base):]


def exit_code(text: str) -> tuple[int, int]:
    """``ExitCode=2:0`` -> (2, 0): the exit status and the signal that ended the job."""
    code, _, signal = text.strip().partition(":")
    try:
        return int(code), int(signal or 0)
    except ValueError:
        raise SlurmError(f"not an exit code: {text!r}") from None


def user_name(text: str) -> str:
    """``UserId=alice(1000)`` -> ``alice``."""
    return text.split("(", 1)[0]


# ---- sinfo / squeue / sacct -----------------------------------------------------------------------

@dataclass(frozen=True)
class SinfoNode:
    name: str
    partition: str
    state: str          # idle, allocated, mixed, drained, draining, down ... (lower case, no flag)
    flags: str          # "*": not responding, "~": powered down ... ("" for none)
    gres: str
    cpus: int
    memory: int
    reason: str         # "none" when there is none
    default_partition: bool = False

    @property
    def idle(self) -> bool:
        return self.state == "idle" and not self.flags


def _fields(text: str, count: int, what: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(SEP, count - 1)
        if len(parts) != count:
            raise SlurmError(f"not {what}'s format: {line[:200]!r}")
        rows.append(parts)
    return rows


def sinfo_nodes(text: str) -> list[SinfoNode]:
    out = []
    for name, part, state, gres, cpus, memory, reason in _fields(text, len(SINFO_NODE_FIELDS), "sinfo"):
        base, flags = split_state(state)
        out.append(SinfoNode(name=name.strip(), partition=part.strip().rstrip("*"), state=base, flags=flags,
                             gres=gres.strip(), cpus=_int(cpus), memory=_int(memory), reason=reason.strip(),
                             default_partition=part.strip().endswith("*")))
    return out


@dataclass(frozen=True)
class QueuedJob:
    id: str
    state: str       # PENDING, RUNNING, COMPLETING ...
    reason: str      # why it waits: Resources, Priority, Dependency, ReqNodeNotAvail, ... ("None" when running)
    user: str
    nodes: int
    nodelist: str
    submitted: str
    started: str
    name: str

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


def squeue_jobs(text: str) -> list[QueuedJob]:
    return [QueuedJob(id=i.strip(), state=st.strip(), reason=r.strip(), user=u.strip(), nodes=_int(n),
                      nodelist=nl.strip(), submitted=sub.strip(), started=sta.strip(), name=name)
            for i, st, r, u, n, nl, sub, sta, name in _fields(text, len(SQUEUE_FIELDS), "squeue")]


@dataclass(frozen=True)
class AccountedJob:
    id: str
    state: str          # COMPLETED, FAILED, CANCELLED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY ...
    cancelled_by: str | None
    exit_code: int
    signal: int
    user: str
    nodes: int
    nodelist: str
    started: str
    ended: str
    name: str


def sacct_jobs(text: str) -> list[AccountedJob]:
    out = []
    for jid, state, code, user, nnodes, nodelist, start, end, name in _fields(text, len(SACCT_FIELDS), "sacct"):
        word, _, by = state.partition(" by ")
        status, signal = exit_code(code)
        out.append(AccountedJob(id=jid, state=word, cancelled_by=by or None, exit_code=status, signal=signal,
                                user=user, nodes=_int(nnodes), nodelist=nodelist, started=start, ended=end,
                                name=name))
    return out


def _int(text: str) -> int:
    digits = text.strip().rstrip("+")
    return int(digits) if digits.isdigit() else 0


# ---- scontrol show node / job, jobcomp -------------------------------------------------------------

@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str       # scontrol's complete state, lower case: idle, allocated, idle+drain, down*+drain ...
    reason: str      # "" when none; Slurm appends " [user@time]"
    gres: str
    address: str
    version: str
    partitions: str

    @property
    def drained(self) -> bool:
        return "drain" in self.state


def node_info(record: dict[str, str]) -> NodeInfo:
    return NodeInfo(name=record.get("NodeName", ""), state=record.get("State", "").lower(),
                    reason=record.get("Reason", ""), gres=record.get("Gres", ""),
                    address=record.get("NodeAddr", ""), version=record.get("Version", ""),
                    partitions=record.get("Partitions", ""))


@dataclass(frozen=True)
class JobInfo:
    id: str
    name: str
    user: str
    state: str        # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, REQUEUED ...
    reason: str
    exit_code: int
    signal: int
    restarts: int
    nodelist: str
    batch_host: str
    stdout: str
    stderr: str
    workdir: str


def job_info(record: dict[str, str]) -> JobInfo:
    """A job from ``scontrol show job`` (or a jobcomp/filetxt line, which names some fields otherwise)."""
    status, signal = exit_code(record.get("ExitCode", "0:0"))
    return JobInfo(id=record.get("JobId", ""), name=record.get("JobName", record.get("Name", "")),
                   user=user_name(record.get("UserId", "")), state=record.get("JobState", ""),
                   reason=record.get("Reason", ""), exit_code=status, signal=signal,
                   restarts=_int(record.get("Restarts", "0")), nodelist=record.get("NodeList", ""),
                   batch_host=record.get("BatchHost", ""), stdout=record.get("StdOut", ""),
                   stderr=record.get("StdErr", ""), workdir=record.get("WorkDir", ""))


def jobcomp_jobs(text: str) -> list[JobInfo]:
    """The controller's jobcomp/filetxt log: one line per finished job (what Slurm forgets after MinJobAge)."""
    return [job_info(key_values(line)) for line in text.splitlines() if line.startswith("JobId=")]

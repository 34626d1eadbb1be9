"""Write the 21.08 and 23.11 texts (and every release's sacct text) from the 22.05 recordings.

Run from the repository root: python tests/unit/data/slurm/derive.py

Nothing here was recorded on 21.08 or 23.11: each change below is what SchedMD's source of that
release prints differently (github.com/SchedMD/slurm, tags slurm-21-08-8-2 and slurm-23-11-11-1;
the files and functions named next to each change).  sacct needs slurmdbd, which the recording
machine did not run (sacct-no-accounting.out): its texts are written from sacct's print code.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "22.05-recorded"


def node_2108(text: str) -> str:
    # src/api/node_info.c slurm_sprint_node_table: 21.08 prints "CPUAlloc=%u CPUTot=%u " (no CPUEfctv,
    # added in 22.05 with CoreSpec's effective CPUs)
    return re.sub(r"CPUAlloc=(\d+) CPUEfctv=\d+ CPUTot=", r"CPUAlloc=\1 CPUTot=", text)


def node_2311(text: str) -> str:
    # src/api/node_info.c: "LastBusyTime=%s " then "ResumeAfterTime=None" on the same line; the
    # unset energy and external sensor values print "n/a" (22.05: "n/s")
    text = re.sub(r"(LastBusyTime=\S+)\n", r"\1 ResumeAfterTime=None\n", text)
    return text.replace("=n/s", "=n/a")


def job_2311(text: str) -> str:
    # src/api/job_info.c slurm_sprint_job_info: "TRES=%s" (the allocated TRES, else the requested)
    # became two lines, "ReqTRES=%s" and "AllocTRES=%s" ((null) before the job runs)
    def split(match: re.Match) -> str:
        indent, tres = match.group(1), match.group(2)
        pending = "JobState=PENDING" in text
        return f"{indent}ReqTRES={tres}\n{indent}AllocTRES={'(null)' if pending else tres}\n"
    return re.sub(r"^( +)TRES=(\S*)\n", split, text, flags=re.M)


VERSION = {"21.08": "slurm 21.08.8-2\n",   # proc_args.c print_slurm_version: PACKAGE_NAME SLURM_VERSION_STRING
           "23.11": "slurm 23.11.11\n"}    # (auxdir/slurm.m4: "-RELEASE" appended unless the release is 1)

# sacct --parsable2 --noheader --allocations --format JobIDRaw,State,ExitCode,User,NNodes,NodeList,Start,End,JobName
# of the recorded jobs (jobcomp.log): src/sacct/print.c prints "%s by %u" for a cancelled job's state and
# the exit code as "status:signal"; a job that never ran has NodeList "None assigned"
# (accounting_storage/mysql as_mysql_job.c); --parsable2 joins fields with "|" and ends no line with one.
SACCT = """2|COMPLETED|0:0|root|3|node-[1-3]|2026-11-28T00:46:07|2026-11-28T00:46:13|train-a
3|COMPLETED|0:0|root|2|node-[1-2]|2026-11-28T00:46:14|2026-11-28T00:46:15|train b|x
6|CANCELLED by 0|0:0|root|1|None assigned|2026-11-28T00:46:09|2026-11-28T00:46:09|pinned
7|FAILED|3:0|root|2|node-[1-2]|2026-11-28T00:46:20|2026-11-28T00:46:21|fails
8|FAILED|0:9|root|1|node-1|2026-11-28T00:46:20|2026-11-28T00:46:20|killed
"""


def derive(release: str) -> None:
    out = HERE / f"{release}-derived"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for path in sorted(RECORDED.iterdir()):
        name, text = path.name, path.read_text()
        if name.startswith("scontrol-show-node"):
            text = node_2108(text) if release == "21.08" else node_2311(text)
        elif name.startswith("scontrol-show-job") and release == "23.11":
            text = job_2311(text)
        elif name == "slurmd-V.out":
            text = VERSION[release]
        elif name in ("sacct-no-accounting.out", "scontrol-json.out", "jobcomp.log", "scontrol-ping.out"):
            continue  # 22.05's own behaviour; not derived
        (out / name).write_text(text)
    (out / "sacct.out").write_text(SACCT)


if __name__ == "__main__":
    for release in ("21.08", "23.11"):
        derive(release)
    (HERE / "22.05-derived").mkdir(exist_ok=True)  # 22.05's sacct: the one text not recorded on 22.05
    (HERE / "22.05-derived" / "sacct.out").write_text(SACCT)

"""`report JOB`: a picture of a run from the samples recorded beside its logs on the leader.

The record (``~/.clustertool/jobs/<id>/watch/samples.jsonl``, written by the watch hub while the job ran:
``monitoring enable``'s exporter, or a recorder started with the job) gives per reading every node's GPU
utilisation, CPU, network and cordon, and every rank's step and step rate; the job's ``attempts.json``
gives its restarts.  This module turns them into series and events (pure, ``Run``); ``report_html``
draws a self-contained page (inline SVG) and ``report_png`` a PNG (matplotlib, the ``train`` extra).
"""

from __future__ import annotations

import base64
import binascii
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustertool.cluster.session import ClusterSession
from clustertool.core.errors import MissingPrerequisite, RemoteError, StateError
from clustertool.core.jobpaths import JOBS_DIR
from clustertool.core.model import jsonable
from clustertool.jobs import records
from clustertool.remote.group import run_on_node
from clustertool.watch import report_html, report_png
from clustertool.watch.runrecord import Run, load

FILES = ("watch/samples.jsonl", "attempts.json", "job.json")


def fetch_script(job_id: str) -> str:
    """Shell for the leader: each file of FILES as ``FILE name`` then its base64 on one line."""
    d = f'"$HOME"/{shlex.quote(JOBS_DIR)}/{shlex.quote(job_id)}'
    return "\n".join(f'[ -f {d}/{f} ] && echo "FILE {f}" && base64 -w0 {d}/{f} && echo' for f in FILES) + "\ntrue\n"


def parse_files(text: str) -> dict[str, str]:
    out, name = {}, None
    for line in text.splitlines():
        if line.startswith("FILE "):
            name = line[5:].strip()
        elif name is not None:
            try:
                out[name] = base64.b64decode(line).decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                pass
            name = None
    return out


def fetch(session: ClusterSession, job_ref: str) -> Run:
    """The job's record from the leader, as a Run."""
    record = session.ready()
    job = records.resolve(records.load_all(session.name), job_ref)
    r = run_on_node(session, record.leader, "sh -s", stdin_data=fetch_script(job.id).encode(), timeout=120)
    if not r.ok:
        raise RemoteError(f"cannot read job {job.id}'s record on {record.leader.name}: {r.reason}")
    run = load(parse_files(r.stdout), job.id)
    run.name = run.name or job.name
    return run


@dataclass
class ReportFiles:
    html: str
    png: str | None
    png_skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def write(run: Run, prefix: str | Path) -> ReportFiles:
    """``PREFIX.html`` always; ``PREFIX.png`` where matplotlib is installed."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    html = prefix.with_name(prefix.name + ".html")
    html.write_text(report_html.page(run))
    png = prefix.with_name(prefix.name + ".png")
    try:
        report_png.write(run, png)
    except MissingPrerequisite as exc:
        return ReportFiles(str(html), None, f"{exc.message} ({exc.hint})")
    return ReportFiles(str(html), str(png))


def end_of_job(session: ClusterSession, job_id: str) -> str | None:
    """`run --follow`'s last line: the job's report written to the cluster's reports folder on this machine
    (``$CLUSTERTOOL_HOME/clusters/<name>/reports/<job>.html`` and ``.png``), or None where the job has no record
    (run with --no-record, or it ended before the first reading)."""
    try:
        run = fetch(session, job_id)
    except (StateError, RemoteError):
        return None
    files = write(run, records.reports_dir(session.name) / run.job)
    return f"report: {files.html}" + (f" and {files.png}" if files.png else f" (no PNG: {files.png_skipped})")

"""All terminal output: tables, live per-host lines, folded output, JSON.

Core modules return data; the CLI hands it here.  rich is imported lazily so that fast
paths (``exec``) do not pay for it unless a table is drawn.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from clustertool.core.model import GroupResult, jsonable

if TYPE_CHECKING:  # rich and the reports load when something is shown
    from rich.console import Console

    from clustertool.doctor.plugin_check_report import CheckReport

Fold = Callable[[Iterable[str]], str]  # node names -> node-[1-3,5]

_lock = threading.Lock()


# Where output is not a terminal (a pipe, `| tee log`, a file), tables are as wide as their
# cells: rich would otherwise lay them out for 80 columns and cut cells with "…".
PIPE_WIDTH = 1 << 16


def is_terminal(stderr: bool = False) -> bool:
    stream = sys.stderr if stderr else sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _console(stderr: bool = False) -> "Console":
    from rich.console import Console

    if is_terminal(stderr):
        return Console(stderr=stderr, highlight=False, soft_wrap=False)
    return Console(file=sys.stderr if stderr else sys.stdout, width=PIPE_WIDTH, highlight=False, soft_wrap=False,
                   color_system=None)


def command_line(words: Sequence[str]) -> str:
    """A command on one line, as a person reads it: plain words bare, others in the quotes that need no
    escaping where one does, a newline shown as ⏎ (a table row stays one row)."""
    import shlex

    shown = []
    for word in words:
        quoted = shlex.quote(word)
        if quoted != word and "'" in word and '"' not in word and not any(c in word for c in "$`\\"):
            quoted = f'"{word}"'
        shown.append(quoted.replace("\r\n", "⏎").replace("\n", "⏎"))
    return " ".join(shown)


def clip(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` with "…" on a terminal; whole where output goes to a pipe or file."""
    if len(text) <= width or not is_terminal():
        return text
    return text[: width - 1] + "…"


def info(message: str) -> None:
    """A progress line for the user, on stderr (stdout stays clean for data)."""
    with _lock:
        try:
            sys.stderr.write(f"» {message}\n")
            sys.stderr.flush()
        except OSError:  # the terminal went away (SIGHUP): the cleanup that follows must not stop
            pass


def to_jsonable(obj: Any) -> Any:
    return jsonable(obj)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    """A table that never cuts a cell: on a terminal too narrow, cells wrap (fold) instead of "…";
    in a pipe or file, every column takes the width it needs, one line per row."""
    from rich.table import Table

    terminal = is_terminal()
    t = Table(title=title if terminal else None, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold", no_wrap=not terminal)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console = _console()
    if terminal:
        console.print(t)
        return
    with console.capture() as captured:
        console.print(t)
    lines = ([title] if title else []) + captured.get().splitlines()  # a title wider than the table stays one line
    with _lock:
        sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))
        sys.stdout.flush()


def kv(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        sys.stdout.write(f"{key.ljust(width)}  {value}\n")


def live_line(node: str, stream: str, line: str, width: int = 0) -> None:
    """One line of live output, prefixed with its node (stderr lines marked with '!')."""
    mark = "!" if stream == "stderr" else ":"
    with _lock:
        out = sys.stdout
        out.write(f"{node.ljust(width)}{mark} {line}\n")
        out.flush()


def folded_output(group: GroupResult, fold: Fold, only_if_folds: bool = False) -> None:
    """Identical output printed once per node set: ``---- node-[1-3,5] (exit 0)``.

    ``only_if_folds``: after live output, print nothing when no two nodes had the same output.
    """
    buckets: dict[tuple[str, str, int], list[str]] = {}
    for r in group.results:
        key = (r.stdout + r.stderr, r.error or "", r.effective_code)
        buckets.setdefault(key, []).append(r.node)
    if only_if_folds and len(buckets) == len(group.results):
        return
    for (text, error, code), nodes in buckets.items():
        status = error if error else f"exit {code}"
        sys.stdout.write(f"---- {fold(nodes)} ({status})\n")
        if text:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")


def group_summary(group: GroupResult, fold: Fold) -> None:
    ok = [r.node for r in group.results if r.ok]
    bad = [r for r in group.results if not r.ok]
    durations = [r.duration for r in group.results]
    slowest = max(durations, default=0.0)
    line = f"{len(ok)}/{len(group.results)} ok"
    if ok:
        line += f" [{fold(ok)}]"
    if bad:
        line += "; failed: " + ", ".join(f"{r.node} ({r.reason})" for r in bad)
    line += f"; slowest {slowest:.2f}s"
    with _lock:
        sys.stdout.flush()
        sys.stderr.write(line + "\n")


def plain_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Aligned columns without box drawing or wrapping (ids stay whole in any terminal width)."""
    rows = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    for row in [list(columns)] + rows:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")


def check_report(report: CheckReport) -> None:
    """`plugin check`: what ran, what NCCL said it loaded, the per-size table, problems with fixes."""
    from clustertool.bench.allreduce import size_text

    sys.stdout.write(report.note + "\n")
    p = report.plugin
    pairs = [("plugin", f"{p.get('version') or '?'} ({(p.get('sha256') or '?')[:12]}) in {p.get('dest')}, "
                        "the same on every node")]
    n = report.nccl
    if n is not None:
        loaded = (f"{n.net_plugin} loaded, ABI v{n.net_abi or '?'}"
                  + (f" (CollNet v{n.collnet_abi})" if n.collnet_abi else "") if n.plugin_loaded
                  else f"NOT loaded: {n.fallback or f'NCCL used {n.network}'}")
        pairs += [("NCCL", n.version or "?"), ("network", n.network or "?"), ("net plugin", loaded),
                  ("CollNet", f"{'on' if n.collnet_on else 'off'}: {n.collnet_reason}"),
                  ("CollNet algorithm", (n.plugin_algorithm or "no CollNet operation logged")
                   + (f" ({report.servers} reduction server(s) in the cluster)" if report.servers else "")),
                  ("tuner", f"{n.tuner_plugin} (v{n.tuner_abi or '?'})" if n.tuner_plugin
                   else "none loaded (NCCL's own tuning)")]
    kv(pairs)
    gpu = report.mode == "nccl"
    columns = ["size", "algorithm"] + (["protocol"] if gpu else []) + ["time (us)", "algbw (GB/s)", "busbw (GB/s)",
                                                                       "#wrong"]
    rows = [[size_text(r.size), r.algo] + ([r.proto] if gpu else [])
            + [f"{r.time_us:.1f}", f"{r.algbw:.3f}", f"{r.busbw:.3f}", str(r.wrong)] for r in report.rows]
    if rows:
        what = "NCCL's choice per size" if gpu else (
            f"collnet_bench: the plugin's {'servers, ' if report.servers else ''}sharded and ring, Open MPI's mpi")
        table(columns, rows, title=f"allreduce float32 sum on {report.ranks} rank(s): {what}")
    if report.evidence:
        sys.stdout.write("what the log says:\n" + "".join(f"  {line}\n" for line in report.evidence))
    for prob in report.problems:
        fix = f"        fix: {prob.fix}\n" if prob.fix else ""
        sys.stdout.write(f"{prob.severity.upper():7} {prob.message}\n{fix}")
    verdict = "ok" if report.ok else "FAILED"
    sys.stdout.write(f"{verdict}: #wrong {report.wrong}"
                     + (f", NCCL {'used' if n.plugin_loaded else 'did NOT use'} the plugin" if n else "")
                     + ("; NCCL did not run (no GPU)" if report.mode == "standin" else "") + "\n")

"""Options shared by many commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer
from typer.core import TyperCommand

from clustertool.core import state
from clustertool.core.model import Reporter, silent

if TYPE_CHECKING:  # a fast --help: the session (and what it imports) loads in the command
    from clustertool.cluster.session import ClusterSession


def complete_cluster(incomplete: str) -> list[str]:
    """Shell completion of -c: the clusters this machine knows (local files only, no network)."""
    return [n for n in known_clusters() if n.startswith(incomplete)]


def known_clusters() -> list[str]:
    """The clusters this machine has state for (names only; nothing is loaded)."""
    return state.list_clusters()


def cluster_exists(name: str) -> bool:
    """Whether this machine has state for the cluster ``name`` (after an `up` in flight was stopped)."""
    return state.exists(name)


def complete_job(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of a job: ids and names of the cluster's jobs this machine has seen."""
    from clustertool.jobs import records

    try:
        name = state.resolve_name(ctx.params.get("cluster"))
    except Exception:  # no cluster, or several and none named yet: nothing to offer
        return []
    jobs = records.load_all(name)
    words = [j.id for j in jobs] + [j.name for j in jobs if j.name]
    return sorted({w for w in words if w.startswith(incomplete)})


ClusterOpt = typer.Option(None, "-c", "--cluster", metavar="NAME", autocompletion=complete_cluster,
                          help="Cluster to act on (default: the only one known).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")
NodesOpt = typer.Option(None, "--nodes", "-n", metavar="SEL",
                        help="Node selection: all (default), leader, members, workers, servers, node-[2-5], "
                             "comma lists.")


def fill_bare_values(args: list[str], bare: dict[str, str], takes_value: set[str]) -> list[str]:
    """An option of ``bare`` given without a value (last, or before another option or ``--``) reads as
    ``--opt=<its bare value>``: ``run --sync -- CMD`` is ``run --sync=. -- CMD``.

    Only the options before the command are looked at (``takes_value``: the options whose next word
    is their value); the command's own words after ``--`` or the first positional stay as they are.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return out + args[i:]
        if word in bare and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(f"{word}={bare[word]}")
        elif word in takes_value and i + 1 < len(args):
            out += [word, args[i + 1]]
            i += 1
        else:
            out.append(word)
        i += 1
    return out


class BareValueCommand(TyperCommand):
    """A command whose options named in ``bare_values`` may be given without their value.

    typer's click has no optional option values; this fills the value in before parsing, and marks
    the parameter (``bare_value``) so a playbook's ``key: true`` becomes the bare option.
    """

    bare_values: dict[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            for opt in getattr(param, "opts", ()):
                if opt in self.bare_values:
                    setattr(param, "bare_value", self.bare_values[opt])

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        takes = {o for p in self.params if getattr(p, "param_type_name", "") == "option"
                 and not getattr(p, "is_flag", False) and not getattr(p, "count", False)
                 for o in list(p.opts) + list(p.secondary_opts)}
        return super().parse_args(ctx, fill_bare_values(list(args), self.bare_values, takes))


def confirm(question: str, *, what: str, kept: str, unasked: str, note: str = "") -> None:
    """Ask ``question`` (y/N) on the terminal before doing ``what`` ("tear down 'demo'").

    No terminal to ask on: a UsageError naming --yes (its hint: ``unasked``, the command that does it
    without asking, and ``note``).  An answer of no: ``kept`` ("not torn down: cluster 'demo' is kept"),
    exit 1, as for every question the tool asks.  Ctrl-C: interrupted (130)."""
    import sys

    from clustertool.core.errors import Declined, UsageError

    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {what} without --yes (no terminal to ask on)",
                         hint=f"`{unasked}` does it without asking" + (f" ({note})" if note else ""))
    if not typer.confirm(question, default=False):
        raise Declined(kept, hint=f"`{unasked}` does it without asking")


def cluster_name(name: Optional[str]) -> str:
    return state.resolve_name(name)


def open_session(name: Optional[str], json_output: bool = False) -> "ClusterSession":
    """The command's one session: the named cluster (or the only one), its progress on stderr
    (none with --json)."""
    from clustertool.cluster.session import ClusterSession

    return ClusterSession.load(name, report=reporter(json_output))


def reporter(json_output: bool) -> Reporter:
    """Progress lines on stderr, or none with --json (stdout stays clean data)."""
    from clustertool.cli import render

    return silent if json_output else render.info

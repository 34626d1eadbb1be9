"""clustertool: bring up, wire, feed and run multi-node GPU training clusters.

Where things live (the README's "Where each command lives" has the full map):

* ``cli/``: one thin module per command group (parse, call the core, render); ``cli/app.py`` is
  the one place that turns errors into a message and an exit code.
* shared core: ``errors``, ``model`` (``HostResult.reason``, ``Reporter``), ``state``, ``spec``,
  ``nodeset``, ``hostfile``, ``inventory``, ``lifecycle`` (up/down/status), ``yamlfile``,
  ``facts`` (what a node has).
* ``remote/`` (transport seam, parallel fan-out, keys, mesh), ``providers/`` (local/, static,
  aws/), ``transfer/`` (copy, sync-s3), ``nodeprogs/`` (programs shipped to nodes), ``jobs/``,
  ``doctor/``, ``plugin/``, ``bench/``, ``playbook/``, ``workloads/``.

The Python API (``clustertool.api``): ``from clustertool import Cluster`` — ``Cluster.up(...)``,
``Cluster.load(name)``, ``.status()``, ``.exec()``, ``.copy()``, ``.run()`` (a ``Job`` with ``.wait()``,
``.logs()``, ``.kill()``), ``.fabric()``, ``.down()``.  The names below load on first use, so
``import clustertool`` (and ``clustertool --help``) stays cheap.
"""

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Cluster": "clustertool.api", "Job": "clustertool.api",
    "GroupResult": "clustertool.core.model", "HostResult": "clustertool.core.model",
    **{name: "clustertool.core.errors" for name in ("ToolError", "UsageError", "SpecError", "StateError",
                                                     "ProviderError", "RemoteError", "MissingPrerequisite")},
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """``clustertool.Cluster`` and friends, imported when first asked for (Any to a type checker: a
    ``TYPE_CHECKING`` import of them would put the API under the package face, which imports nothing)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'clustertool' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

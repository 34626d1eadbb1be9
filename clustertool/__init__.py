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
"""

__version__ = "0.1.0"

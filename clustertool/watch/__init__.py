"""Watching a cluster while it trains: `top`, `monitoring`, `metrics`, `report`.

The collection runs on the cluster (``nodeprogs/watchhub.py`` on the leader, ``watchnode.py`` on every
node); this package starts it over one ssh session to the leader and turns what it says into data
for the CLI and the API (``hub``), installs the Prometheus stack (``monitoring``), reaches it
(``metrics``) and draws a job's record (``report``).
"""

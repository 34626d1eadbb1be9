"""`clustertool doctor`: checks that return findings (data), each with a severity and a fix.

``checkup`` runs the chosen checks (and the safe fixes) over a cluster; each check's own module
(netprobe, gpu, efa, sharedfs, plugin_check ...) measures and judges; ``findings`` is the shape.
"""

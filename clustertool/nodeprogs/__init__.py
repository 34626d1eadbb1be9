"""Programs shipped to nodes over ssh stdin: stdlib-only Python (manifest, ops, s3).

They must not import clustertool: a node runs them with whatever python3 it has.
"""

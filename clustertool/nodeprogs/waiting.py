"""Which jobs on this node (the leader) wait for a replacement now (stdlib only; never imports clustertool).

A job run with ``--restarts N --replace-failed`` whose node was lost has its restart loop (restarts.py) write
``waiting`` in the job's ``attempts.json`` ({nodes, since, until, attempt}) and wait for a ``replaced`` file in
the job's folder.  Whoever replaces the node first claims that wait by making the folder ``replacing.<attempt>``
(atomically: two replacers never act twice).  This program lists each job folder's wait, with whether it is
claimed, already answered, killed, or past its ``until`` (the restart loop then gives up by itself).

``ARGS``: ``jobs_dir`` (relative to the home folder).  Prints one JSON document:
``{"now": <epoch s>, "waiting": [{"job", "nodes", "attempt", "since", "until", "claimed", "replaced", "killed"}]}``.
"""

import json
import os
import sys
import time


def read_json(path):
    try:
        with open(path) as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def wait_of(folder, job):
    """The wait of one job folder, or None (no wait, or the restart loop already said its last word)."""
    doc = read_json(os.path.join(folder, "attempts.json")) or {}
    wait = doc.get("waiting")
    if not isinstance(wait, dict) or doc.get("verdict"):
        return None
    number = wait.get("attempt")
    return {"job": job, "nodes": [str(n) for n in wait.get("nodes") or []], "attempt": number,
            "since": wait.get("since"), "until": wait.get("until"),
            "claimed": os.path.isdir(os.path.join(folder, f"replacing.{number}")),
            "replaced": os.path.exists(os.path.join(folder, "replaced")),
            "killed": os.path.exists(os.path.join(folder, "killed"))}


def waits(root):
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = (wait_of(os.path.join(root, name), name) for name in names)
    return [w for w in found if w is not None]


def main(args):
    root = os.path.join(os.path.expanduser("~"), args["jobs_dir"])
    sys.stdout.write(json.dumps({"now": time.time(), "waiting": waits(root)}) + "\n")
    return 0


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    sys.exit(main(ARGS))  # noqa: F821

"""A job's processes as the leader's node programs see them (stdlib only): a part that
``supervise`` and ``spot`` bring with them (nodeprogs.PARTS), sent before their own source."""

import time


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_pid(path, wait_s=30.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.1)
    return None

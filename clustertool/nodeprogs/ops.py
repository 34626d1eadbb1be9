"""Standalone program (stdlib only) run on a node over ssh stdin: apply a plan's small ops.

``ARGS`` (prepended by the sender): {"root": DEST, "delete": [rel...], "touch": [[rel, mtime, perm]...]}.
Deletes entries the source no longer has (``--delete``) and fixes the metadata of files whose
content already matches (same size and hash, other mtime), so they are not sent again.
Prints one JSON line: {"deleted": n, "touched": n, "errors": [...]}.
"""

import json
import os
import shutil


def apply(args):
    root = os.path.expanduser(args["root"])
    done: dict = {"deleted": 0, "touched": 0, "errors": []}
    for rel in sorted(args.get("delete", []), key=lambda p: -p.count("/")):
        path = os.path.join(root, rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
            done["deleted"] += 1
        except OSError as exc:
            done["errors"].append(f"{rel}: {exc.strerror or exc}")
    for rel, mtime, perm in args.get("touch", []):
        path = os.path.join(root, rel)
        try:
            os.chmod(path, perm)
            os.utime(path, (mtime, mtime))
            done["touched"] += 1
        except OSError as exc:
            done["errors"].append(f"{rel}: {exc.strerror or exc}")
    return done


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    print(json.dumps(apply(ARGS)))  # noqa: F821

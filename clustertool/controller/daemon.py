"""``python -m clustertool.controller.daemon run NAME``: the detached controller process (process.serve)."""

from __future__ import annotations

import argparse
import sys

from clustertool.controller import process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustertool.controller.daemon")
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="run the cluster's controller in the foreground (start() detaches it)")
    run.add_argument("name")
    run.add_argument("--poll", type=float, default=2.0, help="seconds between two looks at the leader")
    run.add_argument("--log", help="where start() sends the output (in the command line for leak checks)")
    args = parser.parse_args(argv)
    return process.serve(args.name, args.poll)


if __name__ == "__main__":
    sys.exit(main())

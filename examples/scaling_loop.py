"""Train at 1, 2 and 4 nodes and compare: the seeds' scaling loop, written with clustertool's Python API.

    python examples/scaling_loop.py                                   # a local cluster, the shipped MLP
    python examples/scaling_loop.py --provider aws --instance-type p4d.24xlarge \\
        --sync ~/code/model -- python train.py --epochs 1              # your code, on AWS

The cluster comes up, every size runs as one `run` job on the first N nodes, the throughput each
job prints (``samples/sec: N``) is compared with one node's, and the cluster goes down at the end,
also after a failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from clustertool import Cluster, ToolError

THROUGHPUT = re.compile(r"samples/sec:\s*([0-9.]+)")
SHIPPED = Path(__file__).resolve().parent.parent / "clustertool" / "workloads" / "train_mlp.py"


def throughput(lines: list[str]) -> float | None:
    """The job's samples/sec (rank 0 prints it for the whole job)."""
    found = [float(m.group(1)) for line in lines if (m := THROUGHPUT.search(line))]
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="scaling")
    p.add_argument("--provider", default="local")
    p.add_argument("--instance-type", default=None)
    p.add_argument("--sizes", default="1,2,4", help="node counts to train at")
    p.add_argument("--per-node", type=int, default=1, help="ranks per node")
    p.add_argument("--sync", default=None, metavar="DIR", help="send this local folder first; the job runs there")
    p.add_argument("command", nargs="*", help="the training command (after --); default: the shipped MLP")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    command = args.command or [sys.executable, str(SHIPPED), "--steps", "10"]
    keywords = {"instance_type": args.instance_type} if args.instance_type else {}
    say = lambda line: print(f"  {line}", file=sys.stderr)  # noqa: E731  (progress on stderr)

    try:
        with Cluster.up(provider=args.provider, nodes=max(sizes), name=args.name, report=say, **keywords) as cluster:
            hosts = cluster.exec("hostname", check=True)
            print(f"cluster {cluster.name} is up: {', '.join(r.stdout.strip() for r in hosts.results)}")
            rates: dict[int, float] = {}
            for n in sizes:
                nodes = ",".join(node.name for node in cluster.nodes[:n])
                job = cluster.run(command, nodes=nodes, per_node=args.per_node, name=f"scale-{n}", sync=args.sync)
                code = job.wait()
                lines = job.logs()
                rate = throughput(lines)
                if code != 0 or rate is None:
                    print("\n".join(lines[-20:]), file=sys.stderr)
                    print(f"{n} node(s): job {job.id} {job.state} (exit {code}), no samples/sec", file=sys.stderr)
                    return 1
                rates[n] = rate
            base = rates[sizes[0]] / sizes[0]
            print(f"{'nodes':>5}  {'samples/sec':>12}  {'speedup':>7}  {'efficiency':>10}")
            for n, rate in rates.items():
                print(f"{n:>5}  {rate:>12.1f}  {rate / rates[sizes[0]]:>7.2f}  {rate / (base * n):>10.0%}")
    except ToolError as exc:
        print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

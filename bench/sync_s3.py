#!/usr/bin/env python3
"""Benchmark: `clustertool sync-s3` to N local nodes vs an `aws s3 sync`-like download on this machine.

Brings up a local cluster (real sshd in namespaces, optionally shaped links), starts a moto S3
server on the cluster bridge, uploads OBJECTS objects of SIZE bytes, then times whole processes,
alternating, several rounds (medians):

  sync-s3             every node pulls the whole prefix into a fresh folder (presigned URLs,
                      --threads per node); N copies of the data land
  sync-s3 --threads 1 the same, one download at a time per node (what parallelism buys)
  sync-s3 re-run      the first again into the same folders: nothing to fetch (the fixed cost)
  boto3 here          the prefix downloaded once on this machine with boto3's transfer manager,
                      10 objects at a time (what `aws s3 sync` does): ONE copy of the data

Throughput is data landed / time, summed over the nodes.  moto is one Python process on the
same shared CPUs as the nodes, so the absolute figures measure this machine more than S3; the
ratios say whether N nodes pull N copies in about the time this machine pulls one.

    sudo .venv/bin/python bench/sync_s3.py [--nodes 4] [--objects 64] [--size 1M] [--rounds 3]
        [--link-rate 200mbit --link-delay 2ms]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# bench/copy.py would shadow the standard library's copy (botocore imports it): not this folder
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
CT = [sys.executable, "-m", "clustertool"]
CREDS = {"AWS_ACCESS_KEY_ID": "AKIABENCHBENCHBENCH0", "AWS_SECRET_ACCESS_KEY": "bench",
         "AWS_DEFAULT_REGION": "us-east-1"}


def sh(argv, env, check=True):
    return subprocess.run(argv, env=env, check=check, capture_output=True, text=True)


def size_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def start_moto(host: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return proc, f"http://{host}:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("moto server did not start")
            time.sleep(0.2)


def bridge_address(home: str, name: str) -> str:
    bridge = json.load(open(f"{home}/clusters/{name}.json"))["provider_state"]["bridge"]
    out = sh(["ip", "-4", "-o", "addr", "show", "dev", bridge], None).stdout
    return out.split()[3].split("/")[0]


def boto3_here(client, keys: list[str], dest: str) -> float:
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(max_concurrency=10)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(lambda k: client.download_file("bench", k, os.path.join(dest, k.replace("/", "_")),
                                                     Config=config), keys))
    return time.perf_counter() - start


def sync(name: str, env: dict, endpoint: str, dest: str, threads: int) -> float:
    argv = CT + ["sync-s3", "-c", name, "s3://bench/data", dest, "--endpoint-url", endpoint,
                 "--threads", str(threads), "--json"]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sync-s3 failed ({proc.returncode}): {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--size", default="1M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--link-rate")
    ap.add_argument("--link-delay")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    size = size_bytes(args.size)
    home = tempfile.mkdtemp(prefix="ct-bench-s3-")
    env = dict(os.environ, CLUSTERTOOL_HOME=home, CLUSTERTOOL_HOSTFILE_DIR=f"{home}/hostfiles",
               CLUSTERTOOL_NO_SSH_INCLUDE="1", **CREDS)
    env.pop("AWS_ENDPOINT_URL", None)
    name = "bs3"
    shaping = (["--link-rate", args.link_rate] if args.link_rate else []) + \
              (["--link-delay", args.link_delay] if args.link_delay else [])
    sh(CT + ["up", "--provider", "local", "--nodes", str(args.nodes), "--name", name, *shaping], env)
    moto = None
    try:
        moto, endpoint = start_moto(bridge_address(home, name))
        results = run_rounds(name, env, endpoint, home, args, size)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        sh(CT + ["down", "-c", name, "--yes"], env, check=False)
        shutil.rmtree(home, ignore_errors=True)
    report(results, args, size)


def run_rounds(name, env, endpoint, home, args, size):
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    client.create_bucket(Bucket="bench")
    keys = [f"data/part-{i:05d}.bin" for i in range(args.objects)]
    for k in keys:
        client.put_object(Bucket="bench", Key=k, Body=os.urandom(size))
    times = {"sync-s3": [], "sync-s3 --threads 1": [], "sync-s3 re-run": [], "boto3 here": []}
    for r in range(args.rounds):
        here = tempfile.mkdtemp(prefix="ct-bench-s3-here-")
        times["boto3 here"].append(boto3_here(client, keys, here))
        shutil.rmtree(here, ignore_errors=True)
        times["sync-s3"].append(sync(name, env, endpoint, f"/scratch/bench-{r}-t8", 8))
        times["sync-s3 re-run"].append(sync(name, env, endpoint, f"/scratch/bench-{r}-t8", 8))
        times["sync-s3 --threads 1"].append(sync(name, env, endpoint, f"/scratch/bench-{r}-t1", 1))
    return times


def report(times, args, size):
    from clustertool.providers.local.net import rate_bits

    data = args.objects * size
    copies = {"sync-s3": args.nodes, "sync-s3 --threads 1": args.nodes, "sync-s3 re-run": 0, "boto3 here": 1}
    base = statistics.median(times["boto3 here"])
    # S/B: the time one shaped link needs for one copy (nodes' links are shaped, this machine's are not)
    sb = data * 8 / rate_bits(args.link_rate) if args.link_rate else None
    print(f"{args.objects} objects x {args.size} = {data / 2**20:.0f} MiB; {args.nodes} nodes"
          + (f"; links {args.link_rate} (S/B {sb:.2f} s)" if sb else ""))
    print(f"{'':24}{'median s':>10}{'copies':>8}{'MiB/s landed':>14}{'/ boto3 here':>14}"
          + (f"{'/ S/B':>8}" if sb else ""))
    figures = {}
    for label, ts in times.items():
        med = statistics.median(ts)
        rate = copies[label] * data / med / 2**20
        figures[label] = {"median_s": med, "runs": ts, "copies": copies[label], "mib_per_s": rate}
        print(f"{label:24}{med:>10.2f}{copies[label]:>8}{rate:>14.1f}{med / base:>14.2f}"
              + (f"{med / sb:>8.2f}" if sb and label != "boto3 here" else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

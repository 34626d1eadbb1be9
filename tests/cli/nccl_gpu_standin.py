"""Stand-in for the GPU proof's ranks where no GPU, CUDA or NCCL exists (this machine).

It is NOT NCCL, NOT PyTorch and NOT the plugin: it prints the log lines a chosen NCCL release
prints (STANDIN_NCCL = 2.19.3, 2.23.4, 2.28.9 or 2.30.7; each line from that tag's format string,
named beside it) and the plugin's own lines, deciding from the environment the proof gave it the
way NCCL and the plugin decide (plugin found on LD_LIBRARY_PATH by name, NCCL_NET,
NCCL_COLLNET_ENABLE, distinct NCCL_HOSTID per rank, CLUSTERTOOL_COLLNET_ALGO), meets the other
ranks over TCP at MASTER_ADDR:MASTER_PORT (so the namespaces and links the proof built must really
work), and writes results the way the workers do. With --sizes it is bench/nccl_gpu_worker.py
(after each size, stopping before a size that would overrun --deadline: the worker's own rule);
otherwise it is bench/nccl_gpu_ddp.py (the same arguments and result_doc()).

Servers: it connects to every reducer in CLUSTERTOOL_REDUCERS (the real clustertool-reducer the
proof started) and, where one cannot be reached, logs the plugin's fallback WARN and runs sharded.
Pacing: with CLUSTERTOOL_LINK_RATE it logs the rate and reports the busbw a paced link would give
(a model, not a measurement: net and sharded 0.95 B, ring 0.92 B, servers 1.45 B). MPS: with
CUDA_MPS_PIPE_DIRECTORY it connects to the control socket there (tests/cli/nccl_gpu_mps_standin.py).
Stats: a CollNet rank writes one line per communicator to CLUSTERTOOL_COLLNET_STATS (a file, or
`clustertool-collnet-stats {JSON}` on stderr for 1). Other knobs:
  STANDIN_FAIL_RANK=r        rank r exits 1 at once
  STANDIN_DLOPEN_ERROR=1     the plugin library exists but does not load (dlopen error)
  STANDIN_COLLNET_FAIL=1     CollNet channels are set up, then the connect fails
  STANDIN_SECONDS_PER_MB=x   each size takes x seconds per MiB (default 0)
  STANDIN_HANG=1             every rank hangs in its first allreduce (or training step)
  STANDIN_NO_STATS=1         a plugin build that writes no stats
  STANDIN_DDP_DIVERGE=1      the training step ends with different parameters on each rank
  STANDIN_FAIL_UNDER_MPS=1   every rank exits 1 when it is given an MPS pipe folder
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
from nccl_gpu_ddp import plan_steps, result_doc  # noqa: E402
from nccl_gpu_worker import next_size_fits  # noqa: E402

REL = {"2.19.3": (2, 19), "2.23.4": (2, 23), "2.28.9": (2, 28), "2.30.7": (2, 30)}
NET_ABI = {(2, 19): 7, (2, 23): 8, (2, 28): 11, (2, 30): 12}
TUNER_ABI = {(2, 28): 5, (2, 30): 6}


def rendezvous(rank: int, world: int) -> list[str]:
    """Rank 0 collects every rank's NCCL_HOSTID over TCP and sends the list back."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    me = os.environ["NCCL_HOSTID"].encode()
    if rank == 0:
        srv = socket.create_server((addr, port))
        peers = [srv.accept()[0] for _ in range(world - 1)]
        ids = [me] + [c.recv(256) for c in peers]
        for c in peers:
            c.sendall(b"\n".join(ids))
            c.close()
        srv.close()
        return [i.decode() for i in ids]
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.05)
    c.sendall(me)
    return c.recv(4096).decode().split("\n")


def plugin_lines(rel, name: str, lib: str, found: bool) -> tuple[list[str], bool]:
    """(lines, loaded) of the net plugin loader."""
    dlerr = f"{lib}: /opt/ct/{os.path.basename(lib)}: version `GLIBC_2.34' not found"
    if os.environ.get("STANDIN_DLOPEN_ERROR") == "1" and found:
        if rel == (2, 19):      # net.cc: "NET/Plugin : Plugin load returned %d : %s."
            return [f"NET/Plugin : Plugin load returned 2 : {dlerr}."], False
        if rel == (2, 23):      # net.cc: "NET/Plugin: %s" (dlerror); then "Could not find:%s. Using internal ..."
            return [f"NET/Plugin: {dlerr}", f"NET/Plugin: Could not find: {name}. Using internal network plugin."], \
                False
        # plugin_open.cc "%s/Plugin: %s: %s", then "%s/Plugin: Could not find:%s%s%s"
        return [f"NET/Plugin: {lib}: {dlerr}", f"NET/Plugin: Could not find: {name}. Using internal network plugin."], \
            False
    if not found:
        if rel == (2, 19):      # net.cc "NET/Plugin : dlerror=%s No plugin found (%s), using internal implementation"
            return [f"NET/Plugin : dlerror={lib}: cannot open shared object file: No such file or directory No plugin "
                    f"found ({lib}), using internal implementation"], False
        return [f"NET/Plugin: Could not find: {name} {lib}. Using internal network plugin."], False
    if rel == (2, 19):          # net.cc "Plugin name set by env to %s"; v7 is its newest: no "Loaded" line
        return [f"Plugin name set by env to {lib}"], True
    if rel == (2, 23):          # net.cc "NET/Plugin: Plugin name set by env to %s"; v8 newest: no "Loaded" line
        return [f"NET/Plugin: Plugin name set by env to {lib}"], True
    v = NET_ABI[rel]            # plugin/net/net_vN.cc and plugin/net.cc
    return [f"NET/Plugin: Loaded net plugin {name} (v{v})", f"NET/Plugin: Loaded collnet plugin {name} (v{v})",
            f"Successfully loaded external network plugin {lib}"], True


def tuner_lines(rel, path: str) -> list[str]:
    if rel == (2, 19):
        return ["Opened tuner: 'clustertool'"]                       # misc/tuner.cc
    if rel == (2, 23):
        return ["TUNER/Plugin: Using tuner plugin clustertool"]      # misc/tuner.cc
    return [f"TUNER/Plugin: Using clustertool (v{TUNER_ABI[rel]})",    # plugin/tuner/tuner_vN.cc
            f"Successfully loaded external tuner plugin {path}"]     # plugin/tuner.cc


def collnet_env_line(rel) -> str:
    # init.cc 2.19.3, 2.23.4: "... to %s." (NCCL_ALL); 2.28.9, 2.30.7: "... to %d." (NCCL_ENV)
    return f"NCCL_COLLNET_ENABLE set by environment to {os.environ['NCCL_COLLNET_ENABLE']}."


def collnet_lines(rel, rank: int, name: str) -> tuple[list[str], bool]:
    """coll_net.cc setup lines, then success or transport.cc's WARN."""
    out = [f"CollNet 00/0 : {rank} [receive] via COLLNET/{name}/0",
           f"CollNet 00/0 : {rank} [send] via COLLNET/{name}/0"]
    if os.environ.get("STANDIN_COLLNET_FAIL") == "1":
        return out + ["WARN Cannot initialize CollNet, using point-to-point network instead"], False
    if rel == (2, 19):
        return out + [f"rank {rank} Connected CollNet"], True                  # init.cc
    return out + [f"Connected Collnet Chains  [0] -1->{rank}->-1"], True      # coll_net.cc


def algo_line(rel, size: int, algo: str) -> str | None:
    if rel == (2, 19):
        return None                                                          # 2.19 prints none (TRACE only)
    if rel == (2, 23):                                                       # enqueue.cc, rank 0 only
        num = {"RING": 1, "COLLNET_CHAIN": 3}[algo]
        return f"AllReduce: {size} Bytes -> Algo {num} proto 2 time 123.000000"
    return f"AllReduce: {size} Bytes -> Algo {algo} proto SIMPLE channel{{Lo..Hi}}={{0..1}}"   # enqueue.cc


def reducer_lines(env, rank: int, nodes: int) -> tuple[list[str], bool]:
    """Connect to every reducer the proof started (as the plugin's ct_servers_connect does, without
    its protocol: connect, then close); (lines, all reached)."""
    listed = [e for e in env.get("CLUSTERTOOL_REDUCERS", "").split(",") if e]
    if not listed:   # ct_coll_settings.c
        return ["WARN clustertool: CLUSTERTOOL_COLLNET_ALGO=servers but CLUSTERTOOL_REDUCERS is empty; "
                "using sharded"], False
    for i, endpoint in enumerate(listed):
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as e:   # ct_coll_settings.c warn_fallback()
            return [f"WARN clustertool: rank {rank}/{nodes}: reduction server {endpoint} (server {i + 1} of "
                    f"{len(listed)}) cannot be reached from rank {rank} ({e}); CollNet uses sharded instead of "
                    "servers on every rank"], False
    return [f"standin: reached {len(listed)} reducer(s) {','.join(listed)}"], True


def nccl_log(rel, version: str, env, rank: int, nodes: int) -> tuple[list[str], str, str | None]:
    """(lines, the algorithm allreduce runs on, the plugin's CollNet algorithm or None)."""
    out = [f"NCCL version {version}+cuda12.4"]
    name = env.get("NCCL_NET_PLUGIN")
    if not name or env.get("NCCL_NET") == "Socket":
        return out + ["Using network Socket"], "RING", None
    lib = f"libnccl-net-{name}.so"
    found = any(os.path.isfile(os.path.join(d, lib)) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d)
    lines, loaded = plugin_lines(rel, name, lib, found)
    out += lines
    if env.get("NCCL_COLLNET_ENABLE"):
        out.append(collnet_env_line(rel))
    if not loaded:
        return out + ["Using network Socket"], "RING", None
    out.append(f"Using network {name}")                                      # init.cc "Using network %s"
    if env.get("NCCL_TUNER_PLUGIN"):
        out += tuner_lines(rel, env["NCCL_TUNER_PLUGIN"])
    if env.get("NCCL_COLLNET_ENABLE") != "1":
        return out, "RING", None
    if nodes < 2:   # init.cc
        return out + [f"Communicator has {nodes} nodes which is less than CollNet node threshold 2, "
                      "disabling CollNet"], "RING", None
    lines, ok = collnet_lines(rel, rank, name)
    out += lines
    if not ok:
        return out, "RING", None
    algo = env.get("CLUSTERTOOL_COLLNET_ALGO", "sharded")
    if algo == "servers":
        lines, reached = reducer_lines(env, rank, nodes)
        out += lines
        algo = "servers" if reached else "sharded"
    out.append(f"clustertool: collnet rank {rank}/{nodes} connected: algo={algo} socks/peer=1 chunk=262144")
    if not env.get("CLUSTERTOOL_TUNER_CONFIG"):
        return out, "RING", algo
    # the plugin's own line (native/src/ct_collnet.c)
    out.append(f"clustertool: CollNet rank {rank}/{nodes}: first iallreduce (1048576 bytes) running, algorithm {algo}")
    return out, "COLLNET_CHAIN", algo


def side_lines(env) -> list[str]:
    """What the stand-in saw of the proof's pacing and MPS."""
    out = []
    if env.get("CLUSTERTOOL_LINK_RATE"):
        out.append(f"standin: paced, CLUSTERTOOL_LINK_RATE={env['CLUSTERTOOL_LINK_RATE']}")
    if pipe := env.get("CUDA_MPS_PIPE_DIRECTORY"):
        try:
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(os.path.join(pipe, "control"))
            out.append(f"standin: MPS control daemon answers at {pipe}")
        except OSError as e:
            out.append(f"standin: no MPS control daemon at {pipe} ({e})")
    return out


def link_bytes_per_s(env) -> float:
    """CLUSTERTOOL_LINK_RATE as bytes/s (the forms the proof passes: 1gbit, 400mbit); 0 unpaced."""
    rate = env.get("CLUSTERTOOL_LINK_RATE", "").lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult / 8
    return 0.0


PACED_BUSBW = {None: 0.95, "sharded": 0.95, "ring": 0.92, "servers": 1.45}   # x B: a model, not a measurement


def write_stats(env, rank: int, world: int, algo: str | None, nbytes: int) -> None:
    where = env.get("CLUSTERTOOL_COLLNET_STATS")
    if not where or algo is None or env.get("STANDIN_NO_STATS") == "1":
        return
    reqs = max(nbytes // 262144, 1)
    doc = {"rank": rank, "nranks": world, "algo": algo, "window": 8, "requests": reqs, "bytes": reqs * 262144,
           "mean_bytes": 262144, "inflight_mean": 5.5, "inflight_max": 8, "post_to_done_p50_us": 900.0,
           "post_to_done_p99_us": 2100.0 + rank, "test_p99_us": 3.5}
    if where == "1":
        print(f"clustertool-collnet-stats {json.dumps(doc)}", file=sys.stderr, flush=True)
    else:
        with open(where, "a") as f:
            f.write(json.dumps(doc) + "\n")


def allreduce(args, env, rank: int, world: int, rel, p: str, chain: str, algo: str | None, version: str) -> int:
    doc = {"rank": rank, "torch": "standin", "nccl": version, "results": [], "stopped_before": None}
    per_mb = float(env.get("STANDIN_SECONDS_PER_MB", "0"))
    deadline = float(args.get("--deadline", "0"))
    b = link_bytes_per_s(env)
    last_size, last_s, moved = 0, 0.0, 0
    iters = int(args.get("--iters", "1")) + int(args.get("--warmup", "0"))
    for size in map(int, args["--sizes"].split(",")):
        if not next_size_fits(deadline, time.time(), last_size, last_s, size):
            doc["stopped_before"] = size
            break
        if env.get("STANDIN_HANG") == "1":
            time.sleep(3600)
        began = time.time()
        time.sleep(per_mb * size / (1 << 20))
        if (line := algo_line(rel, size, chain)) and (rel != (2, 23) or rank == 0):
            print(p + "INFO " + line, flush=True)
        if b:
            algbw = PACED_BUSBW[algo] * b / 1e9 * world / (2 * (world - 1))
            t = size / (algbw * 1e9) * 1e6
        else:
            t = 100.0 + size / 1e4
            algbw = size / (t * 1e-6) / 1e9
        moved += size * iters
        doc["results"].append({"size": size, "time_us": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
                               "wrong": 0, "rank": rank, "world": world, "iters": int(args.get("--iters", "1")),
                               "short": False})
        last_size, last_s = size, time.time() - began
        with open(args["--out"], "w") as f:
            json.dump(doc, f)
    with open(args["--out"], "w") as f:
        json.dump(doc, f)
    write_stats(env, rank, world, algo, moved)
    return 0


def ddp(args, env, rank: int, world: int, rel, p: str, chain: str, algo: str | None, version: str) -> int:
    """bench/nccl_gpu_ddp.py's interface: its arguments, its result_doc(); a step's time is a model."""
    width, layers, batch = int(args["--width"]), int(args["--layers"]), int(args["--batch"])
    params = layers * (width * width + width)
    b = link_bytes_per_s(env)
    grads = params * 4
    step_s = grads * 2 * (world - 1) / world / (PACED_BUSBW[algo] * b) if b else 0.01
    if env.get("STANDIN_HANG") == "1":
        time.sleep(3600)
    for size in (grads % (25 << 20) or (25 << 20), 25 << 20):   # DDP's buckets
        if line := algo_line(rel, size, chain):
            print(p + "INFO " + line, flush=True)
    steps = plan_steps(step_s, float(args["--seconds"]), float(args.get("--deadline", "0")), time.time())
    time.sleep(0.1)
    checksum = [1.5 + (rank if env.get("STANDIN_DDP_DIVERGE") == "1" else 0), 2.5]
    doc = result_doc(rank=rank, world=world, torch="standin", nccl=version, params=params, batch=batch, steps=steps,
                     seconds=steps * step_s, loss_first=1.0, loss_last=0.5, checksum=checksum)
    with open(args["--out"], "w") as f:
        json.dump(doc, f)
    write_stats(env, rank, world, algo, grads * steps)
    return 0


def main() -> int:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    env, rank, world = os.environ, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if env.get("STANDIN_FAIL_RANK") == str(rank):
        print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp: unhandled system error", flush=True)
        return 1
    if env.get("STANDIN_FAIL_UNDER_MPS") == "1" and env.get("CUDA_MPS_PIPE_DIRECTORY"):
        print("RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable", flush=True)
        return 1
    hosts = rendezvous(rank, world)
    version = env.get("STANDIN_NCCL", "2.28.9")
    rel = REL[version]
    p = f"standin:{os.getpid()}:{os.getpid()} [0] NCCL "
    lines, chain, algo = nccl_log(rel, version, env, rank, len(set(hosts)))
    # debug.cc: INFO "host:pid:tid [dev] NCCL INFO msg"; WARN "\nhost:pid:tid [dev] file:line NCCL WARN msg"
    print("\n".join(f"\n{p[:-5]} transport.cc:464 NCCL {ln}" if ln.startswith("WARN ") else f"{p}INFO {ln}"
                    for ln in lines), flush=True)
    print("\n".join(side_lines(env)), flush=True)
    run = allreduce if "--sizes" in args else ddp
    return run(args, env, rank, world, rel, p, chain, algo if chain == "COLLNET_CHAIN" else None, version)


if __name__ == "__main__":
    sys.exit(main())

"""Stand-in for bench/nccl_gpu_worker.py where no GPU, CUDA or NCCL exists (this machine).

It is NOT NCCL: it prints the log lines a chosen NCCL release prints (STANDIN_NCCL = 2.19.3,
2.23.4, 2.28.9 or 2.30.7; each line from that tag's format string, named beside it), deciding
from the environment the proof gave it the way NCCL decides (plugin found on LD_LIBRARY_PATH
by name, NCCL_NET, NCCL_COLLNET_ENABLE, distinct NCCL_HOSTID per rank), meets the other ranks
over TCP at MASTER_ADDR:MASTER_PORT (so the namespaces and links the proof built must really
work), and writes results the way the worker does, after each size, stopping before a size
that would overrun --deadline (the worker's own rule). Other knobs:
  STANDIN_FAIL_RANK=r        rank r exits 1 at once
  STANDIN_DLOPEN_ERROR=1     the plugin library exists but does not load (dlopen error)
  STANDIN_COLLNET_FAIL=1     CollNet channels are set up, then the connect fails
  STANDIN_SECONDS_PER_MB=x   each size takes x seconds per MiB (default 0)
  STANDIN_HANG=1             every rank hangs in its first allreduce
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
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


def nccl_log(rel, version: str, env, rank: int, nodes: int) -> tuple[list[str], str | None]:
    """(lines, the algorithm allreduce runs on, None when on Socket)."""
    out = [f"NCCL version {version}+cuda12.4"]
    name = env.get("NCCL_NET_PLUGIN")
    if not name or env.get("NCCL_NET") == "Socket":
        return out + ["Using network Socket"], "RING"
    lib = f"libnccl-net-{name}.so"
    found = any(os.path.isfile(os.path.join(d, lib)) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d)
    lines, loaded = plugin_lines(rel, name, lib, found)
    out += lines
    if env.get("NCCL_COLLNET_ENABLE"):
        out.append(collnet_env_line(rel))
    if not loaded:
        return out + ["Using network Socket"], "RING"
    out.append(f"Using network {name}")                                      # init.cc "Using network %s"
    if env.get("NCCL_TUNER_PLUGIN"):
        out += tuner_lines(rel, env["NCCL_TUNER_PLUGIN"])
    if env.get("NCCL_COLLNET_ENABLE") != "1":
        return out, "RING"
    if nodes < 2:   # init.cc
        return out + [f"Communicator has {nodes} nodes which is less than CollNet node threshold 2, "
                      "disabling CollNet"], "RING"
    lines, ok = collnet_lines(rel, rank, name)
    out += lines
    if not ok:
        return out, "RING"
    chain = "COLLNET_CHAIN" if env.get("CLUSTERTOOL_TUNER_CONFIG") else "RING"
    if chain == "COLLNET_CHAIN":   # the plugin's own line (native/src/ct_collnet.c)
        algo = env.get("CLUSTERTOOL_COLLNET_ALGO", "sharded")
        out.append(f"clustertool: CollNet rank {rank}/{nodes}: first iallreduce (1048576 bytes) running, "
                   f"algorithm {algo}")
    return out, chain


def main() -> int:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    env, rank, world = os.environ, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if env.get("STANDIN_FAIL_RANK") == str(rank):
        print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp: unhandled system error", flush=True)
        return 1
    hosts = rendezvous(rank, world)
    version = env.get("STANDIN_NCCL", "2.28.9")
    rel = REL[version]
    p = f"standin:{os.getpid()}:{os.getpid()} [0] NCCL "
    lines, algo = nccl_log(rel, version, env, rank, len(set(hosts)))
    # debug.cc: INFO "host:pid:tid [dev] NCCL INFO msg"; WARN "\nhost:pid:tid [dev] file:line NCCL WARN msg"
    print("\n".join(f"\n{p[:-5]} transport.cc:464 NCCL {ln}" if ln.startswith("WARN ") else f"{p}INFO {ln}"
                    for ln in lines), flush=True)
    doc = {"rank": rank, "torch": "standin", "nccl": version, "results": [], "stopped_before": None}
    per_mb = float(env.get("STANDIN_SECONDS_PER_MB", "0"))
    deadline = float(args.get("--deadline", "0"))
    last_size, last_s = 0, 0.0
    for size in map(int, args["--sizes"].split(",")):
        if not next_size_fits(deadline, time.time(), last_size, last_s, size):
            doc["stopped_before"] = size
            break
        if env.get("STANDIN_HANG") == "1":
            time.sleep(3600)
        began = time.time()
        time.sleep(per_mb * size / (1 << 20))
        if (line := algo_line(rel, size, algo)) and (rel != (2, 23) or rank == 0):
            print(p + "INFO " + line, flush=True)
        t = 100.0 + size / 1e4
        algbw = size / (t * 1e-6) / 1e9
        doc["results"].append({"size": size, "time_us": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
                               "wrong": 0, "rank": rank, "world": world})
        last_size, last_s = size, time.time() - began
        with open(args["--out"], "w") as f:
            json.dump(doc, f)
    with open(args["--out"], "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

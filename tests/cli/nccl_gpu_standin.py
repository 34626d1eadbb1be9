"""Stand-in for bench/nccl_gpu_worker.py where no GPU, CUDA or NCCL exists (this machine).

It is NOT NCCL: it prints the log lines NCCL prints (formats from NCCL's source, see
tests/unit/test_nccl_log.py), deciding from the environment the proof gave it the way NCCL
decides (plugin found on LD_LIBRARY_PATH by name, NCCL_NET, NCCL_COLLNET_ENABLE, distinct
NCCL_HOSTID per rank), meets the other ranks over TCP at MASTER_ADDR:MASTER_PORT (so the
namespaces and links the proof built must really work), and writes results the way the
worker does. STANDIN_FAIL_RANK=r makes rank r exit 1.
"""

import json
import os
import socket
import sys
import time


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


def main() -> int:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    env, rank, world = os.environ, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if env.get("STANDIN_FAIL_RANK") == str(rank):
        print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp: unhandled system error", flush=True)
        return 1
    hosts = rendezvous(rank, world)
    p = f"standin:{os.getpid()}:{os.getpid()} [0] NCCL INFO "
    out = [p + "NCCL version 2.26.6+cuda12.8"]
    name = env.get("NCCL_NET_PLUGIN")
    lib_dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = name and any(os.path.isfile(os.path.join(d, f"libnccl-net-{name}.so")) for d in lib_dirs)
    if name and not found:
        out.append(p + f"NET/Plugin: Could not find: {name} libnccl-net-{name}.so")
    if found and env.get("NCCL_NET", "") != "Socket":
        out += [p + f"NET/Plugin: Loaded net plugin {name} (v10)",
                p + f"NET/Plugin: Loaded collnet plugin {name} (v10)",
                p + f"Using network {name}"]
        nodes = len(set(hosts))
        if env.get("NCCL_COLLNET_ENABLE") == "1":
            if nodes < 2:
                out.append(p + f"Communicator has {nodes} nodes which is less than CollNet node threshold 2, "
                           "disabling CollNet")
            else:
                out += [p + f"CollNet 00/0 : {rank} [send] via COLLNET/{name}/0", p + f"rank {rank} Connected CollNet"]
                algo = "COLLNET_CHAIN" if env.get("CLUSTERTOOL_TUNER_CONFIG") else "RING"
        collnet = env.get("NCCL_COLLNET_ENABLE") == "1" and nodes >= 2
    else:
        out.append(p + "Using network Socket")
        collnet = False
    results = []
    for size in map(int, args["--sizes"].split(",")):
        if collnet:
            out.append(p + f"AllReduce: {size} Bytes -> Algo {algo} proto SIMPLE channel{{Lo..Hi}}={{0..0}}")
        t = 100.0 + size / 1e4
        algbw = size / (t * 1e-6) / 1e9
        results.append({"size": size, "time_us": t, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
                        "wrong": 0, "rank": rank, "world": world})
    print("\n".join(out), flush=True)
    with open(args["--out"], "w") as f:
        json.dump({"rank": rank, "torch": "standin", "nccl": "2.26.6", "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

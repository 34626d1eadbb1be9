"""The GPU proof's plan: arguments, variants, rank environments, namespace/tc and reducer commands.

Pure functions (no process, namespace or GPU is touched here), used by bench/nccl_gpu.py
and unit-tested in tests/unit/test_nccl_gpu_plan.py. The verdict and the report are in
bench/nccl_gpu_report.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"
WORKER = Path(__file__).resolve().parent / "nccl_gpu_worker.py"
DDP_WORKER = Path(__file__).resolve().parent / "nccl_gpu_ddp.py"
# allreduce variants, then the training step (ddp-X runs with the environment of allreduce variant X)
VARIANTS = ("socket", "net", "collnet-sharded", "collnet-ring", "collnet-servers")
DDP_VARIANTS = {"ddp-socket": "socket", "ddp-net": "net", "ddp-sharded": "collnet-sharded",
                "ddp-servers": "collnet-servers"}
ALL_VARIANTS = VARIANTS + tuple(DDP_VARIANTS)
BASIC = ("socket", "net", "collnet-sharded", "collnet-ring")
SUBNET = "10.213.249"           # inside the local provider's 10.213.0.0/16, apart from its clusters
NET_LIB, TUNER_LIB, REDUCER = "libnccl-net-clustertool.so", "libnccl-tuner-clustertool.so", "clustertool-reducer"
DEBUG_SUBSYS = "INIT,NET,GRAPH,TUNING,COLL,ENV"
RANK_MARGIN_S = 5.0             # ranks stop by themselves this long before their share ends

# --plan: argument sets. `full` is issue 31's GPU run: an unpaced pass (Socket is the baseline there), a
# paced pass at --pace (1gbit unless given) with the reduction servers, and the training step, in one budget.
PLANS: dict[str, dict] = {
    "basic": {"variants": ",".join(BASIC), "sizes": "1M:256M", "iters": 5, "warmup": 2, "budget": 480},
    "full": {"variants": "socket,net,collnet-sharded,collnet-ring", "paced": "net,collnet-sharded,collnet-servers",
             "ddp": "ddp-socket", "ddp_paced": "ddp-net,ddp-servers", "pace": "1gbit", "sizes": "4M:64M",
             "paced_sizes": "64M", "iters": 20, "warmup": 3, "budget": 420, "ddp_seconds": 25},
}


def load_nccl_log():
    """clustertool.plugin.nccl_log, also where clustertool's own dependencies are not installed."""
    sys.path.insert(0, str(REPO))
    try:
        from clustertool.plugin import nccl_log
        return nccl_log
    except ImportError:
        path = REPO / "clustertool" / "plugin" / "nccl_log.py"
        spec = importlib.util.spec_from_file_location("nccl_log", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["nccl_log"] = mod
        spec.loader.exec_module(mod)
        return mod


# ---------------- pure: arguments, environments, commands ----------------
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"bad size {text!r} (want e.g. 1M, 256M, 65536)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def size_list(spec: str) -> list[int]:
    """'1M:256M' -> 1M, 2M, ... 256M (doubling); 'A,B,C' -> those sizes. Multiples of 4 bytes."""
    if ":" in spec:
        lo, hi = (parse_size(s) for s in spec.split(":", 1))
        if lo > hi:
            raise ValueError(f"bad size range {spec!r}: {lo} > {hi}")
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
    else:
        sizes = [parse_size(s) for s in spec.split(",") if s.strip()]
    if not sizes or any(s % 4 for s in sizes):
        raise ValueError(f"bad sizes {spec!r}: float32 buffers need multiples of 4 bytes")
    return sizes


def parse_rate(text: str) -> int | None:
    """'10gbit' -> 10_000_000_000 bits/s; 'none' or '0' -> None (unshaped)."""
    if text.strip().lower() in ("none", "0", ""):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", text.strip().lower())
    if not m:
        raise ValueError(f"bad rate {text!r} (want e.g. 1gbit, 400mbit, none)")
    return int(float(m.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)])


@dataclass(frozen=True)
class Spec:
    """One variant as asked for: `name` as the user spells it (collnet-servers@1gbit), `base` the
    allreduce variant whose environment it runs with, `pace` the CLUSTERTOOL_LINK_RATE of its ranks
    and reducers (None: unpaced)."""

    name: str
    base: str
    ddp: bool = False
    pace: str | None = None
    pace_bits: int | None = None

    @property
    def plugin(self) -> bool:
        return self.base != "socket"

    @property
    def collnet(self) -> bool:
        return self.base.startswith("collnet")

    @property
    def servers(self) -> bool:
        return self.base == "collnet-servers"

    @property
    def algo(self) -> str | None:
        return self.base.split("-", 1)[1] if self.collnet else None


def parse_variants(text: str, pace: str | None = None) -> list[Spec]:
    """'socket,net,collnet-servers@1gbit,ddp-net@1gbit' -> Specs. `pace` paces every plugin variant
    that names no rate of its own; NCCL's Socket cannot be paced (it does not read the variable)."""
    specs: list[Spec] = []
    for item in (v.strip() for v in text.split(",")):
        if not item:
            continue
        name, _, rate = item.partition("@")
        if name not in ALL_VARIANTS:
            raise ValueError(f"unknown variant {name!r}; choose from {', '.join(ALL_VARIANTS)} (NAME@RATE paces one)")
        base = DDP_VARIANTS.get(name, name)
        if base == "socket" and rate:
            raise ValueError(f"{item}: NCCL's Socket transport cannot be paced (CLUSTERTOOL_LINK_RATE is read only by "
                             "the plugin and the reducer); it runs unpaced as a reference")
        rate = rate or (pace if base != "socket" else None) or ""
        bits = parse_rate(rate) if rate else None
        spec = Spec(f"{name}@{rate}" if bits else name, base, name in DDP_VARIANTS, rate if bits else None, bits)
        if any(s.name == spec.name for s in specs):
            raise ValueError(f"variant {spec.name} is asked for twice")
        specs.append(spec)
    if not specs:
        raise ValueError(f"no variant given; choose from {', '.join(ALL_VARIANTS)}")
    return specs


def plan_variants(plan: dict, pace: str | None) -> str:
    """The variant list of a --plan: unpaced allreduce, paced allreduce, then the training step."""
    rate = pace or plan.get("pace", "")

    def paced(key: str) -> list[str]:
        return [f"{v}@{rate}" for v in plan.get(key, "").split(",") if v]

    parts = [plan["variants"], *paced("paced"), plan.get("ddp", ""), *paced("ddp_paced")]
    return ",".join(p for p in parts if p)


# What the proof itself sets per rank and variant: --nccl-env may not change these.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NCCL_HOSTID", "NCCL_NET",
                "NCCL_NET_PLUGIN", "NCCL_COLLNET_ENABLE", "NCCL_TUNER_PLUGIN", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
                "NCCL_DEBUG_FILE", "CLUSTERTOOL_TUNER_CONFIG", "CLUSTERTOOL_COLLNET_ALGO", "CLUSTERTOOL_REDUCERS",
                "CLUSTERTOOL_LINK_RATE", "CLUSTERTOOL_COLLNET_STATS", "CUDA_MPS_PIPE_DIRECTORY",
                "CUDA_MPS_LOG_DIRECTORY")


def parse_nccl_env(items: list[str]) -> dict[str, str]:
    """['NCCL_P2P_DISABLE=1', ...] -> {name: value}; a malformed or reserved name is a ValueError."""
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"bad --nccl-env {item!r} (want NAME=VALUE, e.g. NCCL_P2P_DISABLE=1)")
        if name in RESERVED_ENV:
            raise ValueError(f"--nccl-env {name}: the proof sets {name} itself for each variant")
        env[name] = value
    return env


def variant_shares(remaining: float, variants_left: int, cap: float | None = None) -> float:
    """Seconds the next variant may take: an even share of what is left (later variants inherit
    what an earlier one did not use), at most `cap`."""
    share = max(remaining, 0.0) / max(variants_left, 1)
    return min(share, cap) if cap else share


def tbf(bits: int) -> list[str]:
    """tc tbf arguments for `bits` per second (the local provider's shaping: burst >= 192 KiB)."""
    burst = max(bits // 800, 196608)
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "100ms"]


def choose_mode(requested: str, have_ip: bool, have_tc: bool, root: bool) -> tuple[str, str]:
    """('netns' or 'hostid', a note saying why)."""
    can_netns = have_ip and have_tc and root
    if requested == "netns" and not can_netns:
        missing = [w for w, ok in (("ip", have_ip), ("tc", have_tc), ("root", root)) if not ok]
        raise ValueError(f"--mode netns needs {', '.join(missing)}; use --mode hostid")
    if requested == "netns" or (requested == "auto" and can_netns):
        return "netns", "each rank in its own network namespace on a shaped veth link"
    why = "asked for" if requested == "hostid" else "no " + "/".join(
        w for w, ok in (("ip", have_ip), ("tc", have_tc), ("root", root)) if not ok)
    return "hostid", f"ranks on loopback with distinct NCCL_HOSTID ({why})"


def netns_names(tag: str, n: int) -> tuple[str, list[str]]:
    return f"{tag}sw", [f"{tag}r{i}" for i in range(n)]


def server_ns(tag: str, i: int) -> str:
    return f"{tag}s{i}"


def rank_addr(mode: str, rank: int) -> str:
    return f"{SUBNET}.{10 + rank}" if mode == "netns" else "127.0.0.1"


def server_addr(mode: str, i: int) -> str:
    """Reducer i's address: its own namespace (another host) in netns mode, else loopback."""
    return f"{SUBNET}.{30 + i}" if mode == "netns" else "127.0.0.1"


def _ns_link(sw: str, ns: str, i: int, addr: str, bits: int | None, veth: str) -> list[list[str]]:
    cmds = [["ip", "netns", "add", ns],
            ["ip", "-n", sw, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
            ["ip", "-n", sw, "link", "set", veth, "master", "br0"],
            ["ip", "-n", sw, "link", "set", veth, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"]]
    if bits:
        cmds += [["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", *tbf(bits)],
                 ["tc", "-n", sw, "qdisc", "replace", "dev", veth, "root", *tbf(bits)]]
    return cmds


def netns_setup_argvs(tag: str, n: int, bits: int | None, servers: int = 0) -> list[list[str]]:
    """A bridge namespace, one namespace per rank (eth0 = SUBNET.10+i/24) and one per reduction
    server (SUBNET.30+i/24), both ends of every link shaped."""
    sw, ranks = netns_names(tag, n)
    cmds = [["ip", "netns", "add", sw], ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", sw, "link", "set", "br0", "up"]]
    for i, ns in enumerate(ranks):
        cmds += _ns_link(sw, ns, i, rank_addr("netns", i), bits, f"v{i}")
    for i in range(servers):
        cmds += _ns_link(sw, server_ns(tag, i), i, server_addr("netns", i), bits, f"s{i}")
    return cmds


def netns_teardown_argvs(tag: str, n: int, servers: int = 0) -> list[list[str]]:
    sw, ranks = netns_names(tag, n)
    return ([["ip", "netns", "del", ns] for ns in ranks + [server_ns(tag, i) for i in range(servers)]]
            + [["ip", "netns", "del", sw]])


def lo_shape_argvs(bits: int) -> list[list[str]]:
    return [["tc", "qdisc", "replace", "dev", "lo", "root", *tbf(bits)]]


def lo_unshape_argvs() -> list[list[str]]:
    return [["tc", "qdisc", "del", "dev", "lo", "root"]]


def rank_argv(mode: str, tag: str, rank: int, python: str, worker_args: list[str],
              worker: Path | None = None) -> list[str]:
    cmd = [python, str(worker or WORKER), *worker_args]
    if mode == "netns":
        return ["ip", "netns", "exec", netns_names(tag, rank + 1)[1][rank], *cmd]
    return cmd


def reducer_argv(mode: str, tag: str, i: int, binary: Path, port_file: Path) -> list[str]:
    """Reduction server i, as `clustertool run --plugin` starts one (clustertool/jobs/reducers.py):
    its own port (0: the kernel picks), written to a port file once it listens."""
    cmd = [str(binary), "--bind", server_addr(mode, i), "--port", "0", "--port-file", str(port_file)]
    return ["ip", "netns", "exec", server_ns(tag, i), *cmd] if mode == "netns" else cmd


def tuner_table_text() -> str:
    """What collnet variants ask NCCL for: CollNet chain (1 GPU per node; Direct needs NVSwitch)."""
    return ("collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks\n"
            "allreduce,0,64G,collnet_chain,simple,-1,-1,-1\n")


def variant_env(variant: str, base: dict[str, str], *, rank: int, world: int, mode: str, port: int, tag: str,
                build: Path, table: Path | None, buffsize: int | None = None, extra: dict[str, str] | None = None,
                reducers: list[str] | None = None, pace: str | None = None,
                stats: Path | None = None) -> dict[str, str]:
    """The whole environment of one rank of one (allreduce) variant: inherited NCCL_* and
    CLUSTERTOOL_* settings are dropped (a stray NCCL_NET would change what is measured); plugin
    variants get the pace, the stats file and (servers) the reducers; `extra` (--nccl-env) is last."""
    env = _variant_env(variant, base, rank=rank, world=world, mode=mode, port=port, tag=tag, build=build,
                       table=table, buffsize=buffsize)
    if variant != "socket":
        if pace:
            env["CLUSTERTOOL_LINK_RATE"] = pace
        if stats is not None:
            env["CLUSTERTOOL_COLLNET_STATS"] = str(stats)
        if variant == "collnet-servers":
            env["CLUSTERTOOL_REDUCERS"] = ",".join(reducers or [])
    env.update(extra or {})
    return env


def _variant_env(variant: str, base: dict[str, str], *, rank: int, world: int, mode: str, port: int, tag: str,
                 build: Path, table: Path | None, buffsize: int | None) -> dict[str, str]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (choose from {', '.join(VARIANTS)})")
    ifname = "eth0" if mode == "netns" else "lo"
    env = {k: v for k, v in base.items() if not k.startswith(("NCCL_", "CLUSTERTOOL_"))}
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
        "MASTER_ADDR": rank_addr(mode, 0), "MASTER_PORT": str(port),
        "NCCL_HOSTID": f"{tag}-host{rank}",          # a different node to NCCL: its net carries the traffic
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS,
        "NCCL_SOCKET_IFNAME": ifname, "NCCL_IB_DISABLE": "1",
        "CLUSTERTOOL_SOCKET_IFNAME": ifname,
    })
    if buffsize:
        env["NCCL_BUFFSIZE"] = str(buffsize)
    if variant == "socket":
        env.update({"NCCL_NET": "Socket", "NCCL_COLLNET_ENABLE": "0"})
        return env
    ld = ":".join(p for p in (str(build), base.get("LD_LIBRARY_PATH", "")) if p)
    # by name: NCCL 2.19/2.20 only try libnccl-net-<name>.so on the loader path
    env.update({"NCCL_NET_PLUGIN": "clustertool", "LD_LIBRARY_PATH": ld, "CLUSTERTOOL_NET_FORWARD": "0"})
    if variant == "net":
        env["NCCL_COLLNET_ENABLE"] = "0"
        return env
    env.update({"NCCL_COLLNET_ENABLE": "1", "CLUSTERTOOL_COLLNET_ALGO": variant.split("-", 1)[1]})
    if table is not None:   # by path: every release dlopens NCCL_TUNER_PLUGIN as given first
        env.update({"NCCL_TUNER_PLUGIN": str(build / TUNER_LIB), "CLUSTERTOOL_TUNER_CONFIG": str(table)})
    return env


def reducer_env(base: dict[str, str], pace: str | None) -> dict[str, str]:
    """A reducer's environment: none of the caller's NCCL_/CLUSTERTOOL_ settings, the variant's pace
    (one bucket per reducer process and direction: each reducer is a server host's NIC)."""
    env = {k: v for k, v in base.items() if not k.startswith(("NCCL_", "CLUSTERTOOL_"))}
    if pace:
        env["CLUSTERTOOL_LINK_RATE"] = pace
    return env


@dataclass
class VariantRun:
    name: str
    results: list[dict] = field(default_factory=list)   # per size: time_us (slowest rank), algbw, busbw, wrong (sum)
    logs: list = field(default_factory=list)            # NcclLog per rank
    texts: list[str] = field(default_factory=list)      # raw log per rank
    error: str | None = None
    nccl: str | None = None
    torch: str | None = None
    share_s: float = 0.0                                 # the seconds of the budget it was given
    stopped_before: int | None = None                   # the first size the budget left out
    spec: Spec | None = None                             # None: the plain variant `name`, unpaced
    stats: list[dict] = field(default_factory=list)      # the plugin's per-communicator stats lines
    ddp: dict | None = None                              # the training step's merged result
    reducer_texts: list[str] = field(default_factory=list)   # each reducer's stderr

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = Spec(self.name, DDP_VARIANTS.get(self.name, self.name), self.name in DDP_VARIANTS)


def merge_ranks(per_rank: list[dict]) -> list[dict]:
    """Per size: the slowest rank's time (the collective ends when its last rank does), wrong summed."""
    by_size: dict[int, dict] = {}
    for doc in per_rank:
        for r in doc["results"]:
            cur = by_size.setdefault(r["size"], dict(r, wrong=0, time_us=0.0))
            cur["wrong"] += r["wrong"]
            if r["time_us"] >= cur["time_us"]:
                cur.update(time_us=r["time_us"], algbw=r["algbw"], busbw=r["busbw"])
    return [by_size[s] for s in sorted(by_size)]


def merge_ddp(per_rank: list[dict]) -> dict | None:
    """The training step over all ranks: the slowest rank's samples/s, and whether every rank ended
    with the same parameters (a wrong allreduce leaves them apart)."""
    done = [d for d in per_rank if d.get("steps")]
    if not done:
        return None
    slow = min(done, key=lambda d: d["samples_per_s"])
    sums = {tuple(d.get("checksum") or ()) for d in done}
    return dict(slow, ranks=len(done), same_params=len(sums) == 1 and len(done) == len(per_rank))


_STATS_RE = re.compile(r"clustertool-collnet-stats (\{.*\})")
STATS_KEYS = ("rank", "nranks", "algo", "window", "requests", "bytes", "mean_bytes", "inflight_mean", "inflight_max",
              "post_to_done_p50_us", "post_to_done_p99_us", "test_p99_us")


def parse_stats(texts: list[str]) -> list[dict]:
    """The plugin's per-communicator stats: JSON lines (a CLUSTERTOOL_COLLNET_STATS file) or
    `clustertool-collnet-stats {JSON}` lines in a rank's log (the variable set to 1). A line that
    is not a JSON object with a request count is skipped."""
    out = []
    for text in texts:
        for line in text.splitlines():
            m = _STATS_RE.search(line)
            raw = m.group(1) if m else line.strip()
            if not raw.startswith("{"):
                continue
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("requests"), (int, float)):
                out.append(doc)
    return out

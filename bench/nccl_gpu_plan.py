"""The GPU proof's plan: arguments, rank environments, namespace/tc commands, verdict, report.

Pure functions (no process, namespace or GPU is touched here), used by bench/nccl_gpu.py
and unit-tested in tests/unit/test_nccl_gpu_plan.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"
WORKER = Path(__file__).resolve().parent / "nccl_gpu_worker.py"
VARIANTS = ("socket", "net", "collnet-sharded", "collnet-ring")
SUBNET = "10.213.249"           # inside the local provider's 10.213.0.0/16, apart from its clusters
NET_LIB, TUNER_LIB = "libnccl-net-clustertool.so", "libnccl-tuner-clustertool.so"
DEBUG_SUBSYS = "INIT,NET,GRAPH,TUNING,COLL,ENV"


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


# What the proof itself sets per rank and variant: --nccl-env may not change these.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NCCL_HOSTID", "NCCL_NET",
                "NCCL_NET_PLUGIN", "NCCL_COLLNET_ENABLE", "NCCL_TUNER_PLUGIN", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
                "NCCL_DEBUG_FILE", "CLUSTERTOOL_TUNER_CONFIG", "CLUSTERTOOL_COLLNET_ALGO")


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


def rank_addr(mode: str, rank: int) -> str:
    return f"{SUBNET}.{10 + rank}" if mode == "netns" else "127.0.0.1"


def netns_setup_argvs(tag: str, n: int, bits: int | None) -> list[list[str]]:
    """A bridge namespace and one namespace per rank (eth0 = SUBNET.10+i/24), both link ends shaped."""
    sw, ranks = netns_names(tag, n)
    cmds = [["ip", "netns", "add", sw], ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", sw, "link", "set", "br0", "up"]]
    for i, ns in enumerate(ranks):
        cmds += [["ip", "netns", "add", ns],
                 ["ip", "-n", sw, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns],
                 ["ip", "-n", sw, "link", "set", f"v{i}", "master", "br0"],
                 ["ip", "-n", sw, "link", "set", f"v{i}", "up"],
                 ["ip", "-n", ns, "link", "set", "lo", "up"],
                 ["ip", "-n", ns, "addr", "add", f"{rank_addr('netns', i)}/24", "dev", "eth0"],
                 ["ip", "-n", ns, "link", "set", "eth0", "up"]]
        if bits:
            cmds += [["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", *tbf(bits)],
                     ["tc", "-n", sw, "qdisc", "replace", "dev", f"v{i}", "root", *tbf(bits)]]
    return cmds


def netns_teardown_argvs(tag: str, n: int) -> list[list[str]]:
    sw, ranks = netns_names(tag, n)
    return [["ip", "netns", "del", ns] for ns in ranks] + [["ip", "netns", "del", sw]]


def lo_shape_argvs(bits: int) -> list[list[str]]:
    return [["tc", "qdisc", "replace", "dev", "lo", "root", *tbf(bits)]]


def lo_unshape_argvs() -> list[list[str]]:
    return [["tc", "qdisc", "del", "dev", "lo", "root"]]


def rank_argv(mode: str, tag: str, rank: int, python: str, worker_args: list[str]) -> list[str]:
    cmd = [python, str(WORKER), *worker_args]
    if mode == "netns":
        return ["ip", "netns", "exec", netns_names(tag, rank + 1)[1][rank], *cmd]
    return cmd


def tuner_table_text() -> str:
    """What collnet variants ask NCCL for: CollNet chain (1 GPU per node; Direct needs NVSwitch)."""
    return ("collective,min_bytes,max_bytes,algorithm,protocol,channels,nodes,ranks\n"
            "allreduce,0,64G,collnet_chain,simple,-1,-1,-1\n")


def variant_env(variant: str, base: dict[str, str], *, rank: int, world: int, mode: str, port: int, tag: str,
                build: Path, table: Path | None, buffsize: int | None = None,
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of one rank of one variant: inherited NCCL_* settings are dropped
    (a stray NCCL_NET would change what is measured), `extra` (--nccl-env) is added last."""
    env = _variant_env(variant, base, rank=rank, world=world, mode=mode, port=port, tag=tag, build=build,
                       table=table, buffsize=buffsize)
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


def verdict(runs: list[VariantRun], nl, asked: list[str] | None = None) -> tuple[int, list[str]]:
    """(exit code, problems): every variant asked for ran, the plugin is NCCL's net where asked,
    CollNet ran where asked, and every element is right."""
    ran = {run.name for run in runs}
    problems = [f"{name}: not run (the budget or an interrupt ended the proof first)"
                for name in (asked or []) if name not in ran]
    for run in runs:
        if not run.results and not run.error:
            problems.append(f"{run.name}: no allreduce finished")
        if run.error:
            problems.append(f"{run.name}: {run.error}")
        wrong = sum(r["wrong"] for r in run.results)
        if wrong:
            problems.append(f"{run.name}: {wrong} wrong elements against the CPU reference")
        if not run.logs or run.error:
            continue   # a failed run's logs stop early: the error is the finding
        if run.name == "socket":
            nets = {log.network for log in run.logs}
            if nets != {"Socket"}:
                problems.append(f"socket: NCCL ran on {', '.join(sorted(map(str, nets)))}, not its Socket transport")
            continue
        if not all(nl.plugin_loaded(log) for log in run.logs):
            bad = next(log for log in run.logs if not nl.plugin_loaded(log))
            why = bad.no_plugin or f"Using network {bad.network}"
            problems.append(f"{run.name}: NCCL did not load the clustertool plugin ({why})")
        elif run.name.startswith("collnet"):
            states = [nl.collnet_state(log) for log in run.logs]
            off = [why for on, why in states if not on]
            if off:
                problems.append(f"{run.name}: NCCL did not run CollNet: {off[0]}")
            elif not nl.ran_collnet(run.logs):
                problems.append(f"{run.name}: CollNet was set up but no allreduce ran on it")
    return (1 if problems else 0), problems


def _fmt_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def format_report(runs: list[VariantRun], nl, header: str) -> str:
    lines = [header, "", f"{'variant':<16} {'size':>6} {'time(us)':>11} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
             f"{'#wrong':>7}  algorithm/protocol (NCCL's choice)"]
    for run in runs:
        choice = nl.algos_by_size(run.logs) if run.logs else {}
        for r in run.results:
            algo = "/".join(choice.get(r["size"], ("-", "-")))
            lines.append(f"{run.name:<16} {_fmt_size(r['size']):>6} {r['time_us']:>11.1f} {r['algbw']:>11.3f} "
                         f"{r['busbw']:>11.3f} {r['wrong']:>7}  {algo}")
        if run.stopped_before:
            lines.append(f"{run.name:<16} stopped before {_fmt_size(run.stopped_before)}: the next size would "
                         f"not end inside its {run.share_s:.0f} s share of --budget")
        if run.error:
            lines.append(f"{run.name:<16} failed: {run.error}")
    sizes = sorted({r["size"] for run in runs for r in run.results})
    busbw = {run.name: {r["size"]: r["busbw"] for r in run.results} for run in runs}
    names = [run.name for run in runs]
    lines += ["", "busbw (GB/s) side by side", f"{'size':>6} " + " ".join(f"{n:>16}" for n in names)
              + ("  sharded/socket" if {"socket", "collnet-sharded"} <= set(names) else "")]
    for s in sizes:
        row = f"{_fmt_size(s):>6} " + " ".join(
            f"{busbw[n][s]:>16.3f}" if s in busbw[n] else f"{'-':>16}" for n in names)
        a, b = busbw.get("socket", {}).get(s), busbw.get("collnet-sharded", {}).get(s)
        if a and b:
            row += f"  {b / a:>14.2f}x"
        lines.append(row)
    return "\n".join(lines)


def format_evidence(runs: list[VariantRun], nl, limit: int = 16) -> str:
    lines = ["", "What NCCL's logs say (rank 0, and the reason where a rank differs)"]
    for run in runs:
        if not run.logs:
            continue
        log = run.logs[0]
        on, why = nl.collnet_state(log)
        lines.append(f"[{run.name}] NCCL {log.version or '?'}; network {log.network or '?'}; net plugin "
                     f"{log.net_plugin or '-'} (v{log.net_abi or '?'}); CollNet plugin {log.collnet_plugin or '-'} "
                     f"(v{log.collnet_abi or '?'}); tuner {log.tuner_plugin or '-'}; CollNet "
                     f"{'on' if on else 'off'}: {why}")
        for text in nl.key_lines(run.texts[0], limit=limit):
            lines.append(f"    {text}")
    return "\n".join(lines)

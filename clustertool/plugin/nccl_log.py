"""What an NCCL_DEBUG=INFO log says about the net plugin, CollNet and the algorithms NCCL ran.

Pure functions over log text, for the GPU proof (``bench/nccl_gpu.py``) and ``plugin check``.
Every pattern is written from NCCL's own format strings at the release tags users have
(2.19 .. 2.30); each ``_RE`` names where its format lives. Lines are matched anywhere after
NCCL's prefix (``host:pid:tid [dev] NCCL INFO ``, with an optional timestamp since 2.28), so
prefixes and interleaved output from other programs do not matter.

Which ABI version NCCL picked: 2.24 and later always print ``Loaded net plugin NAME (vN)``;
2.19 .. 2.23 print it only when they fall back to an older version than the newest they
know, so without that line the version is the newest the release asks for
(:func:`newest_net_abi`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# NCCL's algorithm and protocol numbers (src/include/devcomm.h, 2.19 .. 2.30) and the
# names ncclAlgoToString / ncclProtoToString print (src/collectives.cc, 2.24 .. 2.30).
ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
COLLNET_ALGOS = frozenset({"COLLNET_DIRECT", "COLLNET_CHAIN"})

# (first release, newest net/CollNet ABI it asks for, newest tuner ABI), from each tag's
# loader: src/net.cc up to 2.25, src/plugin/net.cc after; src/misc/tuner.cc, src/plugin/tuner.cc.
_ABI_BY_RELEASE: tuple[tuple[tuple[int, int], int, int], ...] = (
    ((2, 19), 7, 1),
    ((2, 20), 8, 1),
    ((2, 21), 8, 2),
    ((2, 22), 8, 3),
    ((2, 24), 9, 4),
    ((2, 26), 10, 4),
    ((2, 28), 11, 5),
    ((2, 30), 12, 6),
)

# ---- formats -------------------------------------------------------------------------------
# init.cc VERSION_STRING "NCCL version %d.%d.%d%s+cuda%d.%d" (2.19.3 .. 2.30.7)
_VERSION_RE = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)")
# net.cc (2.19.3 .. 2.25.1) and plugin/net/net_vN.cc (2.26.2 .. 2.30.7):
#   "NET/Plugin: Loaded net plugin %s (v%d)"; CollNet: "Loaded coll plugin" up to 2.23.4,
#   "Loaded collnet plugin" from 2.24.3
_LOADED_NET_RE = re.compile(r"NET/Plugin: Loaded net plugin (.+?) \(v(\d+)\)")
_LOADED_COLL_RE = re.compile(r"NET/Plugin: Loaded (?:coll|collnet) plugin (.+?) \(v(\d+)\)")
# init.cc "Using network %s" (2.19.3 .. 2.30.7); names may hold spaces ("AWS Libfabric")
_USING_NETWORK_RE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
# Why NCCL fell back to its internal net:
#   net.cc 2.19.3, 2.20.5  "NET/Plugin : dlerror=%s No plugin found (%s), using internal implementation"
#   net.cc 2.21.5 .. 2.25.1 "NET/Plugin: Could not find:%s. Using internal network plugin."
#   plugin_open.cc 2.26.2 .. 2.30.7 "%s/Plugin: Could not find:%s%s%s" (with "NET")
#   net.cc 2.19.3 .. 2.25.1 "NET/Plugin: Failed to find ncclNetPlugin symbol (>= v5). ..."
#   plugin/net.cc 2.26.2 .. 2.30.7 "External network plugin %s is unsupported"
# A library NCCL found but could not load (dlopen failed for another reason than ENOENT):
#   net.cc 2.19.3, 2.20.5  "NET/Plugin : Plugin load returned %d : %s." (errno, dlerror())
#   net.cc 2.21.5 .. 2.25.1 "NET/Plugin: %s" (dlerror(): "<path>: <reason>")
#   plugin_open.cc 2.26.2 .. 2.30.7 "%s/Plugin: %s: %s" (library name, dlerror())
_NO_PLUGIN_RES = (
    re.compile(r"NET/Plugin : dlerror=.*No plugin found \(([^)]*)\)"),
    re.compile(r"NET/Plugin : Plugin load returned (-?\d+ : .*?)\.?\s*$"),
    re.compile(r"NET/Plugin: Could not find: ?(.*?)\.? ?(?:Using internal network plugin\.)?\s*$"),
    re.compile(r"NET/Plugin: Failed to find ncclNetPlugin symbol \(>= v5\)()"),
    re.compile(r"External network plugin (.+?) is unsupported"),
    re.compile(r"NET/Plugin: (?!Plugin name set by env)(?!Loaded )(?!Using )(?!Could not find)"
               r"(\S+\.so\S*: .+?)\s*$"),
)
# Tuner: misc/tuner.cc 2.19.3/2.20.5 "Opened tuner: '%s'"; 2.21.5 .. 2.29.7 "TUNER/Plugin: Using tuner
# plugin %s"; plugin/tuner/tuner_vN.cc 2.30.7 "TUNER/Plugin: Using %s (v%d)"
_TUNER_RES = (
    re.compile(r"Opened tuner: '(.+?)'()"),
    re.compile(r"TUNER/Plugin: Using tuner plugin (.+?)()\s*$"),
    re.compile(r"TUNER/Plugin: Using (?!internal)(?!tuner plugin)(.+?) \(v(\d+)\)"),
)
# init.cc 2.19.3 "NCCL_COLLNET_ENABLE set by environment to %s." (NCCL_ALL);
# init.cc 2.30.7 "NCCL_COLLNET_ENABLE set by environment to %d." (NCCL_ENV)
_COLLNET_ENV_RE = re.compile(r"NCCL_COLLNET_ENABLE set by environment to (-?\d+)")
# init.cc (2.19.3 .. 2.30.7) "Communicator has %d nodes which is less than CollNet node threshold %d, disabling CollNet"
_THRESHOLD_RE = re.compile(r"Communicator has (\d+) nodes which is less than CollNet node threshold (\d+)")
# init.cc 2.19.3 .. 2.2x WARN "CollNet currently only supports up to %d GPUs per node, disabling CollNet"
_TOO_MANY_GPUS_RE = re.compile(r"CollNet currently only supports up to (\d+) GPUs per node")
# init.cc 2.30.3+ WARN "Detected mixed local CollNet device counts across ranks (min %d, max %d). ..."
_MISMATCH_RE = re.compile(r"Detected mixed local CollNet device counts across ranks \(min (\d+), max (\d+)\)")
# transport.cc (2.19.3 .. 2.30.7) WARN "Cannot initialize CollNet, using point-to-point network instead"
_SETUP_FAILED_RE = re.compile(r"Cannot initialize CollNet, using point-to-point network instead")
# coll_net.cc (2.19.3 .. 2.30.7) "CollNet %02d/%1d : %d [send] via COLLNET/%s/%d%s%s": printed by each
# channel's setup, BEFORE the connect that may still fail, so it names the device, not success.
# Success: "rank %d Connected CollNet" (coll_net.cc 2.23.4 .. 2.30.7, init.cc 2.19.3 .. 2.22.3) and
# "Connected Collnet Chains %s" (coll_net.cc 2.23.4 .. 2.30.7; one GPU per node sets up chains only).
_COLLNET_CONN_RE = re.compile(r"CollNet \d+/\d+ : \d+ \[(?:send|receive)\] via COLLNET/(\S+?)/(\d+)")
_CONNECTED_RE = re.compile(r"rank \d+ Connected CollNet|Connected Collnet Chains")
# enqueue.cc: 2.20.5 .. 2.22.3 "%ld Bytes -> Algo %d proto %d time %f" (rank 0 only up to 2.22);
#             2.23.4 "%s: %ld Bytes -> Algo %d proto %d time %f";
#             2.24.3 .. 2.30.7 "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}".
#             2.19.3 prints none.
_ALGO_RE = re.compile(
    r"NCCL INFO (?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
)
# the plugin's own lines (native/src/ct_collnet.c, ct_net.c; logged with NCCL_INIT|NCCL_NET)
_CT_FIRST_OP_RE = re.compile(r"clustertool: CollNet rank (\d+)/(\d+): first (\w+) \((\d+) bytes\) running, "
                             r"algorithm (\w+)")
_CT_NET_RE = re.compile(r"clustertool: net plugin (\S+): (.*)")
_WARN_RE = re.compile(r"NCCL WARN (.*)")


@dataclass(frozen=True)
class AlgoChoice:
    func: str           # "AllReduce"; "" where the release does not print it (2.20 .. 2.22)
    nbytes: int
    algo: str           # one of ALGOS
    proto: str          # one of PROTOS


@dataclass(frozen=True)
class NcclLog:
    version: str | None = None                  # "2.21.5"
    network: str | None = None                  # "Using network X": the net NCCL runs on
    net_plugin: str | None = None               # name from "Loaded net plugin NAME (vN)"
    net_abi: int | None = None                  # N from that line, or inferred (see module doc)
    collnet_plugin: str | None = None
    collnet_abi: int | None = None
    no_plugin: str | None = None                # why NCCL fell back to its internal net
    tuner_plugin: str | None = None
    tuner_abi: int | None = None
    collnet_env: int | None = None              # NCCL_COLLNET_ENABLE as NCCL read it
    collnet_connected: bool = False             # NCCL set up CollNet connections
    collnet_via: tuple[str, ...] = ()           # "<collnet name>/<net dev>" from "via COLLNET/..."
    threshold: tuple[int, int] | None = None    # (nodes, threshold) when below it
    too_many_gpus: bool = False
    mismatch: tuple[int, int] | None = None
    setup_failed: bool = False
    algos: tuple[AlgoChoice, ...] = ()
    plugin_collnet_ops: tuple[str, ...] = ()    # the plugin's "first <op> running" lines
    plugin_algorithm: str | None = None         # the plugin's CollNet algorithm in the first such line
    plugin_net_line: str | None = None
    warnings: tuple[str, ...] = field(default=())


def _release(version: str | None) -> tuple[int, int] | None:
    if not version:
        return None
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _newest(version: str | None, column: int) -> int | None:
    """Column 1 (net/CollNet) or 2 (tuner) of the newest _ABI_BY_RELEASE row the release reaches."""
    rel = _release(version)
    found = [(net, tuner)[column - 1] for release, net, tuner in _ABI_BY_RELEASE if rel is not None and rel >= release]
    return found[-1] if found else None


def newest_net_abi(version: str | None) -> int | None:
    """The net/CollNet ABI version a release tries first (2.19 -> 7 ... 2.30 -> 12)."""
    return _newest(version, 1)


def newest_tuner_abi(version: str | None) -> int | None:
    return _newest(version, 2)


def _algo_name(raw: str, table: tuple[str, ...]) -> str:
    if raw.isdigit():
        i = int(raw)
        return table[i] if i < len(table) else raw
    return raw.upper()


def parse_log(text: str) -> NcclLog:
    """Read one rank's (or several ranks' concatenated) NCCL log."""
    f: dict = {"algos": [], "collnet_via": [], "plugin_collnet_ops": [], "warnings": []}
    for line in text.splitlines():
        m = _VERSION_RE.search(line)
        if m and "version" not in f:
            f["version"] = ".".join(m.groups())
        if m := _USING_NETWORK_RE.search(line):
            f["network"] = m.group(1)
        if m := _LOADED_NET_RE.search(line):
            f["net_plugin"], f["net_abi"] = m.group(1), int(m.group(2))
        if m := _LOADED_COLL_RE.search(line):
            f["collnet_plugin"], f["collnet_abi"] = m.group(1), int(m.group(2))
        for rx in _NO_PLUGIN_RES:
            if m := rx.search(line):
                f.setdefault("no_plugin", line[m.start():].strip())
        for rx in _TUNER_RES:
            if m := rx.search(line):
                f["tuner_plugin"] = m.group(1)
                f["tuner_abi"] = int(m.group(2)) if m.group(2) else None
        if m := _COLLNET_ENV_RE.search(line):
            f["collnet_env"] = int(m.group(1))
        if m := _THRESHOLD_RE.search(line):
            f["threshold"] = (int(m.group(1)), int(m.group(2)))
        if _TOO_MANY_GPUS_RE.search(line):
            f["too_many_gpus"] = True
        if m := _MISMATCH_RE.search(line):
            f["mismatch"] = (int(m.group(1)), int(m.group(2)))
        if _SETUP_FAILED_RE.search(line):
            f["setup_failed"] = True
        if m := _COLLNET_CONN_RE.search(line):
            via = f"{m.group(1)}/{m.group(2)}"
            if via not in f["collnet_via"]:
                f["collnet_via"].append(via)
        if _CONNECTED_RE.search(line):
            f["collnet_connected"] = True
        if m := _ALGO_RE.search(line):
            f["algos"].append(AlgoChoice(m.group("func") or "", int(m.group("bytes")),
                                         _algo_name(m.group("algo"), ALGOS), _algo_name(m.group("proto"), PROTOS)))
        if m := _CT_FIRST_OP_RE.search(line):
            f["plugin_collnet_ops"].append(m.group(3))
            f.setdefault("plugin_algorithm", m.group(5))
        if m := _CT_NET_RE.search(line):
            f.setdefault("plugin_net_line", m.group(0))
        if m := _WARN_RE.search(line):
            f["warnings"].append(m.group(1).strip())
    for key in ("algos", "collnet_via", "plugin_collnet_ops", "warnings"):
        f[key] = tuple(f[key])
    log = NcclLog(**f)
    return _infer_abi(log)


def _infer_abi(log: NcclLog) -> NcclLog:
    """2.19 .. 2.23 name no version when they take their newest: fill it in."""
    from dataclasses import replace

    if log.net_plugin is None and log.network and log.no_plugin is None and log.network not in ("Socket", "IB"):
        log = replace(log, net_plugin=log.network, net_abi=newest_net_abi(log.version))
    if log.collnet_plugin is None and log.collnet_connected and log.net_plugin:
        log = replace(log, collnet_plugin=log.net_plugin, collnet_abi=newest_net_abi(log.version))
    if log.tuner_plugin and log.tuner_abi is None:
        log = replace(log, tuner_abi=newest_tuner_abi(log.version))
    return log


def plugin_loaded(log: NcclLog, name: str = "clustertool") -> bool:
    """NCCL loaded the plugin called `name` and runs its point-to-point on it."""
    return log.net_plugin == name and log.network == name


def collnet_state(log: NcclLog) -> tuple[bool, str]:
    """(CollNet used?, why or why not) in words a user can act on. A failed connect wins over
    "via COLLNET" and even over a connect line: NCCL then falls back to point-to-point."""
    if log.setup_failed:
        return False, "CollNet setup failed on some rank (see the plugin's WARN lines)"
    if log.collnet_connected:
        via = ", ".join(log.collnet_via)
        return True, f"CollNet connected{f' via {via}' if via else ''}"
    if log.collnet_plugin is None and log.net_plugin is None:
        return False, "NCCL did not load the net plugin, so it has no CollNet"
    if log.collnet_env is not None and log.collnet_env != 1:
        return False, f"NCCL_COLLNET_ENABLE={log.collnet_env}"
    if log.threshold:
        nodes, thr = log.threshold
        return False, (f"{nodes} node(s), below NCCL_COLLNET_NODE_THRESHOLD={thr} "
                       "(ranks on one machine need distinct NCCL_HOSTID values)")
    if log.too_many_gpus:
        return False, "more than 8 GPUs per node"
    if log.mismatch:
        return False, f"ranks report different CollNet device counts ({log.mismatch[0]}..{log.mismatch[1]})"
    if log.collnet_env is None:
        return False, "NCCL_COLLNET_ENABLE is not set to 1 (or the log lacks the ENV/INIT lines)"
    return False, ("NCCL found no CollNet channel: its graph search needs a CollNet device named like a "
                   "net device (coll=1 on a net=1 NIC), or the plugin's CollNet init reported no device")


def algos_by_size(logs: list[NcclLog], func: str = "AllReduce") -> dict[int, tuple[str, str]]:
    """The (algorithm, protocol) NCCL chose for each message size of `func`, from all ranks.

    Lines without a function name (2.20 .. 2.22) count as `func`. A size with several
    choices keeps the most frequent.
    """
    counts: dict[int, dict[tuple[str, str], int]] = {}
    for log in logs:
        for a in log.algos:
            if a.func and a.func != func:
                continue
            bucket = counts.setdefault(a.nbytes, {})
            bucket[(a.algo, a.proto)] = bucket.get((a.algo, a.proto), 0) + 1
    return {n: max(c.items(), key=lambda kv: kv[1])[0] for n, c in sorted(counts.items())}


def ran_collnet(logs: list[NcclLog]) -> bool:
    """CollNet moved data: an algorithm line names CollNet, or (2.19, which prints none) the
    plugin logged its first CollNet collective."""
    return any(a.algo in COLLNET_ALGOS for log in logs for a in log.algos) or any(
        log.plugin_collnet_ops for log in logs)


_KEY_RES = (
    _VERSION_RE, _LOADED_NET_RE, _LOADED_COLL_RE, _USING_NETWORK_RE, *_NO_PLUGIN_RES, *_TUNER_RES,
    re.compile(r"Plugin name set by env to"), re.compile(r"Successfully loaded external network plugin"),
    _COLLNET_ENV_RE, _THRESHOLD_RE, _TOO_MANY_GPUS_RE, _MISMATCH_RE, _SETUP_FAILED_RE, _COLLNET_CONN_RE,
    _CONNECTED_RE, _CT_FIRST_OP_RE, _CT_NET_RE, re.compile(r"clustertool: CollNet plugin"),
)
_MSG_RE = re.compile(r"NCCL (?:INFO|WARN) (.*)")


def key_lines(text: str, limit: int = 14, algo_lines: int = 4) -> list[str]:
    """The log lines that show which net, plugin ABI, CollNet state and algorithms NCCL used,
    NCCL's prefix removed, each message once: the evidence a report quotes. Algorithm lines:
    one per message size of 1 MiB or more, at most `algo_lines`."""
    keys: list[str] = []
    algos: dict[int, str] = {}
    for line in text.splitlines():
        m = _MSG_RE.search(line)
        msg = (m.group(1) if m else line).strip()
        if a := _ALGO_RE.search(line):
            size = int(a.group("bytes"))
            if size >= 1 << 20 and size not in algos and len(algos) < algo_lines:
                algos[size] = msg
            continue
        if msg in keys or not any(rx.search(line) for rx in _KEY_RES):
            continue
        if _COLLNET_CONN_RE.search(line) and any(_COLLNET_CONN_RE.search(k) for k in keys):
            continue   # one "via COLLNET" line is enough
        keys.append(msg)
    return keys[: max(limit - len(algos), 0)] + list(algos.values())

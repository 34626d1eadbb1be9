"""The GPU proof's CPU side (bench/nccl_gpu_plan.py, bench/nccl_gpu_report.py, bench/nccl_gpu.py's
arguments): sizes, rates, variants and their pace, mode choice, namespace/tc and reducer commands,
each variant's environment, the plugin's stats, the verdict that sets the exit code, the report
and issue 31's targets. NCCL cannot run here (no GPU on this machine): the logs fed to
the verdict are lines in NCCL's own formats (see test_nccl_log.py for where each comes from)."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import pytest

from clustertool.plugin import nccl_log
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402
import nccl_gpu_report as report  # noqa: E402

pytestmark = pytest.mark.unit
BUILD = Path("/opt/ct/build")
P = "gpu-a:1:2 [0] NCCL INFO "


def env_for(variant, rank=0, mode="netns", table=Path("/tmp/t.csv"), base=None):
    return plan.variant_env(variant, base or {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"},
                            rank=rank, world=4, mode=mode, port=29500, tag="ctg1", build=BUILD, table=table)


def test_sizes_double_from_a_range_or_come_as_a_list():
    assert plan.size_list("1M:256M") == [1 << (20 + i) for i in range(9)]
    assert plan.size_list("64K,3M") == [65536, 3 << 20]
    for bad in ("0", "3", "2M:1M", "lots", "1M:"):
        with pytest.raises(ValueError):
            plan.size_list(bad)


def test_rates_and_tbf_burst():
    assert plan.parse_rate("10gbit") == 10**10 and plan.parse_rate("400mbit") == 4 * 10**8
    assert plan.parse_rate("none") is None
    with pytest.raises(ValueError):
        plan.parse_rate("fast")
    assert plan.tbf(10**9) == ["tbf", "rate", "1000000000bit", "burst", "1250000", "latency", "100ms"]
    assert plan.tbf(10**6)[4] == "196608", "small rates keep the 192 KiB minimum burst"


def test_mode_is_netns_only_with_ip_tc_and_root():
    assert plan.choose_mode("auto", True, True, True)[0] == "netns"
    mode, note = plan.choose_mode("auto", True, False, True)
    assert mode == "hostid" and "no tc" in note and "NCCL_HOSTID" in note
    assert plan.choose_mode("auto", True, True, False) == ("hostid",
                                                           "ranks on loopback with distinct NCCL_HOSTID (no root)")
    assert plan.choose_mode("hostid", True, True, True)[0] == "hostid"
    with pytest.raises(ValueError, match="needs root"):
        plan.choose_mode("netns", True, True, False)


def test_namespace_commands_build_a_shaped_star_and_remove_it_all():
    setup = plan.netns_setup_argvs("ctg1", 3, 10**9)
    assert all(c[0] in ("ip", "tc") and all(isinstance(a, str) for a in c) for c in setup)
    assert ["ip", "netns", "add", "ctg1sw"] in setup and ["ip", "netns", "add", "ctg1r2"] in setup
    addrs = [c[-3] for c in setup if c[3:5] == ["addr", "add"]]
    assert addrs == ["10.213.249.10/24", "10.213.249.11/24", "10.213.249.12/24"]
    shaped = [c for c in setup if c[0] == "tc"]
    assert len(shaped) == 6, "both ends of every link"
    assert {c[2] for c in shaped} == {"ctg1r0", "ctg1r1", "ctg1r2", "ctg1sw"}
    assert not [c for c in plan.netns_setup_argvs("ctg1", 3, None) if c[0] == "tc"]
    assert plan.netns_teardown_argvs("ctg1", 3) == [["ip", "netns", "del", n] for n in
                                                    ("ctg1r0", "ctg1r1", "ctg1r2", "ctg1sw")]
    assert plan.lo_shape_argvs(10**9)[0][:6] == ["tc", "qdisc", "replace", "dev", "lo", "root"]
    assert plan.lo_unshape_argvs() == [["tc", "qdisc", "del", "dev", "lo", "root"]]


def test_rank_argv_enters_the_rank_namespace_only_in_netns_mode():
    av = plan.rank_argv("netns", "ctg1", 2, "/usr/bin/python3", ["--out", "/tmp/x"])
    assert av[:4] == ["ip", "netns", "exec", "ctg1r2"] and av[4] == "/usr/bin/python3"
    assert av[5].endswith("bench/nccl_gpu_worker.py") and av[-2:] == ["--out", "/tmp/x"]
    assert plan.rank_argv("hostid", "ctg1", 2, "py", [])[0] == "py"


def test_every_rank_is_its_own_host_and_inherited_nccl_settings_are_dropped():
    base = {"PATH": "/bin", "NCCL_ALGO": "Tree", "CLUSTERTOOL_COLLNET_ALGO": "ring", "NCCL_NET_PLUGIN": "ofi"}
    envs = [env_for("collnet-sharded", rank=r, base=base) for r in range(4)]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 4
    assert all("NCCL_ALGO" not in e for e in envs)
    assert envs[3]["RANK"] == "3" and envs[3]["WORLD_SIZE"] == "4" and envs[3]["MASTER_ADDR"] == "10.213.249.10"
    assert envs[0]["NCCL_DEBUG"] == "INFO" and envs[0]["NCCL_DEBUG_SUBSYS"] == "INIT,NET,GRAPH,TUNING,COLL,ENV"
    assert envs[0]["NCCL_SOCKET_IFNAME"] == envs[0]["CLUSTERTOOL_SOCKET_IFNAME"] == "eth0"
    lo = env_for("net", mode="hostid")
    assert lo["NCCL_SOCKET_IFNAME"] == "lo" and lo["MASTER_ADDR"] == "127.0.0.1"


def test_variant_environments():
    sock = env_for("socket")
    assert sock["NCCL_NET"] == "Socket" and sock["NCCL_COLLNET_ENABLE"] == "0" and "NCCL_NET_PLUGIN" not in sock
    net = env_for("net")
    assert net["NCCL_NET_PLUGIN"] == "clustertool", "by name: NCCL 2.19/2.20 only look for libnccl-net-<name>.so"
    assert net["LD_LIBRARY_PATH"] == "/opt/ct/build:/usr/local/cuda/lib64" and net["NCCL_COLLNET_ENABLE"] == "0"
    assert "NCCL_TUNER_PLUGIN" not in net
    sharded, ring = env_for("collnet-sharded"), env_for("collnet-ring")
    assert sharded["NCCL_COLLNET_ENABLE"] == ring["NCCL_COLLNET_ENABLE"] == "1"
    assert (sharded["CLUSTERTOOL_COLLNET_ALGO"], ring["CLUSTERTOOL_COLLNET_ALGO"]) == ("sharded", "ring")
    assert sharded["NCCL_TUNER_PLUGIN"] == "/opt/ct/build/libnccl-tuner-clustertool.so"
    assert sharded["CLUSTERTOOL_TUNER_CONFIG"] == "/tmp/t.csv"
    assert "NCCL_TUNER_PLUGIN" not in env_for("collnet-ring", table=None), "--no-tuner lets NCCL choose"
    with pytest.raises(ValueError, match="unknown variant"):
        env_for("collnet")


def test_tuner_table_makes_the_built_tuner_ask_for_collnet_chain(tmp_path, monkeypatch):
    lib_path = REPO / "native" / "build" / "libnccl-tuner-clustertool.so"
    if not lib_path.is_file():
        pytest.skip("needs the built plugin (make -C native plugins)")
    table = tmp_path / "t.csv"
    table.write_text(plan.tuner_table_text())
    monkeypatch.setenv("CLUSTERTOOL_TUNER_CONFIG", str(table))
    lib = ctypes.CDLL(str(lib_path))
    fn = ctypes.CFUNCTYPE

    class TunerV2(ctypes.Structure):   # ncclTuner_v2_t (NCCL 2.21), the simplest entry to drive
        _fields_ = [("name", ctypes.c_char_p),
                    ("init", fn(ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p))),
                    ("getCollInfo", fn(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))),
                    ("destroy", fn(ctypes.c_int, ctypes.c_void_p))]

    t = TunerV2.in_dll(lib, "ncclTunerPlugin_v2")
    ctx = ctypes.c_void_p()
    assert t.init(4, 4, None, ctypes.byref(ctx)) == 0
    algo, proto, ch = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(0)
    t.getCollInfo(ctx, 4, 64 << 20, 1, 0, 1, ctypes.byref(algo), ctypes.byref(proto), ctypes.byref(ch))
    assert (nccl_log.ALGOS[algo.value], nccl_log.PROTOS[proto.value]) == ("COLLNET_CHAIN", "SIMPLE")
    t.destroy(ctx)


def _run(name, lines, results=None, error=None):
    text = "\n".join(P + line for line in lines)
    return plan.VariantRun(name, results=results if results is not None else [dict(size=1 << 20, time_us=100.0,
                                                                                    algbw=1.0, busbw=1.5, wrong=0)],
                           logs=[nccl_log.parse_log(text)], texts=[text], error=error)


GOOD_NET = ["NCCL version 2.26.6+cuda12.8", "NET/Plugin: Loaded net plugin clustertool (v10)",
            "Using network clustertool"]
GOOD_COLL = GOOD_NET + ["NET/Plugin: Loaded collnet plugin clustertool (v10)", "rank 0 Connected CollNet",
                        "AllReduce: 1048576 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..0}"]


def good_runs():
    return [_run("socket", ["NCCL version 2.26.6+cuda12.8", "Using network Socket"]), _run("net", GOOD_NET),
            _run("collnet-sharded", GOOD_COLL), _run("collnet-ring", GOOD_COLL)]


def test_verdict_passes_when_nccl_used_the_plugin_and_collnet_where_asked():
    assert report.verdict(good_runs(), nccl_log) == (0, [])


def test_verdict_fails_when_nccl_fell_back_to_its_own_net():
    runs = good_runs()
    runs[1] = _run("net", ["NET/Plugin: Could not find: libnccl-net-clustertool.so libnccl-net-clustertool.so",
                           "Using network Socket"])
    code, problems = report.verdict(runs, nccl_log)
    assert code == 1 and problems == ["net: NCCL did not load the clustertool plugin (NET/Plugin: Could not find: "
                                      "libnccl-net-clustertool.so libnccl-net-clustertool.so)"]


def test_verdict_fails_when_collnet_was_asked_for_but_did_not_run():
    runs = good_runs()
    runs[2] = _run("collnet-sharded", GOOD_NET + [
        "Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet"])
    ring_algo = "AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..0}"
    runs[3] = _run("collnet-ring", GOOD_NET + ["rank 0 Connected CollNet", ring_algo])
    code, problems = report.verdict(runs, nccl_log)
    assert code == 1
    assert problems[0].startswith("collnet-sharded: NCCL did not run CollNet: 1 node(s), below NCCL_COLLNET_NODE")
    assert problems[1] == "collnet-ring: CollNet was set up but no allreduce ran on it"


def test_verdict_fails_on_wrong_elements_a_crashed_rank_or_a_baseline_off_socket():
    runs = good_runs()
    runs[0] = _run("socket", ["Using network clustertool"])
    runs[1].results[0]["wrong"] = 7
    runs[3].error = "rank 1 exited 1: RuntimeError: NCCL error"
    code, problems = report.verdict(runs, nccl_log)
    assert code == 1 and problems == ["socket: NCCL ran on clustertool, not its Socket transport",
                                      "net: 7 wrong elements against the CPU reference",
                                      "collnet-ring: rank 1 exited 1: RuntimeError: NCCL error"]


def test_merge_takes_the_slowest_rank_and_sums_wrong():
    docs = [{"results": [dict(size=4, time_us=10.0, algbw=2.0, busbw=3.0, wrong=1)]},
            {"results": [dict(size=4, time_us=30.0, algbw=0.5, busbw=0.7, wrong=2)]}]
    assert plan.merge_ranks(docs) == [dict(size=4, time_us=30.0, algbw=0.5, busbw=0.7, wrong=3)]


def test_report_puts_variants_side_by_side_with_the_sharded_over_socket_ratio():
    runs = good_runs()
    runs[0].results[0]["busbw"] = 1.0
    runs[2].results[0]["busbw"] = 1.4
    text = report.format_report(runs, nccl_log, "NCCL 2.26.6, 4 ranks")
    assert text.splitlines()[0] == "NCCL 2.26.6, 4 ranks"
    assert "collnet-sharded      1M       100.0       1.000       1.400       0  COLLNET_CHAIN/SIMPLE" in text
    side = text.split("busbw (GB/s) side by side")[1].splitlines()
    assert side[1].split() == ["size", "socket", "net", "collnet-sharded", "collnet-ring", "net/socket",
                               "sharded/socket", "ring/socket"]
    assert side[2].split() == ["1M", "1.000", "1.500", "1.400", "1.500", "1.50x", "1.40x", "1.50x"]
    evidence = report.format_evidence(runs, nccl_log)
    assert "[collnet-sharded] NCCL 2.26.6; network clustertool; net plugin clustertool (v10)" in evidence
    assert "    rank 0 Connected CollNet" in evidence


def test_arguments_are_checked_before_anything_runs(capsys):
    a = nccl_gpu.parse_args(["--ranks", "2", "--sizes", "1M,4M", "--variants", "net,socket", "--rate", "none"])
    assert (a.size_list, a.variant_list, a.rate_bits) == ([1 << 20, 4 << 20], ["net", "socket"], None)
    for bad in (["--ranks", "1"], ["--sizes", "5"], ["--variants", "collnet"], ["--rate", "quick"], ["--iters", "0"],
                ["--pace", "fast"], ["--variants", "net,net"]):
        with pytest.raises(SystemExit) as e:
            nccl_gpu.parse_args(bad)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "choose from socket, net, collnet-sharded, collnet-ring, collnet-servers, ddp-socket" in err
    assert "bad rate 'fast'" in err and "variant net is asked for twice" in err


def test_nccl_env_settings_are_checked_and_added_last():
    extra = plan.parse_nccl_env(["NCCL_P2P_DISABLE=1", "NCCL_IB_HCA==mlx5_0"])
    assert extra == {"NCCL_P2P_DISABLE": "1", "NCCL_IB_HCA": "=mlx5_0"}
    env = plan.variant_env("net", {"NCCL_NET": "IB"}, rank=0, world=2, mode="hostid", port=1, tag="t",
                           build=Path("/b"), table=None, extra={"NCCL_SOCKET_IFNAME": "eth9"})
    assert env["NCCL_SOCKET_IFNAME"] == "eth9" and "NCCL_NET" not in env
    for bad in (["NCCL_NET=Socket"], ["NCCL_HOSTID=h"], ["=1"], ["NCCL X=1"], ["NCCL_P2P_DISABLE"]):
        with pytest.raises(ValueError):
            plan.parse_nccl_env(bad)


def test_each_variant_gets_an_even_share_of_what_is_left():
    assert plan.variant_shares(400, 4) == 100
    assert plan.variant_shares(330, 3) == 110          # the first left 10 s unused: the rest inherit it
    assert plan.variant_shares(400, 4, cap=60) == 60
    assert plan.variant_shares(-5, 2) == 0


RECORDED = REPO / "tests" / "unit" / "data" / "nccl-2.28.9-h200"


def test_recorded_h200_logs_of_nccl_2_28_9_pass_the_verdict():
    """The logs of the first run on a GPU (one H200, NCCL 2.28.9 from torch 2.11, 4 ranks on
    loopback), ranks 0 and 1 of each variant: what real NCCL printed, not a stand-in."""
    runs = []
    for name in plan.BASIC:
        texts = [(RECORDED / f"{name}.rank{r}.log").read_text() for r in (0, 1)]
        run = plan.VariantRun(name, texts=texts, logs=[nccl_log.parse_log(t) for t in texts],
                              results=[{"size": 1 << 20, "time_us": 1.0, "algbw": 1.0, "busbw": 1.0, "wrong": 0}])
        runs.append(run)
    assert report.verdict(runs, nccl_log) == (0, [])
    sharded = runs[2].logs[0]
    assert (sharded.version, sharded.net_plugin, sharded.net_abi, sharded.tuner_abi) == ("2.28.9", "clustertool", 11, 5)
    assert nccl_log.collnet_state(sharded) == (True, "CollNet connected via clustertool/0")
    big = {n: a for n, a in nccl_log.algos_by_size(runs[2].logs).items() if n >= 1 << 20}   # the timed sizes
    assert sorted(big) == [1 << k for k in range(20, 29)] and set(big.values()) == {("COLLNET_CHAIN", "SIMPLE")}
    assert {a for n, a in nccl_log.algos_by_size(runs[0].logs).items() if n >= 1 << 20} == {("RING", "SIMPLE")}
    assert runs[0].logs[0].network == "Socket"
    assert nccl_log.collnet_state(runs[1].logs[0]) == (False, "NCCL_COLLNET_ENABLE=0")
    evidence = report.format_evidence(runs, nccl_log)
    assert "Connected Collnet Chains" in evidence and "TUNER/Plugin: Using clustertool (v5)" in evidence


# ---------------- issue 31: variants and their pace, servers, stats, the training step, targets ----------------
def test_variants_take_a_pace_of_their_own_or_from_pace_and_socket_never():
    specs = plan.parse_variants("socket,net,collnet-servers@400mbit,ddp-servers", pace="1gbit")
    assert [(s.name, s.base, s.ddp, s.pace) for s in specs] == [
        ("socket", "socket", False, None), ("net@1gbit", "net", False, "1gbit"),
        ("collnet-servers@400mbit", "collnet-servers", False, "400mbit"),
        ("ddp-servers@1gbit", "collnet-servers", True, "1gbit")]
    assert specs[2].pace_bits == 4 * 10**8 and specs[2].servers and specs[2].algo == "servers"
    assert [s.name for s in plan.parse_variants("net,net@1gbit")] == ["net", "net@1gbit"]
    for bad, why in (("socket@1gbit", "cannot be paced"), ("ddp-socket@1gbit", "cannot be paced"),
                     ("net@fast", "bad rate"), ("collnet", "unknown variant"), ("", "no variant given"),
                     ("net@1gbit,net@1gbit", "asked for twice")):
        with pytest.raises(ValueError, match=why):
            plan.parse_variants(bad)


def test_the_full_plan_is_an_unpaced_pass_a_paced_pass_then_training():
    a = nccl_gpu.parse_args(["--plan", "full"])
    assert a.variant_list == ["socket", "net", "collnet-sharded", "collnet-ring", "net@1gbit", "collnet-sharded@1gbit",
                              "collnet-servers@1gbit", "ddp-socket", "ddp-net@1gbit", "ddp-servers@1gbit"]
    assert (a.budget, a.iters, a.warmup, a.ddp_seconds) == (420, 20, 3, 25)
    assert a.size_list == [4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20] and a.paced_size_list == [64 << 20]
    b = nccl_gpu.parse_args(["--plan", "full", "--pace", "2gbit", "--sizes", "1M,2M", "--budget", "300"])
    assert b.variant_list[4] == "net@2gbit" and b.paced_size_list == [1 << 20, 2 << 20] and b.budget == 300
    c = nccl_gpu.parse_args(["--plan", "full", "--variants", "net,collnet-servers", "--pace", "1gbit"])
    assert c.variant_list == ["net@1gbit", "collnet-servers@1gbit"]
    d = nccl_gpu.parse_args([])
    assert d.variant_list == list(plan.BASIC) and d.budget == 480 and d.size_list[-1] == 256 << 20


def test_plugin_variants_get_the_pace_the_stats_file_and_servers_their_reducers():
    kw = dict(rank=1, world=4, mode="hostid", port=1, tag="t", build=BUILD, table=Path("/t.csv"), pace="1gbit",
              stats=Path("/w/s.jsonl"), reducers=["127.0.0.1:4001", "127.0.0.1:4002"])
    base = {"CLUSTERTOOL_LINK_RATE": "9gbit", "CLUSTERTOOL_REDUCERS": "10.0.0.9:1", "CUDA_MPS_PIPE_DIRECTORY": "/m"}
    sock = plan.variant_env("socket", base, **kw)
    assert not {"CLUSTERTOOL_LINK_RATE", "CLUSTERTOOL_COLLNET_STATS", "CLUSTERTOOL_REDUCERS"} & set(sock)
    assert sock["CUDA_MPS_PIPE_DIRECTORY"] == "/m", "MPS reaches every CUDA client"
    net = plan.variant_env("net", base, **kw)
    assert net["CLUSTERTOOL_LINK_RATE"] == "1gbit" and net["CLUSTERTOOL_COLLNET_STATS"] == "/w/s.jsonl"
    assert "CLUSTERTOOL_REDUCERS" not in net
    serv = plan.variant_env("collnet-servers", base, **kw)
    assert serv["CLUSTERTOOL_REDUCERS"] == "127.0.0.1:4001,127.0.0.1:4002"
    assert serv["CLUSTERTOOL_COLLNET_ALGO"] == "servers" and serv["NCCL_COLLNET_ENABLE"] == "1"
    assert "CLUSTERTOOL_LINK_RATE" not in plan.variant_env("net", base, **dict(kw, pace=None))
    red = plan.reducer_env({"PATH": "/bin", "NCCL_DEBUG": "INFO", "CLUSTERTOOL_LINK_RATE": "9gbit"}, "1gbit")
    assert red == {"PATH": "/bin", "CLUSTERTOOL_LINK_RATE": "1gbit"}
    assert "CLUSTERTOOL_LINK_RATE" not in plan.reducer_env({}, None)
    for name in ("CLUSTERTOOL_LINK_RATE", "CLUSTERTOOL_REDUCERS", "CLUSTERTOOL_COLLNET_STATS",
                 "CUDA_MPS_PIPE_DIRECTORY"):
        with pytest.raises(ValueError, match="sets"):
            plan.parse_nccl_env([f"{name}=x"])


def test_reducers_listen_on_port_0_with_a_port_file_on_loopback_or_in_their_own_namespace():
    assert plan.reducer_argv("hostid", "ctg1", 2, Path("/b/clustertool-reducer"), Path("/w/r2.port")) == [
        "/b/clustertool-reducer", "--bind", "127.0.0.1", "--port", "0", "--port-file", "/w/r2.port"]
    av = plan.reducer_argv("netns", "ctg1", 2, Path("/b/clustertool-reducer"), Path("/w/r2.port"))
    assert av[:4] == ["ip", "netns", "exec", "ctg1s2"] and av[5:7] == ["--bind", "10.213.249.32"]
    setup = plan.netns_setup_argvs("ctg1", 2, 10**9, servers=2)
    assert ["ip", "-n", "ctg1s1", "addr", "add", "10.213.249.31/24", "dev", "eth0"] in setup
    assert len([c for c in setup if c[0] == "tc"]) == 8, "both ends of 2 rank and 2 server links"
    assert plan.netns_teardown_argvs("ctg1", 2, servers=2)[-3:] == [["ip", "netns", "del", "ctg1s0"],
                                                                  ["ip", "netns", "del", "ctg1s1"],
                                                                  ["ip", "netns", "del", "ctg1sw"]]


STAT = {"rank": 0, "nranks": 4, "algo": "sharded", "window": 8, "requests": 100, "bytes": 100 * 262144,
        "mean_bytes": 262144, "inflight_mean": 6.0, "inflight_max": 8, "post_to_done_p50_us": 800.0,
        "post_to_done_p99_us": 1500.0, "test_p99_us": 4.0}


def test_stats_come_from_the_stats_file_or_the_log_line_and_aggregate_over_ranks():
    other = dict(STAT, rank=1, requests=300, bytes=300 * 131072, inflight_mean=2.0, inflight_max=5,
                 post_to_done_p50_us=1000.0, post_to_done_p99_us=9000.0, test_p99_us=2.0)
    text = "\n".join([json.dumps(STAT), "not json", "{broken",
                      f"{P}clustertool-collnet-stats {json.dumps(other)}", json.dumps({"requests": "x"})])
    stats = plan.parse_stats([text])
    assert stats == [STAT, other]
    run = plan.VariantRun("collnet-sharded", stats=stats + [dict(STAT, rank=2, requests=0)])
    row = report.stats_rows(run)
    assert row["requests_per_rank"] == 200 and row["mean_bytes"] == (100 * 262144 + 300 * 131072) / 400
    assert row["inflight_mean"] == (6.0 * 100 + 2.0 * 300) / 400 and row["inflight_max"] == 8
    assert (row["p50_us"], row["p99_us"], row["test_p99_us"]) == (900.0, 9000.0, 4.0)
    assert report.stats_rows(plan.VariantRun("collnet-ring")) is None
    table = report.format_stats([run, plan.VariantRun("collnet-ring"), plan.VariantRun("net")])
    assert "collnet-ring    no stats (a plugin build that writes none" in table and "\nnet " not in table


def test_ddp_merge_takes_the_slowest_rank_and_checks_the_parameters_agree():
    docs = [dict(samples_per_s=100.0, steps=10, checksum=[1.0, 2.0], rank=0),
            dict(samples_per_s=90.0, steps=10, checksum=[1.0, 2.0], rank=1)]
    merged = plan.merge_ddp(docs)
    assert merged["samples_per_s"] == 90.0 and merged["same_params"] and merged["ranks"] == 2
    assert not plan.merge_ddp([docs[0], dict(docs[1], checksum=[1.0, 2.5])])["same_params"]
    assert not plan.merge_ddp([docs[0], dict(docs[1], steps=0)])["same_params"], "a rank without a result"
    assert plan.merge_ddp([dict(docs[0], steps=0)]) is None


def _paced(name, busbw, size=64 << 20, world=4):
    spec = plan.parse_variants(name)[0]
    return plan.VariantRun(spec.name, spec=spec, results=[dict(size=size, time_us=1.0, algbw=1.0, busbw=busbw, wrong=0,
                                                               world=world)])


def test_targets_are_the_issues_ratios_measured_where_the_variants_ran():
    runs = [_paced("socket", 1.0, 16 << 20), _paced("collnet-sharded", 1.1, 16 << 20),
            _paced("net@1gbit", 0.12), _paced("collnet-sharded@1gbit", 0.1), _paced("collnet-servers@1gbit", 0.18)]
    runs[1].stats = [STAT]
    for ddp, rate in (("ddp-net@1gbit", 100.0), ("ddp-servers@1gbit", 130.0)):
        spec = plan.parse_variants(ddp)[0]
        runs.append(plan.VariantRun(spec.name, spec=spec, ddp=dict(samples_per_s=rate, steps=5, seconds=1.0)))
    got = {t["target"]: (round(t["value"], 3) if t["value"] is not None else None, t["met"])
           for t in report.targets(runs)}
    assert got["unpaced: CollNet sharded / Socket busbw at 16M"] == (1.1, True)
    assert got["unpaced: CollNet sharded / Socket busbw at 32M"] == (None, None), "not measured, not guessed"
    assert got["unpaced: CollNet sharded requests in flight (mean)"] == (6.0, True)
    assert got["paced 1gbit: plugin net busbw / B at 64M"] == (0.96, True)          # 0.12 GB/s / 125 MB/s
    assert got["paced 1gbit: CollNet sharded busbw / B at 64M"] == (0.8, False)
    assert got["paced 1gbit: servers busbw / B at 64M"] == (1.44, True)
    assert got["paced 1gbit: servers / plugin net busbw at 64M"] == (1.5, True)
    assert got["training step: samples/s servers / plugin net (same pace)"] == (1.3, True)
    text = report.format_targets(report.targets(runs))
    assert "paced 1gbit: CollNet sharded busbw / B at 64M" in text and "0.80B   >= 0.90B  NOT met" in text


def test_a_paced_table_says_when_the_plugin_did_not_pace():
    text = report.format_report([_paced("socket", 1.2), _paced("net@1gbit", 1.25)], nccl_log, "h")
    paced = text.split("paced at 1gbit")[1]
    assert "B = 125.0 MB/s" in paced and "socket is reference only (unpaced)" in paced
    assert paced.splitlines()[2].split() == ["64M", "1.250", "10.00", "1.200"]
    assert "NOTE: busbw 10.0x B is above what any allreduce can reach through links of B (1.50x for 4 ranks)" in text
    assert "NOTE" not in report.format_report([_paced("net@1gbit", 0.12)], nccl_log, "h")


SERVERS_LOG = GOOD_COLL + ["clustertool: CollNet rank 0/4: first iallreduce (131072 bytes) running, algorithm servers"]


def test_verdict_fails_servers_that_fell_back_to_sharded_and_names_the_plugins_reason():
    ok = _run("collnet-servers", SERVERS_LOG)
    assert report.verdict([ok], nccl_log) == (0, [])
    warn = ("\nvm:1:2 [0] ct_coll_settings.c:230 NCCL WARN clustertool: rank 0/4: reduction server 127.0.0.1:9 "
            "(server 2 of 4) cannot be reached from rank 0 (Connection refused); CollNet uses sharded instead of "
            "servers on every rank")
    fell = _run("collnet-servers", GOOD_COLL + [
        "clustertool: CollNet rank 0/4: first iallreduce (131072 bytes) running, algorithm sharded"])
    fell.texts[0] += warn
    fell.logs = [nccl_log.parse_log(fell.texts[0])]
    code, problems = report.verdict([fell], nccl_log)
    assert code == 1 and problems[0].startswith("collnet-servers: the plugin ran sharded, not the reduction servers "
                                                "(clustertool: rank 0/4: reduction server 127.0.0.1:9 (server 2 of 4)")
    silent = _run("collnet-servers", GOOD_COLL)
    assert report.verdict([silent], nccl_log)[1] == [
        "collnet-servers: the plugin logged no CollNet algorithm, not the reduction servers"]


def test_verdict_on_the_training_step():
    spec = plan.parse_variants("ddp-servers@1gbit")[0]
    good = _run("x", SERVERS_LOG)
    run = plan.VariantRun(spec.name, spec=spec, results=[], logs=good.logs, texts=good.texts,
                          ddp=dict(samples_per_s=10.0, steps=3, seconds=1.0, same_params=True))
    assert report.verdict([run], nccl_log) == (0, [])
    run.ddp = None
    assert report.verdict([run], nccl_log)[1] == ["ddp-servers@1gbit: no training step finished"]
    run.ddp = dict(samples_per_s=10.0, steps=3, seconds=1.0, same_params=False)
    assert "different parameters" in report.verdict([run], nccl_log)[1][0]
    run.ddp["same_params"] = True
    run.logs = [nccl_log.parse_log("\n".join(P + ln for ln in GOOD_NET))]
    assert report.verdict([run], nccl_log)[1][0].startswith("ddp-servers@1gbit: NCCL did not run CollNet")


def test_reducer_evidence_is_one_line_per_reducer():
    text = ("clustertool-reducer: listening on 127.0.0.1:4001 (pid 9, io timeout 30000 ms, 1 reduction thread(s) per "
            "session)\nclustertool-reducer: session 00000000000000ab start: 4 ranks (127.0.0.1:1 127.0.0.1:2), "
            "server 1 of 4, chunk 131072 bytes\nclustertool-reducer: session 00000000000000ab end: 4 ranks, 512 "
            "reductions, 67108864 bytes in 2.0 s\nclustertool-reducer: session 00000000000000cd error: rank 2 "
            "(127.0.0.1:3) closed its connection (after 3 reductions, 9 bytes)\n")
    assert report.reducer_summary(0, text) == (
        "reducer 0 (127.0.0.1:4001): 1 session(s), 1 ended, 512 reductions, 67.1 MB; first error: session "
        "00000000000000cd error: rank 2 (127.0.0.1:3) closed its connection (after 3 reductions, 9 bytes)")
    assert report.reducer_summary(3, "") == "reducer 3 (never listened): 0 session(s), 0 ended, 0 reductions, 0.0 MB"

"""The GPU proof's CPU side (bench/nccl_gpu_plan.py, bench/nccl_gpu.py's arguments): sizes,
rates, mode choice, namespace/tc commands, each variant's environment, the verdict that sets
the exit code, and the report. NCCL cannot run here (no GPU on this machine): the logs fed to
the verdict are lines in NCCL's own formats (see test_nccl_log.py for where each comes from)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from clustertool.plugin import nccl_log
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import nccl_gpu  # noqa: E402
import nccl_gpu_plan as plan  # noqa: E402

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
    assert plan.verdict(good_runs(), nccl_log) == (0, [])


def test_verdict_fails_when_nccl_fell_back_to_its_own_net():
    runs = good_runs()
    runs[1] = _run("net", ["NET/Plugin: Could not find: libnccl-net-clustertool.so libnccl-net-clustertool.so",
                           "Using network Socket"])
    code, problems = plan.verdict(runs, nccl_log)
    assert code == 1 and problems == ["net: NCCL did not load the clustertool plugin (NET/Plugin: Could not find: "
                                      "libnccl-net-clustertool.so libnccl-net-clustertool.so)"]


def test_verdict_fails_when_collnet_was_asked_for_but_did_not_run():
    runs = good_runs()
    runs[2] = _run("collnet-sharded", GOOD_NET + [
        "Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet"])
    ring_algo = "AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..0}"
    runs[3] = _run("collnet-ring", GOOD_NET + ["rank 0 Connected CollNet", ring_algo])
    code, problems = plan.verdict(runs, nccl_log)
    assert code == 1
    assert problems[0].startswith("collnet-sharded: NCCL did not run CollNet: 1 node(s), below NCCL_COLLNET_NODE")
    assert problems[1] == "collnet-ring: CollNet was set up but no allreduce ran on it"


def test_verdict_fails_on_wrong_elements_a_crashed_rank_or_a_baseline_off_socket():
    runs = good_runs()
    runs[0] = _run("socket", ["Using network clustertool"])
    runs[1].results[0]["wrong"] = 7
    runs[3].error = "rank 1 exited 1: RuntimeError: NCCL error"
    code, problems = plan.verdict(runs, nccl_log)
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
    text = plan.format_report(runs, nccl_log, "NCCL 2.26.6, 4 ranks")
    assert text.splitlines()[0] == "NCCL 2.26.6, 4 ranks"
    assert "collnet-sharded      1M       100.0       1.000       1.400       0  COLLNET_CHAIN/SIMPLE" in text
    side = text.split("busbw (GB/s) side by side")[1].splitlines()
    assert side[1].split() == ["size", "socket", "net", "collnet-sharded", "collnet-ring", "sharded/socket"]
    assert side[2].split() == ["1M", "1.000", "1.500", "1.400", "1.500", "1.40x"]
    evidence = plan.format_evidence(runs, nccl_log)
    assert "[collnet-sharded] NCCL 2.26.6; network clustertool; net plugin clustertool (v10)" in evidence
    assert "    rank 0 Connected CollNet" in evidence


def test_arguments_are_checked_before_anything_runs(capsys):
    a = nccl_gpu.parse_args(["--ranks", "2", "--sizes", "1M,4M", "--variants", "net,socket", "--rate", "none"])
    assert (a.size_list, a.variant_list, a.rate_bits) == ([1 << 20, 4 << 20], ["net", "socket"], None)
    for bad in (["--ranks", "1"], ["--sizes", "5"], ["--variants", "collnet"], ["--rate", "quick"], ["--iters", "0"]):
        with pytest.raises(SystemExit) as e:
            nccl_gpu.parse_args(bad)
        assert e.value.code == 2
    assert "choose from socket, net, collnet-sharded, collnet-ring" in capsys.readouterr().err


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
    for name in plan.VARIANTS:
        texts = [(RECORDED / f"{name}.rank{r}.log").read_text() for r in (0, 1)]
        run = plan.VariantRun(name, texts=texts, logs=[nccl_log.parse_log(t) for t in texts],
                              results=[{"size": 1 << 20, "time_us": 1.0, "algbw": 1.0, "busbw": 1.0, "wrong": 0}])
        runs.append(run)
    assert plan.verdict(runs, nccl_log) == (0, [])
    sharded = runs[2].logs[0]
    assert (sharded.version, sharded.net_plugin, sharded.net_abi, sharded.tuner_abi) == ("2.28.9", "clustertool", 11, 5)
    assert nccl_log.collnet_state(sharded) == (True, "CollNet connected via clustertool/0")
    big = {n: a for n, a in nccl_log.algos_by_size(runs[2].logs).items() if n >= 1 << 20}   # the timed sizes
    assert sorted(big) == [1 << k for k in range(20, 29)] and set(big.values()) == {("COLLNET_CHAIN", "SIMPLE")}
    assert {a for n, a in nccl_log.algos_by_size(runs[0].logs).items() if n >= 1 << 20} == {("RING", "SIMPLE")}
    assert runs[0].logs[0].network == "Socket"
    assert nccl_log.collnet_state(runs[1].logs[0]) == (False, "NCCL_COLLNET_ENABLE=0")
    evidence = plan.format_evidence(runs, nccl_log)
    assert "Connected Collnet Chains" in evidence and "TUNER/Plugin: Using clustertool (v5)" in evidence

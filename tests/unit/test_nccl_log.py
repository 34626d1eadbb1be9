"""NCCL log parsing: every line below is built from NCCL's own format string at the tag named
next to it (src/debug.cc gives the "host:pid:tid [dev] NCCL INFO " prefix; WARN lines start with
a newline and carry file:line). No NCCL runs here: these are the lines real releases print."""

from __future__ import annotations

import pytest

from clustertool.plugin import nccl_log

pytestmark = pytest.mark.unit

P = "gpu-a:4242:4300 [0] NCCL INFO "


def info(msg: str) -> str:
    return P + msg


def warn(msg: str, where: str = "init.cc:1362") -> str:
    return f"\ngpu-a:4242:4300 [0] {where} NCCL WARN {msg}"


# NCCL 2.19.3 (PyTorch 2.2): v7 is the newest it asks for, found at once, so no "Loaded" line.
LOG_2_19 = "\n".join([
    info("NCCL version 2.19.3+cuda12.3"),                                       # init.cc VERSION_STRING
    info("Plugin name set by env to libnccl-net-clustertool.so"),                # net.cc ncclNetPluginInit
    info("NCCL_COLLNET_ENABLE set by environment to 1."),                        # init.cc (NCCL_ALL)
    info("clustertool: net plugin 0.1.0: TCP on veth0, device clustertool-tcp"),  # the plugin's own INFO
    info("Using network clustertool"),                                           # init.cc
    info("Opened tuner: 'clustertool'"),                                         # misc/tuner.cc
    info("CollNet 00/0 : 0 [receive] via COLLNET/clustertool/0"),                # transport/coll_net.cc recvSetup
    info("CollNet 00/0 : 0 [send] via COLLNET/clustertool/0"),                   # transport/coll_net.cc sendSetup
    info("rank 0 Connected CollNet"),                                            # init.cc collNetTrySetup
    info("clustertool: CollNet rank 0/2: first iallreduce (1048576 bytes) running, algorithm sharded"),
])

# NCCL 2.21.5 (PyTorch 2.4/2.5): v8 found at once; rank 0 prints "%ld Bytes -> Algo %d proto %d time %f".
LOG_2_21 = "\n".join([
    info("NCCL version 2.21.5+cuda12.4"),
    info("NET/Plugin: Plugin name set by env to libnccl-net-clustertool.so"),    # net.cc openNetPluginLib
    info("Using network clustertool"),
    info("TUNER/Plugin: Using tuner plugin clustertool"),                        # misc/tuner.cc
    info("1048576 Bytes -> Algo 3 proto 2 time 321.500000"),                     # enqueue.cc topoGetAlgoInfo
    info("268435456 Bytes -> Algo 3 proto 2 time 80210.000000"),
    info("4 Bytes -> Algo 1 proto 0 time 12.000000"),
])

# NCCL 2.23.4: the function name comes first.
LOG_2_23 = "\n".join([
    info("NCCL version 2.23.4+cuda12.6"),
    info("Using network clustertool"),
    info("AllReduce: 67108864 Bytes -> Algo 1 proto 2 time 20100.000000"),       # enqueue.cc
    info("Broadcast: 67108864 Bytes -> Algo 1 proto 2 time 20100.000000"),
])

# NCCL 2.26.6 (PyTorch 2.7/2.8): loader lines name the version; algorithm names are strings.
LOG_2_26 = "\n".join([
    info("NCCL version 2.26.6+cuda12.8"),
    info("NET/Plugin: Loaded net plugin clustertool (v10)"),                     # plugin/net/net_v10.cc
    info("NET/Plugin: Loaded collnet plugin clustertool (v10)"),                 # plugin/net/net_v10.cc
    info("Successfully loaded external network plugin libnccl-net-clustertool.so"),  # plugin/net.cc
    info("Using network clustertool"),
    info("CollNet 00/0 : 1 [send] via COLLNET/clustertool/0"),
    info("rank 1 Connected CollNet"),                                            # transport/coll_net.cc
    info("AllReduce: 1048576 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..1}"),  # enqueue.cc
    info("AllReduce: 268435456 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..1}"),
])

# NCCL 2.30.7 with a timestamp on WARN (NCCL_DEBUG_TIMESTAMP_LEVELS default) and the tuner's version.
LOG_2_30_MISMATCH = "\n".join([
    info("NCCL version 2.30.7+cuda13.0"),
    info("NET/Plugin: Loaded net plugin clustertool (v12)"),                     # plugin/net/net_v12.cc
    info("NET/Plugin: Loaded collnet plugin clustertool (v12)"),
    info("TUNER/Plugin: Using clustertool (v6)"),                                # plugin/tuner/tuner_v6.cc
    info("Using network clustertool"),
    info("NCCL_COLLNET_ENABLE set by environment to 1."),                        # init.cc (NCCL_ENV)
    "\n[2026-01-10 12:00:01] " + warn(
        "Detected mixed local CollNet device counts across ranks (min 1, max 2). Set "
        "NCCL_IGNORE_COLLNET_MISMATCH=1 to continue.").lstrip("\n"),             # init.cc initTransportsRank
])


def test_2_19_plugin_on_its_newest_abi_is_named_from_using_network():
    log = nccl_log.parse_log(LOG_2_19)
    assert log.version == "2.19.3"
    assert nccl_log.plugin_loaded(log) and log.net_plugin == "clustertool" and log.net_abi == 7
    assert log.collnet_plugin == "clustertool" and log.collnet_abi == 7
    assert log.tuner_plugin == "clustertool" and log.tuner_abi == 1
    assert log.collnet_env == 1 and log.collnet_via == ("clustertool/0",)
    assert nccl_log.collnet_state(log) == (True, "CollNet connected via clustertool/0")
    assert log.algos == ()                         # 2.19 prints no per-size choice ...
    assert nccl_log.ran_collnet([log])                   # ... the plugin's own line proves CollNet ran
    assert log.plugin_net_line.startswith("clustertool: net plugin 0.1.0")


def test_2_21_numeric_algorithm_lines_without_function_count_as_allreduce():
    log = nccl_log.parse_log(LOG_2_21)
    assert log.net_abi == 8 and log.tuner_abi == 2
    by = nccl_log.algos_by_size([log])
    assert by[1048576] == ("COLLNET_CHAIN", "SIMPLE") and by[268435456] == ("COLLNET_CHAIN", "SIMPLE")
    assert by[4] == ("RING", "LL")
    assert nccl_log.ran_collnet([log])


def test_2_23_function_names_filter_other_collectives():
    log = nccl_log.parse_log(LOG_2_23)
    assert log.net_abi == 8
    assert nccl_log.algos_by_size([log]) == {67108864: ("RING", "SIMPLE")}
    assert nccl_log.algos_by_size([log], func="Broadcast") == {67108864: ("RING", "SIMPLE")}
    assert not nccl_log.ran_collnet([log])


def test_2_26_loader_names_the_version_and_string_algorithms():
    log = nccl_log.parse_log(LOG_2_26)
    assert (log.net_plugin, log.net_abi, log.collnet_plugin, log.collnet_abi) == ("clustertool", 10, "clustertool", 10)
    assert nccl_log.collnet_state(log)[0]
    assert nccl_log.algos_by_size([log])[268435456] == ("COLLNET_CHAIN", "SIMPLE")


def test_2_30_mismatch_warning_with_timestamp_is_the_reason():
    log = nccl_log.parse_log(LOG_2_30_MISMATCH)
    assert log.net_abi == 12 and log.tuner_abi == 6 and log.mismatch == (1, 2)
    on, why = nccl_log.collnet_state(log)
    assert not on and "different CollNet device counts (1..2)" in why
    assert any("mixed local CollNet" in w for w in log.warnings)


@pytest.mark.parametrize("line,tag", [
    # net.cc 2.19.3 / 2.20.5
    ("NET/Plugin : dlerror=libnccl-net-clustertool.so: cannot open shared object file: No such file or directory "
     "No plugin found (libnccl-net-clustertool.so), using internal implementation", "2.20.5"),
    # net.cc 2.22.3 .. 2.25.1
    ("NET/Plugin: Could not find: /opt/ct/libnccl-net-clustertool.so libnccl-net-/opt/ct/libnccl-net-clustertool.so."
     " Using internal network plugin.", "2.24.3"),
    # plugin_open.cc 2.26.2 .. 2.30.7
    ("NET/Plugin: Could not find: libnccl-net-clustertool.so libnccl-net-clustertool.so", "2.28.9"),
    # plugin/net.cc 2.26.2 .. 2.30.7: a library exporting only versions this release does not know
    ("External network plugin libnccl-net-clustertool.so is unsupported", "2.27.7"),
    # net.cc 2.19.3 .. 2.25.1
    ("NET/Plugin: Failed to find ncclNetPlugin symbol (>= v5). ncclNetPlugin symbols v4 and lower are not supported.",
     "2.21.5"),
])
def test_fallback_to_internal_net_is_not_a_loaded_plugin(line, tag):
    log = nccl_log.parse_log("\n".join([info(f"NCCL version {tag}+cuda12.4"), info(line),
                                        info("Using network Socket")]))
    assert log.no_plugin and not nccl_log.plugin_loaded(log) and log.net_plugin is None
    assert nccl_log.collnet_state(log) == (False, "NCCL did not load the net plugin, so it has no CollNet")


def test_below_node_threshold_says_to_give_ranks_distinct_host_ids():
    log = nccl_log.parse_log("\n".join([
        info("NCCL version 2.27.7+cuda12.9"), info("NET/Plugin: Loaded net plugin clustertool (v10)"),
        info("NET/Plugin: Loaded collnet plugin clustertool (v10)"), info("Using network clustertool"),
        info("Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet"),  # init.cc
    ]))
    on, why = nccl_log.collnet_state(log)
    assert not on and "below NCCL_COLLNET_NODE_THRESHOLD=2" in why and "NCCL_HOSTID" in why


def test_loaded_but_never_connected_points_at_device_pairing():
    log = nccl_log.parse_log("\n".join([
        info("NCCL version 2.28.9+cuda12.9"), info("NET/Plugin: Loaded net plugin clustertool (v11)"),
        info("NET/Plugin: Loaded collnet plugin clustertool (v11)"), info("Using network clustertool"),
        info("NCCL_COLLNET_ENABLE set by environment to 1."),
    ]))
    on, why = nccl_log.collnet_state(log)
    assert not on and "named like a net device" in why


def test_collnet_setup_failure_and_disabled_env_are_reasons():
    failed = nccl_log.parse_log("\n".join([info("Using network clustertool"),
                                      info("NCCL_COLLNET_ENABLE set by environment to 1."),
                                     warn("Cannot initialize CollNet, using point-to-point network instead",
                                          "transport.cc:464")]))
    assert nccl_log.collnet_state(failed) == (False, "CollNet setup failed on some rank (see the plugin's WARN lines)")
    off = nccl_log.parse_log("\n".join([info("Using network clustertool"),
                                   info("NCCL_COLLNET_ENABLE set by environment to 0.")]))
    assert nccl_log.collnet_state(off) == (False, "NCCL_COLLNET_ENABLE=0")


def test_other_external_plugin_names_with_spaces_are_kept_whole():
    log = nccl_log.parse_log("\n".join([info("NCCL version 2.22.3+cuda12.4"), info("Using network AWS Libfabric")]))
    assert log.network == "AWS Libfabric" and log.net_plugin == "AWS Libfabric" and not nccl_log.plugin_loaded(log)


def test_abi_tables_follow_each_release_loader():
    net = ("2.19.3", "2.20.5", "2.23.4", "2.24.3", "2.26.2", "2.28.3", "2.30.7")
    assert [nccl_log.newest_net_abi(v) for v in net] == [7, 8, 8, 9, 10, 11, 12]
    tuner = ("2.19.3", "2.20.5", "2.21.5", "2.22.3", "2.25.1", "2.29.7", "2.30.3")
    assert [nccl_log.newest_tuner_abi(v) for v in tuner] == [1, 1, 2, 3, 4, 5, 6]
    assert nccl_log.newest_net_abi(None) is None and nccl_log.newest_net_abi("2.18.5") is None


def test_most_frequent_choice_wins_across_ranks():
    a = nccl_log.parse_log(info("AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}"))
    b = nccl_log.parse_log(info("AllReduce: 1024 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}"))
    assert nccl_log.algos_by_size([a, a, b]) == {1024: ("RING", "LL")}


@pytest.mark.parametrize("line,tag", [
    # net.cc 2.19.3 / 2.20.5 "NET/Plugin : Plugin load returned %d : %s." (errno, dlerror())
    ("NET/Plugin : Plugin load returned 2 : /opt/ct/libnccl-net-clustertool.so: version `GLIBC_2.34' not found "
     "(required by /opt/ct/libnccl-net-clustertool.so).", "2.19.3"),
    # net.cc 2.21.5 .. 2.25.1 "NET/Plugin: %s" (dlerror())
    ("NET/Plugin: /opt/ct/libnccl-net-clustertool.so: undefined symbol: ct_missing", "2.23.4"),
    # plugin_open.cc 2.26.2 .. 2.30.7 "%s/Plugin: %s: %s" (library name, dlerror())
    ("NET/Plugin: libnccl-net-clustertool.so: /opt/ct/libnccl-net-clustertool.so: wrong ELF class: ELFCLASS32",
     "2.28.9"),
])
def test_a_plugin_found_but_not_loadable_is_named_with_its_dlopen_error(line, tag):
    log = nccl_log.parse_log("\n".join([
        info(f"NCCL version {tag}+cuda12.4"), info("NET/Plugin: Plugin name set by env to libnccl-net-clustertool.so"),
        info(line), info("NET/Plugin: Could not find: clustertool. Using internal network plugin."),
        info("Using network Socket")]))
    assert not nccl_log.plugin_loaded(log)
    assert log.no_plugin == line.rstrip(".") or log.no_plugin == line, log.no_plugin
    assert "libnccl-net-clustertool.so" in log.no_plugin


def test_via_collnet_then_a_failed_connect_is_a_setup_failure():
    """coll_net.cc prints "via COLLNET" for each channel's setup, before the connect that fails."""
    log = nccl_log.parse_log("\n".join([
        info("NCCL version 2.28.9+cuda12.9"), info("NET/Plugin: Loaded net plugin clustertool (v11)"),
        info("NET/Plugin: Loaded collnet plugin clustertool (v11)"), info("Using network clustertool"),
        info("NCCL_COLLNET_ENABLE set by environment to 1."),
        info("CollNet 00/0 : 0 [receive] via COLLNET/clustertool/0"),
        info("CollNet 00/0 : 0 [send] via COLLNET/clustertool/0"),
        warn("Cannot initialize CollNet, using point-to-point network instead", "transport.cc:399"),
    ]))
    assert not log.collnet_connected and log.collnet_via == ("clustertool/0",)
    assert nccl_log.collnet_state(log) == (False, "CollNet setup failed on some rank (see the plugin's WARN lines)")


def test_connected_collnet_chains_is_success_from_2_23():
    log = nccl_log.parse_log("\n".join([
        info("NCCL version 2.30.7+cuda13.0"), info("NET/Plugin: Loaded net plugin clustertool (v12)"),
        info("Using network clustertool"), info("CollNet 00/0 : 1 [send] via COLLNET/clustertool/0"),
        info("Connected Collnet Chains  [0] 0->1->-1 [1] 0->1->-1"),                 # coll_net.cc
    ]))
    assert nccl_log.collnet_state(log) == (True, "CollNet connected via clustertool/0")

"""The search for the slow node or link (doctor/bisect.py) against simulated measurements.

A simulated cluster: every link runs at 200 Mbit/s with a 0.1 ms round trip, except what a test
makes slow (a node's every link, or one link); optional noise and dips.  The search only sees the
measurements of the pairs it asks for, as on a real cluster.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import socket
import subprocess
from collections import Counter

import pytest

from clustertool.doctor import bisect_report
from clustertool.doctor.bisect import Measurement, assess, key, max_rounds, next_matching, round_robin, search
from clustertool.doctor.netchecks import parse_iperf
from clustertool.nodeprogs import program_text, python_command

pytestmark = pytest.mark.unit

FAST, SLOW = 200e6, 50e6
RTT, DELAY = 1e-4, 0.04


def names(n):
    return [f"node-{i}" for i in range(1, n + 1)]


class Sim:
    def __init__(self, n, slow_nodes=(), slow_links=(), delayed=(), noise=0.0, dips=0.0, seed=0, failing=()):
        self.nodes = names(n)
        self.slow_nodes, self.delayed, self.failing = set(slow_nodes), set(delayed), set(failing)
        self.slow_links = {key(a, b) for a, b in slow_links}
        self.noise, self.dips, self.rng = noise, dips, random.Random(seed)
        self.rounds: list[list[tuple[str, str]]] = []

    def measure(self, r, pairs):
        self.rounds.append(list(pairs))
        out = []
        for a, b in pairs:
            if {a, b} & self.failing:
                out.append(Measurement(r, a, b, None, None, "iperf3: unable to connect to server"))
                continue
            slow = {a, b} & self.slow_nodes or key(a, b) in self.slow_links
            bw = (SLOW if slow else FAST) * (1 - self.rng.random() * self.noise)
            if self.rng.random() < self.dips:
                bw *= 0.5
            rtt = RTT * (1 + self.rng.random() * self.noise) + DELAY * len({a, b} & self.delayed)
            out.append(Measurement(r, a, b, bw, rtt))
        return out

    def run(self, **kw):
        result = search(self.nodes, self.measure, **kw)
        return result, bisect_report.findings(result, expected_bits=kw.get("expected_bits"))


def problems(found):
    return [(f.node or f.data.get("link"), f.severity, f.data.get("metric")) for f in found if f.problem]


def check_rounds_are_matchings(sim):
    """Every round: disjoint pairs, every node busy but at most one, the one out never twice running."""
    out_before = None
    for pairs in sim.rounds:
        used = [n for p in pairs for n in p]
        assert len(used) == len(set(used)), pairs
        assert len(used) == len(sim.nodes) - len(sim.nodes) % 2, pairs
        if len(used) == len(sim.nodes) - 1 and len(sim.nodes) > 3:
            (out,) = set(sim.nodes) - set(used)
            assert out != out_before, f"{out} sat out twice running"
            out_before = out
        else:
            out_before = None


def test_budget_is_ceil_log2_plus_one():
    assert [max_rounds(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33)] == [0, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7]


@pytest.mark.parametrize("n", range(2, 34))
def test_round_robin_measures_every_pair_once_in_disjoint_rounds(n):
    plan = round_robin(names(n))
    assert len(plan) == (n - 1 if n % 2 == 0 else n)
    seen = [key(a, b) for pairs in plan for a, b in pairs]
    assert len(seen) == len(set(seen)) == n * (n - 1) // 2
    for pairs in plan:
        used = [x for p in pairs for x in p]
        assert len(used) == len(set(used)) == n - n % 2


@pytest.mark.parametrize("n", range(3, 34))
def test_a_slow_node_at_any_position_is_named_alone_within_the_budget(n):
    for s in names(n):
        sim = Sim(n, slow_nodes={s})
        result, found = sim.run()
        assert problems(found) == [(s, "error", "bandwidth")], (n, s, [f.message for f in found])
        assert result.rounds <= max_rounds(n)
        assert "slow link: 50 Mbit/s with every partner vs the cluster's 200 Mbit/s (25%)" in found[0].message
        assert found[0].fix.startswith(f"`clustertool cordon {s}`")
        check_rounds_are_matchings(sim)


def test_the_slow_node_is_named_in_three_rounds_where_all_pairs_take_n_minus_one():
    """Found (round 1), split against known-good partners (round 2), confirmed (round 3)."""
    for n in (8, 16, 32):
        result, _ = Sim(n, slow_nodes={"node-5"}).run()
        assert (result.rounds, result.confirmed) == (3, True)
        assert len(round_robin(names(n))) == n - 1


@pytest.mark.parametrize("n", range(4, 34))
def test_a_link_slow_only_between_two_nodes_is_named_as_the_link(n):
    """The link is one of the first round's pairs (a link the rounds never pair cannot be seen)."""
    first = next_matching(assess(names(n), []), Counter())
    for a, b in (first[0], first[-1]):
        sim = Sim(n, slow_links={(a, b)})
        result, found = sim.run()
        assert problems(found) == [(f"{a}<->{b}", "error", "bandwidth")], (n, a, b, [f.message for f in found])
        assert found[0].node is None and found[0].data["nodes"] == [a, b]
        assert f"slow link {a} <-> {b}: 50 Mbit/s" in found[0].message and "security group" in found[0].fix
        assert result.rounds <= max_rounds(n)


@pytest.mark.parametrize("n", range(2, 34))
def test_a_clean_cluster_names_nothing_and_spends_the_budget_on_new_pairs(n):
    sim = Sim(n)
    result, found = sim.run(expected_bits=FAST)
    assert problems(found) == [] and result.rounds == max_rounds(n)
    measured = {key(a, b) for pairs in sim.rounds for a, b in pairs}
    assert len(measured) == min(n * (n - 1) // 2, sum(len(p) for p in sim.rounds))  # no pair twice
    check_rounds_are_matchings(sim)


def test_noise_within_the_threshold_names_nothing():
    for n in range(3, 34):
        for seed in range(5):
            _, found = Sim(n, noise=0.15, seed=seed).run()
            assert problems(found) == [], (n, seed)


def test_a_single_dip_is_measured_again_and_not_named():
    """One pair at half rate once (noise): its ends meet good partners, the pair is measured again."""
    for n in (4, 8, 9, 16):
        for r_dip in (1, 2):
            sim = Sim(n)
            plain = sim.measure

            def measure(r, pairs, plain=plain, r_dip=r_dip):
                got = plain(r, pairs)
                if r == r_dip:
                    got[0].bits_per_s *= 0.5
                return got

            result = search(sim.nodes, measure)
            found = bisect_report.findings(result)
            assert problems(found) == [], (n, r_dip, [f.message for f in found])


def _slower_from_round(sim, first, factor=0.7, rtt_added=0.005):
    """The whole machine slower from round ``first`` on, every pair alike (a CPU-starved host running iperf3
    and the round trips): bandwidth x ``factor``, ``rtt_added`` more round trip."""
    plain = sim.measure

    def measure(r, pairs):
        got = plain(r, pairs)
        if r >= first:
            for m in got:
                m.bits_per_s = m.bits_per_s * factor if m.bits_per_s is not None else None
                m.rtt_s = m.rtt_s + rtt_added if m.rtt_s is not None else None
        return got
    return measure


def test_rounds_in_which_the_whole_machine_runs_slower_name_nothing():
    """Against the figures of earlier rounds every pair of a slower round is slow, measured again, slow again:
    links were named on a loaded test machine.  Against its own round's median none is."""
    for n in (6, 8, 9, 16, 33):
        for first in (2, 3):
            for seed in range(3):
                sim = Sim(n, noise=0.1, seed=seed)
                result = search(sim.nodes, _slower_from_round(sim, first), expected_bits=FAST)
                assert problems(bisect_report.findings(result, expected_bits=FAST)) == [], (n, first, seed)


def test_a_slow_node_is_still_named_alone_while_the_whole_machine_runs_slower():
    for n in (6, 8, 16):
        sim = Sim(n, slow_nodes={"node-3"})
        result = search(sim.nodes, _slower_from_round(sim, 2))
        assert problems(bisect_report.findings(result)) == [("node-3", "error", "bandwidth")], n


def test_a_slow_node_is_still_named_alone_with_noise():
    for n in (5, 8, 16, 33):
        for seed in range(5):
            result, found = Sim(n, slow_nodes={"node-3"}, noise=0.15, seed=seed).run()
            assert problems(found) == [("node-3", "error", "bandwidth")], (n, seed)
            assert result.rounds <= max_rounds(n)


def test_a_node_with_added_delay_is_named_for_latency_only():
    for n in (4, 8, 16):
        result, found = Sim(n, delayed={"node-2"}).run()
        assert problems(found) == [("node-2", "error", "latency")]
        assert "high latency: 40.10 ms round trip with every partner vs the cluster's 0.10 ms" in found[0].message
        assert result.rounds <= max_rounds(n)


def test_two_slow_nodes_are_both_named():
    for n in (8, 16):
        result, found = Sim(n, slow_nodes={"node-1", "node-2"}).run()  # paired together in round 1
        assert problems(found) == [("node-1", "error", "bandwidth"), ("node-2", "error", "bandwidth")]
        assert result.rounds <= max_rounds(n)


def test_a_node_whose_every_test_fails_is_named_with_the_error():
    _, found = Sim(8, failing={"node-4"}).run()
    assert problems(found) == [("node-4", "error", "bandwidth"), ("node-4", "error", "latency")]
    assert "bandwidth test failed with every partner (iperf3: unable to connect to server)" in found[0].message


def test_two_nodes_have_no_reference_but_the_expected_rate_still_speaks():
    _, found = Sim(2, slow_nodes={"node-2"}).run()
    assert problems(found) == []
    _, found = Sim(2, slow_nodes={"node-2"}).run(expected_bits=FAST)
    assert problems(found) == [(None, "warning", None)]
    assert "median link runs at 50 Mbit/s, 25% of the expected 200 Mbit/s" in found[0].message


def test_a_pair_above_the_expected_rate_is_not_slow_even_below_the_median():
    """Heterogeneous links: a pair at 150 Mbit/s is under 0.8 x a 200 median but meets a 100 Mbit/s rate."""
    result, found = Sim(8, slow_nodes={"node-3"}).run(expected_bits=40e6)
    assert problems(found) == []
    result, found = Sim(8, slow_nodes={"node-3"}).run(expected_bits=100e6)
    assert problems(found) == [("node-3", "error", "bandwidth")]


def test_threshold_moves_the_line():
    _, found = Sim(8, slow_nodes={"node-3"}).run(threshold=0.2)  # 25% of the median is not below 20%
    assert problems(found) == []


def test_all_pairs_mode_measures_every_pair_in_n_minus_one_rounds():
    sim = Sim(8, slow_nodes={"node-6"})
    result, found = sim.run(all_pairs=True)
    assert result.rounds == 7 and len({key(a, b) for p in sim.rounds for a, b in p}) == 28
    assert problems(found) == [("node-6", "error", "bandwidth")]


def test_report_data_has_every_measurement_and_the_figures():
    result, _ = Sim(4, slow_nodes={"node-4"}).run()
    data = bisect_report.report_data(result, threshold=0.8, expected_bits=None)
    assert len(data["measurements"]) == 2 * result.rounds
    m = data["measurements"][0]
    assert set(m) == {"round", "a", "b", "bits_per_s", "rtt_s", "error"} and m["round"] == 1
    assert data["rounds"] == result.rounds and data["max_rounds"] == 3 and data["mode"] == "bisect"
    assert data["node_median_bits_per_s"]["node-4"] == SLOW and data["median_bits_per_s"] == FAST
    assert data["summary"].startswith(f"{result.rounds} round(s) of pairs (budget 3, all pairs: 3)")
    assert not any(math.isinf(v) for v in data["pairs_bits_per_s"].values())


def _free_port_pair():
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two free ports in a row")


@pytest.mark.skipif(not shutil.which("iperf3"), reason="needs iperf3")
def test_the_node_program_serves_round_trips_and_iperf3_then_stops(tmp_path):
    """nodeprogs/pairprobe.py as a node runs it (python3 reading the program on stdin), on 127.0.0.1."""
    port = _free_port_pair()
    base = {"addr": "127.0.0.1", "port": port, "echo_port": port + 1, "pidfile": str(tmp_path / "pid"),
            "lifetime": 60}

    def node(**args):
        proc = subprocess.run(["sh", "-c", python_command()], input=program_text("pairprobe", {**base, **args}),
                              capture_output=True, timeout=30)
        return proc.returncode, proc.stdout.decode().strip()

    assert node(mode="serve") == (0, "ready")
    try:
        code, out = node(mode="serve")
        assert code == 1 and out.startswith(f"error: echo port {port + 1}: ")  # one set of servers per port
        code, out = node(mode="rtt", peer="127.0.0.1", count=5, timeout=10)
        rtt = json.loads(out)
        assert code == 0 and rtt["samples"] == 5 and 0 < rtt["min_s"] <= rtt["rtt_s"] < 0.5
        iperf = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", "1", "--bidir", "-J"],
                               capture_output=True, text=True, timeout=30)
        assert parse_iperf(iperf.stdout) > 0
    finally:
        assert node(mode="stop") == (0, "")
    code, out = node(mode="rtt", peer="127.0.0.1", count=5, timeout=10)
    assert code == 1 and out == "error: Connection refused"  # stopped: nothing answers any more
    assert not (tmp_path / "pid").exists()


def test_a_pairs_round_trip_is_its_fastest_sample_not_the_median_a_starved_cpu_raises():
    """A clean cluster on a loaded box: the probe's median was 4 ms against 0.02 ms elsewhere, its fastest
    sample 0.03 ms; a delayed link has every sample slow, so its fastest is slow too."""
    from clustertool.doctor.netprobe import _rtt

    assert _rtt('{"rtt_s": 0.00398, "min_s": 0.00003, "samples": 5}', "") == (0.00003, "")
    assert _rtt('{"rtt_s": 0.0402, "min_s": 0.0401, "samples": 5}', "") == (0.0401, "")
    assert _rtt('{"rtt_s": 0.002}', "") == (0.002, "")  # a probe that sends only the median
    assert _rtt("error: refused", "")[0] is None


def test_a_port_an_outgoing_connection_holds_is_named_and_the_probe_takes_another(tmp_path, monkeypatch):
    """A node's own connection held the random port once (the leader's ssh, in Linux's ephemeral range): iperf3
    could not listen and `doctor --check links` reported the node. The node program says so, and the probe
    starts its servers on another port pair, below the ephemeral range."""
    from types import SimpleNamespace

    from clustertool.doctor import netprobe

    port = _free_port_pair()
    listener = socket.socket()   # a connection of the node's own whose local end is the port
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.connect(listener.getsockname())
    try:
        base = {"addr": "127.0.0.1", "port": port, "echo_port": port + 1, "pidfile": str(tmp_path / "pid"),
                "lifetime": 60, "mode": "serve"}
        proc = subprocess.run(["sh", "-c", python_command()], input=program_text("pairprobe", base),
                              capture_output=True, timeout=30)
        said = proc.stdout.decode().strip()
        assert proc.returncode == 1 and said == f"error: iperf3 -s exited at once on port {port} (the port in use?)"
    finally:
        held.close()
        listener.close()

    asked: list[tuple[str, int]] = []

    def run_on_nodes(session, nodes, command, timeout, stdin_data):
        mode = "serve" if b'\\"mode\\": \\"serve\\"' in stdin_data(nodes[0]) else "stop"   # its ARGS line
        asked.append((mode, probe.port))
        taken = mode == "serve" and len(asked) == 1
        results = [SimpleNamespace(node=n.name, ok=not taken, reason="exit 1",
                                   stdout=f"error: iperf3 -s exited at once on port {probe.port}" if taken else "ready")
                   for n in nodes]
        return SimpleNamespace(results=results)

    monkeypatch.setattr(netprobe, "run_on_nodes", run_on_nodes)
    nodes = [SimpleNamespace(name=f"node-{i}", address=f"10.0.0.{i}") for i in (1, 2)]
    probe = netprobe.PairProbe(SimpleNamespace(), nodes)
    assert probe.start() == {}
    assert [m for m, _ in asked] == ["serve", "stop", "serve"] and asked[0][1] == asked[1][1] != asked[2][1]
    assert all(netprobe.PORT_LOW <= p < p + 1 <= netprobe.PORT_HIGH < 32768 for _, p in asked)

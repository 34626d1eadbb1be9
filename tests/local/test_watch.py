"""`clustertool top` on a real 4-node local cluster: every node, a slowed rank, a slowed link, a clean exit.

GPU columns come from a stand-in nvidia-smi (tests/fakes/smi_loop.py) on node-2 only; the other nodes
have none and say so.  Links: the cluster's --link-rate for every node, then node-3's shaped to a quarter
of it (tc, as the local provider shapes links); traffic is iperf3 from each node to a server of this
test on the cluster's bridge.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from clustertool.providers.local import net, sysops
from tests.conftest import CLI, run_cli
from tests.fakes import dcgm_exporter, smi_loop
from tests.local.conftest import module_cluster, provider_state

pytestmark = pytest.mark.local

RATE_MBIT = 80
SLOW_SCRIPT = r"""
import os, socket, sys, time
slow = socket.gethostname() == os.environ.get("SLOW_NODE", "node-3")
print("ready", flush=True)
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    time.sleep(0.2 + (0.3 if slow else 0.0))   # the slowed rank: a sleep in its step
    print(f"step {step} loss {1.0 / (step + 1):.4f} time {1000 * (time.perf_counter() - t0):.1f}ms", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, 4, "tw", "--link-rate", f"{RATE_MBIT}mbit")


@pytest.fixture(scope="module")
def folder():
    """Scripts every node sees (nodes share the host's /var/tmp)."""
    path = Path("/var/tmp") / f"ct-test-watch-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "steps.py").write_text(SLOW_SCRIPT)
    yield path
    shutil.rmtree(path)


def home(cluster, node: str) -> Path:
    name, env = cluster
    return Path(provider_state(env, name)["nodes_dir"]) / node / "home"


def top_once(cluster, *flags: str) -> dict:
    name, env = cluster
    proc = run_cli("top", "-c", name, "--once", "--json", *flags, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def watch_processes(name: str) -> list[str]:
    """The watch's processes (hub, samplers, the stand-in) in any of the cluster's namespaces."""
    found = []
    for ns, pids in sysops.pids_in_netns([net.netns_name(name, i) for i in range(1, 5)]).items():
        for pid in pids:
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm in ("ct-watch", "nvidia-smi") or "clustertool>" in args or "smi-loop" in args:
                found.append(f"{ns} {pid} {comm} {args[:80]}")
    return found


def test_top_once_json_reports_every_node_with_gpu_columns_from_a_stand_in(cluster):
    smi_loop.write(home(cluster, "node-2") / ".local" / "bin", seen_as="/root/.local/bin")
    try:
        view = top_once(cluster)
    finally:
        shutil.rmtree(home(cluster, "node-2") / ".local")
    nodes = {row["name"]: row for row in view["nodes"]}
    assert sorted(nodes) == ["node-1", "node-2", "node-3", "node-4"]
    assert all(row["state"] == "ok" and row["cpu"] is not None and row["tx"] is not None for row in nodes.values())
    assert all(row["link_bps"] == RATE_MBIT * 10**6 and row["link_source"] == "recorded" for row in nodes.values())
    gpus = nodes["node-2"]["gpus"]
    assert [g["util"] for g in gpus] in ([97, 95], [98, 96]) and gpus[1]["reasons"] == ["sw_power_cap"]
    assert nodes["node-2"]["gpu_util"] in (96.0, 97.0)
    assert [nodes[n]["gpus"] for n in ("node-1", "node-3", "node-4")] == [None, None, None]   # "no GPU"
    assert nodes["node-1"]["disk"]["free"] > 0
    assert watch_processes(cluster[0]) == []


def test_a_rank_slowed_on_purpose_is_named_by_top(cluster, folder):
    name, env = cluster
    started = run_cli("run", "-c", name, "--launcher", "process", "--", "python3", str(folder / "steps.py"), "600",
                      env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    try:
        deadline = time.monotonic() + 90
        while True:   # every rank has printed a few steps
            view = top_once(cluster, "--job", job_id)
            ranks = view["jobs"][0]["ranks"] if view["jobs"] else []
            if len(ranks) == 4 and all((r.get("step") or 0) >= 3 for r in ranks):
                break
            assert time.monotonic() < deadline, view["jobs"]
        job = top_once(cluster, "--job", job_id)["jobs"][0]
        by_rank = {r["rank"]: r for r in job["ranks"]}
        slow = [r for r in job["ranks"] if r["node"] == "node-3"]
        assert len(slow) == 1 and job["outliers"] == [slow[0]["rank"]], job
        assert job["slowest"][0] == slow[0]["rank"] and slow[0]["ratio"] > 2.0
        assert all(not r["outlier"] for k, r in by_rank.items() if k != slow[0]["rank"])
        table = run_cli("top", "-c", name, "--once", env=env, timeout=120).stdout
        assert f"rank {slow[0]['rank']} on node-3 step time x" in table
    finally:
        assert run_cli("kill", "-c", name, job_id, env=env, timeout=120).returncode == 0


def _shape(name: str, env: dict, index: int, rate: str) -> None:
    slot = int(provider_state(env, name)["slot"])
    lines = net.shaping_lines(net.NODE_IFACE, rate, None)
    subprocess.run(net.tc_batch_argv(net.netns_name(name, index)), input="\n".join(lines) + "\n", text=True,
                   check=True)
    host = net.shaping_lines(net.veth_name(slot, index), rate, None)
    subprocess.run(net.tc_batch_argv(), input="\n".join(host) + "\n", text=True, check=True)


def test_a_link_shaped_to_a_quarter_shows_in_the_network_column(cluster):
    name, env = cluster
    if not shutil.which("iperf3"):
        pytest.skip("needs iperf3 (the Makefile's apt packages)")
    bridge = provider_state(env, name)["bridge"]
    addr = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True,
                          text=True).stdout.split()[3].split("/")[0]
    _shape(name, env, 3, f"{RATE_MBIT // 4}mbit")
    servers, clients = [], []
    try:
        for i in range(1, 5):
            servers.append(subprocess.Popen(["iperf3", "-s", "-1", "-B", addr, "-p", str(5300 + i)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for i in range(1, 5):
            clients.append(subprocess.Popen(
                CLI + ["exec", "-c", name, "-n", f"node-{i}", "--", f"iperf3 -c {addr} -p {5300 + i} -t 25"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4)
        view = top_once(cluster, "--interval", "1")   # readings of a second: this box's hiccups average out
        table = run_cli("top", "-c", name, "--once", env=env, timeout=120).stdout
    finally:
        for p in servers:
            p.terminate()
        for p in clients + servers:
            p.wait(timeout=60)
        _shape(name, env, 3, f"{RATE_MBIT}mbit")
    nodes = {row["name"]: row for row in view["nodes"]}
    seen = [(n["name"], n["tx"], n["rx"], n["net_ratio"]) for n in view["nodes"]]
    assert "tx" in nodes["node-3"]["net_outlier"], seen
    assert 0.15 < nodes["node-3"]["net_ratio"]["tx"] < 0.4
    assert all("tx" not in nodes[n]["net_outlier"] for n in ("node-1", "node-2", "node-4"))
    assert "node-3: network tx at x0." in table, table


def test_top_live_redraws_and_leaves_nothing_on_the_nodes(cluster):
    name, env = cluster
    proc = subprocess.Popen(CLI + ["top", "-c", name, "--interval", "0.5"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(8)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert out.count("node-4") >= 3, out + err   # redrawn, reading after reading
    deadline = time.monotonic() + 20
    while watch_processes(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert watch_processes(name) == []


# ---- monitoring, metrics, report (in this order: enable, a job recorded and drawn, forward, disable) ----

def query(cluster, expr: str) -> list[dict]:
    name, env = cluster
    proc = run_cli("metrics", "query", expr, "-c", name, "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]


def wait_query(cluster, expr: str, ready, seconds: float = 90) -> list[dict]:
    deadline = time.monotonic() + seconds
    while True:
        result = query(cluster, expr)
        if ready(result):
            return result
        assert time.monotonic() < deadline, f"{expr}: {result}"
        time.sleep(1)


def test_monitoring_enable_prometheus_answers_up_for_every_nodes_exporter(cluster):
    name, env = cluster
    proc = run_cli("monitoring", "enable", "-c", name, "--scrape-interval", "2s", "--json", env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = json.loads(proc.stdout)["nodes"]
    assert all(nodes[f"node-{i}"]["node-exporter"].startswith("running") for i in range(1, 5))
    assert nodes["node-1"]["prometheus"].startswith("running") and nodes["node-1"]["hub"].startswith("running")
    assert nodes["node-2"]["gputext"] == "skipped no nvidia-smi"
    up = wait_query(cluster, 'up{job="node"}', lambda r: len(r) == 4 and all(s["value"][1] == "1" for s in r))
    assert sorted(s["metric"]["node"] for s in up) == ["node-1", "node-2", "node-3", "node-4"]
    ours = wait_query(cluster, 'up{job="clustertool"}', lambda r: r and r[0]["value"][1] == "1")
    assert ours[0]["metric"]["cluster"] == name
    listening = subprocess.run(["ip", "netns", "exec", net.netns_name(name, 1), "ss", "-Htln"], capture_output=True,
                               text=True).stdout
    assert "127.0.0.1:9090" in listening and "127.0.0.1:9105" in listening   # Prometheus and ours: loopback only


def test_monitoring_runs_dcgm_exporter_where_installed_and_prometheus_scrapes_it(cluster):
    """node-2 has a dcgm-exporter (a stand-in serving DCGM's metric names: no GPU here): `monitoring enable` starts
    it there instead of the nvidia-smi textfile collector, on the node's private address, and Prometheus scrapes it
    as job `dcgm`; the other nodes keep theirs and are no dcgm target."""
    name, env = cluster
    dcgm_exporter.write(home(cluster, "node-2") / ".local" / "bin")
    try:
        proc = run_cli("monitoring", "enable", "-c", name, "--scrape-interval", "2s", "--json", env=env, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        nodes = json.loads(proc.stdout)["nodes"]
        assert nodes["node-2"]["dcgm"].startswith("running") and "gputext" not in nodes["node-2"], nodes
        assert nodes["node-1"]["gputext"] == "skipped no nvidia-smi" and "dcgm" not in nodes["node-1"], nodes
        up = wait_query(cluster, 'up{job="dcgm"}', lambda r: len(r) == 1 and r[0]["value"][1] == "1")
        assert up[0]["metric"]["node"] == "node-2" and up[0]["metric"]["cluster"] == name
        util = wait_query(cluster, "DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == 2)
        assert sorted((s["metric"]["node"], s["metric"]["gpu"], s["value"][1]) for s in util) == [
            ("node-2", "0", "97"), ("node-2", "1", "95")]
        status = run_cli("monitoring", "status", "-c", name, "--json", env=env, timeout=120)
        assert json.loads(status.stdout)["nodes"]["node-2"]["dcgm"].startswith("running"), status.stdout
    finally:
        shutil.rmtree(home(cluster, "node-2") / ".local")


def test_job_metrics_move_and_the_record_draws_a_report_a_browser_shows(cluster, folder, tmp_path):
    name, env = cluster
    started = run_cli("run", "-c", name, "--launcher", "process", "--", "python3", str(folder / "steps.py"), "70",
                      env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    sel = f'clustertool_rank_step{{job_id="{job_id}"}}'
    first = wait_query(cluster, sel, lambda r: len(r) == 4 and all(float(s["value"][1]) >= 2 for s in r))
    slow_rank = next(s["metric"]["rank"] for s in first if s["metric"]["node"] == "node-3")
    assert run_cli("cordon", "-c", name, "node-4", "--reason", "watch test", env=env).returncode == 0
    before = {s["metric"]["rank"]: float(s["value"][1]) for s in first}

    def moved(result: list[dict]) -> bool:   # every rank's step went on, as Prometheus saw it
        now = {s["metric"]["rank"]: float(s["value"][1]) for s in result}
        return sorted(now) == sorted(before) and all(now[k] >= before[k] + 3 for k in before)

    wait_query(cluster, sel, moved)
    straggler = f'clustertool_rank_straggler{{job_id="{job_id}",rank="{slow_rank}"}} == 1'
    wait_query(cluster, straggler, lambda r: len(r) == 1)
    wait_query(cluster, 'clustertool_node_cordoned{node="node-4"} == 1', lambda r: len(r) == 1)
    # the job's record reads every 5 s (jobs/recorder.py): the cordon stays until the record, as the report
    # reads it, holds the cordon
    samples = home(cluster, "node-1") / ".clustertool" / "jobs" / job_id / "watch" / "samples.jsonl"
    deadline = time.monotonic() + 90
    while ("cordon", "node-4") not in recorded_events(samples, job_id):
        assert time.monotonic() < deadline, recorded_events(samples, job_id)
        time.sleep(0.5)
    assert run_cli("uncordon", "-c", name, "node-4", env=env).returncode == 0
    deadline = time.monotonic() + 180
    while job_state(name, env, job_id) == "running":
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(2)
    drawn = run_cli("report", "-c", name, job_id, "-o", str(tmp_path / "run"), "--json", env=env, timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    doc = json.loads(drawn.stdout)
    assert doc["files"]["png"] == str(tmp_path / "run.png") and (tmp_path / "run.png").stat().st_size > 10_000
    kinds = {(e["kind"], e["node"]) for e in doc["run"]["events"]}
    assert ("straggler", "node-3") in kinds and ("cordon", "node-4") in kinds
    assert doc["run"]["utilisation"] == "CPU" and doc["run"]["nodes"] == ["node-1", "node-2", "node-3", "node-4"]
    cordon_at = next(e["t"] for e in doc["run"]["events"] if e["kind"] == "cordon") / doc["run"]["t"][-1]
    look_at_the_page(tmp_path / "run.html", tmp_path, cordon_at)


def recorded_events(samples: Path, job_id: str) -> set[tuple[str, str | None]]:
    """(kind, node) of every event in a job's record so far, read as `clustertool report` reads it."""
    from clustertool.watch import runrecord

    text = samples.read_text() if samples.exists() else ""
    return {(e.kind, e.node) for e in runrecord.load({"watch/samples.jsonl": text}, job_id).events} if text else set()


def job_state(name: str, env: dict, job_id: str) -> str:
    proc = run_cli("jobs", "-c", name, "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return next(j["state"] for j in json.loads(proc.stdout)["jobs"] if j["id"] == job_id)


def near(pixel, rgb, tolerance=40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], rgb))


def look_at_the_page(page: Path, tmp_path: Path, cordon_at: float) -> None:
    """A real browser (headless Chromium) opens the page: its DOM has the three panels, and its picture shows
    in each panel the nodes' lines and the cordon's purple mark where the cordon happened (``cordon_at``: the
    share of the run before it), and in the step-rate panel only the straggler's band."""
    from PIL import Image

    from clustertool.watch import report_html

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed: `make apt` installs it (Debian package chromium)")
    base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium'}", "--force-device-scale-factor=1"]
    height = report_html.panel_top(len(report_html.PANELS)) + 40
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for key, _ in report_html.PANELS:
        assert f'id="panel-{key}"' in dom
    shot = tmp_path / "shot.png"
    subprocess.run(base + [f"--window-size={report_html.WIDTH},{height}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = Image.open(shot).convert("RGB")
    palette = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in report_html.PALETTE[:4]]
    purple, band = (0x94, 0x67, 0xBD), (255, 223, 195)   # the band: orange at 25% over white
    mark_x = round(report_html.LEFT + (report_html.WIDTH - report_html.LEFT - report_html.RIGHT) * cordon_at)
    for i, (key, _) in enumerate(report_html.PANELS):
        panel = report_html.panel_top(i)
        top, bottom = panel + report_html.TOP + 1, panel + report_html.PANEL_H - report_html.BOTTOM - 1
        xs = range(report_html.LEFT + 1, report_html.WIDTH - report_html.RIGHT - 1, 2)
        box = [img.getpixel((x, y)) for x in xs for y in range(top, bottom, 2)]
        # a line at 0 % or 100 % (a busy box's CPU) is drawn on the plot's edge: its rows are counted too
        edges = [img.getpixel((x, y)) for x in xs for y in range(top - 3, bottom + 3)]
        lines = sum(1 for p in edges if any(near(p, c) for c in palette))
        assert lines > 100, f"panel {key}: no node line drawn ({lines} pixels)"
        marked = [y for y in range(top, bottom) if any(near(img.getpixel((x, y)), purple, 50)
                                                         for x in range(mark_x - 2, mark_x + 3))]
        assert len(marked) > (bottom - top) / 3, f"panel {key}: no cordon mark at x={mark_x} ({len(marked)} rows)"
        banded = sum(1 for p in box if near(p, band, 12))
        assert (banded > 500) == (key == "steps"), f"panel {key}: {banded} pixels of a straggler band"


def test_metrics_forwards_prometheus_over_ssh_and_closes(cluster):
    import urllib.request

    name, env = cluster
    proc = subprocess.Popen(CLI + ["metrics", "-c", name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert processes_with(f"127.0.0.1:{url.rsplit(':', 1)[1]}:127.0.0.1:"), "no ssh holds the tunnel"
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        with urllib.request.urlopen(f"{url}/api/v1/query?query=count(up%7Bjob%3D%22node%22%7D)", timeout=30) as resp:
            answer = json.loads(resp.read())
        assert answer["data"]["result"][0]["value"][1] == "4"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    port = int(url.rsplit(":", 1)[1])
    assert processes_with(f"127.0.0.1:{port}:127.0.0.1:") == []   # the ssh holding the tunnel is gone (the port
    # itself may be anyone's again on a busy machine)


def processes_with(text: str) -> list[str]:
    """Processes on this machine whose command line holds ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in args:
            found.append(f"{pid} {args}")
    return found


def test_monitoring_disable_leaves_no_exporter_or_prometheus(cluster):
    from tests.local.conftest import monitoring_processes

    name, env = cluster
    proc = run_cli("monitoring", "disable", "-c", name, "--json", env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert monitoring_processes(name) == []
    deadline = time.monotonic() + 20
    while watch_processes(name) and time.monotonic() < deadline:   # the exporter's samplers end with it
        time.sleep(0.5)
    assert watch_processes(name) == []


def test_down_leaves_no_monitoring_process(local_cluster, ct_env):
    from tests.local.conftest import local_leftovers, monitoring_processes

    name = local_cluster(2)
    assert run_cli("monitoring", "enable", "-c", name, env=ct_env, timeout=180).returncode == 0
    assert len(monitoring_processes(name)) >= 4   # two node exporters, the exporter, Prometheus
    assert run_cli("down", "-c", name, "--yes", env=ct_env, timeout=180).returncode == 0
    assert local_leftovers(name) == []

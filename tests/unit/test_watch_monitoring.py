"""`monitoring enable`'s pure parts: Prometheus's configuration, the node script's lines, the dashboard.

Prometheus's own promtool (Debian's prometheus package, installed by `make apt`) judges the configuration
and every PromQL expression of the dashboard."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from clustertool.cluster import monitoring
from clustertool.core.errors import UsageError
from clustertool.core.model import ClusterRecord, Node
from clustertool.nodeprogs import gputext, watchnode
from clustertool.watch.metrics import dashboard

pytestmark = pytest.mark.unit


def record() -> ClusterRecord:
    nodes = [Node("node-1", 1, "10.0.0.1", role="leader"), Node("node-2", 2, "10.0.0.2"),
             Node("server-1", 3, "10.0.0.3", role="server")]
    return ClusterRecord("demo", "local", nodes=nodes)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: `make apt` installs it (Debian package prometheus)")
    return path


def test_prometheus_scrapes_every_node_the_exporter_and_itself(tmp_path):
    config = monitoring.prometheus_config(record(), monitoring.MonitoringRequest(scrape_interval="5s"))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert [t["targets"] for t in jobs["node"]["static_configs"]] == [["10.0.0.1:9100"], ["10.0.0.2:9100"],
                                                                      ["10.0.0.3:9100"]]
    assert jobs["node"]["static_configs"][2]["labels"] == {"cluster": "demo", "node": "server-1", "role": "server"}
    assert jobs["clustertool"]["static_configs"][0]["targets"] == ["127.0.0.1:9105"]
    assert config["global"]["scrape_interval"] == "5s"
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))
    check = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_dcgm_exporter_is_scraped_where_it_runs(tmp_path):
    """The `dcgm` job's targets are a file beside the config (the nodes that run dcgm-exporter are known once every
    node ran its script), in file_sd's form with the node job's labels; promtool takes both."""
    config = monitoring.prometheus_config(record(), monitoring.MonitoringRequest(scrape_interval="5s"))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["dcgm"]["file_sd_configs"] == [{"files": ["dcgm-targets.json"], "refresh_interval": "5s"}]
    targets = monitoring.dcgm_targets(record(), ["node-2"])
    labels = {"cluster": "demo", "node": "node-2", "role": "member"}
    assert targets == [{"targets": ["10.0.0.2:9400"], "labels": labels}]
    (tmp_path / "dcgm-targets.json").write_text(json.dumps(targets))
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    check = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert monitoring.write_targets_command() == ("cat > ~/.clustertool/monitoring/dcgm-targets.json.tmp && mv -f "
                                                  "~/.clustertool/monitoring/dcgm-targets.json.tmp "
                                                  "~/.clustertool/monitoring/dcgm-targets.json")
    inputs = monitoring.node_inputs(type("S", (), {"record": record()})(), record().nodes[1],
                                    monitoring.MonitoringRequest(scrape_interval="5s"), "status")
    assert (inputs["DCGM_PORT"], inputs["DCGM_MS"]) == (9400, 5000)


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(UsageError, match="--retention-time"):
        monitoring.MonitoringRequest(retention_time="15 days")
    with pytest.raises(UsageError, match="--retention-size"):
        monitoring.MonitoringRequest(retention_size="lots")
    with pytest.raises(UsageError, match="scrape-interval"):
        monitoring.MonitoringRequest(scrape_interval="often")


def test_the_node_scripts_lines():
    procs, problems = monitoring.parse_lines("skipped gputext no nvidia-smi\nrunning node-exporter 41\n"
                                             "stopped gputext\nrunning hub 44\nfailed prometheus bind: address "
                                             "already in use\n")
    assert procs == {"gputext": "skipped no nvidia-smi", "node-exporter": "running 41", "hub": "running 44",
                     "prometheus": "failed"}
    assert problems == ["prometheus failed: bind: address already in use"]
    dcgm, _ = monitoring.parse_lines("running node-exporter 41\nrunning dcgm 42\n")
    assert dcgm == {"node-exporter": "running 41", "dcgm": "running 42"}
    _, missing = monitoring.parse_lines("missing node-exporter prometheus-node-exporter (or node_exporter) on PATH")
    assert missing == ["node-exporter missing: prometheus-node-exporter (or node_exporter) on PATH"]


def test_the_dashboard_asks_prometheus_valid_questions(tmp_path):
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    titles = [p["title"] for p in board["panels"]]
    assert len(exprs) >= 12 and {"GPU utilisation per node", "Step rate per rank", "Network transmit per node",
                                 "Cost so far"} <= set(titles)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"check:{i}", "expr": e.replace("$cluster", ".*")} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))
    check = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_gpu_textfile_metrics_from_a_real_recording(tmp_path):
    from tests.fakes.smi_loop import RECORDED_BUSY

    gpus = [g for g in map(watchnode.parse_gpu_line, RECORDED_BUSY.read_text().splitlines()) if g][-1:]
    text = gputext.gpu_text(gpus)
    assert 'clustertool_gpu_utilization_percent{gpu="0"} 100.0' in text
    assert 'clustertool_gpu_clocks_event_reason{gpu="0",reason="sw_power_cap"} 1' in text
    assert gputext.gpu_text(None) is None and gputext.gpu_text("error: x") is None
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    gputext.write(str(tmp_path), text)
    assert (tmp_path / "clustertool_gpu.prom").read_text() == text


def test_the_spec_s_monitoring_value_becomes_one_request():
    assert monitoring.MonitoringRequest.of(True) == monitoring.MonitoringRequest()
    assert monitoring.MonitoringRequest.of(False) is None and monitoring.MonitoringRequest.of(None) is None
    mine = monitoring.MonitoringRequest.of({"scrape_interval": "5s", "retention_size": "500MB"})
    assert (mine.scrape_interval, mine.retention_time, mine.retention_size) == ("5s", "15d", "500MB")
    with pytest.raises(UsageError, match="unknown setting.*scrape"):
        monitoring.MonitoringRequest.of({"scrape": "5s"})
    with pytest.raises(UsageError, match="expected true, false or a mapping"):
        monitoring.MonitoringRequest.of("yes please")
    assert monitoring.plan_line(mine) == ("monitoring: the node exporter on every node, Prometheus on the leader "
                                          "(127.0.0.1:9090), scraping every 5s, keeping 15d / 500MB")


def test_the_setting_is_the_records_and_a_phase_a_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTOOL_HOME", str(tmp_path))
    rec = record()
    assert monitoring.setting(rec) is None
    legacy = tmp_path / "clusters" / "demo" / monitoring.LEGACY_FILE
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps(monitoring.MonitoringRequest(scrape_interval="7s").to_dict()))
    assert monitoring.setting(rec).scrape_interval == "7s"   # a cluster enabled before the record held it
    rec.monitoring = monitoring.MonitoringRequest(retention_time="2d").to_dict()
    assert monitoring.setting(rec).retention_time == "2d"   # the record wins
    rebuilt = ClusterRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert rebuilt.monitoring == rec.monitoring   # it survives the state file

"""Cluster specs: YAML file + flags -> ClusterSpec; every error is one line naming file and key."""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import pytest

from clustertool.cluster.spec import ClusterSpec, load_spec
from clustertool.core.errors import SpecError, UsageError
from clustertool.providers import base
from clustertool.providers.base import OptionSpec

pytestmark = pytest.mark.unit


class FakeProvider(base.Provider):
    name: ClassVar[str] = "fake"
    default_user: ClassVar[str] = "ubuntu"
    owns_machines: ClassVar[bool] = True
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "instance_type": OptionSpec(str, "p4d.24xlarge", "EC2 instance type"),
        "link_rate": OptionSpec(str, None, "tc rate per node link"),
        "disk_gb": OptionSpec(int, 200, "root volume size"),
        "spot": OptionSpec(bool, False, "use spot instances"),
        "price": OptionSpec(float, None, "max price"),
        "tier": OptionSpec(str, "gp3", "disk type", choices=("gp3", "io2")),
    }


@pytest.fixture(autouse=True)
def fake_provider(monkeypatch):
    module = types.ModuleType("fake_provider_for_spec_tests")
    module.FakeProvider = FakeProvider
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(base.REGISTRY, "fake", f"{module.__name__}:FakeProvider")
    monkeypatch.setitem(base.REGISTRY, "broken", "clustertool.providers.no_such_module:Nope")


@pytest.fixture
def write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def _write(text: str, name: str = "spec.yaml") -> str:
        (tmp_path / name).write_text(text)
        return name

    return _write


def error_of(path, overrides=None) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides or {})
    message = str(info.value)
    assert "\n" not in message and len(f"error: {message}") < 160, message
    return message


# --- what a valid spec gives --------------------------------------------------------------

def test_a_full_spec_file_loads_with_options_converted_and_defaults_filled(write):
    path = write("name: demo\nprovider: fake\nnodes: 4\nslots: 8\nuser: ec2-user\n"
                 "instance_type: g5.48xlarge\ndisk-gb: 500\nspot: true\nprice: 3\n")
    spec = load_spec(path, {})
    assert spec == ClusterSpec(
        name="demo", provider="fake", nodes=4, slots=8, user="ec2-user", source=path,
        options={"instance_type": "g5.48xlarge", "link_rate": None, "disk_gb": 500, "spot": True,
                 "price": 3.0, "tier": "gp3"},
    )


def test_flags_win_over_the_file_and_none_means_not_given(write):
    path = write("name: demo\nprovider: fake\nnodes: 4\ninstance_type: g5.xlarge\n")
    spec = load_spec(path, {"nodes": 2, "name": None, "slots": None, "instance_type": "p5.48xlarge",
                            "disk_gb": None, "user": None})
    assert (spec.name, spec.nodes, spec.options["instance_type"]) == ("demo", 2, "p5.48xlarge")


def test_flags_alone_make_a_spec_without_a_file():
    spec = load_spec(None, {"provider": "fake", "nodes": 3, "name": "gpus", "link_rate": "200mbit"})
    assert (spec.name, spec.nodes, spec.slots, spec.user, spec.source) == ("gpus", 3, None, None, None)
    assert spec.options["link_rate"] == "200mbit"


def test_an_empty_file_is_an_empty_spec(write):
    assert load_spec(write(""), {"provider": "fake", "nodes": 1, "name": "e"}).nodes == 1


def test_options_of_other_providers_given_as_none_are_ignored():
    spec = load_spec(None, {"provider": "fake", "nodes": 1, "hosts": None, "key": None})
    assert "hosts" not in spec.options


def test_a_yaml_list_for_a_string_option_becomes_a_comma_list(write):
    spec = load_spec(write("provider: fake\nnodes: 1\nlink_rate: [a, b]\n"), {})
    assert spec.options["link_rate"] == "a,b"


def test_numeric_strings_from_flags_are_accepted_for_counts():
    assert load_spec(None, {"provider": "fake", "nodes": "3"}).nodes == 3


def test_static_provider_needs_no_node_count(tmp_path):
    spec = load_spec(None, {"provider": "static", "hosts": "a,b", "name": "adopted"})
    assert spec.nodes is None and spec.options["hosts"] == "a,b" and spec.options["port"] == 22


def test_file_options_are_made_absolute_relative_to_the_spec_file(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text("provider: static\nhostfile: hosts.txt\nkey: ~/k.pem\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    spec = load_spec("conf/c.yaml", {})
    assert spec.options["hostfile"] == str(tmp_path / "conf" / "hosts.txt")
    assert spec.options["key"] == "/home/someone/k.pem"


def test_file_options_given_as_flags_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text("provider: static\nhostfile: hosts.txt\n")
    monkeypatch.chdir(tmp_path)
    spec = load_spec("conf/c.yaml", {"hostfile": "mine.txt"})
    assert spec.options["hostfile"] == str(tmp_path / "mine.txt")


def test_the_default_provider_is_local(monkeypatch):
    monkeypatch.setitem(base.REGISTRY, "local", base.REGISTRY["fake"])
    assert load_spec(None, {"nodes": 2}).provider == "local"


def test_without_a_name_the_cluster_is_named_by_what_it_is(monkeypatch):
    monkeypatch.setitem(base.REGISTRY, "local", base.REGISTRY["fake"])
    assert load_spec(None, {"nodes": 2}).name == "local-2nodes"
    assert load_spec(None, {"nodes": 1}).name == "local-1node"
    assert load_spec(None, {"provider": "static", "hosts": "a,b"}).name == "static-adopted"


# --- errors: one line, file, key, expectation ---------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("provider: fake\nnodes: -2\n", "spec.yaml: nodes: expected a positive integer, got -2"),
    ("provider: fake\nnodes: 0\n", "spec.yaml: nodes: expected a positive integer, got 0"),
    ("provider: fake\nnodes: four\n", "spec.yaml: nodes: expected a positive integer, got 'four'"),
    ("provider: fake\nnodes: true\n", "spec.yaml: nodes: expected a positive integer, got true"),
    ("provider: fake\nnodes: yes\n", "spec.yaml: nodes: expected a positive integer, got 'yes'"),  # YAML 1.2: a word
    ("provider: fake\nnodes: 2.5\n", "spec.yaml: nodes: expected a positive integer, got 2.5"),
    ("provider: fake\nnodes: 2\nslots: 0\n", "spec.yaml: slots: expected a positive integer, got 0"),
    ("provider: fake\nnodes: 2\nname: My_Cluster\n", "spec.yaml: name: expected 1-31 lowercase letters"),
    ("provider: fake\nnodes: 2\nname: 12\n", "spec.yaml: name: expected a non-empty string, got 12"),
    ("provider: fake\nnodes: 2\nuser: 'root; reboot'\n", "spec.yaml: user: expected a user name"),
    ("provider: nope\nnodes: 2\n", "spec.yaml: provider: expected one of"),
    ("provider: fake\nnodes: 2\ndisk_gb: lots\n", "spec.yaml: disk_gb: expected an integer, got 'lots'"),
    ("provider: fake\nnodes: 2\nspot: maybe\n", "spec.yaml: spot: expected true or false, got 'maybe'"),
    ("provider: fake\nnodes: 2\nprice: cheap\n", "spec.yaml: price: expected a number, got 'cheap'"),
    ("provider: fake\nnodes: 2\ntier: sata\n", "spec.yaml: tier: expected one of gp3, io2, got 'sata'"),
    ("provider: fake\nnodes: 2\ninstance_type: {a: 1}\n", "spec.yaml: instance_type: expected a string, got a mapping"),
    ("provider: fake\nnodes: 2\ninstance_type: ''\n", "spec.yaml: instance_type: expected a non-empty"),
    ("provider: fake\n", "spec.yaml: nodes: required for provider 'fake': a positive integer"),
])
def test_bad_values_name_file_key_and_expectation(write, text, expected):
    assert expected in error_of(write(text))


def test_unknown_keys_are_named_with_the_closest_valid_one_in_one_short_line(write):
    message = error_of(write("provider: fake\nnodes: 2\ninstnce_type: p5.48xlarge\n"))
    assert message == ("spec.yaml: instnce_type: unknown key for provider 'fake'; did you mean 'instance_type'? "
                       "(every key: clustertool up --help)")
    message = error_of(write("provider: fake\nnodes: 2\nzzz: 3\n"))   # nothing close: no guess
    assert "did you mean" not in message and "clustertool up --help" in message


def test_a_key_written_both_with_dash_and_underscore_is_refused(write):
    assert "given twice" in error_of(write("provider: fake\nnodes: 2\ndisk-gb: 1\ndisk_gb: 2\n"))


def test_malformed_yaml_names_the_file_and_line(write):
    message = error_of(write("name: demo\nnodes: [1, 2\nprovider: fake\n"))
    assert message.startswith("spec.yaml:") and "malformed YAML" in message
    line = int(message.split(":")[1])
    assert 2 <= line <= 3


def test_a_tab_indented_line_is_malformed_yaml_at_that_line(write):
    assert error_of(write("nodes: 2\n\tname: x\n")).startswith("spec.yaml:2: malformed YAML")


def test_duplicate_keys_are_refused_with_their_line(write):
    message = error_of(write("provider: fake\nnodes: 2\nnodes: 3\n"))
    assert message.startswith("spec.yaml:3:") and "duplicate key 'nodes'" in message


@pytest.mark.parametrize("text, got", [("- a\n- b\n", "a list"), ("just words\n", "'just words'"), ("42\n", "42")])
def test_a_top_level_that_is_not_a_mapping_is_refused(write, text, got):
    message = error_of(write(text))
    assert message.startswith("spec.yaml: expected a mapping") and message.endswith(got)


def test_non_string_keys_are_refused(write):
    assert "spec.yaml: key 3: expected a string key" in error_of(write("3: x\n"))


def test_a_missing_file_is_named(tmp_path):
    path = str(tmp_path / "missing.yaml")
    assert error_of(path) == f"{path}: no such spec file"


def test_a_directory_is_not_a_spec_file(tmp_path):
    assert "is a directory" in error_of(str(tmp_path))


def test_binary_garbage_is_not_a_spec_file(tmp_path):
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in error_of(str(path))


def test_bad_flag_values_name_the_flag():
    assert error_of(None, {"provider": "fake", "nodes": -2}) == "--nodes: expected a positive integer, got -2"
    assert error_of(None, {"provider": "fake", "nodes": 1, "name": "Bad Name"}).startswith("--name: expected")


def test_a_flag_of_another_provider_is_refused_listing_this_providers_flags():
    message = error_of(None, {"provider": "fake", "nodes": 1, "hosts": "a,b"})
    assert message.startswith("--hosts: not an option of provider 'fake'") and "--instance-type" in message


def test_an_unimportable_provider_is_one_clear_error():
    assert "provider 'broken' is not available" in error_of(None, {"provider": "broken", "nodes": 1})


def test_spec_errors_are_usage_errors_with_exit_code_2(write):
    with pytest.raises(UsageError) as info:
        load_spec(write("provider: fake\nnodes: -1\n"), {})
    assert info.value.exit_code == 2


def test_a_missing_node_count_without_a_file_names_the_flag():
    assert error_of(None, {"provider": "fake"}) == "--nodes: required for provider 'fake': a positive integer"


# --- monitoring: true (up --monitoring) --------------------------------------------------------

def test_monitoring_true_or_a_mapping_in_the_file_and_the_flags_with_it(write):
    spec = load_spec(write("name: demo\nprovider: fake\nnodes: 2\nmonitoring: true\n"), {})
    assert spec.monitoring == {"scrape_interval": "15s", "retention_time": "15d", "retention_size": "2GB",
                               "node_port": 9100, "exporter_port": 9105, "prometheus_port": 9090}
    mapped = load_spec(write("name: demo\nprovider: fake\nnodes: 2\nmonitoring:\n  scrape_interval: 5s\n"),
                       {"retention_time": "2d"})
    assert (mapped.monitoring["scrape_interval"], mapped.monitoring["retention_time"]) == ("5s", "2d")
    assert load_spec(None, {"provider": "fake", "nodes": 2, "monitoring": True}).monitoring["retention_size"] == "2GB"
    assert load_spec(write("name: demo\nprovider: fake\nnodes: 2\nmonitoring: false\n"), {}).monitoring is None
    assert load_spec(None, {"provider": "fake", "nodes": 2}).monitoring is None


def test_monitoring_mistakes_are_one_line_naming_the_flag_or_key(write):
    assert error_of(None, {"provider": "fake", "nodes": 2, "scrape_interval": "5s"}) == (
        "--scrape-interval: needs --monitoring (Prometheus on the cluster)")
    assert "monitoring: expected true or false" in error_of(write("provider: fake\nnodes: 2\nmonitoring: lots\n"))
    assert "unknown setting(s) every" in error_of(write("provider: fake\nnodes: 2\nmonitoring:\n  every: 5s\n"))
    assert "--retention-size 'big'" in error_of(None, {"provider": "fake", "nodes": 2, "monitoring": True,
                                                       "retention_size": "big"})

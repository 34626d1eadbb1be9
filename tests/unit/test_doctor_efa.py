"""`doctor --check efa`: fi_info's devices against the EFA interfaces a node should have, the network
NCCL used (from its INFO log), and the AWS provider recording the attached interfaces at `up`.

NCCL's socket log is a real recording (tests/unit/data/nccl-2.28.9-h200); fi_info and the EFA
NCCL logs are derived from libfabric's, NCCL's and aws-ofi-nccl's format strings
(tests/unit/data/gpu-faulty-derived/README.md).
"""

from __future__ import annotations

import pytest

from clustertool.doctor import efa
from clustertool.providers.aws import instances
from tests.fakes.gpu_standins import DATA, DERIVED

pytestmark = pytest.mark.unit


def node(fi_info_text: str = "", rc: int = 0, sysfs: str = "") -> efa.NodeEfa:
    return efa.parse_node(f"host ip-10-1-0-12.ec2.internal\nsysfs{sysfs}\n"
                          "ofi_nccl /opt/amazon/ofi-nccl/lib/libnccl-net.so\n"
                          f"{efa.MARK} fi_info rc={rc}\n{fi_info_text}")


def test_fi_info_devices_count_each_device_once_over_endpoint_types_and_fabrics():
    assert efa.fi_info_devices((DERIVED / "fi-info-p4d-3of4.out").read_text()) == [
        "rdmap16s27", "rdmap32s27", "rdmap144s27"]
    assert len(efa.fi_info_devices((DERIVED / "fi-info-p4d-4of4.out").read_text())) == 4
    direct = ("provider: efa\n    fabric: efa-direct\n    domain: rdmap16s27-rdm\n    version: 200.0\n"
              "provider: tcp\n    fabric: 10.0.0.0/24\n    domain: ens5\n")
    assert efa.fi_info_devices((DERIVED / "fi-info-p4d-3of4.out").read_text() + direct) == [
        "rdmap16s27", "rdmap32s27", "rdmap144s27"]
    got = node("fi_getinfo: -61 (No data available)", rc=1)
    assert (got.host, got.fi_rc, got.fi_devices, got.ofi_nccl) == (
        "ip-10-1-0-12.ec2.internal", 1, [], ["/opt/amazon/ofi-nccl/lib/libnccl-net.so"])


def test_three_of_four_efa_devices_is_an_error_with_the_fix():
    got = node((DERIVED / "fi-info-p4d-3of4.out").read_text(), sysfs=" rdmap16s27 rdmap32s27 rdmap144s27")
    [f] = efa.node_findings("node-2", got, attached=4, type_count=4, instance_type="p4d.24xlarge", box=30)
    assert f.severity == "error" and f.node == "node-2"
    assert f.message == ("fi_info -p efa lists 3 EFA device(s), 4 expected (attached at up): rdmap16s27, rdmap32s27, "
                         "rdmap144s27")
    assert "`clustertool reboot --nodes node-2`" in f.fix and "`clustertool cordon node-2`" in f.fix
    full = node((DERIVED / "fi-info-p4d-4of4.out").read_text(), sysfs=" a b c d")
    assert efa.node_findings("node-2", full, attached=4, type_count=4, instance_type="p4d.24xlarge", box=30) == []


def test_what_up_attached_is_weighed_against_the_type():
    none = efa.node_findings("node-1", node(rc=1), attached=0, type_count=4, instance_type="p4d.24xlarge", box=30)
    assert [(f.severity, f.message) for f in none] == [
        ("warning", "no EFA interface attached; a p4d.24xlarge has 4 network card(s) for EFA: NCCL runs over TCP here")]
    assert "clustertool up --efa" in none[0].fix
    one = efa.node_findings("node-1", node((DERIVED / "fi-info-p4d-4of4.out").read_text()), attached=1,
                            type_count=32, instance_type="p5.48xlarge", box=30)
    assert [f.severity for f in one] == ["warning"] and "1 EFA interface(s) attached" in one[0].message
    # no fi_info on the node: the kernel's devices are counted instead, and the missing tool is said
    bare = efa.node_findings("node-3", node(rc=127, sysfs=" efa_0 efa_1"), attached=None, type_count=4,
                             instance_type="p4d.24xlarge", box=30)
    assert [(f.severity, f.message.split(":")[0]) for f in bare] == [
        ("warning", "libfabric's fi_info is not installed"),
        ("error", "the kernel shows 2 EFA device(s), 4 expected (a p4d.24xlarge has)")]


def test_nccl_over_aws_ofi_nccl_on_four_nics_is_fine():
    uses = efa.nccl_net_use((DERIVED / "nccl-efa-4nics.log").read_text())
    assert sorted(uses) == ["ip-10-1-0-11", "ip-10-1-0-12"]
    u = uses["ip-10-1-0-11"]
    assert (u.network, u.provider, u.nics_found, u.devices, u.local_ranks) == ("Libfabric", "efa", 4, {0, 1, 2, 3}, 8)
    found = efa.nccl_findings(uses, {"ip-10-1-0-11": 4, "": 4}, "job j1", {"ip-10-1-0-11": "node-1"})
    assert [(f.severity, f.node) for f in found] == [("info", "node-1"), ("info", None)]
    assert found[0].message == "node-1: NCCL used Libfabric, provider efa (4 NICs), 4 net device(s) (job j1)"


def test_nccl_fallen_back_to_sockets_on_an_efa_cluster_is_an_error_per_node():
    uses = efa.nccl_net_use((DERIVED / "nccl-socket-fallback.log").read_text())
    found = efa.nccl_findings(uses, {"": 4}, "job j2", {"ip-10-1-0-11": "node-1", "ip-10-1-0-12": "node-2"})
    assert [(f.severity, f.node) for f in found] == [("error", "node-1"), ("error", "node-2")]
    assert found[0].message == ("node-1: NCCL fell back to TCP sockets (NET/Socket), not EFA (4 EFA device(s) here) "
                                "(job j2)")
    for words in ("aws-ofi-nccl", "FI_PROVIDER=efa", "clustertool up --efa", "LD_LIBRARY_PATH"):
        assert words in found[0].fix


def test_the_real_nccl_socket_recording_reads_as_sockets_and_is_fine_without_efa():
    uses = efa.nccl_net_use((DATA / "nccl-2.28.9-h200" / "socket.rank0.log").read_text())
    assert {h: (u.network, u.devices) for h, u in uses.items()} == {"vm": ("Socket", {0})}
    assert [f.severity for f in efa.nccl_findings(uses, {"": 0}, "log")] == ["info"]   # no EFA here: no fault


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("/GDRDMA", "").replace("Libfabric/1", "Libfabric/0").replace("Libfabric/2", "Libfabric/0")
     .replace("Libfabric/3", "Libfabric/0"), "through one net device (of 4 EFA) with 8 local ranks"),
    (lambda t: t.replace("provider is efa, fabric is efa", "provider is tcp, fabric is 10.1.0.0/16"),
     "aws-ofi-nccl chose libfabric provider tcp, not efa"),
    (lambda t: t.replace("found 4 nics", "found 1 nics"), "aws-ofi-nccl found 1 EFA NIC(s) of 4"),
    (lambda t: t.replace("Selected provider is efa, fabric is efa (found 4 nics)",
                         "Selected Provider is efa (found 2 nics)"), "aws-ofi-nccl found 2 EFA NIC(s) of 4"),
], ids=["one-nic", "tcp-provider", "one-of-four", "old-plugin-format"])
def test_nccl_on_fewer_nics_or_another_provider_is_an_error(edit, words):
    uses = efa.nccl_net_use(edit((DERIVED / "nccl-efa-4nics.log").read_text()))
    found = efa.nccl_findings(uses, {"": 4}, "log")
    assert {f.severity for f in found} == {"error"} and all(words in f.message for f in found), found


def describe_instance(interface_types):
    """One instance as describe_instances returns it (the fields to_node reads)."""
    return {"InstanceId": "i-0abc", "InstanceType": "p4d.24xlarge", "PrivateIpAddress": "10.1.0.11",
            "State": {"Name": "running"}, "Placement": {"AvailabilityZone": "us-east-1b"},
            "NetworkInterfaces": [{"NetworkInterfaceId": f"eni-{i}", **({"InterfaceType": t} if t else {}),
                                   "Attachment": {"NetworkCardIndex": i, "DeviceIndex": min(i, 1)}}
                                  for i, t in enumerate(interface_types)]}


def test_up_records_the_efa_interfaces_each_instance_has():
    assert instances.to_node(describe_instance(["efa"] * 4), index=1, leader=True, slots=8).extra[
        "efa_interfaces"] == 4
    assert instances.to_node(describe_instance(["efa"] + ["efa-only"] * 31), index=1, leader=True, slots=8).extra[
        "efa_interfaces"] == 32
    assert instances.to_node(describe_instance(["interface"]), index=1, leader=True, slots=8).extra[
        "efa_interfaces"] == 0
    # moto's describe_instances has no InterfaceType: nothing recorded rather than a wrong 0
    assert "efa_interfaces" not in instances.to_node(describe_instance([None, None]), index=1, leader=True,
                                                     slots=8).extra
    assert efa.expected_efa({"efa_interfaces": 4}, "p4d.24xlarge") == (4, 4)
    assert efa.expected_efa({}, "m5.large") == (None, None)

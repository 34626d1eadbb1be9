"""The ``aws`` provider: same-AZ GPU clusters that come up all or nothing and tear down
leaving nothing.  boto3 is imported lazily by the submodules' functions, never here, so
``clustertool --help`` (which reads OPTIONS to build the `up` flags) stays fast.

Modules: client (session, retries, errors, test seam), capacity (types, AZ order),
images, network (subnet, security group, key pair, SSH source), placement, launch,
instances (waits, nodes), teardown, adopt, pricing, prepare (checks + dry-run plan),
provision (the verbs' bodies), sweep (orphans of no known cluster).
"""

from __future__ import annotations

from typing import ClassVar

from clustertool.model import Cluster, Node
from clustertool.providers.base import OptionSpec, ProvisionRequest


class AwsProvider:
    name: ClassVar[str] = "aws"
    default_user: ClassVar[str] = "ubuntu"  # the Ubuntu Deep Learning AMI's user
    owns_machines: ClassVar[bool] = True
    count_from_options: ClassVar[bool] = True  # adoption counts what it finds; launch checks --nodes itself
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ("key",)
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "instance_type": OptionSpec(str, None, "EC2 instance type, e.g. p4d.24xlarge (required unless adopting)."),
        "region": OptionSpec(str, None, "AWS region (default: your profile's / AWS_DEFAULT_REGION)."),
        "az": OptionSpec(str, None, "Only this Availability Zone (default: every zone offering the type, in order)."),
        "ami": OptionSpec(str, None, "Machine image id (default: the newest Deep Learning AMI of the region)."),
        "spot": OptionSpec(bool, False, "Use spot instances (cheaper, may be reclaimed; cannot be stopped)."),
        "efa": OptionSpec(bool, False, "Attach an EFA network interface (types that support it)."),
        "volume_size": OptionSpec(int, 200, "Root volume size in GB."),
        "volume_type": OptionSpec(str, "gp3", "Root volume type.", ("gp3", "io1", "io2", "gp2")),
        "iops": OptionSpec(int, None, "Provisioned IOPS of the root volume (default 10000 for gp3/io1/io2)."),
        "key_name": OptionSpec(str, None, "Existing EC2 key pair to launch with (default: import the cluster's own "
                                          "key)."),
        "ssh_cidr": OptionSpec(str, None, "Who may SSH in, e.g. 203.0.113.7/32 (default: your own address when "
                                          "found)."),
        "subnet": OptionSpec(str, None, "Subnet id (default: the default VPC's subnet in the chosen zone)."),
        "profile": OptionSpec(str, None, "AWS profile from ~/.aws/config."),
        "adopt_tag": OptionSpec(str, None, "Adopt instances by tag: Name=john,paul,george,ringo."),
        "adopt_ids": OptionSpec(str, None, "Adopt instances by id: i-0abc...,i-0def..."),
        "leader": OptionSpec(str, None, "Which listed host is the leader (default: the first)."),
        "key": OptionSpec(str, None, "Private key that reaches the existing machines (default: your ssh "
                                     "agent/config)."),
    }

    def __init__(self) -> None:
        self._prep = None

    def _prepared(self, request: ProvisionRequest):
        from clustertool.providers.aws import prepare

        if self._prep is None:
            self._prep = prepare.prepare(request)
        return self._prep

    def check(self, request: ProvisionRequest) -> None:
        from clustertool.providers.aws import prepare

        self._prep = prepare.prepare(request)

    def plan(self, request: ProvisionRequest) -> list[str]:
        from clustertool.providers.aws import prepare

        return prepare.plan_lines(self._prepared(request), request)

    def run_instances(self, request: ProvisionRequest) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.run(request, self._prepared(request))

    def wait_instances(self, cluster: Cluster, timeout: float = 600.0) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.wait(cluster)

    def query_instances(self, cluster: Cluster) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.query(cluster)

    def stop_instances(self, cluster: Cluster) -> None:
        from clustertool.providers.aws import provision

        provision.stop(cluster)

    def start_instances(self, cluster: Cluster) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.start(cluster)

    def terminate_instances(self, cluster: Cluster) -> list[str]:
        from clustertool.providers.aws import provision

        return provision.terminate(cluster)

    def owns_cluster(self, cluster: Cluster) -> bool:
        """Adopted clusters are not ours to terminate unless down --terminate-adopted said so."""
        if cluster.provider_state.get("adopted"):
            return bool(cluster.options.get("terminate_adopted"))
        return True

    def describe(self, cluster: Cluster) -> dict:
        from clustertool.providers.aws import provision

        return provision.describe(cluster)

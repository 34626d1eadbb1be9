"""The ``aws`` provider: same-AZ GPU clusters that come up all or nothing and tear down
leaving nothing.  boto3 is imported lazily by the submodules' functions, never here, so
``clustertool --help`` (which reads OPTIONS to build the `up` flags) stays fast.

Modules: client (session, errors, test seam), retry (timeouts, retry budget, progress),
capacity (types, AZ order), quota (vCPU quotas before creation), images, network (subnet,
security group, key pair, SSH source), placement, launch (incl. EFA interfaces), instances
(waits, nodes), tags (identity tags), owner (who a cluster belongs to), lease (an up in
flight), census (tagged resources by cluster), teardown, adopt, pricing, prepare (checks +
dry-run plan), provision (the verbs' bodies), sweep (clusters no state of this home knows),
capacity_blocks / capacity_offers / capacity_wait (Capacity Blocks, `up --retry-until-up`) with
capacity_verbs (what `clustertool capacity` shows and buys),
filesystems / filesystems_down with efs and fsx (shared filesystems made or attached at up, removed
or kept at down), relaunch (`replace`: a new instance for a node, the old one terminated or kept),
controller_policy / controller_iam (the recovery controller's role, policy and instance profile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar

from clustertool.core.model import ClusterRecord, Node, Reporter, silent
from clustertool.providers.base import (
    CapacityQuery,
    Offer,
    OptionSpec,
    Provider,
    ProvisionRequest,
    Purchase,
    SlurmPlacement,
    Sweep,
    SweepRemoved,
    SweepRequest,
    Table,
    UpWaiting,
)

if TYPE_CHECKING:
    from clustertool.providers.aws.client import Aws
    from clustertool.providers.aws.prepare import Prep

# What `up --scheduler slurm` installs on AWS, as the plan says it: the image's distribution decides the release
SLURM_RELEASE = ("the image's own packages (munge, slurmd, slurmctld, slurm-client) installed at first boot: "
                 "Slurm 21.08 on the default Ubuntu 22.04 Deep Learning AMI (23.11 on Ubuntu 24.04, 22.05 on "
                 "Debian 12; Amazon Linux has no Slurm package and is refused); every node runs the same image, "
                 "so the same release (setup refuses mixed releases)")


class AwsProvider(Provider):
    name: ClassVar[str] = "aws"
    default_user: ClassVar[str] = "ubuntu"  # the Ubuntu Deep Learning AMI's user
    owns_machines: ClassVar[bool] = True
    REPLACE_KEEPS_OLD: ClassVar[bool] = True  # relaunch.py: the old instance goes only once the new one is in place
    key_type: ClassVar[tuple[str, ...]] = ("-t", "ed25519")  # EC2 imports only RSA and ED25519 key pairs
    count_from_options: ClassVar[bool] = True  # adoption counts what it finds; launch checks --nodes itself
    SHARED_FS_KINDS: ClassVar[tuple[str, ...]] = ("efs", "fsx")
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ("key",)
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {
        "instance_type": OptionSpec(str, None, "EC2 instance type, e.g. p4d.24xlarge (required unless adopting)."),
        "region": OptionSpec(str, None, "AWS region (default: your profile's / AWS_DEFAULT_REGION)."),
        "az": OptionSpec(str, None, "Only this Availability Zone (default: every zone offering the type, in order)."),
        "ami": OptionSpec(str, None, "Machine image id (default: the newest Deep Learning AMI of the region)."),
        "spot": OptionSpec(bool, False, "Use spot instances (cheaper, may be reclaimed; cannot be stopped)."),
        "efa": OptionSpec(bool, False, "EFA: one EFA interface per network card of the type (p4d: 4, p5: 32); "
                                       "with several, nodes get no public IP at launch (--access leader gives the "
                                       "leader an Elastic IP)."),
        "volume_size": OptionSpec(int, 200, "Root volume size in GB."),
        "volume_type": OptionSpec(str, "gp3", "Root volume type.", ("gp3", "io1", "io2", "gp2")),
        "iops": OptionSpec(int, None, "Provisioned IOPS of the root volume (default 10000 for gp3/io1/io2)."),
        "key_name": OptionSpec(str, None, "Existing EC2 key pair to launch with (default: import the cluster's own "
                                          "key)."),
        "ssh_cidr": OptionSpec(str, None, "Who may SSH in, e.g. 203.0.113.7/32 (default: your own address when "
                                          "found; with --jump, the VPC's range)."),
        "access": OptionSpec(str, "leader", "Who takes SSH from this machine: 'leader' (members only through the "
                                            "leader, with ProxyJump) or 'all' (default: leader on aws, all on local).",
                             ("leader", "all")),
        "jump": OptionSpec(str, None, "Your own bastion, USER@HOST[:PORT], for clusters in private subnets: the leader "
                                      "(with --access all, every node) is reached through it; no public addresses."),
        "subnet": OptionSpec(str, None, "Subnet id (default: the default VPC's subnet in the chosen zone)."),
        "profile": OptionSpec(str, None, "AWS profile from ~/.aws/config."),
        "adopt_tag": OptionSpec(str, None, "Adopt instances by tag: Name=john,paul,george,ringo."),
        "adopt_ids": OptionSpec(str, None, "Adopt instances by id: i-0abc...,i-0def..."),
        "leader": OptionSpec(str, None, "Which listed host is the leader (default: the first)."),
        "key": OptionSpec(str, None, "Private key that reaches the existing machines (default: your ssh "
                                     "agent/config)."),
        "reduction_servers": OptionSpec(int, 0, "K CPU instances as reduction servers (role server, not ranks) in the "
                                                "nodes' zone, subnet, security group and placement group."),
        "server_type": OptionSpec(str, None, "Instance type of the reduction servers (default: c6in.8xlarge)."),
        "skip_quota_check": OptionSpec(bool, False, "Do not compare the request with the account's vCPU quota "
                                                    "first (RunInstances decides)."),
        "retry_until_up": OptionSpec(bool, False, "When no zone has capacity for the whole cluster, keep trying: "
                                                  "every zone again after --retry-interval, until --retry-for has "
                                                  "passed (Ctrl-C stops the wait and removes what was made)."),
        "retry_interval": OptionSpec(str, None, "With --retry-until-up: the wait between attempts, e.g. 5m, 90s, "
                                                "1h (default: 5m)."),
        "retry_for": OptionSpec(str, None, "With --retry-until-up: give up after this long, e.g. 6h, 30m "
                                           "(default: 6h)."),
        "capacity_block": OptionSpec(str, None, "Launch into this EC2 Capacity Block (cr-…, see `clustertool capacity "
                                                "ls`/`buy`), in its zone, with MarketType capacity-block. Before its "
                                                "start `up` exits saying when it starts (or waits: --wait)."),
        "wait": OptionSpec(bool, False, "With --capacity-block: before the block's start, wait for it (a line now "
                                        "and then; Ctrl-C stops the wait, nothing made), then launch."),
        "block_end_warning": OptionSpec(str, None, "With --capacity-block: how long before EC2 takes the instances "
                                                   "back (30 minutes before the block's end) the leader signals "
                                                   "running jobs, e.g. 30m, 1h (default: 30m)."),
        "block_end_signal": OptionSpec(str, None, "With --capacity-block: the signal every rank of a running job gets "
                                                  "then (default: TERM).", ("TERM", "INT", "HUP", "USR1", "USR2",
                                                                            "QUIT")),
        "capacity_reservation": OptionSpec(str, None, "Launch into this On-Demand Capacity Reservation (cr-…): "
                                                      "checked first (active, type, free count, end), in its zone "
                                                      "only; its instances are already paid for."),
        "capacity_reservation_group": OptionSpec(str, None, "Launch into the capacity reservations of this resource "
                                                            "group (ARN); EC2 picks one with room."),
        "reservations": OptionSpec(str, None, "Without a named reservation: 'open' (EC2's default: use matching "
                                              "open reservations first), 'only' (launch only into open "
                                              "reservations) or 'none'.", ("open", "only", "none")),
        "no_topology_order": OptionSpec(bool, False, "Keep launch order in the hostfile and ranks (default: where "
                                                     "EC2 describes the instance topology, nodes under the same "
                                                     "network node get adjacent ranks)."),
        "efs_throughput": OptionSpec(str, None, "With --shared-fs efs: the new EFS's throughput: elastic (default; "
                                                "billed per GB read and written), bursting, or provisioned:MIBPS "
                                                "(billed per MiB/s-month)."),
        "fsx_capacity": OptionSpec(int, None, "With --shared-fs fsx: the new Lustre file system's size in GiB: "
                                              "1200, 2400 or a multiple of 2400 (default: 1200)."),
        "fsx_deployment": OptionSpec(str, None, "With --shared-fs fsx: SCRATCH_2 (default; temporary, cheapest) or "
                                                "PERSISTENT_2 (replicated, 125 MB/s/TiB).",
                                     ("SCRATCH_2", "PERSISTENT_2")),
        "fsx_import": OptionSpec(str, None, "With --shared-fs fsx: s3://BUCKET/PREFIX imported into the new Lustre "
                                            "file system (metadata now, contents loaded on first read)."),
    }

    def __init__(self, report: Reporter = silent, **_ignored: object) -> None:
        super().__init__(report)
        self._prep: Prep | None = None

    def _prepared(self, request: ProvisionRequest) -> Prep:
        from clustertool.providers.aws import prepare

        if self._prep is None:
            self._prep = prepare.prepare(request)
        return self._prep

    def _session(self, cluster: ClusterRecord) -> Aws:
        """The session `up` prepared (it carries the lease), else a new one for the cluster's region."""
        from clustertool.providers.aws import provision

        return self._prep.aws if self._prep is not None else provision.session_for(cluster, self.report)

    def check(self, request: ProvisionRequest) -> None:
        from clustertool.providers.aws import prepare

        self._prep = prepare.prepare(request)

    def plan(self, request: ProvisionRequest) -> list[str]:
        from clustertool.providers.aws import prepare

        return prepare.plan_lines(self._prepared(request), request)

    def run_instances(self, request: ProvisionRequest) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.run(request, self._prepared(request))

    def wait_instances(self, cluster: ClusterRecord, timeout: float = 600.0) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.wait(cluster, self._session(cluster))

    def slurm_placement(self, cluster: ClusterRecord) -> SlurmPlacement:
        """The image's own packages, installed at first boot (az_launch.user_data), under systemd, real cgroups."""
        return SlurmPlacement(private=False, boot_hook=None, standin_gpus=0, cgroups=True, slurm_user="slurm",
                              probe_timeout=900.0, release=SLURM_RELEASE)

    def finish(self, cluster: ClusterRecord) -> None:
        """`up` succeeded: its lease becomes 'done', so sweeps know the cluster is complete."""
        from clustertool.providers.aws import provision

        provision.finish(cluster, self._session(cluster))

    def query_instances(self, cluster: ClusterRecord) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.query(cluster, self.report)

    def confirm_owner(self, cluster: ClusterRecord, force: bool, verb: str) -> None:
        """Refuse (unless ``force``) a cluster whose state or tags say another owner made it."""
        from clustertool.providers.aws import provision

        provision.confirm_owner(cluster, force, verb, self.report)

    def stop_instances(self, cluster: ClusterRecord) -> None:
        from clustertool.providers.aws import provision

        provision.stop(cluster, self.report)

    def start_instances(self, cluster: ClusterRecord) -> list[Node]:
        from clustertool.providers.aws import provision

        return provision.start(cluster, self.report)

    def terminate_instances(self, cluster: ClusterRecord) -> list[str]:
        from clustertool.providers.aws import provision

        return provision.terminate(cluster, self.report)

    def set_shutdown_behavior(self, cluster: ClusterRecord, behavior: str) -> None:
        """What each instance does when its OS powers off: "stop" or "terminate" (autostop/autodown)."""
        from clustertool.providers.aws import provision

        provision.set_shutdown_behavior(cluster, behavior, self.report)

    def replace_node(self, cluster: ClusterRecord, node: str, keep_old: bool = False) -> Node:
        """One new instance like the node's (zone, subnet, placement group, groups, type, image, tags); the
        old one terminated, or (keep_old) stopped and tagged as replaced.  See providers/aws/relaunch.py."""
        from clustertool.core import state
        from clustertool.providers.aws import relaunch

        def save() -> None:
            state.save(cluster)
        return relaunch.replace_node(cluster, node, keep_old, report=self.report, save=save)

    def controller_identity(self, cluster: ClusterRecord, node: str | None, keep_old: bool = False,
                            save: Callable[[], None] = lambda: None) -> list[str]:
        """An IAM role whose inline policy allows what `replace` calls, only on this cluster's tagged resources,
        in an instance profile associated with ``node`` (controller_iam.py); on this machine: nothing to make."""
        from clustertool.providers.aws import controller_iam

        if node is None:
            return []
        return controller_iam.make(self._session(cluster), cluster, node, keep_old=keep_old, report=self.report,
                                   save=save)

    def remove_controller_identity(self, cluster: ClusterRecord,
                                   save: Callable[[], None] = lambda: None) -> list[str]:
        from clustertool.providers.aws import controller_iam

        if not cluster.provider_state.get(controller_iam.RECORD):
            return []
        return controller_iam.remove(self._session(cluster), cluster, self.report, save)

    def shared_fs(self, request: ProvisionRequest) -> list[dict]:
        """EFS / FSx for Lustre made or attached in the cluster's subnet, waited until mountable
        (providers/aws/filesystems.py); down removes the made ones (filesystems_down.py)."""
        from clustertool.providers.aws import provision

        return provision.shared_fs(request, self._prepared(request))

    def owns_cluster(self, cluster: ClusterRecord) -> bool:
        """Adopted clusters are not ours to terminate unless down --terminate-adopted said so."""
        if cluster.provider_state.get("adopted"):
            return cluster.terminate_adopted
        return True

    def topology(self, cluster: ClusterRecord) -> dict[str, list[str]]:
        """DescribeInstanceTopology's network nodes per node (not for adopted machines: their tags and
        order are the user's); {} where EC2 does not say."""
        from clustertool.providers.aws import topology

        if cluster.provider_state.get("adopted"):
            return {}
        return topology.paths(self._session(cluster), cluster)

    def describe(self, cluster: ClusterRecord) -> dict:
        from clustertool.providers.aws import controller_iam, provision, relaunch

        return {**provision.describe(cluster), **relaunch.kept_lines(cluster), **controller_iam.status_lines(cluster)}

    def up_waiting(self, cluster: ClusterRecord) -> UpWaiting | None:
        """`up --retry-until-up` between attempts (capacity_wait.py): attempt N, next try at T."""
        from clustertool.providers.aws import capacity_wait

        wait = cluster.provider_state.get(capacity_wait.KEY)
        if not wait:
            return None
        return UpWaiting(capacity_wait.waiting_line(wait), capacity_wait.waiting_line(wait, short=True), wait)

    def sweep(self, request: SweepRequest) -> Sweep:
        """Tagged resources of clusters this home does not know, with owner, age and price (sweep.py)."""
        from clustertool.providers.aws import sweep

        return sweep.sweep(request)

    def remove_swept(self, swept: Sweep, report: Reporter = silent) -> SweepRemoved:
        from clustertool.providers.aws import sweep

        return sweep.remove(swept, report)

    def capacity_offerings(self, query: CapacityQuery, region: str | None, profile: str | None) -> Table:
        from clustertool.providers.aws import capacity_verbs

        return capacity_verbs.offerings(query, region, profile)

    def capacity_offer(self, offer_id: str, region: str | None, profile: str | None) -> Offer:
        from clustertool.providers.aws import capacity_verbs

        return capacity_verbs.offer(offer_id, region, profile)

    def buy_capacity(self, offer: Offer) -> Purchase:
        from clustertool.providers.aws import capacity_verbs

        return capacity_verbs.buy(offer)

    def reservations(self, region: str | None, profile: str | None) -> Table:
        from clustertool.providers.aws import capacity_verbs

        return capacity_verbs.reservations_table(region, profile)

    @classmethod
    def hourly_price(cls, node_type: str, nodes: int, spot: bool) -> float | None:
        """On-demand list price (approximate); spot prices change by the hour: unknown."""
        from clustertool.providers.aws import pricing

        each = None if spot else pricing.on_demand(node_type)
        return None if each is None else each * nodes

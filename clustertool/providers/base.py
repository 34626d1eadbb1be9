"""The provider interface: every hook the core calls, declared here with its default.

A provider makes machines exist and go away; everything after "a node answers SSH"
(keys, known_hosts, hostfiles, exec) is provider-independent and lives elsewhere. The core
calls these methods and reads these class attributes, and nothing else: a new provider
subclasses ``Provider``, implements the eight verbs marked required, and overrides the
optional hooks it supports. An optional hook's default is the behaviour of a provider
without that capability (a no-op, "not ours", no extra lines), or a ``NotSupported``
error whose hint names what to do instead.

Lifecycle, as driven by ``clustertool.cluster.lifecycle``::

    check(request)            fail fast on missing prerequisites / bad options
    plan(request)             lines describing what would be made (--dry-run)
    run_instances(request)    make the machines; record every created resource in
                              request.cluster.provider_state and call request.save()
                              right after each, so an interrupted `up` can be undone
    wait_instances(cluster)   until every node answers on its SSH port (only until "running"
                              when cluster.no_ssh); fills ssh_host, and
                              host_keys when the provider knows them
    finish(cluster)           `up` succeeded (AWS: its lease becomes done)
    query_instances(cluster)  current node states (status)
    stop_instances / start_instances   keep disks; start returns refreshed nodes
    terminate_instances(cluster)       remove everything the provider made; idempotent,
                                       safe on half-created clusters; returns lines saying
                                       what was removed

Beside the lifecycle, what only a provider knows reaches the rest through hooks here too:
``sweep``/``remove_swept`` (`down --sweep`: what no state of this home knows), the capacity verbs
(`clustertool capacity`: offerings, buying one, reservations), ``up_waiting`` (an `up` that waits
for capacity, for `status`/`ls`) and ``link_rate`` (the speed links are shaped to, for the network
checks). What they return is data (rows, lines, records); the CLI renders it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from clustertool.core.errors import NotSupported, UsageError
from clustertool.core.model import ClusterRecord, Node, Reporter, silent


@dataclass(frozen=True)
class OptionSpec:
    """One provider option, usable as a YAML spec key and (with '-' for '_') a flag."""

    type: type = str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], object] | None = None  # raises ValueError saying what was expected (checked at `up`)


@dataclass
class ProvisionRequest:
    cluster: ClusterRecord  # name, user, options already validated
    count: int
    slots: int | None  # explicit --slots override, else provider decides (GPU count)
    public_key: str  # the cluster's public key line
    key_path: Path  # the cluster's private key (0600)
    files_dir: Path  # the cluster's own directory for provider files
    save: Callable[[], None] = lambda: None  # persist cluster state now
    report: Reporter = silent  # progress lines for the user
    dry_run: bool = False


Reboot = Literal["ssh", "restart", "provider"]

IMAGE_PYTHON = "the nodes' own: whatever their PATH finds (the image's)"


@dataclass(frozen=True)
class RankEnvironment:
    """What a job's ranks find their programs by: ``env`` (PATH, VIRTUAL_ENV) that `run` hands every rank
    (empty: the nodes' own environment, the image's), and ``python``, in words, which Python that gives them
    (what `run --dry-run` says)."""

    env: dict[str, str] = field(default_factory=dict)
    python: str = IMAGE_PYTHON


@dataclass
class Table:
    """Rows a provider found, as the CLI shows them: ``title``, ``columns`` and ``rows``; ``empty``:
    the line when there are none; ``notes``: lines under the table; ``data``: what --json prints."""

    title: str
    columns: list[str]
    rows: list[tuple[Any, ...]]
    data: dict[str, Any]
    empty: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class SweepRequest:
    """`down --sweep`: what to look for."""

    known: Callable[[], tuple[set[str], set[str]]]  # (ids, names) of the clusters this home has state for
    region: str | None = None
    profile: str | None = None
    force_owner: bool = False  # also delete what another owner (or home) made
    any_home: bool = False  # also delete what this identity made from another clustertool home
    report: Reporter = silent


@dataclass
class Sweep:
    """What a sweep found: the table the CLI shows, and the orphans themselves (data for --json)."""

    provider: str
    title: str
    columns: list[str]
    rows: list[tuple[Any, ...]]
    orphans: list[Any]  # the provider's own records, one per row
    to_delete: list[Any]  # those marked for deletion
    kept: str | None = None  # one line on what is kept and costs money
    bills: bool = False  # what this provider leaves costs money: --json always says what was kept
    unit: str = "resource(s)"  # what `removed N ...` counts


@dataclass
class SweepRemoved:
    removed: list[str]  # one line each, as --json lists them
    forget: list[tuple[str, str | None]]  # (name, id) of this home's clusters: their files here go too


@dataclass(frozen=True)
class CapacityQuery:
    """`capacity offerings`: ``nodes`` machines of one type for ``days``, between two dates (text, UTC)."""

    instance_type: str
    nodes: int
    days: int
    start_after: str | None = None
    end_before: str | None = None


@dataclass
class Offer:
    """An offering as the provider offers it now, about to be bought (`capacity buy`)."""

    id: str
    line: str  # what it is and what it costs, in one line
    price: str  # the fee, as a user reads it
    fee: float
    node_type: str
    count: int
    handle: Any = None  # the provider's own (AWS: the session and the offering)


@dataclass
class Purchase:
    id: str  # what was bought (a reservation id)
    what: str  # the cost ledger's words for it
    data: dict[str, Any]  # what --json prints
    lines: list[str]  # what the user reads


@dataclass(frozen=True)
class SlurmPlacement:
    """How Slurm lives on a provider's nodes (`up --scheduler slurm`; slurm/ turns it into a layout and config).

    ``private``: Slurm's files, sockets and pids under the user's home and the node's own /tmp (a local node
    shares this machine's /etc, /run and /var); else the distribution's paths and systemd units.
    ``boot_hook``: the file a node's boot runs to start the daemons again (None: systemd starts them).
    ``release``: where the packages come from and which release, for the plan."""

    private: bool = False
    boot_hook: str | None = None
    standin_gpus: int = 0       # stand-in GPUs (character devices) made on each node: no real ones here
    cgroups: bool = True        # real cgroups (a machine of its own); False: Slurm's own process tracking
    slurm_user: str = "slurm"   # who slurmctld runs as (the packages make the user "slurm")
    probe_timeout: float = 900.0  # a new machine installs the packages at its first boot: wait that long
    release: str = ""


@dataclass(frozen=True)
class UpWaiting:
    """An `up` in flight that waits for capacity: what `status` and `ls` say, and its record (--json)."""

    line: str
    short: str
    record: dict[str, Any]


class Provider:
    """Base of every provider; see the module doc for the lifecycle."""

    name: ClassVar[str]
    default_user: ClassVar[str]
    OPTIONS: ClassVar[dict[str, OptionSpec]] = {}
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ()  # options holding a file path, made absolute from the spec's folder
    count_from_options: ClassVar[bool] = False  # True: the options say how many nodes (adoption), --nodes optional
    owns_machines: ClassVar[bool] = True  # False for adopted machines: down never terminates them
    key_type: ClassVar[tuple[str, ...] | None] = None  # ssh-keygen -t/-b for the cluster key; None: P-256
    POWEROFF: ClassVar[str | None] = None  # what the autostop watcher runs to power a node off; None: shutdown -h
    REBOOT: ClassVar[Reboot] = "ssh"  # ssh: `reboot` on the node; restart: stop+start here; provider: reboot_instances
    SHARED_FS_KINDS: ClassVar[tuple[str, ...]] = ()  # shared filesystem kinds shared_fs makes or attaches
    # replace_node makes the new machine before it removes the old one, so a failed replace leaves the
    # node as it was (AWS); False: the old machine goes first and a failure leaves the node down (local)
    REPLACE_KEEPS_OLD: ClassVar[bool] = False

    def __init__(self, report: Reporter = silent, **_ignored: object) -> None:
        self.report = report

    # ---- required verbs -------------------------------------------------------------------
    def check(self, request: ProvisionRequest) -> None:
        raise NotImplementedError

    def plan(self, request: ProvisionRequest) -> list[str]:
        raise NotImplementedError

    def run_instances(self, request: ProvisionRequest) -> list[Node]:
        raise NotImplementedError

    def wait_instances(self, cluster: ClusterRecord, timeout: float = 600.0) -> list[Node]:
        raise NotImplementedError

    def query_instances(self, cluster: ClusterRecord) -> list[Node]:
        raise NotImplementedError

    def stop_instances(self, cluster: ClusterRecord) -> None:
        raise NotImplementedError

    def start_instances(self, cluster: ClusterRecord) -> list[Node]:
        raise NotImplementedError

    def terminate_instances(self, cluster: ClusterRecord) -> list[str]:
        raise NotImplementedError

    # ---- optional hooks, with the default of a provider that lacks them -------------------
    def finish(self, cluster: ClusterRecord) -> None:
        """`up` succeeded."""

    def confirm_owner(self, cluster: ClusterRecord, force: bool, verb: str) -> None:
        """Refuse (unless ``force``) to ``verb`` a cluster another owner made."""

    def owns_cluster(self, cluster: ClusterRecord) -> bool:
        """Whether down terminates the machines (False for adopted ones)."""
        return self.owns_machines

    def describe(self, cluster: ClusterRecord) -> dict[str, Any]:
        """Extra status lines (hourly cost, cost so far, ...)."""
        return {}

    def autostop_record(self, cluster: ClusterRecord) -> dict[str, Any] | None:
        """What the cluster's watcher left when it powered the cluster off (when, why)."""
        return None

    def set_shutdown_behavior(self, cluster: ClusterRecord, behavior: str) -> None:
        """What each machine does when its OS powers off: "stop" or "terminate" (autostop/autodown)."""

    def reboot_instances(self, cluster: ClusterRecord) -> None:
        """Reboot the cluster's (or a subset's) machines through the provider (REBOOT = "provider")."""
        raise NotSupported(f"the {self.name} provider has no reboot of its own", hint="reboot over SSH")

    @classmethod
    def hourly_price(cls, node_type: str, nodes: int, spot: bool) -> float | None:
        """USD per hour for ``nodes`` machines of ``node_type``; None: unknown (the ledger says so)."""
        return None

    # ---- verbs the next features use: declared now, so every provider answers them --------
    def replace_node(self, cluster: ClusterRecord, node: str, keep_old: bool = False) -> Node:
        """A new machine takes ``node``'s name, role, slots and place; the old one goes (or stops)."""
        raise NotSupported(f"the {self.name} provider cannot replace a node",
                           hint="run on the other nodes (`-w` selects them), or `down` and `up` again")

    def shared_fs(self, request: ProvisionRequest) -> list[dict[str, Any]]:
        """Make or attach each filesystem of ``request.cluster.options["shared_fs"]`` (sharedfs/specs.py),
        right after run_instances. Append each to ``provider_state["shared_fs"]`` and save at once:
        {kind, id, mount, made, dns, mount_name, source}; terminate_instances deletes the made ones."""
        raise NotSupported(f"the {self.name} provider has no shared filesystem",
                           hint="copy the data to every node with `clustertool copy`")

    def topology(self, cluster: ClusterRecord) -> dict[str, list[str]]:
        """Network topology per node, outermost layer first (empty: unknown)."""
        return {}

    def rank_environment(self, cluster: ClusterRecord) -> RankEnvironment:
        """The environment a job's ranks get from this machine (`run`): none, by default: nodes are other
        machines, and their own environment (the image's PATH and Python) is the one that counts."""
        return RankEnvironment()

    def link_rate(self, cluster: ClusterRecord) -> int | None:
        """Bits/s every link between two nodes is shaped to (the local provider's ``link_rate``); None:
        not set. The network checks measure against it; EC2's rated bandwidth is no floor for one flow."""
        return None

    def slurm_placement(self, cluster: ClusterRecord) -> SlurmPlacement:
        """Where and how `up --scheduler slurm` puts Slurm on this provider's nodes."""
        raise NotSupported(f"the {self.name} provider cannot set up Slurm (--scheduler slurm)",
                           hint="use the local or aws provider; a cluster that runs Slurm already is adopted with "
                                "`--provider static --slurm-login HOST`")

    def up_waiting(self, cluster: ClusterRecord) -> UpWaiting | None:
        """What an `up` of ``cluster`` still in flight waits for (capacity it retries for); None: nothing."""
        return None

    # ---- the recovery controller (`up --controller`): replacing with nobody watching --------------
    def controller_identity(self, cluster: ClusterRecord, node: str | None, keep_old: bool = False,
                            save: Callable[[], None] = lambda: None) -> list[str]:
        """Give the machine that runs the cluster's recovery controller the rights `replace` needs on this
        cluster and nothing more (``node``: a node's name; None: this machine); lines saying what was made.
        Record what is made in ``cluster.provider_state`` and ``save()`` before each call, so `down` finds it.
        Default: on this machine the controller acts with this machine's own rights: nothing to make."""
        if node is None:
            return []
        raise NotSupported(f"the {self.name} provider runs the recovery controller on this machine, not on {node}",
                           hint="leave out --controller-node")

    def remove_controller_identity(self, cluster: ClusterRecord,
                                   save: Callable[[], None] = lambda: None) -> list[str]:
        """Remove what ``controller_identity`` made (`down`; idempotent); lines saying what went."""
        return []

    # ---- `down --sweep`: what a killed `up` or a lost state left -----------------------------
    def sweep(self, request: SweepRequest) -> Sweep:
        """This provider's clusters that no state of this home knows, each marked delete or keep."""
        raise NotSupported(f"--sweep works for aws and local, not {self.name!r}",
                           hint="`clustertool ls` lists the clusters this home knows; `clustertool down -c NAME` "
                                "removes one")

    def remove_swept(self, sweep: Sweep, report: Reporter = silent) -> SweepRemoved:
        """Delete ``sweep.to_delete``."""
        raise NotSupported(f"the {self.name} provider has no sweep to remove")

    # ---- `clustertool capacity`: machines booked ahead (EC2 Capacity Blocks) ------------------
    def capacity_offerings(self, query: CapacityQuery, region: str | None, profile: str | None) -> Table:
        """The offerings for ``query`` (and remember them for ``capacity_offer``)."""
        raise NotSupported(f"the {self.name} provider has no capacity to book",
                           hint="Capacity Blocks are EC2's: `clustertool capacity` works with AWS")

    def capacity_offer(self, offer_id: str, region: str | None, profile: str | None) -> Offer:
        """One offering of the last ``capacity_offerings``, as offered now (its fee asked again)."""
        raise NotSupported(f"the {self.name} provider has no capacity to book",
                           hint="Capacity Blocks are EC2's: `clustertool capacity` works with AWS")

    def buy_capacity(self, offer: Offer) -> Purchase:
        """Buy ``offer`` (money: the caller asked first)."""
        raise NotSupported(f"the {self.name} provider has no capacity to book",
                           hint="Capacity Blocks are EC2's: `clustertool capacity` works with AWS")

    def reservations(self, region: str | None, profile: str | None) -> Table:
        """The account's capacity reservations and blocks (what `up` may launch into)."""
        raise NotSupported(f"the {self.name} provider has no capacity reservations",
                           hint="Capacity Blocks are EC2's: `clustertool capacity` works with AWS")


REGISTRY: dict[str, str] = {
    "local": "clustertool.providers.local.local_provider:LocalProvider",
    "static": "clustertool.providers.static:StaticProvider",
    "aws": "clustertool.providers.aws.aws_provider:AwsProvider",
}


def provider_class(name: str) -> type[Provider]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UsageError(
            f"unknown provider {name!r}", hint=f"choose one of: {', '.join(sorted(REGISTRY))}"
        ) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_provider(name: str, **kwargs: Any) -> Provider:
    return provider_class(name)(**kwargs)


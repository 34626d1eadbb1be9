"""Cluster specs: a YAML file and/or flags, validated into one ``ClusterSpec``.

A spec file is a flat mapping::

    name: demo
    provider: local        # default: local
    nodes: 4
    slots: 1               # default: the provider decides (GPU count, else 1)
    user: root             # default: the provider's
    link_rate: 200mbit     # provider options, as listed by the provider's OPTIONS

Flags (``overrides``; ``None`` = not given) win over the file.  Options a provider lists in
``PATH_OPTIONS`` (files such as a key or hostfile) are made absolute: relative to the spec
file's folder when written there, to the working directory when given as a flag.  Every
error is one line naming the file (or the flag), the key and what was expected.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from clustertool.cluster import autostop
from clustertool.cluster.monitoring import SETTING_KEYS, MonitoringRequest
from clustertool.core import state, yamlfile
from clustertool.core.errors import SpecError, UsageError
from clustertool.providers import base
from clustertool.sharedfs.specs import parse_shared_fs

BASE_KEYS = ("name", "provider", "nodes", "slots", "user")
EXAMPLES = {"name": "demo", "provider": "local", "nodes": "2", "slots": "1", "user": "ubuntu", "autostop": "30m",
            "autodown": "true", "wait_for": "jobs"}  # what a hint shows for a bad value of these keys
AUTOSTOP_KEYS = ("autostop", "autodown", "wait_for")  # the cluster's own idle watcher (autostop.py)
SHARED_FS_KEYS = ("shared_fs", "shared_mount")  # shared filesystems (sharedfs/specs.py)
SCHEDULER_KEYS = ("scheduler", "leader_compute")  # `scheduler: slurm`: jobs go through Slurm (cluster/slurmup.py)
SCHEDULERS = ("none", "slurm")
MONITORING_KEYS = ("monitoring", *SETTING_KEYS)  # Prometheus on the cluster (cluster/monitoring.py)
DEFAULT_PROVIDER = "local"
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


@dataclass
class ClusterSpec:
    name: str
    provider: str = DEFAULT_PROVIDER
    nodes: int | None = None  # None only for providers that count what they adopt (static)
    slots: int | None = None  # None = the provider decides
    user: str | None = None  # None = the provider's default user
    options: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # the spec file, when there was one
    autostop: dict | None = None  # autostop.Setting.to_dict(), when the cluster stops itself
    scheduler: str = "none"  # slurm: `up` sets Slurm up, and jobs go through its queue
    leader_compute: bool = True  # with Slurm: the leader runs jobs too (False: only slurmctld there)
    monitoring: dict | None = None  # monitoring.MonitoringRequest.to_dict(), when `up` starts Prometheus


class _Invalid(Exception):
    """A value that does not validate; the message says what was expected."""


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return str(value)


def _positive_int(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit() and value.strip().isascii():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Invalid(f"expected a positive integer, got {_show(value)}")
    return value


def _as_type(value: Any, typ: type) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise _Invalid(f"expected true or false, got {_show(value)}")
    if typ is int:
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer, got {_show(value)}")
        return value
    if typ is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Invalid(f"expected a number, got {_show(value)}")
        return float(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        value = ",".join(str(v) for v in value)  # a YAML list for a comma-list option
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _Invalid(f"expected a string, got {_show(value)}")
    text = str(value)
    if not text or "\n" in text or "\x00" in text:
        raise _Invalid(f"expected a non-empty one-line string, got {_show(value)}")
    return text


def _check_option(value: Any, spec: base.OptionSpec) -> Any:
    converted = _as_type(value, spec.type)
    if spec.choices and converted not in spec.choices:
        raise _Invalid(f"expected one of {', '.join(map(str, spec.choices))}, got {_show(value)}")
    if spec.check is not None:
        try:
            spec.check(converted)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
    return converted


def _check_base(key: str, value: Any) -> Any:
    if key in ("nodes", "slots"):
        return _positive_int(value)
    if not isinstance(value, str) or not value:
        raise _Invalid(f"expected a non-empty string, got {_show(value)}")
    if key == "name":
        try:
            return state.validate_name(value)
        except UsageError:
            raise _Invalid("expected 1-31 lowercase letters, digits and '-', starting with a letter, "
                           f"got {_show(value)}") from None
    if key == "provider" and value not in base.REGISTRY:
        raise _Invalid(f"expected one of {', '.join(sorted(base.REGISTRY))}, got {_show(value)}")
    if key == "user" and not _USER_RE.match(value):
        raise _Invalid(f"expected a user name (letters, digits, '.', '_', '-'), got {_show(value)}")
    return value


def load_yaml_mapping(path: str, what: str = "spec file") -> dict[Any, Any]:
    """Parse a YAML file whose top level must be a mapping; errors name file and line."""
    data = yamlfile.load(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys (name: ..., nodes: ...) at the top level, "
                        f"got {_show(data) if not isinstance(data, list) else 'a list'}")
    return data


def read_file(path: str) -> dict[str, Any]:
    """The top-level mapping of a YAML spec file, keys normalised ('-' -> '_')."""
    data = load_yaml_mapping(path)
    normalised: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise SpecError(f"{path}: key {_show(key)}: expected a string key")
        norm = key.replace("-", "_")
        if norm in normalised:
            raise SpecError(f"{path}: {key}: given twice (as '{norm}' and '{key}')")
        normalised[norm] = value
    return normalised


PROVIDERS = tuple(sorted(base.REGISTRY))  # what --provider / provider: takes
OptionSpec = base.OptionSpec  # one provider option, as `up` turns it into a flag


def every_provider_option() -> dict[str, tuple[OptionSpec, list[str]]]:
    """Each option a provider takes (a spec key; with '-' for '_' an `up` flag), with the providers
    that take it; a provider whose module cannot load here is left out."""
    merged: dict[str, tuple[OptionSpec, list[str]]] = {}
    for name in base.REGISTRY:
        try:
            options = base.provider_class(name).OPTIONS
        except (ImportError, AttributeError):  # a provider module not importable here
            continue
        for key, spec in options.items():
            merged.setdefault(key, (spec, []))[1].append(name)
    return merged


def _provider_options(provider: str) -> tuple[dict[str, base.OptionSpec], type[base.Provider]]:
    try:
        cls = base.provider_class(provider)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"provider {provider!r} is not available here: {exc}") from None
    return dict(cls.OPTIONS), cls


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


class _Sources:
    """Flags over file: where a key's value comes from, and its checked value."""

    def __init__(self, path: str | None, data: dict[str, Any], overrides: dict[str, Any]):
        self.path, self.data, self.overrides = path, data, overrides
        self.label = str(path) if path is not None else "spec"

    def checked(self, key: str, check: Callable[[Any], Any], example: str | None = None) -> Any:
        if key in self.overrides:
            value, where = self.overrides[key], _flag(key)
        elif key in self.data:
            value, where = self.data[key], f"{self.label}: {key}"
        else:
            return None
        try:
            return check(value)
        except _Invalid as exc:
            sample = example or EXAMPLES.get(key)
            hint = None if sample is None else (f"e.g. {_flag(key)} {sample}" if key in self.overrides
                                                else f"e.g. `{key}: {sample}` in {_short(self.label)}")
            raise SpecError(f"{where}: {exc}", hint=hint) from None

    def absolute(self, key: str, value: str) -> str:
        """A file option made absolute: relative to the spec file when written there."""
        spec_file = self.path if key not in self.overrides else None  # a flag's is relative to the working folder
        base_dir = os.path.dirname(os.path.abspath(spec_file)) if spec_file is not None else os.getcwd()
        return os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))


def load_spec(path: str | None, overrides: dict[str, Any] | None = None) -> ClusterSpec:
    """Validate a spec file and flags into a ``ClusterSpec``; flags win over the file."""
    overrides = {k.replace("-", "_"): v for k, v in (overrides or {}).items() if v is not None}
    src = _Sources(path, read_file(path) if path is not None else {}, overrides)
    provider = src.checked("provider", lambda v: _check_base("provider", v)) or DEFAULT_PROVIDER
    option_specs, cls = _provider_options(provider)
    _reject_unknown(src.data, overrides, option_specs, provider, src.label)
    values = {key: src.checked(key, functools.partial(_check_base, key)) for key in BASE_KEYS if key != "provider"}
    options = {}
    for key, spec in option_specs.items():
        value = src.checked(key, functools.partial(_check_option, spec=spec), _example(spec))
        options[key] = spec.default if value is None else value
        if key in cls.PATH_OPTIONS and isinstance(options[key], str):
            options[key] = src.absolute(key, options[key])
    shared = _shared_fs(src)
    if shared:
        options["shared_fs"] = shared
    if values["nodes"] is None and not cls.count_from_options:
        where = f"{path}: nodes" if path is not None else "--nodes"
        raise SpecError(f"{where}: required for provider {provider!r}: a positive integer")
    scheduler, leader_compute = _scheduler(src, options)
    return ClusterSpec(name=values["name"] or default_name(provider, values["nodes"]), provider=provider,
                       nodes=values["nodes"], slots=values["slots"], user=values["user"], options=options, source=path,
                       autostop=_autostop(src), scheduler=scheduler, leader_compute=leader_compute,
                       monitoring=_monitoring(src))


def _scheduler(src: _Sources, options: dict[str, Any]) -> tuple[str, bool]:
    """``scheduler:`` / ``--scheduler`` (none, slurm) and ``leader_compute:`` / ``--no-leader-compute``; an
    adopted Slurm (``slurm_login``) is a Slurm cluster already."""
    def scheduler(value: Any) -> str:
        if value not in SCHEDULERS:
            raise _Invalid(f"expected {' or '.join(SCHEDULERS)}, got {_show(value)}")
        return value

    chosen = src.checked("scheduler", scheduler) or "none"
    leader = src.checked("leader_compute", lambda v: _as_type(v, bool))
    if options.get("slurm_login"):
        if chosen == "slurm":
            raise SpecError("--scheduler slurm sets Slurm up on new machines; --slurm-login adopts a cluster that "
                            "runs it already: give one of them")
        if leader is not None:
            raise SpecError("--no-leader-compute goes with --scheduler slurm (an adopted Slurm says which nodes "
                            "compute)")
        return "none", True
    if leader is not None and chosen != "slurm":
        raise SpecError("--no-leader-compute goes with --scheduler slurm",
                        hint="clustertool up --scheduler slurm --no-leader-compute ...")
    return chosen, True if leader is None else leader


def _example(spec: base.OptionSpec) -> str | None:
    """A value of an option, for a hint: its help's "e.g. X", else its first choice."""
    found = re.search(r"e\.g\. ([^\s,;)]+)", spec.help)
    return found.group(1) if found else (str(spec.choices[0]) if spec.choices else None)


def default_name(provider: str, nodes: int | None) -> str:
    """A cluster's name when `up` is given none: what it is (local-2nodes, aws-8nodes; static-adopted)."""
    if nodes is None:
        return f"{provider}-adopted"
    return f"{provider}-{nodes}node{'s' if nodes != 1 else ''}"


def _shared_fs(src: _Sources) -> list[dict]:
    """``shared_fs:`` / ``--shared-fs`` (a list) placed by ``shared_mount`` / ``--shared-mount``."""
    where = "--shared-fs" if "shared_fs" in src.overrides else f"{src.label}: shared_fs"
    values = src.overrides.get("shared_fs", src.data.get("shared_fs"))
    mount = src.overrides.get("shared_mount", src.data.get("shared_mount"))
    if mount is not None and not values:
        raise SpecError("--shared-mount: needs --shared-fs KIND (which filesystem to mount there)")
    try:
        return parse_shared_fs(values, mount)
    except UsageError as exc:
        raise SpecError(f"{where}: {exc.message}", hint=exc.hint) from None


def _autostop(src: _Sources) -> dict | None:
    def duration(value: Any) -> int:
        try:
            return autostop.parse_duration(str(value))
        except UsageError as exc:
            raise _Invalid(f"expected an idle time such as 30m, 1h or 90s, got {_show(value)}") from exc

    def wait_for(value: Any) -> str:
        if value not in autostop.WAIT_FOR:
            raise _Invalid(f"expected {' or '.join(autostop.WAIT_FOR)}, got {_show(value)}")
        return value

    idle = src.checked("autostop", duration)
    down = src.checked("autodown", lambda v: _as_type(v, bool))
    waits = src.checked("wait_for", wait_for)
    if idle is None:
        if down or waits:
            where = "--autodown" if down else "--wait-for"
            raise SpecError(f"{where}: needs --autostop TIME (how long the cluster may stay idle)")
        return None
    return autostop.Setting(idle, bool(down), waits or "jobs").to_dict()


def _monitoring(src: _Sources) -> dict | None:
    """``monitoring: true`` (or a mapping of its settings) / ``--monitoring``; the settings' flags only with it."""
    def check(value: Any) -> MonitoringRequest | None:
        if isinstance(value, (dict, MonitoringRequest)):
            try:
                return MonitoringRequest.of(value)
            except UsageError as exc:
                raise _Invalid(exc.message) from None
        return MonitoringRequest.of(_as_type(value, bool))

    request = src.checked("monitoring", check)
    given = {k: src.overrides[k] for k in SETTING_KEYS if k in src.overrides}
    given.update({k: src.data[k] for k in SETTING_KEYS if k in src.data and k not in given})
    if given and request is None:
        raise SpecError(f"{_flag(next(iter(given)))}: needs --monitoring (Prometheus on the cluster)")
    if given and request is not None:
        try:
            request = MonitoringRequest.of({**request.to_dict(), **given})
        except UsageError as exc:
            raise SpecError(exc.message, hint=exc.hint) from None
    return request.to_dict() if request is not None else None


def _reject_unknown(data: dict, overrides: dict, option_specs: dict, provider: str, label: str) -> None:
    """One line: the key, the closest valid one, where the full list is."""
    valid = (set(BASE_KEYS) | set(AUTOSTOP_KEYS) | set(SHARED_FS_KEYS) | set(SCHEDULER_KEYS) | set(MONITORING_KEYS)
             | set(option_specs))
    for key in data:
        if key not in valid:
            guess = difflib.get_close_matches(str(key), sorted(valid), n=1, cutoff=0.6)
            maybe = f"did you mean {guess[0]!r}? " if guess else ""
            raise SpecError(f"{_short(label)}: {_clip(key)}: unknown key for provider {provider!r}; {maybe}"
                            f"(every key: clustertool up --help)")
    for key in overrides:
        if key not in valid:
            guess = difflib.get_close_matches(str(key), sorted(option_specs), n=1, cutoff=0.6)
            flags = ", ".join(_flag(k) for k in sorted(option_specs)) or "none"
            maybe = f"did you mean {_flag(guess[0])}? " if guess else ""
            line = f"{_flag(_clip(key))}: not an option of provider {provider!r}; {maybe}(its options: "
            # the options themselves where the line stays short, else where to read them
            raise SpecError(line + (flags if len(line) + len(flags) < 150 else "clustertool up --help") + ")")


def _short(label: str, limit: int = 48) -> str:
    """A spec file's path as given, its folders cut when long (the file's own name always shown)."""
    return label if len(label) <= limit else f".../{os.path.basename(label)}"


def _clip(key: object, limit: int = 40) -> str:
    text = str(key)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_options(provider: str) -> list[tuple[str, str]]:
    """(key, help) pairs a spec file may use for ``provider``, for help and docs."""
    option_specs, _ = _provider_options(provider)
    base_help = [("name", "cluster name"), ("provider", f"one of {', '.join(sorted(base.REGISTRY))}"),
                 ("nodes", "number of nodes"), ("slots", "slots per node"), ("user", "ssh user"),
                 ("scheduler", "none, or slurm: Slurm set up on the nodes, jobs through its queue"),
                 ("leader_compute", "with scheduler slurm: false keeps jobs off the leader (slurmctld only)")]
    return base_help + [(k, s.help) for k, s in sorted(option_specs.items())]

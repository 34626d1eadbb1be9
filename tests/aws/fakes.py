"""Stand-ins installed at the provider's one seam, ``clustertool.providers.aws.client.HOOKS``.

moto 5's server does not implement placement groups (CreatePlacementGroup answers HTTP 500),
so ``FakePlacementGroups`` answers those three calls the way EC2 documents them, and checks
that RunInstances names a group that exists.  ``Faults`` raises chosen errors (capacity,
DependencyViolation, an exception or KeyboardInterrupt) at chosen calls, which moto cannot
produce.  Every other call goes to the real moto server over HTTP.
"""

from __future__ import annotations

from typing import Any, Callable


def client_error(code: str, op: str, message: str = "injected by the test") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, op)


def _tags(kwargs: dict, resource_type: str) -> list[dict]:
    for spec in kwargs.get("TagSpecifications", []):
        if spec.get("ResourceType") == resource_type:
            return list(spec.get("Tags", []))
    return []


class FakePlacementGroups:
    def __init__(self) -> None:
        self.groups: dict[str, dict] = {}
        self.created: list[str] = []

    def __call__(self, service: str, op: str, kwargs: dict, call: Callable[[], Any]) -> Any:
        if op == "create_placement_group":
            if kwargs.get("DryRun"):
                raise client_error("DryRunOperation", "CreatePlacementGroup", "Request would have succeeded")
            name = kwargs["GroupName"]
            if name in self.groups:
                raise client_error("InvalidPlacementGroup.Duplicate", "CreatePlacementGroup")
            self.groups[name] = {"GroupName": name, "Strategy": kwargs.get("Strategy"), "State": "available",
                                 "Tags": _tags(kwargs, "placement-group")}
            self.created.append(name)
            return {"PlacementGroup": self.groups[name]}
        if op == "describe_placement_groups":
            return {"PlacementGroups": [g for g in self.groups.values() if _matches(g, kwargs)]}
        if op == "delete_placement_group":
            if kwargs["GroupName"] not in self.groups:
                raise client_error("InvalidPlacementGroup.Unknown", "DeletePlacementGroup")
            del self.groups[kwargs["GroupName"]]
            return {}
        if op == "run_instances" and not kwargs.get("DryRun"):
            group = kwargs.get("Placement", {}).get("GroupName")
            if group and group not in self.groups:
                raise client_error("InvalidPlacementGroup.Unknown", "RunInstances", f"no group {group}")
        return call()

    def tagged(self, cluster: str) -> list[str]:
        return [n for n, g in self.groups.items()
                if any(t["Key"] == "clustertool:cluster" and t["Value"] == cluster for t in g["Tags"])]


def _matches(group: dict, kwargs: dict) -> bool:
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    if kwargs.get("GroupNames") and group["GroupName"] not in kwargs["GroupNames"]:
        return False
    for flt in kwargs.get("Filters", []):
        name, values = flt["Name"], flt["Values"]
        if name == "tag-key" and not any(v in tags for v in values):
            return False
        if name.startswith("tag:") and tags.get(name[4:]) not in values:
            return False
    return True


class Recorder:
    """Records the operations the provider calls, in order."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def __call__(self, service, op, kwargs, call):
        self.ops.append(op)
        return call()


class Faults:
    """Raise ``exc`` at the n-th call of ``op`` (before or after the real call runs)."""

    def __init__(self) -> None:
        self.rules: list[dict] = []
        self.fired: list[str] = []

    def add(self, op: str, exc: BaseException | Callable[[dict], BaseException | None], *, nth: int = 1,
            times: int = 1, after: bool = False) -> None:
        self.rules.append({"op": op, "exc": exc, "nth": nth, "times": times, "after": after, "seen": 0})

    def __call__(self, service, op, kwargs, call):
        for rule in self.rules:
            if rule["op"] != op:
                continue
            rule["seen"] += 1
            if rule["nth"] <= rule["seen"] < rule["nth"] + rule["times"]:
                exc = rule["exc"](kwargs) if callable(rule["exc"]) and not isinstance(rule["exc"], BaseException) \
                    and not isinstance(rule["exc"], type) else rule["exc"]
                if exc is None:
                    continue
                if rule["after"]:
                    call()
                self.fired.append(op)
                raise exc
        return call()

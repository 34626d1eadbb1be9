"""Adopt instances launched by hand: --adopt-tag Name=john,paul,george,ringo or --adopt-ids i-..,i-..

Adopted instances are never tagged, changed, stopped or terminated by the tool unless the
user says so (``down --terminate-adopted``)."""

from __future__ import annotations

import re

from clustertool.core.errors import UsageError
from clustertool.core.model import Node
from clustertool.providers.aws import instances, tags
from clustertool.providers.aws.client import Aws

_ID_RE = re.compile(r"^i-[0-9a-f]{8,17}$")
_HINT = "e.g. --adopt-tag Name=john,paul,george,ringo or --adopt-ids i-0abc...,i-0def..."


def parse_tag(text: str) -> tuple[str, list[str]]:
    key, sep, values = (text or "").partition("=")
    names = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not names:
        raise UsageError(f"--adopt-tag: expected KEY=VALUE[,VALUE...], got {text!r}", hint=_HINT)
    return key.strip(), names


def parse_ids(text: str) -> list[str]:
    ids = [v.strip() for v in (text or "").split(",") if v.strip()]
    bad = [i for i in ids if not _ID_RE.match(i)]
    if not ids or bad:
        raise UsageError(f"--adopt-ids: not instance ids: {', '.join(bad) or repr(text)}", hint=_HINT)
    return ids


def find(aws: Aws, options: dict) -> list[dict]:
    """The instances to adopt, in the order the user listed them."""
    if options.get("adopt_ids"):
        wanted = parse_ids(options["adopt_ids"])
        found = {i["InstanceId"]: i for i in instances.describe(aws, wanted)}
        key = lambda i: i["InstanceId"]  # noqa: E731
    else:
        tag_key, wanted = parse_tag(options["adopt_tag"])
        found_list = instances.describe(aws, filters=[{"Name": f"tag:{tag_key}", "Values": wanted},
                                                     {"Name": "instance-state-name",
                                                      "Values": ["pending", "running", "stopped", "stopping"]}])
        found = {}
        for inst in found_list:
            value = tags.as_dict(inst.get("Tags")).get(tag_key)
            if value in found:
                raise UsageError(f"--adopt-tag: several instances have {tag_key}={value}",
                                 hint="use --adopt-ids to say which")
            found[value] = inst
        key = lambda i: tags.as_dict(i.get("Tags")).get(tag_key)  # noqa: E731
    missing = [w for w in wanted if w not in found]
    if missing:
        raise UsageError(f"instances to adopt not found in {aws.region}: {', '.join(missing)}", hint=_HINT)
    dead = [w for w in wanted if instances.state_of(found[w]) in ("terminated", "shutting-down")]
    if dead:
        raise UsageError(f"cannot adopt terminated instances: {', '.join(dead)}")
    return [found[w] for w in wanted] if wanted else sorted(found.values(), key=key)


def label(inst: dict) -> str:
    return tags.as_dict(inst.get("Tags")).get("Name") or inst["InstanceId"]


def to_nodes(found: list[dict], leader: str | None, slots: int) -> list[Node]:
    """Nodes in listed order; the leader is the one named by --leader (Name tag or id), else the first."""
    names = [label(i) for i in found]
    if leader and leader not in names and leader not in [i["InstanceId"] for i in found]:
        raise UsageError(f"--leader {leader!r} is not one of the adopted instances ({', '.join(names)})")
    lead = next((k for k, i in enumerate(found) if leader in (label(i), i["InstanceId"])), 0) if leader else 0
    nodes = []
    for k, inst in enumerate(found, start=1):
        node = instances.to_node(inst, index=k, leader=k - 1 == lead, slots=slots)
        node.extra["adopted"] = True
        node.extra["label"] = label(inst)
        nodes.append(node)
    return nodes

"""The one YAML reader of clustertool, for cluster specs and playbooks alike.

Rules, the same for every file the tool reads:

* safe loading only (no Python objects);
* booleans as YAML 1.2 reads them: only ``true``/``false`` (any case), so keys and values
  such as ``on``, ``off``, ``yes`` and ``no`` stay words (``on: leader`` is a key named "on");
* a key given twice in one mapping is an error naming its line, never "the last one wins".

Errors are one line naming the file and line (``SpecError``); ``what`` names the kind of
file in them ("spec file", "playbook").
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Hashable

from clustertool.core.errors import SpecError

_BOOL_TAG = "tag:yaml.org,2002:bool"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_LOADER: list[type] = []


def _loader() -> type:
    """A SafeLoader subclass with YAML 1.2 booleans that refuses duplicate keys (built once)."""
    if _LOADER:
        return _LOADER[0]
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: let the base class explain
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
    _LOADER.append(Loader)
    return Loader


def loads(text: str) -> Any:
    """Parse YAML text by the rules above; raises yaml.YAMLError."""
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        near = difflib.get_close_matches(os.path.basename(path), os.listdir(folder) if os.path.isdir(folder) else [],
                                         n=1)
        raise SpecError(f"{path}: no such {what}", hint=f"did you mean {os.path.join(os.path.dirname(path), near[0])}?"
                        if near else f"the path of a {what}, from this folder ({os.getcwd()})") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, expected a YAML {what}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text, expected a YAML {what}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def load(path: str, what: str) -> Any:
    """The parsed content of a YAML file; every problem is one line naming the file and line."""
    import yaml

    text = _read(str(path), what)
    try:
        return loads(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        last = max(1, len(text.splitlines()))
        line = f":{min(mark.line + 1, last)}" if mark is not None else ""
        problem = exc.problem or exc.context or "cannot parse"
        raise SpecError(f"{path}{line}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: malformed YAML: {exc}") from None

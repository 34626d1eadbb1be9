"""YAML playbooks: variables, steps that are clustertool commands, and ``always:`` steps.

::

    name: quickstart
    vars: {cluster: qs, nodes: 4, bucket: null}     # null: must be given with --var
    cluster: ${cluster}     # -c for every step that takes it (--name for up)
    on_failure: down        # default for steps: down | keep | continue
    steps:
      - name: bring the cluster up                  # optional; default: the command
        up: {provider: local, nodes: "${nodes}"}
      - exec: {nodes: leader, command: hostname}
        when: ${nodes} != 1                         # a value, or a == b / a != b
        timeout: 60                                 # seconds
      - doctor                                      # a command with no keys
    always:
      - down                                        # runs after a failure or Ctrl-C too
    report: [results/scaling.csv, results/scaling.png]  # shown at the end (CSV as a table)

Everything is checked before anything runs; a problem is one line naming the step and key.
``${name}`` is replaced by the variable (a value that is only ``${name}`` keeps its type);
``$$`` is a literal ``$``.  Built-in variables: ``python`` (a Python the nodes can run with
this tool's packages), ``workloads`` (the shipped workloads folder), ``playbook_dir``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustertool.core import yamlfile
from clustertool.core.errors import SpecError
from clustertool.playbook.steps import GROUPS, KNOWN_COMMANDS, CommandSpec, Resolver, ValueProblem, param_argv, suggest
from clustertool.workloads import DIR, node_python

TOP_KEYS = ("name", "description", "vars", "cluster", "on_failure", "steps", "always", "report")
CONTROL_KEYS = ("name", "when", "on_failure", "timeout")
ON_FAILURE = ("down", "keep", "continue")
VAR_RE = re.compile(r"\$\$|\$\{([^}]*)\}")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Step:
    section: str                # "steps" | "always"
    index: int                  # 1-based within its section
    command: tuple[str, ...]
    args: dict[str, Any]
    name: str
    when: Any = None
    on_failure: str = "down"
    timeout: float | None = None
    argv: list[str] = field(default_factory=list)  # set by plan()
    run: bool = True                               # False when `when:` is false

    @property
    def label(self) -> str:
        where = "always step" if self.section == "always" else "step"
        return f"{where} {self.index} ({self.name})"

    @property
    def display(self) -> str:
        return "clustertool " + shlex.join(self.argv)


@dataclass
class Playbook:
    path: str
    name: str
    description: str = ""
    vars: dict[str, Any] = field(default_factory=dict)
    cluster: str | None = None
    steps: list[Step] = field(default_factory=list)
    always: list[Step] = field(default_factory=list)
    report: list[str] = field(default_factory=list)  # files shown at the end (CSV as a table)


def builtin_vars(path: Path) -> dict[str, Any]:
    return {"python": shlex.join(node_python()), "workloads": str(DIR),
            "playbook_dir": str(path.resolve().parent)}


def _err(where: str, message: str) -> SpecError:
    return SpecError(f"{where}: {message}", hint="fix the playbook; `clustertool play FILE --dry-run` checks it all")


def load(path: str | Path, overrides: dict[str, Any] | None, resolver: Resolver) -> Playbook:
    """Read, substitute and check a playbook; every step gets its argv. Raises SpecError."""
    path = Path(path)
    data = yamlfile.load(str(path), "playbook")
    return parse(data, str(path), overrides or {}, resolver, builtin_vars(path))


def parse(data: Any, source: str, overrides: dict[str, Any], resolver: Resolver,
          builtins: dict[str, Any] | None = None) -> Playbook:
    if not isinstance(data, dict):
        raise _err(source, "a playbook is a mapping with steps: (and optional vars:, always:)")
    for key in data:
        if key not in TOP_KEYS:
            raise _err(source, f"unknown top-level key {key!r}{suggest(str(key), TOP_KEYS)}")
    variables = resolve_vars(data.get("vars") or {}, overrides, builtins or {}, source)
    book = Playbook(path=source, name=str(data.get("name") or Path(source).stem),
                    description=str(data.get("description") or ""), vars=variables)
    if data.get("cluster") is not None:
        book.cluster = str(substitute(data["cluster"], variables, f"{source}: key 'cluster'"))
    report = substitute(data.get("report") or [], variables, f"{source}: key 'report'")
    if not isinstance(report, list) or not all(isinstance(r, str) for r in report):
        raise _err(source, "key 'report' must be a list of file paths")
    book.report = report
    default = data.get("on_failure", "down")
    if default not in ON_FAILURE:
        raise _err(source, f"key 'on_failure' expects one of {', '.join(ON_FAILURE)}, got {default!r}")
    if not isinstance(data.get("steps"), list) or not data["steps"]:
        raise _err(source, "key 'steps' must be a non-empty list of steps")
    for section in ("steps", "always"):
        items = data.get(section) or []
        if not isinstance(items, list):
            raise _err(source, f"key {section!r} must be a list of steps")
        steps = [parse_step(item, section, i, default, variables, source) for i, item in enumerate(items, 1)]
        setattr(book, section, steps)
    for step in book.steps + book.always:
        plan_step(step, book.cluster, resolver)
    return book


def resolve_vars(declared: Any, overrides: dict[str, Any], builtins: dict[str, Any], source: str) -> dict[str, Any]:
    if not isinstance(declared, dict):
        raise _err(source, "key 'vars' must be a mapping of name: value")
    for name in list(declared) + list(overrides):
        if not NAME_RE.match(str(name)):
            raise _err(source, f"variable name {name!r} is not valid (letters, digits, _)")
    unknown = [k for k in overrides if k not in declared and k not in builtins]
    if unknown:
        raise _err(source, f"--var {unknown[0]}: the playbook has no such variable"
                           f"{suggest(unknown[0], list(declared) + list(builtins))}")
    values = {**builtins, **overrides}  # a var's value may use earlier vars and any --var
    for name, value in declared.items():
        if name in overrides:
            continue
        if value is None:
            raise _err(source, f"variable {name!r} has no value: pass --var {name}=VALUE")
        values[name] = substitute(value, values, f"{source}: variable {name!r}")
    return values


def substitute(value: Any, variables: dict[str, Any], where: str) -> Any:
    """Replace ${name} in strings (recursively in lists and mappings)."""
    if isinstance(value, list):
        return [substitute(v, variables, where) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, variables, where) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    whole = re.fullmatch(r"\$\{([^}]*)\}", value.strip())
    if whole:
        return _lookup(whole.group(1).strip(), variables, where)

    def replace(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        found = _lookup(m.group(1).strip(), variables, where)
        return str(found).lower() if isinstance(found, bool) else str(found)

    return VAR_RE.sub(replace, value)


def _lookup(name: str, variables: dict[str, Any], where: str) -> Any:
    if name not in variables:
        raise _err(where, f"variable {name!r} is not defined (add it under vars: or pass --var {name}=...)"
                          f"{suggest(name, variables)}")
    return variables[name]


def _command_key(item: dict, where: str) -> str:
    keys = [k for k in item if k not in CONTROL_KEYS]
    if not keys:
        raise _err(where, f"names no command (one of: {', '.join(KNOWN_COMMANDS)})")
    if len(keys) > 1:
        raise _err(where, f"names several commands ({', '.join(map(str, keys))}); one step runs one command")
    return str(keys[0])


def _command_path(key: str, where: str) -> tuple[str, ...]:
    words = tuple(key.split())
    if " ".join(words) in KNOWN_COMMANDS:
        return words
    if len(words) == 1 and words[0] in GROUPS:
        subs = [c.split()[1] for c in KNOWN_COMMANDS if c.startswith(words[0] + " ")]
        raise _err(where, f"{key!r} needs a subcommand: {', '.join(f'{key} {s}' for s in subs)}")
    raise _err(where, f"unknown command {key!r}{suggest(key, KNOWN_COMMANDS)}")


def parse_step(item: Any, section: str, index: int, default: str, variables: dict, source: str) -> Step:
    where = f"{'always step' if section == 'always' else 'step'} {index}"
    if isinstance(item, str):
        item = {item: None}
    if not isinstance(item, dict):
        raise _err(where, "a step is a mapping like `- exec: {command: hostname}` or a command name")
    key = _command_key(item, where)
    path = _command_path(key, where)
    name = str(substitute(item.get("name") or key, variables, f"{where}: key 'name'"))
    where = f"{where} ({name})"
    raw = item.get(key)
    if raw is not None and not isinstance(raw, dict):
        raise _err(where, f"the keys of {key!r} must be a mapping, e.g. `{key}: {{nodes: leader}}`")
    args = {str(k).replace("-", "_"): substitute(v, variables, f"{where}: key {k!r}")
            for k, v in (raw or {}).items()}
    step = Step(section, index, path, args, name, on_failure=item.get("on_failure", default))
    if step.on_failure not in ON_FAILURE:
        raise _err(where, f"key 'on_failure' expects one of {', '.join(ON_FAILURE)}, got {step.on_failure!r}")
    if "when" in item:
        step.when = substitute(item["when"], variables, f"{where}: key 'when'")
        step.run = condition(step.when, where)
    if item.get("timeout") is not None:
        step.timeout = _timeout(item["timeout"], where)
    return step


def _timeout(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _err(where, f"key 'timeout' expects a positive number of seconds, got {value!r}")
    return float(value)


def condition(value: Any, where: str) -> bool:
    """`when:` after substitution: a boolean-ish value, or `a == b` / `a != b` (as text)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if value is None:
        return False
    text = str(value).strip()
    for op in ("==", "!="):
        if op in text:
            left, right = (s.strip().strip("'\"") for s in text.split(op, 1))
            return (left == right) == (op == "==")
    if text.lower() in ("", "0", "false", "no", "off", "none", "null"):
        return False
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    raise _err(where, f"key 'when': cannot read {text!r} as a condition (use true/false, a == b, a != b)")


def plan_step(step: Step, cluster: str | None, resolver: Resolver) -> None:
    """Check the step's keys against its command and build its argv."""
    spec = resolver(step.command)
    args = dict(step.args)
    _inject_defaults(spec, args, cluster)
    options: list[str] = []
    positionals: list[str] = []
    for key, value in args.items():
        param = spec.lookup(key)
        if param is None:
            raise _err(step.label, f"{' '.join(step.command)} has no key {key!r}"
                                   f"{suggest(key, spec.keys())} (keys: {', '.join(spec.keys())})")
        try:
            opts, pos = param_argv(param, value)
        except ValueProblem as exc:
            raise _err(step.label, f"key {key!r} {exc}") from None
        options += opts
        positionals += pos
    missing = [p.name for p in spec.params if p.required and not any(spec.lookup(k) is p for k in args)]
    if missing:
        raise _err(step.label, f"missing required key {missing[0]!r} for {' '.join(step.command)}")
    step.argv = list(step.command) + options + (["--"] + positionals if positionals else [])


def _inject_defaults(spec: CommandSpec, args: dict[str, Any], cluster: str | None) -> None:
    """The playbook's cluster as -c (or up's --name); --yes for down (the playbook is the consent)."""
    if cluster:
        for key in (("name",) if spec.path == ("up",) else ("cluster",)):
            if spec.lookup(key) is not None and not any(spec.lookup(k) is spec.lookup(key) for k in args):
                args[key] = cluster
    yes = spec.lookup("yes")
    if yes is not None and yes.kind == "flag" and "yes" not in args:
        args["yes"] = True

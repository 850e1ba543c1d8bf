"""`areal-hpc config show|get|check`: print the resolved config or one of its values, or validate
config files."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import textwrap
from typing import Any

import yaml

from areal_hpc.config import reference, schema
from areal_hpc.config.load import Report, _known, load_config
from areal_hpc.errors import ConfigError

# Width of `config show`'s comment lines, as the schema wraps them.
COMMENT_WIDTH = 100


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override applied over the file, e.g. --set ppo.clip_eps=0.1 (repeatable)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="inspect and validate experiment configs")
    cmds = p.add_subparsers(dest="config_cmd", required=True)
    show = cmds.add_parser("show", help="print the resolved configuration as YAML, each key with its comment")
    show.add_argument("file", metavar="CONFIG", help="experiment YAML, e.g. configs/experiments/tiny-cpu.yaml")
    _overrides(show)
    show.set_defaults(func=_show)
    get = cmds.add_parser("get", help="print one resolved value, e.g. rollout.eta (for scripts); a section as YAML")
    get.add_argument("file", metavar="CONFIG", help="experiment YAML")
    get.add_argument("key", metavar="KEY", help="dotted key, e.g. rollout.eta, or a section, e.g. trainer")
    _overrides(get)
    get.set_defaults(func=_get)
    check = cmds.add_parser("check", help="validate config files; exit 2 on the first bad one")
    check.add_argument("files", nargs="+", metavar="CONFIG", help="experiment YAML files")
    _overrides(check)
    check.set_defaults(func=_check)
    reference.register(cmds)


def _flow(value: Any) -> str:
    """One value as YAML on one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def commented_yaml(cfg: Any) -> str:
    """The resolved config as YAML with each key's comment from the schema above it (the comment
    shared by the keys below it written once); loading it gives back `cfg`."""
    comments = reference.field_comments(inspect.getsource(schema))
    lines: list[str] = []

    def visit(obj: Any, pad: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            comment = comments.get((type(obj).__name__, f.name))
            if comment and comment.text and not comment.shared:
                lines.extend(textwrap.wrap(comment.text, COMMENT_WIDTH, initial_indent=f"{pad}# ",
                                           subsequent_indent=f"{pad}# "))
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{f.name}:")
                visit(value, pad + "  ")
            else:
                lines.append(f"{pad}{f.name}: {_flow(value)}")

    visit(cfg, "")
    return "\n".join(lines) + "\n"


def _show(args: argparse.Namespace) -> int:
    print(commented_yaml(load_config(args.file, args.overrides)), end="")
    return 0


def lookup(cfg: Any, key: str, source: str) -> Any:
    """The value of dotted `key` in `cfg`; a key the schema lacks is a ConfigError with the
    loader's suggestion of the closest one."""
    value, seen = cfg, []
    for part in key.split("."):
        if dataclasses.is_dataclass(value) and part in {f.name for f in dataclasses.fields(value)}:
            value = getattr(value, part)
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            report = Report()
            nested: Any = 0
            for name in reversed(key.split(".")[:len(seen) + 1]):
                nested = {name: nested}
            _known(nested, report)
            why = report.lines[0] if report.lines else f"no key '{key}': '{'.'.join(seen) or 'config'}' has no '{part}'"
            raise ConfigError(f"{source}: {why}")
        seen.append(part)
    return value


def as_yaml(value: Any) -> str:
    """A section, a mapping or a list as block YAML, anything else on one line."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict | list) and value:
        return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=10**6)
    return (value if isinstance(value, str) else _flow(value)) + "\n"  # a string as it is, for scripts


def _get(args: argparse.Namespace) -> int:
    print(as_yaml(lookup(load_config(args.file, args.overrides), args.key, args.file)), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    for f in args.files:
        load_config(f, args.overrides)
        print(f"ok: {f}")
    return 0

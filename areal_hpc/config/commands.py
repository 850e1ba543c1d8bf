"""`areal-hpc config show|get|check`: print the resolved config or one of its values, or validate
config files."""

from __future__ import annotations

import argparse

from areal_hpc.config import reference
from areal_hpc.config.load import load_config, to_yaml
from areal_hpc.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="inspect and validate experiment configs")
    cmds = p.add_subparsers(dest="config_cmd", required=True)
    show = cmds.add_parser("show", help="print the resolved configuration as YAML")
    show.add_argument("file")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="dotted override, e.g. --set ppo.clip_eps=0.1 (repeatable)")
    show.set_defaults(func=_show)
    get = cmds.add_parser("get", help="print one resolved value, e.g. rollout.eta (for scripts)")
    get.add_argument("file")
    get.add_argument("key", help="dotted key")
    get.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    get.set_defaults(func=_get)
    check = cmds.add_parser("check", help="validate config files; exit 2 on the first bad one")
    check.add_argument("files", nargs="+")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.set_defaults(func=_check)
    reference.register(cmds)


def _show(args: argparse.Namespace) -> int:
    print(to_yaml(load_config(args.file, args.overrides)), end="")
    return 0


def _get(args: argparse.Namespace) -> int:
    value = load_config(args.file, args.overrides)
    for part in args.key.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"{args.file}: no setting {args.key!r} (no {part!r})")
        value = getattr(value, part)
    print(value)
    return 0


def _check(args: argparse.Namespace) -> int:
    for f in args.files:
        load_config(f, args.overrides)
        print(f"ok: {f}")
    return 0

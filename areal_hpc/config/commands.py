"""`areal-hpc config show|check`: print the resolved config, or validate config files."""

from __future__ import annotations

import argparse

from areal_hpc.config.load import load_config, to_yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="inspect and validate experiment configs")
    cmds = p.add_subparsers(dest="config_cmd", required=True)
    show = cmds.add_parser("show", help="print the resolved configuration as YAML")
    show.add_argument("file")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="dotted override, e.g. --set ppo.clip_eps=0.1 (repeatable)")
    show.set_defaults(func=_show)
    check = cmds.add_parser("check", help="validate config files; exit 2 on the first bad one")
    check.add_argument("files", nargs="+")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.set_defaults(func=_check)


def _show(args: argparse.Namespace) -> int:
    print(to_yaml(load_config(args.file, args.overrides)), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    for f in args.files:
        load_config(f, args.overrides)
        print(f"ok: {f}")
    return 0

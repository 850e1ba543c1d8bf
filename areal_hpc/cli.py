"""The `areal-hpc` command: one subcommand group per area, each registered by its own module."""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import sys

from areal_hpc.errors import UserError

# Modules that define `register(subparsers)`; each adds one subcommand group.
COMMAND_MODULES = [
    "areal_hpc.runtime.train_command",
    "areal_hpc.config.commands",
    "areal_hpc.sim.commands",
    "areal_hpc.reward.commands",
    "areal_hpc.data.commands",
    "areal_hpc.slurm.commands",
    "areal_hpc.evaluation.commands",
    "areal_hpc.trainer.commands",
]
DESCRIPTION = ("Fully asynchronous RL for reasoning LLMs: train an experiment, inspect its config and data,"
               " predict its throughput, render its SLURM job, evaluate and export its checkpoints.")
# What a command without its subcommand exits with, as argparse does for other usage errors.
USAGE_EXIT = 2


def subcommands(action: argparse._SubParsersAction) -> list[tuple[str, str]]:
    """(name, help) of each subcommand of a group, in the order registered."""
    return [(a.dest, a.help or "") for a in action._choices_actions]


def _no_subcommand(parser: argparse.ArgumentParser, action: argparse._SubParsersAction,
                   _args: argparse.Namespace) -> int:
    choices = subcommands(action)
    width = max(len(name) for name, _ in choices)
    lines = [f"  {name:<{width}}  {text}" for name, text in choices]
    print(f"{parser.prog}: give a subcommand, one of:\n" + "\n".join(lines)
          + f"\nRun `{parser.prog} SUBCOMMAND --help` for its options.", file=sys.stderr)
    return USAGE_EXIT


def _list_missing_subcommands(parser: argparse.ArgumentParser) -> None:
    """Every command group, this one and those below it, answers a missing subcommand with its
    list of subcommands instead of argparse's `the following arguments are required`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.required = False
            parser.set_defaults(func=functools.partial(_no_subcommand, parser, action))
            for child in action.choices.values():
                _list_missing_subcommands(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="areal-hpc", description=DESCRIPTION)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {importlib.metadata.version('areal-hpc')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _list_missing_subcommands(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

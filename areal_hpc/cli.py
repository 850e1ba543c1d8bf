"""The `areal-hpc` command: one subcommand group per area, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

from areal_hpc.errors import UserError

# Modules that define `register(subparsers)`; each adds one subcommand group.
COMMAND_MODULES = [
    "areal_hpc.config.commands",
    "areal_hpc.sim.commands",
    "areal_hpc.reward.commands",
    "areal_hpc.data.commands",
    "areal_hpc.slurm.commands",
    "areal_hpc.evaluation.commands",
    "areal_hpc.trainer.commands",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="areal-hpc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
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

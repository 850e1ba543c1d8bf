"""The `areal-hpc` command line as a user meets it: help for every argument, --version, a missing
subcommand, and one name per option across subcommands."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from areal_hpc.cli import build_parser, main


def parsers(parser: argparse.ArgumentParser, path: str = "areal-hpc"):
    """(command path, parser) of every command and subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_every_positional_and_every_set_has_help() -> None:
    missing = []
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            shown = action.help not in (None, "", argparse.SUPPRESS)
            if (not action.option_strings and not isinstance(action, argparse._SubParsersAction)
                    or "--set" in action.option_strings) and not shown:
                missing.append(f"{path} {action.dest}")
    assert missing == []


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"areal-hpc {importlib.metadata.version('areal-hpc')}\n"


@pytest.mark.parametrize("argv, first, listed", [
    ([], "areal-hpc: give a subcommand, one of:", ["train", "config", "sim", "slurm", "eval", "export-hf"]),
    (["config"], "areal-hpc config: give a subcommand, one of:", ["show", "get", "check"]),
    (["sim"], "areal-hpc sim: give a subcommand, one of:", ["scaling", "hours", "staleness", "fit"]),
])
def test_a_missing_subcommand_lists_them(capsys, argv: list[str], first: str, listed: list[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(first + "\n") and "required" not in err
    names = [line.split()[0] for line in err.splitlines()[1:-1]]
    assert set(listed) <= set(names)


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_sim_hours_takes_gpus_as_the_other_sim_commands_do(capsys) -> None:
    args = ("sim", "hours", "--model", "1.5b", "--steps", "10", "--quick", "--json")
    assert run(capsys, *args, "--gpus", "16") == run(capsys, *args, "--nodes", "2")  # the old name, hidden
    assert "--nodes" not in help_of(capsys, "sim", "hours") and "--gpus" in help_of(capsys, "sim", "hours")
    assert main([*args, "--gpus", "12"]) == 2
    assert capsys.readouterr().err == "error: --gpus must be a positive multiple of the preset's 8 GPUs a node, got 12\n"
    assert main(list(args)) == 2 and capsys.readouterr().err == "error: give the run's GPUs with --gpus\n"


def test_slurm_plan_takes_hardware_as_sim_does(capsys) -> None:
    args = ("slurm", "plan", "configs/experiments/code-32b.yaml")
    h200 = run(capsys, *args, "--hardware", "h200")
    assert "(estimate, H200 141 GB)" in h200 and run(capsys, *args, "--gpu", "h200") == h200  # the old name, hidden
    shown = help_of(capsys, "slurm", "plan")
    assert "--hardware" in shown and "--gpu " not in shown

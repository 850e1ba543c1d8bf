"""`areal-hpc slurm render|plan|scale|verify`: job scripts from configs, the rank -> node -> GPU map,
strong-scaling points, and the check of a layout at its true shapes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.sim.hardware import preset
from areal_hpc.slurm.plan_report import describe
from areal_hpc.slurm.render import render
from areal_hpc.slurm.scaling import parse_context, strong_scaling_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slurm", help="heterogeneous SLURM job scripts and rank plans")
    cmds = p.add_subparsers(dest="slurm_cmd", required=True)
    r = cmds.add_parser("render", help="print (or write) the sbatch script of a config")
    r.add_argument("file", help="experiment config, named in the script as given here")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, baked into the script (repeatable)")
    r.add_argument("-o", "--output", help="write the script here (executable) instead of printing it")
    r.set_defaults(func=_render)
    pl = cmds.add_parser("plan", help="print the rank -> component -> node -> GPU map of a config")
    pl.add_argument("file", help="experiment config")
    pl.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="dotted override (repeatable)")
    pl.add_argument("--ranks", action="store_true", help="also print one line per rank")
    pl.add_argument("--hardware", default="h800",
                    help="GPU preset of the memory estimate: h800 (the paper's), h100 or h200 (as sim --hardware)")
    pl.add_argument("--gpu", dest="hardware", help=argparse.SUPPRESS)  # the old name, kept for scripts
    pl.set_defaults(func=_plan)
    sc = cmds.add_parser("scale", help="render the sbatch script of one strong-scaling point of a config")
    sc.add_argument("file", help="experiment config")
    sc.add_argument("gpus", type=int, help="total GPUs of the point")
    sc.add_argument("--context", default="32k", help="longest sequence, prompt + generation (16k, 32k, 20000)")
    sc.add_argument("--steps", type=int, default=20, help="training steps of the point")
    sc.add_argument("--run-dir", required=True, help="the point's logging.dir (metrics.jsonl goes there)")
    sc.add_argument("-o", "--output", help="write the script here (executable) instead of printing it")
    sc.set_defaults(func=_scale)
    v = cmds.add_parser("verify", help="check a config's whole layout at its true shapes (config.json only, no GPU)")
    v.add_argument("file", help="experiment config")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override (repeatable)")
    v.add_argument("--hardware", help="GPU preset of the memory check: h800 (the paper's), h100 or h200 (default:"
                   " $AREAL_GPU, else h800)")
    v.add_argument("--gpu", dest="hardware", help=argparse.SUPPRESS)  # the old name, kept for scripts
    v.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    v.set_defaults(func=_verify)


def _render(args: argparse.Namespace) -> int:
    _emit(args.file, args.overrides, args.output)
    return 0


def _emit(config: str, overrides: list[str], output: str | None) -> None:
    text = render(load_config(config, overrides), config, overrides, script_path=output)
    if output is None:
        print(text, end="")
        return
    out = Path(output)
    out.write_text(text)
    out.chmod(0o755)


def _plan(args: argparse.Namespace) -> int:
    print(describe(load_config(args.file, args.overrides), ranks=args.ranks, hw=preset(args.hardware)))
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Exit 0 with the table (or JSON), 2 with one line per problem."""
    from areal_hpc.metrics.library_logs import quiet_libraries
    from areal_hpc.slurm.verify import as_dict, gpu_of, table, verify

    quiet_libraries()
    cfg = load_config(args.file, args.overrides, check_files=False)
    report = verify(cfg, gpu_of(args.hardware), progress=lambda line: print(f"verify: {line}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(as_dict(report), indent=1))
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    if report.problems:
        return 2
    if not args.json:
        print(table(report))
    return 0


def _scale(args: argparse.Namespace) -> int:
    overrides = strong_scaling_overrides(load_config(args.file), args.gpus, parse_context(args.context),
                                         args.steps, args.run_dir)
    _emit(args.file, overrides, args.output)
    return 0

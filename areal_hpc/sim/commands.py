"""`areal-hpc sim scaling|hours|staleness|fit`: the simulator's predictions on the command line,
and its calibration on measured runs.

With --json each prediction prints exactly the documented JSON (an interface other tools read);
without it, a small table. Out-of-memory layouts print null. `fit` reads run directories and
writes a calibration file; `--calibration FILE` predicts with one. The files are read and written
here; the fit itself is run_fit.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from areal_hpc.config.load import load_config
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.errors import UserError
from areal_hpc.metrics.jsonl import LogError, read_records
from areal_hpc.metrics.writer import METRICS_FILE
from areal_hpc.sim import predict
from areal_hpc.sim.calibration import Calibration, CalibrationError
from areal_hpc.sim.hardware import PRESETS, preset
from areal_hpc.sim.lengths import REASONING
from areal_hpc.sim.run_fit import MeasuredRun, fit_runs, step_records

# The CLI's default preset without a calibration (with one: the preset it was measured on).
DEFAULT_HARDWARE = "h800"


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not values:
        raise UserError(f"{what} is empty")
    return values


def _common(p: argparse.ArgumentParser, system: bool = True) -> None:
    p.add_argument("--model", required=True,
                   help=f"model size: {', '.join(predict.EXPERIMENTS)}, or an experiment config .yaml")
    if system:
        p.add_argument("--system", default="areal", help="areal (asynchronous) or sync (verl-like colocated)")
    p.add_argument("--hardware", default=None,
                   help=f"GPU preset: {', '.join(PRESETS)} (default: the calibration's, else {DEFAULT_HARDWARE})")
    p.add_argument("--calibration", default=None,
                   help="a file written by `areal-hpc sim fit`: predict with its fitted parameters")
    p.add_argument("--quick", action="store_true", help="simulate fewer training steps (faster, noisier)")
    p.add_argument("--json", action="store_true", help="print JSON")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="predict throughput and training time on a simulated cluster")
    cmds = p.add_subparsers(dest="sim_cmd", required=True)
    scaling = cmds.add_parser("scaling", help="effective tokens/s at several GPU counts")
    _common(scaling)
    scaling.add_argument("--context", type=int, required=True, help="tokens per sequence, prompt included")
    scaling.add_argument("--gpus", required=True, help="comma-separated GPU counts, e.g. 32,64,128")
    scaling.set_defaults(func=_scaling)
    hours = cmds.add_parser("hours", help="wall-clock hours of a training run (Table 3 batch)")
    _common(hours)
    hours.add_argument("--gpus", type=int, help="total GPUs, whole nodes of the preset (required)")
    # The old name, in whole nodes, kept for scripts.
    hours.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    hours.add_argument("--steps", type=int, required=True, help="training steps of the run")
    hours.add_argument("--context", type=int, default=None,
                       help="tokens per sequence, prompt included (default: the experiment config's)")
    hours.add_argument("--eta", type=int, default=None,
                       help="staleness bound of the asynchronous system (default: the experiment config's)")
    hours.set_defaults(func=_hours)
    stale = cmds.add_parser("staleness", help="asynchronous tokens/s at several staleness bounds")
    _common(stale, system=False)
    stale.add_argument("--gpus", type=int, required=True, help="total GPUs")
    stale.add_argument("--etas", default="0,1,2,4,8,16", help="comma-separated staleness bounds")
    stale.add_argument("--context", type=int, default=None,
                       help="tokens per sequence, prompt included (default: the experiment config's)")
    stale.add_argument("--gate", default=None, choices=predict.GATES,
                       help="training gate: strict (trained staleness <= eta) or admission (AReaL's; "
                            "default: the experiment config's rollout.staleness_gate)")
    stale.set_defaults(func=_staleness)
    fit = cmds.add_parser("fit", help="fit the simulator's parameters to measured runs")
    fit.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="logging.dir of a finished run")
    fit.add_argument("--out", required=True, help="calibration file to write (YAML)")
    fit.add_argument("--config", default=None,
                     help="the runs' experiment config (default: each run's newest checkpoint's config.yaml)")
    fit.add_argument("--hardware", default=None,
                     help=f"preset the runs ran on: {', '.join(PRESETS)} (default: cpu for device cpu)")
    fit.set_defaults(func=_fit)


def read_calibration(path: str | Path) -> Calibration:
    """The calibration in `path`; a missing, unreadable or malformed file is a UserError naming it."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UserError(f"calibration {path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise UserError(f"calibration {path}: not YAML ({e})") from None
    try:
        cal = Calibration.from_dict(data)
        preset(cal.hardware)
    except CalibrationError as e:
        raise CalibrationError(f"calibration {path}: {e}") from None
    except UserError as e:
        raise CalibrationError(f"calibration {path}: hardware: {e}") from None
    return cal


def write_calibration(cal: Calibration, path: str | Path) -> None:
    header = ("# Written by `areal-hpc sim fit`: the simulator's parameters fitted on measured runs.\n"
              "# value: the fitted value; points: what it was fitted on (0: the prior, not fitted);\n"
              "# residual: RMS relative error of its model on those points (docs/simulator.md).\n")
    try:
        Path(path).write_text(header + yaml.safe_dump(cal.to_dict(), sort_keys=False))
    except OSError as e:
        raise UserError(f"--out {path}: cannot write it ({e.strerror or e})") from None


def _run_config(run_dir: Path, config: str | None):
    if config is not None:
        return load_config(config, check_files=False)
    own = run_dir / "config.yaml"
    latest = ckpt.latest_complete(run_dir / "checkpoints")
    path = own if own.is_file() else None if latest is None else ckpt.config_file(latest)
    if path is None:
        raise UserError(f"run {run_dir}: no config.yaml and no complete checkpoint with one; name it with --config")
    return load_config(path, check_files=False)


def measured_run(run_dir: str, config: str | None) -> MeasuredRun:
    """One run directory's config and training-step records."""
    root = Path(run_dir)
    metrics = root / METRICS_FILE
    if not metrics.is_file():
        raise UserError(f"run {run_dir}: no {METRICS_FILE}")
    try:
        steps = step_records(read_records(metrics))
    except LogError as e:
        raise UserError(str(e)) from None
    if not steps:
        raise UserError(f"run {run_dir}: {metrics} holds no training step")
    return MeasuredRun(str(run_dir), _run_config(root, config), steps)


def _fit(args: argparse.Namespace) -> int:
    runs = [measured_run(d, args.config) for d in args.run_dirs]
    name = args.hardware or ("cpu" if all(r.cfg.device == "cpu" for r in runs) else None)
    if name is None:
        raise UserError("the runs ran on GPUs: name their preset with --hardware")
    cal = fit_runs(runs, preset(name))
    write_calibration(cal, args.out)
    for pname in cal.parameter_names():
        f = getattr(cal, pname)
        how = "not measured by these runs: kept the prior" if f.points == 0 else (
            f"{f.points} points, residual " + ("n/a" if f.residual is None else f"{f.residual:.1%}"))
        print(f"{pname:20s} {f.value:<12.4g} {how}", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _setup(args: argparse.Namespace) -> dict:
    """Hardware and fitted parameters for predict's functions, from --calibration and --hardware."""
    cal = None if args.calibration is None else read_calibration(args.calibration)
    hw = preset(args.hardware or (cal.hardware if cal else DEFAULT_HARDWARE))
    if cal is None:
        return {"hw": hw}
    return {"hw": hw, "eff": cal.efficiency, "lengths": cal.lengths(REASONING.cap), "reward_s": cal.reward_s.value,
            "prompt_len": cal.prompt_tokens()}


def _fidelity(args: argparse.Namespace) -> predict.Fidelity:
    return predict.QUICK if args.quick else predict.DEFAULT


def _scaling(args: argparse.Namespace) -> int:
    gpus = _ints(args.gpus, "--gpus")
    preds = predict.scaling(args.model, args.context, gpus, args.system, fidelity=_fidelity(args), **_setup(args))
    if args.json:
        print(json.dumps([{"gpus": n, "tokens_per_s": p.tokens_per_s} for n, p in zip(gpus, preds, strict=True)]))
    else:
        for p in preds:
            print(f"{p.setting()}\n    {p.summary()}")
    return 0


def whole_nodes(gpus: int | None, nodes: int | None, gpus_per_node: int) -> int:
    """The nodes of `--gpus` (or of the old `--nodes`); a count that is not whole nodes is refused."""
    if (gpus is None) == (nodes is None):
        raise UserError("give the run's GPUs with --gpus" if gpus is None else "give --gpus or --nodes, not both")
    if nodes is not None:
        return nodes
    if gpus < 1 or gpus % gpus_per_node:
        raise UserError(f"--gpus must be a positive multiple of the preset's {gpus_per_node} GPUs a node, got {gpus}")
    return gpus // gpus_per_node


def _hours(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise UserError(f"--steps must be positive, got {args.steps}")
    setup = _setup(args)
    nodes = whole_nodes(args.gpus, args.nodes, setup["hw"].gpus_per_node)
    pred = predict.hours(args.model, nodes, args.system, fidelity=_fidelity(args), context=args.context,
                         eta=args.eta, **setup)
    value = None if pred.run is None else pred.run.hours(args.steps)
    if args.json:
        print(json.dumps({"hours": value}))
    else:
        print(f"{pred.setting()}\n    {pred.summary()}")
        if value is not None:
            print(f"    {args.steps} steps: {value:.1f} hours")
    return 0


def _staleness(args: argparse.Namespace) -> int:
    etas = _ints(args.etas, "--etas")
    preds = predict.staleness(args.model, args.gpus, list(etas), args.context, fidelity=_fidelity(args),
                              gate=args.gate, **_setup(args))
    if args.json:
        print(json.dumps([{"eta": eta, "tokens_per_s": p.tokens_per_s,
                           "max_staleness": None if p.run is None else p.run.max_staleness}
                          for eta, p in zip(etas, preds, strict=True)]))
    else:
        print(preds[0].setting(with_eta=False))
        for eta, p in zip(etas, preds, strict=True):
            trained = "" if p.run is None else f"  max trained staleness {p.run.max_staleness}"
            print(f"    eta {eta:3d}  {p.summary()}{trained}")
    return 0

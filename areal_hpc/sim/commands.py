"""`areal-hpc sim scaling|hours|staleness`: the simulator's predictions on the command line.

With --json each prints exactly the documented JSON (an interface other tools read); without it,
a small table. Out-of-memory layouts print null.
"""

from __future__ import annotations

import argparse
import json

from areal_hpc.errors import UserError
from areal_hpc.sim import predict
from areal_hpc.sim.hardware import PRESETS, preset


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not values:
        raise UserError(f"{what} is empty")
    return values


def _common(p: argparse.ArgumentParser, system: bool = True) -> None:
    p.add_argument("--model", required=True, help=f"model size: {', '.join(predict.EXPERIMENTS)}")
    if system:
        p.add_argument("--system", default="areal", help="areal (asynchronous) or sync (verl-like colocated)")
    p.add_argument("--hardware", default="h800", help=f"GPU preset: {', '.join(PRESETS)}")
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
    hours.add_argument("--nodes", type=int, required=True)
    hours.add_argument("--steps", type=int, required=True)
    hours.set_defaults(func=_hours)
    stale = cmds.add_parser("staleness", help="asynchronous tokens/s at several staleness bounds")
    _common(stale, system=False)
    stale.add_argument("--gpus", type=int, required=True)
    stale.add_argument("--etas", default="0,1,2,4,8,16", help="comma-separated staleness bounds")
    stale.add_argument("--context", type=int, default=None,
                       help="tokens per sequence, prompt included (default: the experiment config's)")
    stale.add_argument("--gate", default=None, choices=predict.GATES,
                       help="training gate: strict (trained staleness <= eta) or admission (AReaL's; "
                            "default: the experiment config's rollout.staleness_gate)")
    stale.set_defaults(func=_staleness)


def _fidelity(args: argparse.Namespace) -> predict.Fidelity:
    return predict.QUICK if args.quick else predict.DEFAULT


def _scaling(args: argparse.Namespace) -> int:
    gpus = _ints(args.gpus, "--gpus")
    preds = predict.scaling(args.model, args.context, gpus, args.system, preset(args.hardware),
                            fidelity=_fidelity(args))
    if args.json:
        print(json.dumps([{"gpus": n, "tokens_per_s": p.tokens_per_s} for n, p in zip(gpus, preds, strict=True)]))
    else:
        for p in preds:
            print(f"{p.setting()}\n    {p.summary()}")
    return 0


def _hours(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise UserError(f"--steps must be positive, got {args.steps}")
    pred = predict.hours(args.model, args.nodes, args.system, preset(args.hardware), fidelity=_fidelity(args))
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
    preds = predict.staleness(args.model, args.gpus, list(etas), args.context, preset(args.hardware),
                              fidelity=_fidelity(args), gate=args.gate)
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

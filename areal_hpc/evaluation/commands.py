"""`areal-hpc eval` (score a checkpoint on held-out data sets) and `areal-hpc eval-merge` (combine
the shards of a multi-node evaluation)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.errors import UserError
from areal_hpc.evaluation.presets import PRESETS, resolve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score a checkpoint on data sets: avg@n, pass@k, maj@n (summary.json)",
                       description="Sample every prompt n times with vLLM (one engine per GPU, or --engines"
                       " on CPU), score each sample with the training reward (reward.kind, reward.by_source),"
                       " write OUT/summary.json, OUT/NAME.responses.jsonl and print a table.")
    p.add_argument("--model", required=True,
                   help="Hugging Face model directory, e.g. a training checkpoint's hf/ export (areal-hpc export-hf"
                        " writes one)")
    p.add_argument("--data", required=True,
                   help="data files or dataset directories, comma-separated (read as data.train_path; each named"
                        " by its stem)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", help=f"sampling protocol: {', '.join(f'{k} ({v})' for k, v in PRESETS.items())};"
                                    " flags given override it")
    p.add_argument("--n", type=int, help="samples per prompt")
    p.add_argument("--temperature", type=float, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (1: off)")
    p.add_argument("--max-new-tokens", type=int, help="most generated tokens per sample")
    p.add_argument("--seed", type=int, help="sampling seed (default: the config's seed)")
    p.add_argument("--engines", type=int,
                   help="vLLM engines (default: one per GPU or generator.tensor_parallel_size GPUs; 1 on CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the engines run (default auto: cuda when a GPU is visible)")
    p.add_argument("--shard", default="0/1", metavar="I/N",
                   help="evaluate only shard I of N (one per node); then `areal-hpc eval-merge --out OUT`")
    p.add_argument("--config", help="experiment config for the data, reward and generator sections (default: built-in)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set reward.kind=code (repeatable)")
    p.set_defaults(func=_eval)
    m = sub.add_parser("eval-merge", help="combine the shards of `areal-hpc eval --shard I/N` into summary.json")
    m.add_argument("--out", required=True, help="the output directory every shard wrote to")
    m.set_defaults(func=_merge)


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= index < count:
        raise UserError(f"--shard {text!r}: need 0 <= I < N")
    return index, count


def model_problem(model: Path) -> str | None:
    """Why `model` is not a Hugging Face directory vLLM can load, pointing a training checkpoint
    (or a run's checkpoints directory) to its hf/ export or to `areal-hpc export-hf`; None if it is one."""
    if (model / "config.json").is_file():
        return None
    if (ckpt.hf_dir(model) / "config.json").is_file():
        return f"a training checkpoint, not a Hugging Face directory: evaluate its export, --model {ckpt.hf_dir(model)}"
    if ckpt.trainer_dir(model).is_dir() or ckpt.config_file(model).is_file():
        return ("a training checkpoint without a Hugging Face export (hf/, written at checkpoint.hf_interval):"
                f" export it first, areal-hpc export-hf {model} --out DIR, then evaluate --model DIR")
    latest = ckpt.latest_complete(model)
    if latest is not None:
        return f"a run's checkpoints directory: evaluate one checkpoint's hf/ export, e.g. --model {ckpt.hf_dir(latest)}"
    return "no config.json there (not a Hugging Face checkpoint directory)"


def _eval(args: argparse.Namespace) -> int:
    from areal_hpc.evaluation.run import EvalJob, evaluate

    model = Path(args.model)
    problem = model_problem(model)
    if problem:
        raise UserError(f"--model {model}: {problem}")
    # Checked as the CPU profile is, which leaves out the trainer and cluster layout: evaluation
    # uses neither. The engines then run on --device.
    cfg = load_config(args.config, [*args.overrides, f"model.path={json.dumps(str(model))}", "device=cpu"])
    cfg = dataclasses.replace(cfg, device=args.device)
    given = {"n": args.n, "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
    sampling = resolve(args.preset, given, cfg.seed if args.seed is None else args.seed)
    data = [Path(d) for d in args.data.split(",") if d]
    if not data:
        raise UserError("--data: no file given")
    evaluate(EvalJob(model, data, sampling, Path(args.out), args.engines, _shard(args.shard)), cfg)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from areal_hpc.evaluation.run import merge

    merge(Path(args.out))
    return 0

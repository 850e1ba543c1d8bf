"""The tiny model of the CPU profile, warm-started so that RL has something to improve.

A random tiny Qwen2 never produces an answer the reward accepts, so every reward would be equal
and RL would learn nothing. This module builds the tokenizer and the random model, trains it by SFT
on worked solutions of the synthetic task (data.synthetic_task) with the real trainer (megatron-core,
one gloo rank) until greedy decoding solves part of a validation set, as the run's reward judges it
(the math check, or the programs run in the sandbox), and exports it as a Hugging Face directory
that vLLM loads. The result is cached under `.cache/` keyed by everything that shapes it, so only
the first run pays for it:

    python -m areal_hpc.recipes.warm_start configs/experiments/tiny-cpu.yaml   # prints the directory
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.data.arithmetic import MAX_OPS, OPERATORS, Problem
from areal_hpc.data.synthetic_tasks import make_problem, make_splits, with_slip

CACHE_ENV = "AREAL_HPC_CACHE"
READY_FILE = "warm_start.json"
# SFT problems avoid the first this-many held-out problems of the seed, which contain the held-out
# set of any run with data.synthetic_eval_size up to it (held-out sets are prefixes of one
# sequence), so one warm-started model serves every such run. Kept small: the task has only 243
# distinct one-operation problems.
RESERVED_HELD_OUT = 128


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How the warm start trains; part of the cache key."""

    sft_problems: int = 6000
    val_problems: int = 128
    # Longest SFT problem in operations: short problems teach the arithmetic fastest; RL then
    # meets the longer ones of the full distribution (up to 8 operations).
    max_ops: int = 4
    # Small batches learn more per token here (measured: 16 x 2000 steps beat 64 x 700 steps).
    batch: int = 16
    lr: float = 2e-3
    max_steps: int = 2800
    eval_every: int = 400
    version: int = 1


def cache_dir(cfg: ExperimentConfig, recipe: Recipe = Recipe()) -> Path:
    model = dataclasses.asdict(cfg.model)
    model.pop("path")
    model.pop("tokenizer_path")
    data = cfg.data
    # Where SFT stops (data.synthetic_warm_start_accuracy) is part of the recipe.
    key = {"model": model, "seed": cfg.seed,
           "recipe": {**dataclasses.asdict(recipe), "target_accuracy": data.synthetic_warm_start_accuracy}}
    if data.synthetic_eval_size > RESERVED_HELD_OUT:
        key["eval"] = data.synthetic_eval_size
    if (data.synthetic_max_ops, data.synthetic_ops) != (MAX_OPS, OPERATORS):
        key["task"] = {"max_ops": data.synthetic_max_ops, "ops": data.synthetic_ops}
    if data.synthetic_task != "arithmetic":  # absent for the default: cached models keep their keys
        key["synthetic_task"] = data.synthetic_task
    if data.synthetic_warm_start_slips:
        key["slips"] = data.synthetic_warm_start_slips
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(os.environ.get(CACHE_ENV, ".cache")) / "tiny-model" / f"{cfg.model.name}-{digest}"


def is_prepared(path: Path) -> bool:
    return (path / READY_FILE).is_file()


def ensure_prepared(cfg: ExperimentConfig) -> Path:
    """The cached model directory; prepares it in a child process the first time (minutes)."""
    from areal_hpc.config.load import save_config

    out = cache_dir(cfg)
    if is_prepared(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another launch may be preparing the same model
        if not is_prepared(out):
            with tempfile.TemporaryDirectory() as tmp:
                config = Path(tmp) / "config.yaml"
                save_config(cfg, config)
                print(f"preparing the tiny model in {out} (first run only; a few minutes)", file=sys.stderr, flush=True)
                subprocess.run([sys.executable, "-m", __name__, str(config)], check=True)
    return out


def sft_and_validation(cfg: ExperimentConfig, recipe: Recipe) -> tuple[list[Problem], list[Problem]]:
    """SFT problems (up to recipe.max_ops operations) with worked solutions, data.synthetic_warm_start_slips
    of them slipped (synthetic_tasks.with_slip), and validation problems of the run's task distribution;
    none of them is held out for RL."""
    data = cfg.data
    _, reserved = make_splits(data, cfg.seed, 0, max(data.synthetic_eval_size, RESERVED_HELD_OUT))
    avoid = {p.prompt for p in reserved}
    rng = random.Random(f"warm-start/{cfg.seed}")
    slips = random.Random(f"warm-start-slips/{cfg.seed}")

    def draw(n: int, max_ops: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            p = make_problem(data, rng, max_ops)
            if p.prompt not in avoid:
                out.append(p)
        return out

    sft = [with_slip(data, p, slips) if slips.random() < data.synthetic_warm_start_slips else p
           for p in draw(recipe.sft_problems, min(recipe.max_ops, data.synthetic_max_ops))]
    return sft, draw(recipe.val_problems, data.synthetic_max_ops)


def answer_check(cfg: ExperimentConfig) -> Callable[[str, Problem], bool]:
    """Whether a response solves a problem, as the run's reward judges it: math verification of the
    final answer, or (programs) the program run in the run's sandbox against the problem's tests."""
    if cfg.data.synthetic_task == "programs":
        from areal_hpc.reward.code_check import check_code
        from areal_hpc.reward.code_tests import parse_tests
        from areal_hpc.reward.sandbox import Sandbox
        from areal_hpc.reward.task import CodeTask

        sandbox = Sandbox.detect(cfg.reward.code)
        return lambda text, p: check_code(CodeTask(text, parse_tests(json.loads(p.answer))), cfg.reward,
                                          sandbox).reward >= cfg.reward.correct

    from areal_hpc.config.schema import RewardConfig
    from areal_hpc.reward.math_check import check_math
    from areal_hpc.reward.task import MathTask

    reward = RewardConfig()
    return lambda text, p: check_math(MathTask(text, p.answer), reward).passed == 1


def greedy_accuracy(model_dir: Path, problems: list[Problem], max_new_tokens: int,
                    solves: Callable[[str, Problem], bool]) -> float:
    """Share of problems whose greedy completion `solves` accepts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(map(solves, texts, problems)) / len(problems)


def _sft_config(cfg: ExperimentConfig, recipe: Recipe) -> ExperimentConfig:
    sft = dataclasses.replace(cfg, total_steps=recipe.max_steps, device="cpu")
    sft.trainer = dataclasses.replace(cfg.trainer, tp=1, pp=1, dp=1)
    sft.optimizer = dataclasses.replace(cfg.optimizer, lr=recipe.lr, warmup_ratio=0.02)
    return sft


def prepare(cfg: ExperimentConfig, out: Path, recipe: Recipe = Recipe()) -> dict:
    """Build, SFT, validate and export into `out`; the marker file is written last."""
    from transformers import AutoTokenizer

    from areal_hpc.data.tiny_model import build_tiny_model
    from areal_hpc.trainer.engine import TrainEngine
    from areal_hpc.trainer.parallel import init_trainer_world
    from areal_hpc.wire.network import free_port

    start = time.monotonic()
    sft_cfg = _sft_config(cfg, recipe)
    init_trainer_world(sft_cfg, 0, 1, f"tcp://127.0.0.1:{free_port()}")
    with tempfile.TemporaryDirectory() as tmp:
        init_dir = build_tiny_model(cfg.model, Path(tmp) / "init", seed=cfg.seed, task=cfg.data.synthetic_task)
        engine = TrainEngine(sft_cfg)
        engine.load_hf(init_dir)
        tok = AutoTokenizer.from_pretrained(str(init_dir))
        train, val = sft_and_validation(cfg, recipe)
        pairs = [
            (tok(p.prompt, add_special_tokens=False)["input_ids"],
             tok(p.solution, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
            for p in train
        ]
        longest = max(len(c) for _, c in pairs) + 8
        rng = random.Random(cfg.seed)
        solves = answer_check(cfg)
        history = []
        acc, step = 0.0, 0
        while step < recipe.max_steps:
            for _ in range(recipe.eval_every):
                metrics = engine.sft_step(rng.sample(pairs, recipe.batch))
                step += 1
            engine.export_hf(out, tokenizer_dir=init_dir)
            acc = greedy_accuracy(out, val, longest, solves)
            history.append({"step": step, "loss": metrics["loss"], "val_accuracy": acc})
            print(f"warm start: step {step} loss {metrics['loss']:.3f} validation accuracy {acc:.3f}",
                  file=sys.stderr, flush=True)
            if acc >= cfg.data.synthetic_warm_start_accuracy:
                break
    info = {"steps": step, "val_accuracy": acc, "seconds": time.monotonic() - start, "history": history,
            "recipe": dataclasses.asdict(recipe)}
    (out / READY_FILE).write_text(json.dumps(info, indent=1))
    return info


def main(argv: list[str] | None = None) -> int:
    from areal_hpc.config.load import load_config
    from areal_hpc.metrics.library_logs import quiet_libraries

    quiet_libraries()

    p = argparse.ArgumentParser(prog="python -m areal_hpc.recipes.warm_start", description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    out = cache_dir(cfg)
    if not is_prepared(out):
        prepare(cfg, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

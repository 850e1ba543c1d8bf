"""Rank 0's checks before any process group exists: config, world size, layout, model directory, data.

Everything a user can get wrong is found here and reported as one UserError, so a bad launch
fails in seconds with a clear message instead of inside a collective on some other rank.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from areal_hpc.config.hf import read_hf_config, shape_mismatches
from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import check_world, missing_weights
from areal_hpc.controller.checkpoint import resume_from
from areal_hpc.data.chat import left_out, load_tokenizer, render
from areal_hpc.data.prompts import train_and_eval_prompts
from areal_hpc.errors import UserError
from areal_hpc.prompt_row import PromptRow
from areal_hpc.reward.references import references
from areal_hpc.reward.task import Reference
from areal_hpc.runtime import run_lock
from areal_hpc.slurm.hetjob import uses_gpus
from areal_hpc.slurm.verify import GPU_ENV, gpu_of, verify
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint
from areal_hpc.wire.messages import LaunchPlan
from areal_hpc.wire.network import interface_address

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Prompts:
    """The training and held-out prompts with their token ids (int32) and reward references
    (the controller's data)."""

    train: list[PromptRow]
    train_ids: list[np.ndarray]
    train_references: list[Reference]
    held_out: list[PromptRow]
    held_out_ids: list[np.ndarray]
    held_out_references: list[Reference]
    # The held-out data sets in order, each (name, rows): held_out is their concatenation.
    held_out_sets: list[tuple[str, int]]


def model_dir_of(cfg: ExperimentConfig) -> Path:
    """model.path, or the cached warm-started tiny model (prepared on first use)."""
    if cfg.model.path is not None:
        path = Path(cfg.model.path)
    else:
        from areal_hpc.recipes.warm_start import ensure_prepared

        path = ensure_prepared(cfg)
    problems = shape_mismatches(cfg.model, read_hf_config(path))
    if problems:
        raise UserError(f"model directory {path} does not match the config: " + "; ".join(problems))
    return path


def check_model_files(cfg: ExperimentConfig, model_dir: Path, tokenizer: PreTrainedTokenizerBase,
                      tokenizer_dir: Path) -> None:
    """The weights' headers against the model's shape (a truncated or mis-shaped file is named
    here, not by a trainer rank's load after minutes of start-up; headers only: milliseconds for a
    32B model's shards), and a tokenizer whose ids fit the embedding."""
    HFCheckpoint(model_dir).check(cfg.model)
    if len(tokenizer) > cfg.model.vocab_size:
        raise UserError(f"the tokenizer in {tokenizer_dir} has {len(tokenizer)} tokens, more than the model's"
                        f" vocab_size = {cfg.model.vocab_size} ({model_dir}/config.json): ids from"
                        f" {cfg.model.vocab_size} on have no embedding row; use the model's own tokenizer")


def check_layout(cfg: ExperimentConfig) -> None:
    """`areal-hpc slurm verify`'s mapping and memory checks (not its Megatron build, which would
    cost the launch seconds: ~10 of imports alone), memory against the GPU named by AREAL_GPU."""
    hw = gpu_of(None)
    problems = verify(cfg, hw, build=False).problems
    if problems:
        gpu = f" (memory against an {hw.name}; {GPU_ENV} names another GPU)" if uses_gpus(cfg) else ""
        raise UserError(f"the layout cannot run{gpu}: " + "; ".join(problems))


def fitting(rows: list[PromptRow], refs: list[Reference], tokenizer: PreTrainedTokenizerBase,
            cfg: ExperimentConfig, what: str) -> tuple[list[PromptRow], list[np.ndarray], list[Reference]]:
    """The rows whose rendered prompt fits rollout.max_prompt_len, their token ids and references;
    the others are left out (data.overlong: filter) and counted in one line."""
    rendered = render(rows, tokenizer, cfg.data, cfg.rollout.max_prompt_len, what)
    if rendered.filtered:
        print(f"rank 0 (controller): {left_out(Path(what).name, len(rows), rendered.filtered)}", file=sys.stderr,
              flush=True)
    return [rows[i] for i in rendered.kept], rendered.ids, [refs[i] for i in rendered.kept]


def preflight(config: str, overrides: list[str], world_size: int) -> tuple[LaunchPlan, Prompts]:
    cfg = load_config(config, overrides)
    problems = check_world(cfg, world_size) + missing_weights(cfg)
    if problems:
        raise UserError("; ".join(problems))
    check_layout(cfg)
    if cfg.cluster.network_interface:  # in seconds, not after minutes of preparing a model
        interface_address(cfg.cluster.network_interface)
    run_lock.hold(cfg.logging.dir)  # before anything reads or prunes its checkpoints
    train, held_out_sets = train_and_eval_prompts(cfg.data, cfg.seed, cfg.eval.paths)
    train_what = cfg.data.train_path or "synthetic training prompts"
    eval_whats = cfg.eval.paths or [cfg.data.eval_path or "synthetic held-out prompts"]
    train_refs = references(train, cfg.reward, train_what)
    held_out_refs = [references(rows, cfg.reward, what) for (_, rows), what in zip(held_out_sets, eval_whats, strict=True)]
    model_dir = model_dir_of(cfg)
    tokenizer_dir = Path(cfg.model.tokenizer_path or model_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    check_model_files(cfg, model_dir, tokenizer, tokenizer_dir)
    train, train_ids, train_refs = fitting(train, train_refs, tokenizer, cfg, train_what)
    prompts = Prompts(train, train_ids, train_refs, [], [], [], [])
    for (name, rows), refs, what in zip(held_out_sets, held_out_refs, eval_whats, strict=True):
        rows, ids, refs = fitting(rows, refs, tokenizer, cfg, what)
        prompts.held_out += rows
        prompts.held_out_ids += ids
        prompts.held_out_references += refs
        prompts.held_out_sets.append((name, len(rows)))
    resume = resume_from(cfg)
    plan = LaunchPlan(cfg, str(model_dir), None if resume is None else str(resume))
    return plan, prompts
